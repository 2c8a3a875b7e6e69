"""The decode roofline: bandwidth, bytes per step, tokens per second, and the physics gate.

Python equivalents (core/roofline.py): `decode_bytes_per_step`, `roofline_tokens_per_second`,
`tp_bandwidth`, `experts_host_bound` and `roofline_facts`; the parity test ties them.
"""

from __future__ import annotations

from typing import Any

from core import series as llmb
from core.roofline import MISFIT_REASONS
from core.thresholds import threshold_promql
from mixin.rules.card import gpu_names
from mixin.rules.common import E, mx, rec

MISFIT_RECORD = "llmb:engine_roofline:misfit"
UP1 = "0 * engine:llmb_engine_up:max + 1"


def _names() -> tuple[str, str, str]:
    rw = threshold_promql("rate_window")
    return (
        f"engine:llmb_decode_weights_bytes_per_step:avg{rw}",
        f"engine:llmb_decode_batch:avg{rw}",
        "engine:llmb_decode_accepted_tokens_per_step:max",
    )


def roofline_rules() -> list[dict[str, Any]]:
    """The groups' rules in evaluation order (each reads only earlier records)."""
    return [
        bandwidth_rule(),
        *step_rules(),
        *speed_rules(),
        *expert_offload_rules(),
        rec(MISFIT_RECORD, misfit_expr()),
    ]


def bandwidth_rule() -> dict[str, Any]:
    """The memory bandwidth one engine's decode step can use."""
    memory_clock = gpu_names()["memory"]
    # Each GPU's datasheet bandwidth is scaled by the memory clock its window reached
    # against the maximum (mixin/rules/card.py; 1 where either clock is unknown).
    per_gpu = f"""(
                    max by (host, gpu) ({llmb.GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND})
                  * (
                      {memory_clock}
                    or
                      0 * max by (host, gpu) ({llmb.GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND}) + 1
                  )
                )"""
    return rec("engine:llmb_gpu_memory_bandwidth_bytes_per_second:max", engine_gpus_join(per_gpu))


def engine_gpus_join(per_gpu: str) -> str:
    """One engine's figure from a per-GPU one (`host`, `gpu` labels): each GPU the engine's
    processes hold does its share of a step (its share of the engine's GPU memory) and the
    slowest sets the pace: min(value / share), the sum for an even split (tensor parallel),
    the GPU's own on one GPU. A CPU-only engine holds no GPU: the result is absent."""
    return f"""
        min by ({E}) (
            (
                {per_gpu}
              / on (host, gpu) group_right ()
                (
                    engine_gpu:llmb_gpu_process_memory_used_bytes:sum
                  / on (host, engine) group_left ()
                    sum by (host, engine) (engine_gpu:llmb_gpu_process_memory_used_bytes:sum)
                  > 0
                )
            )
          * on (host, engine) group_left (kind) group by ({E}) ({llmb.ENGINE_UP})
        )
        """


def _expert_share(batch: str) -> str:
    """PromQL of 1 - (1 - k/E)^B: the share of routed experts B sequences touch."""
    return f"""
                        1
                      - (
                          1
                        - {mx(llmb.MODEL_EXPERTS_USED)} / ({mx(llmb.MODEL_EXPERTS)} > 0)
                      ) ^ {batch}"""


def step_rules() -> list[dict[str, Any]]:
    """Batch, accept length and the weight bytes one decode step reads."""
    rw = threshold_promql("rate_window")
    weights_step, batch, accepted = _names()
    return [
        rec(
            # Sequences per decode step: whole ones, so (1 - k/E)^B is exact in PromQL and
            # Python alike; 1 when nothing ran.
            batch,
            f"""
              clamp_min(round({mx(f"avg_over_time({llmb.ENGINE_REQUESTS_RUNNING}[{rw}])")}), 1)
            or
              {UP1}
            """,
        ),
        rec(
            # Tokens per target-model step: the speculative accept length, else 1.
            accepted,
            f"""
              clamp_min({mx(llmb.ENGINE_SPEC_ACCEPT_LENGTH)}, 1)
            or
              {UP1}
            """,
        ),
        rec(
            # Weights one step reads: always-read + routed experts x the expected share of
            # distinct experts B sequences touch (uniform routing) + B rows of an untied
            # token embedding. Without the structure series every weight counts (dense);
            # without E or k every routed expert does.
            weights_step,
            f"""
              (
                  {mx(llmb.MODEL_WEIGHTS_ALWAYS_READ_BYTES)}
                + (
                      {mx(llmb.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES)}
                    * ({_expert_share(batch)}
                    )
                  or
                    {mx(llmb.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES)}
                )
                + (
                    {mx(llmb.MODEL_TOKEN_EMBEDDING_ROW_BYTES)} * {batch}
                  or
                    0 * {mx(llmb.MODEL_WEIGHTS_ALWAYS_READ_BYTES)}
                )
              )
            or
              {mx(llmb.MODEL_WEIGHTS_BYTES)}
            """,
        ),
    ]


def speed_rules() -> list[dict[str, Any]]:
    """Bytes per step, the roofline tok/s and the measured share of it."""
    rw = threshold_promql("rate_window")
    weights_step, _, accepted = _names()
    return [
        rec(
            # Each decode step reads those weights, the KV of every running sequence and,
            # with speculative decoding, the draft model once per proposed token; it yields
            # one token (the accept length) per sequence, so per-sequence tok/s <=
            # bandwidth x accepted / this.
            f"engine:llmb_decode_bytes_per_step:avg{rw}",
            f"""
              {weights_step}
            + (
                  {mx(f"avg_over_time({llmb.ENGINE_KV_CACHE_USED_TOKENS}[{rw}])")}
                * {mx(llmb.MODEL_KV_BYTES_PER_TOKEN_ESTIMATED)}
              or
                0 * {weights_step}
            )
            + (
                {mx(llmb.MODEL_DRAFT_WEIGHTS_BYTES)} * {accepted}
              or
                0 * {weights_step}
            )
            """,
        ),
        rec(
            f"engine:llmb_decode_roofline_tokens_per_second:avg{rw}",
            f"""
            engine:llmb_gpu_memory_bandwidth_bytes_per_second:max * {accepted}
              / (engine:llmb_decode_bytes_per_step:avg{rw} > 0)
            """,
        ),
        rec(
            f"engine:llmb_decode_efficiency:ratio{rw}",
            f"""
            engine:llmb_decode_tokens_per_second:rate{rw}
              / (engine:llmb_decode_roofline_tokens_per_second:avg{rw} > 0)
            """,
        ),
    ]


def expert_offload_rules() -> list[dict[str, Any]]:
    """Routed experts kept in host memory and the decode bound that sets."""
    rw = threshold_promql("rate_window")
    _, batch, _ = _names()
    return [
        rec("engine:llmb_experts_host_layers:max", mx(llmb.ENGINE_EXPERTS_HOST_LAYERS)),
        rec("engine:llmb_experts_host_bytes:max", mx(llmb.ENGINE_EXPERTS_HOST_BYTES)),
        rec(
            # Expert offload: host memory bandwidth (the exporter's measurement, or the figure
            # it was given) / host expert bytes a step reads (the share of experts the batch
            # touches): the host side's decode bound. No bandwidth series, no bound.
            f"engine:llmb_experts_host_bound_tokens_per_second:avg{rw}",
            f"""
            max by (host) ({llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND})
              / on (host) group_right ()
                (
                    engine:llmb_experts_host_bytes:max
                  * ({_expert_share(batch)}
                    or
                      0 * engine:llmb_experts_host_bytes:max + 1
                  )
                > 0
                )
            """,
        ),
    ]


def misfit_known() -> dict[str, str]:
    """Per misfit reason: PromQL of the engines that HAVE the fact the reason lacks.

    The Python side is `core.roofline.roofline_facts`; the parity test ties them.
    """
    structure = (
        f"{mx(llmb.MODEL_WEIGHTS_ALWAYS_READ_BYTES)}"
        f" and on ({E}) {mx(llmb.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES)}"
    )
    experts = (
        f"({structure}) and on ({E}) ("
        f"{mx(llmb.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES)} == 0"
        f" or on ({E}) ({mx(llmb.MODEL_EXPERTS_USED)}"
        f" and on ({E}) {mx(llmb.MODEL_EXPERTS)} > 0))"
    )
    return {
        "model_structure_unknown": structure,
        "expert_counts_unknown": experts,
        "speculative_decoding_not_detected": mx(llmb.ENGINE_SPEC_ACCEPT_LENGTH),
    }


def misfit_expr() -> str:
    """`llmb:engine_roofline:misfit{reason}`: the decode efficiency of engines beyond physics
    (above `decode_efficiency_physical_max`), labelled with the first reason that applies."""
    rw = threshold_promql("rate_window")
    physical_max = threshold_promql("decode_efficiency_physical_max")
    beyond = f"engine:llmb_decode_efficiency:ratio{rw} > {physical_max}"
    known = misfit_known()
    parts = []
    for reason in MISFIT_REASONS:
        cond = beyond
        if reason.name in known:
            cond = f"{beyond}\n    unless on ({E}) ({known[reason.name]})"
        parts.append(f'label_replace(\n    {cond},\n    "reason", "{reason.name}", "", ""\n  )')
    return "  " + f"\nor on ({E})\n  ".join(parts) + "\n"
