"""report.md: the answer, the metadata, the steps, the tables and what was not measured."""

from __future__ import annotations

from collections.abc import Sequence

from diagnose.report import content


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(rep: content.Report) -> str:
    """report.md: the answer, the metadata, the steps, the tables and what was not measured."""
    a = rep.answer
    parts = [f"# llm-bottleneck {rep.title}", "", "## Answer", ""]
    parts += [
        _md_table(("engine", "verdict", "meaning"), [[n, f"`{v}`", m] for n, v, m in a.verdicts]),
        "",
    ]
    parts += [f"**Recommendation:** `{a.recommendation}`", "", f"**Action:** {a.action}", ""]
    if a.load:
        parts += [f"**Your load:** {a.load}", ""]
    parts += [f"**Comparable:** {content.comparable_text(a)}", ""]
    if a.estimates:
        parts += ["**Estimates:**", ""] + [f"- {x}" for x in a.estimates] + [""]
    parts += ["**Caveats:**" + ("" if a.caveats else " none"), ""]
    parts += [f"- {c}" for c in a.caveats] + ([""] if a.caveats else [])
    parts += ["## Run", "", _md_table(("", ""), content.metadata_rows(rep.meta)), ""]
    if rep.traffic:
        parts += ["## Your traffic", "", _md_table(("", ""), rep.traffic), ""]
    parts += ["## Steps, in order", ""]
    for n, (question, answer, decisive) in enumerate(rep.steps, 1):
        parts.append(f"{n}. **{question}** {answer}" + (" ← decided" if decisive else ""))
    parts += ["", "## Engines", "", _md_table(*rep.facts), ""]
    parts += ["## Plots", ""]
    for p in rep.plots:
        parts.append(f"- {p.caption}: " + ("in report.html" if p.svg else p.missing))
    head, rows, notes = rep.table
    parts += ["", "## Measurements", ""]
    parts += [_md_table(head, rows), ""] if rows else [content.NO_ROWS, ""]
    parts += [f"- {n}" for n in notes] + ([""] if notes else [])
    parts += ["## Phases", ""]
    parts += (
        [_md_table(content.PHASE_HEAD, rep.phases), ""] if rep.phases else [content.NO_PHASES, ""]
    )
    parts += ["## Not measured", ""]
    parts += [f"- {m}" for m in rep.missing] or ["- nothing: every step ran"]
    return "\n".join(parts) + "\n"
