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
