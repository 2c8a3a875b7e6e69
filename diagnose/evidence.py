"""A step's evidence for the verdict: the decision core's `Signals` at the step's end.

The signals come from the exporter's samples of the step's window through the recording
rules' arithmetic (`core.rules.rule_values_at`, via the monitor), completed with what only the
client saw (KV errors, the MoE batch); where the exporter gave no sample (or no GPU
bandwidth), from the samples it would have given (`diagnose.samples`), through the same
rules. The verdict itself is always `core.conditions.evaluate`'s.
"""

from __future__ import annotations

from dataclasses import replace

from core.conditions import evaluate
from core.roofline import decode_efficiency, roofline_tokens_per_second
from core.rules import RuleValues
from core.signals import Signals
from diagnose.decision.model import Row
from diagnose.decision.roofline import bytes_per_step, row_batch
from diagnose.engine_run import EngineRun
from diagnose.samples import step_values

WAITING = "llmb_engine_requests_waiting"
KV_USAGE = "llmb_engine_kv_cache_usage_ratio"


def step_evidence(run: EngineRun, row: Row, t0: float, t1: float) -> None:
    """The step's signals and verdict (appended to `run.step_verdicts`)."""
    mon = run.monitor
    values = mon.rule_values(t1, since=t0)
    if values is not None:
        sig = complete(run, values.signals, row, t1, values)
        kv = mon.window(KV_USAGE, t0, t1)
        waiting = mon.window(WAITING, t0, t1)
        row.kv_usage_max = max(kv) if kv else None
        row.waiting_avg = sum(waiting) / len(waiting) if waiting else None
    else:
        # No exporter sample of the step: the samples it would have given, through the rules.
        sig = step_values(run, row, t1).signals
        row.waiting_avg = sig.waiting_avg
    verdict = evaluate(sig)
    run.step_verdicts.append((row.step, verdict.name, sig))


def _moe_batch_efficiency(
    run: EngineRun, sig: Signals, row: Row, values: RuleValues | None
) -> Signals:
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
    roof = roofline_tokens_per_second(
        values.bandwidth_bytes_per_second, per_step, run.result.spec_accept_length
    )
    run.note(
        f"{row.step}: the mixture-of-experts roofline uses the {batch:.0f} sequences the step kept "
        f"running (the rules' running average over the step gave {values.decode_batch:.0f})"
    )
    return replace(sig, decode_efficiency=decode_efficiency(values.decode_tokens_per_second, roof))


def complete(
    run: EngineRun, sig: Signals, row: Row, t1: float, values: RuleValues | None = None
) -> Signals:
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
        own = step_values(run, row, t1).signals.decode_efficiency
        if own is not None:
            sig = replace(sig, decode_efficiency=own)
            run.note(
                "decode efficiency uses --bandwidth-gbs: no GPU bandwidth series for the "
                "rules (the Prometheus verdict cannot see it)"
            )
    return sig
