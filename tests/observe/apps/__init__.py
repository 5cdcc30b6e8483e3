"""Small programs the observability tests start as real processes."""
