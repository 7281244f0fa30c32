"""`a3c-train`: the main job. On this host: a master and the workers of workers.txt, training until
the run finishes, with progress on screen and a reward plot at the end. With `--master URL`: a run
on a master that is already running (and its workers, listed there or joining by themselves),
followed the same way.

    a3c-train [--env Acrobot-v1] [--config run.toml] [--port 33333] [--time-cap 840]
    a3c-train --master http://10.0.0.10:33333 --config run.toml
    a3c-train --master http://10.0.0.10:33333 --follow
    a3c-train --env Acrobot-v1 --print-config > run.toml

The run's config: the defaults, under them the preset of its env_id, then each --config in turn
(a .toml or .json file, a run folder's config.json, or an inline JSON object; a later one's fields
replace an earlier one's), then --env, which replaces env_id alone. The master validates it.

With `--master`, a master that goes away (killed, restarted) is waited for up to
`--reconnect-s` seconds, with a line saying so, and the run followed again once the master has
resumed it. `--follow` starts nothing: it follows the run the master runs now (one started
elsewhere, or resumed), and leaves it running when interrupted.

Exit code: 0 when the run was solved (mean return of the last 100 episodes >= target_return),
1 when it finished unsolved, hit the time cap, lost its master or was interrupted, 2 when no run
started (a bad config, a master that refused it or could not be reached, nothing to follow: one
line that says what is wrong). Every process it started is ended, also on Ctrl-C; a run on
another master that it started is stopped then (POST /stop).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from a3c_http.algos.registry import train_config
from a3c_http.cli.progress import RECONNECT_S, Stopped, follow, start_run
from a3c_http.cli.remote import on_master
from a3c_http.config import files as configfile
from a3c_http.config.ending import how_it_ends
from a3c_http.config.workerlist import WorkerListError, read_workers_file
from a3c_http.local.cluster import LocalCluster
from a3c_http.server.edge import is_loopback
from a3c_http.server.service import describe_error

# Without a workers file: what the checkout's workers.txt lists.
DEFAULT_WORKERS = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
# The time cap of a run on this host, the quickstart's (CartPole-v1 solves in 7 to 12 s).
LOCAL_TIME_CAP_S = 840.0


def _on_signal(signum, frame):  # noqa: ANN001
    raise Stopped(signal.Signals(signum).name)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="a3c-train",
        description="Train until the run finishes: a master and the local workers of "
        "workers.txt, or a run on a running master (--master).",
    )
    p.add_argument(
        "--env",
        default=None,
        help="the gymnasium environment to train (default CartPole-v1); its preset "
        "(a3c_http/config/presets.py) fills what the config does not give. Replaces the env_id of "
        "--config and nothing else",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE|JSON",
        help="training config fields: a .toml or .json file (a run folder's config.json too) "
        "or a JSON object, e.g. '{\"seed\": 1}'; repeated, later ones win field by field",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the full config the run would get (defaults, preset, --config, --env) as "
        "TOML that --config reads, and exit",
    )
    p.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="start the run on this running master (token: A3C_TOKEN) instead of starting a "
        "master and workers here",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="with --master: start nothing, follow the run the master runs now (started "
        "elsewhere, or resumed) until it ends; Ctrl-C leaves it running",
    )
    p.add_argument(
        "--reconnect-s",
        type=float,
        default=RECONNECT_S,
        help=f"with --master: how long to wait for a master that cannot be reached (killed, "
        f"restarted) before giving the run up (default {RECONNECT_S:.0f})",
    )
    p.add_argument(
        "--time-cap",
        type=float,
        default=None,
        help=f"seconds of training before the run is stopped (default {LOCAL_TIME_CAP_S:.0f}; "
        "none with --master: the run's max_steps or max_episodes end it)",
    )
    p.add_argument("--every", type=float, default=5.0, help="seconds between progress lines")
    here = p.add_argument_group("a run on this host (without --master)")
    here.add_argument("--host", default="127.0.0.1", help="master bind address")
    here.add_argument("--port", type=int, default=33333, help="master port")
    here.add_argument(
        "--workers-file",
        type=Path,
        default=None,
        help="the workers (default $A3C_WORKERS_FILE, else workers.txt; without either, two "
        "workers on 127.0.0.1:8001 and :8002)",
    )
    here.add_argument(
        "--run-dir", type=Path, default=Path(os.environ.get("A3C_RUN_DIR", "runs/latest"))
    )
    return p


def run_config(sources: list[str], env: str | None) -> dict[str, Any]:
    """The body of POST /train: each --config in turn, then --env."""
    body: dict[str, Any] = {}
    for source in sources:
        body.update(configfile.load(source))
    if env:
        body["env_id"] = env
    return body


def printed_config(body: dict[str, Any]) -> str:
    """The full config the master would run `body` with, as TOML (with its `workers` and
    `master_url`, if it gives them). An unset seed stays unset: the master draws one per run."""
    fields = {k: v for k, v in body.items() if k not in configfile.BODY_FIELDS}
    try:
        config = train_config(fields)
        config = config.resolved().model_copy(update={"seed": config.seed})
    except ValidationError as exc:
        raise ValueError("; ".join(describe_error(e, "config") for e in exc.errors())) from None
    header = (
        f"a3c-train's config for {config.env_id}, every field "
        '(docs/configuration.md: "Training config").\n'
        "Run it with: a3c-train --config FILE"
    )
    if config.seed is None:
        header += "\nNo seed: each run draws its own (seed = N repeats a run)."
    header += f"\nThis run {how_it_ends(config)}."
    extra = {k: body[k] for k in configfile.BODY_FIELDS if body.get(k) is not None}
    return configfile.config_toml(config, header, extra)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        body = run_config(args.config, args.env)
        if args.print_config:
            print(printed_config(body), end="")
            return 0
    except (ValueError, configfile.TomlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    before = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    if args.follow and (not args.master or body or args.time_cap is not None):
        why = (
            "needs --master URL" if not args.master
            else "takes no --config, --env or --time-cap"
        )  # fmt: skip
        print(f"error: --follow {why}: it follows the run a master runs", file=sys.stderr)
        return 2
    try:
        if args.master:
            return on_master(
                args.master, None if args.follow else body, args.time_cap, args.every,
                reconnect_s=args.reconnect_s,
            )  # fmt: skip
        time_cap = LOCAL_TIME_CAP_S if args.time_cap is None else args.time_cap
        return on_this_host(args, body, time_cap)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _workers(workers_file: Path | None) -> tuple[list[str], Path | None]:
    """The worker URLs and the file the master reads them from (None: LocalCluster writes one)."""
    named = workers_file or (
        Path(os.environ["A3C_WORKERS_FILE"]) if os.environ.get("A3C_WORKERS_FILE") else None
    )
    if named is None and not Path("workers.txt").exists():
        print("note: no workers.txt here: two workers on 127.0.0.1:8001 and :8002")
        return DEFAULT_WORKERS, None
    path = named or Path("workers.txt")
    return read_workers_file(path), path


def on_this_host(args: argparse.Namespace, body: dict[str, Any], time_cap: float) -> int:
    """A master and the local workers of the workers file, a run, its progress, a plot."""
    try:
        urls, workers_file = _workers(args.workers_file)
    except WorkerListError as exc:
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
        workers_file=workers_file,
    )
    busy = cluster.busy_ports()
    if busy:
        print(
            f"error: port already in use: {', '.join(busy)} (another run? stop it, or change "
            "the ports in workers.txt / --port)",
            file=sys.stderr,
        )
        return 2
    data = None
    solved = False
    try:
        print(
            f"starting the master on {cluster.master.url} and {len(local)} local worker(s); "
            f"logs in {logs}/"
        )
        cluster.start()
        data = start_run(cluster.http, cluster.master.url, body, replace_running=True)
        if data is None:
            return 2  # the reason is printed; `finally` ends the processes
        print(f"run folder {args.run_dir}")
        # The master is this command's: one that died does not come back.
        status = follow(
            cluster.http, cluster.master.url, data["run_id"], time_cap, args.every, reconnect_s=0
        )
        solved = bool(status["solved"])
    except Stopped as exc:
        print(f"\n{exc}: stopping every process this command started")
    except (httpx.HTTPError, RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if cluster.master.running():
            # Leave the run folder finished, not "running" for the next master to resume.
            with contextlib.suppress(httpx.HTTPError):
                cluster.http.post(f"{cluster.master.url}/stop", json={}, timeout=10)
        cluster.close()
    if data is None:  # interrupted, or the master or a worker did not come up
        return 2
    from a3c_http.cli.plot import PlotError, plot

    try:
        print(f"reward plot: {plot(args.run_dir)}")
    except PlotError as exc:
        print(f"no plot: {exc}")
    env_id = str(body.get("env_id", ""))
    print(f"watch it play: {evaluate_command(env_id)} {args.run_dir} --episodes 10")
    print("SOLVED" if solved else "not solved")
    return 0 if solved else 1


def evaluate_command(env_id: str = "") -> str:
    """How to run a3c-evaluate here: by name where it is on PATH, else the one beside this
    Python (a venv not activated), else the checkout's script; for an environment of a module
    of the user's (`module:Name-v0`), with the variables that make it importable and allowed
    here, as this run had them."""
    beside = Path(sys.executable).parent / "a3c-evaluate"
    if not beside.exists():
        command = f"{_shown(Path(sys.executable))} scripts/evaluate.py"
    elif shutil.which("a3c-evaluate") == str(beside):
        command = "a3c-evaluate"
    else:
        command = _shown(beside)
    if ":" not in env_id:
        return command
    names = ("A3C_ENV_MODULES", "PYTHONPATH")
    given = [f"{n}={shlex.quote(os.environ[n])}" for n in names if os.environ.get(n)]
    return " ".join([*given, command])


def _shown(path: Path) -> str:
    """`path` relative to the current directory when it lies below it."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)
