"""`llmb-sim demo` starts both simulators and the exporter with a valid generated config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from exporter.config import load_config
from tests.conftest import get_free_port

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_and_stops(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # keep Prometheus out: fast
    port = get_free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simulator",
            "demo",
            "--out",
            str(out),
            "--exporter-port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(5)] if proc.stdout else []
        urls = {ln.split()[0]: ln.split()[-1] for ln in lines if "http://" in ln}
        assert "prometheus           not on PATH, skipped\n" in lines
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
        state = json.loads(Path(config.gpu.fake_file[0]).read_text())
        assert state["devices"][0]["procs"][0]["cmdline"].startswith("llama-server ")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
