"""`llmb-sim demo`: the whole stack without a GPU, its verdict, and a clean stop.

Integration: the demo as a user runs it (a child process), with the real Prometheus and
Alertmanager from Debian; checked through Prometheus' HTTP API.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from config.settings import load_config
from simulator import scenarios
from simulator.demo import KINDS, engine_name
from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.prom import rule_groups
from tests.system.test_readme import VERDICTS as README_VERDICTS

VERDICTS = set(README_VERDICTS)


def children(pid: int) -> set[int]:
    """Direct children of `pid` (Linux /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found |= {int(p) for p in text}
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class RunningDemo:
    proc: subprocess.Popen[str]
    out: Path
    lines: list[str]
    prom: str
    alertmanager: str


def start_demo(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "simulator", "demo", "--out", str(out), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDemo]:
    """The demo with Prometheus (1s interval) and Alertmanager, until both verdicts settle."""
    out = tmp_path_factory.mktemp("demo")
    ports = [get_free_port() for _ in range(3)]
    proc = start_demo(
        out,
        "--exporter-port",
        str(ports[0]),
        "--prometheus-port",
        str(ports[1]),
        "--alertmanager-port",
        str(ports[2]),
        "--interval",
        "1s",
        "--settle",
        "5",
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if sum(ln.startswith("verdict ") for ln in lines) >= 2:
                break
        running = RunningDemo(
            proc, out, lines, f"http://127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[2]}"
        )
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.prometheus
class TestDemoWithPrometheus:
    def test_prints_urls_and_a_verdict_per_engine(self, demo: RunningDemo) -> None:
        text = "".join(demo.lines)
        assert f"prometheus           {demo.prom}" in text, text
        assert f"alertmanager         {demo.alertmanager}" in text, text
        printed = dict(ln.split()[1:3] for ln in demo.lines if ln.startswith("verdict "))
        assert set(printed) == {engine_name(k) for k in KINDS}, text
        assert set(printed.values()) <= VERDICTS, text

    def test_rules_are_loaded_and_the_verdict_series_exists(self, demo: RunningDemo) -> None:
        groups = httpx.get(f"{demo.prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
        assert {g["name"] for g in groups} == {g["name"] for g in rule_groups()}
        rows = httpx.get(
            f"{demo.prom}/api/v1/query",
            params={"query": "llmb:engine_bottleneck:verdict == 1"},
            timeout=10,
        ).json()["data"]["result"]
        assert {r["metric"]["engine"] for r in rows} == {engine_name(k) for k in KINDS}
        printed = dict(ln.split()[1:3] for ln in demo.lines if ln.startswith("verdict "))
        # The verdict printed is the one Prometheus holds (the healthy preset under load).
        assert {r["metric"]["engine"]: r["metric"]["verdict"] for r in rows} == printed

    def test_alertmanager_is_wired(self, demo: RunningDemo) -> None:
        data = httpx.get(f"{demo.prom}/api/v1/alertmanagers", timeout=10).json()["data"]
        assert [a["url"] for a in data["activeAlertmanagers"]] == [
            f"{demo.alertmanager}/api/v2/alerts"
        ]
        assert httpx.get(f"{demo.alertmanager}/-/ready", timeout=5).status_code == 200

    def test_each_engine_has_its_own_gpu_below_its_total(self, demo: RunningDemo) -> None:
        def query(expr: str) -> list[dict[str, object]]:
            resp = httpx.get(f"{demo.prom}/api/v1/query", params={"query": expr}, timeout=10)
            result: list[dict[str, object]] = resp.json()["data"]["result"]
            return result

        procs = query("llmb_gpu_process_memory_used_bytes")
        gpu_of = {r["metric"]["engine"]: r["metric"]["gpu"] for r in procs}  # type: ignore[index]
        assert set(gpu_of) == {engine_name(k) for k in KINDS}
        assert len(set(gpu_of.values())) == 2, gpu_of
        used = {
            r["metric"]["gpu"]: float(r["value"][1]) for r in query("llmb_gpu_memory_used_bytes")
        }  # type: ignore[index]
        total = {
            r["metric"]["gpu"]: float(r["value"][1]) for r in query("llmb_gpu_memory_total_bytes")
        }  # type: ignore[index]
        preset = scenarios.get("healthy").gpu.total_bytes
        for gpu in gpu_of.values():
            assert total[gpu] == preset
            assert 0 < used[gpu] < total[gpu], (gpu, used, total)

    def test_sigterm_stops_every_child(self, demo: RunningDemo) -> None:
        kids = children(demo.proc.pid)
        # two simulators, the exporter, Prometheus, Alertmanager
        assert len(kids) == 5, kids
        demo.proc.send_signal(signal.SIGTERM)
        assert demo.proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in kids):
            time.sleep(0.1)
        assert not [p for p in kids if alive(p)]


class TestDemoWithoutPrometheus:
    def test_runs_per_engine_scenarios_and_stops_on_sigint(self, tmp_path: Path) -> None:
        out = tmp_path / "demo"
        env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # no Prometheus: fast
        proc = start_demo(
            out,
            "--exporter-port",
            str(get_free_port()),
            "--sglang-scenario",
            "rtx-pro-5000-27b",
            "--no-load",
            env=env,
        )
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline() for _ in range(5)]
            assert lines[3].startswith("prometheus           not installed"), lines
            urls = {ln.split()[0]: ln.split()[2] for ln in lines[:2]}
            config = load_config(out / "llmb.yaml", environ={})
            assert {e.kind for e in config.engines} == {"llamacpp", "sglang"}
            assert config.gpu.fake_file and len(config.gpu.fake_file) == 2
            deadline = time.monotonic() + 30
            ready = False
            while time.monotonic() < deadline and not ready:
                try:
                    ready = all(
                        httpx.get(urls[k] + "/health", timeout=2).status_code == 200
                        for k in ("llama.cpp", "SGLang")
                    ) and all(Path(f).exists() for f in config.gpu.fake_file)
                except httpx.TransportError:
                    time.sleep(0.2)
            assert ready
            llama, sgl = (json.loads(Path(f).read_text()) for f in config.gpu.fake_file)
            assert llama["devices"][0]["procs"][0]["cmdline"].startswith("llama-server ")
            assert llama["devices"][0]["index"] == 0
            assert llama["devices"][0]["name"] == scenarios.get("healthy").gpu.name
            assert sgl["devices"][0]["index"] == 1
            assert sgl["devices"][0]["name"] == scenarios.get("rtx-pro-5000-27b").gpu.name
            assert llama["devices"][0]["uuid"] != sgl["devices"][0]["uuid"]
            assert proc.poll() is None
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0

    def test_busy_port_is_one_line_and_exit_2(self, tmp_path: Path) -> None:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "simulator",
                    "demo",
                    "--out",
                    str(tmp_path),
                    "--exporter-port",
                    str(port),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert result.returncode == 2
        assert result.stdout == ""
        assert result.stderr == (
            f"llmb-sim demo: port {port} (exporter) is in use; stop what holds it or pass "
            f"--exporter-port PORT\n"
        )
