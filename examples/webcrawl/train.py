"""Train WebCrawl-v0 with a3c-http's Python API, then watch the trained crawler.

    python examples/webcrawl/train.py                      # a master and 2 workers on this host
    python examples/webcrawl/train.py --master http://10.0.0.10:33333   # on a running cluster

Run from anywhere: Python puts this script's folder on sys.path, so `webcrawl` imports here, and
`a3c_http.train` gives the processes it starts the same folder (PYTHONPATH) and allows the module
(A3C_ENV_MODULES). With --master, every host of that cluster must have the package (pip install
examples/webcrawl, or the image extended with it) and list it in A3C_ENV_MODULES.

Exit code: 0 when the run was solved (trained to a mean return of 3.25, past the environment's
threshold of 3.0) and the policy plays at that threshold: the mean return of --episodes episodes,
played as the run was judged (PPO's policy as it samples), within two standard errors of it or
above.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import gymnasium as gym
import webcrawl

import a3c_http


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="local workers (2)")
    parser.add_argument("--master", default=None, help="a running master's URL (A3C_TOKEN)")
    parser.add_argument("--seed", type=int, default=None, help="the run's seed")
    parser.add_argument("--episodes", type=int, default=20, help="episodes to play (20)")
    args = parser.parse_args(argv)
    # The mean of the last 100 episodes first reaches a target on a lucky window: a run stopped
    # right at the threshold (3.0) leaves a crawler that plays at about 2.8. Training on to 3.25
    # (a second or two more here) leaves one that plays at the threshold.
    config = {"target_return": 3.25}
    if args.seed is not None:
        config["seed"] = args.seed

    # "webcrawl:WebCrawl-v0": importing webcrawl registers WebCrawl-v0 (passing the module
    # itself, a3c_http.train(webcrawl, ...), names the same environment).
    try:
        run = a3c_http.train(
            f"webcrawl:{webcrawl.ENV_ID}",
            config=config,
            workers=args.workers,
            master=args.master,
            timeout_s=300,
        )
    except a3c_http.TrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'solved' if run.solved else 'NOT solved'}: run {run.id}, folder {run.folder}")

    # The trained crawler, on new sites: raw observations in, a link out. (Later, elsewhere:
    # a3c_http.load_policy(folder, env_modules=["webcrawl"]).)
    policy = run.policy()
    env = policy.make_env(render_mode="ansi")
    obs, _ = env.reset(seed=0)
    state, done, total = None, False, 0.0
    while not done:
        print(env.render(), end="")
        action, state = policy.act(obs, state)
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        done = terminated or truncated
    print(f"found {info['found']} on-topic pages, return {total:.1f}")
    env.close()

    returns = policy.play(args.episodes, seed=1)
    threshold = gym.spec(webcrawl.ENV_ID).reward_threshold
    mean = statistics.fmean(returns)
    error = statistics.stdev(returns) / len(returns) ** 0.5 if len(returns) > 1 else 0.0
    print(f"mean return over {args.episodes} episodes: {mean:.2f} +- {error:.2f} (threshold "
          f"{threshold})")
    return 0 if run.solved and mean + 2 * error >= threshold else 1


if __name__ == "__main__":
    sys.exit(main())
