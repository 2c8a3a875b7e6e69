#!/usr/bin/env bash
# Every GPU run of docs/results/h200-moe.md and h200-sglang-vs-llamacpp.md in one detached
# pipeline, started by `bash bench/gpu_device.sh start` from a copy of the repo in
# $LLMB_GPU_WORK/repo; `bash bench/gpu_device.sh follow S` hands each finished run to $OUT.
# Models are written while llama-server builds; the GPU runs then follow back to back, each
# under its own time limit, and a failed run does not stop the next one.
#
# Runs (folders under $W/res, each packed to $W/out/NAME.tar.xz when done):
#   moe-diagnose      Qwen3-30B-A3B shape Q8_0: diagnose at concurrency 1, 4, 16
#   moe-ncpumoe       the same with --n-cpu-moe 24 (experts of 24 layers in host memory), -lv 5
#   dense-kvq8        Gemma-3-27B shape Q4_0 with -ctk q8_0 -ctv q8_0 at 8192 and 32768
#   sglang-vs-llama   Qwen2-0.5B shape, the same bf16 weights on SGLang 0.5.11 and llama-server
#   gptoss-diagnose   gpt-oss-20b shape (MXFP4 experts): diagnose at concurrency 1, 4, 16
#   dense-spec        Gemma-3-27B shape Q4_0 with a Gemma-3-270M-shape draft (-md)
#   seed-27b-bf16     Gemma-3-27B shape in 16 bits: SGLang (bf16, dummy weights) vs llama.cpp (f16)
# LLMB_RUNS picks some (default: all but seed-27b-bf16).
set -uo pipefail
ONLY=${LLMB_RUNS:-moe-diagnose moe-ncpumoe dense-kvq8 sglang-vs-llama gptoss-diagnose dense-spec}
# W, R, SERVER, SYNTH, M, RES, O, PY, LLAMA_SRC and the helpers (log, wanted, wait_build,
# sglang_env, sample, nvml, pack, stop_port, run_loadgen).
# shellcheck source=bench/gpu_lib.sh
source bench/gpu_lib.sh

llama_cfg() {
  # config.yaml for one llama-server engine: name, model, port, extra flags, launch context.
  cat <<YAML
engines:
  - name: $1
    kind: llamacpp
    url: "http://127.0.0.1:$3"
    model_path: "$2"
    launch:
      command: "$SERVER -m {model} -c {ctx} -np {parallel} -ngl 999 $4 --port {port} --metrics -lv ${6:-4} --log-file {log}"
      settle_seconds: 5
      ready_timeout_seconds: 900
      defaults: {ctx: $5}
gpu: {sample_interval_seconds: 0.1, peak_window_seconds: 10}
YAML
}

diagnose_llama() {
  # diagnose_llama NAME LIMIT_S ENGINE ARGS...: diagnose of the engine in $RES/NAME/config.yaml
  # (425-token prompts, 5 s settle, ARGS for the rest), samplers beside it, then packed.
  local name=$1 limit=$2 engine=$3 d=$RES/$1
  shift 3
  run_loadgen "$name" "$limit" 8090 -- diagnose --config "$d/config.yaml" --engine "$engine" \
    --out "$d/report" --prompt-tokens 425 --settle 5 "$@"
  pack "$name"
}

diagnose_default() {
  # diagnose_default NAME LIMIT_S ENGINE MODEL HEADER: the model at its default flags through
  # diagnose at concurrency 1, 4, 16 (3 rounds, 16384 context), its GGUF header beside it.
  local d=$RES/$1
  mkdir -p "$d"
  $PY bench/gguf_header.py "$4" "$d/$5"
  llama_cfg "$3" "$4" 8090 "" 16384 >"$d/config.yaml"
  diagnose_llama "$1" "$2" "$3" --concurrency 1,4,16 --max-tokens 128 --rounds 3 --contexts 16384
}

compare_sglang_llama() {
  # compare_sglang_llama NAME HF_DIR GGUF SGLANG_PRE SGLANG_CUDA_GRAPH MEM_FRACTION ARGS...:
  # SGLang on HF_DIR (port 30000) against llama-server on GGUF (port 8091), the same 256-token
  # prompts at concurrency 1, 4, 16, 64 (ARGS for the rest), samplers beside it, then packed.
  local d=$RES/$1
  cat >"$d/config.yaml" <<YAML
engines:
  - name: sglang
    kind: sglang
    url: "http://127.0.0.1:30000"
    model_path: "$2"
    launch:
      command: "$PY -m sglang.launch_server --model-path {model} $4--host 127.0.0.1 --port {port} --enable-metrics --attention-backend triton --sampling-backend pytorch --grammar-backend none $5 --mem-fraction-static $6 --context-length {ctx} --log-level info"
      settle_seconds: 10
      ready_timeout_seconds: 600
  - name: llama
    kind: llamacpp
    url: "http://127.0.0.1:8091"
    model_path: "$3"
    launch:
      command: "$SERVER -m {model} -c {ctx} -np {parallel} -ngl 999 --port {port} --metrics -lv 4 --log-file {log}"
      settle_seconds: 5
      ready_timeout_seconds: 600
gpu: {sample_interval_seconds: 0.1, peak_window_seconds: 10}
YAML
  run_loadgen "$1" 560 "30000 8091" -- compare --config "$d/config.yaml" \
    --engine sglang --engine llama --out "$d/report" --concurrency 1,4,16,64 \
    --prompt-tokens 256 --kv-prompt-tokens 0 --parallel 64 --settle 10 "${@:7}"
  pack "$1"
}

# --- models, written while llama-server builds -------------------------------------------------
MOE=$M/qwen3-30b-a3b-q8_0.gguf
OSS=$M/gpt-oss-20b.gguf
DENSE=$M/gemma3-27b-q4_0.gguf
DRAFT=$M/gemma3-270m-q8_0.gguf
HF=$M/qwen2-0.5b-bf16
HFG=$M/qwen2-0.5b-bf16.gguf
log "work $W, llama.cpp $LLAMA_SRC, runs: $ONLY"
df -h "$W" | tail -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
MOE_PID=
if wanted moe-diagnose || wanted moe-ncpumoe; then
  (
    $PY "${SYNTH[@]}" --like qwen3-30b-a3b --type q8_0 --out "$MOE" && log "MoE model written"
  ) >"$W/model-moe.log" 2>&1 &
  MOE_PID=$!
fi
write_dense() {
  $PY "${SYNTH[@]}" --like gemma3-27b --type q4_0 --tokenizer-from .gpu/gemma3-tokenizer.gguf \
    --out "$DENSE" &&
    $PY "${SYNTH[@]}" --like gemma3-270m --type q8_0 --tokenizer-from .gpu/gemma3-tokenizer.gguf \
      --out "$DRAFT" && log "dense models written"
}
# The MoE (32.5 GB) and the dense pair (15.5 GB) at once only where the disk holds both.
AVAIL=$(df -P -B1 "$W" | awk 'NR==2 {print $4}')
DENSE_PID=
NEED_DENSE=
if wanted dense-kvq8 || wanted dense-spec; then NEED_DENSE=1; fi
if [ -n "$NEED_DENSE" ] && [ "$AVAIL" -gt 56000000000 ]; then
  write_dense >"$W/model-dense.log" 2>&1 &
  DENSE_PID=$!
fi
SGL_CG="--disable-cuda-graph --disable-piecewise-cuda-graph"
if wanted sglang-vs-llama; then
  (
    sglang_env
    D=$RES/sglang-vs-llama && mkdir -p "$D/probe"
    $PY bench/hf_qwen2_model.py "$HF" .sgl/tiny-tokenizer --size 0.5b &&
      $PY bench/hf_to_gguf.py "$LLAMA_SRC" --pre gpt-2 -- "$HF" --outtype bf16 --outfile "$HFG" &&
      log "same-weights models written"
    # Probe: does SGLang start here with CUDA graphs? (Also builds its JIT kernels once.)
    timeout 400 $PY -m sglang.launch_server --model-path "$HF" --host 127.0.0.1 --port 30100 \
      --enable-metrics --attention-backend triton --sampling-backend pytorch --grammar-backend none \
      --cuda-graph-max-bs 64 --disable-piecewise-cuda-graph --mem-fraction-static 0.3 \
      --context-length 8192 --log-level info >"$D/probe/server.log" 2>&1 &
    sp=$!
    ok=0
    for _ in $(seq 1 380); do
      if $PY - "$D/probe/completion.json" "$HF" <<'PY' 2>/dev/null; then
import json, sys, httpx
r = httpx.post("http://127.0.0.1:30100/v1/completions", timeout=20, json={
    "model": sys.argv[2], "prompt": "probe", "max_tokens": 16, "ignore_eos": True})
open(sys.argv[1], "w").write(r.text)
sys.exit(0 if r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16 else 1)
PY
        ok=1
        break
      fi
      kill -0 $sp 2>/dev/null || break
      sleep 1
    done
    kill $sp 2>/dev/null
    sleep 5
    kill -9 $sp 2>/dev/null
    echo $ok >"$W/sglang-cuda-graph.ok"
    log "SGLang probe with CUDA graphs: ok=$ok"
  ) >"$W/sglang-prep.log" 2>&1 &
  SGL_PID=$!
fi

# --- the build ------------------------------------------------------------------------------------
if ! wait_build pack; then
  touch "$W/pipeline.done"
  exit 1
fi

# --- 1. MoE at concurrency 1, 4, 16 ----------------------------------------------------------------
[ -n "$MOE_PID" ] && wait $MOE_PID && log "$(tail -2 "$W/model-moe.log" | tr '\n' ' ')"
if wanted moe-diagnose; then
  diagnose_default moe-diagnose 420 moe "$MOE" qwen3-30b-a3b-q8_0.header.gguf
fi

# --- 2. expert offload: --n-cpu-moe 24 ---------------------------------------------------------------
if wanted moe-ncpumoe; then
  D=$RES/moe-ncpumoe && mkdir -p "$D"
  llama_cfg moe_ncpumoe24 "$MOE" 8090 "--n-cpu-moe 24" 8192 5 >"$D/config.yaml"
  diagnose_llama moe-ncpumoe 300 moe_ncpumoe24 --concurrency 1,4 --max-tokens 64 --rounds 1 \
    --contexts 8192 --kv-prompt-tokens 0
fi
rm -f "$MOE"
# gpt-oss (and the dense pair if it had to wait) now that the disk has room again.
[ -n "$DENSE_PID" ] || [ -z "$NEED_DENSE" ] || write_dense >"$W/model-dense.log" 2>&1
OSS_PID=
if wanted gptoss-diagnose; then
  (
    $PY "${SYNTH[@]}" --like gpt-oss-20b --type q8_0 --out "$OSS" && log "gpt-oss model written"
  ) >"$W/model-oss.log" 2>&1 &
  OSS_PID=$!
fi

# --- 3. quantized KV on a dense model ----------------------------------------------------------------
[ -n "$DENSE_PID" ] && wait $DENSE_PID
[ -n "$NEED_DENSE" ] && log "$(tail -1 "$W/model-dense.log")"
if wanted dense-kvq8; then
  D=$RES/dense-kvq8 && mkdir -p "$D"
  $PY bench/gguf_header.py "$DENSE" "$D/gemma3-27b-q4_0.header.gguf"
  llama_cfg dense_kvq8 "$DENSE" 8090 "-ctk q8_0 -ctv q8_0 -fa on" 8192 >"$D/config.yaml"
  diagnose_llama dense-kvq8 240 dense_kvq8 --concurrency 1,4 --max-tokens 128 --rounds 1 \
    --contexts 8192,32768
fi

# --- 4. SGLang against llama.cpp on the same bf16 weights --------------------------------------------
if wanted sglang-vs-llama; then
  wait $SGL_PID
  log "$(grep '^==' "$W/sglang-prep.log" | tr '\n' ' ')"
  D=$RES/sglang-vs-llama
  cp "$W/sglang-prep.log" "$D/probe/" 2>/dev/null
  [ "$(cat "$W/sglang-cuda-graph.ok" 2>/dev/null)" = 1 ] && SGL_CG="--cuda-graph-max-bs 64 --disable-piecewise-cuda-graph"
  $PY bench/gguf_header.py "$HFG" "$D/qwen2-0.5b-bf16.header.gguf"
  cp "$HF/config.json" "$D/hf-config.json"
  sglang_env
  compare_sglang_llama sglang-vs-llama "$HF" "$HFG" "" "${SGL_CG:-}" 0.3 \
    --max-tokens 128 --rounds 2 --contexts 65536,131072
fi

# --- 5. gpt-oss-20b at concurrency 1, 4, 16 -----------------------------------------------------------
[ -n "$OSS_PID" ] && wait $OSS_PID && log "$(tail -1 "$W/model-oss.log")"
if wanted gptoss-diagnose; then
  diagnose_default gptoss-diagnose 300 gptoss "$OSS" gpt-oss-20b.header.gguf
fi

# --- 6. speculative decoding with a draft model --------------------------------------------------------
if wanted dense-spec; then
  D=$RES/dense-spec && mkdir -p "$D"
  $PY bench/gguf_header.py "$DRAFT" "$D/gemma3-270m-q8_0.header.gguf"
  llama_cfg dense_spec "$DENSE" 8090 "-md $DRAFT --spec-type draft-simple -ngld 999" 8192 >"$D/config.yaml"
  diagnose_llama dense-spec 240 dense_spec --concurrency 1,4 --max-tokens 128 --rounds 1 \
    --contexts 8192 --kv-prompt-tokens 0
fi
# --- 7. the seed's case: a 27B-class model in 16 bits on both engines -----------------------------------
if wanted seed-27b-bf16; then
  D=$RES/seed-27b-bf16 && mkdir -p "$D"
  G16=$M/gemma3-27b-f16.gguf
  HF27=$M/gemma3-27b-bf16-config
  rm -f "$OSS" "$DENSE" "$DRAFT"
  # The same tokenizer on both engines (the bench BPE, from the same-weights GGUF), so that
  # both count the same prompt tokens; llama.cpp pads its vocabulary to the shape's 262144 rows.
  $PY "${SYNTH[@]}" --like gemma3-27b --type f16 --tokenizer-from .gpu/qwen2-0.5b-bf16.header.gguf \
    --out "$G16" >"$W/model-g16.log" 2>&1 && log "$(tail -1 "$W/model-g16.log")"
  $PY bench/gguf_header.py "$G16" "$D/gemma3-27b-f16.header.gguf"
  $PY bench/hf_gemma3_config.py "$HF27" .gpu/tiny-tokenizer && cp "$HF27/config.json" "$D/hf-config.json"
  for _ in $(seq 1 600); do [ -f "$W/site/.sglang" ] && break; sleep 1; done
  sglang_env
  compare_sglang_llama seed-27b-bf16 "$HF27" "$G16" "--load-format dummy " \
    "--cuda-graph-max-bs 64 --disable-piecewise-cuda-graph" 0.85 \
    --max-tokens 96 --rounds 1 --contexts 131072
fi
log "pipeline done"
touch "$W/pipeline.done"
