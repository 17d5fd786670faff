"""module."""
