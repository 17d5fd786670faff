"""repro."""
