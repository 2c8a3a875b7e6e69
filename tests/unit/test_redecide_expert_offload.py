"""Issue 32 item 5: a saved `--n-cpu-moe 24` run on an H200, re-decided with today's code.

`decide` re-reads the engine log diagnose saved in the folder with today's log parser, decides
the verdict and action again from the saved signals, and takes the host bandwidth for the
expert-offload bound from `--host-bandwidth-gbs` (the saved run measured none).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main
from core.conditions import LAYERS_ACTION
from diagnose.decide import redecide, refresh, saved_logs
from diagnose.decision.results import engine_from_dict
from diagnose.decision.two_engines import CompareInputs
from model.host_memory import HostBandwidth
from tests.paths import FIXTURES

SAVED = FIXTURES / "h200-moe-ncpumoe-saved-run"
GIB = 2**30
# The saved run's host experts (24 layers, from the GGUF at run time) and the share of them
# one sequence's decode step reads (8 of 128 experts).
HOST_BYTES = 15401484288.0
SHARE = 8 / 128


def test_the_saved_log_is_found_in_the_folder() -> None:
    doc = json.loads((SAVED / "results.json").read_text(encoding="utf-8"))
    engine = engine_from_dict(doc["engines"][0])
    assert [p.name for p in saved_logs(SAVED, engine)] == ["moe_ncpumoe24-c8192-np4.log.xz"]


def test_redecided_with_the_flagged_bandwidth_the_expert_advice_and_bound() -> None:
    host = HostBandwidth(41.5 * GIB, "flag")
    (engine,), decision = redecide(SAVED, None, CompareInputs(), None, host)
    assert engine.verdict == "weights_not_resident" and engine.experts_host_layers == 24
    assert engine.experts_host_bytes == HOST_BYTES  # the GGUF's exact bytes, kept
    action = decision.action
    assert action == engine.action
    assert "Expert offload: the routed experts of 24 layers live in host memory" in action
    assert "(14.34 GiB; 0.90 GiB read per step)" in action
    bound = 41.5 * GIB / (HOST_BYTES * SHARE)
    assert f"bound near {bound:.1f} tok/s per sequence by host memory (44.6 GB/s, flag" in action
    # The run measured 47.0 tok/s per sequence: at the bound (46.3), so host memory is the limit.
    assert "Measured decode 47.0 tok/s per sequence is 102 % of that bound" in action
    assert "host memory is the limit" in action and "free VRAM unknown" in action
    # The expert advice, and no layers advice: all 49 layers were on the GPU.
    assert "--n-cpu-moe" in action
    assert "-ngl" not in action and LAYERS_ACTION not in action
    assert "100 GB/s" not in action and "103.9" not in action


def test_without_a_bandwidth_the_saved_run_gets_no_bound(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    assert main(["decide", str(SAVED), "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert "host memory bandwidth unknown (pass --host-bandwidth-gbs)" in doc["action"]
    assert "bound near" not in doc["action"] and "-ngl" not in doc["action"]
    # With the flag, through the command line: the figure and its source in results.json.
    flagged = tmp_path / "flagged"
    assert main(["decide", str(SAVED), "--host-bandwidth-gbs", "44.56", "--out", str(flagged)]) == 0
    doc = json.loads((flagged / "results.json").read_text(encoding="utf-8"))
    engine = doc["engines"][0]
    assert (engine["host_bandwidth_bytes_per_s"], engine["host_bandwidth_source"]) == (
        44.56e9,
        "flag",
    )
    assert "by host memory (44.6 GB/s, flag" in doc["action"]
    out = capsys.readouterr().out
    assert "host memory is the limit" in out
    # The answer's expert-offload line: the bound beside the measured decode.
    assert (
        "moe_ncpumoe24: experts of 24 layers in host memory (14.34 GiB); host bound 46.3 tok/s "
        "per sequence at 44.6 GB/s (flag), measured 47.0 tok/s (102 % of it)"
    ) in out
    assert "host bound 46.3 tok/s" in (flagged / "report.md").read_text(encoding="utf-8")


def test_a_saved_run_gains_todays_log_parser(tmp_path: Path) -> None:
    """A run saved before its parser saw expert offload regains it from its saved log."""
    folder = tmp_path / "saved"
    shutil.copytree(SAVED, folder)
    path = folder / "results.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    engine = doc["engines"][0]
    engine["experts_host_layers"] = engine["experts_host_bytes"] = None
    del engine["signals"]["experts_host_layers"]
    path.write_text(json.dumps(doc), encoding="utf-8")
    (e,), decision = redecide(folder, None, CompareInputs(), None, None)
    # The -lv 5 override lines: 3 expert tensors of 204 MiB in each of layers 0-23.
    assert e.experts_host_layers == 24 and e.experts_host_bytes == 24 * 3 * 204 * 2**20
    assert e.signals["experts_host_layers"] == 24
    assert "the routed experts of 24 layers live in host memory" in decision.action
    assert "-ngl" not in decision.action


def test_a_run_saved_with_its_measured_bandwidth_keeps_it(tmp_path: Path) -> None:
    """Today's diagnose saves the host bandwidth it used; decide takes it without a flag."""
    folder = tmp_path / "saved"
    shutil.copytree(SAVED, folder)
    path = folder / "results.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["engines"][0] |= {
        "host_bandwidth_bytes_per_s": 44.56e9,
        "host_bandwidth_source": "measured",
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    (e,), decision = redecide(folder, None, CompareInputs(), None, None)
    assert "by host memory (44.6 GB/s, measured" in decision.action
    assert e.host_bandwidth_source == "measured"


def test_refresh_reads_the_saved_engine_into_a_new_value() -> None:
    """The saved engine is a value: `refresh` returns today's reading of it and writes into
    neither the engine nor its signals (a write raises: the result is frozen)."""
    doc = json.loads((SAVED / "results.json").read_text(encoding="utf-8"))
    saved = engine_from_dict(doc["engines"][0])
    signals = dict(saved.signals)
    today = refresh(saved, SAVED, HostBandwidth(41.5 * GIB, "flag"))
    assert today is not saved and today.host_bandwidth_source == "flag"
    assert saved.host_bandwidth_source is None and saved.signals == signals
    assert today.experts_host_layers == 24 and today.signals["experts_host_layers"] == 24
    with pytest.raises(FrozenInstanceError):
        today.verdict = "idle"  # type: ignore[misc]
