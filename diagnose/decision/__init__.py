"""What `diagnose` and `compare` measured, and the answer they give from it.

Modules: `model` (the typed results shared by the terminal output, `results.json`,
`report.md` and `report.html`), `roofline` (the card's decode limit per engine and step),
`one_engine` (an engine's verdict and `diagnose`'s answer), `two_engines` (two engines
side by side and the recommendation), `calls` (one difference with its interval), `loads`
(the answer per load, the crossover, the SLO), `requests` (requests.jsonl matched to the
rows), `results` (the results.json document and the way back).

The verdict of each engine is never decided here: `one_engine.engine_verdict` builds nothing
of its own and calls `core.conditions.evaluate`, the same evaluator the Prometheus recording rules
are generated from. What is decided here is only what the rules cannot see: the
comparison of two engines (comparability, batching at equal load, long context, spread
over rounds) and the recommendation.
"""
