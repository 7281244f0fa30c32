"""The pieces of the hot path, each on its own: the window of request numbers, the worker's
pipeline of pushes, the flat network and its optimizer, and the quiet access log."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import pytest
import torch

from a3c_http.algos.registry import model_for, train_config
from a3c_http.optim.flatnet import FlatNetwork
from a3c_http.optim.optimizers import make_optimizer
from a3c_http.server.service import QuietAccessLog
from master.ingress.route import UpdateRoute
from master.learning.admission import WIDTH, SeqWindow
from worker.pipeline import Pipeline

# -- SeqWindow ------------------------------------------------------------------------------------


def test_numbers_out_of_order_are_each_taken_once() -> None:
    window = SeqWindow()
    for seq in (5, 2, 4, 1):
        assert not window.seen(seq)
        window.add(seq)
    assert all(window.seen(s) for s in (1, 2, 4, 5)) and not window.seen(3)
    window.add(3)
    assert window.seen(3) and not window.seen(6)


def test_a_number_older_than_the_window_counts_as_taken_and_a_huge_jump_is_cheap() -> None:
    window = SeqWindow()
    window.add(WIDTH + 10)
    assert window.seen(9) and not window.seen(WIDTH + 9)
    window.add(2**62)  # a jump this big must neither take memory nor forget the new number
    assert window.seen(2**62) and not window.seen(2**62 - 1) and window.mask == 1


def test_the_window_survives_a_save_and_an_earlier_versions_single_number() -> None:
    window = SeqWindow()
    for seq in (1, 3, 7):
        window.add(seq)
    again = SeqWindow.from_json(window.to_json())
    assert [again.seen(s) for s in range(1, 9)] == [window.seen(s) for s in range(1, 9)]
    legacy = SeqWindow.from_json(7)  # every number up to 7 was taken
    assert legacy.seen(1) and legacy.seen(7) and not legacy.seen(8)


# -- Pipeline -------------------------------------------------------------------------------------


class TwoInFlight(Pipeline):
    limit = 2  # what the round trip needs is the next test's matter


def test_the_pipeline_keeps_at_most_its_limit_in_flight_and_drains_the_rest() -> None:
    pushes: list[Future] = [Future() for _ in range(4)]
    pipeline = TwoInFlight(max_in_flight=8)
    for push in pushes:
        pipeline.add(push)
    pushes[1].set_result(1)  # later pushes answered first: enough once two are left out
    pushes[3].set_result(3)
    done = pipeline.completed()
    assert sorted(f.result() for f in done) == [1, 3] and len(pipeline) == 2
    pushes[0].set_result(0)
    pushes[2].set_result(2)
    assert [f.result() for f in pipeline.drain()] == [0, 2] and len(pipeline) == 0


class TimedByItself(Future):
    round_trip_s = 0.002  # as a push process's future: the child's figure


def test_a_push_that_times_itself_is_timed_by_its_own_round_trip() -> None:
    """Not by when the caller took its reply in (between rollouts, milliseconds later)."""
    pipeline, push, untimed = Pipeline(max_in_flight=8), TimedByItself(), Future()
    pipeline.add(push)
    pipeline.add(untimed)
    push.set_result(None)
    assert pipeline.round_trip_s == 0.002
    untimed.set_result(None)  # a sender thread's future: timed from add() to its completion
    assert len(pipeline._round_trips) == 2 and pipeline._round_trips[-1] >= 0


@pytest.mark.parametrize(
    ("max_in_flight", "rtt", "compute", "limit"),
    [(0, 1.0, 0.01, 0), (8, 0.001, 0.01, 2), (8, 0.045, 0.01, 6), (8, 1.0, 0.01, 8)],
)
def test_the_limit_is_what_the_round_trip_needs(
    max_in_flight: int, rtt: float, compute: float, limit: int
) -> None:
    pipeline = Pipeline(max_in_flight)
    assert pipeline.limit == min(1, max_in_flight)  # nothing measured yet
    # The shortest counts (the path, no queue); one push that queued is no queue.
    pipeline._round_trips.extend([rtt * 3] + [rtt] * 4)
    pipeline.computed(compute)
    assert pipeline.limit == limit


@pytest.mark.parametrize(
    ("shortest", "seen", "compute", "limit"),
    [
        (0.045, 0.045, 0.01, 6),  # no queue: what the shortest round trip needs
        (0.045, 0.05, 0.01, 6),  # waits shorter than two rollouts: jitter, the limit stays
        (0.045, 0.07, 0.015, 4),  # over half the shortest and one rollout, under two: it stays
        (0.045, 0.0575, 0.01, 6),  # under half the shortest: a long path's jitter, it stays
        (0.0045, 0.0075, 0.001, 1),  # 2 out would keep about 0.8 of them queued, 3: 1.2
        (0.045, 0.085, 0.01, 1),
        (0.045, 0.9, 0.01, 0),  # round trips over twice the shortest: wait for each reply
        (0.0005, 0.003, 0.004, 2),  # loopback: six times the shortest, but under a rollout
    ],
)
def test_a_queue_lowers_the_limit_instead_of_raising_it(
    shortest: float, seen: float, compute: float, limit: int
) -> None:
    """While the round trips seen exceed the shortest by more than two rollouts' compute time, the
    k pushes out after a push (the limit + 1) keep about k x (1 - shortest / seen) of them in a
    queue: the limit keeps that at one at most. A master always busy would otherwise make even
    the shortest round trip long, and the limit would rise with the queue it makes."""
    pipeline = Pipeline(max_in_flight=16)
    pipeline._round_trips.extend([shortest] + [seen] * 8)  # the latest: what is seen now
    pipeline.computed(compute)
    assert pipeline.recent_round_trip_s == seen
    assert pipeline.limit == limit


# -- FlatNetwork ----------------------------------------------------------------------------------


def test_the_flat_step_is_the_per_tensor_step_and_takes_a_saved_per_tensor_state() -> None:
    """Stepping the whole vector as one tensor is RMSprop over the model's tensors one by one;
    an optimizer state saved by an earlier version (per tensor) resumes exactly."""
    config = train_config(seed=0)
    torch.manual_seed(0)
    reference = model_for(config)
    optimizer = make_optimizer(reference.parameters(), config)
    net = FlatNetwork(model_for(config), config)
    net.model.load_state_dict(reference.state_dict())
    grads = [[torch.randn_like(p) for p in reference.parameters()] for _ in range(3)]
    for step in grads[:2]:
        for p, g in zip(reference.parameters(), step, strict=True):
            p.grad = g
        optimizer.step()
        net.step([torch.cat([g.reshape(-1) for g in step])])
    resumed = FlatNetwork(model_for(config), config, optimizer.state_dict())
    resumed.model.load_state_dict(reference.state_dict())
    for p, g in zip(reference.parameters(), grads[2], strict=True):
        p.grad = g
    optimizer.step()
    resumed.step([torch.cat([g.reshape(-1) for g in grads[2]])])
    for name, tensor in reference.state_dict().items():
        assert torch.allclose(resumed.model.state_dict()[name], tensor, atol=1e-7), name
    # The model's tensors are views of the vector: loading weights writes the vector.
    resumed.model.load_state_dict({k: torch.zeros_like(v) for k, v in tensor_items(resumed)})
    assert not resumed.flat.any()


def tensor_items(net: FlatNetwork) -> list[tuple[str, torch.Tensor]]:
    return list(net.model.state_dict().items())


# -- QuietAccessLog -------------------------------------------------------------------------------


def access(path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "POST", path, "1.1", status), None,
    )  # fmt: skip


def test_the_access_log_leaves_out_only_successes_of_the_hot_routes() -> None:
    quiet = QuietAccessLog({"/gradients"})
    assert not quiet.filter(access("/gradients", 200))
    assert quiet.filter(access("/gradients", 409))  # errors stay visible
    assert quiet.filter(access("/train?x=1", 202))  # and every other route
    assert not quiet.filter(access("/gradients?a=b", 304))
    # The master's: also the refusals of updates (counted in updates_rejected_by instead).
    master = QuietAccessLog({"/gradients", "/episode"}, conflicts={"/gradients"})
    assert not master.filter(access("/gradients", 409))
    assert master.filter(access("/gradients", 422))  # a body that does not fit stays visible
    assert master.filter(access("/episode", 409))


def test_the_master_quiets_uvicorns_access_log_unless_told_otherwise(tmp_path) -> None:
    from a3c_http.config.settings import Settings
    from master.app import create_app

    logger = logging.getLogger("uvicorn.access")

    def quiet() -> list[QuietAccessLog]:
        return [f for f in logger.filters if isinstance(f, QuietAccessLog)]

    try:
        create_app(Settings(run_dir=tmp_path / "a")).state.cluster.close()
        assert len(quiet()) == 1 and "/gradients" in quiet()[0].paths
        assert quiet()[0].conflicts == {"/gradients", "/experience", "/local_model_weights"}
        create_app(Settings(run_dir=tmp_path / "b")).state.cluster.close()
        assert len(quiet()) == 1  # once per process, however many apps
    finally:
        for f in quiet():
            logger.removeFilter(f)
    create_app(Settings(run_dir=tmp_path / "c", access_log="all")).state.cluster.close()
    assert quiet() == []


# -- the gradient route ---------------------------------------------------------------------------


def test_the_hot_path_and_the_declared_route_answer_a_push_alike(tmp_path) -> None:
    """POST /gradients is answered by master/ingress/route.py before FastAPI routes it; the
    route declared for the schema answers the same pushes the same way (here without that layer)."""
    from tests.support.common import OCTET, master_running, push_rollout

    def answers(c) -> list:
        layout = c.app.state.cluster.params.net.layout
        headers = {**OCTET, "X-Worker-Id": "w1", "X-Model-Version": "0"}
        bad = {**headers, "X-Model-Version": "-1", "X-A3C-Grad-Norm": "inf"}
        replies = [
            push_rollout(c, 1, [[10.0, 10]]),  # taken
            push_rollout(c, 1, [[10.0, 10]]),  # a retry: the same weights, X-A3C-Duplicate
            c.post("/gradients", content=layout.encode(torch.zeros(layout.numel)), headers=bad),
            c.post("/gradients", content=b"junk", headers={**headers, "X-A3C-Seq": "9"}),
            push_rollout(c, 10, worker="stranger"),
        ]
        return [
            (r.status_code, r.json() if r.status_code != 200 else len(r.content),
             {k: v for k, v in r.headers.items() if k.startswith("x-") or k == "etag"})
            for r in replies
        ]

    with master_running(tmp_path / "hot") as c:
        hot = answers(c)
    with master_running(tmp_path / "route") as c:
        c.app.user_middleware = [m for m in c.app.user_middleware if m.cls is not UpdateRoute]
        c.app.middleware_stack = c.app.build_middleware_stack()
        route = answers(c)
    assert [status for status, _, _ in hot] == [200, 200, 422, 422, 409]
    assert hot == route


def test_glibc_takes_the_settings_that_keep_freed_buffers() -> None:
    """a3c_http/tuning/ (what the settings save is a figure of bench.py's master section,
    not a test's): glibc takes both, and a threshold above its own maximum is brought down to it."""
    import ctypes.util

    from a3c_http.tuning import keep_freed_memory

    if ctypes.util.find_library("c") is None:
        pytest.skip("no C library to ask")
    assert keep_freed_memory(8 * 1024 * 1024)
    assert keep_freed_memory(1 << 40)  # refused by glibc as it is: clamped to 32 MiB


def test_a_push_is_answered_at_once_unless_it_must_wait_for_its_sync_round(tmp_path) -> None:
    """master/ingress/updates.py `take_push`: the answer itself where the master waits for nothing
    (what the receivers' channel answers without a task), an awaitable where a sync round must close
    first."""
    import inspect

    from master.api.headers import PushHeaders
    from master.ingress.updates import take_push
    from tests.support.common import master_running

    def first_push(c) -> object:
        state, metrics = c.app.state.cluster, c.app.state.metrics
        layout = state.params.net.wire
        headers = PushHeaders.model_validate({"X-Worker-Id": "w1", "X-Model-Version": 0})
        body = layout.encode(torch.full((layout.numel,), 1e-3))
        return take_push(state, metrics, "/gradients", headers, body)

    with master_running(tmp_path / "async") as c:
        reply = first_push(c)
        assert isinstance(reply, tuple) and reply[0] == 200
        assert c.app.state.cluster.params.version == 1
    with master_running(tmp_path / "sync", algo="a2c") as c:
        pending = first_push(c)  # w2 has not sent: the round stays open
        assert inspect.isawaitable(pending) and c.app.state.cluster.params.version == 0
        pending.close()
