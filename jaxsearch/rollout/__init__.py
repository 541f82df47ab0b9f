"""jaxsearch.rollout."""
