#!/usr/bin/env bash
# Set up .venv with the development tools on first use, then lint and run the whole test suite.
# Extra arguments go to pytest, e.g. ./scripts/test.sh -k wire -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup_venv.sh dev
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
