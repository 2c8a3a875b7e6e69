"""Commands as a user runs them.

* `run_module(module, *args)`: `python -m module *args` from the repository root in its own
  process, output captured as text, the real exit code.
* `wait_http(url, timeout, proc, what)`: wait until a started server answers 200.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping

import httpx

from tests.paths import ROOT


def run_module(
    module: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m module *args` (environment `env`, else this one's); never raises on exit."""
    argv = [sys.executable, "-m", module, *args]
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env, check=False
    )


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], what: str) -> None:
    """Wait until `url` answers 200, failing early when the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} did not answer {url} within {timeout:.0f}s")
