"""The engine kinds: an inference server is one `register(EngineKind(...))` call here.

Each row holds what the project knows about one `kind` (the config's `engines[].kind` and the
`kind` label) as plain facts: how docs name it, how its GPU processes are recognised, which
endpoint tells diagnose what it serves and names its model, whether its model is a file or a
folder, what only its log tells, where residency figures come from, what a request sends to
defeat its prompt cache, how a prompt's tokens are counted, whether it preallocates its KV
pool. Everything that branches on an engine kind reads these fields, through `engine_kind`,
`engines()` and `kinds()` (read at call time, so a kind registered later counts too).

Code lives on the floors above, and the row names it as entry points ("module:attribute",
resolved with `pkgutil.resolve_name` by the floor that owns it; this floor never imports
them): its collector class and its source columns (the series map of docs/metrics.md) in its
package `exporter/collectors/<kind>/`, its simulator class in `simulator/<kind>/`.
docs/engines.md is the recipe; tests/unit/test_engines.py adds a fake kind through
`register` and scrapes it.
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


# A plain OpenAI-compatible server (`llmb-loadgen run --kind`, a `--url` that answers no
# registered info endpoint): no row, no collector, no simulator; only load is sent to it.
GENERIC = "openai"


@dataclass(frozen=True)
class EngineKind:
    """One inference server the project can read, measure and simulate."""

    kind: str  # config `kind:` and the `kind` label
    display: str  # how docs and messages name it
    process: ProcessRule
    info: InfoEndpoint
    residency: ResidencySources
    # Entry points on the floors above ("module:attribute"): the `EngineCollector` subclass,
    # its `SourceColumn`s (docs/metrics.md, the main column first), the `SimBase` subclass.
    collector: str
    sources: str
    simulator: str
    # What only its log tells (diagnose's answer when no log is given).
    log_only: str
    # The model the engine serves: one file (GGUF) or a folder with config.json (HF).
    model_layout: Literal["file", "folder"]
    # Its log's load lines (layers and weight buffers on the GPU) are quoted by diagnose.
    log_load_lines: bool = False
    # It preallocates its KV pool from a memory fraction, so its process memory beyond the
    # pool is the weights' residency figure (`weights_gpu_memory_beyond_kv`).
    kv_pool_preallocated: bool = False
    # Request fields that stop the engine reusing a cached prompt or slot (diagnose's load).
    uncached_body: dict[str, Any] = field(default_factory=dict)
    # Its llmb_engine_kv_pressure_events_total counts KV events of its log (diagnose's KV step).
    kv_events_in_log: bool = False
    # An endpoint whose count (with BOS) equals /v1/completions' prompt_tokens, at no prefill
    # (body `{"content", "add_special"}`); None: a 1-token request counts the prompt.
    tokenize_path: str | None = None

    @property
    def model_named_by(self) -> str:
        """The endpoint field that names the model path (said where it is not readable)."""
        return f"{self.info.paths[0]} model_path"


# The registry: kind -> row, in registration order (docs columns, detection order).
BY_KIND: dict[str, EngineKind] = {}


def register(engine: EngineKind) -> EngineKind:
    """Add an engine kind (once per kind; the generic `openai` is not one)."""
    if engine.kind in BY_KIND or engine.kind == GENERIC:
        raise ValueError(f"engine kind {engine.kind!r} is already registered")
    BY_KIND[engine.kind] = engine
    return engine


def engines() -> tuple[EngineKind, ...]:
    """The registered rows, in registration order."""
    return tuple(BY_KIND.values())


def kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(BY_KIND)


def engine_kind(kind: str) -> EngineKind:
    """The registered kind called `kind` (KeyError naming the known ones)."""
    try:
        return BY_KIND[kind]
    except KeyError:
        raise KeyError(f"unknown engine kind {kind!r} (known: {', '.join(kinds())})") from None


def target_kinds() -> tuple[str, ...]:
    """What `--kind` and `loadgen.kind` accept: the registered kinds and the generic one."""
    return (*kinds(), GENERIC)


def kind_choice(value: object, generic: bool = False) -> str:
    """`value` as a registered kind (or, with `generic`, `openai`); ValueError naming them.

    Checked at call time (pydantic's BeforeValidator), so a kind registered later is valid.
    """
    valid = target_kinds() if generic else kinds()
    if isinstance(value, str) and value in valid:
        return value
    quoted = [f"'{k}'" for k in valid]
    listed = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
    raise ValueError(f"Input should be {listed}")  # pydantic's own words for a Literal


def preallocating_selector() -> str:
    """The PromQL label matcher of the kinds that preallocate their KV pool."""
    names = [e.kind for e in engines() if e.kv_pool_preallocated]
    return f'kind="{names[0]}"' if len(names) == 1 else f'kind=~"{"|".join(names)}"'


register(
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
        collector="exporter.collectors.llamacpp.collector:LlamaCppCollector",
        sources="exporter.collectors.llamacpp.sources:COLUMNS",
        simulator="simulator.llamacpp.server:LlamaCppSim",
        log_only="layers and weight buffers on the GPU, KV cache types and bytes, expert "
        "offload, the speculative acceptance and KV-pressure events",
        model_layout="file",
        log_load_lines=True,
    )
)
register(
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
        collector="exporter.collectors.sglang.collector:SGLangCollector",
        sources="exporter.collectors.sglang.sources:COLUMNS",
        simulator="simulator.sglang.server:SglangSim",
        log_only="the load lines (weight memory, KV pool) when /server_info lacks them",
        model_layout="folder",
        kv_pool_preallocated=True,
    )
)
