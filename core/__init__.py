"""The decision core: thresholds, verdicts and their conditions, and the decode roofline.

Modules: `thresholds`, `signals`, `conditions` (the condition table and `evaluate`, the one
evaluator), `roofline` (bytes per step, the physics gate), `rules` (the recording rules'
arithmetic over raw samples). This package re-exports their public names except the
condition table, which only the evaluator and the rule generator read.

Every surface that names a bottleneck takes it from here: the Prometheus rules
(`python -m mixin` renders them from `CONDITIONS`, `VERDICTS` and `THRESHOLDS`),
`prometheus/thresholds.md`, the verdict table in `docs/diagnose.md`, and `llmb-loadgen
diagnose` / `compare` (which call `evaluate`). `tests/system/test_verdict_parity.py` feeds the same
samples to `evaluate` and to promtool and requires the same verdict.

Public API
----------
Thresholds
    `Threshold`, `THRESHOLDS` (name -> value as PromQL text, unit, why), `t(name)` (the
    PromQL text), `number(name)` (a ratio/requests/bytes threshold as a float),
    `seconds(name)` (a range/duration threshold in seconds).
Verdicts
    `VERDICTS` (names in decision order), `VERDICT_INFO` (name -> `VerdictInfo`: the
    condition that decides it, summary, action, fleet severity), `SEVERITY`.
Conditions
    `CONDITIONS` (in decision order, each a `Condition` built from `Evidence` alternatives
    of `Compare` / `AllOf` tests on `Signals` fields). `SIGNAL_RECORDS` maps each
    `Signals` field to the recorded series the rules read it from.
Evaluation
    `Signals` (the recording-rule-level inputs; `None` = the series is absent),
    `evaluate(signals) -> Verdict` (`.name`, `.conditions`, `.evidence`, `.info`),
    `ConditionResult`.
Roofline
    `decode_bytes_per_step(weights, kv_tokens, kv_bytes_per_token)`,
    `roofline_tokens_per_second(bandwidth, bytes_per_step)`,
    `decode_efficiency(decode_tokens_per_second, roofline)`.
From raw samples (`core.rules`)
    `series_from_scrapes`, `signals_at`, `verdicts_at`, `rule_values_at`: the recording
    rules' arithmetic at a time `at`, as promtool computes it (details in `core.rules`).

Absence mirrors PromQL: a comparison on an absent signal is absent, `AllOf` is absent when
one part is, an `Evidence` alternative that is absent does not count, and a condition with
every alternative absent is false (the rules' `or 0 * up`).
"""

from core.conditions import (
    POOL_ACTION,
    PREFILL_ACTION,
    SEVERITY,
    SLOTS_FULL_ACTION,
    VERDICT_INFO,
    VERDICTS,
    AllOf,
    Compare,
    Condition,
    ConditionResult,
    Evidence,
    Verdict,
    VerdictInfo,
    evaluate,
)
from core.roofline import (
    MISFIT_BY_NAME,
    MISFIT_REASONS,
    MisfitReason,
    ModelStructure,
    RooflineFacts,
    accepted_tokens,
    active_weights_bytes,
    decode_batch,
    decode_bytes_per_step,
    decode_efficiency,
    expert_offload_action,
    expert_share,
    experts_host_bound,
    go_pow,
    misfit_text,
    physical,
    roofline_facts,
    roofline_misfit,
    roofline_tokens_per_second,
    tp_bandwidth,
)
from core.rules import (
    LOOKBACK_SECONDS,
    EngineKey,
    Labels,
    Points,
    RuleValues,
    SeriesKey,
    admission_values,
    rule_values_at,
    series_from_scrapes,
    signals_at,
    verdicts_at,
)
from core.signals import (
    SIGNAL_FIELDS,
    SIGNAL_RECORDS,
    Signals,
)
from core.thresholds import (
    THRESHOLDS,
    Threshold,
    number,
    seconds,
    t,
)

__all__ = [
    "LOOKBACK_SECONDS",
    "MISFIT_BY_NAME",
    "MISFIT_REASONS",
    "POOL_ACTION",
    "PREFILL_ACTION",
    "SEVERITY",
    "SIGNAL_FIELDS",
    "SIGNAL_RECORDS",
    "SLOTS_FULL_ACTION",
    "THRESHOLDS",
    "VERDICTS",
    "VERDICT_INFO",
    "AllOf",
    "Compare",
    "Condition",
    "ConditionResult",
    "EngineKey",
    "Evidence",
    "Labels",
    "MisfitReason",
    "ModelStructure",
    "Points",
    "RooflineFacts",
    "RuleValues",
    "SeriesKey",
    "Signals",
    "Threshold",
    "Verdict",
    "VerdictInfo",
    "accepted_tokens",
    "active_weights_bytes",
    "admission_values",
    "decode_batch",
    "decode_bytes_per_step",
    "decode_efficiency",
    "evaluate",
    "expert_offload_action",
    "expert_share",
    "experts_host_bound",
    "go_pow",
    "misfit_text",
    "number",
    "physical",
    "roofline_facts",
    "roofline_misfit",
    "roofline_tokens_per_second",
    "rule_values_at",
    "seconds",
    "series_from_scrapes",
    "signals_at",
    "t",
    "tp_bandwidth",
    "verdicts_at",
]
