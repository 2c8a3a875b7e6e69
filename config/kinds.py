"""The engine kinds: the one table a new inference server is registered in.

Each row holds what the project knows about one `kind` (the config's `engines[].kind` and the
`kind` label) as plain facts: how docs name it, how its GPU processes are recognised, which
endpoint tells diagnose what it serves, where residency figures come from, what a request
sends to defeat its prompt cache, how a prompt's tokens are counted. Everything that
branches on an engine kind reads these fields: `config.settings` (the allowed kinds),
`exporter.attribution` (`process`), `diagnose.probe` (`info`), `diagnose.steps.residency` and
the report's tables (`residency`), `diagnose.load` (`uncached_body`, `kv_events_in_log`),
`loadgen.scheduler.calibration` (`tokenize_path`). docs/engines.md is the recipe.

Code lives on the floors above, each in one table keyed by these kinds: the collector class
in `exporter/app.py` (`COLLECTORS`), the source columns in `exporter/collectors/sources.py`,
the simulator class in `simulator/__main__.py`. tests/unit/test_engines.py checks that every
table has every kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from config.endpoints import llamacpp_props_facts, sglang_server_info_facts


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
class InfoEndpoint:
    """The engine's own description of itself, which `diagnose` probes.

    `paths` are tried in order: the first that answers a JSON object tells a bare `--url`
    that the server is of this kind, and `read` turns its body into `EngineFacts` fields.
    """

    paths: tuple[str, ...]
    read: Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ResidencySources:
    """Where the residency step's figures come from on this kind (said in its answers)."""

    buffers: str  # the GPU weight buffers the engine reports
    weights: str  # the weight size (named when it is missing)
    layers: str | None  # the offloaded-layer count; None: the engine does not report it
    layers_fix: str = ""  # how to make `layers` readable when it was not read


@dataclass(frozen=True)
class EngineKind:
    """One inference server the project can read, measure and simulate."""

    kind: str  # config `kind:` and the `kind` label
    display: str  # how docs and messages name it
    process: ProcessRule
    info: InfoEndpoint
    residency: ResidencySources
    # Request fields that stop the engine reusing a cached prompt or slot (diagnose's load).
    uncached_body: dict[str, Any] = field(default_factory=dict)
    # Its llmb_engine_kv_pressure_events_total counts KV events of its log (diagnose's KV step).
    kv_events_in_log: bool = False
    # An endpoint whose count (with BOS) equals /v1/completions' prompt_tokens, at no prefill
    # (body `{"content", "add_special"}`); None: a 1-token request counts the prompt.
    tokenize_path: str | None = None


ENGINES: tuple[EngineKind, ...] = (
    EngineKind(
        kind="llamacpp",
        display="llama.cpp",
        process=ProcessRule("llama-server"),
        info=InfoEndpoint(("/props",), llamacpp_props_facts),
        residency=ResidencySources(
            buffers="GPU weight buffers the engine reports (llama.cpp log `model buffer size`)",
            weights="/v1/models meta.size, GGUF or log",
            layers="the llama.cpp log",
            layers_fix="pass --log-file or set engines[].log_file in the config (llama-server "
            "-lv 4 --log-file ...)",
        ),
        # Unique prompt prefixes already defeat the cache; this also stops slot reuse.
        uncached_body={"cache_prompt": False},
        kv_events_in_log=True,
        tokenize_path="/tokenize",
    ),
    EngineKind(
        kind="sglang",
        display="SGLang",
        # SGLang's GPU workers are spawned children whose command line may not carry the
        # port; with one SGLang engine the name alone is unambiguous.
        process=ProcessRule("sglang", port="when_several"),
        info=InfoEndpoint(("/server_info", "/get_server_info"), sglang_server_info_facts),
        residency=ResidencySources(
            buffers=(
                "GPU weight buffers SGLang reports (`weight_memory_usage_gb`, `/server_info` "
                "memory_usage or its log `Load weight end`)"
            ),
            weights="weight series, /server_info memory_usage, log or safetensors",
            layers=None,
        ),
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
