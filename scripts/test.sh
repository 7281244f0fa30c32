#!/usr/bin/env bash
# Set up .venv with the development tools on first use, then lint and run the whole test suite.
# Extra arguments go to pytest, e.g. ./scripts/test.sh -k wire -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup_venv.sh dev
# Python's own bytecode cache (__pycache__/, ignored by git), even where the environment turns it
# off: the suite starts hundreds of Python processes, each of which would otherwise compile this
# project's modules again (about 3 s of the unit tests alone on a 2-core machine).
unset PYTHONDONTWRITEBYTECODE
.venv/bin/ruff check .
# Every core runs tests (pytest-xdist; each test takes its own free loopback ports and folders),
# a free core taking the next test as it finishes. `-n 0` among the arguments runs them in one process.
exec .venv/bin/python -m pytest -n auto --dist worksteal "$@"
