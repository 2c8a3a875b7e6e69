"""What is known about the engine before any load: its endpoints, its GGUF, the exporter.

`collect_facts` returns what is known of the model, precision, sizes, slots and contexts from
the engine's one probe (`diagnose.probe`: the one `--url` resolution took, else its own) and
the GGUF it serves (the exporter's one GGUF reader), as a `CollectedFacts` value that the
procedure applies to the `EngineResult` (`apply_facts`); `gpu_facts` reads the exporter's
series (card, bandwidth, memory, layers, buffers), `structure_facts` the model-structure
series.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from config.kinds import engine_kind
from config.settings import EngineConfig
from core import series as llmb
from core.prefill import PEAK_DTYPE
from diagnose.decision.model import EngineResult
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

# EngineResult field -> the per-engine series read with the GPU facts.
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


def structure_from_geometry(res: EngineResult, geo: Any) -> None:
    """The model-structure fields of a GGUF/HF geometry (`ModelGeometry`)."""
    for attr, name in (
        ("always_read_bytes", "always_read_bytes"),
        ("routed_expert_bytes", "routed_expert_bytes"),
        ("experts", "expert_count"),
        ("experts_used", "expert_used_count"),
        ("token_embedding_row_bytes", "token_embedding_row_bytes"),
    ):
        value = getattr(geo, name, None)
        if value is not None and getattr(res, attr) is None:
            setattr(res, attr, float(value))


@dataclass(frozen=True)
class CollectedFacts:
    """What is known before any load, for the procedure to apply (`apply_facts`): what the
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


def apply_facts(res: EngineResult, facts: CollectedFacts) -> None:
    """The facts into the result: the endpoints' first, the GGUF's where they said nothing."""
    for key, value in facts.endpoints.known().items():
        if key != "model_path":
            setattr(res, key, value)
    res.evidence["model"] = facts.model_evidence
    geo = facts.geometry
    if geo is None:
        return
    with contextlib.suppress(OSError, ValueError):
        res.parameters = res.parameters or (float(geo.n_params) if geo.n_params else None)
        res.trained_context = res.trained_context or geo.n_ctx_train
        res.kv_bytes_per_token = geo.kv_bytes_per_token()
        res.layers_total = res.layers_total or float(geo.n_layer + 1)
        if res.weights_bytes is None and geo.weight_bytes:
            res.weights_bytes = float(geo.weight_bytes)
        structure_from_geometry(res, geo)
        prefill_from_geometry(res, geo)


async def gpu_facts(run: EngineRun) -> None:
    """Card, bandwidth (model/gpu_specs, via the NVML collector), memory, layers, buffers."""
    res, mon = run.result, run.monitor
    await mon.sample()
    res.memory_source = mon.source
    series = mon.latest()
    if series:
        res.gpu_total_bytes = first(series, llmb.GPU_MEMORY_TOTAL_BYTES)
        res.bandwidth_bytes_per_s = first(series, llmb.GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND)
        # The engine's GPUs as the rules see them (tensor parallel: their bandwidths add).
        values = mon.rule_values(time.time())
        if values is not None and values.bandwidth_bytes_per_second:
            res.bandwidth_bytes_per_s = values.bandwidth_bytes_per_second
        res.bandwidth_source = "exporter" if res.bandwidth_bytes_per_s else None
        _engine_series(res, series, mon.exporter_engine)
        res.gpu_free_bytes = first(series, llmb.GPU_MEMORY_FREE_BYTES)
    host_bandwidth_facts(res, run.opts.host_bandwidth, series)
    if run.opts.bandwidth_bytes_per_s:
        res.bandwidth_bytes_per_s = run.opts.bandwidth_bytes_per_s
        res.bandwidth_source = "--bandwidth-gbs"
    _peak_facts(run, series)


def host_bandwidth_facts(
    res: EngineResult, given: HostBandwidth | None, series: Series | None
) -> None:
    """Host memory bandwidth for the expert-offload bound: the exporter's series (its own
    measurement, or what it was given), unless this run was given one (flag, config)."""
    for labels, value in labelled(series or {}, llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND):
        res.host_bandwidth_bytes_per_s = value
        res.host_bandwidth_source = labels.get("source") or "exporter"
    if given is not None and (res.host_bandwidth_bytes_per_s is None or given.source != "measured"):
        res.host_bandwidth_bytes_per_s = given.bytes_per_second
        res.host_bandwidth_source = given.source


def prefill_from_geometry(res: EngineResult, geo: Any) -> None:
    """The model's FLOPs per prompt token (model/flops.py) from a GGUF/HF geometry."""
    fl = prefill_flops(geo)
    if fl is not None:
        res.prefill = replace(res.prefill, **fl._asdict())


def _peak_facts(run: EngineRun, series: Series | None) -> None:
    """The card's peak compute (--peak-tflops, else the exporter's table value) and, where
    no GGUF was read, the model's FLOPs per token from the exporter's series."""
    res = run.result
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
        res.prefill = replace(res.prefill, peak_flops=peak, peak_source=source)
    if res.prefill.matmul_flops is None and series:
        matmul = first(series, llmb.MODEL_PREFILL_FLOPS_PER_TOKEN, engine=engine)
        parts = {
            lab.get("layers", ""): v
            for lab, v in labelled(series, llmb.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION)
            if lab.get("engine") == engine
        }
        if matmul:
            res.prefill = replace(
                res.prefill,
                matmul_flops=matmul,
                attention_flops_full=parts.get("full"),
                attention_flops_swa=parts.get("sliding"),
                sliding_window=first(series, llmb.MODEL_SLIDING_WINDOW_TOKENS, engine=engine),
            )


def _engine_series(res: EngineResult, series: Series, engine: str) -> None:
    """The engine's own series: sizes, layers, GPU weight buffers, version, the card's name."""
    for attr, name in ENGINE_SERIES.items():
        value = first(series, name, engine=engine)
        if value is not None:
            setattr(res, attr, value)
    buffers = [
        (lab.get("device", ""), v)
        for lab, v in labelled(series, llmb.ENGINE_MODEL_BUFFER_BYTES)
        if lab.get("engine") == engine
    ]
    if buffers:
        # Only host (CPU) buffers reported is an explicit 0 on the GPU, not an unknown.
        res.gpu_buffer_bytes = sum(v for dev, v in buffers if not dev.lower().startswith("cpu"))
    for info, _ in labelled(series, llmb.ENGINE_INFO):
        if info.get("engine") == engine:
            res.quantization = info.get("quantization") or res.quantization
            res.engine_version = info.get("version") or res.engine_version
    for info, _ in labelled(series, llmb.GPU_INFO):
        if info.get("name"):
            res.gpu_name = info["name"]
            res.gpu_driver = info.get("driver") or res.gpu_driver


def structure_facts(run: EngineRun) -> None:
    """The model-structure series of the newest scrape (exporter or embedded collectors)."""
    for attr, name in RESULT_STRUCTURE_SERIES.items():
        value = run.monitor.engine_value(name)
        if value is not None:
            setattr(run.result, attr, value)


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
    run.result.evidence["log"] = text
    if text.startswith("not seen") or "no load lines" in text:
        run.result.missing.append(f"log: {text}")
