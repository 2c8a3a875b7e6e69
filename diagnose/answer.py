"""The end of `diagnose` and `compare`: the answer on stdout first, then the files, then the
exit status.

The answer is printed before anything is written, so a report that cannot be written (no
matplotlib, a full disk) costs that file and a warning, never the verdict. `exit_status` is
the one rule of the commands' exit codes (docs/diagnose.md "Exit codes").
"""

from __future__ import annotations

import logging
from pathlib import Path

from core.roofline import host_bound_text
from diagnose.decision.model import Decision, EngineResult, RunInfo, utc_now, verdict_text
from diagnose.report.html.write import write_report
from diagnose.steps.base import gib
from diagnose.steps.concurrency import traffic_row_text
from loadgen.options import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK

log = logging.getLogger(__name__)

WIDTH = 16


def _line(key: str, text: str) -> str:
    return f"{key:<{WIDTH}}{text}"


def _engine_lines(e: EngineResult) -> list[str]:
    """An engine's roofline, speculative, expert-offload and evidence lines."""
    lines = []
    roof = e.roofline
    if roof.efficiency is not None and roof.limit_tok_s:
        if roof.misfit is not None:
            lines.append(
                _line(
                    "roofline",
                    f"{e.name}: does not fit ({roof.misfit}): {roof.efficiency * 100:.0f} % of "
                    f"{roof.limit_tok_s:.1f} tok/s is beyond physics, so no decode verdict",
                )
            )
        else:
            lines.append(
                _line(
                    "roofline",
                    f"{e.name}: {roof.efficiency * 100:.0f} % of {roof.limit_tok_s:.1f} tok/s",
                )
            )
    if e.spec_accept_length is not None:
        lines.append(
            _line(
                "acceptance",
                f"{e.name}: {e.spec_accept_length:.2f} tokens per model step "
                "(speculative decoding)",
            )
        )
    if e.experts_host_layers:
        lines.append(
            _line(
                "expert offload",
                f"{e.name}: experts of {e.experts_host_layers:.0f} layers in host memory "
                f"({gib(e.experts_host_bytes)}); {host_bound_text(e.host_offload())}",
            )
        )
    for what, where in e.evidence.items():
        lines.append(_line(what, f"{e.name}: {where}"))
    if e.stopped:
        lines.append(_line("partial", f"{e.name}: stopped at {e.stopped}"))
    return lines


def print_answer(engines: list[EngineResult], decision: Decision, out: Path) -> None:
    """The answer on stdout, once: verdict(s), recommendation, action, steps, caveats."""
    lines = [_line("verdict", f"{name}: {verdict_text(v)}") for name, v in decision.verdict.items()]
    lines.append(_line("recommendation", decision.recommendation))
    lines.append(_line("action", decision.action))
    load = decision.load_text()
    if load:
        lines.append(_line("your load", load))
    if len(engines) > 1:
        lines.append(_line("comparable", "yes" if decision.comparable else "no"))
    # compare sends every engine the same mix: said once.
    for mix in dict.fromkeys(e.traffic.text() for e in engines if e.traffic is not None):
        lines.append(_line("your traffic", mix))
    for step in decision.steps:
        lines.append(f"  {step.key:<{WIDTH - 2}}{step.answer}")
    if len(engines) > 1:
        # compare's steps compare; each engine's own figures under the traffic are here.
        for e in engines:
            row = next((r for r in e.ok_rows("concurrency") if e.traffic is not None), None)
            if row is not None:
                lines.append(_line("under traffic", f"{e.name}: {traffic_row_text(row)}"))
    for e in engines:
        lines += _engine_lines(e)
    for est in decision.estimates:
        lines.append(_line("estimate", f"{est.basis} ≈ {est.tok_s:.1f} tok/s"))
    for c in decision.caveats:
        lines.append(_line("caveat", c))
    lines.append(_line("report", str(out / "report.html")))
    print("\n".join(lines), flush=True)


def write_outputs(
    out: Path, engines: list[EngineResult], decision: Decision, run: RunInfo, title: str
) -> bool:
    """results.json, report.md and report.html; each one not written is a warning on stderr.

    Returns whether results.json was written (the one file the exit status depends on).
    """
    run.finished_at = utc_now()
    run.partial = any(e.stopped for e in engines)
    warnings = write_report(out, engines, decision, title, run)
    for text in warnings:
        log.warning("%s", text)
    return not any(w.startswith(("results.json", "no report")) for w in warnings)


def exit_status(
    engines: list[EngineResult], decision: Decision, fail_on: frozenset[str], written: bool
) -> int:
    """0: the answer is known; 3: a `--fail-on` verdict; 1: the engine was lost or
    results.json could not be written; 130: interrupted (docs/diagnose.md "Exit codes")."""
    if any(e.interrupted for e in engines):
        return EXIT_INTERRUPTED
    if any(e.stopped for e in engines) or not written:
        return EXIT_FAILED
    if fail_on & set(decision.verdict.values()):
        return EXIT_INVALID
    return EXIT_OK
