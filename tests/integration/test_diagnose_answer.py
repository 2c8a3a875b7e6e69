"""The answer survives: `diagnose` as a real process against the llama.cpp simulator (`llmb-sim`).

What is real: both processes, the HTTP between them, the signal, the missing import and the
files on disk. The simulator writes its llama.cpp log (read through `--log-file`) and an
NVML-shaped GPU file the embedded exporter reads.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnose.launcher import EngineProcess
from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.loadgen import loadgen_process, records_so_far

# Small and quick: one slot pair, short prompts, no context sweep (the engine is running).
QUICK = ("--prompt-tokens", "64", "--max-tokens", "32", "--concurrency", "1,4")

# A site hook that makes `import matplotlib` fail as it does where it is not installed: the
# import system finds no such module (ModuleNotFoundError), whatever the venv holds.
NO_MATPLOTLIB = """
import sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Any]:
    """A factory: `sim(scenario, *flags)` starts a llama.cpp simulator; (url, config, log)."""
    started: list[EngineProcess] = []

    def start(scenario: str, *flags: str) -> tuple[str, Path, Path]:
        port = get_free_port()
        gpu, log = tmp_path / f"gpu-{port}.json", tmp_path / f"sim-{port}.log"
        argv = [sys.executable, "-m", "simulator", "--kind", "llamacpp", "--scenario", scenario,
                "--port", str(port), "--gpu-state-file", str(gpu), "--log-file", str(log),
                *flags]  # fmt: skip
        proc = EngineProcess(argv, f"http://127.0.0.1:{port}/health", tmp_path / f"{port}.out")
        proc.start()
        started.append(proc)
        # Only the GPU: the engine itself is given by --url, as a user's running one.
        config = tmp_path / f"gpu-{port}.yaml"
        config.write_text(f"gpu:\n  fake_file: {gpu}\n  sample_interval_seconds: 0.1\n")
        return f"http://127.0.0.1:{port}", config, log

    yield start
    for proc in started:
        proc.stop()


def diagnose(url: str, config: Path, out: Path, *extra: str, env: dict[str, str] | None = None
             ) -> subprocess.Popen[str]:  # fmt: skip
    argv = [sys.executable, "-m", "cli.loadgen", "diagnose", "--url", url, "--config",
            str(config), "--out", str(out), *extra]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)  # fmt: skip


def test_fail_on_exits_3_on_the_verdict_and_0_without_it(sim: Any, tmp_path: Path) -> None:
    """`--fail-on kv_saturated`: 3 on the kv_saturated preset, 0 on the healthy one; the
    answer and results.json are there either way."""
    codes = {}
    for scenario in ("kv_saturated", "healthy"):
        url, config, log = sim(scenario)
        out = tmp_path / scenario
        proc = diagnose(url, config, out, "--log-file", str(log), *QUICK,
                        "--fail-on", "kv_saturated,weights_not_resident")  # fmt: skip
        stdout, stderr = proc.communicate(timeout=180)
        codes[scenario] = proc.returncode
        doc = json.loads((out / "results.json").read_text())
        (verdict,) = doc["verdict"].values()
        assert stdout.startswith(f"verdict         {doc['engines'][0]['name']}: {verdict}\n")
        assert doc["partial"] is False
        if scenario == "kv_saturated":
            assert verdict == "kv_saturated", stderr
        else:
            assert verdict not in ("kv_saturated", "weights_not_resident"), stderr
    assert codes == {"kv_saturated": 3, "healthy": 0}


def test_no_matplotlib_still_prints_the_verdict_and_writes_json_and_markdown(
    sim: Any, tmp_path: Path
) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(NO_MATPLOTLIB)
    check = subprocess.run([sys.executable, "-c", "import matplotlib"], capture_output=True,
                           text=True, env={"PYTHONPATH": str(shim)})  # fmt: skip
    assert "ModuleNotFoundError: No module named 'matplotlib'" in check.stderr
    url, config, log = sim("healthy")
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(shim), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = diagnose(url, config, out, "--log-file", str(log), *QUICK,
                    "--kv-prompt-tokens", "0", env=env)  # fmt: skip
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert stdout.startswith("verdict ")
    assert "Traceback" not in stderr
    assert "report.html not written: it needs matplotlib" in stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["verdict"] and doc["engines"][0]["rows"]
    assert "## Answer" in (out / "report.md").read_text()
    assert not (out / "report.html").exists()


def test_sigint_during_a_step_writes_the_finished_steps_as_partial(
    sim: Any, tmp_path: Path
) -> None:
    """Ctrl-C while the concurrency step runs: the single step's rounds are kept, the run is
    marked partial, the requests in flight are `interrupted`, and the exit code is 130."""
    url, config, log = sim("healthy", "--time-scale", "3")
    out = tmp_path / "out"
    proc = diagnose(url, config, out, "--log-file", str(log), "--prompt-tokens", "32",
                    "--max-tokens", "32", "--concurrency", "1,4", "--rounds", "2",
                    "--requests-per-slot", "20")  # fmt: skip
    # Rounds are the scheduler's steps 0, 1 (single) and 2, 3 (concurrency): wait for the
    # concurrency step's first finished request.
    deadline = time.monotonic() + 120
    while not any(r["step"] >= 2 for r in records_so_far(out)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    t_signal = time.monotonic()
    stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - t_signal < 15
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["partial"] is True
    engine = doc["engines"][0]
    assert engine["interrupted"] is True
    assert engine["stopped"].startswith("concurrency: interrupted")
    steps = {s["key"]: s["answer"] for s in doc["decision"]["steps"]}
    assert not steps["single"].startswith("not measured")
    assert steps["concurrency"].startswith("not measured: the run stopped during the concurrency")
    assert steps["kv_pressure"].startswith("not measured: the run stopped")
    single = next(r for r in engine["rows"] if r["step"] == "single")
    assert len(single["per_seq_rounds"]) == 2 and single["error"] is None
    stopped = next(r for r in engine["rows"] if r["step"] == "concurrency")
    assert stopped["error"].startswith("stopped: interrupted")
    assert "interrupted" in {r["error"] for r in records_so_far(out)}
    assert f"partial         {engine['name']}: stopped at concurrency: interrupted" in stdout
    md = (out / "report.md").read_text()
    assert f"| {engine['name']}: partial | stopped at concurrency: interrupted" in md


def test_compare_two_running_engines_by_url(sim: Any, tmp_path: Path) -> None:
    """compare --url A --url B: no config engines, no launch template; only the context
    sweep (a relaunch) is skipped, and the answer says so."""
    url_a, config, log_a = sim("healthy")
    url_b, _, log_b = sim("scheduling_bound")
    out = tmp_path / "out"
    proc = loadgen_process(
        "compare", "--url", url_a, "--url", url_b, "--name", "a", "--name", "b",
        "--config", str(config), "--log-file", str(log_a), "--log-file", str(log_b),
        "--out", str(out), "--rounds", "2", "--kv-prompt-tokens", "0", *QUICK,
    )  # fmt: skip
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    doc = json.loads((out / "results.json").read_text())
    assert set(doc["verdict"]) == {"a", "b"}
    assert doc["recommendation"]
    for engine in doc["engines"]:
        assert any(r["step"] == "concurrency" and r["error"] is None for r in engine["rows"])
        assert engine["evidence"]["log"].startswith("--log-file ")
        assert any(m.startswith("context: the engine was already running") for m in
                   engine["missing"]), engine["missing"]  # fmt: skip
    assert "need a relaunch and are skipped" in stderr
    assert stdout.startswith("verdict         a: ")
    # Where each engine's log came from, in the report as on the terminal.
    md = (out / "report.md").read_text()
    assert f"| a: log | --log-file {log_a}: layers on the GPU " in md
    assert f"| b: log | --log-file {log_b}: layers on the GPU " in md
