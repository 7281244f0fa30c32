"""The dashboard in a real headless Chromium (tests/support/browser.py) against the session cluster,
which has a token: the page asks for it once, draws the return curve, lists every worker and the
learner, and its stop button stops the run. Skipped, with the reason, where no Chromium is
installed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from a3c_http.local.cluster import LocalCluster, wait_for
from tests.support.browser import Browser, chromium_or_skip
from tests.support.common import ENDLESS_RUN, TOKEN

pytestmark = pytest.mark.integration

CURVE = """(() => {
  const svg = document.querySelector('#curve');
  const drawn = (cls) => (svg.querySelector('path.' + cls)?.getAttribute('d') || '').length;
  return {episodes: Number(svg.dataset.episodes || 0), line: drawn('episodes'),
          mean: drawn('mean100'), target: svg.querySelectorAll('line.target').length};
})()"""
WORKERS = "[...document.querySelectorAll('#workers tbody tr')].map(r => r.dataset.workerId)"
LEARNER_ROWS = ("Object.fromEntries([...document.querySelectorAll('#learner tr')]"
                ".map(r => [r.cells[0].textContent, r.cells[1].textContent]))")


def test_the_dashboard_draws_the_run_lists_every_worker_and_the_learner_and_stops_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    executable = chromium_or_skip()
    reply = cluster.train(**{**ENDLESS_RUN, "algo": "ppo", "target_return": 475.0})
    assert reply.status_code == 202, reply.text
    wait_for(lambda: cluster.status()["global_episode"] >= 20, 60, "some episodes")
    worker_ids = {w["worker_id"] for w in cluster.status()["workers"]}
    assert len(worker_ids) == len(cluster.workers)

    with Browser(executable, tmp_path / "profile", tmp_path / "chromium.log") as page:
        page.goto(f"{cluster.master.url}/")
        # The master has a token: the page asks for it, and keeps it out of the URL.
        page.wait("!document.querySelector('#token-form').hidden", 20, "the token form")
        page.js(f"""document.querySelector('#token').value = {TOKEN!r};
                    document.querySelector('#token-form').requestSubmit()""")
        curve = page.wait(f"(c => c.episodes >= 20 && c)({CURVE})", 20, "the curve")
        assert curve["line"] > 100 and curve["mean"] > 100 and curve["target"] == 1, curve
        listed = page.wait(f"(ids => ids.length === {len(worker_ids)} && ids)({WORKERS})",
                           20, "the workers table")
        assert set(listed) == worker_ids
        assert page.js("document.querySelector('#state').textContent") == "running"
        # The curve names the run's algorithm; a time of the status reads as a date, not as
        # seconds since the epoch.
        assert page.js("document.querySelector('#env-id').textContent") == "CartPole-v1 · ppo"
        # The learner beside the master: its process and its updates as /status has them.
        learner = cluster.status()["learner"]
        assert page.wait("!document.querySelector('#learner-section').hidden", 20, "the learner")
        assert page.js("document.querySelector('#learner-state').textContent") == (
            "running on cpu, one process")
        rows = page.wait(f"(r => Number(r.updates.replaceAll(',', '')) > 0 && r)({LEARNER_ROWS})",
                         20, "an update")
        assert rows["pids"] == str(learner["pid"]) and "train/value_loss" in rows, rows
        saved = page.wait(
            """[...document.querySelectorAll('#run tr')].filter(
                 r => r.cells[0].textContent === 'last_saved_at' && r.cells[1].textContent !== '–'
               ).map(r => r.cells[1].textContent)[0]""", 20, "a save")
        assert not saved.replace(".", "").isdigit() and str(time.localtime().tm_year) in saved

        # A reload does not ask again; the token is in neither the URL nor the master's log.
        page.send("Page.reload")
        page.wait(f"({CURVE}).episodes >= 20", 20, "the curve after a reload")
        assert page.js("document.querySelector('#token-form').hidden") is True
        assert TOKEN not in page.js("location.href")

        # The stop button takes two clicks: the first only arms it.
        page.js("document.querySelector('#stop').click()")
        assert cluster.status()["state"] == "running"
        page.js("document.querySelector('#stop').click()")
        status = cluster.wait_finished(30)
        assert status["finish_reason"] == "stopped by POST /stop", status
        page.wait("document.querySelector('#state').textContent === 'finished'", 20,
                  "the page to show the run finished")
        assert page.js("document.querySelector('#stop').disabled") is True
    assert TOKEN not in cluster.master.log_path.read_text(errors="replace")


SHARDS = ("[...document.querySelectorAll('#shards tbody tr')]"
          ".map(r => [...r.cells].map(c => c.textContent))")


def test_the_dashboard_lists_every_shard_of_a_run_with_shards(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    executable = chromium_or_skip()
    reply = cluster.train(**{**ENDLESS_RUN, "shards": 2})
    assert reply.status_code == 202, reply.text
    wait_for(lambda: cluster.status()["updates_applied"] > 0, 60, "a push through the shards")
    shards = cluster.status()["shards"]
    with Browser(executable, tmp_path / "profile", tmp_path / "chromium.log") as page:
        page.goto(f"{cluster.master.url}/")
        page.wait("!document.querySelector('#token-form').hidden", 20, "the token form")
        page.js(f"""document.querySelector('#token').value = {TOKEN!r};
                    document.querySelector('#token-form').requestSubmit()""")
        rows = page.wait(f"(r => r.length === 2 && r)({SHARDS})", 20, "the shards table")
        assert [(r[0], r[1], r[4], r[5]) for r in rows] == [
            (str(s["index"]), "running", str(s["pid"]), s["url"]) for s in shards
        ]
        assert page.js("document.querySelector('#learner-section').hidden") is True
    cluster.stop_run()
