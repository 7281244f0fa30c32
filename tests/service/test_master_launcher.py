"""The master's calls to the workers it starts (POST /start_worker), in-process (TestClient)
against stand-in workers over loopback: each gets the token, the run and the master's URL, a
worker that cannot be started is reported while the run goes on, a worker's reply is bounded, and
the calls take the environment's proxy only with A3C_PROXY_FROM_ENV."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from a3c_http.local.cluster import free_port
from a3c_http.testing.standin import StandInWorker
from master.app import create_app as create_master
from tests.support.badpeer import BadPeer, without_proxies
from tests.support.common import AUTH, TOKEN
from tests.support.http_layer import LOOPBACK, settings, start_run
from tests.support.http_layer import _clean_env as _clean_env


def test_train_calls_each_worker_with_the_token_the_run_and_its_own_url(
    tmp_path: Path, standin: StandInWorker
) -> None:
    with StandInWorker(token=TOKEN) as other, TestClient(
        create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH
    ) as c:
        before_a, before_b = len(standin.starts()), len(other.starts())
        bare = other.url.removeprefix("http://")  # both forms of a worker's address
        data = start_run(c, [standin.url, bare], seed=5)
        assert isinstance(data["run_id"], str) and data["run_id"]
        assert [(e["url"], e["started"], e["error"]) for e in data["workers"]] == [
            (standin.url, True, None), (other.url, True, None)], data
        (a,), (b,) = standin.starts()[before_a:], other.starts()[before_b:]
        for start in (a, b):
            assert start["headers"]["authorization"] == f"Bearer {TOKEN}", start["headers"]
            # Without A3C_MASTER_URL or "master_url", the URL /train was addressed to.
            assert start["body"]["master_url"].rstrip("/") in (
                "http://testserver", "http://testserver:80"), start
            assert start["body"]["run_id"] == data["run_id"]
            assert start["body"]["config"]["seed"] == 5
        assert [a["body"]["worker_id"], b["body"]["worker_id"]] == ["w1", "w2"]

        again = c.post("/train", json={"workers": [standin.url]})
        assert again.status_code == 409, again.text
        assert len(standin.starts()) == before_a + 1
        assert c.get("/status").json()["run_id"] == data["run_id"]

        # "master_url" in the body is what the workers are given.
        assert c.post("/stop", json={}).status_code == 200
        start_run(c, [standin.url], master_url="http://localhost:4321")
        assert standin.starts()[-1]["body"]["master_url"].rstrip("/") == "http://localhost:4321"
    # A3C_MASTER_URL, when set, is.
    alias = "http://master.example:4321"
    with TestClient(create_master(settings(tmp_path / "2", master_url=alias)), client=LOOPBACK,
                    headers=AUTH) as c:
        start_run(c, [standin.url])
        assert standin.starts()[-1]["body"]["master_url"].rstrip("/") == alias


def test_a_worker_that_cannot_be_started_is_reported_and_the_run_goes_on(
    tmp_path: Path, standin: StandInWorker
) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    with StandInWorker(token="another-token") as refusing, TestClient(
        create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH
    ) as c:
        ok, refused, dead = start_run(c, [standin.url, refusing.url, unreachable])["workers"]
        assert ok["started"] is True and ok["error"] is None, ok
        assert refused["started"] is False, refused
        assert "401" in refused["error"] and "A3C_TOKEN" in refused["error"], refused
        assert dead["started"] is False and dead["error"], dead
        s = c.get("/status").json()
        assert s["state"] == "running", s
        states = {w["url"]: w["state"] for w in s["workers"]}
        assert states == {standin.url: "starting", refusing.url: "failed", unreachable: "failed"}
        # A master whose only worker refuses its token has nobody to run the run.
        assert c.post("/stop", json={}).status_code == 200
        reply = c.post("/train", json={"workers": [refusing.url], "seed": 1})
        assert reply.status_code == 503, reply.text
        assert "401" in reply.json()["detail"] and "A3C_TOKEN" in reply.json()["detail"]
        (only,) = reply.json()["data"]["workers"]
        assert only["started"] is False and "401" in only["error"], only
        s = c.get("/status").json()
        assert s["state"] == "finished" and s["finish_reason"] == "no worker could be started"
        assert s["workers"][0]["state"] == "failed" and "401" in s["workers"][0]["error"]


def test_a_worker_whose_reply_is_too_large_is_reported_without_reading_it_whole(
    tmp_path: Path,
) -> None:
    with BadPeer("huge", length=64 << 20) as huge, TestClient(
        create_master(settings(tmp_path)), client=LOOPBACK, headers=AUTH
    ) as c:
        (result,) = start_run(c, [huge.url], expect=503)["workers"]
    assert result["started"] is False and "reply passed 1048576 bytes" in result["error"], result
    assert huge.sent < 16 << 20, huge.sent


@pytest.mark.parametrize("from_env", [False, True])
def test_the_calls_take_the_environments_proxy_only_with_a3c_proxy_from_env(
    tmp_path: Path, standin: StandInWorker, monkeypatch: pytest.MonkeyPatch, from_env: bool
) -> None:
    without_proxies(monkeypatch)
    with BadPeer("json") as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        before = len(standin.starts())
        with TestClient(
            create_master(settings(tmp_path, proxy_from_env=from_env)),
            client=LOOPBACK,
            headers=AUTH,
        ) as c:
            (result,) = start_run(c, [standin.url], expect=503 if from_env else 202)["workers"]
    if not from_env:
        assert proxy.heads == [] and result["started"] is True, result
        assert len(standin.starts()) == before + 1
        return
    # Sent through the proxy, token and all, as the setting asks: the worker never saw it.
    assert len(standin.starts()) == before
    ((line, *rest),) = [head.decode().split("\r\n") for head in proxy.heads]
    assert line == f"POST {standin.url}/start_worker HTTP/1.1"
    headers = {name.lower(): value for name, _, value in (h.partition(": ") for h in rest)}
    assert headers["authorization"] == f"Bearer {TOKEN}"
