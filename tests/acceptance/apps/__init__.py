"""Tiny applications the CLI acceptance tests start workers with."""
