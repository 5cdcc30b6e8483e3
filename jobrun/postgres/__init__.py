"""The PostgreSQL adapter: the only package in jobrun that runs SQL."""
