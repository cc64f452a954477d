"""ragd: a local retrieval daemon over your notes and documents."""

__version__ = "0.1.0"
