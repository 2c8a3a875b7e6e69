"""Where the simulated engine's bytes are: weights and KV cache on the GPU and in host memory.

Layers go to the GPU as llama.cpp offloads them (-ngl: the output layer first, then repeating
layers), --n-cpu-moe keeps routed experts in host memory, and the KV cache follows the
repeating layers; SGLang serves its own (unquantized) weight size. `process_gpu_bytes` is what
NVML shows for the process.
"""

from __future__ import annotations

from simulator.model import (
    LLAMACPP_KV_BYTES,
    SGLANG_KV_BYTES,
    Clock,
    EngineParams,
    GpuSpec,
    KvStyle,
    ModelSpec,
)


class MemoryModel:
    """Weight and KV bytes of one engine (the state is set by `Engine`)."""

    style: KvStyle
    model: ModelSpec
    gpu: GpuSpec
    params: EngineParams
    clock: Clock
    loaded_at: float

    @property
    def n_layers_total(self) -> int:
        """Layers as llama.cpp counts them (repeating + output)."""
        return self.model.n_layer + 1

    @property
    def gpu_layers(self) -> int:
        """Layers offloaded to the GPU."""
        ngl = self.params.n_gpu_layers
        return self.n_layers_total if ngl < 0 else min(ngl, self.n_layers_total)

    @property
    def weights_total(self) -> int:
        """Weight bytes of the served model."""
        if self.style.checkpoint_weights and self.model.sglang_weight_bytes:
            return self.model.sglang_weight_bytes
        return self.model.weights_bytes

    @property
    def weights_gpu(self) -> int:
        """Weight bytes resident on the GPU (output layer goes first, as llama.cpp does)."""
        return self._layers_gpu_bytes() - self.host_expert_bytes

    def _layers_gpu_bytes(self) -> int:
        if self.gpu_layers >= self.n_layers_total:
            return self.weights_total
        if self.gpu_layers <= 0:
            return 0
        share = (self.gpu_layers - 1) / self.model.n_layer
        scale = self.weights_total / self.model.weights_bytes
        return int(
            (self.model.output_bytes + share * self.model.n_layer * self.model.layer_bytes) * scale
        )

    @property
    def host_expert_layers(self) -> int:
        """Offloaded layers whose routed experts stay in host memory (llama.cpp --n-cpu-moe)."""
        if not self.style.experts_on_host or not self.model.expert_count:
            return 0
        first_gpu_layer = self.model.n_layer - self.n_layer_gpu()
        return max(0, min(self.params.n_cpu_moe, self.model.n_layer) - first_gpu_layer)

    @property
    def host_expert_bytes(self) -> int:
        """Bytes of the routed experts kept in host memory by --n-cpu-moe."""
        return self.host_expert_layers * self.model.routed_layer_bytes

    @property
    def weights_cpu(self) -> int:
        """Weight bytes in host memory (whole layers under -ngl, experts under --n-cpu-moe)."""
        return self.weights_total - self.weights_gpu

    def n_layer_gpu(self) -> int:
        """Repeating layers on the GPU (the output layer is offloaded first)."""
        if self.gpu_layers >= self.n_layers_total:
            return self.model.n_layer
        return max(0, self.gpu_layers - 1)

    @property
    def kv_gpu_share(self) -> float:
        """Share of the KV cache that lives on the GPU (follows the repeating layers)."""
        if self.gpu_layers >= self.n_layers_total:
            return 1.0
        return max(0, self.gpu_layers - 1) / self.model.n_layer

    @property
    def kv_type_bytes(self) -> tuple[float, float]:
        """Bytes per K and per V element of the cache (the model's figure is for 16-bit)."""
        p = self.params
        if not self.style.split_kv_types:
            size = SGLANG_KV_BYTES[p.kv_cache_dtype]
            return size, size
        return LLAMACPP_KV_BYTES[p.cache_type_k], LLAMACPP_KV_BYTES[p.cache_type_v]

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token of context takes in this engine's cache element types."""
        k, v = self.kv_type_bytes
        return self.model.kv_bytes_per_token * (k + v) / 4.0

    @property
    def kv_pool_bytes(self) -> int:
        """KV buffer allocated at start for the whole pool.

        SGLang allocates one page more than `max_total_num_tokens` (a dummy slot for padded
        tokens; page size 1 here)."""
        slots = self.params.ctx_total + (1 if self.style.padding_page else 0)
        return round(slots * self.kv_bytes_per_token)

    def process_gpu_bytes(self) -> int:
        """What NVML would report as this process's GPU memory."""
        if self.clock.now() < self.loaded_at * 0.5:
            return self.gpu.driver_bytes  # still mapping the weights
        return int(
            self.gpu.driver_bytes
            + self.weights_gpu
            + self.kv_pool_bytes * self.kv_gpu_share
            + self.params.compute_buffer_bytes
            + self.params.graph_bytes
            + self.params.draft_bytes
            + self.params.ctx_total * self.params.draft_kv_bytes_per_token
        )
