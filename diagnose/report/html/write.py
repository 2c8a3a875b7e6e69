"""Write results.json, report.md and report.html of one diagnose or compare run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from diagnose.decision.model import Decision, EngineResult, RunInfo
from diagnose.decision.results import results_to_dict
from diagnose.report.content import (
    Report,
    answer_of,
    metadata_of,
    not_measured,
    traffic_rows,
)
from diagnose.report.html.figure import Plot, PlottingMissing
from diagnose.report.html.page import render_html
from diagnose.report.html.plots import build_plots
from diagnose.report.md import render_markdown
from diagnose.report.tables import facts_table, measurement_table, phase_rows


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
        traffic=traffic_rows(engines),
    )


def write_report(
    out: Path,
    engines: list[EngineResult],
    decision: Decision,
    title: str,
    run: RunInfo | None = None,
) -> list[str]:
    """Write results.json, report.md and report.html into `out`; the warnings of any not written.

    Each file is written on its own, results.json and report.md first (they need no
    plotting library): a missing matplotlib or a full disk costs the file it stops, with
    a warning, and loses no measurement.
    """
    warnings: list[str] = []

    def write(name: str, render: Callable[[], str]) -> None:
        try:
            (out / name).write_text(render(), encoding="utf-8")
        except OSError as exc:
            warnings.append(f"{name} not written: {exc}")

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [f"no report written: cannot create {out}: {exc}"]
    doc = results_to_dict(engines, decision, run)
    doc["title"] = title
    write("results.json", lambda: json.dumps(doc, indent=2, default=str) + "\n")
    try:
        plots = build_plots(engines)
    except PlottingMissing as exc:
        warnings.append(str(exc))
        write("report.md", lambda: render_markdown(build_report(engines, decision, title, run, [])))
        return warnings
    rep = build_report(engines, decision, title, run, plots)
    write("report.md", lambda: render_markdown(rep))
    write("report.html", lambda: render_html(rep))
    return warnings
