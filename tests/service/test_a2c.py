"""algo a2c (A2C across machines): the master gathers one gradient per running worker for
the current version and applies their mean in one step. Through TestClient, the test playing the
workers from threads; ordering is shown with the round's state, never with timing."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import anyio.to_thread
import httpx
import torch
from fastapi.testclient import TestClient

from a3c_http.algos.registry import model_for, train_config
from a3c_http.local.cluster import wait_for
from a3c_http.wire import tensors as wire
from master.learning.admission import RunLimits
from master.learning.parameter_server import ParameterServer
from tests.support.common import OCTET, master_running

SYNC = {"algo": "a2c"}


def global_weights(c: TestClient) -> tuple[dict[str, torch.Tensor], int]:
    r = c.get("/global_model_weights")
    assert r.status_code == 200, r.text
    tensors = wire.decode(r.content, c.app.state.cluster.params.spec)
    return tensors, int(r.headers["X-Model-Version"])


def random_grads(c: TestClient, seed: int) -> dict[str, torch.Tensor]:
    """Gradients whose norm (about 0.1) is within the default max_grad_norm, as a worker's."""
    generator = torch.Generator().manual_seed(seed)
    model = c.app.state.cluster.params.model
    return {
        n: torch.randn(p.shape, generator=generator) * 1e-3 for n, p in model.named_parameters()
    }


def push(
    c: TestClient, worker_id: str, version: int, grads: dict[str, torch.Tensor], seq: int = 1
) -> httpx.Response:
    headers = {
        **OCTET,
        "X-Worker-Id": worker_id,
        "X-Model-Version": str(version),
        "X-A3C-Seq": str(seq),
    }
    return c.post("/gradients", content=wire.encode(grads), headers=headers)


def reply(pending: Future[httpx.Response]) -> httpx.Response:
    """A push's reply. The bound only turns a round that never closes into a failure instead of
    a hang; no test depends on how long a reply takes."""
    return pending.result(timeout=60)


def gathered(c: TestClient) -> set[str]:
    """The workers whose gradients the open round holds."""
    current = c.app.state.cluster.params.round
    return set(current.updates) if current is not None else set()


def in_round(c: TestClient, *workers: str) -> Callable[[], bool]:
    return lambda: set(workers) <= gathered(c)


def stepped(
    c: TestClient, start: dict[str, torch.Tensor], grad_sets: list[dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The weights a fresh copy of the master's optimizer reaches from `start` with one step per
    gradient set."""
    config = c.app.state.cluster.ledger.config
    model = model_for(config)
    model.load_state_dict(start)
    used = c.app.state.cluster.params.net.optimizer
    optimizer = type(used)(model.parameters(), **used.defaults)
    for grads in grad_sets:
        for name, param in model.named_parameters():
            param.grad = grads[name].clone()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def close_to(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)


def test_a_round_waits_for_every_running_worker_and_applies_the_mean(tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool, master_running(tmp_path, **SYNC) as c:
        start, version = global_weights(c)
        g1, g2 = random_grads(c, 1), random_grads(c, 2)
        first = pool.submit(push, c, "w1", version, g1)
        wait_for(in_round(c, "w1"), 10, "w1's gradients in the round")
        assert not first.done()  # w2 is running and has not sent: w1 waits
        second = pool.submit(push, c, "w2", version, g2)
        replies = [reply(first), reply(second)]
        for r in replies:
            assert r.status_code == 200, r.text
            assert r.headers["X-Model-Version"] == str(version + 1)
        assert replies[0].content == replies[1].content
        after, new_version = global_weights(c)
        assert new_version == version + 1
        mean = {n: (g1[n] + g2[n]) / 2 for n in g1}
        assert close_to(after, stepped(c, start, [mean]))
        # Not one worker's step, nor a step per worker.
        for other in ([g1], [g2], [g1, g2]):
            assert not close_to(after, stepped(c, start, other))
        status = c.get("/status").json()
        assert (status["sync_rounds"], status["sync_gradients_per_round"]) == (1, 2.0)
        assert (status["updates_applied"], status["updates_rejected"]) == (2, 0)
        assert status["config"]["algo"] == "a2c"


def test_a_round_with_a_silent_worker_closes_at_its_timeout(tmp_path: Path) -> None:
    with ThreadPoolExecutor(1) as pool, master_running(tmp_path, sync_timeout_s=0.2, **SYNC) as c:
        _, version = global_weights(c)
        # w2 never sends and no other request comes: the round closes at its deadline.
        r = reply(pool.submit(push, c, "w1", version, random_grads(c, 1)))
        assert r.status_code == 200, r.text
        assert r.headers["X-Model-Version"] == str(version + 1)
        status = c.get("/status").json()
        assert (status["sync_rounds"], status["sync_gradients_per_round"]) == (1, 1.0)
        # w2's late gradients, of the version before the round, are stale: it pulls and goes on.
        late = push(c, "w2", version, random_grads(c, 2))
        assert late.status_code == 409
        assert "versions old (algo a2c" in late.json()["detail"]
        assert "X-A3C-Stop" not in late.headers
        status = c.get("/status").json()
        assert (status["model_version"], status["updates_rejected"]) == (version + 1, 1)


def test_a_retry_in_the_round_gets_its_reply_and_a_second_push_is_409(tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool, master_running(tmp_path, **SYNC) as c:
        _, version = global_weights(c)
        grads = random_grads(c, 1)
        first = pool.submit(push, c, "w1", version, grads, 7)
        wait_for(in_round(c, "w1"), 10, "w1's gradients in the round")
        other = push(c, "w1", version, grads, 8)
        assert other.status_code == 409
        assert "already sent gradients" in other.json()["detail"]
        retry = pool.submit(push, c, "w1", version, grads, 7)
        wait_for(lambda: c.app.state.cluster.ledger.workers.get("w1").duplicates == 1, 10, "retry")
        assert not first.done() and not retry.done()
        assert push(c, "w2", version, random_grads(c, 2)).status_code == 200
        assert reply(first).content == reply(retry).content
        assert reply(retry).headers["X-A3C-Duplicate"] == "1"
        status = c.get("/status").json()
        assert (status["sync_gradients_per_round"], status["updates_rejected"]) == (2.0, 1)


def test_a_round_stops_waiting_for_a_worker_that_failed(tmp_path: Path) -> None:
    with ThreadPoolExecutor(1) as pool, master_running(tmp_path, **SYNC) as c:
        _, version = global_weights(c)
        first = pool.submit(push, c, "w1", version, random_grads(c, 1))
        wait_for(in_round(c, "w1"), 10, "w1's gradients in the round")
        r = c.post("/worker_done", json={"worker_id": "w2", "error": "the environment raised"})
        assert r.status_code == 200, r.text
        # Closed by the report itself, long before the 10 s timeout.
        assert c.app.state.cluster.params.round is None
        assert reply(first).headers["X-Model-Version"] == str(version + 1)


def test_waiting_requests_hold_no_threadpool_thread(tmp_path: Path) -> None:
    """With two threadpool tokens, five workers still meet in one round: a waiting request
    awaits on the event loop (if each held a thread, the third could not even be screened)."""
    workers = [f"w{i}" for i in range(1, 6)]
    with ThreadPoolExecutor(5) as pool, master_running(tmp_path, workers=5, **SYNC) as c:

        def two_tokens() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = 2

        c.portal.call(two_tokens)
        _, version = global_weights(c)
        pending: list[Future[httpx.Response]] = []
        for i, worker_id in enumerate(workers[:-1]):
            pending.append(pool.submit(push, c, worker_id, version, random_grads(c, i)))
        wait_for(in_round(c, *workers[:-1]), 10, "four workers' gradients in the round")
        assert not any(p.done() for p in pending)
        last = push(c, workers[-1], version, random_grads(c, 9))
        assert last.status_code == 200, last.text
        assert all(reply(p).status_code == 200 for p in pending)
        assert c.get("/status").json()["sync_gradients_per_round"] == 5.0


def test_a_round_steps_on_the_mean_not_the_sum() -> None:
    """With plain SGD at lr=1 the step is exactly minus the gradients it was given."""
    config = train_config(seed=1, max_steps=None, algo="a2c")
    params = ParameterServer()
    params.start_run(config, model_for(config), next_version=False)
    params.net.optimizer = torch.optim.SGD([params.net.params], lr=1.0)
    before = {k: v.clone() for k, v in params.model.state_dict().items()}
    names = [n for n, _ in params.model.named_parameters()]
    grads = [torch.full((params.net.layout.numel,), k * 5e-4) for k in (1, 2, 6)]
    workers = {"a", "b", "c"}
    limits = RunLimits.of(config)
    outcomes = [
        params.join_round(params.checked_update(w, 0, g, config, limits), config, None, workers)
        for w, g in zip(sorted(workers), grads, strict=True)
    ]
    assert all(o.is_done() for o in outcomes) and params.version == 1
    for name in names:
        assert torch.allclose(params.model.state_dict()[name], before[name] - 1.5e-3)


def test_a_worker_a_round_closed_without_is_not_waited_for_until_it_sends(
    tmp_path: Path,
) -> None:
    # One registered but silent worker used to make every round wait out sync_timeout_s.
    timeouts = {"sync_timeout_s": 60, "heartbeat_timeout_s": 120}
    with ThreadPoolExecutor(2) as pool, master_running(tmp_path, **timeouts, **SYNC) as c:
        params = c.app.state.cluster.params
        _, version = global_weights(c)
        first = pool.submit(push, c, "w1", version, random_grads(c, 1), 1)
        wait_for(in_round(c, "w1"), 10, "w1's gradients in the round")
        params.close_round(params.round.number)  # what its deadline does
        assert reply(first).status_code == 200 and params.absent == {"w2"}
        # The next round closes on w1's gradients alone, at once.
        second = pool.submit(push, c, "w1", version + 1, random_grads(c, 2), 2)
        r = wait_for(lambda: second.done() and second.result(), 10, "the round without w2")
        assert r.status_code == 200 and r.headers["X-Model-Version"] == str(version + 2)
        # Once w2 sends again, rounds wait for it again.
        third = pool.submit(push, c, "w2", version + 2, random_grads(c, 3), 1)
        wait_for(in_round(c, "w2"), 10, "w2's gradients in the round")
        assert params.absent == set() and not third.done()
        assert push(c, "w1", version + 2, random_grads(c, 4), 3).status_code == 200
        assert reply(third).status_code == 200
