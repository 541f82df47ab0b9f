"""jaxsearch.rl."""
