"""Unit tests of diagnose's pieces: the exporter reader, facts, step sizing, the run's verdict,
the roofline on a real H200 capture, and the command line's errors and help."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from cli.loadgen import main as loadgen_main
from config.endpoints import sglang_server_info_facts as sglang_facts
from config.settings import parse_config
from core.conditions import evaluate
from core.promql import series_from_scrapes
from core.roofline import roofline_tokens_per_second
from core.rules import rule_values_at
from core.signals import Signals
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.roofline import roofline
from diagnose.monitor import Monitor, counters_from_zero
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher
from diagnose.procedure import Diagnoser, combine
from diagnose.step_inputs import context_inputs
from diagnose.steps.context import contexts
from diagnose.steps.kv import kv_prompt_tokens
from loadgen.exporter_series import Series, read_exporter, series_from_text
from tests.paths import FIXTURES
from tests.plugins.exporter import parse_samples, served_page

H200 = "llamacpp-h200-gemma3-27b-shape-q4_0"
NGL30 = FIXTURES / "h200-validation-2026-11-30" / "ngl30"


def ngl30_scrapes() -> list[tuple[float, str]]:
    """The exporter pages captured on the H200 while llama-server ran with -ngl 30 of 63."""
    with gzip.open(NGL30 / "scrapes.jsonl.gz", "rt") as fh:
        return [(float(d["t"]), d["text"]) for d in map(json.loads, fh)]


@pytest.fixture
def real_exporter() -> Iterator[str]:
    """The last captured H200 exporter page served on a loopback port."""
    body = ngl30_scrapes()[-1][1].encode()
    with served_page(lambda: body) as target:
        yield f"http://{target}"


def test_read_exporter_with_and_without_metrics_path(real_exporter: str) -> None:
    """One reader (exporter.promtext) gives the same series as the test plugin's parser."""
    series = read_exporter(real_exporter)
    assert read_exporter(real_exporter + "/metrics") == series
    assert series == parse_samples(ngl30_scrapes()[-1][1])


def test_rules_on_the_captured_h200_run_say_weights_not_resident() -> None:
    """diagnose's path on real samples: every scrape through the reader, then the rules."""
    scrapes = [(t, series_from_text(text)) for t, text in ngl30_scrapes()]
    at = scrapes[-1][0]
    values = rule_values_at(series_from_scrapes(scrapes), at)
    (engine,) = values.values()
    verdict = evaluate(engine.signals)
    assert verdict.name == "weights_not_resident"
    assert "layers" in verdict.evidence and engine.signals.layers_ratio == pytest.approx(30 / 63)


def test_sglang_facts() -> None:
    info = {
        "dtype": "bfloat16",
        "kv_cache_dtype": "fp8_e4m3",
        "max_running_requests": 48,
        "context_length": 8192,
        "internal_states": [
            {"memory_usage": {"weight": 51.12}, "effective_max_running_requests_per_dp": 40}
        ],
    }
    facts = sglang_facts(info)
    assert facts == {
        "quantization": "bfloat16 kv fp8_e4m3",
        "slots": 40,
        "slot_context": 8192,
        "weights_bytes": pytest.approx(51.12 * 2**30),
    }
    assert "quantization" not in sglang_facts({"dtype": "auto", "kv_cache_dtype": "auto"})


def test_run_verdict_is_the_first_in_decision_order_any_step_showed() -> None:
    s = Signals()
    steps = [("single", "decode_at_card_limit", s), ("concurrency", "scheduling_bound", s),
             ("kv_pressure", "kv_saturated", s)]  # fmt: skip
    assert combine(steps)[0] == "kv_saturated"
    assert combine([("single", "idle", s), ("c", "decode_below_card_limit", s)])[0] == (
        "decode_below_card_limit"
    )
    assert combine([("single", "idle", s)])[0] == "idle"
    assert combine([])[0] is None
    # The KV step's long probe prompts say nothing about the load's prompts; a load step does.
    probe = [
        ("single", "decode_below_card_limit", s),
        ("kv_pressure", "prefill_below_card_limit", s),
    ]
    assert combine(probe)[0] == "decode_below_card_limit"
    assert combine([("single", "prefill_below_card_limit", s), *probe])[0] == (
        "prefill_below_card_limit"
    )


def test_roofline_counts_weights_and_kv_on_the_h200_capture(fixtures_dir: Path) -> None:
    """27B Q4_0 at 4.8 TB/s: 94.8 tok/s is 30 % of the card's limit (weights + KV)."""
    req = json.loads((fixtures_dir / H200 / "req_c1.json").read_text())
    per_tok_ms = req[0]["timings"]["predicted_per_token_ms"]
    e = EngineResult(name="h200", kind="llamacpp", weights_bytes=15203778848,
                     bandwidth_bytes_per_s=4.8e12, kv_bytes_per_token=161792.0)  # fmt: skip
    e.rows.append(
        Row("h200", "single", 1, prompt_tokens=425, max_tokens=256, per_seq_tok_s=1000 / per_tok_ms)
    )
    roof = roofline(e)
    kv_tokens = 425 + 256 / 2
    assert roof.bytes_per_step == pytest.approx(15203778848 + kv_tokens * 161792.0)
    assert roof.limit_tok_s == pytest.approx(
        roofline_tokens_per_second(4.8e12, roof.bytes_per_step)
    )
    assert roof.efficiency == pytest.approx(0.30, abs=0.01)


def _diagnoser(tmp_path: Path, command: str | None, **opts: object) -> Diagnoser:
    launch = {"launch": {"command": command}} if command else {}
    cfg = parse_config(
        {"engines": [{"name": "e", "kind": "llamacpp", "url": "http://127.0.0.1:1", **launch}]},
        environ={},
    )
    return Diagnoser(cfg.engines[0], Options(**opts), tmp_path, PhasePublisher())  # type: ignore[arg-type]


def test_kv_prompt_ends_past_half_a_slot() -> None:
    assert kv_prompt_tokens(None, None, 32)[0] is None  # the slot's context is unknown
    assert kv_prompt_tokens(None, 4096, 32)[0] == 2048 - 16
    assert kv_prompt_tokens(None, 1 << 20, 32)[0] == 16384 - 16  # capped: prefill takes minutes
    assert kv_prompt_tokens(300, 4096, 32) == (300, "--kv-prompt-tokens")


def test_automatic_context_sweep_doubles_up_to_the_trained_context(tmp_path: Path) -> None:
    d = _diagnoser(tmp_path, "server -c {ctx} --port {port}")
    d.launched_ctx, d.facts = 4096, replace(d.facts, trained_context=32768)
    assert contexts(context_inputs(d)) == ([8192, 16384, 32768], "")
    d.facts = replace(d.facts, trained_context=4096)
    tried, why = contexts(context_inputs(d))
    assert tried == [] and "already reaches" in why
    assert "no {ctx}" in contexts(context_inputs(_diagnoser(tmp_path, "server --port {port}")))[1]
    assert "already running" in contexts(context_inputs(_diagnoser(tmp_path, None)))[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["diagnose", "--out", "x"], "no target"),
        (["diagnose", "--out", "x", "--url", "ftp://x"], "must start with http"),
        (["compare", "--out", "x", "--url", "http://127.0.0.1:1"], "compare needs two engines"),
        (["diagnose", "--out", "x", "--concurrency", "1,zero", "--url", "http://h"], "integers"),
    ],
)
def test_bad_input_exits_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert loadgen_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert loadgen_main(["compare", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "--rounds N rounds of every load step; the spread over rounds is reported (default: 3)"
        in out
    )
    assert "(default: 1,2,4,8)" in out


def _sglang_scrape(up: float, decode: tuple[float, float] | None, generated: float) -> Series:
    """One exporter scrape of an SGLang engine (numbers of the `moe_below_limit` simulator)."""
    lab = (("engine", "e"), ("host", "h"), ("kind", "sglang"))
    page = {("llmb_engine_up", lab): up, ("llmb_engine_generation_tokens_total", lab): generated}
    if decode is not None:
        page[("llmb_engine_decode_tokens_total", lab)] = decode[0]
        page[("llmb_engine_decode_seconds_total", lab)] = decode[1]
    return page


def test_a_counter_the_engine_creates_during_a_step_counts_from_zero() -> None:
    """SGLang's inter-token histogram (the decode counters) appears at the first streamed
    request: the step's opening scrape lacks it, so without a 0 there the step's only
    points are after the requests and the decode rate is none."""
    mon = Monitor("e", Options(concurrency=[1]))
    mon.scrapes = [
        (10.0, _sglang_scrape(1, None, 6)),  # the step's opening scrape
        (10.7, _sglang_scrape(1, (62, 0.3634), 70)),
        (10.9, _sglang_scrape(1, (62, 0.3634), 70)),
    ]
    values = mon.rule_values(10.9, since=10.0)
    assert values is not None and values.decode_tokens_per_second == pytest.approx(62 / 0.3634)
    # A counter already there is not touched; an engine that was not up gives no zero.
    assert counters_from_zero(mon.scrapes[1:], "e") == mon.scrapes[1:]
    down = [(10.0, _sglang_scrape(0, None, 6)), *mon.scrapes[1:]]
    assert counters_from_zero(down, "e") == down
    mon.scrapes = down
    values = mon.rule_values(10.9, since=10.0)
    assert values is not None and values.decode_tokens_per_second is None
