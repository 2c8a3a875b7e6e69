"""matplotlib, imported quietly and only when a plot is drawn, and the pieces every plot of
report.html shares: the axes, the concurrency and context ticks, the inline SVG.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")

INSTALL_HINT = "pip install 'llm-bottleneck[report]'"


class PlottingMissing(Exception):
    """report.html cannot be drawn because matplotlib is not installed.

    `write_report` turns it into a warning: results.json and report.md are written anyway.
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
            f"report.html not written: it needs matplotlib, which is not installed: {INSTALL_HINT}"
            " (results.json and report.md are written)"
        ) from None
    return matplotlib


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


def series_label(text: str) -> str:
    """Text safe from matplotlib's mathtext ($...$)."""
    return text.replace("$", r"\$")


def new_axes(pid: str, width: float = 9.0, height: float = 3.6) -> tuple[Figure, Axes]:
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


def to_svg(fig: Figure, tight: bool = True) -> str:
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


def concurrency_axis(ax: Axes, values: Sequence[int]) -> None:
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


def context_axis(ax: Axes, values: Sequence[int]) -> None:
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


def y_from_zero(ax: Axes) -> None:
    """y from 0 with room above the highest line, so no marker sits on the frame."""
    ys: list[float] = []
    for line in ax.get_lines():
        ys += [float(y) for y in cast("Sequence[float]", line.get_ydata())]
    top = max((y for y in ys if math.isfinite(y)), default=0.0)
    ax.set_ylim(0, top * 1.12 or 1.0)


def add_legend(ax: Axes) -> None:
    ax.legend(fontsize=8, loc="best", framealpha=0.85)
