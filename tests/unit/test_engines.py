"""The engine registry (config/kinds.py) and every place that reads it agree.

Adding a kind means one row in `ENGINES` (docs/engines.md); these tests fail when a row
names code that does not exist, or when a consumer still lists the kinds on its own.
"""

from __future__ import annotations

import asyncio
import inspect
import re

import httpx
import pytest

from config.kinds import BY_KIND, ENGINES, KINDS, engine_kind, load
from config.settings import ConfigError, EngineConfig, parse_config
from exporter.app import build_runner
from exporter.attribution import Attribution
from exporter.collectors import EngineCollector
from exporter.schema import SCHEMA, markdown_table
from simulator.__main__ import build_parser
from simulator.common import SimBase
from tests.paths import ROOT


def test_kinds_are_unique_and_named_for_the_config() -> None:
    assert len(set(KINDS)) == len(KINDS) == len(BY_KIND)
    for kind in KINDS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", kind), kind
    # Contracts: config files and the `kind` label use these names.
    assert {"llamacpp", "sglang"} <= set(KINDS)


@pytest.mark.parametrize("engine", ENGINES, ids=KINDS)
def test_every_reference_loads(engine) -> None:
    collector = load(engine.collector)
    assert inspect.isclass(collector) and issubclass(collector, EngineCollector)
    simulator = load(engine.simulator)
    assert inspect.isclass(simulator) and issubclass(simulator, SimBase)
    assert simulator.kind == engine.kind
    for column in engine.sources:
        assert isinstance(load(column.table), dict), column.table


def test_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=f"known: {', '.join(KINDS)}"):
        engine_kind("vllm")


def test_config_accepts_exactly_the_registered_kinds() -> None:
    engines = [{"name": f"e{i}", "kind": k, "url": "http://h:1"} for i, k in enumerate(KINDS)]
    config = parse_config({"engines": engines}, environ={})
    assert tuple(e.kind for e in config.engines) == KINDS
    with pytest.raises(ConfigError) as err:
        parse_config({"engines": [{"name": "v", "kind": "vllm", "url": "http://h:1"}]}, {})
    quoted = [f"'{k}'" for k in KINDS]
    listed = ", ".join(quoted[:-1]) + " or " + quoted[-1]
    assert err.value.errors == [f"engines.0(v).kind: Input should be {listed}"]


def test_simulator_kinds_come_from_the_registry() -> None:
    action = next(a for a in build_parser()._actions if a.dest == "kind")
    assert tuple(action.choices) == KINDS


def test_build_runner_makes_each_kinds_collector_labelled_with_its_kind() -> None:
    engines = [{"name": f"e{i}", "kind": k, "url": "http://h:1"} for i, k in enumerate(KINDS)]
    config = parse_config({"engines": engines, "gpu": {"enabled": False}}, environ={})

    async def built() -> list[tuple[type, list]]:
        async with httpx.AsyncClient() as client:
            runner = build_runner(config, client)
            out = [(type(c), c.fallback()) for c in runner.collectors]
            await runner.close()
        return out

    collectors = asyncio.run(built())
    assert [cls for cls, _ in collectors] == [load(engine.collector) for engine in ENGINES]
    for (_, fallback), engine in zip(collectors, ENGINES, strict=True):
        (sample,) = fallback[0].samples
        assert sample.name == "llmb_engine_up" and sample.value == 0
        assert sample.labels["kind"] == engine.kind


def test_source_columns_cover_the_engine_series() -> None:
    """Every source names a schema series; every engine series has a source somewhere."""
    main = {engine.kind: load(engine.sources[0].table) for engine in ENGINES}
    for engine in ENGINES:
        for column in engine.sources:
            table = load(column.table)
            assert set(table) <= set(SCHEMA), column.table
            if column is not engine.sources[0]:
                assert column.release and set(table) <= set(main[engine.kind]), column.table
    engine_series = [n for n in SCHEMA if n.startswith(("llmb_engine_", "llmb_model_"))]
    for name in engine_series:
        assert any(table.get(name) for table in main.values()), f"{name}: no engine's source"


def test_docs_table_has_one_column_per_source_column() -> None:
    header = markdown_table().splitlines()[0]
    for engine in ENGINES:
        assert f"| {engine.display} source |" in header
        for column in engine.sources[1:]:
            assert f"| {engine.display} {column.release} source |" in header
    doc = (ROOT / "docs" / "engines.md").read_text()
    for engine in ENGINES:
        assert f"`{engine.kind}`" in doc, engine.kind


def _engine(name: str, kind: str, port: int) -> EngineConfig:
    return EngineConfig(name=name, kind=kind, url=f"http://127.0.0.1:{port}")


def test_default_process_rule_per_kind() -> None:
    llama = _engine("llama", "llamacpp", 8080)
    one_sglang = Attribution([llama, _engine("sgl", "sglang", 30000)])
    assert one_sglang.engine_for(1, "llama-server -m m.gguf --port 8080") == llama
    assert one_sglang.engine_for(1, "llama-server -m m.gguf --port 8081") is None
    # The only SGLang engine owns every process that says sglang, port or not.
    worker = "python -m sglang.launch_server (scheduler TP0)"
    assert one_sglang.engine_for(2, worker).name == "sgl"  # type: ignore[union-attr]
    a, b = _engine("a", "sglang", 30000), _engine("b", "sglang", 30001)
    two = Attribution([a, b])
    assert two.engine_for(2, worker) is None
    assert two.engine_for(2, "python -m sglang.launch_server --port 30001") == b
    for engine in ENGINES:
        assert engine.process.marker and engine.process.port in ("always", "when_several")
