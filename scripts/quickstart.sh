#!/usr/bin/env bash
# The main job: set up .venv on first use, then run a master and the workers of workers.txt on
# this host until CartPole-v1 (or --env ENV_ID) is solved, showing progress and writing
# runs/latest/rewards.png.
# Extra arguments go to a3c-train (scripts/run_local.py; see --help), e.g. --config run.toml.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup_venv.sh plot
# Python's bytecode cache, even where the environment turns it off: a .venv that test.sh set up
# holds its dev tools uncompiled, and every process would otherwise compile what it imports.
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python scripts/run_local.py "$@"
