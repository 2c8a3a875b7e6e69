#!/usr/bin/env bash
# The device runs of issues 32 (item 6) and 33 in one detached pipeline, engines started by hand
# and attached the way a user would (`llmb-loadgen diagnose|compare --url ... --log-file ...
# --model-path ...`). Started from a copy of the repo by bench/gpu_device.sh; each finished run
# comes back as NAME.tar.xz through `follow`. On the GPU machine (carry .gpu and .sgl):
#   LLMB_PIPELINE=bench/gpu_issue32_33.sh bash bench/gpu_device.sh start && bash bench/gpu_device.sh follow 500
#   bash bench/gpu_device.sh follow 560          # again, back to back, until "pipeline done"
# Models are written while llama-server builds; the runs then follow in this order, each under
# its own time limit, and a failed run does not stop the next one:
#   same-weights    33: two llama-servers, one Gemma-3-1B-shape Q8_0 model, identical flags:
#                   compare at c=1,4,16, 3 rounds -> `stay` at every load
#   np1-np16        33: the same model on a 1-slot and a 16-slot llama-server: compare at c=1,16,
#                   3 rounds -> switch to np16 at c=16, `stay` at c=1
#   f16-prefill     32.6a: Gemma-3-27B shape in F16 (54 GB), 8192-token prompts at c=1 and 4 ->
#                   a prefill verdict, not card_throttled; nvidia-smi clocks, power, reasons and
#                   limits every 0.5 s, the engine's own `prompt eval time` lines
#   sglang-prefill  32.6c: SGLang 0.5.11, Qwen2-7B shape (bf16, dummy weights), 8192-token prompts
#                   at c=1 and 4: its prefill efficiency and TTFT split from its own figures
#   moe-offload     32.6b: Qwen3-30B-A3B shape Q8_0 with --n-cpu-moe 24 (-lv 5): the host bound
#                   beside the measured decode
# LLMB_RUNS picks some (default: all). Flags that only the merged code has go in through
# LLMB_DIAG_EXTRA (every diagnose/compare) and LLMB_MOE_EXTRA (moe-offload only), e.g.
# LLMB_MOE_EXTRA="--host-bandwidth-gbs 40". Local dry runs (CPU): LLMB_SERVER=a CPU llama-server,
# LLMB_SYNTH_EXTRA="--layers 1", LLMB_F16_LIKE=gemma3-270m, LLMB_LONG_PROMPT=1024,
# LLMB_MAX_TOKENS=8, LLMB_SGLANG_PY/LLMB_SGLANG_SIZE/LLMB_SGLANG_FLAGS for a CPU SGLang.
set -uo pipefail
ONLY=${LLMB_RUNS:-same-weights np1-np16 f16-prefill sglang-prefill moe-offload}
# shellcheck source=bench/gpu_lib.sh
source bench/gpu_lib.sh
SGL_PY=${LLMB_SGLANG_PY:-$PY}
LONG=${LLMB_LONG_PROMPT:-8192}
# Word-split on purpose: extra flags.
# shellcheck disable=SC2206
DIAG_EXTRA=(${LLMB_DIAG_EXTRA:-})
# shellcheck disable=SC2206
MOE_EXTRA=(${LLMB_MOE_EXTRA:-})
# The device's SGLang flags (Triton attention: FA3 was trimmed from the carried sgl_kernel);
# a CPU SGLang takes --device cpu instead.
# shellcheck disable=SC2206
SGL_FLAGS=(${LLMB_SGLANG_FLAGS:---attention-backend triton --disable-piecewise-cuda-graph --mem-fraction-static 0.5})
# The Gemma 3 tokenizer travels xz-compressed (1.2 MiB instead of 6.2).
TOK=.gpu/gemma3-tokenizer.gguf
if [ ! -f "$TOK" ] && [ -f "$TOK.xz" ]; then
  TOK=$W/gemma3-tokenizer.gguf
  xz -dc .gpu/gemma3-tokenizer.gguf.xz >"$TOK"
fi
SMALL=$M/gemma3-1b-q8_0.gguf
F16=$M/gemma3-27b-f16.gguf
MOE=$M/qwen3-30b-a3b-q8_0.gguf
HF7=$M/qwen2-7b-shape
LOCAL=http://127.0.0.1

max_tokens() { echo "${LLMB_MAX_TOKENS:-$1}"; }

llama_up() {
  # llama_up RUN PORT MODEL FLAGS...: llama-server started by hand in its own session, its log
  # (-lv 4 unless FLAGS say otherwise) and its command line in the run's folder.
  local d=$RES/$1 port=$2 model=$3
  shift 3
  local cmd=("$SERVER" -m "$model" --port "$port" "$@" --metrics --log-file "$d/llama-$port.log")
  [[ " $* " == *" -lv "* ]] || cmd+=(-lv 4)
  echo "${cmd[*]}" >>"$d/commands.txt"
  setsid "${cmd[@]}" >"$d/llama-$port.out" 2>&1 </dev/null &
}

ready() {
  # ready URL LIMIT_S: until /v1/models answers and a 4-token completion comes back (SGLang's
  # warm-up included); what came back is kept in the run's folder.
  $PY - "$@" <<'PY'
import sys, time, httpx
url, limit = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + limit
while time.monotonic() < end:
    try:
        model = httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]
        r = httpx.post(url + "/v1/completions", timeout=60, json={
            "model": model, "prompt": "ready", "max_tokens": 4, "ignore_eos": True})
        if r.status_code == 200:
            print(f"{url} ready: {model}")
            sys.exit(0)
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        pass
    time.sleep(2)
print(f"{url} not ready within {limit:.0f} s")
sys.exit(1)
PY
}

up_or_log() {
  # up_or_log RUN URL LIMIT_S PORT: ready, or the server's last lines in the pipeline log.
  ready "$2" "$3" && return 0
  tail -20 "$RES/$1/llama-$4.out" "$RES/$1/server.log" 2>/dev/null
  return 1
}

header() {
  # The GGUF header (model/gguf_header.py re-reads it in CI) and the card beside a run.
  $PY bench/gguf_header.py "$1" "$RES/$2/$(basename "$1" .gguf).header.gguf"
  xz -f "$RES/$2/$(basename "$1" .gguf).header.gguf"
}

prefill_diagnose() {
  # prefill_diagnose RUN PORT KIND LOG MODEL: once the server is up, the long-prompt diagnose
  # of a prefill run (c=1 and 4, one round) into $D/report.
  if up_or_log "$1" "$LOCAL:$2" 420 "$2"; then
    run_loadgen "$1" 360 "$2" -- diagnose --url "$LOCAL:$2" --kind "$3" \
      --log-file "$4" --model-path "$5" --out "$D/report" \
      --concurrency 1,4 --prompt-tokens "$LONG" --max-tokens "$(max_tokens 64)" --rounds 1 \
      --kv-prompt-tokens 0 --settle 2 "${DIAG_EXTRA[@]}"
  fi
}

# --- models, written while llama-server builds -----------------------------------------------------
log "work $W, runs: $ONLY"
df -h "$W" | tail -1
nvidia-smi --query-gpu="$SMI_LIMITS" --format=csv,noheader 2>/dev/null
(
  if wanted same-weights || wanted np1-np16; then
    $PY "${SYNTH[@]}" --like "${LLMB_SMALL_LIKE:-gemma3-1b}" --type q8_0 --tokenizer-from "$TOK" \
      --out "$SMALL" && log "small model written"
  fi
  # 54 GB: only where the disk holds it beside the rest (else f16-prefill says so and is skipped).
  if wanted f16-prefill; then
    need=$($PY "${SYNTH[@]}" --like "${LLMB_F16_LIKE:-gemma3-27b}" --type f16 --dry-run 2>/dev/null |
      grep -oE '[0-9]{6,}' | sort -n | tail -1)
    avail=$(df -P -B1 "$M" | awk 'NR==2 {print $4}')
    log "F16 model needs ${need:-?} B, the disk has $avail B"
    if [ "${need:-0}" -gt 0 ] && [ "$avail" -gt $((need + 1500000000)) ]; then
      $PY "${SYNTH[@]}" --like "${LLMB_F16_LIKE:-gemma3-27b}" --type f16 --tokenizer-from "$TOK" \
        --out "$F16" && log "F16 model written"
    fi
  fi
  if wanted sglang-prefill; then
    $SGL_PY bench/hf_qwen2_model.py "$HF7" tests/fixtures/sglang-tiny-qwen2 --size "${LLMB_SGLANG_SIZE:-7b}" \
      --max-position 32768 --config-only && log "SGLang model config written"
  fi
) >"$W/models.log" 2>&1 &
MODELS_PID=$!
if ! wait_build; then
  touch "$W/pipeline.done"
  exit 1
fi
wait $MODELS_PID
grep '^==' "$W/models.log"

# --- 1. (33) two identical llama-servers: `stay` at every load -------------------------------------
if wanted same-weights; then
  D=$RES/same-weights && mkdir -p "$D"
  header "$SMALL" same-weights
  for p in 8090 8091; do llama_up same-weights $p "$SMALL" -c 16384 -np 16 -ngl 999; done
  if up_or_log same-weights $LOCAL:8090 300 8090 && up_or_log same-weights $LOCAL:8091 300 8091; then
    run_loadgen same-weights 300 "8090 8091" -- compare --url $LOCAL:8090 --url $LOCAL:8091 \
      --kind llamacpp --name llama_a --name llama_b --log-file "$D/llama-8090.log" \
      --log-file "$D/llama-8091.log" --model-path "$SMALL" --model-path "$SMALL" \
      --out "$D/report" --concurrency 1,4,16 --prompt-tokens 425 --max-tokens "$(max_tokens 128)" \
      --rounds 3 --kv-prompt-tokens 0 --settle 2 "${DIAG_EXTRA[@]}"
  fi
  stop_port 8090
  stop_port 8091
  pack same-weights
fi

# --- 2. (33) one model on a 1-slot and a 16-slot llama-server: switch at c=16, `stay` at c=1 -------
if wanted np1-np16; then
  D=$RES/np1-np16 && mkdir -p "$D"
  llama_up np1-np16 8090 "$SMALL" -c 4096 -np 1 -ngl 999
  llama_up np1-np16 8091 "$SMALL" -c 65536 -np 16 -ngl 999
  if up_or_log np1-np16 $LOCAL:8090 300 8090 && up_or_log np1-np16 $LOCAL:8091 300 8091; then
    run_loadgen np1-np16 300 "8090 8091" -- compare --url $LOCAL:8090 --url $LOCAL:8091 \
      --kind llamacpp --name np1 --name np16 --log-file "$D/llama-8090.log" \
      --log-file "$D/llama-8091.log" --model-path "$SMALL" --model-path "$SMALL" \
      --out "$D/report" --concurrency 1,16 --prompt-tokens 425 --max-tokens "$(max_tokens 128)" \
      --rounds 3 --kv-prompt-tokens 0 --settle 2 "${DIAG_EXTRA[@]}"
  fi
  stop_port 8090
  stop_port 8091
  pack np1-np16
fi
rm -f "$SMALL"

# --- 3. (32.6a) a 16-bit 27B dense model, long prompts: a prefill verdict, not card_throttled ------
if wanted f16-prefill; then
  D=$RES/f16-prefill && mkdir -p "$D"
  if [ -f "$F16" ]; then
    header "$F16" f16-prefill
    smi_state "$D/smi-before.txt"
    llama_up f16-prefill 8090 "$F16" -c 65536 -np 4 -ngl 999
    prefill_diagnose f16-prefill 8090 llamacpp "$D/llama-8090.log" "$F16"
    stop_port 8090
    smi_state "$D/smi-after.txt"
    # The engine's own prompt timings, beside the tool's answer.
    grep -E "prompt eval time|       eval time|total time" "$D/llama-8090.log" >"$D/prompt-timings.txt"
  else
    log "f16-prefill: no model ($(tail -2 "$W/models.log" | tr '\n' ' '))"
  fi
  pack f16-prefill
fi
rm -f "$F16"
MOE_PID=
if wanted moe-offload; then
  # 32.5 GB, written while SGLang runs (it needs no disk: dummy weights).
  $PY "${SYNTH[@]}" --like "${LLMB_MOE_LIKE:-qwen3-30b-a3b}" --type q8_0 --out "$MOE" \
    >"$W/model-moe.log" 2>&1 &
  MOE_PID=$!
fi

# --- 4. (32.6c) SGLang, long prompts: prefill efficiency and TTFT split from its own figures --------
if wanted sglang-prefill; then
  D=$RES/sglang-prefill && mkdir -p "$D"
  cp "$HF7/config.json" "$D/hf-config.json" 2>/dev/null
  for _ in $(seq 1 300); do [ -f "$W/site/.sglang" ] || [ -n "${LLMB_SGLANG_PY:-}" ] && break; sleep 1; done
  sglang_env
  smi_state "$D/smi-before.txt"
  # No CUDA graphs: they serve decode, and capturing them costs start-up time. Each finished
  # request's own queue, prefill and decode times go to the log (SGLang's figures, for the
  # write-up beside the tool's split).
  cmd=("$SGL_PY" -m sglang.launch_server --model-path "$HF7" --load-format dummy --port 30000
    --host 127.0.0.1 --enable-metrics --sampling-backend pytorch --grammar-backend none
    --disable-cuda-graph --context-length $((LONG * 2)) --log-level info
    --enable-request-time-stats-logging "${SGL_FLAGS[@]}")
  echo "${cmd[*]}" >>"$D/commands.txt"
  # SGLang's own packages only (the carried closure), not the project's.
  PYTHONPATH=$W/site setsid "${cmd[@]}" >"$D/server.log" 2>&1 </dev/null &
  prefill_diagnose sglang-prefill 30000 sglang "$D/server.log" "$HF7"
  stop_port 30000
  smi_state "$D/smi-after.txt"
  pack sglang-prefill
fi

# --- 5. (32.6b) expert offload: the measured host bound beside the measured decode ----------------
if wanted moe-offload; then
  D=$RES/moe-offload && mkdir -p "$D"
  wait $MOE_PID && log "MoE model written"
  if [ -f "$MOE" ]; then
    header "$MOE" moe-offload
    lscpu >"$D/lscpu.txt" 2>&1
    llama_up moe-offload 8090 "$MOE" -c 8192 -np 4 -ngl 999 --n-cpu-moe 24 -lv 5
    if up_or_log moe-offload $LOCAL:8090 420 8090; then
      run_loadgen moe-offload 300 8090 -- diagnose --url $LOCAL:8090 --kind llamacpp \
        --log-file "$D/llama-8090.log" --model-path "$MOE" --out "$D/report" \
        --concurrency 1,4 --prompt-tokens 425 --max-tokens "$(max_tokens 64)" --rounds 1 \
        --kv-prompt-tokens 0 --settle 2 "${DIAG_EXTRA[@]}" "${MOE_EXTRA[@]}"
    fi
    stop_port 8090
    grep -E "eval time" "$D/llama-8090.log" >"$D/prompt-timings.txt"
  else
    log "moe-offload: no model ($(tail -2 "$W/model-moe.log" | tr '\n' ' '))"
  fi
  pack moe-offload
fi
log "pipeline done"
touch "$W/pipeline.done"
