"""The dashboard's data and files through the app: `GET /history` pages the run's episodes and
evaluations across what is saved and what is not yet, and the page and its files are served without
the token (that everything it shows needs the token is tests/service/test_http_auth.py's matter).
The page itself runs in a real browser in tests/ops/test_browser.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from a3c_http.config.settings import Settings
from master.api.view import PUBLIC_PATHS
from master.app import create_app
from tests.support.common import TOKEN, master_running


def pages(c: TestClient, limit: int) -> tuple[list[dict], list[dict], list[dict[str, Any]]]:
    """Every episode and evaluation, `limit` rows at a time as the dashboard asks for them."""
    episodes: list[dict] = []
    evaluations: list[dict] = []
    replies = []
    since = evaluations_since = 0
    while True:
        r = c.get("/history", params={
            "since": since, "evaluations_since": evaluations_since, "limit": limit,
        })
        assert r.status_code == 200, r.text
        page = r.json()
        replies.append(page)
        assert len(page["episodes"]) <= limit and len(page["evaluations"]) <= limit
        episodes += page["episodes"]
        evaluations += page["evaluations"]
        since, evaluations_since = page["next"], page["evaluations_next"]
        if not page["more"]:
            return episodes, evaluations, replies


def evaluate(c: TestClient, version: int, mean: float) -> None:
    state = c.app.state.cluster
    taken = {"model_version": version, "elapsed_s": 1.0, "global_steps": 10 * version}
    result = {"mean_return": mean, "std_return": 1.0, "episodes": 2, "mean_length": 9.0}
    state.record_evaluation(state.ledger.run_id, taken, result, None)


def test_history_pages_saved_and_unsaved_rows_in_order_once_each(tmp_path: Path) -> None:
    with master_running(tmp_path) as c:
        state = c.app.state.cluster
        for i in range(5):
            c.post("/episode", json={"worker_id": "w1", "reward": i, "length": 10 + i})
        evaluate(c, 1, 3.0)
        state.persist()  # these are in the run folder now; the rest only in the ledger
        for i in range(5, 8):
            c.post("/episode", json={"worker_id": "w2", "reward": i, "length": 10 + i})
        evaluate(c, 2, 4.0)
        episodes, evaluations, replies = pages(c, limit=3)
        assert [e["global_episode"] for e in episodes] == list(range(1, 9))
        assert [e["reward"] for e in episodes] == [float(i) for i in range(8)]
        assert [e["worker_id"] for e in episodes] == ["w1"] * 5 + ["w2"] * 3
        assert [e["mean_return"] for e in evaluations] == [3.0, 4.0]
        assert len(replies) == 3 and replies[0]["more"] and not replies[-1]["more"]
        assert {r["run_id"] for r in replies} == {state.ledger.run_id}
        assert replies[-1]["global_episode"] == 8 and replies[-1]["evaluations_total"] == 2
        # What a client that has everything gets: nothing new, and where to ask from next time.
        last = c.get("/history", params={"since": 8, "evaluations_since": 2}).json()
        assert (last["episodes"], last["evaluations"], last["more"]) == ([], [], False)
        assert (last["next"], last["evaluations_next"]) == (8, 2)
        state.persist()
        assert episodes == state.store.read_episodes()
        assert evaluations == state.store.read_evaluations()


def test_history_names_the_run_so_a_client_starts_again_on_a_new_one(tmp_path: Path) -> None:
    with master_running(tmp_path) as c:
        state = c.app.state.cluster
        c.post("/episode", json={"worker_id": "w1", "reward": 1.0, "length": 10})
        first = c.get("/history").json()
        state.finish("the test starts another")
        state.start_run(state.ledger.config, ["http://127.0.0.1:9001"])
        second = c.get("/history", params={"since": first["next"]}).json()
        assert second["run_id"] != first["run_id"] and second["global_episode"] == 0
        assert second["episodes"] == [] and second["state"] == "running"


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("limit=0", "limit: Input should be greater than or equal to 1"),
        ("limit=10001", "limit: Input should be less than or equal to 10000"),
        ("since=-1", "since: Input should be greater than or equal to 0"),
        ("evaluations_since=x", "evaluations_since: Input should be a valid integer"),
        # Past SQLite's integers: a 422, not an overflow in the database.
        (f"since={2**63}", f"since: Input should be less than or equal to {2**63 - 1}"),
        (f"evaluations_since={2**63}",
         f"evaluations_since: Input should be less than or equal to {2**63 - 1}"),
    ],
)
def test_history_refuses_bad_paging_naming_the_parameter(
    tmp_path: Path, query: str, problem: str
) -> None:
    with master_running(tmp_path) as c:
        r = c.get(f"/history?{query}")
        assert r.status_code == 422 and r.json()["detail"].startswith(problem), r.text


def test_the_page_and_every_file_it_loads_are_served_without_the_token(tmp_path: Path) -> None:
    settings = Settings(run_dir=tmp_path / "run", workers_file=tmp_path / "w.txt", token=TOKEN)
    with TestClient(create_app(settings), client=("10.1.2.3", 50000)) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        # Everything the page loads is served, from this master only (no CDN), without the token.
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert set(assets) == PUBLIC_PATHS - {"/"}
        for path in assets:
            r = c.get(path)
            assert r.status_code == 200 and r.content, path
        # What the page shows needs the token: tests/service/test_http_auth.py's matrix of every
        # route.
