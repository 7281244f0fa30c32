#!/usr/bin/env bash
# The main job: set up .venv on first use, then run a master and the workers of workers.txt on
# this host until CartPole-v1 (or --env ENV_ID) is solved, showing progress and writing
# runs/latest/rewards.png.
# Extra arguments go to a3c-train (scripts/run_local.py; see --help), e.g. --config run.toml.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup_venv.sh plot
exec .venv/bin/python scripts/run_local.py "$@"
