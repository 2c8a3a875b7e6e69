"""Shared pytest configuration. Area-specific fixtures live in tests/plugins/*.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

# llama.cpp's CPU build (GGML_NATIVE) repacks weights into AMX tiles when the CPU advertises
# AMX; VMs that advertise AMX without granting the tile permission then die with SIGILL at
# the first generation. Every llama-server the tests start inherits this (= --no-repack).
os.environ.setdefault("LLAMA_ARG_REPACK", "0")

pytest_plugins = [
    "tests.plugins.llama",
    "tests.plugins.exporter",
    "tests.plugins.loadgen",
    "tests.plugins.sim",
    "tests.plugins.prom",
    "tests.plugins.sglang",
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
