"""Under TLS neither service sends anything to a plain http:// URL it is given in a request:
the master's POST /train and a worker's POST /start_worker answer 422 naming it, and nothing
starts. (At start, a3c_http's settings refuse one: tests/unit/test_tls.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from a3c_http.config.settings import WorkerSettings
from tests.support.master_api import LOOPBACK, make_settings, master
from tests.support.master_api import _clean_env as _clean_env
from tests.support.master_api import launched as launched
from tests.support.tls import Files, make_files
from tests.support.worker_api import start_body
from worker.app import create_app


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return make_files(tmp_path_factory.mktemp("tls"))


def test_the_master_refuses_plain_urls_for_its_workers_and_itself(
    files: Files, tmp_path: Path, launched: list
) -> None:
    settings = make_settings(tmp_path, tls_cert=files.cert, tls_key=files.key, tls_ca=files.ca)
    with master(settings) as c:
        r = c.post("/train", json={"workers": ["http://127.0.0.1:9001"],
                                   "master_url": "https://127.0.0.1:33333"})
        assert r.status_code == 422
        assert "workers entry 1: a worker: http://127.0.0.1:9001 is plain http://" in r.json()[
            "detail"]
        r = c.post("/train", json={"workers": ["127.0.0.1:9001"],
                                   "master_url": "http://127.0.0.1:33333"})
        assert r.status_code == 422
        assert r.json()["detail"].startswith("master_url: http://127.0.0.1:33333 is plain http://")
        assert c.get("/status").json()["state"] == "idle" and launched == []
        r = c.post("/train", json={"workers": ["127.0.0.1:9001"],
                                   "master_url": "https://127.0.0.1:33333"})
        assert r.status_code == 202, r.text
        assert list(launched[0]["workers"].values()) == ["https://127.0.0.1:9001"]


def test_a_worker_refuses_a_plain_master_url(files: Files) -> None:
    settings = WorkerSettings(tls_cert=files.cert, tls_key=files.key, tls_ca=files.ca)
    with TestClient(create_app(settings=settings), client=LOOPBACK) as c:
        for body in (start_body(1), start_body(1, master_url="https://127.0.0.1:1",
                                                push_url="http://127.0.0.1:2")):
            r = c.post("/start_worker", json=body)
            assert r.status_code == 422
            assert "is plain http:// while TLS is configured" in r.json()["detail"]
        assert c.get("/status").json()["state"] == "idle"
