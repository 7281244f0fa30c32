"""Following a run on a master, for `a3c-train` (a3c_http/cli/train.py) and the Python API's `Run`:
start it (POST /train, with what to say when the master refuses), then a progress line every few
seconds until it finishes, and a summary. A follower outlives its master: while the master cannot
be reached (killed, restarted, a proxy without it) it waits up to `reconnect_s` for it to come
back, saying so, and follows the same run again once the master has resumed it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

# How long a follower waits for a master it cannot reach before it gives the run up: long enough
# for a master restarted by hand, systemd or Kubernetes to resume the run in its folder.
RECONNECT_S = 300.0
# Between two tries to reach a master that went away.
RETRY_S = 1.0
# What a proxy answers for a master that is not there, and a master that is not serving yet.
AWAY = frozenset({502, 503, 504})


class Stopped(Exception):
    """A signal (SIGINT, SIGTERM) interrupted the command that follows a run."""


class MasterAway(Exception):
    """The master answered as one that is not there (AWAY)."""


class MasterLost(Exception):
    """The master could not be reached for the whole of a follower's wait."""


def _fmt(value: float | None) -> str:
    """A return with the decimals its size needs: 1.48 stays 1.48 (not 1, nor 1.5, beside a
    target of 1.38), 17.25 reads 17.2, 475 reads 475."""
    if value is None:
        return "-"
    size = abs(value)
    return format(value, ".2f" if size < 10 else ".1f" if size < 100 else ".0f")


def progress_line(status: dict, previous: dict | None) -> str:
    """One line of progress; the rate is measured between this status and the previous one
    ("-" without one, or where the counters went back: a run resumed from its last save)."""
    rate = "-"
    if previous is not None:
        dt = status["elapsed_s"] - previous["elapsed_s"]
        steps = status["global_steps"] - previous["global_steps"]
        if dt > 0 and steps >= 0:
            rate = f"{steps / dt:,.0f}"
    workers = status.get("workers", [])
    states: dict[str, int] = {}
    for w in workers:
        states[w["state"]] = states.get(w["state"], 0) + 1
    ws = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none"
    return (
        f"[{status['elapsed_s']:6.0f} s] episodes {status['global_episode']:>6}  "
        f"steps {status['global_steps']:>9,}  mean100 {_fmt(status['mean_return_100']):>6}  "
        f"best {_fmt(status['best_score']):>6}  env steps/s {rate:>7}  "
        f"updates {status['updates_applied']:>6}  workers: {ws}"
    )


def refusal(reply: httpx.Response) -> str:
    """The line to print when POST /train started no run: `error: ` and `why_refused`."""
    return f"error: {why_refused(reply)}"


def why_refused(reply: httpx.Response) -> str:
    """Why POST /train started no run: the master's `detail`, readable (and what a reply without
    one said, its first 500 characters)."""
    try:
        detail = reply.json().get("detail")
    except ValueError:
        detail = None
    if not isinstance(detail, str):
        return f"POST /train answered {reply.status_code}: {reply.text[:500]}"
    if reply.status_code == 422:
        return f"the master refused the config: {detail}"
    return detail


def resume_note(status: dict) -> str | None:
    """One line when the master could not resume the run in its folder: the new run this command
    starts moves that run to the archive."""
    problem = status.get("resume_error")
    if not problem:
        return None
    return f"note: {problem['error']} (the new run starts now)"


def start_run(
    http: httpx.Client, url: str, body: dict[str, Any], replace_running: bool
) -> dict | None:
    """POST /train: the reply's `data`, or None (the reason printed) when no run started. With
    `replace_running`, a run left running in the master's folder is stopped first."""
    status = read_status(http, url)
    note = resume_note(status)
    if note:
        print(note)
    reply = http.post(f"{url}/train", json=body)
    if reply.status_code == 409 and replace_running:
        # The run folder holds a run left running (an earlier a3c-train was killed): the master
        # resumed it; end it (it is archived) and start the new one.
        print(f"note: {reply.json()['detail']}; stopping that run and starting a new one")
        http.post(f"{url}/stop", json={})
        reply = http.post(f"{url}/train", json=body)
    if reply.status_code != 202:
        print(refusal(reply), file=sys.stderr)
        return None
    data = reply.json()["data"]
    print(f"run {data['run_id']} started on {url}")
    if data.get("ends"):  # a master before this field: nothing to say
        print(f"it {data['ends']}")
    print(f"dashboard: {url}/ (open it in a browser to watch the run)")
    for w in data.get("workers", []):
        print(
            f"  {w['worker_id']} {w['url']}: "
            + ("started" if w["started"] else f"NOT started: {w['error']}")
        )
    return data


def read_status(http: httpx.Client, url: str = "") -> dict:
    """GET /status's JSON. httpx.TransportError where the master cannot be reached, MasterAway
    where it answers as one that is not there, HTTPStatusError for any other refusal."""
    reply = http.get(f"{url}/status")
    if reply.status_code in AWAY:
        raise MasterAway(f"{reply.status_code} {reply.reason_phrase}")
    reply.raise_for_status()
    return reply.json()


def outliving(
    read: Callable[[], dict], url: str, reconnect_s: float, say: Callable[[str], None] = print
) -> dict:
    """`read()`'s status, waiting for a master that cannot be reached: a line when it went away,
    then a try every RETRY_S until it answers (a line: it is back) or `reconnect_s` have passed
    (MasterLost). With `reconnect_s` 0, the first failure is raised as it is."""
    try:
        return read()
    except (httpx.TransportError, MasterAway) as exc:
        if reconnect_s <= 0:
            raise
        say(
            f"the master at {url} cannot be reached ({exc or type(exc).__name__}): waiting up "
            f"to {reconnect_s:.0f} s for it to come back"
        )
    deadline = time.monotonic() + reconnect_s
    while time.monotonic() < deadline:
        time.sleep(RETRY_S)  # the interval between tries, not a synchronisation
        try:
            status = read()
        except (httpx.TransportError, MasterAway):
            continue
        say(f"the master at {url} is back: run {status.get('run_id')}, {status.get('state')}")
        return status
    raise MasterLost(f"the master at {url} did not come back within {reconnect_s:.0f} s")


def follow(
    http: httpx.Client,
    url: str,
    run_id: str,
    time_cap: float | None,
    every: float,
    reconnect_s: float = RECONNECT_S,
) -> dict:
    """Progress lines every `every` seconds until run `run_id` is no longer running (stopped at
    `time_cap`, when given); its last status, after a summary. A master that cannot be reached
    is waited for up to `reconnect_s` (`outliving`; MasterLost after that)."""
    # On a terminal the progress line is rewritten in place; into a file, one line each time.
    in_place = sys.stdout.isatty()

    def _status(http: httpx.Client, url: str) -> dict:
        say = (lambda line: print(f"\n{line}")) if in_place else print
        return outliving(lambda: read_status(http, url), url, reconnect_s, say)

    started = time.monotonic()
    status = _status(http, url)
    previous = status
    while status["state"] == "running" and status.get("run_id") == run_id:
        if time_cap is not None and time.monotonic() - started > time_cap:
            print(f"\ntime cap of {time_cap:.0f} s reached: stopping the run")
            http.post(f"{url}/stop", json={})
            break
        # A line every `every` seconds; the run's end is seen within a second of it, however
        # long `every` is.
        due = time.monotonic() + every
        while True:
            time.sleep(max(0.0, min(1.0, due - time.monotonic())))
            status = _status(http, url)
            if time.monotonic() >= due or status["state"] != "running":
                break
        line = progress_line(status, previous)
        print(f"\r\033[K{line}" if in_place else line, end="" if in_place else "\n", flush=True)
        previous = status
    if in_place:
        print()
    status = _status(http, url)
    if status.get("run_id") != run_id:
        print(f"run {run_id} is no longer the master's run (it runs {status.get('run_id')})")
        return {**status, "solved": False}
    print(f"run finished: {status.get('finish_reason')}")
    print(
        f"  episodes {status['global_episode']}, env steps {status['global_steps']:,}, "
        f"mean return of the last 100: {_fmt(status['mean_return_100'])}, "
        f"time {status['elapsed_s']:.0f} s"
    )
    return status
