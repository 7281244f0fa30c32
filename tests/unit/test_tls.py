"""The TLS settings (a3c_http/net/tls.py): what they refuse at start, in one line, and the
https:// they make of URLs. That the services serve and call over TLS and mutual TLS is shown on
real processes (tests/cluster/test_mutual_tls.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from a3c_http.cli import servers
from a3c_http.config.settings import Settings, WorkerSettings
from a3c_http.config.workerlist import PlainUnderTLS, parse_workers
from a3c_http.net import tls
from tests.support.tls import Files, make_files


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return make_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(autouse=True)
def _no_tls_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in tls.VARIABLES:
        monkeypatch.delenv(name, raising=False)


def refusal(env: dict[str, str]) -> str:
    with pytest.raises(tls.TLSError) as caught:
        tls.from_environ(env)
    return str(caught.value)


def test_settings_that_cannot_work_are_refused_naming_the_variable(files: Files) -> None:
    ok = files.env()
    assert "set both or neither" in refusal({"A3C_TLS_CERT": ok["A3C_TLS_CERT"]})
    assert "needs A3C_TLS_CA" in refusal({**ok, "A3C_TLS_CA": ""})
    assert "A3C_TLS_KEY='/nowhere/key.pem': cannot read it (no such file)" in refusal(
        {**ok, "A3C_TLS_KEY": "/nowhere/key.pem"}
    )
    # a key that is not the certificate's, and a CA file that holds no certificate
    mismatched = refusal({**ok, "A3C_TLS_KEY": str(files.stranger_key)})
    assert mismatched.startswith("A3C_TLS_CERT=")
    assert "not a PEM certificate and its key" in mismatched
    assert "A3C_TLS_CA=" in refusal({**ok, "A3C_TLS_CA": str(files.key)})
    assert "expected true or false" in refusal({**ok, "A3C_TLS_MUTUAL": "maybe"})
    assert tls.from_environ(ok).mutual and not tls.from_environ({}).configured


def test_a_service_with_bad_tls_settings_stops_at_start_with_one_line(
    files: Files, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("A3C_TLS_CERT", str(files.cert))
    assert servers.worker(["--port", "1"]) == 2  # before uvicorn binds anything
    err = capsys.readouterr().err
    assert err == "a3c-worker: A3C_TLS_CERT and A3C_TLS_KEY go together: set both or neither\n"
    with pytest.raises(ValueError, match="A3C_TLS_CERT and A3C_TLS_KEY go together"):
        WorkerSettings.from_env()


def test_plain_urls_are_refused_at_start_while_tls_is_configured(
    files: Files, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, value in files.env(mutual=False).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("A3C_MASTER_URL", "http://10.0.0.10:33333")
    with pytest.raises(ValueError, match=r"A3C_MASTER_URL: http://10.0.0.10:33333 is plain"):
        WorkerSettings.from_env()
    monkeypatch.delenv("A3C_MASTER_URL")
    workers = tmp_path / "workers.txt"
    workers.write_text("https://10.0.0.11:8001\nhttp://10.0.0.12:8001\n")
    monkeypatch.setenv("A3C_WORKERS_FILE", str(workers))
    with pytest.raises(ValueError, match=r"workers.txt entry 2: a worker: http://10.0.0.12:8001"):
        Settings.from_env()
    workers.write_text("10.0.0.11:8001\n")  # no scheme: https
    assert Settings.from_env().tls.configured


def test_a_worker_list_takes_https_where_tls_is_configured(files: Files) -> None:
    served = tls.from_environ(files.env(mutual=False))
    assert parse_workers(["10.0.0.11:8001"], "workers", served=served) == [
        "https://10.0.0.11:8001"
    ]
    assert parse_workers(["10.0.0.11:8001"], "workers", served=tls.TLS()) == [
        "http://10.0.0.11:8001"
    ]
    with pytest.raises(PlainUnderTLS, match="entry 1: a worker: http://h:1 is plain http://"):
        parse_workers(["http://h:1"], "workers", served=served)


def test_mutual_tls_asks_uvicorn_for_client_certificates_of_the_ca(files: Files) -> None:
    served = tls.from_environ(files.env())
    assert served.uvicorn_kwargs() == {
        "ssl_certfile": str(files.cert), "ssl_keyfile": str(files.key),
        "ssl_ca_certs": str(files.ca), "ssl_cert_reqs": ssl.CERT_REQUIRED,
        "timeout_graceful_shutdown": tls.TLS_SHUTDOWN_S,
    }
    assert served.uvicorn_args()[-2:] == ["--ssl-cert-reqs", str(int(ssl.CERT_REQUIRED))]
    assert tls.from_environ(files.env(mutual=False)).uvicorn_kwargs() == {
        "ssl_certfile": str(files.cert), "ssl_keyfile": str(files.key),
        "timeout_graceful_shutdown": tls.TLS_SHUTDOWN_S,
    }
    assert tls.TLS().uvicorn_kwargs() == {}


def test_the_services_commands_serve_https_with_the_settings(
    files: Files, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(servers.uvicorn, "run", lambda app, **kw: calls.append(kw))
    for name, value in files.env().items():
        monkeypatch.setenv(name, value)
    assert servers.master([]) == 0
    served = tls.from_environ(files.env()).uvicorn_kwargs()
    assert {k: v for k, v in calls[0].items() if k in served} == served
    assert servers.master(["--timeout-graceful-shutdown", "30"]) == 0  # the user's own wins
    assert calls[1]["timeout_graceful_shutdown"] == 30
