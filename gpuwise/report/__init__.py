"""Rendering only: terminal tables (rich) and JSON records. Nothing here computes estimates."""
