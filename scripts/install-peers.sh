#!/usr/bin/env bash
# The peer load generators bench/loadgen_peers.py compares llmb-loadgen with: AIPerf 0.13.0 and
# inference-perf 0.7.0, each in its own Python 3.12 venv in the user's cache folder
# (${XDG_CACHE_HOME:-~/.cache}/llm-bottleneck/peers/, override with LLMB_PEERS_DIR), never in
# the project's venv.
#
#   scripts/install-peers.sh [PROJECT_PYTHON]
#
# - Pinned: scripts/peers/<name>-requirements.txt is each peer's whole closure (--no-deps).
#   About 1.2 GB together (pyarrow, pandas, scipy, ...): a few minutes the first time, a
#   second afterwards (a stamp per venv).
# - Offline (a machine without network): LLMB_PEERS_WHEELS=DIR installs from a wheelhouse made
#   elsewhere with `python bench/peer_venvs.py download DIR`.
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT_PY=${1:-${VENV:-.venv}/bin/python}
PY312_WHY="inference-perf 0.7.0 requires Python >= 3.12"
# shellcheck source=scripts/python312.sh
source scripts/python312.sh

require_project_python "$PROJECT_PY"
PY312=$(find_python312)
ARGS=(install --python "$PY312")
if [ -n "${LLMB_PEERS_WHEELS:-}" ]; then
  ARGS+=(--no-index --find-links "$LLMB_PEERS_WHEELS")
fi
"$PROJECT_PY" bench/peer_venvs.py "${ARGS[@]}"
