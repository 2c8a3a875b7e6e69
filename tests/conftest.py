"""Shared pytest configuration. Area-specific fixtures live in tests/plugins/*.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.plugins.llama",
    "tests.plugins.exporter",
    "tests.plugins.sim",
    "tests.plugins.prom",
]

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files instead of comparing against them",
    )


@pytest.fixture
def fixtures_dir() -> Path:
    """Folder of captured real outputs (each subfolder has a PROVENANCE.md)."""
    return FIXTURES


def get_free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def free_port() -> int:
    return get_free_port()
