"""The engine registry (config/kinds.py) and every place that reads it agree.

Adding a kind means one row in `ENGINES` (docs/engines.md) and one entry in each table of
code keyed by kind (collector, source columns, simulator); these tests fail when a table
misses a kind, or when a consumer still lists the kinds on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import re

import httpx
import pytest
from aiohttp import web

from config.kinds import BY_KIND, ENGINES, KINDS, engine_kind
from config.settings import ConfigError, EngineConfig, parse_config
from diagnose.probe import probe_url
from exporter.app import COLLECTORS, build_runner
from exporter.attribution import Attribution
from exporter.collectors import EngineCollector
from exporter.collectors.sources import SOURCE_COLUMNS
from exporter.metrics_doc import markdown_table
from exporter.schema import SCHEMA
from loadgen.options import add_target_options
from simulator.__main__ import SIMULATORS, build_parser
from simulator.common import SimBase
from tests.conftest import get_free_port
from tests.paths import ROOT


def test_kinds_are_unique_and_named_for_the_config() -> None:
    assert len(set(KINDS)) == len(KINDS) == len(BY_KIND)
    for kind in KINDS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", kind), kind
    # Contracts: config files and the `kind` label use these names.
    assert {"llamacpp", "sglang"} <= set(KINDS)


def test_every_table_of_code_has_every_kind() -> None:
    """Collector, source columns and simulator: one entry per registered kind, no other."""
    for table in (COLLECTORS, SOURCE_COLUMNS, SIMULATORS):
        assert tuple(table) == KINDS
    for kind in KINDS:
        assert inspect.isclass(COLLECTORS[kind]) and issubclass(COLLECTORS[kind], EngineCollector)
        simulator = SIMULATORS[kind]
        assert issubclass(simulator, SimBase) and simulator.kind == kind
        assert SOURCE_COLUMNS[kind] and all(isinstance(c.table, dict) for c in SOURCE_COLUMNS[kind])


@pytest.mark.parametrize("engine", ENGINES, ids=KINDS)
def test_every_row_says_how_diagnose_reads_it(engine) -> None:
    assert engine.display and engine.info.paths
    assert all(path.startswith("/") for path in engine.info.paths)
    assert engine.info.read({}) == {}  # an empty answer leaves every fact unknown
    residency = engine.residency
    assert residency.buffers and residency.weights
    assert (residency.layers is None) == (not residency.layers_fix)
    assert engine.tokenize_path is None or engine.tokenize_path.startswith("/")


async def _serving(paths: tuple[str, ...]) -> tuple[str, web.AppRunner]:
    """A server answering a JSON object at each of `paths` (anything else: 404)."""
    app = web.Application()
    for path in paths:
        app.router.add_get(path, lambda request: web.json_response({"ok": True}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = get_free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}", runner


async def test_detect_kind_probes_each_rows_info_endpoint() -> None:
    """A server answering only one row's info endpoint is told to be that row's kind."""
    for engine in ENGINES:
        for path in engine.info.paths:
            url, runner = await _serving((path,))
            try:
                assert await probe_url(url, None, "openai", model=False) == (engine.kind, None)
            finally:
                await runner.cleanup()
    url, runner = await _serving(())
    try:
        assert await probe_url(url, None, "openai", model=False) == ("openai", None)
    finally:
        await runner.cleanup()


def test_loadgen_kind_choices_are_the_registered_kinds() -> None:
    parser = argparse.ArgumentParser()
    add_target_options(parser)
    action = next(a for a in parser._actions if a.dest == "kind")
    assert tuple(action.choices) == (*KINDS, "openai")


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
    assert [cls for cls, _ in collectors] == [COLLECTORS[kind] for kind in KINDS]
    for (_, fallback), engine in zip(collectors, ENGINES, strict=True):
        (sample,) = fallback[0].samples
        assert sample.name == "llmb_engine_up" and sample.value == 0
        assert sample.labels["kind"] == engine.kind


def test_source_columns_cover_the_engine_series() -> None:
    """Every source names a schema series; every engine series has a source somewhere."""
    main = {kind: columns[0].table for kind, columns in SOURCE_COLUMNS.items()}
    for kind, (first, *releases) in SOURCE_COLUMNS.items():
        assert set(first.table) <= set(SCHEMA) and not first.release, kind
        for column in releases:
            assert set(column.table) <= set(SCHEMA), column.release
            assert column.release and set(column.table) <= set(main[kind]), column.release
    engine_series = [n for n in SCHEMA if n.startswith(("llmb_engine_", "llmb_model_"))]
    for name in engine_series:
        assert any(table.get(name) for table in main.values()), f"{name}: no engine's source"


def test_docs_table_has_one_column_per_source_column() -> None:
    header = markdown_table().splitlines()[0]
    for engine in ENGINES:
        assert f"| {engine.display} source |" in header
        for column in SOURCE_COLUMNS[engine.kind][1:]:
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
