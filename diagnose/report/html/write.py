"""Write results.json, report.md and report.html of one diagnose or compare run."""

from __future__ import annotations

import json
from pathlib import Path

from diagnose.decision.model import Decision, EngineResult, RunInfo
from diagnose.decision.results import results_to_dict
from diagnose.report.content import Report, answer_of, metadata_of, not_measured
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
    )


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
