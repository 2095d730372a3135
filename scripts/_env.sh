# Sourced by scripts/docs and scripts/test: make (once) and enter the project's virtual environment.
# Idempotent: reinstalls only when pyproject.toml changes. KVREF_VENV overrides the location.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVREF_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.kvref-installed"
# pip, one line a package as it goes (a first install takes minutes), minus this machine's notices about local
# package folders that do not exist.
pip_quiet() {
  "$VENV/bin/pip" --disable-pip-version-check "$@" --progress-bar off 2>&1 \
    | { grep -E "^(Collecting|Installing collected|Successfully installed|ERROR|error)" | grep -v "^WARNING: Location" || true; }
  return "${PIPESTATUS[0]}"
}
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "setup: installing kvref and its dev extra into $VENV (first run takes a few minutes)"
  # Install torch first and alone: a CPU build (2.13.0 lies on these machines' disk). Left to resolve
  # `torch>=2.4` by itself, pip would fetch a multi-GB CUDA build.
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    pip_quiet install "${KVREF_TORCH:-torch==2.13.0}"
  fi
  pip_quiet install -e "$ROOT[dev]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
