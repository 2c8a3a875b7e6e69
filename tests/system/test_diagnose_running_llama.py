"""`diagnose --url` on a real llama-server the user already runs (CPU build, Gemma 3 270M).

What is real: llama-server started outside the tool with `--log-file` and `-lv 4`, its HTTP
endpoints, its log and model file, the requests. What is not: this machine has no GPU, so
the exporter's NVML collector reads an NVML-shaped file (`gpu.fake_file` in a config that
names no engine), as in tests/system/test_diagnose_llama.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.loadgen import main as loadgen_main
from tests.plugins.llama import LlamaServer
from tests.system.test_diagnose_llama import FAKE_GPU

pytestmark = pytest.mark.llamaserver

QUICK = ["--concurrency", "1", "--kv-prompt-tokens", "0", "--prompt-tokens", "16",
         "--max-tokens", "8"]  # fmt: skip


def _diagnose(server: LlamaServer, tmp_path: Path, name: str, *extra: str) -> dict[str, Any]:
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(FAKE_GPU))
    config = tmp_path / "gpu.yaml"
    config.write_text(yaml.safe_dump({"gpu": {"fake_file": str(gpu)}}))
    out = tmp_path / name
    code = loadgen_main(["diagnose", "--url", server.url, "--config", str(config),
                         "--out", str(out), *QUICK, *extra])  # fmt: skip
    assert code == 0
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    return doc


def test_log_file_decides_residency_and_without_it_the_answer_says_what_is_unseen(
    tmp_path: Path,
    llama_server: Callable[..., LlamaServer],
    gemma_model: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = llama_server(ctx=1024, parallel=1)
    with_log = _diagnose(server, tmp_path, "with", "--log-file", str(server.log))
    printed = capsys.readouterr().out
    engine = with_log["engines"][0]
    residency = with_log["decision"]["steps"][0]["answer"]
    # The log's load lines: every weight buffer in host memory (CPU_Mapped), none on the GPU;
    # the CPU build loads nothing onto a GPU and prints no `offloaded N/M layers` line.
    log = engine["evidence"]["log"]
    assert log.startswith(f"--log-file {server.log}: no `offloaded N/M layers` line"), log
    assert re.search(r"weight buffers CPU_Mapped 0\.2\d GiB", log), log
    assert engine["gpu_buffer_bytes"] == 0
    assert "GPU weight buffers 0.00 GiB" in residency
    assert with_log["verdict"] == {engine["name"]: "weights_not_resident"}
    # Where each fact came from, in results.json and in the printed answer.
    assert engine["evidence"]["model"] == f"the engine's /props model_path {gemma_model}"
    assert f"log             {engine['name']}: {log}\n" in printed
    assert not any(m.startswith("log:") for m in engine["missing"])

    without = _diagnose(server, tmp_path, "without")
    printed = capsys.readouterr().out
    engine = without["engines"][0]
    log = engine["evidence"]["log"]
    assert log.startswith("not seen: no --log-file (llamacpp does not name its log over HTTP)")
    assert "layers and weight buffers on the GPU" in log
    assert f"log             {engine['name']}: {log}\n" in printed
    assert f"log: {log}" in engine["missing"]
    # No buffer figures without the log: the answer says they are unknown.
    assert engine["gpu_buffer_bytes"] is None
    assert "GPU weight buffers ?" in without["decision"]["steps"][0]["answer"]
