"""The verdict rules: one 0/1 series per condition of the core, the verdict in decision
order built from them by arithmetic, and the fleet's severity per engine and host."""

from __future__ import annotations

from typing import Any

from core import series as llmb
from core.conditions import (
    CONDITION_BY_NAME,
    CONDITIONS,
    SEVERITY,
    VERDICT_INFO,
    VERDICTS,
)
from core.predicates import AllOf, Compare, Condition
from core.signals import SIGNAL_RECORDS
from mixin.rules.common import UP, E, rec


def _indent(lines: list[str], n: int) -> list[str]:
    return [" " * n + line for line in lines]


def _compare(c: Compare) -> str:
    """`record OP bool threshold`; an absent signal that counts as holding reads `up`."""
    text = f"{SIGNAL_RECORDS[c.signal]} {c.op} bool {c.promql_threshold}"
    return f"{text} or {UP}" if c.absent_holds else text


def _test(test: Compare | AllOf, bare: bool = False) -> list[str]:
    """A 0/1 vector, absent where a signal is (AllOf: the comparisons multiplied)."""
    if isinstance(test, Compare):
        return [_compare(test) if bare else f"({_compare(test)})"]
    return [("    " if i == 0 else "  * ") + f"({_compare(p)})" for i, p in enumerate(test.parts)]


def condition_expr(cond: Condition) -> str:
    """PromQL of one condition of the core: 0 or 1 for every engine that is up."""
    if len(cond.alternatives) == 1:
        body = _test(cond.alternatives[0].test)
        if len(body) > 1:
            body = ["(", *body, ")"]
    else:
        # Each alternative keeps its name as an `evidence` label until `max` folds them.
        alts = []
        for e in cond.alternatives:
            test = _test(e.test, bare=True)
            test[-1] += ","
            alts.append(
                ["label_replace(", *_indent(test, 2), f'  "evidence", "{e.label}", "", ""', ")"]
            )
        inner: list[str] = []
        for i, alt in enumerate(alts):
            if i:
                inner.append("  or")
            inner += _indent(alt, 4)
        body = [f"max by ({E}) (", *inner, ")"]
    if cond.needs_gpu:
        body = [
            "(",
            *_indent(body, 4),
            f"  and on (host) count by (host) ({llmb.GPU_MEMORY_TOTAL_BYTES}) > 0",
            ")",
        ]
    lines = [*_indent(body, 2), f"  and on ({E}) {UP}", "or", f"  0 * {UP}"]
    return "\n".join(lines) + "\n"


def verdict_rules() -> list[dict[str, Any]]:
    """The decision conditions (0/1 per up engine) and the verdict built from them."""
    conditions = [rec(c.record, condition_expr(c)) for c in CONDITIONS]
    # Decision order: a verdict is 1 only when every earlier condition is 0.
    verdicts = []
    earlier: list[str] = []
    for v in VERDICTS:
        cond = VERDICT_INFO[v].condition
        record = CONDITION_BY_NAME[cond].record if cond is not None else None
        terms = [f"(1 - {r})" for r in earlier]
        if record is not None:
            terms.append(record)
            earlier.append(record)
        expr = "\n* ".join(terms) + "\n" if len(terms) > 1 else terms[0]
        verdicts.append(rec("llmb:engine_bottleneck:verdict", expr, verdict=v))
    return [
        {"name": "llmb-verdict-conditions", "rules": conditions},
        {"name": "llmb-verdict", "rules": verdicts},
        {"name": "llmb-fleet", "rules": fleet_rules()},
    ]


def fleet_rules() -> list[dict[str, Any]]:
    """Many hosts on one Prometheus: a severity per engine and verdict counts per host."""
    # A loading engine (SGLang warming up, llama.cpp loading the model) is not down.
    down = (
        "label_replace(engine:llmb_engine_up:max == 0 unless on (host, engine, kind) "
        f"max by (host, engine, kind) ({llmb.ENGINE_LOADING}) == 1, "
        '"verdict", "engine_down", "", "")'
    )
    parts = [f"{down} + {SEVERITY['engine_down']}"] + [
        f'(llmb:engine_bottleneck:verdict{{verdict="{v}"}} == 1) * {SEVERITY[v]}' for v in VERDICTS
    ]
    return [
        rec(
            # One series per engine (labels host, engine, kind, verdict), value = severity.
            "llmb:engine_bottleneck:severity",
            "\n  or\n".join(parts) + "\n",
        ),
        rec(
            "host_verdict:llmb_engines:count",
            "count by (host, verdict) (llmb:engine_bottleneck:severity)",
        ),
        rec(
            "host:llmb_engine_bottleneck_severity:max",
            "max by (host) (llmb:engine_bottleneck:severity)",
        ),
    ]
