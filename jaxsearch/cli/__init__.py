"""jaxsearch.cli: the commands (console scripts jaxsearch-*; launch/*.py are thin wrappers). Each module has `main(argv=None)`."""
