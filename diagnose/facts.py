"""What is known about the engine before any load: its endpoints, its GGUF, the exporter.

`collect_facts` returns what is known of the model, precision, sizes, slots and contexts from
the engine's one probe (`diagnose.probe`: the one `--url` resolution took, else its own) and
the GGUF it serves (the exporter's one GGUF reader), as a `CollectedFacts` value that
`with_collected` turns into the engine's `Facts`; `gpu_facts` adds the exporter's series
(card, bandwidth, memory, layers, buffers), `structure_facts` the model-structure series.
Each returns a new `Facts`: the run keeps the newest and builds its result from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from config.kinds import engine_kind
from config.settings import EngineConfig
from core import series as llmb
from core.prefill import PEAK_DTYPE
from diagnose.decision.model import Facts, Prefill
from diagnose.engine_run import EngineRun
from diagnose.monitor import RESULT_STRUCTURE_SERIES
from diagnose.options import Options
from diagnose.probe import EngineFacts, engine_facts
from loadgen.client import probe_client
from loadgen.exporter_series import Series, first, labelled
from loadgen.resolve import probe_target
from loadgen.target import Target
from model.flops import prefill_flops
from model.geometry import ModelGeometry, geometry_from_gguf
from model.host_memory import HostBandwidth

# A fact reader that keeps its argument's type (a run's `Facts`, or a result's).
F = TypeVar("F", bound=Facts)

# Facts field -> the per-engine series read with the GPU facts.
ENGINE_SERIES = {
    **llmb.field_series(
        "process_gpu_bytes",
        "weights_bytes",
        "parameters",
        "layers_offloaded",
        "layers_total",
        "kv_bytes_per_token",
    ),
    **RESULT_STRUCTURE_SERIES,
}


def structure_from_geometry(known: Facts, geo: Any) -> Facts:
    """The model-structure fields of a GGUF/HF geometry (`ModelGeometry`) where `known` has
    none."""
    found: dict[str, Any] = {}
    for attr, name in (
        ("always_read_bytes", "always_read_bytes"),
        ("routed_expert_bytes", "routed_expert_bytes"),
        ("experts", "expert_count"),
        ("experts_used", "expert_used_count"),
        ("token_embedding_row_bytes", "token_embedding_row_bytes"),
    ):
        value = getattr(geo, name, None)
        if value is not None and getattr(known, attr) is None:
            found[attr] = float(value)
    return replace(known, **found)


@dataclass(frozen=True)
class CollectedFacts:
    """What is known before any load, for the procedure to take in (`with_collected`): what the
    engine's endpoints said, its model file and where that came from, the file's geometry
    (None: no GGUF readable here)."""

    endpoints: EngineFacts
    model_path: Path | None
    model_evidence: str
    geometry: ModelGeometry | None = None


async def collect_facts(
    engine: EngineConfig, opts: Options, target: Target, model_path: Path | None
) -> CollectedFacts:
    """The engine's endpoints (its one probe, else one now at `target`), its model file
    (`model_path`, else the one its endpoint names) and that file's GGUF, when readable here."""
    probe = opts.probes.get(engine.name)
    if probe is None:  # launched, or from the config: not probed yet
        async with probe_client(target.url, target.api_key, opts.connect_timeout) as client:
            probe = await probe_target(client, engine.kind)
    facts = engine_facts(probe)
    if model_path is None and facts.model_path:
        model_path = Path(facts.model_path)
    evidence = model_evidence(engine, opts.path_origins, facts.model_path)
    geo = None
    # One GGUF reader for the whole project: the exporter's.
    # diagnose --url: the GGUF that /props names, when it is readable here.
    if model_path is not None and model_path.suffix == ".gguf":
        with contextlib.suppress(OSError, ValueError):
            geo = await asyncio.to_thread(geometry_from_gguf, model_path)
    return CollectedFacts(facts, model_path, evidence, geo)


def with_collected(known: Facts, facts: CollectedFacts) -> Facts:
    """`known` with the collected facts: the endpoints' first, the GGUF's where they said
    nothing."""
    said = {k: v for k, v in facts.endpoints.known().items() if k != "model_path"}
    known = replace(known, **said)
    geo = facts.geometry
    if geo is None:
        return known
    try:
        params = known.parameters or (float(geo.n_params) if geo.n_params else None)
        weights = known.weights_bytes
        if weights is None and geo.weight_bytes:
            weights = float(geo.weight_bytes)
        known = replace(
            known,
            parameters=params,
            trained_context=known.trained_context or geo.n_ctx_train,
            kv_bytes_per_token=geo.kv_bytes_per_token(),
            layers_total=known.layers_total or float(geo.n_layer + 1),
            weights_bytes=weights,
        )
        known = structure_from_geometry(known, geo)
        known = prefill_from_geometry(known, geo)
    except (OSError, ValueError):  # a geometry this reader cannot size: what was taken stays
        pass
    return known


async def gpu_facts(run: EngineRun) -> Facts:
    """The run's facts with the card, bandwidth (model/gpu_specs, via the NVML collector),
    memory, layers and buffers of a fresh sample."""
    known, mon = run.facts, run.monitor
    await mon.sample()
    known = replace(known, memory_source=mon.source)
    series = mon.latest()
    if series:
        bandwidth = first(series, llmb.GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND)
        # The engine's GPUs as the rules see them (tensor parallel: their bandwidths add).
        values = mon.rule_values(time.time())
        if values is not None and values.bandwidth_bytes_per_second:
            bandwidth = values.bandwidth_bytes_per_second
        known = replace(
            _engine_series(known, series, mon.exporter_engine),
            gpu_total_bytes=first(series, llmb.GPU_MEMORY_TOTAL_BYTES),
            bandwidth_bytes_per_s=bandwidth,
            bandwidth_source="exporter" if bandwidth else None,
            gpu_free_bytes=first(series, llmb.GPU_MEMORY_FREE_BYTES),
        )
    known = host_bandwidth_facts(known, run.opts.host_bandwidth, series)
    if run.opts.bandwidth_bytes_per_s:
        known = replace(
            known,
            bandwidth_bytes_per_s=run.opts.bandwidth_bytes_per_s,
            bandwidth_source="--bandwidth-gbs",
        )
    return replace(known, prefill=_peak_facts(run, known.prefill, series))


def host_bandwidth_facts(known: F, given: HostBandwidth | None, series: Series | None) -> F:
    """Host memory bandwidth for the expert-offload bound: the exporter's series (its own
    measurement, or what it was given), unless this run was given one (flag, config)."""
    value, source = known.host_bandwidth_bytes_per_s, known.host_bandwidth_source
    for labels, seen in labelled(series or {}, llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND):
        value, source = seen, labels.get("source") or "exporter"
    if given is not None and (value is None or given.source != "measured"):
        value, source = given.bytes_per_second, given.source
    return replace(known, host_bandwidth_bytes_per_s=value, host_bandwidth_source=source)


def prefill_from_geometry(known: Facts, geo: Any) -> Facts:
    """The model's FLOPs per prompt token (model/flops.py) from a GGUF/HF geometry."""
    fl = prefill_flops(geo)
    if fl is None:
        return known
    return replace(known, prefill=replace(known.prefill, **fl._asdict()))


def _peak_facts(run: EngineRun, prefill: Prefill, series: Series | None) -> Prefill:
    """The card's peak compute (--peak-tflops, else the exporter's table value) and, where
    no GGUF was read, the model's FLOPs per token from the exporter's series."""
    engine = run.monitor.exporter_engine
    peak, source = run.opts.peak_flops, "--peak-tflops"
    if peak is None and series:
        peaks = [
            v for lab, v in labelled(series, llmb.GPU_PEAK_FLOPS) if lab.get("dtype") == PEAK_DTYPE
        ]
        peak, source = (
            (max(peaks), f"{llmb.GPU_PEAK_FLOPS}{{dtype={PEAK_DTYPE}}}") if peaks else (None, "")
        )
    if peak is not None:
        prefill = replace(prefill, peak_flops=peak, peak_source=source)
    if prefill.matmul_flops is None and series:
        matmul = first(series, llmb.MODEL_PREFILL_FLOPS_PER_TOKEN, engine=engine)
        parts = {
            lab.get("layers", ""): v
            for lab, v in labelled(series, llmb.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION)
            if lab.get("engine") == engine
        }
        if matmul:
            prefill = replace(
                prefill,
                matmul_flops=matmul,
                attention_flops_full=parts.get("full"),
                attention_flops_swa=parts.get("sliding"),
                sliding_window=first(series, llmb.MODEL_SLIDING_WINDOW_TOKENS, engine=engine),
            )
    return prefill


def _engine_series(known: Facts, series: Series, engine: str) -> Facts:
    """The engine's own series: sizes, layers, GPU weight buffers, version, the card's name."""
    found: dict[str, Any] = {}
    for attr, name in ENGINE_SERIES.items():
        value = first(series, name, engine=engine)
        if value is not None:
            found[attr] = value
    buffers = [
        (lab.get("device", ""), v)
        for lab, v in labelled(series, llmb.ENGINE_MODEL_BUFFER_BYTES)
        if lab.get("engine") == engine
    ]
    if buffers:
        # Only host (CPU) buffers reported is an explicit 0 on the GPU, not an unknown.
        found["gpu_buffer_bytes"] = sum(
            v for dev, v in buffers if not dev.lower().startswith("cpu")
        )
    for info, _ in labelled(series, llmb.ENGINE_INFO):
        if info.get("engine") == engine:
            found["quantization"] = info.get("quantization") or known.quantization
            found["engine_version"] = info.get("version") or known.engine_version
    for info, _ in labelled(series, llmb.GPU_INFO):
        if info.get("name"):
            found["gpu_name"] = info["name"]
            found["gpu_driver"] = info.get("driver") or known.gpu_driver
    return replace(known, **found)


def structure_facts(run: EngineRun) -> Facts:
    """The run's facts with the model-structure series of the newest scrape (exporter or
    embedded collectors)."""
    found: dict[str, Any] = {}
    for attr, name in RESULT_STRUCTURE_SERIES.items():
        value = run.monitor.engine_value(name)
        if value is not None:
            found[attr] = value
    return replace(run.facts, **found)


def _readable_model(kind: str, path: str) -> bool:
    """Whether the path an engine names is its model on this machine (its row's
    `model_layout`: one file, or a folder with config.json)."""
    try:
        p = Path(path)
        if engine_kind(kind).model_layout == "file":
            return p.is_file()
        return (p / "config.json").is_file()
    except (OSError, ValueError):  # a name this filesystem cannot take
        return False


def model_evidence(engine: EngineConfig, origins: dict[str, str], reported: str | None) -> str:
    """Where the model file came from: a flag (`origins`: what named each path), the config,
    the engine's endpoint, or not seen."""
    if engine.model_path is not None:
        origin = origins.get(f"{engine.name}.model", "the config's model_path")
        return f"{origin} {engine.model_path}"
    where = engine_kind(engine.kind).model_named_by
    if reported and _readable_model(engine.kind, reported):
        return f"the engine's {where} {reported}"
    if reported:
        return (
            f"not seen: the engine's {where} is {reported}, not readable on this machine "
            "(pass --model-path)"
        )
    return f"not seen: no {where} (pass --model-path)"


def log_evidence(run: EngineRun) -> str:
    """Where the engine's log came from and what its load lines said, or what was not seen."""
    engine = run.engine
    if run.opts.exporter_url:
        return f"read by the exporter at {run.opts.exporter_url} (its config's log_file)"
    if engine.launch is not None and "log" in run.template():
        source = "the log the launch template writes ({log})"
    elif engine.log_file is not None:
        origin = run.opts.path_origins.get(f"{engine.name}.log", "the config's log_file")
        source = f"{origin} {engine.log_file}"
    else:
        return (
            f"not seen: no --log-file ({engine.kind} does not name its log over HTTP), so "
            f"{engine_kind(engine.kind).log_only} are not known"
        )
    if not engine_kind(engine.kind).log_load_lines:
        return source
    return f"{source}: {load_lines(run)}"


def load_lines(run: EngineRun) -> str:
    """What llama-server's load lines said (the exporter's series of its log), or their absence."""
    mon = run.monitor
    offloaded, total = (
        mon.engine_value(llmb.ENGINE_GPU_LAYERS_OFFLOADED),
        mon.engine_value(llmb.ENGINE_GPU_LAYERS_TOTAL),
    )
    buffers = sorted(
        (lab.get("device", "?"), v)
        for lab, v in labelled(mon.latest(), llmb.ENGINE_MODEL_BUFFER_BYTES)
        if lab.get("engine") == mon.exporter_engine
    )
    if not buffers and total is None:
        return (
            "no load lines in it (llama-server writes them only at -lv 4, when it starts), "
            "so layers and weight buffers on the GPU are not known"
        )
    parts = []
    if total is not None:
        parts.append(f"layers on the GPU {offloaded or 0:.0f}/{total:.0f}")
    else:
        # A build without a GPU backend loads nothing onto a GPU and never prints the line.
        parts.append("no `offloaded N/M layers` line (a build without a GPU backend has none)")
    if buffers:
        parts.append(
            "weight buffers " + ", ".join(f"{dev} {v / 2**30:.2f} GiB" for dev, v in buffers)
        )
    return "; ".join(parts)


def record_evidence(run: EngineRun) -> None:
    """The log's line of the answer; what it could not see goes to the missing list too."""
    text = log_evidence(run)
    run.evidence["log"] = text
    if text.startswith("not seen") or "no load lines" in text:
        run.missing.append(f"log: {text}")
