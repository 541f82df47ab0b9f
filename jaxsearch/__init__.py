"""jaxsearch: train LLM search agents with reinforcement learning in JAX."""

__version__ = "0.1.0"
