"""A command run as a user runs it: `run_module(module, *args)` is `python -m module *args`
from the repository root in its own process, output captured as text, the real exit code."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from tests.paths import ROOT


def run_module(
    module: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m module *args` (environment `env`, else this one's); never raises on exit."""
    argv = [sys.executable, "-m", module, *args]
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env, check=False
    )
