#!/usr/bin/env bash
# A real SGLang (0.5.11, CPU) for the system tests, in its own Python 3.12 venv.
#
#   scripts/install-sglang.sh [PROJECT_PYTHON]
#
# - The venv lives in the user's cache folder, outside the clone, so fresh clones on one machine
#   share it: ${XDG_CACHE_HOME:-~/.cache}/llm-bottleneck/sglang-0.5.11-py3.12 (override with
#   LLMB_SGLANG_VENV). `python -m tests.plugins.sglang --venv-dir` prints it; the tests read it
#   from the same place.
# - Pinned: scripts/sglang-requirements.txt is the whole closure (installed with --no-deps).
#   About 5 GB, mostly PyPI's torch 2.11.0 (the CUDA build, run on the CPU): ~3 min the first
#   time, seconds afterwards.
# - Idempotent: a stamp in the venv records the sha256 of the pins and the driver stub; when it
#   matches, nothing is done. When it does not (or an earlier run was interrupted), the venv is
#   rebuilt from scratch (pip's cache keeps the downloads).
# - Python 3.12 comes from LLMB_PYTHON312, else `pyenv prefix 3.12`, else python3.12 on PATH;
#   without one the install fails saying so (and so do the SGLang tests).
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT_PY=${1:-${VENV:-.venv}/bin/python}
LOCK=scripts/sglang-requirements.txt
STUB_SRC=scripts/cuda-driver-stub.c

PY312_WHY="SGLang 0.5.11 ships cp312 wheels only"
# shellcheck source=scripts/python312.sh
source scripts/python312.sh

require_project_python "$PROJECT_PY"
DEST=$("$PROJECT_PY" -m tests.plugins.sglang --venv-dir)
STAMP="$DEST/llmb-installed.sha256"
WANT=$(cat "$LOCK" "$STUB_SRC" | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$DEST/bin/python" -c 'import importlib.util as u; assert u.find_spec("sglang")' 2>/dev/null; then
  echo "==> SGLang venv up to date: $DEST"
  exit 0
fi

PY312=$(find_python312)
command -v cc >/dev/null || die "no C compiler (cc) to build the CPU-only CUDA driver stub"
echo "==> building the SGLang 0.5.11 venv at $DEST with $PY312 (first time: ~5 GB, a few minutes)"
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
"$PY312" -m venv "$DEST"
"$DEST/bin/python" -m pip install -q --upgrade pip
"$DEST/bin/python" -m pip install -q --no-deps -r "$LOCK"
mkdir -p "$DEST/lib/llmb-cuda-stub"
cc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$DEST/lib/llmb-cuda-stub/libcuda.so.1" "$STUB_SRC"
# Fail here, not in the tests, if the closure is incomplete.
SGLANG_USE_CPU_ENGINE=1 LD_LIBRARY_PATH="$DEST/lib/llmb-cuda-stub" \
  "$DEST/bin/python" -c 'import sglang.srt.entrypoints.http_server, sgl_kernel' 2>"$DEST/import-check.log" ||
  die "the SGLang import check failed, see $DEST/import-check.log"
echo "$WANT" >"$STAMP"
echo "==> SGLang $("$DEST/bin/python" -c 'import sglang; print(sglang.__version__)') ready ($(du -sh "$DEST" | cut -f1))"
