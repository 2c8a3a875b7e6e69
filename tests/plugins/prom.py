"""Fixtures for the prom area (filled in by that area's tests)."""
