# Sourced by scripts/install-sglang.sh and scripts/install-peers.sh: find_python312 prints a
# working Python 3.12 (LLMB_PYTHON312, else `pyenv prefix 3.12`, else python3.12 on PATH) or
# dies saying what was tried; die and require_project_python are shared by both installers.
die() {
  echo "$(basename "$0" .sh): $*" >&2
  exit 1
}

require_project_python() {
  [ -x "$1" ] || die "project Python $1 not found (run scripts/install.sh first)"
}

find_python312() {
  local candidate prefix
  if [ -n "${LLMB_PYTHON312:-}" ]; then
    candidate=$LLMB_PYTHON312
  elif command -v pyenv >/dev/null && prefix=$(pyenv prefix 3.12 2>/dev/null); then
    candidate=$prefix/bin/python3.12
  elif command -v python3.12 >/dev/null; then
    candidate=$(command -v python3.12)
  else
    die "no Python 3.12 found (tried LLMB_PYTHON312, 'pyenv prefix 3.12', python3.12 on PATH); $PY312_WHY: install Python 3.12 (e.g. 'pyenv install 3.12')"
  fi
  "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' 2>/dev/null ||
    die "$candidate is not a working Python 3.12"
  echo "$candidate"
}
