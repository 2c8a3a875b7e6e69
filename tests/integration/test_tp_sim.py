"""Tensor parallel on a simulator: one engine whose process holds memory on two GPUs.

The llama.cpp simulator writes its card's NVML state (GPU 0); a second card (GPU 1) carries
the same process with the same memory, as NVML shows a llama-server split `-ts 1,1` over
two cards. The real exporter reads both cards and attributes the process on each to the
engine; the roofline's bandwidth must be the two cards' together (each reads half of every
step), in Python and in promtool alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from core.promql import series_from_scrapes
from core.rules import rule_values_at
from simulator.gpu_state import write_atomic
from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.cli import wait_http
from tests.plugins.exporter import parse_samples
from tests.plugins.prom import stop_process
from tests.system.test_verdict_parity import promtool_test


def mirror(src: Path, dst: Path, stop: threading.Event) -> None:
    """Copy GPU 0's state as GPU 1 (same process, same memory) until stopped."""
    while not stop.is_set():
        try:
            doc = json.loads(src.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        for dev in doc["devices"]:
            dev["index"] = 1
            dev["uuid"] = dev["uuid"][:-4] + "0001"
        write_atomic(dst, doc)
        time.sleep(0.1)


@pytest.mark.prometheus
@pytest.mark.timeout(300)
def test_two_gpus_of_one_engine_add_their_bandwidth(tmp_path: Path) -> None:
    port, exp_port = get_free_port(), get_free_port()
    s0, s1, log = tmp_path / "gpu0.json", tmp_path / "gpu1.json", tmp_path / "llama.log"
    argv = [sys.executable, "-m", "simulator", "--kind", "llamacpp", "--port", str(port),
            "--scenario", "h200-gemma3-27b", "--gpu-state-file", str(s0),
            "--log-file", str(log)]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    copier = threading.Thread(target=mirror, args=(s0, s1, stop), daemon=True)
    try:
        procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{port}/health", 120, procs[0], "simulator")
        copier.start()
        while not s1.exists():
            time.sleep(0.05)
        config: dict[str, Any] = {
            "listen": f"127.0.0.1:{exp_port}",
            "engines": [
                {"name": "tp", "kind": "llamacpp", "url": f"http://127.0.0.1:{port}",
                 "log_file": str(log)}
            ],
            "gpu": {"fake_file": [str(s0), str(s1)], "sample_interval_seconds": 0.2},
        }  # fmt: skip
        cfg = tmp_path / "exporter.yaml"
        cfg.write_text(yaml.safe_dump(config))
        exporter = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--config", str(cfg)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        procs.append(exporter)
        wait_http(f"http://127.0.0.1:{exp_port}/metrics", 120, exporter, "exporter")
        scrapes = []
        with httpx.Client(timeout=60) as client:
            for step in range(24):
                body = {"prompt": f"tensor parallel {step}", "n_predict": 32, "ignore_eos": True}
                client.post(f"http://127.0.0.1:{port}/completion", json=body)
                text = client.get(f"http://127.0.0.1:{exp_port}/metrics").text
                scrapes.append((15.0 * step, parse_samples(text)))
    finally:
        stop.set()
        for proc in reversed(procs):
            stop_process(proc)
    last = scrapes[-1][1]
    procs_on = {
        dict(k[1])["gpu"]
        for k in last
        if k[0] == "llmb_gpu_process_memory_used_bytes" and dict(k[1]).get("engine") == "tp"
    }
    assert procs_on == {"0", "1"}
    card = [v for k, v in last.items() if k[0] == "llmb_gpu_memory_bandwidth_bytes_per_second"]
    assert len(card) == 2 and card[0] == card[1] > 0
    ((_, values),) = rule_values_at(series_from_scrapes(scrapes), scrapes[-1][0]).items()
    # Half of each step on each card: the engine's bandwidth is both cards'.
    assert values.bandwidth_bytes_per_second == 2 * card[0]
    assert values.roofline_tokens_per_second is not None
    assert values.decode_bytes_per_step is not None
    assert values.roofline_tokens_per_second == 2 * card[0] / values.decode_bytes_per_step
    # promtool computes the same at every step (values exactly, and the verdict).
    final, steps, result = promtool_test([("tensor parallel", scrapes, 15.0)], tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert steps == len(scrapes) and len(final["tensor parallel"]) == 1
