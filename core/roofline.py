"""The decode roofline: bytes read per step (dense, MoE, KV, draft), the bandwidth of a
tensor-parallel engine, accepted tokens, the physics gate and the expert-offload bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from core import series as llmb
from core.thresholds import threshold_number

# ------------------------------------------------------------------------------ roofline


@dataclass(frozen=True, kw_only=True)
class ModelStructure:
    """What the roofline knows about the bytes a model reads per decode step.

    `weights_bytes` is every weight in the file. With `always_read_bytes` known, a step
    reads those, the expected share of the routed experts (`routed_expert_bytes`, E =
    `experts`, k = `experts_used`) that the batch touches, and one row of an untied token
    embedding per sequence; without it every weight counts as read (a dense model). A draft
    model (speculative decoding) adds `draft_weights_bytes` per proposed token.

    Keyword-only: diagnose's `Facts` extends it, so these fields are declared once and
    results.json carries them under the same names.
    """

    weights_bytes: float | None = None
    always_read_bytes: float | None = None
    routed_expert_bytes: float | None = None
    experts: float | None = None
    experts_used: float | None = None
    token_embedding_row_bytes: float | None = None
    draft_weights_bytes: float | None = None

    @property
    def structure_known(self) -> bool:
        """Whether the always-read and routed-expert bytes are known (else: all weights)."""
        return self.always_read_bytes is not None and self.routed_expert_bytes is not None

    @property
    def experts_known(self) -> bool:
        """Whether the routed-expert share is known: no routed experts, or E and k."""
        if not self.structure_known:
            return False
        if not self.routed_expert_bytes:
            return True
        return self.experts_used is not None and self.experts is not None and self.experts > 0


def go_pow(x: float, y: float) -> float:
    """`x ^ y` as PromQL computes it (Go's math.Pow) for an integer `y`, bit for bit.

    Go multiplies normalized mantissas by repeated squaring and scales once at the end;
    C's pow (Python's `**`) rounds differently in the last bit, which the parity test sees.
    """
    if y == 0 or x == 1:
        return 1.0
    if y == 1:
        return x
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if y != int(y) or math.isinf(y) or math.isinf(x) or x == 0:
        return float(x**y)
    a1, ae = 1.0, 0
    x1, xe = math.frexp(x)
    i = int(abs(y))
    while i != 0:
        if xe < -(1 << 12) or (1 << 12) < xe:
            ae += xe
            break
        if i & 1 == 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    if y < 0:
        a1 = 1 / a1
        ae = -ae
    return math.ldexp(a1, ae)


def decode_batch(running_avg: float | None) -> float:
    """Sequences per decode step for the roofline: the average running, rounded, at least 1.

    PromQL `clamp_min(round(x), 1)` (round: floor(x + 0.5)); 1 when unknown. Whole
    sequences keep the expert share `1 - (1 - k/E)^B` exact in PromQL and Python alike.
    """
    if running_avg is None or math.isnan(running_avg):
        return 1.0
    return max(float(math.floor(running_avg + 0.5)), 1.0)


def expert_share(experts: float, experts_used: float, batch: float) -> float:
    """Expected share of the E routed experts that B sequences touch with k experts each.

    Under uniform routing one expert is missed by one token with probability 1 - k/E, so
    by all B with (1 - k/E)^B: an expectation, not a measurement (real routers are skewed,
    which lowers it).
    """
    return 1 - go_pow(1 - experts_used / experts, batch)


def active_weights_bytes(model: float | ModelStructure, batch: float = 1.0) -> float:
    """Weight bytes one decode step of `batch` sequences reads (the draft model excluded).

    always-read + routed x (1 - (1 - k/E)^B) + B x token-embedding row; all weights when
    the structure is unknown, all routed experts when E or k is. Same order of operations
    as the recording rule `engine:llmb_decode_weights_bytes_per_step:avg5m`.
    """
    if not isinstance(model, ModelStructure):
        return float(model)
    if not model.structure_known:
        if model.weights_bytes is None:
            raise ValueError("neither the weight bytes nor the model structure is known")
        return float(model.weights_bytes)
    assert model.always_read_bytes is not None and model.routed_expert_bytes is not None
    routed = float(model.routed_expert_bytes)
    if model.experts_known and model.routed_expert_bytes:
        assert model.experts is not None and model.experts_used is not None
        routed = routed * expert_share(model.experts, model.experts_used, batch)
    total = float(model.always_read_bytes) + routed
    if model.token_embedding_row_bytes is not None:
        total = total + model.token_embedding_row_bytes * batch
    return total


def accepted_tokens(accept_length: float | None) -> float:
    """Tokens per target-model step: the speculative accept length (at least 1), else 1.

    PromQL `clamp_min(x, 1)`, NaN included (Go's math.Max keeps a NaN).
    """
    if accept_length is None:
        return 1.0
    if math.isnan(accept_length):
        return math.nan
    return max(float(accept_length), 1.0)


def decode_bytes_per_step(
    model: float | ModelStructure,
    kv_tokens: float | None = None,
    kv_bytes_per_token: float | None = None,
    batch: float = 1.0,
    accept_length: float | None = None,
) -> float:
    """Bytes one decode step reads, the one formula every surface uses:

        active_weights_bytes(model, B) + kv_tokens x kv_bytes_per_token
                                       + draft_weights x accepted tokens per step

    `model` is a `ModelStructure` or (a dense model) its weight bytes. `kv_tokens` is the KV
    cache tokens in use (all running sequences together); without it or the KV bytes per
    token the KV term is 0, as in the rules. The draft model runs once per token it
    proposes: the accepted ones and the rejected one that ends the step, about the accept
    length.
    """
    weights = active_weights_bytes(model, batch)
    total = weights
    if kv_tokens is not None and kv_bytes_per_token is not None:
        total = total + kv_tokens * kv_bytes_per_token
    draft = model.draft_weights_bytes if isinstance(model, ModelStructure) else None
    if draft is not None:
        total = total + draft * accepted_tokens(accept_length)
    return total


def roofline_tokens_per_second(
    bandwidth_bytes_per_second: float | None,
    bytes_per_step: float | None,
    accept_length: float | None = None,
) -> float | None:
    """Upper bound on per-sequence decode tok/s: bandwidth x accepted tokens / bytes per step.

    Each step yields one token per running sequence (`accept_length` with speculative
    decoding), so per-sequence speed cannot exceed this. None without a bandwidth or bytes.
    """
    if bandwidth_bytes_per_second is None:
        return None
    return known_ratio(bandwidth_bytes_per_second * accepted_tokens(accept_length), bytes_per_step)


def known_ratio(num: float | None, den: float | None) -> float | None:
    """`num / den`; None when either is unknown or `den` is not above 0 (PromQL `/ (den > 0)`)."""
    if num is None or den is None or not den > 0:
        return None
    return num / den


def decode_efficiency(
    decode_tokens_per_second: float | None, roofline: float | None
) -> float | None:
    """Measured per-sequence decode tok/s / roofline tok/s (None when either is unknown)."""
    return known_ratio(decode_tokens_per_second, roofline)


def tp_bandwidth(
    gpus: Iterable[tuple[float, float]],
) -> float | None:
    """Bandwidth of the GPUs one engine holds, from (bandwidth, engine memory) per GPU.

    Each GPU reads its share of the bytes of a step (the share of the engine's GPU memory on
    it: weights and KV split alike) and the step lasts as long as the slowest: the engine's
    bandwidth is min(bandwidth_i / share_i), the sum of the bandwidths for an even split and
    exactly the one GPU's bandwidth on one GPU. None when no GPU holds memory.
    """
    items = list(gpus)
    held = 0.0
    for _, mem in items:
        held += mem
    best: float | None = None
    for bw, mem in items:
        share = mem / held if held else math.nan
        if not share > 0 or math.isnan(bw):
            continue
        value = bw / share
        if best is None or value < best:
            best = value
    return best


# ---------------------------------------------------------------------- physics gate


@dataclass(frozen=True)
class MisfitReason:
    """Why a decode efficiency above `decode_efficiency_physical_max` is possible: the fact
    the bytes-per-step model lacks (the first that applies wins)."""

    name: str
    lacks: str
    cause: str


MISFIT_REASONS: tuple[MisfitReason, ...] = (
    MisfitReason(
        "model_structure_unknown",
        f"the model's structure ({llmb.MODEL_WEIGHTS_ALWAYS_READ_BYTES}, "
        f"{llmb.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES}): every weight counts as read per step",
        "a mixture-of-experts model whose expert metadata is unknown reads only its active "
        "experts; give the exporter/diagnose the model file (GGUF or HF config)",
    ),
    MisfitReason(
        "expert_counts_unknown",
        f"the expert counts ({llmb.MODEL_EXPERTS}, {llmb.MODEL_EXPERTS_USED}): every routed expert "
        "counts as read per step",
        "a mixture-of-experts model reads only k of its E experts per token; the model file "
        "lacks `expert_count` / `expert_used_count`",
    ),
    MisfitReason(
        "speculative_decoding_not_detected",
        f"the speculative accept length ({llmb.ENGINE_SPEC_ACCEPT_LENGTH}): one token per "
        "model step is assumed",
        "speculative decoding (llama.cpp `-md`, SGLang `--speculative-algorithm`) makes "
        "several tokens per weight read; its acceptance was not seen",
    ),
    MisfitReason(
        "bandwidth_too_low",
        "a right GPU memory bandwidth: the model, experts and acceptance are all known",
        "the bandwidth (NVML table, the config's `gpu.bandwidth_bytes_per_second` or "
        "--bandwidth-gbs) is lower than the card's; check the GPU model and the value given",
    ),
)
MISFIT_BY_NAME: dict[str, MisfitReason] = {r.name: r for r in MISFIT_REASONS}


@dataclass(frozen=True)
class RooflineFacts:
    """What the bytes-per-step model knew when it was computed."""

    structure_known: bool
    experts_known: bool
    accept_known: bool


def roofline_facts(model: float | ModelStructure, accept_length: float | None) -> RooflineFacts:
    """The facts of `model` (a bare weight count knows no structure) and the acceptance."""
    if isinstance(model, ModelStructure):
        return RooflineFacts(model.structure_known, model.experts_known, accept_length is not None)
    return RooflineFacts(False, False, accept_length is not None)


def physical(efficiency: float | None) -> bool:
    """Whether a decode efficiency is within physics (absent counts as no claim, fine)."""
    return efficiency is None or efficiency <= threshold_number("decode_efficiency_physical_max")


def roofline_misfit(efficiency: float | None, facts: RooflineFacts) -> MisfitReason | None:
    """The reason the roofline does not fit the measurement, None when it does."""
    if physical(efficiency):
        return None
    if not facts.structure_known:
        return MISFIT_BY_NAME["model_structure_unknown"]
    if not facts.experts_known:
        return MISFIT_BY_NAME["expert_counts_unknown"]
    if not facts.accept_known:
        return MISFIT_BY_NAME["speculative_decoding_not_detected"]
    return MISFIT_BY_NAME["bandwidth_too_low"]


def misfit_text(efficiency: float, reason: MisfitReason) -> str:
    """One sentence for every surface: no decode verdict, the likely cause, what is lacking."""
    return (
        "no decode verdict: the bytes-per-step model does not fit the measurement (decode at "
        f"{efficiency * 100:.0f} % of the roofline, above "
        f"{threshold_number('decode_efficiency_physical_max') * 100:.0f} %: beyond physics). "
        f"Likely cause: {reason.cause}. Lacking: {reason.lacks}"
    )


# -------------------------------------------------------------------- expert offload


def experts_host_bound(
    host_bytes: float | None,
    experts: float | None,
    experts_used: float | None,
    batch: float = 1.0,
    host_bandwidth: float | None = None,
) -> float | None:
    """Per-sequence decode tok/s that experts in host memory allow: host memory bandwidth /
    (host expert bytes x the share of experts a step touches; all of them without E/k).
    None without a bandwidth (nothing measured, no figure given): no constant stands in.

    Same arithmetic as `engine:llmb_experts_host_bound_tokens_per_second:avg5m`.
    """
    if host_bytes is None or host_bandwidth is None:
        return None
    share = 1.0
    if experts_used is not None and experts is not None and experts > 0:
        share = expert_share(experts, experts_used, batch)
    read = host_bytes * share
    if not read > 0:
        return None
    return host_bandwidth / read


@dataclass(frozen=True)
class HostOffload:
    """What the expert-offload finding says: where the experts are, the host's bandwidth
    (and where that figure comes from), the measured per-sequence decode and free VRAM."""

    layers: float | None
    host_bytes: float | None
    # Share of the host experts one decode step reads (`expert_share`; 1: all of them).
    share: float = 1.0
    bandwidth: float | None = None
    bandwidth_source: str | None = None
    decode_tokens_per_second: float | None = None
    free_vram_bytes: float | None = None

    @property
    def per_step(self) -> float | None:
        """Host expert bytes one decode step reads."""
        return self.host_bytes * self.share if self.host_bytes else None

    @property
    def bound(self) -> float | None:
        """Per-sequence decode tok/s host memory allows (None: bandwidth or bytes unknown)."""
        per_step = self.per_step
        return self.bandwidth / per_step if self.bandwidth and per_step else None

    def bound_ratio(self) -> float | None:
        """Measured per-sequence decode / the bound (None: either unknown)."""
        bound, measured = self.bound, self.decode_tokens_per_second
        return measured / bound if bound and measured is not None else None

    def near_bound(self) -> bool:
        """Whether the measured decode is within 1 - `experts_host_bound_near_ratio` (20 %)
        of the bound, on either side: host memory is the limit."""
        ratio, near = self.bound_ratio(), threshold_number("experts_host_bound_near_ratio")
        return ratio is not None and near <= ratio <= 2 - near

    def above_bound(self) -> bool:
        """Whether the measured decode is further above the bound than that: the bandwidth
        figure is lower than what the engine draws (a copy is not its access pattern)."""
        ratio, near = self.bound_ratio(), threshold_number("experts_host_bound_near_ratio")
        return ratio is not None and ratio > 2 - near


def host_bound_text(o: HostOffload) -> str:
    """The bound beside the measured decode, as the answer's `expert offload` line says it."""
    bound = o.bound
    if bound is None or o.bandwidth is None:
        return "host bound unknown (no host memory bandwidth: pass --host-bandwidth-gbs)"
    text = (
        f"host bound {bound:.1f} tok/s per sequence at {o.bandwidth / 1e9:.1f} GB/s "
        f"({o.bandwidth_source or 'given'})"
    )
    measured = o.decode_tokens_per_second
    if measured is not None:
        text += f", measured {measured:.1f} tok/s ({measured / bound * 100:.0f} % of it)"
    return text


def expert_offload_action(offload: HostOffload) -> str:
    """The expert-offload finding: its layers, bytes, the host-side bound, and, when the
    measured decode is near that bound, what moving more layers' experts to the GPU buys."""
    o = offload
    layers = f"{o.layers:.0f} layers" if o.layers is not None else "some layers"
    text = f"Expert offload: the routed experts of {layers} live in host memory"
    per_step, bound = o.per_step, o.bound
    if o.host_bytes and per_step:
        text += f" ({o.host_bytes / 2**30:.2f} GiB; {per_step / 2**30:.2f} GiB read per step)"
        if bound is not None and o.bandwidth is not None:
            text += (
                f", so decode is bound near {bound:.1f} tok/s per sequence by host memory "
                f"({o.bandwidth / 1e9:.1f} GB/s, {o.bandwidth_source or 'given'}: the CPU "
                "computes host-resident experts at batch sizes below 32)"
            )
        else:
            text += (
                "; host memory bandwidth unknown (pass --host-bandwidth-gbs), so no bound on "
                "decode is given"
            )
    text += "."
    if o.near_bound() and o.layers and round(o.layers) > 0:
        text += " " + _more_layers_text(o)
    elif o.above_bound() and o.bandwidth is not None:
        ratio = o.bound_ratio() or 0.0
        text += (
            f" Measured decode {o.decode_tokens_per_second:.1f} tok/s per sequence is "
            f"{ratio * 100:.0f} % of that bound: the engine draws more than "
            f"{o.bandwidth / 1e9:.1f} GB/s from host memory, so that figure is low for its "
            "access pattern; give the host's own with --host-bandwidth-gbs."
        )
    # What to do is the `experts_host` evidence's own action (core/conditions.py).
    return text


def _more_layers_text(o: HostOffload) -> str:
    """Host memory is the limit: what N more layers' experts on the GPU would buy."""
    assert o.layers and o.host_bytes and o.bound and o.decode_tokens_per_second is not None
    host_layers = round(o.layers)
    per_layer = o.host_bytes / host_layers
    text = (
        f"Measured decode {o.decode_tokens_per_second:.1f} tok/s per sequence is "
        f"{o.decode_tokens_per_second / o.bound * 100:.0f} % of that bound: host memory is "
        "the limit."
    )
    free = o.free_vram_bytes
    n = max(1, host_layers // 2) if free is None else min(host_layers, int(free // per_layer))
    if n == 0:
        assert free is not None
        return text + (
            f" One more layer's experts on the GPU needs {per_layer / 2**30:.2f} GiB of VRAM, "
            f"more than the {free / 2**30:.2f} GiB free: make room first."
        )
    room = f"; {free / 2**30:.2f} GiB free" if free is not None else "; free VRAM unknown"
    need = f"{n} x {per_layer / 2**30:.2f} GiB = {n * per_layer / 2**30:.2f} GiB of VRAM{room}"
    if n == host_layers:
        return text + (
            f" Moving all {n} layers' experts to the GPU ({need}) removes the host bound: "
            "decode then reads only GPU memory."
        )
    new_bound = o.bound * host_layers / (host_layers - n)
    return text + (
        f" Moving {n} more layers' experts to the GPU (a `--n-cpu-moe` lower by {n}; "
        f"{need}) raises the bound to {new_bound:.1f} tok/s per sequence."
    )
