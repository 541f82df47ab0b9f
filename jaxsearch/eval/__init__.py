"""jaxsearch.eval."""
