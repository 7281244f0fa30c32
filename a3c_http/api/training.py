"""Training from Python: `train(env, ...)` starts a run, on a cluster of this host that it starts
(a master and `workers` workers, uvicorn processes as a3c-train starts them) or on a running
master (`master=URL`), and returns it as a `Run` (a3c_http/api/run.py); `attach(URL)` returns the
run a running master runs now, started elsewhere, to follow.

Every HTTP client of the API is made by `_client`, and only there.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from a3c_http.algos.registry import LEGACY_FIELDS, owners, train_config
from a3c_http.api.environments import EnvChoice, EnvChoiceError, EnvLike, resolve
from a3c_http.api.errors import TrainError
from a3c_http.api.run import Progress, Run
from a3c_http.cli.progress import read_status, why_refused
from a3c_http.config.ending import how_it_ends
from a3c_http.config.files import BODY_FIELDS
from a3c_http.config.hints import unknown_field
from a3c_http.config.workerlist import WorkerListError, normalize_url
from a3c_http.envs.make import allow_modules, listed_modules
from a3c_http.local.cluster import LocalCluster, free_port
from a3c_http.net import tls
from a3c_http.server.service import describe_error

__all__ = ["attach", "train"]

# What the master says of a worker that did not answer POST /start_worker (master/background/
# launcher.py UNREACHABLE): a host that is down, not one that cannot train the run.
UNREACHABLE = "cannot reach the worker"
START_TIMEOUT_S = 120.0
# Variables of this process that would send the processes of a local cluster elsewhere.
NOT_INHERITED = ("A3C_MASTER_URL", "A3C_WORKER_URL", "A3C_WORKER_NAME")


def _client(url: str, token: str | None) -> httpx.Client:
    """The one place the API makes an HTTP client: to the master at `url`, with `token`, over
    TLS as this process's A3C_TLS_* say (a3c_http/net/tls.py: the peer verified against
    A3C_TLS_CA, this host's certificate presented under mutual TLS; an http:// URL refused while
    they are set)."""
    try:
        served = tls.current()
        served.require_https(url, "master")
    except tls.TLSError as exc:
        raise TrainError(str(exc)) from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(
        base_url=url, headers=headers, timeout=30.0, trust_env=False,
        verify=served.client_context(),
    )


def train(
    env: EnvLike,
    *,
    config: dict[str, Any] | None = None,
    workers: int = 2,
    master: str | None = None,
    token: str | None = None,
    run_dir: str | Path | None = None,
    env_modules: Iterable[str] = (),
    wait: bool = True,
    timeout_s: float | None = None,
    progress: Progress = True,
) -> Run:
    """Train `env` and return the run.

    `env`: a gymnasium id (`"CartPole-v1"`), `"module:Name-v0"` (importing `module` registers
    `Name-v0`), an entry point (a gymnasium.Env subclass or a function that makes one, at the top
    level of an importable module: it has no time limit and no reward_threshold, so give
    `target_return` or `max_steps`), or a module (or its name) that registers one environment.
    `config`: the fields of POST /train's body (docs/configuration.md), e.g. `{"seed": 1}`;
    `env_id` comes from `env`.

    Without `master`: starts a master and `workers` workers on this host (ports chosen free),
    with `run_dir` as the run folder (default `runs/<env>-<time>/`, its logs in `logs/` there),
    A3C_ENV_MODULES naming the environment's module and PYTHONPATH holding the folder it imports
    from here, and trains there; the config is checked here first. With `master` (a URL): starts
    the run on that running master and its workers (`token`, default A3C_TOKEN), whose hosts
    must import the environment's module and list it in A3C_ENV_MODULES; nothing starts here.

    `wait`: follow the run until it ends (`Run.wait`), then end the processes started here;
    `timeout_s` caps that: the run is stopped at the cap. Without `wait` the run goes on; end it
    with `Run.wait`, `Run.stop` or a `with` block. `progress`: see `Progress`.

    Raises TrainError (one line) for what the caller can mend: an environment no host can make,
    a config the master refuses (its 422), a master that cannot be reached or refuses the token,
    a worker that cannot train the run (e.g. cannot import the module), a run that every worker
    left with an error.
    """
    body = _body(config)
    token = token or os.environ.get("A3C_TOKEN") or None
    try:
        choice = resolve(env, env_modules, strict=master is None)
    except EnvChoiceError as exc:
        raise TrainError(str(exc)) from None
    body["env_id"] = choice.env_id
    if master is None:
        run = _train_here(choice, body, workers, token, run_dir, progress, wait, timeout_s)
    else:
        run = _train_on(master, choice, body, token, progress)
    if wait:
        never = "never ends by itself" in (run.ends or "")
        if never and timeout_s is None:
            run.close()
            raise TrainError(f"this run {run.ends}; or give train() a timeout_s", run)
        run._follow(timeout_s, stop_at_cap=True)
    return run


def _body(config: dict[str, Any] | None) -> dict[str, Any]:
    body = dict(config or {})
    known = [*owners(), *BODY_FIELDS, *LEGACY_FIELDS]
    unknown = [name for name in body if name not in known]
    if unknown:
        raise TrainError("config: " + "; ".join(unknown_field(n, known) for n in unknown))
    if "env_id" in body:
        raise TrainError("config: env_id is train's `env`, not a field of `config`")
    return body


def _train_here(
    choice: EnvChoice,
    body: dict[str, Any],
    workers: int,
    token: str | None,
    run_dir: str | Path | None,
    progress: Progress,
    wait: bool,
    timeout_s: float | None,
) -> Run:
    if workers < 1:
        raise TrainError(f"workers: at least 1 on this host, not {workers}")
    given = [name for name in BODY_FIELDS if name in body]
    if given:
        raise TrainError(
            f"config: {', '.join(given)} only with master=: here the workers are `workers` "
            "processes of this host"
        )
    allow_modules(choice.modules)
    try:  # said before any process starts, as the master would say it
        resolved = train_config(body).resolved()
    except ValidationError as exc:
        why = "; ".join(describe_error(e, "config") for e in exc.errors())
        raise TrainError(f"the config is refused: {why}") from None
    if wait and timeout_s is None and "never ends by itself" in how_it_ends(resolved):
        raise TrainError(f"this run {how_it_ends(resolved)}; or give train() a timeout_s")
    folder = Path(run_dir) if run_dir is not None else _new_folder(choice.env_id)
    cluster = LocalCluster(
        folder,
        folder.resolve() / "logs",
        [("127.0.0.1", free_port()) for _ in range(workers)],
        master_port=free_port(),
        token=token,
        env=_process_env(choice),
    )
    for process in cluster.processes:
        for name in NOT_INHERITED:
            process.env.pop(name, None)
    try:
        cluster.start(START_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as exc:
        cluster.close()
        first = str(exc).splitlines()[0]
        raise TrainError(
            f"the local cluster did not start: {first} (logs in {folder}/logs)"
        ) from None
    except BaseException:
        cluster.close()
        raise
    http = _client(cluster.master.url, token)
    try:
        data = _start(http, cluster.master.url, body, replace_running=True)
    except BaseException:
        http.close()
        cluster.close()
        raise
    return Run(http, cluster.master.url, data, choice.modules, progress, cluster)


def _new_folder(env_id: str) -> Path:
    """`runs/<env>-<time>`, a folder that does not exist yet."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", env_id.rpartition(":")[2]).strip("-") or "run"
    stem = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder, n = Path("runs") / stem, 1
    while folder.exists():
        n += 1
        folder = Path("runs") / f"{stem}-{n}"
    return folder


def _process_env(choice: EnvChoice) -> dict[str, str]:
    """A3C_ENV_MODULES and PYTHONPATH for the processes of a local cluster: the environment's
    modules allowed, the folders they import from here first (the processes run in another
    folder: relative entries of PYTHONPATH are made absolute)."""
    listed = listed_modules()
    inherited = [
        str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    modules = ",".join(dict.fromkeys([*listed, *choice.modules]))
    env = {"A3C_ENV_MODULES": modules} if modules else {}
    paths = list(dict.fromkeys([*choice.paths, *inherited]))
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def attach(
    master: str,
    *,
    token: str | None = None,
    env_modules: Iterable[str] = (),
    progress: Progress = True,
) -> Run:
    """The run the master at `master` (a URL) runs now, or its last one: started elsewhere (by
    a3c-train, curl or another process) or resumed after a restart, to follow (`Run.wait`), read
    (`status`, `history`, `policy`: `env_modules` as for `train`) and stop (`Run.stop`).
    Nothing starts, and nothing here stops it but `Run.stop`. TrainError when the master cannot
    be reached or has no run."""
    url = _master_url(master)
    http = _client(url, token or os.environ.get("A3C_TOKEN") or None)
    try:
        status = read_status(http)
    except httpx.HTTPError as exc:
        http.close()
        raise TrainError(f"cannot read the master at {url}: {exc}") from None
    if not status.get("run_id"):
        http.close()
        raise TrainError(f"the master at {url} has no run to follow: start one")
    try:
        ends = how_it_ends(train_config(status.get("config") or {}))
    except (ValidationError, ValueError):  # a config this version does not read
        ends = None
    data = {"run_id": status["run_id"], "ends": ends, "workers": []}
    return Run(http, url, data, env_modules, progress, attached=True)


def _master_url(master: str) -> str:
    """`master` as a URL with its port; TrainError for what is not one."""
    try:
        url = normalize_url(master, default_port=True) if "://" in master else ""
    except WorkerListError:
        url = ""
    if not url:
        raise TrainError(f"master: expected a URL such as http://10.0.0.10:33333, not {master!r}")
    return url


def _train_on(
    master: str, choice: EnvChoice, body: dict[str, Any], token: str | None, progress: Progress
) -> Run:
    url = _master_url(master)
    http = _client(url, token)
    try:
        data = _start(http, url, body, replace_running=False)
    except BaseException:
        http.close()
        raise
    return Run(http, url, data, choice.modules, progress)


def _start(
    http: httpx.Client, url: str, body: dict[str, Any], replace_running: bool
) -> dict[str, Any]:
    """POST /train: the reply's `data`; TrainError when no run started, or when a worker
    refused it (the run is stopped then). `replace_running`: a run the master resumed from its
    folder is stopped first (a local cluster's folder of an earlier run)."""
    try:
        reply = http.post("/train", json=body)
        if reply.status_code == 409 and replace_running:
            http.post("/stop", json={})
            reply = http.post("/train", json=body)
    except httpx.TransportError as exc:
        raise TrainError(f"cannot reach the master at {url}: {exc}") from None
    if reply.status_code == 401:
        raise TrainError(
            f"the master at {url} refused the token (401): pass token= or set A3C_TOKEN to the "
            "master's"
        )
    if reply.status_code != 202:
        raise TrainError(why_refused(reply))
    data = reply.json()["data"]
    refused = [
        w for w in data.get("workers", [])
        if not w["started"] and not str(w["error"]).startswith(UNREACHABLE)
    ]  # fmt: skip
    if refused:
        with contextlib.suppress(httpx.HTTPError):
            http.post("/stop", json={})
        why = "; ".join(f"{w['worker_id']} at {w['url']}: {w['error']}" for w in refused)
        raise TrainError(f"run {data['run_id']} stopped: a worker cannot train it ({why})")
    return data
