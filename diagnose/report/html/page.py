"""report.html: one self-contained page, every drawn plot inline as SVG."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from diagnose.report import content
from diagnose.report.html.figure import Plot

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


def render_html(rep: content.Report) -> str:
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
    load = f'<p id="load"><b>Your load:</b> {_esc(a.load)}</p>\n' if a.load else ""
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
        else f"<p>{_esc(content.NO_ROWS)}</p>"
    )
    phases = (
        _html_table(content.PHASE_HEAD, rep.phases, "phases")
        if rep.phases
        else f"<p>{_esc(content.NO_PHASES)}</p>"
    )
    missing = "".join(f"<li>{_esc(m)}</li>" for m in rep.missing) or (
        "<li>nothing: every step ran</li>"
    )
    meta = _html_table(("", ""), content.metadata_rows(rep.meta), "meta", True)
    traffic = (
        f'<section id="traffic"><h2>Your traffic</h2>'
        f"{_html_table(('', ''), rep.traffic, 'meta', True)}</section>\n"
        if rep.traffic
        else ""
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
{load}<p id="comparable"><b>Comparable:</b> {_esc(content.comparable_text(a))}</p>
{estimates}<div id="caveats"><b>Caveats:</b>{caveats}</div>
</section>
<section id="metadata"><h2>Run</h2>{meta}
</section>
{traffic}<h2>Steps, in order</h2><ol id="steps">{steps}</ol>
<h2>Engines</h2>{_html_table(*rep.facts, "facts", True)}
<h2>Plots</h2>{"".join(_html_plot(p) for p in rep.plots)}
<h2>Measurements</h2>{measurements}{table_notes}
<h2>Phases</h2>{phases}
<h2>Not measured</h2><ul id="not-measured">{missing}</ul>
</body></html>
"""
