"""A3C_TUNING=off, in a process of its own (the hooks are process-wide): a real master serves
pushes on the plain uvicorn, httpx and torch path, and nothing of a3c_http/tuning/ is
installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


OFF = """
import gc, json, socket, threading, time
from pathlib import Path

import httpcore, httpx, torch, uvicorn
import uvicorn.protocols.http.h11_impl, uvicorn.protocols.http.httptools_impl
from fastapi.testclient import TestClient

kernel = torch._fused_adagrad_
kernel_calls = []
torch._fused_adagrad_ = lambda *a, **k: kernel_calls.append(1) or kernel(*a, **k)

from a3c_http.algos.registry import train_config
from a3c_http import tuning
from a3c_http.optim.optimizers import make_optimizer
from a3c_http.config.training import TrainConfig
from a3c_http.net.outbound import IDENTITY, BoundedTransport
from a3c_http.config.settings import Settings
from master.app import create_app
from worker.app import create_app as create_worker

run = Path({run!r})
app = create_app(Settings(run_dir=run / "run", workers_file=run / "workers.txt", token=None))
listening = socket.socket()
listening.bind(("127.0.0.1", 0))
port = listening.getsockname()[1]
server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
thread = threading.Thread(target=server.run, kwargs={{"sockets": [listening]}}, daemon=True)
thread.start()
for _ in range(200):
    if server.started:
        break
    time.sleep(0.05)
state = app.state.cluster
_, ids = state.start_run(train_config(seed=1, max_steps=None), ["http://127.0.0.1:9"])
before = state.params.net.params.detach().clone()
bounded = BoundedTransport(max_reply_bytes=1 << 24)
with httpx.Client(transport=bounded, base_url=f"http://127.0.0.1:{{port}}") as http:
    r = http.post("/worker_started", json={{"worker_id": ids[0]}}, headers=IDENTITY)
    assert r.status_code == 200, r.text
    layout = state.params.net.wire
    metadata = {{"a3c": json.dumps({{"episodes": []}})}}
    body = layout.encode(torch.full((layout.numel,), 1e-3), metadata)
    headers = {{**IDENTITY, "Content-Type": "application/octet-stream", "X-Worker-Id": ids[0],
               "X-Model-Version": "0", "X-A3C-Seq": "1"}}
    r = http.post("/gradients", content=body, headers=headers)
    assert r.status_code == 200, r.text
assert state.params.version == 1, state.params.version
assert not torch.equal(state.params.net.params.detach(), before), "the push moved no weight"
with TestClient(create_worker(token=None)) as worker:
    assert worker.get("/healthz").status_code == 200
server.should_exit = True
thread.join(timeout=20)

# An optimizer step with the switch off is torch's RMSprop's, bit for bit.
ours = torch.nn.Parameter(torch.randn(1000))
theirs = torch.nn.Parameter(ours.detach().clone())
optimizer = make_optimizer([ours], train_config(seed=0))
reference = torch.optim.RMSprop([theirs], lr=optimizer.param_groups[0]["lr"], alpha=0.99, eps=1e-5)
for _ in range(3):
    ours.grad = torch.randn(1000)
    theirs.grad = ours.grad.clone()
    optimizer.step()
    reference.step()
assert torch.equal(ours.detach(), theirs.detach())

# No hook: nothing recorded, and none of tuning's in the libraries.
assert not tuning.enabled()
assert tuning.installed == set(), tuning.installed
for cls in (uvicorn.protocols.http.h11_impl.H11Protocol,
            uvicorn.protocols.http.httptools_impl.HttpToolsProtocol):
    for name in ("connection_made", "data_received", "connection_lost"):
        method = getattr(cls, name)
        while method is not None:
            assert method.__module__ != "a3c_http.tuning", (cls, name)
            method = getattr(method, "__wrapped__", None)
assert type(bounded._direct._pool._network_backend) is httpcore.SyncBackend
assert gc.get_freeze_count() == 0
assert kernel_calls == [], len(kernel_calls)
print("plain path ok")
"""


@pytest.mark.integration
def test_with_tuning_off_a_master_serves_pushes_on_the_plain_path(tmp_path: Path) -> None:
    """A3C_TUNING=off: a real uvicorn master takes a push over a3c_http/net/outbound.py's transport
    and steps its optimizer; the worker's app starts; no hook of a3c_http/tuning/ is installed, no
    freeze, no fused kernel, and the RMSprop step is torch's bit for bit."""
    pytest.importorskip("httptools")
    env = {**os.environ, "A3C_TUNING": "off", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OFF.format(run=str(tmp_path)))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "plain path ok" in done.stdout
