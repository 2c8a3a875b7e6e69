"""SGLang's static endpoints (`/server_info`, `/model_info`, `/v1/models`): identity and slots.

They change only with a new instance, so the collector reads them at most every
STATIC_TTL_SECONDS (exporter.collectors.sglang.collector) and maps them here.
"""

from __future__ import annotations

import re

from core import series as llmb
from exporter.collectors.sglang.metrics import PREFIX
from exporter.fields import Fields
from exporter.promtext import Exposition
from exporter.schema import MetricSet, sanitize_label

GIB = 1 << 30


def version(text: str | None) -> tuple[int, ...] | None:
    """`0.5.23` / `0.5.11.post1` as (0, 5, 23) / (0, 5, 11); None when unreadable."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if match is None:
        return None
    return tuple(int(part) for part in match.groups("0"))


def _model_name(expo: Exposition, server_info: Fields, model_info: Fields, card: Fields) -> str:
    """The served model's name, from the first source that names it ("" when none does)."""
    return (
        server_info.text("served_model_name")
        or model_info.text("served_model_name")
        or card.text("id")
        or next(
            (
                s.labels[k]
                for s in expo.get(PREFIX + "num_running_reqs")
                for k in ("model_name", "name")
                if k in s.labels
            ),
            None,
        )
        or model_info.text("model_path")
        or server_info.text("model_path")
        or ""
    )


def map_identity(
    ms: MetricSet,
    expo: Exposition,
    statics: tuple[Fields, Fields, Fields],
    labels: dict[str, str],
) -> None:
    """Context (when /metrics has none), slots and `llmb_engine_info` of the instance.

    `statics` are the answers of /server_info, /model_info and /v1/models.
    """
    server_info, model_info, models = statics
    cards = models.objects("data")
    card = cards[0] if cards else Fields(None, "/v1/models.data[0]", server_info.problems)
    if PREFIX + "context_len" not in expo:
        ms.add(llmb.ENGINE_CONTEXT_TOKENS, card.num("max_model_len") or None, **labels)

    states = server_info.objects("internal_states") or []
    per_dp = [s.num("effective_max_running_requests_per_dp") for s in states]
    known = [n for n in per_dp if n]
    if known:
        ms.add(llmb.ENGINE_SLOTS, float(sum(known)), **labels)
    else:
        ms.add(llmb.ENGINE_SLOTS, server_info.num("max_running_requests") or None, **labels)

    model = _model_name(expo, server_info, model_info, card)
    if not (model or server_info):
        return
    quant = ""
    for key in ("quantization", "dtype", "kv_cache_dtype"):
        value = server_info.text(key)
        if value and value != "auto":
            quant = value
            break
    ms.info(
        llmb.ENGINE_INFO,
        model=sanitize_label(model),
        version=server_info.text("version") or "",
        quantization=quant,
        simulated="true" if server_info.flag("simulated") is True else "false",
        **labels,
    )


def reported_memory(server_info: Fields) -> tuple[float | None, float | None] | None:
    """(weight bytes, KV pool bytes) from `/server_info` `internal_states[0].memory_usage`.

    SGLang reports GiB rounded to 0.01, so 0 is "unknown"; memory deltas on a CPU can read
    -0.00 or below: not above 0 is not known either. None when neither is known.
    """
    states = server_info.objects("internal_states") or []
    usage = states[0].obj("memory_usage") if states else None
    weight = usage.num("weight", minimum=None) if usage is not None else None
    kv = usage.num("kvcache", minimum=None) if usage is not None else None
    if (weight is not None and weight > 0) or (kv is not None and kv > 0):
        return (
            weight * GIB if weight is not None and weight > 0 else None,
            kv * GIB if kv is not None and kv > 0 else None,
        )
    return None
