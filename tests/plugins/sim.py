"""Fixtures for the sim area (filled in by that area's tests)."""
