"""Every `llmb_*` series name is spelled once, in `core/series.py` (issue 35).

A name spelled in a second place is a rename that misses it and a silent "not measured";
the product imports the constants instead. Docstrings and comments may name a series (they
are prose); recording-rule names (`engine:llmb_...:...`) and globs in prose (`llmb_loadgen_*`)
are not series names.
"""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

from prometheus_client import generate_latest

from core import series
from core.roofline import ModelStructure
from diagnose.decision.model import EngineResult
from exporter.schema import SCHEMA
from loadgen.metrics import LoadgenMetrics
from tests.paths import ROOT

NAMES_MODULE = Path("core/series.py")
PRODUCT = ("cli", "config", "core", "diagnose", "exporter", "loadgen", "mixin", "model")
PRODUCT += ("simulator", "tools", "bench")
# A series name: not the middle of a rule name (`engine:llmb_x:max`), nor a glob in prose.
NAME = re.compile(r"(?<![\w:])llmb_[a-z0-9_]+(?![\w*<])")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of each series name in a string literal of `source`, f-strings'
    literal parts included, docstrings aside (comments are not in the tree)."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            found += [(node.lineno, name) for name in NAME.findall(node.value)]
    return sorted(found)


def _spelled_in_product() -> list[str]:
    out = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == NAMES_MODULE:
                continue
            for line, name in spelled_names(path.read_text(encoding="utf-8")):
                out.append(f"{rel}:{line}: {name}")
    return out


def test_no_series_name_is_spelled_outside_the_names_module() -> None:
    spelled = _spelled_in_product()
    assert not spelled, "import the name from core/series.py:\n" + "\n".join(spelled)


def test_a_planted_name_is_found_and_prose_and_rule_names_are_not() -> None:
    planted = '''"""Reads llmb_engine_up (a docstring: prose)."""
# a comment naming llmb_engine_up
UP = "llmb_engine_up"
RULE = "engine:llmb_engine_up:max"
GLOB = "serve the llmb_loadgen_* metrics"


def f(sel):
    """Prose about llmb_gpu_power_watts."""
    return f"rate(llmb_engine_decode_tokens_total{sel}[5m]) / {UP}"
'''
    assert spelled_names(planted) == [
        (3, "llmb_engine_up"),
        (10, "llmb_engine_decode_tokens_total"),
    ]
    # Planted in a product module's text, the scan of the product would fail.
    module = (ROOT / "diagnose/monitor.py").read_text(encoding="utf-8")
    assert spelled_names(module) == []
    assert spelled_names(module + '\nX = "llmb_engine_slots"\n') == [
        (module.count("\n") + 2, "llmb_engine_slots")
    ]


def _constants() -> dict[str, str]:
    """Every series name of `core/series.py` by its constant (the prefixes are none)."""
    return {
        k: v
        for k, v in vars(series).items()
        if k.isupper() and isinstance(v, str) and not k.endswith("PREFIX")
    }


def test_each_name_is_one_constant_named_after_it() -> None:
    names = _constants()
    assert len(set(names.values())) == len(names), "a name spelled twice in core/series.py"
    for const, name in names.items():
        assert NAME.fullmatch(name), name
        assert const == name.removeprefix("llmb_").upper(), (const, name)


def test_the_exporter_registers_every_exporter_name_and_no_other() -> None:
    exporter = {
        v
        for v in _constants().values()
        if v.startswith(("llmb_gpu_", "llmb_engine_", "llmb_model_"))
    } | set(series.EXPORTER_OWN)
    assert set(SCHEMA) == exporter
    nvml = {name for name in SCHEMA if name.startswith(series.NVML_PREFIX)}
    assert nvml and not nvml & set(series.EXPORTER_OWN)


def test_the_load_generator_exposes_its_names() -> None:
    """The live `/metrics` page's families are the LOADGEN_* names (the SLO's info only with
    --slo), as Prometheus stores them: a counter with `_total`, an info with `_info`."""
    page = generate_latest(LoadgenMetrics().registry).decode()
    typed = {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}
    typed = {name for name in typed if not name.endswith("_created")}
    loadgen = {v for k, v in _constants().items() if k.startswith("LOADGEN_")}
    phases = {series.LOADGEN_PHASE_INFO, series.LOADGEN_PHASE_START_TIMESTAMP_SECONDS}
    assert typed == loadgen - phases - {series.LOADGEN_SLO_INFO}


def test_one_field_to_series_map_names_real_fields() -> None:
    """Each field of `FIELD_SERIES` is a field of the rules' `ModelStructure` or of
    diagnose's `EngineResult`, and every `ModelStructure` field is read from a series."""
    structure = {f.name for f in fields(ModelStructure)}
    result = {f.name for f in fields(EngineResult)}
    assert set(series.FIELD_SERIES) <= structure | result
    assert structure <= set(series.FIELD_SERIES)
    assert set(series.FIELD_SERIES.values()) <= set(SCHEMA)
    assert list(series.field_series("experts", "layers_total")) == ["experts", "layers_total"]
