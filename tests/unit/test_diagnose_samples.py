"""Without an exporter sample, diagnose's readings go through the rules as the exporter's
samples would: the same efficiency as the row's roofline, the queue against the slots."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from config.settings import parse_config
from core.conditions import evaluate
from diagnose.decision.model import Row
from diagnose.decision.roofline import row_roofline
from diagnose.evidence import residency_values, step_values
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher
from diagnose.procedure import Diagnoser


def _diagnoser(tmp_path: Path) -> Diagnoser:
    cfg = parse_config(
        {"engines": [{"name": "e", "kind": "llamacpp", "url": "http://127.0.0.1:1"}]},
        environ={},
    )
    d = Diagnoser(cfg.engines[0], Options(), tmp_path, PhasePublisher())
    d.facts = replace(
        d.facts,
        slots=2,
        weights_bytes=4e9,
        kv_bytes_per_token=2048.0,
        bandwidth_bytes_per_s=1e11,
        bandwidth_source="--bandwidth-gbs",
        layers_offloaded=30.0,
        layers_total=63.0,
    )
    return d


def test_a_step_without_exporter_samples_goes_through_the_rules(tmp_path: Path) -> None:
    d = _diagnoser(tmp_path)
    row = Row("e", "concurrency", 4, prompt_tokens=100.0, max_tokens=32, per_seq_tok_s=12.5,
              completion_tokens=256, wall_s=6.0, kv_exhausted=1, requests=8)  # fmt: skip
    sig = step_values(d, row, t1=1_000_000.0).signals
    assert sig.decode_efficiency == pytest.approx(row_roofline(d.facts, row).efficiency)
    assert sig.waiting_avg == 2 and sig.waiting == 2  # four in flight, two slots
    assert sig.running == 2 and sig.running_slots_ratio == 1.0
    assert sig.kv_pressure_increase == pytest.approx(1.0)
    assert sig.generation_tokens_per_second and sig.generation_tokens_per_second > 0
    assert sig.layers_ratio == pytest.approx(30 / 63) and not sig.host_has_gpu
    assert evaluate(sig).name == "kv_saturated"  # KV before the queue, as always


def test_residency_without_exporter_samples(tmp_path: Path) -> None:
    d = _diagnoser(tmp_path)
    sig = residency_values(d).signals
    assert sig.layers_ratio == pytest.approx(30 / 63)
    assert not sig.host_has_gpu and sig.weights_memory_ratio is None
    d.facts = replace(d.facts, bandwidth_bytes_per_s=None)
    no_row = Row("e", "single", 1, max_tokens=32, completion_tokens=32, wall_s=1.0)
    assert step_values(d, no_row, t1=1_000_000.0).signals.decode_efficiency is None
