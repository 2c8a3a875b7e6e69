"""The diagnose/compare report: report.md, a self-contained report.html and results.json.

Plots are drawn with matplotlib's SVG backend and embedded inline, so the
HTML needs no network and no files next to it. A plot without data is still drawn,
with the reason written in it, so a reader sees what was not measured.
"""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from loadgen.decision import (
    Decision,
    EngineResult,
    Row,
    results_to_dict,
    roofline_fraction,
    roofline_tok_s,
)

PLOTS = ("memory-timeline", "memory-vs-context", "decode-vs-concurrency", "ttft-vs-concurrency")
GIB = 2**30
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def _svg(draw: Callable[[Axes], None], width: float = 7.5, height: float = 3.6) -> str:
    """Draw on a fresh figure and return its SVG markup (without the XML prolog)."""
    # A bare Figure needs no pyplot state and no global backend choice.
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot()
    draw(ax)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buf = io.StringIO()
    # Real <text> elements: smaller files, searchable and selectable in the browser.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.find("<svg") :]


def _no_data(ax: Axes, reason: str) -> None:
    ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_memory_timeline(engines: list[EngineResult]) -> str:
    """Memory used over time with a vertical marker at every phase start."""

    def draw(ax: Axes) -> None:
        t0 = min(
            [p.start for e in engines for p in e.phases]
            + [t for e in engines for t, _ in e.timeline],
            default=None,
        )
        if t0 is None or not any(e.timeline or e.phases for e in engines):
            _no_data(ax, "no memory samples (no exporter, NVML or launched engine)")
            return
        for i, e in enumerate(engines):
            color = COLORS[i % len(COLORS)]
            pts = sorted(e.timeline)
            if pts:
                ax.plot(
                    [t - t0 for t, _ in pts],
                    [v / GIB for _, v in pts],
                    color=color,
                    label=f"{e.name} ({e.memory_source or '?'})",
                )
            seen: set[str] = set()
            for p in e.phases:
                ax.axvline(p.start - t0, color=color, alpha=0.35, linestyle="--", linewidth=0.8)
                if p.name not in seen:
                    seen.add(p.name)
                    ax.text(
                        p.start - t0,
                        1.0,
                        p.name,
                        rotation=90,
                        va="top",
                        ha="right",
                        fontsize=7,
                        color=color,
                        transform=ax.get_xaxis_transform(),
                    )
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("memory used (GiB)")
        ax.set_title("Memory timeline with phases")
        if any(e.timeline for e in engines):
            ax.legend(fontsize=8, loc="lower right")
        else:
            ax.text(
                0.5,
                0.5,
                "no memory samples (no exporter, NVML or launched engine)",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )

    return _svg(draw)


def plot_memory_vs_context(engines: list[EngineResult]) -> str:
    """Loaded memory (and KV cache bytes where known) against the context length."""

    def draw(ax: Axes) -> None:
        drawn = False
        for i, e in enumerate(engines):
            color = COLORS[i % len(COLORS)]
            rows = sorted(
                (r for r in e.rows if r.step == "context" and r.context and r.loaded_memory_bytes),
                key=lambda r: r.context or 0,
            )
            if rows:
                drawn = True
                ax.plot(
                    [r.context or 0 for r in rows],
                    [(r.loaded_memory_bytes or 0) / GIB for r in rows],
                    marker="o",
                    color=color,
                    label=f"{e.name} loaded memory",
                )
            kv = [r for r in rows if r.kv_bytes]
            if kv:
                ax.plot(
                    [r.context or 0 for r in kv],
                    [(r.kv_bytes or 0) / GIB for r in kv],
                    marker="s",
                    linestyle=":",
                    color=color,
                    label=f"{e.name} KV cache",
                )
            for r in e.rows:
                if r.step == "context" and r.context and r.error:
                    drawn = True
                    ax.axvline(r.context, color=color, linestyle="-.", alpha=0.7)
                    ax.text(
                        r.context,
                        0.5,
                        f"{e.name} failed",
                        rotation=90,
                        fontsize=7,
                        color=color,
                        transform=ax.get_xaxis_transform(),
                    )
            if e.gpu_total_bytes and e.memory_source == "gpu":
                ax.axhline(e.gpu_total_bytes / GIB, color="black", linewidth=0.8)
        if not drawn:
            _no_data(ax, "no context sweep (needs a launch template and --contexts)")
            return
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("GiB")
        ax.set_title("Memory vs context")
        ax.legend(fontsize=8)

    return _svg(draw)


def _by_concurrency(e: EngineResult) -> list[Row]:
    rows = {r.concurrency: r for r in e.ok_rows("concurrency")}
    single = e.single()
    if single is not None:
        rows.setdefault(1, single)
    return [rows[c] for c in sorted(rows)]


def plot_decode(engines: list[EngineResult]) -> str:
    """Per-sequence and aggregate decode tok/s against concurrency, with the roofline."""

    def draw(ax: Axes) -> None:
        drawn = False
        for i, e in enumerate(engines):
            color = COLORS[i % len(COLORS)]
            rows = _by_concurrency(e)
            if not rows:
                continue
            drawn = True
            xs = [r.concurrency for r in rows]
            ax.plot(
                xs,
                [r.per_seq_tok_s or math.nan for r in rows],
                marker="o",
                color=color,
                label=f"{e.name} per sequence",
            )
            ax.plot(
                xs,
                [r.aggregate_tok_s or math.nan for r in rows],
                marker="s",
                linestyle="--",
                color=color,
                label=f"{e.name} aggregate",
            )
            roof = roofline_tok_s(e)
            if roof:
                ax.axhline(
                    roof,
                    color=color,
                    linestyle=":",
                    linewidth=1.2,
                    label=f"{e.name} roofline {roof:.0f} tok/s",
                )
        if not drawn:
            _no_data(ax, "no decode rows measured")
            return
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("tokens/s")
        ax.set_title("Decode throughput vs concurrency")
        ax.legend(fontsize=8)

    return _svg(draw)


def plot_ttft(engines: list[EngineResult]) -> str:
    """Mean time to first token against concurrency."""

    def draw(ax: Axes) -> None:
        drawn = False
        for i, e in enumerate(engines):
            rows = [r for r in _by_concurrency(e) if r.ttft_s is not None]
            if rows:
                drawn = True
                ax.plot(
                    [r.concurrency for r in rows],
                    [(r.ttft_s or 0) * 1000 for r in rows],
                    marker="o",
                    color=COLORS[i % len(COLORS)],
                    label=e.name,
                )
        if not drawn:
            _no_data(ax, "no TTFT measured")
            return
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("TTFT (ms)")
        ax.set_title("Time to first token vs concurrency")
        ax.legend(fontsize=8)

    return _svg(draw)


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


TABLE_HEAD = (
    "engine",
    "step",
    "ctx",
    "slots",
    "conc",
    "prompt tok",
    "gen tok",
    "tokens ok",
    "TTFT ms",
    "ms/token",
    "server ms/token",
    "per-seq tok/s",
    "aggregate tok/s",
    "memory GiB",
    "loaded GiB",
    "load s",
    "error",
)


def table_rows(engines: list[EngineResult]) -> list[list[str]]:
    """The side-by-side table, one list of cells per measured row."""
    out = []
    for e in engines:
        for r in e.rows:
            out.append(
                [
                    e.name,
                    r.step,
                    _fmt(r.context),
                    _fmt(r.parallel),
                    str(r.concurrency),
                    _fmt(r.prompt_tokens, 0),
                    str(r.completion_tokens),
                    _fmt(r.tokens_ok),
                    _fmt(r.ttft_s * 1000 if r.ttft_s is not None else None),
                    _fmt(r.per_token_ms, 2),
                    _fmt(r.server_per_token_ms, 2),
                    _fmt(r.per_seq_tok_s),
                    _fmt(r.aggregate_tok_s),
                    _gib(r.memory_bytes),
                    _gib(r.loaded_memory_bytes),
                    _fmt(r.load_seconds, 2),
                    r.error or "",
                ]
            )
    return out


def _phase_rows(engines: list[EngineResult]) -> list[list[str]]:
    out = []
    for e in engines:
        for p in e.phases:
            start = datetime.fromtimestamp(p.start, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
            dur = f"{p.end - p.start:.2f}" if p.end is not None else "—"
            out.append([e.name, p.name, start, dur, _gib(p.memory_bytes), p.note])
    return out


def _engine_facts(engines: list[EngineResult]) -> list[list[str]]:
    out = []
    for e in engines:
        frac = roofline_fraction(e)
        out.append(
            [
                e.name,
                e.kind,
                e.model or "—",
                e.quantization or "—",
                _gib(e.weights_bytes),
                _gib(e.process_gpu_bytes),
                f"{_fmt(e.layers_offloaded, 0)}/{_fmt(e.layers_total, 0)}",
                e.memory_source or "—",
                _fmt(e.load_seconds, 2),
                "—" if frac is None else f"{frac * 100:.0f} %",
            ]
        )
    return out


FACTS_HEAD = (
    "engine",
    "kind",
    "model",
    "quantization",
    "weights GiB",
    "process mem GiB",
    "layers on GPU",
    "memory source",
    "load s",
    "roofline",
)
PHASE_HEAD = ("engine", "phase", "start (UTC)", "seconds", "memory GiB", "note")


def _md_table(head: tuple[str, ...], rows: list[list[str]]) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(head: tuple[str, ...], rows: list[list[str]], cls: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def render_markdown(engines: list[EngineResult], decision: Decision, title: str) -> str:
    """report.md: verdict, decision steps with numbers, tables, what could not be measured."""
    parts = [
        f"# llm-bottleneck {title}",
        "",
        f"**Verdict: {decision.verdict}**",
        "",
        decision.recommendation,
        "",
    ]
    if decision.caveats:
        parts += ["## Caveats", ""] + [f"- {c}" for c in decision.caveats] + [""]
    parts += ["## Decision (in order)", ""]
    for s in decision.steps:
        mark = " ← decided" if s.decisive else ""
        parts.append(f"{s.number}. **{s.question}** {s.answer}{mark}")
    parts += [
        "",
        "## Engines",
        "",
        _md_table(FACTS_HEAD, _engine_facts(engines)),
        "",
        "## Measurements",
        "",
        _md_table(TABLE_HEAD, table_rows(engines)),
        "",
        "## Phases",
        "",
        _md_table(PHASE_HEAD, _phase_rows(engines)),
        "",
    ]
    missing = [f"- {e.name}: {m}" for e in engines for m in e.missing]
    parts += ["## Not measured", ""] + (missing or ["- nothing: every row was produced"]) + [""]
    parts += ["Plots: see report.html."]
    return "\n".join(parts) + "\n"


CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
td:first-child,th:first-child,td:last-child{text-align:left}
.verdict{font-size:1.4em;font-weight:bold;padding:.4em;background:#f3f3f3}
figure{margin:1em 0} figure svg{max-width:100%;height:auto}
.decisive{font-weight:bold}
"""

# Counts the plots whose SVG the browser actually laid out with a non-empty box; the
# headless-browser test reads the result from the DOM.
CHECK_JS = """
window.addEventListener('load', function () {
  var n = 0;
  document.querySelectorAll('figure.plot svg').forEach(function (svg) {
    var box = svg.getBoundingClientRect();
    if (box.width > 50 && box.height > 50 && svg.querySelectorAll('path').length > 0) { n++; }
  });
  document.body.setAttribute('data-plots-rendered', String(n));
});
"""


def render_html(engines: list[EngineResult], decision: Decision, title: str) -> str:
    """The self-contained report.html with every plot inline."""
    plots = {
        "memory-timeline": (
            "GPU memory timeline with phase markers",
            plot_memory_timeline(engines),
        ),
        "memory-vs-context": (
            "Memory (KV / GPU) vs context per engine",
            plot_memory_vs_context(engines),
        ),
        "decode-vs-concurrency": (
            "Decode tok/s per sequence and aggregate vs concurrency, with the roofline",
            plot_decode(engines),
        ),
        "ttft-vs-concurrency": ("TTFT vs concurrency", plot_ttft(engines)),
    }
    steps = "".join(
        f'<li class="{"decisive" if s.decisive else ""}"><b>{html.escape(s.question)}</b> '
        f"{html.escape(s.answer)}</li>"
        for s in decision.steps
    )
    caveats = "".join(f"<li>{html.escape(c)}</li>" for c in decision.caveats)
    missing = (
        "".join(
            f"<li>{html.escape(e.name)}: {html.escape(m)}</li>" for e in engines for m in e.missing
        )
        or "<li>nothing: every row was produced</li>"
    )
    figs = "".join(
        f'<figure class="plot" id="plot-{pid}"><figcaption>{html.escape(cap)}</figcaption>{svg}'
        "</figure>"
        for pid, (cap, svg) in plots.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>llm-bottleneck {html.escape(title)}</title>
<style>{CSS}</style></head>
<body data-plots="{len(plots)}">
<h1>llm-bottleneck {html.escape(title)}</h1>
<p class="verdict" id="verdict">Verdict: {html.escape(decision.verdict)}</p>
<p id="recommendation">{html.escape(decision.recommendation)}</p>
{f"<h2>Caveats</h2><ul>{caveats}</ul>" if caveats else ""}
<h2>Decision, in order</h2><ol>{steps}</ol>
<h2>Engines</h2>{_html_table(FACTS_HEAD, _engine_facts(engines), "facts")}
<h2>Plots</h2>{figs}
<h2>Measurements</h2>{_html_table(TABLE_HEAD, table_rows(engines), "rows")}
<h2>Phases</h2>{_html_table(PHASE_HEAD, _phase_rows(engines), "phases")}
<h2>Not measured</h2><ul>{missing}</ul>
<script>{CHECK_JS}</script>
</body></html>
"""


def write_report(out: Path, engines: list[EngineResult], decision: Decision, title: str) -> None:
    """Write report.md, report.html and results.json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(render_markdown(engines, decision, title), encoding="utf-8")
    (out / "report.html").write_text(render_html(engines, decision, title), encoding="utf-8")
    doc = results_to_dict(engines, decision)
    doc["title"] = title
    (out / "results.json").write_text(
        json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8"
    )
