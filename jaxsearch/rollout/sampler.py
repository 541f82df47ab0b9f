"""Moved to `jaxsearch.agent.sampler`; this name stays importable (DESIGN.md's public API)."""

from jaxsearch.agent.sampler import *  # noqa: F401,F403
from jaxsearch.agent.sampler import generate  # noqa: F401
