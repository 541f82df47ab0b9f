"""jaxsearch.models."""
