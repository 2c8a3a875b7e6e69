"""llama-server's log lines: its `M.SS.mmm.uuu L text` format, the load and the request lines.

The exporter's log follower reads these lines as it reads the real server's.
"""

from __future__ import annotations

from pathlib import Path

from model.geometry import geometry_from_gguf
from simulator.llamacpp.payloads import LlamaCppSim, request_ms
from simulator.model import MIB, Request


def _mapped_span(sim: LlamaCppSim) -> int | None:
    """llama.cpp's `CPU_Mapped` size with routed experts on the host: with mmap it maps the
    file span from the token embedding to the last host expert tensor, the attention
    weights of those layers included (issue 27). None without experts on the host or a
    GGUF file to measure it on."""
    layers = sim.engine.host_expert_layers
    path = Path(sim.model_path)
    if not layers or not path.is_file():
        return None
    spans = geometry_from_gguf(path).host_mapped_bytes_by_layers
    return spans[layers] if layers < len(spans) else None


def line(t: float, level: str, text: str) -> str:
    """One line at simulated time `t` seconds."""
    us = int(t * 1e6)
    minutes, rest = divmod(us, 60_000_000)
    secs, rest = divmod(rest, 1_000_000)
    ms, us_part = divmod(rest, 1000)
    return f"{minutes}.{secs:02d}.{ms:03d}.{us_part:03d} {level} {text}\n"


def startup(sim: LlamaCppSim) -> None:
    """What llama-server logs while it loads the model, up to `listening on`."""
    e = sim.engine
    gpu_layers = e.gpu_layers
    total = e.n_layers_total
    sim.log("I", f"srv    load_model: loading model '{sim.model_name}'")
    _model_info(sim)
    sim.log("I", "load_tensors: offloading output layer to GPU") if gpu_layers else None
    sim.log("I", f"load_tensors: offloading {max(0, gpu_layers - 1)} repeating layers to GPU")
    sim.log("I", f"load_tensors: offloaded {gpu_layers}/{total} layers to GPU")
    if e.host_expert_layers:
        sim.log(
            "W",
            "llama_model_loader: tensor overrides to CPU are used with mmap enabled - "
            "consider using --load-mode none for better performance",
        )
    if e.weights_cpu or e.model.token_embd_bytes:
        # the token embedding stays on the host (tied: the output projection's copy)
        cpu = e.weights_cpu + (e.model.token_embd_bytes or e.model.output_bytes)
        cpu = _mapped_span(sim) or cpu
        sim.log("I", f"load_tensors: {'CPU_Mapped':>12s} model buffer size = {cpu / MIB:8.2f} MiB")
    sim.log("I", f"load_tensors: {'CUDA0':>12s} model buffer size = {e.weights_gpu / MIB:8.2f} MiB")
    _kv_cache(sim)
    sim.log(
        "I",
        f"sched_reserve: {'CUDA0':>10s} compute buffer size = "
        f"{e.params.compute_buffer_bytes / MIB:8.2f} MiB",
    )
    if e.params.spec_draft_max > 0:
        _draft_load(sim)
    unified = "true" if e.params.kv_unified else "false"
    sim.log(
        "I",
        f"srv    load_model: initializing, n_slots = {len(e.slots)}, "
        f"n_ctx_slot = {e.n_ctx_slot}, kv_unified = '{unified}'",
    )
    if e.params.spec_draft_max > 0:
        sim.log("I", "srv    load_model: speculative decoding context initialized")
    sim.log("I", "srv  llama_server: model loaded")
    sim.log("I", f"srv  llama_server: listening on http://{sim.opts.host}:{sim.opts.port}")


def _model_info(sim: LlamaCppSim) -> None:
    m = sim.opts.scenario.model
    if m.expert_count:
        sim.log("I", f"print_info: n_expert              = {m.expert_count}")
        sim.log("I", f"print_info: n_expert_used         = {m.expert_used}")


def _draft_load(sim: LlamaCppSim) -> None:
    """The draft model loads after the target's context, with buffers of its own."""
    p = sim.engine.params
    draft = f"{sim.model_path}-draft"
    sim.log("I", f"common_speculative_init_result: loading draft model '{draft}'")
    weights = p.draft_bytes / MIB
    sim.log("I", f"load_tensors: {'CUDA0':>12s} model buffer size = {weights:8.2f} MiB")
    draft_kv = p.ctx_total * p.draft_kv_bytes_per_token
    sim.log("I", f"llama_kv_cache: {'CUDA0':>10s} KV buffer size = {draft_kv / MIB:8.2f} MiB")


def _kv_cache(sim: LlamaCppSim) -> None:
    """The KV cache lines of llama_kv_cache's constructor (types as -ctk/-ctv set them)."""
    e, p = sim.engine, sim.engine.params
    if "q" in p.cache_type_v:
        sim.log(
            "I",
            "llama_init_from_model: enabling flash_attn since it is required for quantized V cache",
        )
    kv = e.kv_pool_bytes
    if e.kv_gpu_share < 1:
        kv_cpu = kv * (1 - e.kv_gpu_share) / MIB
        sim.log("I", f"llama_kv_cache: {'CPU':>10s} KV buffer size = {kv_cpu:8.2f} MiB")
    sim.log(
        "I",
        f"llama_kv_cache: {'CUDA0':>10s} KV buffer size = {kv * e.kv_gpu_share / MIB:8.2f} MiB",
    )
    k_bytes, v_bytes = e.kv_type_bytes
    k_mib = kv * k_bytes / (k_bytes + v_bytes) / MIB
    n_stream = 1 if p.kv_unified else p.n_slots
    cells = p.ctx_total // n_stream
    sim.log(
        "I",
        f"llama_kv_cache: size = {kv / MIB:7.2f} MiB ({cells:6d} cells, "
        f"{e.model.n_layer:3d} layers, {n_stream:2d}/{n_stream} seqs), "
        f"K ({p.cache_type_k}): {k_mib:7.2f} MiB, V ({p.cache_type_v}): "
        f"{kv / MIB - k_mib:7.2f} MiB",
    )


def release(sim: LlamaCppSim, req: Request) -> None:
    """The timing lines of a finished request and its slot's release."""
    prompt_ms, predicted_ms = request_ms(req)
    n_prompt = req.uncached
    n_gen = len(req.generated)
    slot, task = req.slot, req.id
    pre = f"slot print_timing: id {slot:2d} | task {task} | "
    pps = n_prompt / prompt_ms * 1e3 if prompt_ms else 0.0
    ppt = prompt_ms / n_prompt if n_prompt else 0.0
    gps = (n_gen - 1) / predicted_ms * 1e3 if predicted_ms and n_gen > 1 else 0.0
    gpt = predicted_ms / (n_gen - 1) if n_gen > 1 else 0.0
    sim.log(
        "I",
        pre + f"prompt eval time = {prompt_ms:10.2f} ms / {n_prompt:5d} tokens "
        f"({ppt:8.2f} ms per token, {pps:8.2f} tokens per second)",
    )
    sim.log(
        "I",
        pre + f"       eval time = {predicted_ms:10.2f} ms / {n_gen:5d} tokens "
        f"({gpt:8.2f} ms per token, {gps:8.2f} tokens per second)",
    )
    sim.log(
        "I",
        pre + f"      total time = {prompt_ms + predicted_ms:10.2f} ms / "
        f"{n_prompt + n_gen:5d} tokens",
    )
    if req.draft_accepted:  # the real server prints nothing when no draft token was kept
        acc = req.draft_accepted / req.draft_n if req.draft_n else 0.0
        mean_len = 1 + req.draft_accepted / req.n_drafts
        sim.log(
            "I",
            pre + f"draft acceptance = {acc:.5f} ({req.draft_accepted:5d} accepted / "
            f"{req.draft_n:5d} generated), mean len = {mean_len:5.2f}",
        )
    sim.log(
        "I",
        f"slot      release: id {slot:2d} | task {task} | stop processing: "
        f"n_tokens = {req.n_tokens - 1}, truncated = {int(req.truncated)}",
    )
