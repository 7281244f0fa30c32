"""Following a run on a master, for `a3c-train` (a3c_http/cli/train.py): start it (POST /train,
with what to say when the master refuses), then a progress line every few seconds until it
finishes, and a summary."""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx


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
    status = _status(http, url)
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


def _status(http: httpx.Client, url: str) -> dict:
    reply = http.get(f"{url}/status")
    reply.raise_for_status()
    return reply.json()


def follow(http: httpx.Client, url: str, run_id: str, time_cap: float | None, every: float) -> dict:
    """Progress lines every `every` seconds until run `run_id` is no longer running (stopped at
    `time_cap`, when given); its last status, after a summary."""
    started = time.monotonic()
    status = _status(http, url)
    previous = status
    # On a terminal the progress line is rewritten in place; into a file, one line each time.
    in_place = sys.stdout.isatty()
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
