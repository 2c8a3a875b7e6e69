"""report.html renders in headless Chromium with every plot; report.md and results.json agree."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

from loadgen.decision import EngineResult, Phase, Row, decide_compare, decide_single
from loadgen.htmlreport import PLOTS, write_report

CHROMIUM = "/usr/bin/chromium"


def chromium_dom(html_file: Path) -> str:
    """The DOM of `html_file` after Chromium has loaded and laid it out (scripts run)."""
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=3000",
                "--dump-dom",
                html_file.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    return out.stdout


def assert_report_renders(out: Path) -> str:
    """Every plot is in the rendered DOM with a non-empty laid-out SVG; returns the DOM."""
    dom = chromium_dom(out / "report.html")
    for pid in PLOTS:
        fig = re.search(rf'<figure class="plot" id="plot-{pid}">(.*?)</figure>', dom, re.S)
        assert fig is not None, f"plot {pid} missing"
        assert "<svg" in fig.group(1) and "<path" in fig.group(1)
    rendered = re.search(r'data-plots-rendered="(\d+)"', dom)
    assert rendered is not None, "the in-page check did not run"
    assert int(rendered.group(1)) == len(PLOTS)
    return dom


def _engine(name: str, kind: str, scale: float) -> EngineResult:
    t0 = 1_790_000_000.0
    e = EngineResult(
        name=name,
        kind=kind,
        quantization="Q4_0",
        weights_bytes=15.2e9,
        process_gpu_bytes=17e9,
        layers_offloaded=63,
        layers_total=63,
        gpu_total_bytes=72e9,
        bandwidth_bytes_per_s=1.344e12,
        memory_source="gpu",
        load_seconds=12.5,
    )
    names = ["baseline", "start", "settle", "first_generation", "after", "weights", "single"]
    e.phases = [Phase(n, t0 + 10 * i, t0 + 10 * i + 9, 1e9 + 2e9 * i) for i, n in enumerate(names)]
    e.timeline = [(t0 + i, 1e9 + 0.3e9 * i) for i in range(70)]
    e.rows.append(
        Row(
            name,
            "single",
            1,
            per_seq_tok_s=20 * scale,
            aggregate_tok_s=19 * scale,
            ttft_s=0.05,
            per_token_ms=50 / scale,
        )
    )
    for c in (2, 4, 8):
        e.rows.append(
            Row(
                name,
                "concurrency",
                c,
                per_seq_tok_s=18 * scale,
                aggregate_tok_s=17 * c * scale,
                ttft_s=0.05 * c,
            )
        )
    for ctx, mem in ((8192, 17e9), (32768, 21e9), (131072, 35e9)):
        e.rows.append(
            Row(name, "context", 1, context=ctx, loaded_memory_bytes=mem, kv_bytes=mem - 16e9)
        )
    return e


def test_compare_report_renders_every_plot(tmp_path: Path) -> None:
    a, b = _engine("llama", "llamacpp", 1.0), _engine("sglang", "sglang", 1.02)
    b.rows = [r for r in b.rows if r.step != "concurrency"]
    for c, agg in ((2, 60.0), (4, 120.0), (8, 230.0)):
        b.rows.append(
            Row("sglang", "concurrency", c, per_seq_tok_s=agg / c, aggregate_tok_s=agg, ttft_s=0.04)
        )
    decision = decide_compare(a, b)
    write_report(tmp_path, [a, b], decision, title="compare llama vs sglang")
    dom = assert_report_renders(tmp_path)
    assert "Verdict: switch: batching" in dom
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["verdict"] == "switch: batching"
    assert doc["recommendation"].startswith("switch to sglang")
    assert [e["name"] for e in doc["engines"]] == ["llama", "sglang"]
    md = (tmp_path / "report.md").read_text()
    assert "**Verdict: switch: batching**" in md
    assert "| sglang | concurrency |" in md


def test_report_without_data_still_draws_each_plot(tmp_path: Path) -> None:
    e = EngineResult(name="bare", kind="llamacpp", missing=["context sweep (no launch template)"])
    write_report(tmp_path, [e], decide_single(e), title="diagnose bare")
    dom = assert_report_renders(tmp_path)
    assert "context sweep (no launch template)" in dom
    assert "no context sweep" in dom  # the reason is written into the empty plot
