"""The main job on one host: a master and the workers of workers.txt, training until the run
finishes, with progress on screen and a reward plot at the end.

    python scripts/run_local.py [--env Acrobot-v1] [--port 33333] [--time-cap 840]
        [--config '{"lr": 0.001}']

Exit code: 0 when the run was solved (mean return of the last 100 episodes >= target_return),
1 when it finished unsolved or hit the time cap, 2 when it could not start. Every process it
started is ended, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from a3c_http.edge import is_loopback  # noqa: E402
from a3c_http.localcluster import LocalCluster  # noqa: E402
from master.launcher import WorkerListError, read_workers_file  # noqa: E402
from scripts.plot_rewards import plot  # noqa: E402


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def progress_line(status: dict, previous: dict | None) -> str:
    """One line of progress; the rate is measured between this status and the previous one."""
    rate = 0.0
    if previous is not None:
        dt = status["elapsed_s"] - previous["elapsed_s"]
        if dt > 0:
            rate = (status["global_steps"] - previous["global_steps"]) / dt
    workers = status.get("workers", [])
    states: dict[str, int] = {}
    for w in workers:
        states[w["state"]] = states.get(w["state"], 0) + 1
    ws = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none"
    return (
        f"[{status['elapsed_s']:6.0f} s] episodes {status['global_episode']:>6}  "
        f"steps {status['global_steps']:>9,}  mean100 {_fmt(status['mean_return_100']):>6}  "
        f"best {_fmt(status['best_score'], '.0f'):>4}  env steps/s {rate:>7,.0f}  "
        f"updates {status['updates_applied']:>6}  workers: {ws}"
    )


def refusal(reply: httpx.Response) -> str:
    """The line to print when POST /train started no run: the master's `detail`, readable."""
    try:
        detail = reply.json().get("detail")
    except ValueError:
        detail = None
    if not isinstance(detail, str):
        return f"error: POST /train answered {reply.status_code}: {reply.text}"
    if reply.status_code == 422:
        return f"error: the master refused the config: {detail}"
    return f"error: {detail}"


def resume_note(status: dict) -> str | None:
    """One line when the master could not resume the run in its folder: the new run this script
    starts moves that run to the archive."""
    problem = status.get("resume_error")
    if not problem:
        return None
    return f"note: {problem['error']} (the new run starts now)"


class Stopped(Exception):
    pass


def _on_signal(signum, frame):  # noqa: ANN001
    raise Stopped(signal.Signals(signum).name)


def main() -> int:
    parser = argparse.ArgumentParser(description="Run a master and the local workers until solved.")
    parser.add_argument("--host", default="127.0.0.1", help="master bind address")
    parser.add_argument("--port", type=int, default=33333, help="master port")
    parser.add_argument(
        "--workers-file", type=Path, default=Path(os.environ.get("A3C_WORKERS_FILE", "workers.txt"))
    )
    parser.add_argument(
        "--run-dir", type=Path, default=Path(os.environ.get("A3C_RUN_DIR", "runs/latest"))
    )
    parser.add_argument(
        "--time-cap",
        type=float,
        default=840.0,
        help="seconds of training before the run is stopped (default 840)",
    )
    parser.add_argument(
        "--env",
        default=None,
        help="the gymnasium environment to train (default CartPole-v1); its preset "
        "(a3c_http/presets.py) fills what --config does not give",
    )
    parser.add_argument(
        "--config", default="{}", help="training config overrides as JSON, e.g. '{\"seed\": 1}'"
    )
    parser.add_argument("--every", type=float, default=5.0, help="seconds between progress lines")
    args = parser.parse_args()

    try:
        overrides = json.loads(args.config)
        if not isinstance(overrides, dict):
            raise ValueError("not a JSON object")
        if args.env:
            overrides["env_id"] = args.env
        urls = read_workers_file(args.workers_file)
    except (ValueError, WorkerListError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    logs = args.run_dir.parent / "logs"
    token = os.environ.get("A3C_TOKEN") or None
    local: list[tuple[str, int]] = []
    for url in urls:
        parts = urlsplit(url)
        if is_loopback(parts.hostname):
            local.append((parts.hostname, parts.port))
        else:
            print(f"note: {url} is not on this host; it must already be running there")
    cluster = LocalCluster(
        args.run_dir,
        logs,
        local,
        master_port=args.port,
        host=args.host,
        token=token,
        workers_file=args.workers_file,
    )
    busy = cluster.busy_ports()
    if busy:
        print(
            f"error: port already in use: {', '.join(busy)} (another run? stop it, or change "
            "the ports in workers.txt / --port)",
            file=sys.stderr,
        )
        return 2

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    solved = False
    try:
        print(
            f"starting the master on {cluster.master.url} and {len(local)} local worker(s); "
            f"logs in {logs}/"
        )
        cluster.start()
        note = resume_note(cluster.status())
        if note:
            print(note)
        reply = cluster.train(**overrides)
        if reply.status_code == 409:
            # The run folder holds a run left running (an earlier quickstart was killed): the
            # master resumed it; end it (it is archived) and start the new one.
            print(f"note: {reply.json()['detail']}; stopping that run and starting a new one")
            cluster.http.post(f"{cluster.master.url}/stop", json={})
            reply = cluster.train(**overrides)
        if reply.status_code != 202:
            print(refusal(reply), file=sys.stderr)
            return 2
        data = reply.json()["data"]
        print(f"run {data['run_id']} started; run folder {args.run_dir}")
        print(f"dashboard: {cluster.master.url}/ (open it in a browser to watch the run)")
        for w in data["workers"]:
            print(
                f"  {w['worker_id']} {w['url']}: "
                + ("started" if w["started"] else f"NOT started: {w['error']}")
            )
        started = time.monotonic()
        status = cluster.status()
        previous = status
        # On a terminal the progress line is rewritten in place; into a file, one line each time.
        in_place = sys.stdout.isatty()
        while status["state"] == "running":
            if time.monotonic() - started > args.time_cap:
                print(f"\ntime cap of {args.time_cap:.0f} s reached: stopping the run")
                cluster.http.post(f"{cluster.master.url}/stop", json={})
                break
            time.sleep(args.every)  # the pace of the progress line, not a synchronisation
            status = cluster.status()
            line = progress_line(status, previous)
            print(f"\r\033[K{line}" if in_place else line, end="" if in_place else "\n", flush=True)
            previous = status
        if in_place:
            print()
        status = cluster.status()
        solved = bool(status["solved"])
        print(f"run finished: {status.get('finish_reason')}")
        print(
            f"  episodes {status['global_episode']}, env steps {status['global_steps']:,}, "
            f"mean return of the last 100: {_fmt(status['mean_return_100'])}, "
            f"time {status['elapsed_s']:.0f} s"
        )
    except Stopped as exc:
        print(f"\n{exc}: stopping every process this script started")
    except (httpx.HTTPError, RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if cluster.master.running():
            # Leave the run folder finished, not "running" for the next master to resume.
            with contextlib.suppress(httpx.HTTPError):
                cluster.http.post(f"{cluster.master.url}/stop", json={}, timeout=10)
        cluster.close()
    try:
        print(f"reward plot: {plot(args.run_dir)}")
    except SystemExit as exc:
        print(f"no plot: {exc}")
    print(f"watch it play: .venv/bin/python scripts/evaluate.py {args.run_dir} --episodes 10")
    print("SOLVED" if solved else "not solved")
    return 0 if solved else 1


if __name__ == "__main__":
    sys.exit(main())
