#!/usr/bin/env bash
# Make .venv and install the project into it; does nothing when it is already up to date.
# Usage: scripts/setup_venv.sh [extra,...]   (e.g. "plot" or "dev")
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
echo "[setup] installing torch 2.13.0 (CPU) and the project [$extras] into .venv (first run only)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$root/scripts/constraints.txt" "torch==2.13.0"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$root/scripts/constraints.txt" -e "$root[$extras]"
touch "$stamp"
