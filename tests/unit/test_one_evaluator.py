"""One evaluator: the verdict is decided by `core.conditions.evaluate` and nowhere else.

The source of every product module is parsed (ast, not grep: a docstring may name the
table). Only the evaluator's own module and the rule generator, which renders the same
conditions as PromQL, may read the condition table or look inside a condition; every
other module reaches the verdict by calling `core.conditions.evaluate`. A behavioural check ties
diagnose's and compare's verdict to that call.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from core.conditions import Verdict, evaluate
from core.signals import Signals
from diagnose.answer import print_answer
from diagnose.decision import one_engine
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.one_engine import decide_single, engine_verdict
from diagnose.decision.two_engines import decide_compare
from diagnose.report.content import answer_of
from tests.paths import ROOT

# The product: what is shipped or run (tests are not scanned; they may read the table).
PACKAGES = ("core", "exporter", "loadgen", "diagnose", "simulator", "tools", "mixin", "prometheus")
EVALUATOR = "core/conditions.py"
# The condition language the table is written in: a condition evaluates its own alternatives.
LANGUAGE = "core/predicates.py"
# The mixin renders the same conditions as the verdict rules (PromQL) and as the docs' prose.
RULE_GENERATORS = ("mixin/rules/verdict.py", "mixin/docs.py")
TABLE = {"CONDITIONS", "CONDITION_BY_NAME"}


def product_modules() -> dict[str, ast.Module]:
    """Every product module, by its path relative to the repository."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[path.relative_to(ROOT).as_posix()] = ast.parse(path.read_text(), str(path))
    return out


MODULES = product_modules()


def table_uses(tree: ast.Module) -> list[str]:
    """Where a module reads the condition table or looks inside a condition."""
    found = []
    for node in ast.walk(tree):
        where = f":{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom):
            found += [f"import {a.name}{where}" for a in node.names if a.name in TABLE]
        elif isinstance(node, ast.Name) and node.id in TABLE:
            found.append(node.id + where)
        elif isinstance(node, ast.Attribute):
            if node.attr in TABLE or node.attr == "alternatives":
                found.append("." + node.attr + where)
            elif node.attr == "evaluate" and not _is_core(node.value):
                # `Condition.evaluate`, or `cond.evaluate(signals)` on one condition.
                found.append(ast.unparse(node) + where)
    return found


def _is_core(node: ast.expr) -> bool:
    """`core` or `core.conditions`: the evaluator's module."""
    text = ast.unparse(node)
    return text in ("core", "core.conditions")


def test_the_scan_sees_the_product() -> None:
    assert EVALUATOR in MODULES and LANGUAGE in MODULES
    assert "diagnose/decision/one_engine.py" in MODULES
    assert all(g in MODULES for g in RULE_GENERATORS)
    assert len(MODULES) > 50, sorted(MODULES)


def test_only_the_evaluator_and_the_rule_generator_read_the_condition_table() -> None:
    allowed = {EVALUATOR, LANGUAGE, *RULE_GENERATORS}
    offenders = {
        path: uses
        for path, tree in MODULES.items()
        if path not in allowed and (uses := table_uses(tree))
    }
    assert offenders == {}
    # The scan would see a use: the evaluator and the generator do read the table.
    assert table_uses(MODULES[EVALUATOR])
    assert all(table_uses(MODULES[g]) for g in RULE_GENERATORS)


def test_the_scan_catches_a_second_evaluator() -> None:
    """What the scan flags (so that an empty list above means something)."""
    code = (
        "from core.conditions import CONDITIONS\n"
        "import core\n"
        "ok = core.evaluate(s)\n"
        "held = [c.evaluate(s) for c in core.conditions.CONDITION_BY_NAME.values()]\n"
        "texts = [e.text for e in cond.alternatives]\n"
    )
    uses = sorted(table_uses(ast.parse(code)))
    assert uses == [
        ".CONDITION_BY_NAME:4",
        ".alternatives:5",
        "c.evaluate:4",
        "import CONDITIONS:1",
    ]


def test_evaluate_and_verdicts_are_made_in_core_only() -> None:
    """No module outside core/ defines an `evaluate` or builds a `Verdict` of its own."""
    defined, built = [], []
    for path, tree in MODULES.items():
        if path.startswith("core/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in (
                "evaluate",
                "decide_verdict",
            ):
                defined.append(f"{path}:{node.lineno}")
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Verdict":
                built.append(f"{path}:{node.lineno}")
    assert defined == []
    assert built == []


def _evaluate_calls(tree: ast.Module) -> list[str]:
    """`core.evaluate(...)` calls, and calls of `evaluate` imported from core."""
    imported = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module in ("core", "core.conditions")
        for a in n.names
        if a.name == "evaluate"
    }
    return [
        ast.unparse(n.func)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and (
            ast.unparse(n.func) in ("core.evaluate", "core.conditions.evaluate")
            or (isinstance(n.func, ast.Name) and n.func.id in imported)
        )
    ]


def test_diagnose_and_compare_reach_the_verdict_through_core_evaluate() -> None:
    """The verdict of diagnose and compare: `engine_verdict` calls core.conditions.evaluate; the
    reports and compare's recommendation only read the verdict it gave."""
    assert _evaluate_calls(MODULES["diagnose/decision/one_engine.py"]) == ["evaluate"]
    for path in MODULES:
        if path.startswith(("diagnose/report/", "diagnose/decision/")) and not path.endswith(
            "one_engine.py"
        ):
            assert _evaluate_calls(MODULES[path]) == [], path


def _engine(verdict: str | None = None) -> EngineResult:
    row = Row("e", "single", 1, per_seq_tok_s=100.0, prompt_tokens=100, max_tokens=64)
    return EngineResult(
        name="e",
        kind="llamacpp",
        weights_bytes=1e9,
        bandwidth_bytes_per_s=1e12,
        rows=[row],
        verdict=verdict,
    )


SIGNALS = [
    Signals(),
    Signals(host_has_gpu=True, layers_ratio=0.5),
    Signals(host_has_gpu=True, layers_ratio=1.0, kv_usage_avg=0.99, waiting_avg=3.0),
    Signals(host_has_gpu=True, layers_ratio=1.0, decode_efficiency=0.2, running=1.0),
    Signals(host_has_gpu=True, layers_ratio=1.0, decode_efficiency=0.9, running=1.0),
]


@pytest.mark.parametrize("signals", SIGNALS)
def test_engine_verdict_is_core_evaluate(signals: Signals) -> None:
    assert engine_verdict(_engine(), signals)[0] == evaluate(signals).name


def test_the_verdict_follows_core_evaluate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever core.conditions.evaluate answers is the verdict diagnose and compare report."""
    calls: list[Signals] = []
    real = evaluate

    def forced(signals: Signals) -> Verdict:
        calls.append(signals)
        return replace(real(signals), name="kv_saturated")

    # engine_verdict calls the evaluator it imported from core.conditions.
    monkeypatch.setattr(one_engine, "evaluate", forced)
    verdict, action = engine_verdict(_engine(), SIGNALS[0])
    e = replace(_engine(), verdict=verdict, action=action)
    assert calls == [SIGNALS[0]]
    assert e.verdict == "kv_saturated"
    assert decide_single(e).verdict == {"e": "kv_saturated"}
    other = replace(_engine("idle"), name="f")
    assert decide_compare(e, other).verdict == {"e": "kv_saturated", "f": "idle"}


def test_an_engine_nothing_measured_is_not_measured_not_idle_and_not_resident_yes() -> None:
    """Ctrl-C before the candidate ran, or a host without a GPU: the verdict says `not
    measured` (it said `idle`, "nothing to fix") and residency says why it is unknown (it
    said `yes, on both engines`). Measured engines keep their answers."""
    measured = replace(_engine("decode_below_card_limit"), name="a")
    unrun = EngineResult(name="b", kind="llamacpp", missing=["every step: interrupted"])
    d = decide_compare(measured, unrun)
    assert d.verdict == {"a": "decode_below_card_limit", "b": None}
    residency = d.steps[0]
    assert residency.key == "residency" and not residency.decisive
    assert residency.answer == "yes on a; not measured: b: interrupted"
    assert [v[:2] for v in answer_of([measured, unrun], d).verdicts] == [
        ("a", "decode_below_card_limit"),
        ("b", "not measured"),
    ]
    assert decide_single(unrun).verdict == {"b": None}
    no_gpu = replace(measured, name="c", missing=["residency: no GPU seen (no NVML)"])
    assert decide_compare(no_gpu, replace(no_gpu, name="d")).steps[0].answer == (
        "not measured: c: no GPU seen (no NVML); d: no GPU seen (no NVML)"
    )
    assert decide_compare(measured, replace(measured, name="f")).steps[0].answer == (
        "yes, on both engines"
    )


def test_the_terminal_says_not_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unrun = EngineResult(name="b", kind="llamacpp", missing=["every step: interrupted"])
    print_answer([unrun], decide_single(unrun), tmp_path)
    out = capsys.readouterr().out
    assert "b: not measured" in out and "idle" not in out, out


def test_rounds_that_spread_wildly_get_a_caveat_beside_the_call() -> None:
    """A new user's compare on a shared 2-core host: np1's three c=1 rounds at 5.3, 1.8 and
    1.1 tok/s, np4's at 9.0, 37.6 and 39.2. The call stands (np4 ahead in every round) but
    says the rounds were not steady; steady rounds say nothing."""

    def engine(name: str, rounds: list[float]) -> EngineResult:
        row = Row(
            name, "single", 1, per_seq_tok_s=sorted(rounds)[1], per_seq_rounds=rounds,
            prompt_tokens=64, max_tokens=32, requests=3, completion_tokens=96, tokens_ok=True,
        )  # fmt: skip
        return EngineResult(
            name=name, kind="llamacpp", weights_bytes=2.5e8, parameters=2.7e8, rows=[row],
            verdict="decode_below_card_limit",
        )  # fmt: skip

    d = decide_compare(engine("np1", [5.3, 1.8, 1.1]), engine("np4", [9.0, 37.6, 39.2]))
    unsteady = [c for c in d.caveats if "the rounds spread" in c]
    assert unsteady and all(c.startswith("c=1 (") for c in unsteady), d.caveats
    assert "the rounds spread 233 %, over 50 %" in unsteady[0], unsteady
    steady = decide_compare(engine("np1", [5.3, 5.1, 5.2]), engine("np4", [9.0, 9.4, 9.2]))
    assert not [c for c in steady.caveats if "the rounds spread" in c], steady.caveats
