"""The diagnose/compare report: report.md, a self-contained report.html and results.json.

Both reports lead with the answer, in the words of results.json: the verdict of each
engine (said once), the recommendation, whether the engines compare like with like, and
the caveats. A metadata block follows (tool version, command line, UTC time, engine
version, GPU), then the plots and the tables.

Plots are drawn with matplotlib's SVG backend and embedded inline, so the HTML needs no
network and no files next to it. A plot without data is left out, and a line says what
was not measured and why. matplotlib is an optional extra (`[report]`): it is imported
only when a plot is drawn, and its log lines never reach the terminal.
"""

from __future__ import annotations

import html
import io
import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import core
from core import VERDICT_INFO
from diagnose.decision import Decision, EngineResult, Row, RunInfo, results_to_dict
from exporter import __version__

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Every plot the report can hold, in the order shown.
PLOTS = (
    "memory-timeline",
    "memory-vs-context",
    "decode-per-sequence",
    "decode-aggregate",
    "ttft-vs-concurrency",
)
GIB = 2**30
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
INSTALL_HINT = "pip install 'llm-bottleneck[report]'"

# How to get a value that came out unknown: every "unknown" in the report names its fix.
FIX_EXPORTER = "pass --exporter-url (an llmb-exporter on the GPU host)"
FIX_BANDWIDTH = "pass --bandwidth-gbs (or set gpu.bandwidth_bytes_per_second in the config)"
FIX_LAUNCH = "add a launch template (engines[].launch) to the config so the tool starts the engine"
FIX_LLAMA_LOG = (
    "set engines[].log_file in the config (llama-server -lv 4 --log-file ...) or pass "
    "--exporter-url"
)
FIX_CONTEXT_SWEEP = (
    "needs a launch template with {ctx} (engines[].launch) in the config; --contexts or "
    "--max-context set its range"
)

# Phase labels above the memory timeline: rows before a label is left to the phase table.
LABEL_ROWS = 3
LABEL_PAD_PX = 6.0


class PlottingMissing(SystemExit):
    """report.html cannot be drawn because matplotlib is not installed.

    A SystemExit, so the command line ends with this one line instead of a traceback;
    results.json and report.md are written before it is raised.
    """


def _matplotlib() -> Any:
    """Import matplotlib quietly, or stop with one line that says how to install it."""
    # matplotlib logs while it builds its font cache or picks a cache folder ("generated new
    # fontManager"); that is nothing the user asked about. Set before the import logs it.
    for name in ("matplotlib", "PIL"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: F401
        from matplotlib.transforms import offset_copy  # noqa: F401
    except ImportError:
        raise PlottingMissing(
            f"llmb-loadgen: report.html needs matplotlib, which is not installed: {INSTALL_HINT}"
            " (results.json and report.md are written)"
        ) from None
    return matplotlib


# --- plots ---------------------------------------------------------------------------------


@dataclass
class Plot:
    """One plot of report.html, or the reason it was left out."""

    pid: str
    caption: str
    svg: str | None = None
    # "not measured: <why>" when there is no svg.
    missing: str = ""
    # Lines printed under the plot (what it leaves out and why).
    notes: list[str] = field(default_factory=list)


def _label(text: str) -> str:
    """Text safe from matplotlib's mathtext ($...$)."""
    return text.replace("$", r"\$")


def _new_axes(pid: str, width: float = 9.0, height: float = 3.6) -> tuple[Figure, Axes]:
    """A bare Figure (no pyplot state, no global backend) with one axes tagged for tests."""
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    # An Agg canvas gives a renderer to measure text with; saving as SVG still works.
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # The axes background carries an id, so a browser test can find the plot area.
    ax.patch.set_gid(f"{pid}-axes")
    ax.grid(True, alpha=0.3)
    return fig, ax


def _svg(fig: Figure, tight: bool = True) -> str:
    """The figure as SVG markup (without the XML prolog)."""
    matplotlib = _matplotlib()
    if tight:
        fig.tight_layout()
    buf = io.StringIO()
    # Real <text> elements: smaller files, searchable and selectable in the browser.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "llmb"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.find("<svg") :]


def _thin(values: Sequence[float], position: Callable[[float], float], gap: float) -> list[float]:
    """The values whose tick labels keep at least `gap` (axis fraction) between them."""
    kept: list[float] = []
    for v in sorted(set(values)):
        if not kept or position(v) - position(kept[-1]) >= gap:
            kept.append(v)
    return kept


def _concurrency_axis(ax: Axes, values: Sequence[int]) -> None:
    """A linear x axis with a plain tick at each measured concurrency."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    lo, hi = min(values), max(values)
    pad = max(0.5, 0.05 * (hi - lo))
    ax.set_xlim(lo - pad, hi + pad)
    ticks = _thin(values, lambda v: (v - lo + pad) / (hi - lo + 2 * pad), 0.045)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.set_xlabel("concurrent requests")


def _tokens(n: float) -> str:
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _context_axis(ax: Axes, values: Sequence[int]) -> None:
    """A log-spaced context axis labelled with plain token counts (8k, 32k), not powers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    lo, hi = float(min(values)), float(max(values))
    if lo == hi:
        ax.set_xlim(lo / 2, hi * 2)
        lo, hi = lo / 2, hi * 2
    ax.set_xscale("log", base=2)
    span = math.log2(hi) - math.log2(lo)
    ticks = _thin(values, lambda v: (math.log2(v) - math.log2(lo)) / span, 0.06)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _tokens(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("context (tokens)")


def _y_from_zero(ax: Axes) -> None:
    """y from 0 with room above the highest line, so no marker sits on the frame."""
    ys: list[float] = []
    for line in ax.get_lines():
        ys += [float(y) for y in cast("Sequence[float]", line.get_ydata())]
    top = max((y for y in ys if math.isfinite(y)), default=0.0)
    ax.set_ylim(0, top * 1.12 or 1.0)


def _legend(ax: Axes) -> None:
    ax.legend(fontsize=8, loc="best", framealpha=0.85)


def _missing_why(engines: list[EngineResult], step: str) -> str | None:
    """The reason diagnose recorded for `step` not running ("step: why" in missing)."""
    for e in engines:
        for m in e.missing:
            if m.startswith(step + ": "):
                return m.split(": ", 1)[1]
    return None


def _memory_why(engines: list[EngineResult]) -> str:
    if any(e.memory_source for e in engines):
        return "no memory sample was taken during the run"
    return (
        "no memory source: " + FIX_EXPORTER + ", or run on the GPU host so NVML is found, or "
        "let the tool launch the engine (host memory)"
    )


def plot_memory_timeline(engines: list[EngineResult]) -> Plot:
    """Memory used over time, with a marker and a non-overlapping label at each phase start."""
    plot = Plot("memory-timeline", "Memory used over the run, with the phases")
    series = [(i, e, sorted(e.timeline)) for i, e in enumerate(engines) if len(e.timeline) >= 2]
    if not series:
        plot.missing = "not measured: " + _memory_why(engines)
        return plot
    fig, ax = _new_axes(plot.pid, height=4.0)
    # Fixed side margins: label positions are measured once and stay valid.
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.12, top=0.8)
    t0 = min(
        [t for _, _, pts in series for t, _ in pts] + [p.start for e in engines for p in e.phases]
    )
    peak = 0.0
    for i, e, pts in series:
        peak = max(peak, max(v for _, v in pts))
        ax.plot(
            [t - t0 for t, _ in pts],
            [v / GIB for _, v in pts],
            color=COLORS[i % len(COLORS)],
            label=_label(f"{e.name} ({e.memory_source or 'memory'})"),
            linewidth=1.6,
        )
    totals = {e.gpu_total_bytes for e in engines if e.gpu_total_bytes and e.memory_source == "gpu"}
    for total in totals:
        if peak > total / 2:
            ax.axhline(total / GIB, color="black", linewidth=0.8, label="card total")
        else:
            plot.notes.append(f"The card's total ({total / GIB:.1f} GiB) is off the scale.")
    _y_from_zero(ax)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("memory used (GiB)")
    _legend(ax)
    marks: list[tuple[float, str, str]] = []
    for i, e in enumerate(engines):
        color = COLORS[i % len(COLORS)]
        seen: set[str] = set()
        for p in sorted(e.phases, key=lambda p: p.start):
            ax.axvline(p.start - t0, color=color, alpha=0.35, linestyle="--", linewidth=0.8)
            if p.name not in seen:
                seen.add(p.name)
                marks.append((p.start - t0, p.name, color))
    dropped = _place_phase_labels(fig, ax, plot.pid, marks)
    if dropped:
        plot.notes.append(
            "Phases too short to label here (see the phase table): " + ", ".join(dropped) + "."
        )
    plot.svg = _svg(fig, tight=False)
    return plot


def _group_marks(ax: Axes, marks: list[tuple[float, str, str]]) -> list[tuple[float, str, str]]:
    """Merge the labels of one engine's phases that start at the same pixel into one.

    Phases such as "after" and "weights" take milliseconds: their markers coincide, and
    "after, weights, single" reads better than three labels fighting for one spot.
    """
    groups: list[tuple[float, str, str]] = []
    last_px = -math.inf
    for x, name, color in sorted(marks, key=lambda m: (m[2], m[0])):
        px = float(ax.transData.transform((x, 0))[0])
        if groups and groups[-1][2] == color and px - last_px < 3:
            gx, gname, _ = groups[-1]
            groups[-1] = (gx, f"{gname}, {name}", color)
        else:
            groups.append((x, name, color))
        last_px = px
    return sorted(groups)


def _place_phase_labels(
    fig: Figure, ax: Axes, pid: str, marks: list[tuple[float, str, str]]
) -> list[str]:
    """Put each label in the first row above the axes where it overlaps no other label.

    Returns the labels that fit in no row (their phases stay in the phase table).
    """
    from matplotlib.transforms import offset_copy

    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    ax.get_xlim()  # settles the autoscaled limits, so data x maps to its final pixel
    row_right = [-math.inf] * LABEL_ROWS
    dropped: list[str] = []
    for n, (x, name, color) in enumerate(_group_marks(ax, marks)):
        placed = False
        for row in range(LABEL_ROWS):
            trans = offset_copy(
                ax.get_xaxis_transform(), fig=fig, x=1, y=3 + 11 * row, units="points"
            )
            text = ax.text(
                x, 1.0, name, transform=trans, ha="left", va="bottom", fontsize=7, color=color
            )
            text.set_clip_on(False)
            box = text.get_window_extent(renderer)
            if box.x0 >= row_right[row] + LABEL_PAD_PX and box.x1 <= fig.bbox.width:
                row_right[row] = box.x1
                text.set_gid(f"{pid}-phase-{n}")
                placed = True
                break
            text.remove()
        if not placed:
            dropped.append(name)
    return dropped


def plot_memory_vs_context(engines: list[EngineResult]) -> Plot:
    """Memory after loading (and the KV cache where known) against the context length."""
    plot = Plot("memory-vs-context", "Memory and KV cache vs context, per engine")
    ctx_rows = {e.name: [r for r in e.rows if r.step == "context" and r.context] for e in engines}
    has_data = any(
        r.loaded_memory_bytes or r.kv_bytes or r.error for rows in ctx_rows.values() for r in rows
    )
    if not has_data:
        why = _missing_why(engines, "context")
        plot.missing = "not measured: " + (
            why or "no context sweep ran (" + FIX_CONTEXT_SWEEP + ")"
        )
        return plot
    fig, ax = _new_axes(plot.pid)
    contexts: list[int] = []
    for i, e in enumerate(engines):
        color = COLORS[i % len(COLORS)]
        rows = sorted(ctx_rows[e.name], key=lambda r: r.context or 0)
        contexts += [r.context for r in rows if r.context]
        loaded = [r for r in rows if r.loaded_memory_bytes and not r.error]
        if loaded:
            ax.plot(
                [r.context or 0 for r in loaded],
                [(r.loaded_memory_bytes or 0) / GIB for r in loaded],
                marker="o",
                color=color,
                label=_label(f"{e.name} memory after loading"),
            )
        kv = [r for r in rows if r.kv_bytes and not r.error]
        if kv:
            ax.plot(
                [r.context or 0 for r in kv],
                [(r.kv_bytes or 0) / GIB for r in kv],
                marker="s",
                linestyle=":",
                color=color,
                label=_label(f"{e.name} KV cache"),
            )
        for r in rows:
            if r.error and r.context:
                ax.axvline(r.context, color=color, linestyle="-.", alpha=0.8)
                ax.text(
                    r.context,
                    0.97,
                    _label(f" {e.name} failed"),
                    va="top",
                    fontsize=7,
                    color=color,
                    transform=ax.get_xaxis_transform(),
                )
    totals = {e.gpu_total_bytes for e in engines if e.gpu_total_bytes and e.memory_source == "gpu"}
    for total in sorted(t for t in totals if t):
        ax.axhline(
            total / GIB, color="black", linewidth=0.8, label=f"card total {total / GIB:.0f} GiB"
        )
    _context_axis(ax, contexts)
    _y_from_zero(ax)
    ax.set_ylabel("GiB")
    if ax.get_legend_handles_labels()[0]:
        _legend(ax)
    plot.svg = _svg(fig)
    return plot


def _by_concurrency(e: EngineResult) -> list[Row]:
    rows = {r.concurrency: r for r in e.ok_rows("concurrency")}
    single = e.single()
    if single is not None:
        rows.setdefault(1, single)
    return [rows[c] for c in sorted(rows)]


def _load_why(engines: list[EngineResult]) -> str:
    why = _missing_why(engines, "single") or _missing_why(engines, "concurrency")
    if why:
        return why
    failed = [e.name for e in engines if any(r.error for r in e.rows)]
    if failed:
        return "no load step completed (" + ", ".join(failed) + ": see the error column)"
    return "no load step ran"


def roofline_unknown(e: EngineResult) -> str:
    """Why the card's decode limit is unknown for `e`, with the flag that fixes it."""
    if not (e.roofline.bandwidth_bytes_per_s or e.bandwidth_bytes_per_s):
        return "GPU memory bandwidth unknown: " + FIX_BANDWIDTH
    if not e.weights_bytes:
        return "model weight size unknown: " + FIX_EXPORTER
    return "single-request decode not measured"


def plot_decode_per_sequence(engines: list[EngineResult]) -> Plot:
    """Per-sequence decode tok/s against concurrency, under the card's per-sequence limit."""
    plot = Plot(
        "decode-per-sequence",
        "Decode tok/s per sequence vs concurrency, with the card's per-sequence limit",
    )
    series = [
        (i, e, rows)
        for i, e in enumerate(engines)
        if (rows := [r for r in _by_concurrency(e) if r.per_seq_tok_s])
    ]
    if not series:
        plot.missing = "not measured: " + _load_why(engines)
        return plot
    fig, ax = _new_axes(plot.pid)
    xs: list[int] = []
    for i, e, rows in series:
        color = COLORS[i % len(COLORS)]
        xs += [r.concurrency for r in rows]
        ax.plot(
            [r.concurrency for r in rows],
            [r.per_seq_tok_s or 0.0 for r in rows],
            marker="o",
            color=color,
            label=_label(f"{e.name} per sequence"),
        )
        roof = e.roofline.limit_tok_s
        if roof and e.roofline.misfit is not None:
            plot.notes.append(
                f"No card limit drawn for {e.name}: the bytes-per-step model does not fit the "
                f"measurement ({e.roofline.misfit})."
            )
        elif roof:
            line = ax.axhline(
                roof,
                color=color,
                linestyle=":",
                linewidth=1.4,
                label=_label(f"{e.name} card limit {roof:.0f} tok/s"),
            )
            line.set_gid(f"{plot.pid}-roofline-{i}")
        else:
            plot.notes.append(f"No card limit drawn for {e.name}: {roofline_unknown(e)}.")
    _concurrency_axis(ax, xs)
    _y_from_zero(ax)
    ax.set_ylabel("tok/s per sequence")
    _legend(ax)
    plot.svg = _svg(fig)
    return plot


def plot_decode_aggregate(engines: list[EngineResult]) -> Plot:
    """Aggregate decode tok/s against concurrency (no roofline: it bounds one sequence)."""
    plot = Plot("decode-aggregate", "Aggregate decode tok/s vs concurrency")
    series = [
        (i, e, rows)
        for i, e in enumerate(engines)
        if (rows := [r for r in _by_concurrency(e) if r.aggregate_tok_s])
    ]
    if not series:
        plot.missing = "not measured: " + _load_why(engines)
        return plot
    fig, ax = _new_axes(plot.pid)
    xs: list[int] = []
    for i, e, rows in series:
        xs += [r.concurrency for r in rows]
        ax.plot(
            [r.concurrency for r in rows],
            [r.aggregate_tok_s or 0.0 for r in rows],
            marker="s",
            color=COLORS[i % len(COLORS)],
            label=_label(f"{e.name} aggregate"),
        )
    _concurrency_axis(ax, xs)
    _y_from_zero(ax)
    ax.set_ylabel("tok/s, all sequences")
    _legend(ax)
    plot.notes.append(
        "The card's limit is per sequence and is not drawn here: one read of the weights serves "
        "every sequence of a batch, so the aggregate may exceed it."
    )
    plot.svg = _svg(fig)
    return plot


def plot_ttft(engines: list[EngineResult]) -> Plot:
    """Mean time to first token against concurrency."""
    plot = Plot("ttft-vs-concurrency", "Time to first token vs concurrency")
    series = [
        (i, e, rows)
        for i, e in enumerate(engines)
        if (rows := [r for r in _by_concurrency(e) if r.ttft_s is not None])
    ]
    if not series:
        plot.missing = "not measured: " + _load_why(engines)
        return plot
    fig, ax = _new_axes(plot.pid)
    xs: list[int] = []
    for i, e, rows in series:
        xs += [r.concurrency for r in rows]
        ax.plot(
            [r.concurrency for r in rows],
            [(r.ttft_s or 0) * 1000 for r in rows],
            marker="o",
            color=COLORS[i % len(COLORS)],
            label=_label(e.name),
        )
    _concurrency_axis(ax, xs)
    _y_from_zero(ax)
    ax.set_ylabel("TTFT (ms)")
    _legend(ax)
    plot.svg = _svg(fig)
    return plot


def build_plots(engines: list[EngineResult]) -> list[Plot]:
    """Every plot of PLOTS, drawn where there is data, else with its reason."""
    plots = [
        plot_memory_timeline(engines),
        plot_memory_vs_context(engines),
        plot_decode_per_sequence(engines),
        plot_decode_aggregate(engines),
        plot_ttft(engines),
    ]
    assert tuple(p.pid for p in plots) == PLOTS
    return plots


# --- the answer and the metadata -----------------------------------------------------------


@dataclass
class Answer:
    """What the report says first, in results.json's words."""

    # (engine, verdict, what the verdict means)
    verdicts: list[tuple[str, str, str]]
    recommendation: str
    action: str
    comparable: bool
    comparable_why: str
    caveats: list[str]
    # "estimate: ... ≈ N tok/s", as the terminal prints them.
    estimates: list[str]


def answer_of(engines: list[EngineResult], decision: Decision) -> Answer:
    """The answer block, field by field from the Decision that results.json is written from."""
    verdicts = []
    for name, v in decision.verdict.items():
        info = VERDICT_INFO.get(v)
        verdicts.append((name, v, info.summary if info else ""))
    why = next((s.answer for s in decision.steps if s.key == "comparability"), "")
    if len(engines) < 2:
        why = "one engine, nothing to compare it with"
    return Answer(
        verdicts=verdicts,
        recommendation=decision.recommendation,
        action=decision.action,
        comparable=decision.comparable,
        comparable_why=why,
        caveats=list(decision.caveats),
        estimates=[f"{e.basis} ≈ {e.tok_s:.1f} tok/s" for e in decision.estimates],
    )


@dataclass
class Metadata:
    """Who ran what, when, on which engine and GPU."""

    tool_version: str
    command: str
    started_utc: str
    finished_utc: str
    # (engine, engine version, GPU name, GPU driver), each a value or "unknown: why".
    engines: list[tuple[str, str, str, str]]


def _utc(ts: float | None = None) -> str:
    when = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _unknown(why: str) -> str:
    return "unknown: " + why


# Engine version and GPU driver: the exporter's llmb_engine_info / llmb_gpu_info carry them,
# but EngineResult has no field for them yet; the metadata block shows them once it does.
NOT_RECORDED = "not recorded by this version of diagnose"


def _recorded(e: EngineResult, attr: str, what: str) -> str:
    """A fact EngineResult may not have a field for yet (the exporter's info labels)."""
    if not hasattr(e, attr):
        return _unknown(f"{what} {NOT_RECORDED}")
    return str(getattr(e, attr) or _unknown(f"{what} not read: " + FIX_EXPORTER))


def metadata_of(engines: list[EngineResult], run: RunInfo | None = None) -> Metadata:
    """The metadata block: the run's record, the engines' facts, every gap explained."""
    starts = [p.start for e in engines for p in e.phases]
    ends = [p.end for e in engines for p in e.phases if p.end is not None]
    if run is None:
        # A library call (tests, notebooks) has no command line of its own.
        run = RunInfo(
            command=_unknown("the report was written by a library call, not by llmb-loadgen"),
            tool_version=__version__,
            started_at=_utc(min(starts)) if starts else _utc(),
            finished_at=_utc(max(ends)) if ends else None,
        )
    rows = []
    for e in engines:
        if e.gpu_name:
            gpu = e.gpu_name
        elif e.memory_source == "gpu":
            gpu = _unknown("the GPU's name was not read: " + FIX_EXPORTER)
        else:
            gpu = _unknown("no GPU seen (no NVML on this host and no exporter): " + FIX_EXPORTER)
        rows.append(
            (
                e.name,
                _recorded(e, "engine_version", f"{e.kind} build"),
                gpu,
                _recorded(e, "gpu_driver", "driver"),
            )
        )
    return Metadata(
        tool_version=run.tool_version,
        command=run.command,
        started_utc=run.started_at,
        # A run without a finish time is being written up now.
        finished_utc=run.finished_at or _utc(),
        engines=rows,
    )


# --- tables --------------------------------------------------------------------------------


def _count(n: int) -> str:
    return str(n) if n else ""


def _pct_or_dash(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f} %"


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


def _gib_or(value: float | None, why: str) -> str:
    return _unknown(why) if value is None else f"{value / GIB:.2f} GiB"


def _layers(e: EngineResult) -> str:
    if e.layers_total is not None and e.layers_offloaded is not None:
        return f"{e.layers_offloaded:.0f} of {e.layers_total:.0f}"
    if e.layers_total is not None and e.kind == "llamacpp":
        return f"unknown of {e.layers_total:.0f}: the llama.cpp log was not read: " + FIX_LLAMA_LOG
    if e.kind != "llamacpp":
        return "not reported by SGLang (compare process GPU memory with the weights)"
    return _unknown("the llama.cpp log was not read: " + FIX_LLAMA_LOG)


def _decode_share(e: EngineResult) -> str:
    roof = e.roofline
    if not roof.measured_tok_s:
        return "not measured: no single-request step completed"
    speed = f"{roof.measured_tok_s:.1f} tok/s"
    if roof.efficiency is None:
        return f"{speed}; share of the card's limit unknown: {roofline_unknown(e)}"
    if roof.misfit is not None:
        # The physics gate: never a share above the limit, the reason instead.
        return f"{speed}: " + core.misfit_text(roof.efficiency, core.MISFIT_BY_NAME[roof.misfit])
    return f"{speed} = {roof.efficiency * 100:.0f} % of the card's limit"


def _bytes_per_step(e: EngineResult) -> str:
    roof = e.roofline
    if roof.bytes_per_step is None:
        return _unknown("model weight size unknown: " + FIX_EXPORTER)
    text = f"{roof.bytes_per_step / 2**30:.2f} GiB"
    if roof.active_weights_bytes is not None:
        text += f" (weights {roof.active_weights_bytes / 2**30:.2f} GiB"
        if e.experts and e.experts_used:
            text += f", {e.experts_used:.0f} of {e.experts:.0f} experts per token"
        elif (model := e.structure()) is None or not model.structure_known:
            text += ", every weight counted: model structure unknown"
        if roof.kv_bytes_per_token:
            text += f"; KV {roof.kv_bytes_per_token / 1024:.0f} KiB per token"
        text += ")"
    return text


def _acceptance(e: EngineResult) -> str:
    if e.spec_accept_length is None:
        return "none seen (no speculative decoding reported)"
    return f"{e.spec_accept_length:.2f} tokens per model step"


def _expert_offload(e: EngineResult) -> str:
    if not e.experts_host_layers:
        return "none" if e.experts else "not a mixture-of-experts model (or unknown)"
    return (
        f"experts of {e.experts_host_layers:.0f} layers in host memory "
        f"({_gib_or(e.experts_host_bytes, FIX_EXPORTER)})"
    )


def _bandwidth(e: EngineResult) -> str:
    bw = e.roofline.bandwidth_bytes_per_s or e.bandwidth_bytes_per_s
    if not bw:
        return _unknown(FIX_BANDWIDTH)
    source = e.roofline.bandwidth_source or e.bandwidth_source
    return f"{bw / 1e9:.0f} GB/s" + (f" ({source})" if source else "")


def _slots(e: EngineResult) -> str:
    if e.slots is None:
        return _unknown("the engine reported no slot count (llama.cpp /slots or /props)")
    ctx = f", {e.slot_context} tokens each" if e.slot_context else ""
    return f"{e.slots}{ctx}"


def engine_facts(e: EngineResult) -> list[tuple[str, str]]:
    """(fact, value) for one engine; every unknown value says how to get it."""
    limit = e.roofline.limit_tok_s
    return [
        ("kind", e.kind + (f" at {e.url}" if e.url else "")),
        ("model", e.model or _unknown("the engine named no model in /v1/models")),
        ("quantization", e.quantization or _unknown(FIX_EXPORTER)),
        ("weights", _gib_or(e.weights_bytes, FIX_EXPORTER)),
        ("process GPU memory", _gib_or(e.process_gpu_bytes, FIX_EXPORTER)),
        ("layers on the GPU", _layers(e)),
        ("slots", _slots(e)),
        (
            "trained context",
            f"{e.trained_context} tokens"
            if e.trained_context
            else _unknown("the model's metadata was not read: " + FIX_EXPORTER),
        ),
        ("card memory", _gib_or(e.gpu_total_bytes, FIX_EXPORTER)),
        ("memory source", e.memory_source or _unknown(_memory_why([e]))),
        ("memory bandwidth", _bandwidth(e)),
        (
            "card's decode limit per sequence",
            f"{limit:.1f} tok/s" if limit else _unknown(roofline_unknown(e)),
        ),
        ("bytes per decode step", _bytes_per_step(e)),
        ("speculative acceptance", _acceptance(e)),
        ("expert offload", _expert_offload(e)),
        ("single-request decode", _decode_share(e)),
        (
            "load time",
            f"{e.load_seconds:.2f} s"
            if e.load_seconds is not None
            else _unknown("the engine was already running: " + FIX_LAUNCH),
        ),
    ]


def facts_table(engines: list[EngineResult]) -> tuple[tuple[str, ...], list[list[str]]]:
    """Facts down, engines across."""
    per_engine = [engine_facts(e) for e in engines]
    head = ("", *(e.name for e in engines))
    rows = [
        [name, *(facts[i][1] for facts in per_engine)] for i, (name, _) in enumerate(per_engine[0])
    ]
    return head, rows


def _share_of_limit(r: Row) -> str:
    """A row's per-sequence decode as a share of its limit; never beyond physics."""
    if r.efficiency is None:
        return "—"
    if r.misfit is not None:
        return f"does not fit ({r.misfit})"
    return f"{r.efficiency * 100:.0f} %"


@dataclass(frozen=True)
class Column:
    """One column of the measurement table and why it can be empty."""

    head: str
    cell: Callable[[Row], str]
    # Shown (as "not measured: ...") when the column is empty in every row and left out.
    empty_why: str = ""
    # Empty everywhere is the good case (no failures): left out without a note.
    quiet: bool = False


COLUMNS = (
    Column("engine", lambda r: r.engine),
    Column("step", lambda r: r.step),
    Column("ctx", lambda r: _fmt(r.context), "no row ran at a known context"),
    Column("slots", lambda r: _fmt(r.parallel), "no row recorded its slot count"),
    Column("conc", lambda r: str(r.concurrency)),
    Column("prompt tok", lambda r: _fmt(r.prompt_tokens, 0), "no prompt token counts"),
    Column("gen tok", lambda r: str(r.completion_tokens)),
    Column("tokens ok", lambda r: _fmt(r.tokens_ok)),
    Column(
        "TTFT ms", lambda r: _fmt(r.ttft_s * 1000 if r.ttft_s is not None else None), "no tokens"
    ),
    Column(
        "TTFT p99 ms",
        lambda r: _fmt(r.ttft_p99_s * 1000 if r.ttft_p99_s is not None else None),
        "no step recorded a p99 TTFT",
    ),
    Column("ms/token", lambda r: _fmt(r.per_token_ms, 2), "no tokens"),
    Column(
        "server ms/token",
        lambda r: _fmt(r.server_per_token_ms, 2),
        "the engine returned no per-request timings (llama.cpp does; SGLang does not)",
    ),
    Column("per-seq tok/s", lambda r: _fmt(r.per_seq_tok_s), "no tokens"),
    Column("aggregate tok/s", lambda r: _fmt(r.aggregate_tok_s), "no tokens"),
    Column("limit tok/s", lambda r: _fmt(r.limit_tok_s), "no roofline (bandwidth unknown)"),
    Column("of limit", lambda r: _share_of_limit(r), "no roofline (bandwidth unknown)"),
    Column(
        "spread",
        lambda r: _pct_or_dash(r.spread),
        "one round per step: pass --rounds 3 for the spread between rounds",
    ),
    Column("failed", lambda r: _count(r.requests_failed), quiet=True),
    Column("KV exhausted", lambda r: _count(r.kv_exhausted), quiet=True),
    Column("truncated", lambda r: _count(r.truncated), quiet=True),
    Column(
        "KV use max",
        lambda r: _pct_or_dash(r.kv_usage_max),
        "KV usage needs the engine's metrics: " + FIX_EXPORTER,
    ),
    Column(
        "waiting avg",
        lambda r: _fmt(r.waiting_avg),
        "queued requests need the engine's metrics: " + FIX_EXPORTER,
    ),
    Column("memory GiB", lambda r: _gib(r.memory_bytes), "no memory source: " + FIX_EXPORTER),
    Column(
        "loaded GiB",
        lambda r: _gib(r.loaded_memory_bytes),
        "memory after loading needs the tool to start the engine: " + FIX_LAUNCH,
    ),
    Column(
        "KV GiB",
        lambda r: _gib(r.kv_bytes),
        "KV cache size needs a context sweep and the engine's log; or " + FIX_EXPORTER,
    ),
    Column(
        "load s",
        lambda r: _fmt(r.load_seconds, 2),
        "load time needs the tool to start the engine: " + FIX_LAUNCH,
    ),
    Column("error", lambda r: r.error or ""),
)


def measurement_table(
    engines: list[EngineResult],
) -> tuple[tuple[str, ...], list[list[str]], list[str]]:
    """(head, rows, notes): columns empty in every row are left out, each with a note why."""
    rows = [r for e in engines for r in e.rows]
    cells = [[c.cell(r) for c in COLUMNS] for r in rows]
    keep, notes = [], []
    if not rows:
        return (), [], []
    for j, col in enumerate(COLUMNS):
        empty = all(row[j] in ("", "—") for row in cells)
        if empty and (col.quiet or col.head == "error"):
            continue  # no failure anywhere is the good case, not a gap
        if empty and col.empty_why and rows:
            notes.append(f"{col.head}: not measured: {col.empty_why}")
            continue
        keep.append(j)
    head = tuple(COLUMNS[j].head for j in keep)
    return head, [[row[j] for j in keep] for row in cells], notes


PHASE_HEAD = ("engine", "phase", "start (UTC)", "seconds", "memory GiB", "note")
NO_ROWS = "No step produced a measurement (see Not measured)."
NO_PHASES = "No phase ran."


def phase_rows(engines: list[EngineResult]) -> list[list[str]]:
    """One row per phase, in time order."""
    out = []
    for e in engines:
        for p in e.phases:
            start = datetime.fromtimestamp(p.start, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
            dur = f"{p.end - p.start:.2f}" if p.end is not None else "—"
            out.append([e.name, p.name, start, dur, _gib(p.memory_bytes), p.note])
    return out


def not_measured(engines: list[EngineResult], plots: list[Plot]) -> list[str]:
    """Every step and plot that did not run, each with its reason."""
    out = [f"{e.name}: {m}" for e in engines for m in e.missing]
    # A plot left out for a reason already listed is not listed again.
    out += [
        f"{p.caption}: {p.missing}"
        for p in plots
        if p.svg is None and not any(p.missing.removeprefix("not measured: ") in m for m in out)
    ]
    return out


# --- report.md and report.html ------------------------------------------------------------


def _comparable_text(a: Answer) -> str:
    return ("yes" if a.comparable else "no") + (
        f" — {a.comparable_why}" if a.comparable_why else ""
    )


def metadata_rows(m: Metadata) -> list[tuple[str, str]]:
    """(field, value) pairs of the metadata block, shared by report.md and report.html."""
    rows = [
        ("tool version", m.tool_version),
        ("command", m.command),
        ("started (UTC)", m.started_utc),
        ("finished (UTC)", m.finished_utc),
    ]
    for name, version, gpu, driver in m.engines:
        rows += [
            (f"{name}: engine version", version),
            (f"{name}: GPU", gpu),
            (f"{name}: GPU driver", driver),
        ]
    return rows


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


@dataclass
class Report:
    """Everything both reports show, computed once so they cannot disagree."""

    title: str
    answer: Answer
    meta: Metadata
    steps: list[tuple[str, str, bool]]
    facts: tuple[tuple[str, ...], list[list[str]]]
    table: tuple[tuple[str, ...], list[list[str]], list[str]]
    phases: list[list[str]]
    plots: list[Plot]
    missing: list[str]


def build_report(
    engines: list[EngineResult],
    decision: Decision,
    title: str,
    run: RunInfo | None = None,
    plots: list[Plot] | None = None,
) -> Report:
    """The report's content; `plots` None draws them (needs matplotlib)."""
    plots = build_plots(engines) if plots is None else plots
    return Report(
        title=title,
        answer=answer_of(engines, decision),
        meta=metadata_of(engines, run),
        steps=[(s.question, s.answer, s.decisive) for s in decision.steps],
        facts=facts_table(engines),
        table=measurement_table(engines),
        phases=phase_rows(engines),
        plots=plots,
        missing=not_measured(engines, plots),
    )


def render_markdown(rep: Report) -> str:
    """report.md: the answer, the metadata, the steps, the tables and what was not measured."""
    a = rep.answer
    parts = [f"# llm-bottleneck {rep.title}", "", "## Answer", ""]
    parts += [
        _md_table(("engine", "verdict", "meaning"), [[n, f"`{v}`", m] for n, v, m in a.verdicts]),
        "",
    ]
    parts += [f"**Recommendation:** `{a.recommendation}`", "", f"**Action:** {a.action}", ""]
    parts += [f"**Comparable:** {_comparable_text(a)}", ""]
    if a.estimates:
        parts += ["**Estimates:**", ""] + [f"- {x}" for x in a.estimates] + [""]
    parts += ["**Caveats:**" + ("" if a.caveats else " none"), ""]
    parts += [f"- {c}" for c in a.caveats] + ([""] if a.caveats else [])
    parts += ["## Run", "", _md_table(("", ""), metadata_rows(rep.meta)), ""]
    parts += ["## Steps, in order", ""]
    for n, (question, answer, decisive) in enumerate(rep.steps, 1):
        parts.append(f"{n}. **{question}** {answer}" + (" ← decided" if decisive else ""))
    parts += ["", "## Engines", "", _md_table(*rep.facts), ""]
    parts += ["## Plots", ""]
    for p in rep.plots:
        parts.append(f"- {p.caption}: " + ("in report.html" if p.svg else p.missing))
    head, rows, notes = rep.table
    parts += ["", "## Measurements", ""]
    parts += [_md_table(head, rows), ""] if rows else [NO_ROWS, ""]
    parts += [f"- {n}" for n in notes] + ([""] if notes else [])
    parts += ["## Phases", ""]
    parts += [_md_table(PHASE_HEAD, rep.phases), ""] if rep.phases else [NO_PHASES, ""]
    parts += ["## Not measured", ""]
    parts += [f"- {m}" for m in rep.missing] or ["- nothing: every step ran"]
    return "\n".join(parts) + "\n"


CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:.6em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
table.rows td{text-align:right;white-space:nowrap} table.rows td:nth-child(-n+2){text-align:left}
table.rows td:last-child{white-space:normal} .scroll{overflow-x:auto}
#answer{background:#f5f7fa;border:1px solid #d0d7e2;border-radius:6px;padding:.2em 1.2em 1em}
#answer .verdict{font-family:ui-monospace,monospace;font-weight:bold;font-size:1.15em}
#answer code{font-size:1.05em;font-weight:bold}
#metadata th{font-weight:normal;color:#555;white-space:nowrap}
#metadata td{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
figure{margin:1.2em 0} figure svg{max-width:100%;height:auto;display:block}
figcaption{font-weight:bold;margin-bottom:.3em}
.note,.not-measured{color:#555;font-size:.92em;margin:.2em 0}
.not-measured::before{content:"\\2014  "}
.decisive{font-weight:bold} .flag{white-space:nowrap}
"""


def _esc(s: str) -> str:
    """Escaped text; a command-line flag never breaks across lines at its own hyphens."""
    return re.sub(
        r"(?<![\w-])(--[a-z][a-z-]*)", r'<span class="flag">\1</span>', html.escape(s, quote=True)
    )


def _esc_code(s: str) -> str:
    """Escaped text with its `code` spans (as the verdict texts write flags) in <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _esc(s))


def _html_table(
    head: Sequence[str], rows: Sequence[Sequence[str]], cls: str, row_heads: bool = False
) -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in head)

    def row(r: Sequence[str]) -> str:
        if row_heads:
            return f"<tr><th>{_esc(r[0])}</th>" + "".join(f"<td>{_esc(c)}</td>" for c in r[1:])
        return "<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r)

    body = "".join(row(r) + "</tr>" for r in rows)
    thead = f"<thead><tr>{th}</tr></thead>" if any(head) else ""
    return f'<table class="{cls}">{thead}<tbody>{body}</tbody></table>'


def _html_plot(p: Plot) -> str:
    notes = "".join(f'<p class="note">{_esc(n)}</p>' for n in p.notes)
    if p.svg is None:
        return (
            f'<p class="not-measured" id="missing-{p.pid}">{_esc(p.caption)}: {_esc(p.missing)}</p>'
        )
    return (
        f'<figure class="plot" id="plot-{p.pid}"><figcaption>{_esc(p.caption)}</figcaption>'
        f"{p.svg}{notes}</figure>"
    )


def render_html(rep: Report) -> str:
    """The self-contained report.html with every drawn plot inline."""
    a = rep.answer
    verdicts = "".join(
        f'<tr><th>{_esc(n)}</th><td class="verdict">{_esc(v)}</td><td>{_esc_code(m)}</td></tr>'
        for n, v, m in a.verdicts
    )
    estimates = (
        '<div id="estimates"><b>Estimates:</b><ul>'
        + "".join(f"<li>{_esc(x)}</li>" for x in a.estimates)
        + "</ul></div>"
        if a.estimates
        else ""
    )
    caveats = (
        "<ul>" + "".join(f"<li>{_esc(c)}</li>" for c in a.caveats) + "</ul>"
        if a.caveats
        else " none"
    )
    steps = "".join(
        f'<li class="{"decisive" if d else ""}"><b>{_esc(q)}</b> {_esc(ans)}</li>'
        for q, ans, d in rep.steps
    )
    head, rows, notes = rep.table
    table_notes = "".join(f'<p class="not-measured">{_esc(n)}</p>' for n in notes)
    # Many columns: the table scrolls sideways inside the page rather than widening it.
    measurements = (
        f'<div class="scroll">{_html_table(head, rows, "rows")}</div>'
        if rows
        else f"<p>{_esc(NO_ROWS)}</p>"
    )
    phases = (
        _html_table(PHASE_HEAD, rep.phases, "phases") if rep.phases else f"<p>{_esc(NO_PHASES)}</p>"
    )
    missing = "".join(f"<li>{_esc(m)}</li>" for m in rep.missing) or (
        "<li>nothing: every step ran</li>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>llm-bottleneck {html.escape(rep.title)}</title>
<style>{CSS}</style></head>
<body>
<h1>llm-bottleneck {_esc(rep.title)}</h1>
<section id="answer"><h2>Answer</h2>
<table class="verdicts"><thead><tr><th>engine</th><th>verdict</th><th>meaning</th></tr></thead>
<tbody>{verdicts}</tbody></table>
<p id="recommendation"><b>Recommendation:</b> <code>{_esc(a.recommendation)}</code></p>
<p id="action"><b>Action:</b> {_esc_code(a.action)}</p>
<p id="comparable"><b>Comparable:</b> {_esc(_comparable_text(a))}</p>
{estimates}<div id="caveats"><b>Caveats:</b>{caveats}</div>
</section>
<section id="metadata"><h2>Run</h2>{_html_table(("", ""), metadata_rows(rep.meta), "meta", True)}
</section>
<h2>Steps, in order</h2><ol id="steps">{steps}</ol>
<h2>Engines</h2>{_html_table(*rep.facts, "facts", True)}
<h2>Plots</h2>{"".join(_html_plot(p) for p in rep.plots)}
<h2>Measurements</h2>{measurements}{table_notes}
<h2>Phases</h2>{phases}
<h2>Not measured</h2><ul id="not-measured">{missing}</ul>
</body></html>
"""


def write_report(
    out: Path,
    engines: list[EngineResult],
    decision: Decision,
    title: str,
    run: RunInfo | None = None,
) -> None:
    """Write results.json, report.md and report.html into `out`.

    results.json and report.md need no plotting library and are written first, so a
    missing matplotlib (PlottingMissing) loses no measurement.
    """
    out.mkdir(parents=True, exist_ok=True)
    doc = results_to_dict(engines, decision, run)
    doc["title"] = title
    (out / "results.json").write_text(
        json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8"
    )
    try:
        plots = build_plots(engines)
    except PlottingMissing:
        text = render_markdown(build_report(engines, decision, title, run, plots=[]))
        (out / "report.md").write_text(text, encoding="utf-8")
        raise
    rep = build_report(engines, decision, title, run, plots)
    (out / "report.md").write_text(render_markdown(rep), encoding="utf-8")
    (out / "report.html").write_text(render_html(rep), encoding="utf-8")
