"""jobrun: a durable background-job system on PostgreSQL."""

__version__ = "0.1.0"
