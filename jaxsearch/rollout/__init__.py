"""Kept for the public API of DESIGN.md: `from jaxsearch.rollout.sampler import generate` (now `jaxsearch.agent`)."""
