#!/usr/bin/env bash
# Make .venv and install the project into it; does nothing when it is already up to date.
# Usage: scripts/setup_venv.sh [extra,...]   (e.g. "plot", "dev", "box2d" or "bench")
# TORCH_INDEX_URL, when set, is the package index torch comes from, e.g. PyTorch's CPU-only
# builds: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu (on a plain index, torch 2.13.0
# for Linux brings its CUDA packages, gigabytes a CPU-only host never uses).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-plot}"
venv="$root/.venv"
stamp="$venv/.a3c-installed-$extras"
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating $venv"
    "$py" -m venv "$venv"
fi
# Reinstall when pyproject.toml changed since the last install of these extras.
if [ -f "$stamp" ] && [ "$stamp" -nt "$root/pyproject.toml" ]; then
    exit 0
fi
from="${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
echo "[setup] installing torch 2.13.0$from and the project [$extras] into .venv (first run only)"
# The dev tools bring about 10,000 modules that pip would compile one by one (about 45 s of a
# fresh clone's set-up); scripts/test.sh lets Python write the bytecode of those the tests import
# as they import them instead.
compile=()
case ",$extras," in *,dev,*) compile=(--no-compile) ;; esac
pip_install() {
    # This machine's pip config names index folders that may not exist; its warnings are noise.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        ${compile[@]+"${compile[@]}"} -c "$root/scripts/constraints.txt" "$@" 2>&1 \
        | { grep -v "is ignored: it is neither" || true; }
}
# torch first where it comes from an index of its own; otherwise the constraints file pins it
# and one install brings it with the rest (one resolution: about 10 s less on a fresh clone).
torch=("torch==2.13.0")
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    pip_install --index-url "$TORCH_INDEX_URL" "torch==2.13.0"
    torch=()
fi
case ",$extras," in
    *,box2d,*|*,bench,*)
        # box2d-py has no wheel: its build needs swig on PATH, from the venv.
        pip_install swig
        export PATH="$venv/bin:$PATH" ;;
esac
pip_install ${torch[@]+"${torch[@]}"} -e "$root[$extras]"
touch "$stamp"
