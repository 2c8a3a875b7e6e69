"""report.md and report.html: the answer first, the same words as results.json, no empty plot.

* Browser tests (`assert_report_renders`): report.html from hand-built EngineResults,
  rendered in real headless Chromium (Debian's `chromium`); the pixel checks look inside
  each plot's box of a full-page screenshot (tests/report_browser.py).
* Unit tests: the flags the hints name exist; concurrency ticks are plain and linear.
* Process tests: no loadgen module imports matplotlib; no third-party log line even with a
  fresh font cache; without matplotlib one clear line and no lost measurement.
* Integration (`llamaserver`): `diagnose --url` against the real CPU llama-server, its
  report rendered and checked against results.json and what the terminal printed.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main as loadgen_main
from core.conditions import VERDICT_INFO
from diagnose.answer import print_answer
from diagnose.decision.model import (
    NOT_MEASURED,
    Decision,
    EngineResult,
    PhaseMark,
    Row,
    RunInfo,
    Step,
)
from diagnose.decision.one_engine import decide_single
from diagnose.decision.roofline import roofline
from diagnose.decision.two_engines import decide_compare
from diagnose.report.html.plots import (
    PLOTS,
    plot_decode_aggregate,
    plot_decode_per_sequence,
    plot_ttft,
)
from diagnose.report.html.write import write_report
from diagnose.step_table import STEP_QUESTIONS, STEPS
from tests.paths import ROOT
from tests.plugins.llama import LlamaServer
from tests.report_browser import Page, colored_pixels, dark_pixels, render

# A plot's axes must hold at least this many clearly coloured pixels (a drawn series).
MIN_DATA_PIXELS = 150


def assert_report_renders(out: Path) -> Page:
    """report.html in Chromium: each plot drawn with data or left out with a reason.

    Every id of PLOTS is either a figure whose axes hold drawn, coloured pixels in the
    screenshot, or a "not measured" line; never an empty box. The metadata block is laid
    out and painted, concurrency ticks are plain numbers and phase labels do not overlap.
    """
    page = render(out / "report.html", out)
    for pid in PLOTS:
        drawn, missing = pid in page.plots, pid in page.missing
        assert drawn != missing, f"{pid}: drawn={drawn} missing={missing}"
        if missing:
            assert "not measured: " in page.missing[pid]
    for pid, plot in page.plots.items():
        assert plot.axes is not None, f"{pid}: no axes in the SVG"
        assert plot.axes.w > 200 and plot.axes.h > 100, (pid, plot.axes)
        inked = colored_pixels(page.screenshot, plot.axes.inset(3))
        assert inked >= MIN_DATA_PIXELS, f"{pid}: empty plot area ({inked} coloured pixels)"
        for a, (ta, ba) in enumerate(plot.labels):
            for tb, bb in plot.labels[a + 1 :]:
                assert not ba.overlaps(bb), f"{pid}: labels {ta!r} and {tb!r} overlap"
        if pid in ("decode-per-sequence", "decode-aggregate", "ttft-vs-concurrency"):
            assert plot.xticks and all(re.fullmatch(r"\d+", t) for t in plot.xticks), plot.xticks
        roofline = [i for i in plot.ids if "roofline" in i]
        if pid != "decode-per-sequence":
            assert not roofline, f"{pid}: the per-sequence roofline is drawn here"
    assert page.metadata is not None, "no metadata block"
    box, text = page.metadata
    for label in ("tool version", "command", "started (UTC)", "finished (UTC)", "GPU driver"):
        assert label in text, label
    assert dark_pixels(page.screenshot, box.inset(1)) > 500, "metadata block not painted"
    return page


def _load_row(
    name: str, step: str, c: int, per_seq: float, aggregate: float, ttft: float, **extra: Any
) -> Row:
    """A load row at concurrency `c`: three 128-token requests per sequence, all tokens back."""
    return Row(
        name, step, c, prompt_tokens=128, max_tokens=128, requests=3 * c,
        completion_tokens=384 * c, tokens_ok=True, per_seq_tok_s=per_seq,
        aggregate_tok_s=aggregate, ttft_s=ttft, **extra,
    )  # fmt: skip


def _engine(
    name: str,
    kind: str,
    scale: float,
    t0: float = 1_790_000_000.0,
    verdict: str = "decode_below_card_limit",
) -> EngineResult:
    """A fully measured engine: phases, memory timeline, load steps and a context sweep."""
    # A Q4_0 Gemma 3 27B, all 63 layers on a 72 GB RTX PRO 5000, launched by diagnose.
    e = EngineResult(
        name=name, kind=kind, url="http://127.0.0.1:8080", model="gemma-3-27b",
        quantization="Q4_0", weights_bytes=15.2e9, process_gpu_bytes=17e9,
        layers_offloaded=63, layers_total=63, gpu_total_bytes=72e9,
        gpu_name="NVIDIA RTX PRO 5000", bandwidth_bytes_per_s=1.344e12,
        bandwidth_source="table", memory_source="gpu", load_seconds=12.5, slots=8,
        slot_context=4096, trained_context=131072, launched=True,
    )  # fmt: skip
    # As in a real run: after and weights take milliseconds, so their labels would collide.
    starts = [0, 0.2, 14.0, 44.0, 46.0, 46.01, 46.02, 52, 60, 70, 80]
    names = ["baseline", "start", "settle", "first_generation", "after", "weights", "single"]
    names += ["concurrency"] * 3 + ["context"]
    e.phases.extend(
        PhaseMark(n, t0 + s, t0 + s + 0.5, 1e9 + 2e8 * s)
        for n, s in zip(names, starts, strict=True)
    )
    e.timeline.extend((t0 + i, 1e9 + 0.2e9 * min(i, 50)) for i in range(90))
    e.rows.append(
        _load_row(name, "single", 1, 60 * scale, 59 * scale, 0.05, per_token_ms=16 / scale)
    )
    for c in (2, 4, 8):
        e.rows.append(_load_row(name, "concurrency", c, 55 * scale, 52 * c * scale, 0.05 * c))
    for ctx, mem in ((8192, 17e9), (32768, 21e9), (131072, 35e9)):
        e.rows.append(
            Row(name, "context", 1, context=ctx, loaded_memory_bytes=mem, kv_bytes=mem - 16e9)
        )
    return replace(e, roofline=roofline(e), verdict=verdict, action=VERDICT_INFO[verdict].action)


def _steps(e: EngineResult) -> list[Step]:
    """diagnose's steps in order; the ones without rows say `not measured: why`."""
    out = []
    for key in STEPS:
        why = next((m.split(": ", 1)[1] for m in e.missing if m.startswith(key + ": ")), None)
        answer = NOT_MEASURED + why if why else f"{key} measured"
        out.append(Step(key, STEP_QUESTIONS[key], answer))
    return out


def printed_answer(out: Path, engines: list[EngineResult], decision: Decision) -> str:
    """What diagnose/compare print on the terminal for this answer."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_answer(engines, decision, out)
    return buf.getvalue()


def assert_same_answer(out: Path, terminal: str) -> None:
    """report.md and report.html say what results.json and the terminal say, word for word."""
    doc = json.loads((out / "results.json").read_text())
    md = (out / "report.md").read_text()
    page = render(out / "report.html", out)
    assert page.answer is not None and page.metadata is not None
    answer_text = " ".join(page.answer.split())
    said = [doc["recommendation"], doc["action"], *doc["caveats"]]
    said += [f"{e['basis']} ≈ {e['tok_s']:.1f} tok/s" for e in doc["decision"]["estimates"]]
    for text in said:
        assert text in terminal, text
        assert text in md, text
        # report.html shows `code` spans as <code>: the same words without the backticks.
        assert " ".join(text.replace("`", "").split()) in answer_text, text
    comparable = "yes" if doc["comparable"] else "no"
    assert f"**Comparable:** {comparable}" in md
    assert f"Comparable: {comparable}" in answer_text
    for step in doc["decision"]["steps"]:
        assert step["answer"] in md and step["answer"] in terminal
    for n, v in doc["verdict"].items():
        assert f"{n}: {v}" in terminal
        assert f"| {n} | `{v}` |" in md
        assert f"{n} {v}" in answer_text
        # Said once: in the answer, not again as a heading or in the steps.
        assert md.count(f"`{v}`") == 1, v
    # The metadata block holds results.json's run record.
    for key in ("tool_version", "command", "started_at", "finished_at"):
        if doc.get(key):
            assert doc[key] in md, key
            assert doc[key] in page.metadata[1], key


def test_compare_report_renders_every_plot(tmp_path: Path) -> None:
    a = _engine("llama", "llamacpp", 1.0)
    b = _engine("sglang", "sglang", 1.02, t0=1_790_000_100.0, verdict="scheduling_bound")
    b = replace(b, rows=[r for r in b.rows if r.step != "concurrency"])
    for c, agg in ((2, 130.0), (4, 250.0), (8, 480.0)):
        rounds = [agg * 0.98, agg, agg * 1.01]
        b.rows.append(
            _load_row("sglang", "concurrency", c, agg / c, agg, 0.04, aggregate_rounds=rounds)
        )
    b = replace(b, weights_bytes=51.1 * 2**30)  # bf16 against Q4_0: not comparable
    # ... and at bf16 speed: 60 tok/s would be beyond physics (no estimate from it).
    rows = [replace(r, per_seq_tok_s=20.5) if r.step == "single" else r for r in b.rows]
    b = replace(b, rows=rows)
    b = replace(b, roofline=roofline(b), engine_version=None)
    # Fields a later EngineResult may carry (the exporter's info labels) show once present.
    a = replace(a, engine_version="b6700 (3df2244d)", gpu_driver="580.95.05")
    decision = decide_compare(a, b)
    assert decision.comparable is False and decision.estimates
    run = RunInfo(
        "llmb-loadgen compare --engine llama --engine sglang", "0.1.0", "2026-11-30T18:00:00Z"
    )
    write_report(tmp_path, [a, b], decision, title="compare llama vs sglang", run=run)
    page = assert_report_renders(tmp_path)
    assert set(page.plots) == set(PLOTS)
    # Aggregate above the per-sequence limit: fine, because the limit is not drawn there.
    assert max(r.aggregate_tok_s or 0 for r in a.rows) > (a.roofline.limit_tok_s or 0)
    assert any("roofline" in i for i in page.plots["decode-per-sequence"].ids)
    assert page.metadata is not None
    meta = page.metadata[1]
    assert "llmb-loadgen compare --engine llama --engine sglang" in meta
    assert "2026-11-30T18:00:00Z" in meta and "NVIDIA RTX PRO 5000" in meta
    assert "b6700 (3df2244d)" in meta and "580.95.05" in meta
    assert "sglang build not read: pass --exporter-url" in meta
    assert "driver not read: pass --exporter-url" in meta
    assert_same_answer(tmp_path, printed_answer(tmp_path, [a, b], decision))


# What a run without an exporter or NVML does not know of the card, the memory and the load.
NOT_READ: dict[str, Any] = dict.fromkeys(
    (
        "memory_source", "gpu_name", "gpu_total_bytes", "process_gpu_bytes",
        "bandwidth_bytes_per_s", "bandwidth_source", "layers_offloaded", "layers_total",
        "load_seconds",
    )
)  # fmt: skip


def test_diagnose_report_without_sweep_or_exporter_leaves_the_plots_out(tmp_path: Path) -> None:
    """A diagnose of a running engine, no exporter: no memory plots, each with its reason."""
    e = _engine("llama", "llamacpp", 1.0)
    e = replace(
        e,
        rows=[r for r in e.rows if r.step != "context"],
        timeline=[],
        missing=[
            "context: needs a launch template with {ctx} (the engine was already running)",
            "roofline: no GPU bandwidth known (pass --bandwidth-gbs)",
        ],
        **NOT_READ,
    )
    e = replace(e, roofline=roofline(e))
    decision = decide_single(e, _steps(e))
    run = RunInfo(
        "llmb-loadgen diagnose --url http://127.0.0.1:8080", "0.1.0", "2026-11-30T18:00:00Z"
    )
    write_report(tmp_path, [e], decision, title="diagnose llama", run=run)
    page = assert_report_renders(tmp_path)
    assert set(page.missing) == {"memory-timeline", "memory-vs-context"}
    assert "needs a launch template with {ctx}" in page.missing["memory-vs-context"]
    assert "--exporter-url" in page.missing["memory-timeline"]
    assert "command" in (page.metadata or (None, ""))[1]
    html = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    for text in (html, md):
        assert "None" not in text and "?/?" not in text
        # Flags are wrapped in <span class="flag"> in the HTML; other tags end a cell.
        text = re.sub(r"</?span[^>]*>", "", text)
        for line in text.splitlines():
            # Every unknown names what fixes it: a flag, a config key or the step's reason.
            for unknown in re.findall(r"unknown: [^|<]*", line):
                assert re.search(
                    r"--[a-z-]+|engines\[\]\.|gpu\.|not recorded|/v1/models|/slots", unknown
                ), unknown
        assert "--bandwidth-gbs" in text  # the roofline is unknown: the flag that fixes it
        assert "engines[].log_file" in text  # layers unknown: the setting that fixes it
    assert_same_answer(tmp_path, printed_answer(tmp_path, [e], decision))


def test_bare_report_has_no_plot_at_all(tmp_path: Path) -> None:
    e = EngineResult(name="bare", kind="llamacpp", missing=["single: the engine did not start"])
    write_report(tmp_path, [e], decide_single(e, _steps(e)), title="diagnose bare")
    page = assert_report_renders(tmp_path)
    assert page.plots == {}
    assert set(page.missing) == set(PLOTS)
    assert "the engine did not start" in page.missing["decode-per-sequence"]


def test_flags_named_in_the_report_exist() -> None:
    """Every flag and config key the report's hints name is one diagnose, compare and the
    config accept (read from every string literal of the diagnose/report/ package)."""
    import argparse
    import ast

    from config import kinds
    from config.settings import EngineConfig, GpuConfig
    from diagnose.cli import COMPARE, DIAGNOSE
    from diagnose.report import html as htmlreport

    sources = sorted(Path(htmlreport.__file__).parents[1].rglob("*.py"))
    assert len(sources) > 3, sources
    literals = [
        n.value
        for source in sources
        for n in ast.walk(ast.parse(source.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    # The engine kinds' residency fixes, which the answer and the report print.
    literals += [e.residency.layers_fix for e in kinds.engines()]
    # Flags of llama-server itself, quoted as "(llama-server ...)", are not ours.
    hints = re.sub(r"\(llama-server [^)]*\)", "", " ".join(literals))
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", hints))
    assert {"--exporter-url", "--bandwidth-gbs", "--rounds"} <= flags
    for command in (DIAGNOSE, COMPARE):
        parser = argparse.ArgumentParser()
        command.configure(parser)
        assert flags <= set(parser._option_string_actions), command.name
    engine_keys = set(re.findall(r"engines\[\]\.(\w+)", hints))
    assert engine_keys == {"launch", "log_file"}
    assert engine_keys <= set(EngineConfig.model_fields)
    assert set(re.findall(r"gpu\.(\w+)", hints)) <= set(GpuConfig.model_fields)


def _xticks(svg: str) -> list[tuple[float, str]]:
    """(x, label) of each x tick label in a matplotlib SVG."""
    out = []
    for tick in re.findall(r'<g id="xtick_\d+">(.*?)</text>', svg, re.S):
        found = re.search(r'<text [^>]*x="([\d.]+)"[^>]*>([^<]*)$', tick, re.S)
        assert found is not None
        out.append((float(found.group(1)), found.group(2).strip()))
    return out


def test_concurrency_ticks_are_plain_and_apart() -> None:
    """1..64 on a linear axis: plain numbers, 1 and 64 labelled, no two labels crowded."""
    e = _engine("a", "llamacpp", 1.0)
    rows = [
        Row("a", "concurrency", c, aggregate_tok_s=50.0 * c, per_seq_tok_s=50.0, ttft_s=0.1)
        for c in (2, 4, 8, 16, 32, 64)
    ]
    e = replace(e, rows=[r for r in e.rows if r.step != "concurrency"] + rows)
    for plot in (plot_decode_aggregate([e]), plot_decode_per_sequence([e]), plot_ttft([e])):
        assert plot.svg is not None
        ticks = _xticks(plot.svg)
        labels = [label for _, label in ticks]
        assert all(re.fullmatch(r"\d+", label) for label in labels), labels
        assert labels[0] == "1" and labels[-1] == "64"
        xs = [x for x, _ in ticks]
        # Linear: 64 is four times as far from 0 as 16.
        x0 = xs[0] - (xs[labels.index("64")] - xs[0]) / 63
        assert (xs[-1] - x0) == pytest.approx(4 * (xs[labels.index("16")] - x0), rel=0.01)
        assert min(b - a for a, b in itertools.pairwise(xs)) > 20  # no crowded labels


def test_no_loadgen_module_imports_matplotlib() -> None:
    """matplotlib is an optional extra: importing any loadgen module must not load it."""
    code = (
        "import importlib, pkgutil, sys, loadgen\n"
        "for m in pkgutil.iter_modules(loadgen.__path__):\n"
        "    importlib.import_module('loadgen.' + m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] == 'matplotlib')\n"
        "print(bad[:3])\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _script(out: Path, extra: str = "") -> str:
    return (
        "import logging, sys\n" + extra + "logging.basicConfig(level=logging.DEBUG)\n"
        "from pathlib import Path\n"
        "from tests.system.test_htmlreport import _engine, _steps\n"
        "from diagnose.decision.one_engine import decide_single\n"
        "from diagnose.report.html.write import write_report\n"
        "e = _engine('llama', 'llamacpp', 1.0)\n"
        f"write_report(Path({str(out)!r}), [e], decide_single(e, _steps(e)), title='d llama')\n"
    )


def test_no_third_party_log_lines(tmp_path: Path) -> None:
    """A fresh matplotlib cache (font cache built now) logs nothing, even at DEBUG."""
    env = {"MPLCONFIGDIR": str(tmp_path / "mpl"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    argv = [sys.executable, "-c", _script(tmp_path / "out")]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # The font cache was built by this run: the case that logs "generated new fontManager".
    assert any(p.name.startswith("fontlist") for p in (tmp_path / "mpl").iterdir())
    noisy = [ln for ln in done.stderr.splitlines() if re.search(r"matplotlib|PIL|font", ln, re.I)]
    assert noisy == []
    assert (tmp_path / "out" / "report.html").exists()


def test_missing_matplotlib_is_one_warning(tmp_path: Path) -> None:
    block = "sys.modules['matplotlib'] = None  # import matplotlib now raises ImportError\n"
    script = _script(tmp_path / "out", block).replace("write_report(", "print(write_report(")
    done = subprocess.run(
        [sys.executable, "-c", script + ")\n"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    import ast

    (warning,) = ast.literal_eval(done.stdout.strip())  # the list write_report returned
    assert warning.startswith("report.html not written: it needs matplotlib")
    assert "pip install 'llm-bottleneck[report]'" in warning
    # The measurements are not lost.
    assert json.loads((tmp_path / "out" / "results.json").read_text())["engines"]
    assert (tmp_path / "out" / "report.md").read_text().startswith("# llm-bottleneck")
    assert not (tmp_path / "out" / "report.html").exists()


@pytest.mark.llamaserver
def test_report_of_a_real_diagnose(
    tmp_path: Path, llama_server: Callable[..., LlamaServer], capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's user path: `diagnose --url` against the real CPU llama-server, no config.

    No launch template, no exporter, no GPU: the memory plots are left out with their
    reasons, the load plots are drawn, and the report says what the terminal said.
    """
    server = llama_server(ctx=2048, parallel=2)
    out = tmp_path / "out"
    code = loadgen_main(
        ["diagnose", "--url", server.url, "--kind", "llamacpp", "--out", str(out),
         "--concurrency", "1,2", "--prompt-tokens", "32", "--max-tokens", "16",
         "--kv-prompt-tokens", "256"]
    )  # fmt: skip
    terminal = capsys.readouterr().out
    assert code == 0, terminal
    page = assert_report_renders(out)
    assert {"decode-per-sequence", "decode-aggregate", "ttft-vs-concurrency"} <= set(page.plots)
    assert "memory-vs-context" in page.missing
    assert_same_answer(out, terminal)
    doc = json.loads((out / "results.json").read_text())
    assert doc["command"].startswith("llmb-loadgen diagnose --url")
    md = (out / "report.md").read_text()
    assert "None" not in md
    assert "--bandwidth-gbs" in md  # no GPU here: the roofline needs the bandwidth
