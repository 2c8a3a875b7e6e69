"""Shared pytest configuration. Area-specific fixtures live in tests/plugins/*.py.

Tests are grouped by tier, one folder each, and every test gets its tier's marker:
`unit` (in-process, no child processes: `make unit`), `integration` (simulators, stubs,
the exporter as a process) and `system` (the real llama-server, SGLang, Prometheus and
promtool, Docker, pip installs).
"""

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
TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, from its folder; a test outside a tier folder fails."""
    for item in items:
        tier = next((t for t in TIERS if f"tests/{t}/" in item.path.as_posix()), None)
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/unit|integration|system")
        item.add_marker(getattr(pytest.mark, tier))


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
