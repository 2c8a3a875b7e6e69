"""The plots of report.html, each drawn where there is data, else left out with its reason."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from diagnose.decision.model import EngineResult, Row
from diagnose.decision.sources import ENGINE, ENGINE_NOTE
from diagnose.report.hints import (
    FIX_CONTEXT_SWEEP,
    GIB,
    memory_why,
    missing_why,
    roofline_unknown,
)
from diagnose.report.html.figure import (
    COLORS,
    Plot,
    add_legend,
    concurrency_axis,
    context_axis,
    new_axes,
    series_label,
    to_svg,
    y_from_zero,
)

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

# Phase labels above the memory timeline: rows before a label is left to the phase table.
LABEL_ROWS = 3

LABEL_PAD_PX = 6.0


def plot_memory_timeline(engines: list[EngineResult]) -> Plot:
    """Memory used over time, with a marker and a non-overlapping label at each phase start."""
    plot = Plot("memory-timeline", "Memory used over the run, with the phases")
    series = [(i, e, sorted(e.timeline)) for i, e in enumerate(engines) if len(e.timeline) >= 2]
    if not series:
        plot.missing = "not measured: " + memory_why(engines)
        return plot
    fig, ax = new_axes(plot.pid, height=4.0)
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
            label=series_label(f"{e.name} ({e.memory_source or 'memory'})"),
            linewidth=1.6,
        )
    totals = {e.gpu_total_bytes for e in engines if e.gpu_total_bytes and e.memory_source == "gpu"}
    for total in totals:
        if peak > total / 2:
            ax.axhline(total / GIB, color="black", linewidth=0.8, label="card total")
        else:
            plot.notes.append(f"The card's total ({total / GIB:.1f} GiB) is off the scale.")
    y_from_zero(ax)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("memory used (GiB)")
    add_legend(ax)
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
    plot.svg = to_svg(fig, tight=False)
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


# The lines of the memory-vs-context plot: the row's value, its legend, its style.
_CONTEXT_SERIES: tuple[tuple[Callable[[Row], float | None], str, dict[str, Any]], ...] = (
    (lambda r: r.loaded_memory_bytes, "memory after loading", {"marker": "o"}),
    (lambda r: r.kv_bytes, "KV cache", {"marker": "s", "linestyle": ":"}),
)


def plot_memory_vs_context(engines: list[EngineResult]) -> Plot:
    """Memory after loading (and the KV cache where known) against the context length."""
    plot = Plot("memory-vs-context", "Memory and KV cache vs context, per engine")
    ctx_rows = {e.name: [r for r in e.rows if r.step == "context" and r.context] for e in engines}
    has_data = any(
        r.loaded_memory_bytes or r.kv_bytes or r.error for rows in ctx_rows.values() for r in rows
    )
    if not has_data:
        why = missing_why(engines, "context")
        plot.missing = "not measured: " + (
            why or "no context sweep ran (" + FIX_CONTEXT_SWEEP + ")"
        )
        return plot
    fig, ax = new_axes(plot.pid)
    contexts: list[int] = []
    for i, e in enumerate(engines):
        color = COLORS[i % len(COLORS)]
        rows = sorted(ctx_rows[e.name], key=lambda r: r.context or 0)
        contexts += [r.context for r in rows if r.context]
        for value, what, style in _CONTEXT_SERIES:
            done = [(r.context or 0, v) for r in rows if (v := value(r)) and not r.error]
            if done:
                ax.plot(
                    [c for c, _ in done],
                    [v / GIB for _, v in done],
                    color=color,
                    label=series_label(f"{e.name} {what}"),
                    **style,
                )
        for r in rows:
            if r.error and r.context:
                ax.axvline(r.context, color=color, linestyle="-.", alpha=0.8)
                ax.text(
                    r.context,
                    0.97,
                    series_label(f" {e.name} failed"),
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
    context_axis(ax, contexts)
    y_from_zero(ax)
    ax.set_ylabel("GiB")
    if ax.get_legend_handles_labels()[0]:
        add_legend(ax)
    plot.svg = to_svg(fig)
    return plot


def _by_concurrency(e: EngineResult) -> list[Row]:
    rows = {r.concurrency: r for r in e.ok_rows("concurrency")}
    single = e.single()
    if single is not None:
        rows.setdefault(1, single)
    return [rows[c] for c in sorted(rows)]


def _load_why(engines: list[EngineResult]) -> str:
    why = missing_why(engines, "single") or missing_why(engines, "concurrency")
    if why:
        return why
    failed = [e.name for e in engines if any(r.error for r in e.rows)]
    if failed:
        return "no load step completed (" + ", ".join(failed) + ": see the error column)"
    return "no load step ran"


def _load_plot(
    plot: Plot,
    engines: list[EngineResult],
    keep: Callable[[Row], bool],
    y: Callable[[Row], float],
    marker: str,
    name: Callable[[EngineResult], str],
    ylabel: str,
    per_engine: Callable[[Axes, int, EngineResult, str], None] | None = None,
) -> Plot:
    """`y` of every load row that `keep`s against concurrency, one line per engine; then
    `per_engine` draws what belongs to that engine (its card limit)."""
    series = [
        (i, e, rows)
        for i, e in enumerate(engines)
        if (rows := [r for r in _by_concurrency(e) if keep(r)])
    ]
    if not series:
        plot.missing = "not measured: " + _load_why(engines)
        return plot
    fig, ax = new_axes(plot.pid)
    xs: list[int] = []
    for i, e, rows in series:
        color = COLORS[i % len(COLORS)]
        xs += [r.concurrency for r in rows]
        ax.plot(
            [r.concurrency for r in rows],
            [y(r) for r in rows],
            marker=marker,
            color=color,
            label=series_label(name(e)),
        )
        if per_engine is not None:
            per_engine(ax, i, e, color)
    concurrency_axis(ax, xs)
    y_from_zero(ax)
    ax.set_ylabel(ylabel)
    add_legend(ax)
    plot.svg = to_svg(fig)
    return plot


def plot_decode_per_sequence(engines: list[EngineResult]) -> Plot:
    """Per-sequence decode tok/s against concurrency, under the card's per-sequence limit."""
    plot = Plot(
        "decode-per-sequence",
        "Decode tok/s per sequence vs concurrency, with the card's per-sequence limit",
    )

    def card_limit(ax: Axes, i: int, e: EngineResult, color: str) -> None:
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
                label=series_label(f"{e.name} card limit {roof:.0f} tok/s"),
            )
            line.set_gid(f"{plot.pid}-roofline-{i}")
        else:
            plot.notes.append(f"No card limit drawn for {e.name}: {roofline_unknown(e)}.")

    _load_plot(
        plot,
        engines,
        lambda r: bool(r.per_seq_tok_s),
        lambda r: r.per_seq_tok_s or 0.0,
        "o",
        lambda e: f"{e.name} per sequence",
        "tok/s per sequence",
        card_limit,
    )
    return _source_notes(plot, engines, lambda r: r.per_seq_source, "")


def plot_decode_aggregate(engines: list[EngineResult]) -> Plot:
    """Aggregate decode tok/s against concurrency (no roofline: it bounds one sequence)."""
    plot = _load_plot(
        Plot("decode-aggregate", "Aggregate decode tok/s vs concurrency"),
        engines,
        lambda r: bool(r.aggregate_tok_s),
        lambda r: r.aggregate_tok_s or 0.0,
        "s",
        lambda e: f"{e.name} aggregate",
        "tok/s, all sequences",
    )
    if plot.svg is not None:
        plot.notes.append(
            "The card's limit is per sequence and is not drawn here: one read of the weights "
            "serves every sequence of a batch, so the aggregate may exceed it."
        )
    return plot


def plot_ttft(engines: list[EngineResult]) -> Plot:
    """Time to first token against concurrency (never a 0: a TTFT not measured is no point)."""
    plot = _load_plot(
        Plot("ttft-vs-concurrency", "Time to first token vs concurrency"),
        engines,
        lambda r: bool(r.ttft_s),
        lambda r: (r.ttft_s or 0) * 1000,
        "o",
        lambda e: e.name,
        "TTFT (ms)",
    )
    return _source_notes(plot, engines, lambda r: r.ttft_source, ", the mean of each step")


def _source_notes(
    plot: Plot, engines: list[EngineResult], source: Callable[[Row], str | None], what: str
) -> Plot:
    """A note for each engine whose points are its own timing (the streamed text was empty)."""
    if plot.svg is not None:
        for e in engines:
            if any(source(r) == ENGINE for r in _by_concurrency(e)):
                plot.notes.append(f"{e.name}'s points: {ENGINE_NOTE}{what}.")
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
