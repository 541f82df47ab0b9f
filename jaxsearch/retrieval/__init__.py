"""jaxsearch.retrieval."""
