"""Starting the workers of a run over HTTP (their list: a3c_http/config/workerlist.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from a3c_http.config.training import TrainConfig
from a3c_http.net.outbound import IDENTITY, BoundedTransport, ReplyRefused
from master.run.ledger import RunLedger

# A worker answers POST /start_worker with a few hundred bytes of JSON: a larger reply is not one.
START_REPLY_BYTES = 1024 * 1024


# How the reason of a worker that did not answer at all begins (the others answered and refused).
UNREACHABLE = "cannot reach the worker"


def _start_one(client: httpx.Client, url: str, body: dict[str, Any]) -> str | None:
    """POST /start_worker; None when it started, else why not."""
    try:
        response = client.post(f"{url}/start_worker", json=body)
    except httpx.HTTPError as exc:
        return f"{UNREACHABLE}: {type(exc).__name__}: {exc}"
    except ReplyRefused as exc:
        return f"the worker's reply {exc}"
    if response.status_code == 202:
        return None
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    if response.status_code == 401:
        return f"the worker refused the token (401): set the same A3C_TOKEN everywhere ({detail})"
    return f"the worker answered {response.status_code}: {str(detail)[:500]}"


def start_workers(
    ledger: RunLedger,
    workers: dict[str, str],
    run_id: str,
    config: TrainConfig,
    master_url: str,
    token: str | None,
    timeout_s: float = 10.0,
    proxy_from_env: bool = False,
    push_url: str | None = None,
) -> list[dict[str, Any]]:
    """POST /start_worker to every worker (id -> URL) at once; a worker that cannot be started is
    marked failed with the reason. Each call ends within `timeout_s`, however slowly the worker
    answers, and goes through the proxy the environment names only with `proxy_from_env`
    (A3C_PROXY_FROM_ENV). `push_url`: where the workers send their gradients, when the master has
    receivers (master/ingress/receivers.py)."""
    jobs = [
        (
            worker_id,
            url,
            {
                "master_url": master_url,
                "worker_id": worker_id,
                "run_id": run_id,
                "config": config.model_dump(),
                "exploration": ledger.exploration_of(worker_id),
                **({"push_url": push_url} if push_url else {}),
            },
        )
        for worker_id, url in workers.items()
    ]
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    client = httpx.Client(
        headers={**auth, **IDENTITY},
        timeout=timeout_s,
        transport=BoundedTransport(START_REPLY_BYTES, proxy_from_env=proxy_from_env),
        trust_env=False,  # the proxy, if any, is the transport's choice
    )
    with client, ThreadPoolExecutor(max_workers=min(16, len(jobs))) as pool:
        errors = list(pool.map(lambda job: _start_one(client, job[1], job[2]), jobs))
    results = []
    for (worker_id, url, _), error in zip(jobs, errors, strict=True):
        if error:
            ledger.mark_failed(worker_id, error)
        else:
            ledger.worker_accepted(worker_id)
        results.append(
            {"url": url, "worker_id": worker_id, "started": error is None, "error": error}
        )
    return results
