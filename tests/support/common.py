"""What the tests share beyond the harness (`a3c_http.local.cluster`: processes, clusters,
the stand-in worker, `wait_for`): the session cluster's workers, run configs, a snapshot of
everything a refused request must leave as it was, and the catalogue of bad tensor bodies."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save as st_save

from a3c_http.algos.registry import train_config
from a3c_http.config.settings import Settings
from a3c_http.local.cluster import LocalCluster, ServiceProcess, stat_fields
from master.app import create_app

# The session cluster's workers. IMPATIENT gives up on an unreachable master after 3 s
# (A3C_MASTER_RETRY_S); the others keep the default 60 s. A run names the workers it uses.
PATIENT = (0, 1)
IMPATIENT = 2
MAX_BODY = 256 * 1024  # the session cluster's A3C_MAX_BODY_BYTES (the model's weights fit)


TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OCTET = {"Content-Type": "application/octet-stream"}

# A run of a few seconds on two workers.
SHORT_RUN = {
    "num_envs": 2,
    "t_max": 8,
    "max_episodes": 40,
    "max_steps": None,
    "seed": 7,
    "heartbeat_interval_s": 0.5,
    "heartbeat_timeout_s": 20,
}
# A run that goes on until it is stopped.
ENDLESS_RUN = {**SHORT_RUN, "max_episodes": None, "max_steps": None, "target_return": 1e9}
# A run whose workers are stand-ins (they never report): it stays running for the test to play.
STAND_IN_RUN = {"seed": 1, "heartbeat_timeout_s": 3600, "max_steps": None}



@contextmanager
def master_running(
    tmp_path: Path, workers: int = 2, allowed_hosts: tuple[str, ...] = (), **config: Any
) -> Iterator[TestClient]:
    """A master in-process (TestClient, a loopback client, no token) running a run of `config`
    whose workers `w1`, `w2`, ... have registered: no launcher, the test plays the workers. The
    run is finished on the way out, which answers any request still waiting for a sync round
    (so a test that fails while one waits ends instead of hanging)."""
    settings = Settings(
        run_dir=tmp_path / "run",
        workers_file=tmp_path / "workers.txt",
        token=None,
        allowed_hosts=allowed_hosts,
    )
    with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as c:
        urls = [f"http://127.0.0.1:{9001 + i}" for i in range(workers)]
        _, worker_ids = c.app.state.cluster.start_run(
            train_config(**{"seed": 1, "max_steps": None, **config}), urls
        )
        for worker_id in worker_ids:
            r = c.post("/worker_started", json={"worker_id": worker_id})
            assert r.status_code == 200, r.text
        try:
            yield c
        finally:
            c.app.state.cluster.finish("the test is over")


def push_rollout(
    c: TestClient,
    seq: int,
    episodes: list | None = None,
    stats: dict | None = None,
    worker: str = "w1",
    version: int | None = None,
    metadata: dict[str, str] | None = None,
) -> httpx.Response:
    """A worker's gradient push to an in-process master (`master_running`): small gradients of
    the model, the rollout's `episodes` and `stats` in the body's metadata (or `metadata` as it
    is), in the run's wire dtype, computed on `version` (default the current one)."""
    layout = c.app.state.cluster.params.net.wire
    if metadata is None:
        metadata = {"a3c": json.dumps({"episodes": episodes or [], "stats": stats})}
    body = layout.encode(torch.full((layout.numel,), 1e-3), metadata)
    current = c.app.state.cluster.params.version
    headers = {
        **OCTET,
        "X-Worker-Id": worker,
        "X-Model-Version": str(current if version is None else version),
        "X-A3C-Seq": str(seq),
    }
    return c.post("/gradients", content=body, headers=headers)


# What a refused request must not change (besides the registry and the weights).
COUNTERS = (
    "state",
    "run_id",
    "finish_reason",
    "global_episode",
    "global_steps",
    "best_score",
    "moving_average",
    "mean_return_100",
    "solved",
    "model_version",
    "updates_applied",
    "queue_length",
    "queue_dropped",
)


def snapshot(http: httpx.Client, base: str = "") -> dict[str, Any]:
    """Everything a refused request must leave as it was: the counters, the registry and the
    global weights (when there are any). `http` may be a TestClient (base "") or an httpx client
    with the master's URL as `base`."""
    reply = http.get(f"{base}/status")
    assert reply.status_code == 200, reply.text
    s = reply.json()
    snap: dict[str, Any] = {k: s.get(k) for k in COUNTERS}
    snap["workers"] = sorted(
        (w["worker_id"], w["state"], w["episodes"], w["steps"]) for w in s["workers"]
    )
    weights = http.get(f"{base}/global_model_weights")
    snap["weights"] = (
        weights.headers.get("X-Model-Version"),
        hashlib.sha256(weights.content).hexdigest(),
    )
    return snap


def registry(status: dict) -> dict[str, dict]:
    """The master's worker records by worker id."""
    return {w["worker_id"]: w for w in status["workers"]}


# -- bad tensor bodies ----------------------------------------------------------------------------

PARSE = ("safetensors",)


def bad_tensor_bodies(good: dict[str, torch.Tensor]) -> dict[str, tuple[bytes, tuple[str, ...]]]:
    """Bodies for the tensor endpoints that are wrong in one way each, made from the global
    weights `good`: label -> (body, words one of which the 422's detail must contain)."""
    names = sorted(good)
    first = names[0]
    matrix = next(n for n in names if good[n].dim() == 2)
    valid = st_save(good)
    header_len = int.from_bytes(valid[:8], "little")

    def header(raw: bytes) -> bytes:
        return len(raw).to_bytes(8, "little") + raw

    def lying(entry: dict) -> bytes:
        return header(json.dumps({first: entry}).encode())

    def changed(**replace: torch.Tensor) -> bytes:
        return st_save({**good, **replace})

    def every(dtype: torch.dtype) -> bytes:
        return st_save({k: v.to(dtype) for k, v in good.items()})

    def with_value(name: str, index: tuple[int, ...], value: float) -> bytes:
        t = good[name].clone()
        t[index] = value
        return changed(**{name: t})

    buf = io.BytesIO()
    torch.save(dict(good), buf)
    t = good[matrix]
    return {
        "empty": (b"", PARSE),
        "plain text": (b"this is not a safetensors file", PARSE),
        "random bytes": (bytes(range(256)) * 8, PARSE),
        "JSON": (b'{"data": [1, 2, 3]}', PARSE),
        "pickle": (pickle.dumps({k: v.tolist() for k, v in good.items()}), PARSE),
        "torch.save": (buf.getvalue(), PARSE),
        "7 bytes": (valid[:7], PARSE),
        "header only": (valid[: 8 + header_len], PARSE),
        "truncated half": (valid[: len(valid) // 2], PARSE),
        "truncated by a byte": (valid[:-1], PARSE),
        "header length beyond the body": ((2**40).to_bytes(8, "little") + b"{}", PARSE),
        "header length 2**64-1": (b"\xff" * 8 + b"{}", PARSE),
        "header not JSON": (header(b"not json"), PARSE),
        "header a JSON list": (header(b"[]"), PARSE),
        "non-string metadata": (header(b'{"__metadata__": {"a": 1}}'), PARSE),
        "offsets beyond the body": (
            lying({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}),
            PARSE,
        ),
        "shape overflowing": (
            lying({"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 0]}),
            PARSE,
        ),
        "unknown dtype": (lying({"dtype": "F99", "shape": [0], "data_offsets": [0, 0]}), PARSE),
        "no tensor": (st_save({}), ("missing", first)),
        "a renamed tensor": (
            st_save({(k + "_x" if k == first else k): v for k, v in good.items()}),
            ("missing", "unexpected"),
        ),
        "a missing tensor": (st_save({k: v for k, v in good.items() if k != first}), ("missing",)),
        "an extra tensor": (changed(**{"extra.weight": torch.zeros(3)}), ("unexpected",)),
        "a wrong shape": (changed(**{matrix: torch.zeros(t.shape[1], t.shape[0] + 1)}), ("shape",)),
        "a flattened tensor": (changed(**{matrix: t.flatten().contiguous()}), ("shape",)),
        "float64": (every(torch.float64), ("float32",)),
        "float16": (every(torch.float16), ("float32",)),
        "bfloat16": (every(torch.bfloat16), ("float32",)),
        "int64": (every(torch.int64), ("float32",)),
        "int32": (every(torch.int32), ("float32",)),
        "bool": (every(torch.bool), ("float32",)),
        "NaN": (with_value(matrix, (0, 0), float("nan")), ("nan",)),
        "+Inf": (with_value(matrix, (0, 0), float("inf")), ("infinite",)),
        "-Inf": (with_value(matrix, (-1, -1), float("-inf")), ("infinite",)),
    }


def without_box2d(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gymnasium's Box2D environments as where box2d-py is not installed, whether it is here or
    not: `import Box2D` fails, and their modules are imported again (and fail) when next made."""
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)


def patient(cluster: LocalCluster) -> list[ServiceProcess]:
    """The session cluster's workers that wait out a master that is away (PATIENT)."""
    return [cluster.workers[i] for i in PATIENT]


def pid_running(pid: int) -> bool:
    """Whether process `pid` runs (Linux): an ended process whose parent has not reaped it yet
    is a zombie, not running."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"
