"""The alerting rules (prometheus/rules/alerts.yml), each with its runbook link.

The job selector, the extra alert labels and the runbook's address come from the mixin's
config; every `for:` and threshold from the core's THRESHOLDS.
"""

from __future__ import annotations

from typing import Any

from core import series as llmb
from core.roofline import MISFIT_REASONS
from core.thresholds import threshold_promql
from mixin.config import MixinConfig
from mixin.rules.card import card_alert_text
from mixin.rules.common import E, q
from mixin.rules.roofline import MISFIT_RECORD


def alert(
    cfg: MixinConfig,
    name: str,
    expr: str,
    for_: str,
    severity: str,
    summary: str,
    description: str,
) -> dict[str, Any]:
    """An alerting rule with its runbook link."""
    return {
        "alert": name,
        "expr": q(expr),
        "for": threshold_promql(for_),
        "labels": {"severity": severity, **cfg.alert_labels},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{cfg.runbook_url}#{name.lower()}",
        },
    }


def alert_rules(cfg: MixinConfig) -> list[dict[str, Any]]:
    """The alerts of issue 5 item 4, in the order of the runbook."""
    rules = [
        *bottleneck_alerts(cfg),
        *decode_alerts(cfg),
        *card_alerts(cfg),
        *availability_alerts(cfg),
    ]
    return [{"name": "llmb-alerts", "rules": rules}]


def bottleneck_alerts(cfg: MixinConfig) -> list[dict[str, Any]]:
    """KV saturated, weights not resident, GPU memory near full, requests queueing."""
    rw, qw = threshold_promql("rate_window"), threshold_promql("queue_window")
    return [
        alert(
            cfg,
            "LLMKVCacheSaturated",
            "engine:llmb_kv_saturated:bool == 1",
            "for_kv_saturated",
            "warning",
            "KV cache of {{ $labels.engine }} is saturated",
            "{{ $labels.kind }} engine {{ $labels.engine }} has its KV cache at or above "
            f"{threshold_promql('kv_usage_high')} with requests waiting (average over {qw}), or "
            "logged KV pressure events (KV full, context shift/exceeded, truncation, retraction) "
            f"in the last {rw}. Requests wait or are cut because the KV pool is full.",
        ),
        alert(
            cfg,
            "LLMWeightsNotResident",
            "engine:llmb_weights_not_resident:bool == 1",
            "for_weights_not_resident",
            "critical",
            "Model weights of {{ $labels.engine }} are not all on the GPU",
            "{{ $labels.kind }} engine {{ $labels.engine }} has fewer layers or weight "
            "buffers on the GPU than the model has, or less GPU memory than the weights need "
            f"(below {threshold_promql('weights_memory_ratio_min')} of the weight bytes). Every "
            "decode step waits for the part in host memory." + expert_offload_annotation(),
        ),
        alert(
            cfg,
            "LLMGPUMemoryNearFull",
            "gpu:llmb_gpu_memory_headroom_bytes:peak < "
            f"{threshold_promql('gpu_headroom_min_bytes')}",
            "for_gpu_memory_near_full",
            "warning",
            "GPU {{ $labels.gpu }} is nearly out of memory",
            "At its recent peak GPU {{ $labels.gpu }} had only {{ $value | humanize1024 }}B "
            "free. The next larger batch, context or process may fail to allocate.",
        ),
        alert(
            cfg,
            "LLMRequestsQueueing",
            f"""
            engine:llmb_requests_waiting:avg{qw} >= {threshold_promql("queue_min")}
            unless on ({E}) engine:llmb_kv_saturated:bool == 1
            """,
            "for_requests_queueing",
            "warning",
            "Requests queue at {{ $labels.engine }} while its KV cache has room",
            '{{ $labels.kind }} engine {{ $labels.engine }} has {{ $value | printf "%.1f" }} '
            f"requests waiting on average over {qw} and its KV cache is not saturated: "
            "the limit is slots, max running requests or batching, not memory.",
        ),
    ]


def decode_alerts(cfg: MixinConfig) -> list[dict[str, Any]]:
    """Decode below the card's limit, and a roofline that does not fit."""
    rw = threshold_promql("rate_window")
    at_limit = threshold_promql("decode_efficiency_at_limit")
    return [
        alert(
            cfg,
            "LLMDecodeBelowCardLimit",
            f"""
            engine:llmb_decode_efficiency:ratio{rw} < {at_limit}
            and on ({E}) llmb:engine_bottleneck:verdict{{verdict="decode_below_card_limit"}} == 1
            """,
            "for_decode_below_card_limit",
            "info",
            "Decode of {{ $labels.engine }} runs below the card's memory-bandwidth limit",
            "{{ $labels.kind }} engine {{ $labels.engine }} decodes at "
            "{{ $value | humanizePercentage }} of the roofline (GPU memory bandwidth / bytes "
            "read per decode step) with no queue and no memory problem: the engine or its "
            "settings, not the card, set the speed.",
        ),
        alert(
            cfg,
            "LLMRooflineMisfit",
            MISFIT_RECORD,
            "for_roofline_misfit",
            "info",
            "The decode roofline of {{ $labels.engine }} does not fit its measured speed",
            "{{ $labels.kind }} engine {{ $labels.engine }} decodes at {{ $value | "
            "humanizePercentage }} of its roofline, above "
            f"{threshold_promql('decode_efficiency_physical_max')}: beyond physics, so the "
            "bytes-per-step model does not fit and no decode verdict is given (reason {{ "
            "$labels.reason }}). " + misfit_annotation(),
        ),
    ]


def card_alerts(cfg: MixinConfig) -> list[dict[str, Any]]:
    """The card itself slowed (issues 27, 32): the verdict `card_throttled`, with the card
    sentence and the first cause's action of the core (mixin/rules/card.py)."""
    rw = threshold_promql("rate_window")
    at_limit = threshold_promql("decode_efficiency_at_limit")
    text = card_alert_text(
        "{host=%q,engine=%q,kind=%q}", "$labels.host $labels.engine $labels.kind"
    )
    return [
        alert(
            cfg,
            "LLMCardThrottled",
            f"""
            engine:llmb_card_throttled:bool == 1
            and on ({E}) llmb:engine_bottleneck:verdict{{verdict="card_throttled"}} == 1
            """,
            "for_card_throttled",
            "warning",
            "The GPU of {{ $labels.engine }} runs below its clocks",
            "{{ $labels.kind }} engine {{ $labels.engine }} decodes below "
            f"{at_limit} of its roofline while its GPU runs below its clocks over the last "
            f"{rw}, and the lost clock explains a real part of the gap: the card, not the "
            "engine, sets the speed. " + text,
        ),
    ]


def availability_alerts(cfg: MixinConfig) -> list[dict[str, Any]]:
    """Engine down, exporter down (its scrape job: `exporter_selector`), source failing,
    and the load generator's token-count mismatch."""
    return [
        alert(
            cfg,
            "LLMEngineDown",
            f"""
            engine:llmb_engine_up:max == 0
            unless on ({E}) max by ({E}) ({llmb.ENGINE_LOADING}) == 1
            """,
            "for_engine_down",
            "critical",
            "Engine {{ $labels.engine }} is down",
            "{{ $labels.kind }} engine {{ $labels.engine }} does not answer its health endpoint "
            "with success and does not report that it is loading.",
        ),
        alert(
            cfg,
            "LLMExporterDown",
            f"up{{{cfg.exporter_selector}}} == 0",
            "for_exporter_down",
            "critical",
            "The llm-bottleneck exporter {{ $labels.instance }} cannot be scraped",
            "Prometheus cannot scrape {{ $labels.instance }}; every llm-bottleneck rule and "
            "alert is blind until it is back.",
        ),
        alert(
            cfg,
            "LLMExporterSourceFailing",
            # A down engine's source fails too; LLMEngineDown already says so.
            f"""
            max by (host, source) ({llmb.SOURCE_UP}) == 0
            unless on (host, source)
              label_replace(engine:llmb_engine_up:max == 0, "source", "$1", "engine", "(.*)")
            """,
            "for_source_failing",
            "warning",
            "Exporter source {{ $labels.source }} fails",
            "The exporter could not read source {{ $labels.source }} (an engine's endpoints or "
            f"NVML) in any scrape; see {llmb.SOURCE_ERRORS_TOTAL}"
            '{source="{{ $labels.source }}"} '
            "for the reason and the exporter log for the message.",
        ),
        alert(
            cfg,
            "LLMTokenCountMismatch",
            f"max by (host, engine) ({llmb.LOADGEN_TOKEN_COUNT_MISMATCH}) == 1",
            "for_token_count_mismatch",
            "warning",
            "Load run token counts do not match for {{ $labels.engine }}",
            "The load generator saw token counts for {{ $labels.engine }} that differ from the "
            "other engines in the run or from max_tokens: the runs are not comparable.",
        ),
    ]


def misfit_annotation() -> str:
    """Likely cause and lacking fact per misfit reason, as an alert template."""
    parts = []
    for i, r in enumerate(MISFIT_REASONS):
        head = "{{ if" if i == 0 else "{{ else if"
        parts.append(
            f'{head} eq $labels.reason "{r.name}" }}}}Likely cause: {r.cause}. Lacking: {r.lacks}.'
        )
    return "".join(parts) + "{{ end }}"


def expert_offload_annotation() -> str:
    """The expert-offload sentence of LLMWeightsNotResident (empty without host experts)."""
    rw = threshold_promql("rate_window")
    near = threshold_promql("experts_host_bound_near_ratio")
    sel = "{host=%q,engine=%q,kind=%q}"
    args = "$labels.host $labels.engine $labels.kind"
    return (
        f'{{{{ with printf "engine:llmb_experts_host_layers:max{sel} > 0" {args} | query }}}}'
        ' Expert offload: the routed experts of {{ . | first | value | printf "%.0f" }} '
        "layers live in host memory"
        f'{{{{ with printf "engine:llmb_experts_host_bytes:max{sel}" {args} | query }}}}'
        " ({{ . | first | value | humanize1024 }}B){{ end }}"
        f'{{{{ with printf "engine:llmb_experts_host_bound_tokens_per_second:avg{rw}{sel}" '
        f"{args} | query }}}}"
        ', which bounds decode near {{ . | first | value | printf "%.1f" }} tok/s per '
        "sequence"
        f'{{{{ with printf "max({llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND}{{host=%q}})" '
        "$labels.host | query }}"
        " at {{ . | first | value | humanize }}B/s of host memory bandwidth{{ end }}"
        f" ({llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND}){{{{ end }}}}"
        # Near the bound (core/roofline.py HostOffload.near_bound): host memory is the limit.
        f'{{{{ with printf "engine:llmb_decode_tokens_per_second:rate{rw}{sel}'
        f" / engine:llmb_experts_host_bound_tokens_per_second:avg{rw}{sel}"
        f' >= {near} <= 2 - {near}" '
        f"{args} {args} | query }}}}"
        "; decode per sequence reaches {{ . | first | value | humanizePercentage }} of it: "
        "host memory is the limit, and each layer's experts moved to the GPU raise the bound"
        "{{ end }}. Keep "
        "fewer experts on the host (a lower `--n-cpu-moe`, no `-ot exps=CPU`) if VRAM allows, or "
        "use a smaller quantization.{{ end }}"
    )
