"""What one forward of the simulated engine costs, in simulated seconds.

One decode step of the whole batch costs
    (weight bytes on the GPU + KV bytes read on the GPU) / GPU bandwidth
  + (weight bytes on the CPU + KV bytes read on the CPU) / CPU bandwidth
  + fixed overhead + per-sequence overhead x batch size,
and a prefill costs uncached prompt tokens / prefill tokens per second. A mixture of experts
reads only the experts its tokens route to; a draft model adds its own steps.
"""

from __future__ import annotations

import functools
import json
import random

from core.prefill import PrefillStructure, prefill_flops_per_token
from model.flops import prefill_flops
from model.geometry import geometry_from_hf_config
from simulator.memory import MemoryModel
from simulator.model import ModelSpec, Request

# Layers whose routing is drawn each step; the others are taken to touch as many experts.
ROUTING_PROBE_LAYERS = 4


class StepCosts(MemoryModel):
    """Prefill and decode times from the bytes a step reads (the state is set by `Engine`)."""

    utilization: float
    last_routed_share: float
    _route_rng: random.Random

    def prefill_seconds(self, tokens: int, prompt: float | None = None) -> float:
        """Time to compute `tokens` prompt tokens of prompts `prompt` tokens long (CPU-resident
        layers are compute bound). With `prefill_flops_per_s` the GPU part costs the model's
        FLOPs per prompt token at that length (core.prefill) at that rate."""
        cpu_share = 1.0 - self.kv_gpu_share
        gpu = tokens / self.params.prefill_tok_s * self.gpu.compute_slowdown
        structure = prefill_structure(self.model)
        if self.params.prefill_flops_per_s and structure is not None:
            per_token = prefill_flops_per_token(structure, prompt or float(tokens))
            gpu = tokens * per_token / self.params.prefill_flops_per_s * self.gpu.compute_slowdown
        return gpu + tokens * cpu_share / self.params.cpu_prefill_tok_s

    def routed_share(self, tokens: int) -> float:
        """Share of the routed experts a forward over `tokens` tokens reads.

        Drawn as the router picks: every token runs `expert_used` distinct experts, chosen
        uniformly; a layer reads each expert any of its tokens picked once.
        """
        m = self.model
        if not m.expert_count or tokens <= 0:
            return 0.0
        experts = range(m.expert_count)
        layers = min(m.n_layer, ROUTING_PROBE_LAYERS)
        touched = 0
        for _ in range(layers):
            seen: set[int] = set()
            for _ in range(tokens):
                seen.update(self._route_rng.sample(experts, m.expert_used))
                if len(seen) == m.expert_count:
                    break
            touched += len(seen)
        return touched / (layers * m.expert_count)

    def _weights_read(self, tokens: int, n_seq: int) -> tuple[float, float]:
        """Weight bytes one forward reads from GPU and from host memory."""
        m, scale = self.model, self.weights_total / self.model.weights_bytes
        share = self.routed_share(tokens)
        self.last_routed_share = share
        gpu_layers = self.n_layer_gpu() - self.host_expert_layers  # layers with experts on GPU
        unread = m.routed_layer_bytes * scale * (1.0 - share)
        gpu = self.weights_gpu - unread * gpu_layers
        cpu = self.weights_cpu - unread * (m.n_layer - gpu_layers) + n_seq * m.token_row_bytes
        return gpu, cpu

    def decode_seconds(self, batch: list[Request]) -> float:
        """Time of one decode step over `batch` (with speculative decoding: draft + verify)."""
        if not batch:
            return 0.0
        p = self.params
        width = 1 + p.spec_draft_max  # tokens per sequence the target computes this step
        kv_bytes = sum(r.n_tokens for r in batch) * self.kv_bytes_per_token
        share = self.kv_gpu_share
        weights_gpu, weights_cpu = self._weights_read(len(batch) * width, len(batch))
        gpu_bytes = weights_gpu + kv_bytes * share
        cpu_bytes = weights_cpu + kv_bytes * (1 - share)
        memory_s = gpu_bytes / self.gpu.bandwidth
        moe_s = p.moe_layer_overhead_s * self.model.n_layer if self.model.expert_count else 0.0
        draft_s = p.spec_draft_max * (p.draft_bytes / self.gpu.bandwidth + p.draft_step_overhead_s)
        # The kernels' compute and launch overheads run at the SM clock (a slowed card).
        compute_s = (moe_s + p.step_overhead_s + p.per_seq_overhead_s * len(batch)) * (
            self.gpu.compute_slowdown
        )
        total = memory_s + cpu_bytes / p.cpu_bandwidth + draft_s + compute_s
        self.utilization = memory_s / total
        return total

    def tokens_per_step(self) -> float:
        """Expected tokens one decode step gives a sequence (1 + accepted drafts)."""
        p = self.params
        return sum(p.spec_accept_p**i for i in range(p.spec_draft_max + 1))

    def per_seq_tok_s(self, batch: int) -> float:
        """Steady-state decode speed of one sequence at `batch` (documentation, tests)."""
        fake = [Request(-1, [0] * 512, 0, True, random.Random(0), 0) for _ in range(batch)]
        util, share = self.utilization, self.last_routed_share
        speed = self.tokens_per_step() / self.decode_seconds(fake)
        self.utilization, self.last_routed_share = util, share
        return speed


@functools.cache
def _structure(config: str) -> PrefillStructure | None:
    fl = prefill_flops(geometry_from_hf_config(json.loads(config)))
    return None if fl is None else PrefillStructure(*fl)


def prefill_structure(model: ModelSpec) -> PrefillStructure | None:
    """FLOPs per prompt token of a preset's model (its HF config's shapes), None without one."""
    if model.hf_config is None:
        return None
    return _structure(json.dumps(model.hf_config, sort_keys=True))
