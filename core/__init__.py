"""The decision core: thresholds, verdicts and their conditions, and the decode roofline.

Import from the modules (`from core.conditions import evaluate`); this package re-exports
nothing, so that every name is found where it is defined:

- `thresholds`: `THRESHOLDS` (name -> value as PromQL text, unit, why), `threshold_promql`
  (the PromQL text), `threshold_number` (a ratio/requests/bytes threshold as a float),
  `threshold_seconds` (a range/duration threshold in seconds);
- `signals`: `Signals` (the recording-rule-level inputs; `None` = the series is absent),
  `SIGNAL_RECORDS` (each field's recorded series);
- `predicates`: the condition language (`Compare`, `AllOf`, `Evidence`, `Condition`);
- `conditions`: `VERDICTS` (names in decision order), `VERDICT_INFO`, `SEVERITY`, the
  condition table (`CONDITIONS`: `Evidence` alternatives of `Compare` / `AllOf` tests on
  `Signals` fields, read only by the evaluator and the rule generator) and `evaluate`, the
  one evaluator (`evaluate(signals) -> Verdict`);
- `roofline`: bytes per decode step, the roofline, decode efficiency, the physics gate;
- `rules`: the recording rules' arithmetic over raw samples (`series_from_scrapes`,
  `rule_values_at`, `verdicts_at`), as promtool computes it.

Every surface that names a bottleneck takes it from here: the Prometheus rules
(`python -m mixin` renders them from `CONDITIONS`, `VERDICTS` and `THRESHOLDS`),
`prometheus/thresholds.md`, the verdict table in `docs/diagnose.md`, and `llmb-loadgen
diagnose` / `compare` (which call `evaluate`). `tests/system/test_verdict_parity.py` feeds the
same samples to `evaluate` and to promtool and requires the same verdict.

Absence mirrors PromQL: a comparison on an absent signal is absent, `AllOf` is absent when
one part is, an `Evidence` alternative that is absent does not count, and a condition with
every alternative absent is false (the rules' `or 0 * up`).
"""
