"""The diagnose/compare report: report.md, a self-contained report.html and results.json.

Both reports lead with the answer, in the words of results.json: the verdict of each
engine (said once), the recommendation, whether the engines compare like with like, and
the caveats. A metadata block follows (tool version, command line, UTC time, engine
version, GPU), then the plots and the tables.

Plots are drawn with matplotlib's SVG backend and embedded inline, so the HTML needs no
network and no files next to it. A plot without data is left out, and a line says what
was not measured and why. matplotlib is an optional extra (`[report]`): it is imported
only when a plot is drawn, and its log lines never reach the terminal.

Modules: `figure` (matplotlib and the shared axes), `plots`, `page` (the HTML page),
`write` (the three files); beside this package, `diagnose.report.content` (the answer and
metadata both reports show), `tables`, `hints` (how to get each unknown) and `md`.
"""

from diagnose.report.content import (
    NO_PHASES,
    NO_ROWS,
    PHASE_HEAD,
    Answer,
    Metadata,
    Report,
    answer_of,
    metadata_of,
    metadata_rows,
    not_measured,
)
from diagnose.report.hints import roofline_unknown
from diagnose.report.html.figure import INSTALL_HINT, Plot, PlottingMissing
from diagnose.report.html.page import render_html
from diagnose.report.html.plots import (
    PLOTS,
    build_plots,
    plot_decode_aggregate,
    plot_decode_per_sequence,
    plot_memory_timeline,
    plot_memory_vs_context,
    plot_ttft,
)
from diagnose.report.html.write import build_report, write_report
from diagnose.report.md import render_markdown
from diagnose.report.tables import engine_facts, facts_table, measurement_table, phase_rows

__all__ = [
    "INSTALL_HINT",
    "NO_PHASES",
    "NO_ROWS",
    "PHASE_HEAD",
    "PLOTS",
    "Answer",
    "Metadata",
    "Plot",
    "PlottingMissing",
    "Report",
    "answer_of",
    "build_plots",
    "build_report",
    "engine_facts",
    "facts_table",
    "measurement_table",
    "metadata_of",
    "metadata_rows",
    "not_measured",
    "phase_rows",
    "plot_decode_aggregate",
    "plot_decode_per_sequence",
    "plot_memory_timeline",
    "plot_memory_vs_context",
    "plot_ttft",
    "render_html",
    "render_markdown",
    "roofline_unknown",
    "write_report",
]
