"""The source tree's version: a leaf module every layer may read (it imports nothing)."""

__version__ = "0.1.0"
