"""The unit tier runs in-process: a test here that starts a child process fails."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_child_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    # asyncio's subprocesses go through subprocess.Popen too, so this one seam covers both.
    def refuse(self: subprocess.Popen[Any], args: Any, *_: Any, **__: Any) -> None:
        raise RuntimeError(
            f"a unit test started a process ({args!r}): it belongs in tests/integration"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
