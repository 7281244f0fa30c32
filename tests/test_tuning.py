"""a3c_http/tuning.py: what it relies on in uvicorn, httpx/httpcore, h11 and torch is there
as it expects (a newer library that changed it fails here, naming the module and what changed), it
falls back to the plain path when something is not, and A3C_TUNING=off runs a master without any of
it."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from a3c_http import tuning
from a3c_http.server import headerbounds

MODULE = "a3c_http/tuning.py"

ROOT = Path(__file__).resolve().parent.parent


def uvicorn_protocols() -> list[tuple[str, type]]:
    found = []
    for module_name, class_name in tuning.UVICORN_PROTOCOLS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if "httptools" in module_name:
                continue  # optional
            pytest.fail(f"{MODULE}: {module_name} is gone (uvicorn moved its protocols)")
        cls = getattr(module, class_name, None)
        assert cls is not None, f"a3c_http/tuning.py: {module_name}.{class_name} is gone"
        found.append((f"{module_name}.{class_name}", cls))
    return found


def test_uvicorns_protocols_are_as_tuning_expects() -> None:
    """install_server_hooks swaps the transport connection_made is given: the protocol must take
    (self, transport) and keep that transport as the one it writes to."""
    for name, cls in uvicorn_protocols():
        problem = tuning.uvicorn_protocol_problem(cls)
        assert problem is None, f"{MODULE}: {name}.connection_made changed: {problem}"
        made = inspect.unwrap(cls.connection_made)
        source = inspect.getsource(made)
        assert "self.transport = transport" in source, (
            f"a3c_http/tuning.py: {name}.connection_made changed: it no longer keeps the "
            "transport it is given as self.transport"
        )


def test_httpx_transport_is_as_tuning_expects() -> None:
    """install_network_backend sets the network backend of httpx's pool, direct and proxied."""
    for proxy in (None, "http://127.0.0.1:9"):
        transport = httpx.HTTPTransport(proxy=proxy)
        try:
            problem = tuning.httpx_transport_problem(transport)
        finally:
            transport.close()
        assert problem is None, (
            f"{MODULE}: httpx.HTTPTransport(proxy={proxy!r})._pool changed: {problem}"
        )


def test_torchs_fused_adagrad_kernel_is_as_tuning_expects() -> None:
    problem = tuning.fused_adagrad_problem()
    assert problem is None, f"a3c_http/tuning.py: torch._fused_adagrad_ changed: {problem}"


def test_uvicorns_protocols_are_as_headerbounds_expects() -> None:
    """a3c_http/server/headerbounds.py (the bounds on a request's head, not a tuning: A3C_TUNING
    does not turn them off) wraps methods of the same classes and raises an h11 bound."""
    import h11

    for module_name, (class_name, extra, _) in headerbounds._PROTOCOLS.items():
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except ImportError:
            continue
        for method in (*headerbounds._CONNECTION_METHODS, *extra):
            assert callable(getattr(cls, method, None)), (
                f"a3c_http/server/headerbounds.py: {module_name}.{class_name}.{method} is gone"
            )
    conn = h11.Connection(h11.SERVER)
    assert isinstance(getattr(conn, "_max_incomplete_event_size", None), int), (
        "a3c_http/server/headerbounds.py: h11.Connection._max_incomplete_event_size is gone"
    )


def test_a_changed_library_leaves_the_plain_path_with_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Protocol:
        def connection_made(self, transport, extra) -> None:  # noqa: ANN001
            pass

    assert "not (self, transport)" in (tuning.uvicorn_protocol_problem(Protocol) or "")
    monkeypatch.setattr(tuning, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="a3c.tuning"):
        assert not tuning.install_network_backend(object(), None)
        assert not tuning.install_network_backend(object(), None)
    lines = [r.getMessage() for r in caplog.records if r.name == "a3c.tuning"]
    assert len(lines) == 1 and lines[0].startswith("a3c_http/tuning.py: outbound"), lines


def test_the_switch_reads_booleans_and_names_itself_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for raw, expected in (("", True), ("on", True), ("OFF", False), ("false", False)):
        monkeypatch.setattr(tuning, "_enabled", None)
        monkeypatch.setenv("A3C_TUNING", raw)
        assert tuning.enabled() is expected, raw
    monkeypatch.setattr(tuning, "_enabled", None)
    monkeypatch.setenv("A3C_TUNING", "fast")
    with pytest.raises(ValueError, match="A3C_TUNING='fast'"):
        tuning.enabled()


# Run in a process of its own: the hooks are process-wide and this test's process may hold them.
OFF = """
import gc, json, socket, threading, time
from pathlib import Path

import httpcore, httpx, torch, uvicorn
from fastapi.testclient import TestClient

kernel = torch._fused_adagrad_
kernel_calls = []
torch._fused_adagrad_ = lambda *a, **k: kernel_calls.append(1) or kernel(*a, **k)

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
_, ids = state.start_run(TrainConfig(seed=1, max_steps=None), ["http://127.0.0.1:9"])
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
optimizer = make_optimizer([ours], TrainConfig(seed=0))
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
    made = cls.connection_made
    while made is not None:
        assert made.__module__ != "a3c_http.tuning", cls
        made = getattr(made, "__wrapped__", None)
assert type(bounded._direct._pool._network_backend) is httpcore.SyncBackend
assert gc.get_freeze_count() == 0
assert kernel_calls == [], len(kernel_calls)
print("plain path ok")
"""


@pytest.mark.integration
def test_with_tuning_off_a_master_serves_pushes_on_the_plain_path(tmp_path: Path) -> None:
    """A3C_TUNING=off: a real uvicorn master takes a push over a3c_http/net/outbound.py's transport
    and steps its optimizer; the worker's app starts; no hook of tuning.py is installed, no
    freeze, no fused kernel, and the RMSprop step is torch's bit for bit."""
    pytest.importorskip("httptools")
    env = {**os.environ, "A3C_TUNING": "off", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OFF.format(run=str(tmp_path)))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "plain path ok" in done.stdout
