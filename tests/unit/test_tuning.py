"""a3c_http/tuning/: what it relies on in uvicorn, httpx/httpcore, h11 and torch is there
as it expects (a newer library that changed it fails here, naming the module and what changed), it
falls back to the plain path when something is not, and A3C_TUNING=off runs a master without any of
it."""

from __future__ import annotations

import importlib
import inspect
import logging
from pathlib import Path

import httpx
import pytest

from a3c_http import tuning

MODULE = "a3c_http/tuning/"

ROOT = Path(__file__).resolve().parents[2]


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
        assert cls is not None, f"a3c_http/tuning/: {module_name}.{class_name} is gone"
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
            f"a3c_http/tuning/: {name}.connection_made changed: it no longer keeps the "
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
    assert problem is None, f"a3c_http/tuning/: torch._fused_adagrad_ changed: {problem}"


def test_uvicorns_protocols_are_as_the_head_bounds_expect() -> None:
    """bound_request_heads wraps methods of the same classes and raises an h11 bound."""
    import h11

    for module_name, (class_name, extra, _) in tuning.HEAD_PROTOCOLS.items():
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except ImportError:
            continue
        for method in (*tuning.CONNECTION_METHODS, *extra):
            assert callable(getattr(cls, method, None)), (
                f"{MODULE}: {module_name}.{class_name}.{method} is gone"
            )
    conn = h11.Connection(h11.SERVER)
    assert isinstance(getattr(conn, "_max_incomplete_event_size", None), int), (
        f"{MODULE}: h11.Connection._max_incomplete_event_size is gone"
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
    assert len(lines) == 1 and lines[0].startswith("a3c_http/tuning/: outbound"), lines


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
