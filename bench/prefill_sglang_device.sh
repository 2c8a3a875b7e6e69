#!/usr/bin/env bash
# Issue 27 device run, SGLang half: SGLang 0.5.11 on one H200, a Qwen2-7B-shape model with
# random bf16 weights (--load-format dummy), long prompts of 8192 and 32768 tokens one at a
# time; records each request's client TTFT, meta_info, SGLang's /metrics before and after,
# and the card's clocks. Run from a folder holding sglang-site.tar.xz (the wheels of the
# SGLang-on-GPU bundle installed with pip --target, sglang-kernel trimmed), model/ (config.json
# and tokenizer) and prefill_sglang_requests.py.
set -uo pipefail
H=$(pwd); WORK=${TMPDIR:-/tmp}/llmb-prefill-sglang; SITE=$WORK/site; mkdir -p "$SITE"
export PYTHONUNBUFFERED=1 PYTHONPATH=$SITE TVM_FFI_CACHE_DIR=$WORK/tvm MAX_JOBS=16
PY=/opt/torch/.venv/bin/python3; [ -x "$PY" ] || PY=python3
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit \
  --format=csv | tee "$OUT/gpu.csv"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE >"$OUT/smi-idle.txt"
"$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
  sglang-site.tar.xz "$SITE" || exit 1
# The JIT kernels need the CUDA toolkit's root; nvcc may be a wrapper elsewhere.
for c in /usr/local/cuda /usr/local/cuda-13*; do
  [ -x "$c/bin/nvcc" ] && [ -f "$c/include/cuda_runtime.h" ] && { export CUDA_HOME=$c; break; }
done
: "${CUDA_HOME:=/usr/local/cuda}"; export CUDA_HOME
if [ ! -e "$CUDA_HOME/lib64/libcudart.so" ]; then  # tvm-ffi links -L$CUDA_HOME/lib64 -lcudart
  S=$WORK/cuda; mkdir -p $S/lib64
  for d in "$CUDA_HOME"/*; do [ "$(basename "$d")" = lib64 ] || ln -sfn "$d" $S/; done
  for f in "$CUDA_HOME"/lib64/*; do ln -sfn "$f" $S/lib64/; done
  RT=$(ls "$CUDA_HOME"/lib64/libcudart.so.1* "$("$PY" -c 'import nvidia; print(list(nvidia.__path__)[0])')"/cu13/lib/libcudart.so.13 2>/dev/null | head -1)
  ln -sfn "$RT" $S/lib64/libcudart.so; export CUDA_HOME=$S
fi
export PATH=$(dirname "$PY"):${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
ARGS=(--model-path "$H/model" --load-format dummy --served-model-name qwen2-7b-shape-random
  --host 127.0.0.1 --port 30000 --enable-metrics --attention-backend triton
  --sampling-backend pytorch --grammar-backend none --disable-cuda-graph
  --disable-piecewise-cuda-graph --mem-fraction-static 0.5 --context-length 40960
  --dtype bfloat16 --log-level info)
echo "$PY -m sglang.launch_server ${ARGS[*]}" | tee "$OUT/command.txt"
"$PY" -m sglang.launch_server "${ARGS[@]}" >"$OUT/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 360); do
  curl -sf -m 5 localhost:30000/server_info >/dev/null && break
  kill -0 $SERVER 2>/dev/null || break; sleep 1
done
"$PY" prefill_sglang_requests.py http://127.0.0.1:30000 "$OUT/prefill.json" || tail -60 "$OUT/server.log"
curl -s localhost:30000/metrics >"$OUT/metrics.txt"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE >"$OUT/smi-after.txt"
kill $SERVER; sleep 3; kill -9 $SERVER 2>/dev/null
echo "done at $SECONDS s"
