"""The engine registry (config/kinds.py) and every place that reads it agree.

Adding a kind means one `register(EngineKind(...))` (docs/engines.md) whose entry points name
its collector package and its simulator; these tests fail when a row names code that is not
there, when a consumer still lists the kinds on its own, or when a literal kind is spelled
outside the registry and the engines' own packages. A fake kind is registered and scraped.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from config import kinds as registry
from config.kinds import (
    GENERIC,
    EngineKind,
    InfoEndpoint,
    ProcessRule,
    ResidencySources,
    engine_kind,
    engines,
    kinds,
    register,
)
from config.settings import ConfigError, EngineConfig, parse_config
from exporter.app import build_runner, collector_class
from exporter.attribution import Attribution
from exporter.collectors import EngineCollector, Scrape, SourceError
from exporter.collectors.sources import SourceColumn, source_columns
from exporter.metrics_doc import markdown_table
from exporter.schema import SCHEMA, MetricSet
from exporter.server import make_app
from loadgen.options import add_target_options
from loadgen.resolve import probe_url
from simulator.__main__ import build_parser
from simulator.common import simulator_class
from tests.paths import ROOT

KINDS = kinds()
ENGINES = engines()


def test_kinds_are_unique_and_named_for_the_config() -> None:
    assert len(set(KINDS)) == len(KINDS) == len(ENGINES)
    for kind in KINDS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", kind), kind
    # Contracts: config files and the `kind` label use these names.
    assert {"llamacpp", "sglang"} <= set(KINDS)
    assert GENERIC == "openai" and GENERIC not in KINDS
    with pytest.raises(ValueError, match="already registered"):
        register(ENGINES[0])


@pytest.mark.parametrize("engine", ENGINES, ids=KINDS)
def test_every_row_names_its_code_in_its_own_packages(engine: EngineKind) -> None:
    """Collector and source columns in exporter/collectors/<kind>/, simulator in
    simulator/<kind>/: each entry point resolves to the right kind of object."""
    package = f"exporter.collectors.{engine.kind}."
    assert engine.collector.startswith(package) and engine.sources.startswith(package)
    assert engine.simulator.startswith(f"simulator.{engine.kind}.")
    assert issubclass(collector_class(engine.kind), EngineCollector)
    assert simulator_class(engine.kind).kind == engine.kind
    columns = source_columns(engine.kind)
    assert columns and all(isinstance(c.table, dict) for c in columns)


@pytest.mark.parametrize("engine", ENGINES, ids=KINDS)
def test_every_row_says_how_diagnose_reads_it(engine) -> None:
    assert engine.display and engine.info.paths
    assert all(path.startswith("/") for path in engine.info.paths)
    assert engine.info.read({}) == {}  # an empty answer leaves every fact unknown
    residency = engine.residency
    assert residency.buffers and residency.weights
    assert (residency.layers is None) == (not residency.layers_fix)
    assert engine.tokenize_path is None or engine.tokenize_path.startswith("/")
    assert engine.log_only and engine.model_layout in ("file", "folder")
    assert engine.model_named_by.startswith(engine.info.paths[0] + " ")


async def test_detect_kind_probes_each_rows_info_endpoint(serve: Any) -> None:
    """A server answering only one row's info endpoint is told to be that row's kind."""
    for engine in ENGINES:
        for path in engine.info.paths:
            url, _ = await serve({path: {"ok": True}})
            probe = await asyncio.to_thread(probe_url, url, None, GENERIC, 5.0, True)
            assert probe.kind == engine.kind
    url, _ = await serve({})
    probe = await asyncio.to_thread(probe_url, url, None, GENERIC, 5.0, True)
    assert probe.kind == GENERIC


def test_loadgen_kind_choices_are_the_registered_kinds() -> None:
    parser = argparse.ArgumentParser()
    add_target_options(parser)
    action = next(a for a in parser._actions if a.dest == "kind")
    assert tuple(action.choices) == (*KINDS, GENERIC)


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
    assert [cls for cls, _ in collectors] == [collector_class(kind) for kind in KINDS]
    for (_, fallback), engine in zip(collectors, ENGINES, strict=True):
        (sample,) = fallback[0].samples
        assert sample.name == "llmb_engine_up" and sample.value == 0
        assert sample.labels["kind"] == engine.kind


def test_source_columns_cover_the_engine_series() -> None:
    """Every source names a schema series; every engine series has a source somewhere."""
    main = {kind: source_columns(kind)[0].table for kind in KINDS}
    for kind in KINDS:
        first, *releases = source_columns(kind)
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
        for column in source_columns(engine.kind)[1:]:
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


# --- a new engine is one registration ---------------------------------------------------


class FakeCollector(EngineCollector):
    """A made-up engine's collector: its `/status` says how many requests run."""

    async def collect(self) -> Scrape:
        try:
            body = await self.get("/status")
        except SourceError as exc:
            return Scrape(self.fallback(), up=False, errors=[exc])
        ms = MetricSet()
        ms.add("llmb_engine_up", 1, **self.labels)
        ms.add("llmb_engine_requests_running", json.loads(body.content)["running"], **self.labels)
        return Scrape.of(ms, True, [])


FAKE_COLUMNS = (SourceColumn({"llmb_engine_requests_running": "`/status` running"}),)
FAKE = EngineKind(
    kind="fake",
    display="Fake",
    process=ProcessRule("fake-server"),
    info=InfoEndpoint(("/fake_info",), lambda body: {"slots": body["slots"]}),
    residency=ResidencySources(buffers="its log", weights="its log", layers=None),
    collector=f"{__name__}:FakeCollector",
    sources=f"{__name__}:FAKE_COLUMNS",
    simulator="simulator.none:Nothing",  # never resolved: the test runs no simulator
    log_only="nothing",
    model_layout="file",
)


@pytest.fixture
def fake_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineKind]:
    """FAKE registered the way a real kind is (one `register`), for this test only."""
    monkeypatch.setattr(registry, "BY_KIND", dict(registry.BY_KIND))
    yield register(FAKE)


async def test_a_kind_added_by_one_registration_is_scraped(fake_kind: EngineKind) -> None:
    """Config, exporter (collector, in-process /metrics), docs columns and kind detection
    all take the fake kind from its one registration."""

    async def status(request: web.Request) -> web.Response:
        return web.json_response({"running": 3})

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"slots": 2})

    app = web.Application()
    app.router.add_get("/status", status)
    app.router.add_get("/fake_info", info)
    engine_server = TestServer(app)
    await engine_server.start_server()
    url = str(engine_server.make_url("")).rstrip("/")
    config = parse_config(
        {"engines": [{"name": "f", "kind": "fake", "url": url}], "gpu": {"enabled": False}},
        environ={},
    )
    try:
        async with httpx.AsyncClient() as client:
            exporter = TestClient(TestServer(make_app(build_runner(config, client))))
            async with exporter:
                text = await (await exporter.get("/metrics")).text()
        probe = await asyncio.to_thread(probe_url, url, None, GENERIC, 5.0, True)
    finally:
        await engine_server.close()
    lines = text.splitlines()
    assert 'llmb_engine_up{engine="f",host="vm",kind="fake"} 1.0' in lines
    assert 'llmb_engine_requests_running{engine="f",host="vm",kind="fake"} 3.0' in lines
    assert 'llmb_source_up{host="vm",source="f"} 1.0' in lines
    assert (probe.kind, probe.info) == ("fake", {"slots": 2})
    assert "| Fake source |" in markdown_table().splitlines()[0]
    assert "fake" in add_target_choices()


def add_target_choices() -> tuple[str, ...]:
    parser = argparse.ArgumentParser()
    add_target_options(parser)
    return tuple(next(a for a in parser._actions if a.dest == "kind").choices)  # type: ignore[arg-type]


# Where an engine kind may be spelled: the registry and each kind's own packages. Outside the
# product: tests, docs, bench/ (runs of a named real engine) and the collectors' fuzz harness,
# which serves each kind's captured answers.
PRODUCT = ("cli", "config", "core", "diagnose", "exporter", "loadgen", "mixin", "model",
           "simulator", "tools")  # fmt: skip
OWN = (
    "config/kinds.py",
    *(f"{p}/{k}/" for p in ("exporter/collectors", "simulator") for k in KINDS),
)
HARNESS = ("tools/fuzz_collectors.py",)


def _kind_literals(source: str) -> list[int]:
    """Lines of string constants that are an engine kind, or select one (`kind="..."`);
    docstrings and comments aside."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    names = (*KINDS, GENERIC)
    selector = re.compile(r"kind\s*=~?\s*\\?[\"'](" + "|".join(names) + ")")
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and (node.value in names or selector.search(node.value))
    )


def _literals_outside_the_registry() -> dict[str, list[int]]:
    found = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(OWN) or rel in HARNESS:
                continue
            if lines := _kind_literals(path.read_text()):
                found[rel] = lines
    return found


def test_no_engine_kind_is_spelled_outside_the_registry() -> None:
    assert _literals_outside_the_registry() == {}


def test_the_literal_count_sees_a_kind_and_a_selector() -> None:
    planted = '"""sglang"""\nX = "sglang"  # llamacpp\n'
    planted += 'Y = f\'m{{kind="llamacpp"}}\'\nZ = "openai"\n'
    assert _kind_literals(planted) == [2, 3, 4]
