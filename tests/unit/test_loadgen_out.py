"""The load generator's default output folder: a new one per run (issue 19).

The compose `loadgen` service passes no --out, so this default is what keeps one run from
overwriting the last one in LOADGEN_OUT_DIR (tests/system/test_docker_stack.py runs it for real).
"""

from __future__ import annotations

import re
from pathlib import Path

from loadgen.cli import default_out_dir


def test_each_run_gets_its_own_folder(tmp_path: Path) -> None:
    made = []
    for _ in range(3):  # within one second: -2, -3
        out = default_out_dir("run", tmp_path)
        out.mkdir()
        made.append(out.name)
    assert len(set(made)) == 3
    assert re.fullmatch(r"run-\d{8}-\d{6}", made[0]), made
    assert all(name.startswith(made[0]) for name in made)


def test_the_folder_is_relative_to_out_by_default() -> None:
    out = default_out_dir("diagnose")
    assert out.parent == Path("out") and out.name.startswith("diagnose-")
