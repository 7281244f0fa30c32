"""Plot a run's episode returns: `python scripts/plot_rewards.py [RUN_DIR] [--out FILE]`.

Reads the run folder RUN_DIR (default runs/latest) and writes RUN_DIR/rewards.png: every episode's
return, the mean of the last 100 and the target return when the run had one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from a3c_http.store import RunStore  # noqa: E402


def plot(run_dir: Path, out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    store = RunStore(run_dir)
    rows = store.read_episodes()
    if not rows:
        raise SystemExit(f"no episodes in the run folder {run_dir}: nothing to plot")
    saved = store.load()
    config = saved.config if saved else {}
    episodes = [r["global_episode"] for r in rows]
    rewards = [r["reward"] for r in rows]
    window, mean100 = [], []
    for r in rewards:
        window.append(r)
        if len(window) > 100:
            window.pop(0)
        mean100.append(sum(window) / len(window))

    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    ax.scatter(episodes, rewards, s=3, alpha=0.3, color="tab:blue", label="episode return")
    ax.plot(episodes, mean100, color="tab:orange", linewidth=2, label="mean of the last 100")
    target = config.get("target_return")
    if target is not None:
        ax.axhline(target, color="tab:green", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("global episode")
    ax.set_ylabel("return")
    title = config.get("env_id", "")
    ax.set_title(f"{title} — {config.get('sync_mode', '')} — run {config.get('run_id', '')}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    out = Path(out) if out else run_dir / "rewards.png"
    fig.savefig(out)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", default="runs/latest", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(plot(args.run_dir, args.out))


if __name__ == "__main__":
    main()
