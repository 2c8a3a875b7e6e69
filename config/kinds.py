"""The engine kinds: the one table a new inference server is registered in.

Each row names, for one `kind` (the config's `engines[].kind` and the `kind` label), the
collector that reads it, the schema's source column for docs/metrics.md, the simulator that
plays it in tests, and how its GPU processes are recognised. Everything that branches on an
engine kind reads this table: `config.settings` (the allowed kinds), `exporter.app` (which
collector), `exporter.attribution` (the default process rule), `exporter.schema` (the source
columns) and `llmb-sim --kind`. docs/engines.md is the recipe for adding a row.

Code is named by `module:attribute` strings, loaded on first use (`load`): the config can
list the kinds without importing a collector, and the exporter never imports the simulator
(the simulator may import the exporter, not the other way round). A unit test loads every
string, so a typo fails the tests, not a user.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class ProcessRule:
    """The default rule that attributes a GPU process to an engine of this kind.

    A process belongs to the engine when its command line contains `marker` and carries
    `--port <the engine URL's port>`; with `port="when_several"` the port is needed only when
    more than one engine of the kind is configured (workers spawned without the port).
    """

    marker: str
    port: Literal["always", "when_several"] = "always"


@dataclass(frozen=True)
class SourceColumn:
    """A column of docs/metrics.md: where each `llmb_*` series comes from on this engine.

    `table` names a `dict[str, str]` (series name -> source; "" = absent). A `release`
    column lists only what differs on that release from the kind's main column.
    """

    table: str
    release: str = ""


@dataclass(frozen=True)
class EngineKind:
    """One inference server the exporter can read."""

    kind: str  # config `kind:` and the `kind` label
    display: str  # how docs and messages name it
    collector: str  # module:class of its exporter.collectors.Collector
    simulator: str  # module:class of its simulator.common.SimBase
    sources: tuple[SourceColumn, ...]  # the main column first
    process: ProcessRule


ENGINES: tuple[EngineKind, ...] = (
    EngineKind(
        kind="llamacpp",
        display="llama.cpp",
        collector="exporter.collectors.llamacpp.collector:LlamaCppCollector",
        simulator="simulator.llamacpp:LlamaCppSim",
        sources=(SourceColumn("exporter.collectors.llamacpp.sources:SOURCES"),),
        process=ProcessRule("llama-server"),
    ),
    EngineKind(
        kind="sglang",
        display="SGLang",
        collector="exporter.collectors.sglang.collector:SGLangCollector",
        simulator="simulator.sglang:SglangSim",
        sources=(
            SourceColumn("exporter.collectors.sglang.sources:SOURCES"),
            SourceColumn("exporter.collectors.sglang.sources:SOURCES_0_5_11", release="0.5.11"),
        ),
        # SGLang's GPU workers are spawned children whose command line may not carry the
        # port; with one SGLang engine the name alone is unambiguous.
        process=ProcessRule("sglang", port="when_several"),
    ),
)

KINDS: tuple[str, ...] = tuple(engine.kind for engine in ENGINES)
BY_KIND: dict[str, EngineKind] = {engine.kind: engine for engine in ENGINES}


def engine_kind(kind: str) -> EngineKind:
    """The registered kind called `kind` (KeyError naming the known ones)."""
    try:
        return BY_KIND[kind]
    except KeyError:
        raise KeyError(f"unknown engine kind {kind!r} (known: {', '.join(KINDS)})") from None


def load(ref: str) -> Any:
    """The attribute a `module:attribute` string names, importing the module."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)
