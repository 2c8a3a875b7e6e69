"""Fixtures for the llama area (filled in by that area's tests)."""
