"""The output folder: a new one per run by default (issue 19), and a given --out checked
before anything runs (a folder that holds a run is kept as it is).

The compose `loadgen` service passes no --out, so this default is what keeps one run from
overwriting the last one in LOADGEN_OUT_DIR (tests/system/test_docker_stack.py runs it for real).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from cli.loadgen import main
from loadgen.cli import default_out_dir
from loadgen.options import RUN_FILES, out_folder


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


@pytest.mark.parametrize("name", RUN_FILES)
def test_a_folder_that_holds_a_run_is_refused_and_kept(tmp_path: Path, name: str) -> None:
    """requests.jsonl is appended to: a second run in one folder would mix its requests with
    the first's (compare's intervals over both) and overwrite its answer."""
    (tmp_path / name).write_text("kept\n", encoding="utf-8")
    with pytest.raises(argparse.ArgumentTypeError, match=rf"already holds a run \({name}\)"):
        out_folder(str(tmp_path))
    assert (tmp_path / name).read_text(encoding="utf-8") == "kept\n"


def test_a_new_or_empty_folder_is_taken_and_nothing_is_left_behind(tmp_path: Path) -> None:
    assert out_folder(str(tmp_path)) == tmp_path  # empty
    (tmp_path / "requests.jsonl").touch()  # a run that failed before its first request
    assert out_folder(str(tmp_path)) == tmp_path
    (tmp_path / "requests.jsonl").unlink()
    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    assert out_folder(str(tmp_path)) == tmp_path  # no run in it
    deep = tmp_path / "a" / "b" / "c"
    assert out_folder(str(deep)) == deep
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # checked, not made


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("file", "is a file, not a folder"),
        ("file/sub", "cannot make"),
        ("", "empty name"),
        ("  ", "empty name"),
    ],
)
def test_a_folder_that_cannot_be_one_is_said_before_anything_runs(
    tmp_path: Path, given: str, says: str
) -> None:
    (tmp_path / "file").write_text("x", encoding="utf-8")
    text = str(tmp_path / given) if given.strip() else given
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        out_folder(text)


def test_every_command_with_out_refuses_a_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One check for run, sweep, diagnose, compare and decide: exit 2, one line, the folder
    as it was."""
    (tmp_path / "results.json").write_text("{}", encoding="utf-8")
    url = "http://127.0.0.1:9"
    for argv in (
        ["run", "--url", url],
        ["sweep", "--url", url],
        ["diagnose", "--url", url],
        ["compare", "--url", url, "--url", url],
        ["decide", str(tmp_path)],
    ):
        assert main([*argv, "--out", str(tmp_path)]) == 2, argv
        err = capsys.readouterr().err
        assert f"argument --out: {tmp_path} already holds a run (results.json)" in err, argv
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_folder_that_cannot_be_written_is_said_before_anything_runs() -> None:
    """Tried, not read off the permission bits (which do not bind root): /proc takes no file."""
    with pytest.raises(argparse.ArgumentTypeError, match="cannot write in /proc: "):
        out_folder("/proc")
