"""The benchmarks, one command. Without a command: every figure of the cluster's performance bar,
section by section (scripts/benchlib/bar.py); with one, that benchmark:

    .venv/bin/python scripts/bench.py [--sections throughput,master,latency,wire,solve] [--quick]
    .venv/bin/python scripts/bench.py scale [--workers 1,2,4,8] [--pin] [--quick] ...
    .venv/bin/python scripts/bench.py learn [--tasks CartPole-v1,Acrobot-v1] [--seeds 3] ...
    .venv/bin/python scripts/bench.py solve [--runs 3] [--workers 2] ...
    .venv/bin/python scripts/bench.py staleness [--workers 1,2,4,8,16] [--lags 1,2] ...
    .venv/bin/python scripts/bench.py http [--n 300]
    .venv/bin/python scripts/bench.py push_body [--workers 16] [--rounds 3]
    .venv/bin/python scripts/bench.py tls [--workers 16] [--rounds 3]
    .venv/bin/python scripts/bench.py ingest [--algo impala] [--env MinAtar/Breakout-v1] ...
    .venv/bin/python scripts/bench.py path [--algos ppo,apex]

`scripts/bench.py COMMAND --help` gives each one's options. The code is scripts/benchlib/, one
module per concern; this file only finds it and hands the arguments on.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the one place: scripts.benchlib and the project's packages

# command -> (its module in scripts/benchlib/, what it measures)
COMMANDS = {
    "scale": ("scale", "how the cluster scales with its number of workers on one host"),
    "learn": ("learn", "env steps and wall time to each task's target against SB3's A2C"),
    "solve": ("solve", "time to solve CartPole-v1, where the workers spend their time"),
    "staleness": ("staleness", "what the staleness of W workers does to learning, in one process"),
    "http": ("exchanges", "latency of a worker's exchanges next to the compute they wrap"),
    "push_body": ("push_body", "the master's CPU a push by who wrote its body: a worker or not"),
    "tls": ("tls_cost", "what TLS and mutual TLS cost the master: pushes/s and CPU a push"),
    "ingest": ("ingest", "the master's and the learner's CPU per 1,000 env steps of rollouts"),
    "path": ("path", "the project's files on the path of one experience push and update"),
    "load": ("actors", "many simulated actors against one master: rates, latency, CPU, counts"),
    "capacity": ("capacity", "actors a core of the master and of the learner serves, by model"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = Path(__file__).name
    if argv and argv[0] in COMMANDS:
        module = importlib.import_module(f"scripts.benchlib.{COMMANDS[argv[0]][0]}")
        return module.main(argv[1:], prog=f"{prog} {argv[0]}")
    if argv and not argv[0].startswith("-"):
        print(f"{prog}: unknown command {argv[0]!r}; known: {', '.join(COMMANDS)} (or none: "
              "the bar's sections, --help)", file=sys.stderr)
        return 2
    from scripts.benchlib import bar

    epilog = (f"or {prog} COMMAND [options] (COMMAND --help for its options), one of: "
              + "; ".join(f"{name}: {what}" for name, (_, what) in COMMANDS.items()))
    return bar.main(argv, prog=prog, epilog=epilog)


if __name__ == "__main__":
    sys.exit(main())
