"""jaxsearch.data."""
