"""`a3c-plot [RUN_DIR ...] [--out FILE]`: plot runs' returns (needs matplotlib, the `plot` extra).

One run folder (default runs/latest): every episode's return, the mean of the last 100, each
worker's own mean of its last 100, the evaluations of the global weights (mean and spread) when
the run had any, and the target return; written to RUN_DIR/rewards.png. Several run folders: each
run's mean of the last 100 in one figure, to compare them; written to the first one's
compare.png. The x axis is env steps (of reported episodes), the measure runs are compared by.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict, deque
from itertools import accumulate
from pathlib import Path

from a3c_http.algos.registry import DEFAULT_ALGO, upgrade
from a3c_http.store.runstore import RunStore

INSTALL = (
    "the reward plot needs matplotlib, the plot extra: pip install 'a3c-http[plot]' (in a "
    "checkout: ./scripts/setup_venv.sh plot)"
)


class PlotError(Exception):
    """No plot: matplotlib is not installed, or a run folder holds no episodes (the message says
    which)."""


def _mean_last(values: list[float], n: int = 100) -> list[float]:
    window: deque[float] = deque(maxlen=n)
    out = []
    for v in values:
        window.append(v)
        out.append(sum(window) / len(window))
    return out


def _read(run_dir: Path) -> tuple[list[dict], list[dict], dict]:
    store = RunStore(run_dir)
    rows = store.read_episodes()
    if not rows:
        raise PlotError(f"no episodes in the run folder {run_dir}: nothing to plot")
    saved = store.load()
    return rows, store.read_evaluations(), (saved.config if saved else {})


def plot(run_dirs: Path | list[Path], out: Path | None = None) -> Path:
    try:
        import matplotlib
    except ImportError:
        raise PlotError(INSTALL) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dirs = [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(d) for d in run_dirs]
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    targets = set()
    for run_dir in dirs:
        rows, evaluations, config = _read(run_dir)
        steps = list(accumulate(r["length"] for r in rows))
        rewards = [r["reward"] for r in rows]
        if config.get("target_return") is not None:
            targets.add(config["target_return"])
        if len(dirs) > 1:
            label = f"{run_dir.name} ({config.get('env_id', '')}, run {config.get('run_id', '')})"
            ax.plot(steps, _mean_last(rewards), linewidth=2, label=label)
            continue
        ax.scatter(steps, rewards, s=3, alpha=0.25, color="tab:blue", label="episode return")
        by_worker: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
        for step, row in zip(steps, rows, strict=True):
            by_worker[row["worker_id"]][0].append(step)
            by_worker[row["worker_id"]][1].append(row["reward"])
        for worker_id, (xs, ys) in sorted(by_worker.items()):
            ax.plot(xs, _mean_last(ys), linewidth=0.8, alpha=0.8, label=f"{worker_id}, last 100")
        ax.plot(steps, _mean_last(rewards), color="black", linewidth=2, label="all, last 100")
        if evaluations:
            ax.errorbar(
                [e["global_steps"] for e in evaluations],
                [e["mean_return"] for e in evaluations],
                yerr=[e["std_return"] for e in evaluations],
                fmt="o", color="tab:red", capsize=3, label="evaluation (greedy)",
            )
        algo = upgrade(config)[0].get("algo", DEFAULT_ALGO)  # a run of before: its sync_mode's
        title = f"{config.get('env_id', '')} — {algo}"
        ax.set_title(f"{title} — run {config.get('run_id', '')}")
    for target in sorted(targets):
        ax.axhline(target, color="tab:green", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("env steps (of reported episodes)")
    ax.set_ylabel("return")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    default = "rewards.png" if len(dirs) == 1 else "compare.png"
    out = Path(out) if out else dirs[0] / default
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="a3c-plot", description="Plot runs' returns (needs matplotlib, the plot extra)."
    )
    parser.add_argument("run_dirs", nargs="*", type=Path, help="run folders (runs/latest)")
    parser.add_argument("--out", type=Path, default=None, help="the image to write")
    args = parser.parse_args(argv)
    try:
        print(plot(args.run_dirs or [Path("runs/latest")], args.out))
    except PlotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
