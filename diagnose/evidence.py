"""A step's evidence for the verdict: the decision core's `Signals` at the step's end.

The signals come from the exporter's samples of the step's window through the recording
rules' arithmetic (`core.rule_values_at`, via the monitor), completed with what only the
client saw (KV errors, the MoE batch). The verdict itself is always `core.evaluate`'s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import core
from diagnose.decision import Row, bytes_per_step, row_batch, row_roofline
from diagnose.engine_run import EngineRun

WAITING = "llmb_engine_requests_waiting"
KV_USAGE = "llmb_engine_kv_cache_usage_ratio"


def step_evidence(run: EngineRun, row: Row, t0: float, t1: float) -> None:
    """The step's signals and verdict (appended to `run.step_verdicts`)."""
    mon = run.monitor
    values = mon.rule_values(t1, since=t0)
    if values is not None:
        sig = complete(run, values.signals, row, values)
        kv = mon.window(KV_USAGE, t0, t1)
        waiting = mon.window(WAITING, t0, t1)
        row.kv_usage_max = max(kv) if kv else None
        row.waiting_avg = sum(waiting) / len(waiting) if waiting else None
    else:
        sig = own_signals(run, row)
    verdict = core.evaluate(sig)
    run.step_verdicts.append((row.step, verdict.name, sig))


def _moe_batch_efficiency(
    run: EngineRun, sig: core.Signals, row: Row, values: core.RuleValues | None
) -> core.Signals:
    """A mixture-of-experts step's decode efficiency at the batch the step kept running."""
    model = run.result.structure()
    batch = float(row_batch(run.result, row))
    moe = model is not None and model.experts_known and bool(model.routed_expert_bytes)
    if not (
        values is not None
        and moe
        and values.decode_batch is not None
        and values.decode_batch < batch
        and values.decode_tokens_per_second is not None
        and values.bandwidth_bytes_per_second is not None
    ):
        return sig
    # A short step's edges dilute the running average the rules take as the batch;
    # an MoE step's bytes grow with it, so use the sequences the step kept running.
    kv_tokens = None
    if row.prompt_tokens is not None:
        kv_tokens = batch * (row.prompt_tokens + row.max_tokens / 2)
    per_step, _ = bytes_per_step(run.result, kv_tokens, batch)
    roof = core.roofline_tokens_per_second(
        values.bandwidth_bytes_per_second, per_step, run.result.spec_accept_length
    )
    run.note(
        f"{row.step}: the mixture-of-experts roofline uses the {batch:.0f} sequences the "
        f"step kept running (the rules' running average over the step gave "
        f"{values.decode_batch:.0f})"
    )
    return replace(
        sig, decode_efficiency=core.decode_efficiency(values.decode_tokens_per_second, roof)
    )


def complete(
    run: EngineRun, sig: core.Signals, row: Row, values: core.RuleValues | None = None
) -> core.Signals:
    """Add what the client measured and the rules cannot see, and say so."""
    sig = _moe_batch_efficiency(run, sig, row, values)
    client_kv = row.kv_exhausted + row.truncated
    if client_kv and not (sig.kv_pressure_increase or 0) > 0:
        sig = replace(sig, kv_pressure_increase=float(client_kv))
        run.note(
            f"{row.step}: {client_kv} requests ran out of KV/context on the client side "
            "that the exporter did not count (no engine log?); counted as KV pressure"
        )
    if sig.decode_efficiency is None and run.opts.bandwidth_bytes_per_s:
        own = own_signals(run, row, count_events=False).decode_efficiency
        if own is not None:
            sig = replace(sig, decode_efficiency=own)
            run.note(
                "decode efficiency uses --bandwidth-gbs: no GPU bandwidth series for the "
                "rules (the Prometheus verdict cannot see it)"
            )
    return sig


def own_residency_signals(run: EngineRun) -> dict[str, Any]:
    """The residency part of `Signals` from diagnose's own readings (no exporter sample)."""
    res = run.result
    has_gpu = run.monitor.source == "gpu"
    out: dict[str, Any] = {
        "host_has_gpu": has_gpu,
        "experts_host_layers": res.experts_host_layers,
    }
    if res.layers_total:
        out["layers_ratio"] = (res.layers_offloaded or 0.0) / res.layers_total
    if res.weights_bytes and res.gpu_buffer_bytes is not None and has_gpu:
        out["weights_buffers_ratio"] = res.gpu_buffer_bytes / res.weights_bytes
    if res.weights_bytes and res.process_gpu_bytes is not None and has_gpu:
        out["weights_memory_ratio"] = res.process_gpu_bytes / res.weights_bytes
    return out


def own_signals(run: EngineRun, row: Row, count_events: bool = True) -> core.Signals:
    """`Signals` from diagnose's own measurements of one step (no exporter sample)."""
    res = run.result
    slots = res.slots
    if slots and row.concurrency > slots:
        # A closed loop keeps `concurrency` in flight; beyond the slots they wait.
        row.waiting_avg = float(row.concurrency - slots)
    elif slots:
        row.waiting_avg = 0.0
    if count_events:
        run.kv_events_total += row.kv_exhausted + max(row.truncated, row.kv_events)
    eff = row_roofline(res, row).efficiency if row.per_seq_tok_s else None
    return core.Signals(
        **own_residency_signals(run),
        waiting_avg=row.waiting_avg,
        kv_pressure_increase=float(run.kv_events_total),
        running=float(row.concurrency),
        waiting=row.waiting_avg,
        # A closed loop runs min(concurrency, slots) at once.
        running_slots_ratio=min(row.concurrency, slots) / slots if slots else None,
        generation_tokens_per_second=row.aggregate_tok_s,
        decode_efficiency=eff,
    )
