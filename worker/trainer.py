"""The worker's training loop: collect a rollout, hand it to the run's algorithm, repeat.

What the worker does with each rollout is its algorithm's (a3c_http/algos/: A3C, sync A2C, the
original design's best weights, asynchronous DQN, and the actors of PPO, IMPALA and Ape-X); this
module is the port they do it through (`WorkerPort`): pushes of gradients, or of the rollout itself
for a learner beside the master, with the rollout's finished episodes and the worker's statistics,
whose replies bring the new weights and the run's summary; episode reports; weights pushed and
pulled; the target network fetched. Up to the
algorithm's `pushes_in_flight` pushes are in flight while the worker collects its next rollouts
(worker/pipeline.py). A heartbeat goes only when no reply came for `heartbeat_interval_s`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from a3c_http.algos.base import Algorithm, GradientUpdate
from a3c_http.algos.exploration import widened
from a3c_http.algos.learner import rollout_tensors
from a3c_http.algos.registry import algorithm_for, model_for
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Episode, Rollout, RolloutCollector
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.net.client import A3CError, Conflict, MasterClient, Stopped, Weights
from a3c_http.optim.flatnet import bind
from a3c_http.server.logs import Events, ProgressClock
from a3c_http.wire import tensors as wire
from worker.pipeline import Pipeline


@dataclass
class Progress:
    """What the worker's /status shows; written by the training thread only."""

    episodes: int = 0
    steps: int = 0  # the lengths of the episodes the master accepted
    env_steps: int = 0  # every environment step, of finished episodes and of those going on
    last_reward: float | None = None
    steps_per_s: float | None = None
    updates: int = 0  # gradients or global weights the master took from this worker
    started_at: float = field(default_factory=time.monotonic)
    # Seconds spent in each phase, for the HTTP-versus-compute figures of the benchmarks.
    time_rollout_s: float = 0.0
    time_learn_s: float = 0.0
    time_http_s: float = 0.0  # waiting for the master: replies, and the weights at the start
    in_flight: int = 0  # gradient pushes on their way, after the last rollout
    in_flight_limit: int = 0  # how many the round trip needs now (worker/pipeline.py)
    round_trip_s: float | None = None  # the shortest recent round trip of a push
    refused: int = 0  # pushes the master refused (too stale, or outliers): their rollouts dropped
    # The latest training metrics under the names SB3 and TensorBoard users chart.
    metrics: dict[str, float] = field(default_factory=dict)
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=100))


def worker_seed(run_seed: int, worker_id: str) -> int:
    """The seed of one worker's torch and environments: the run's, made different per worker and
    brought below 2**31 (what gymnasium's reset takes) whatever the run's seed."""
    return (run_seed + zlib.crc32(worker_id.encode())) % 2**31


class _Stop(Exception):
    """The master or the worker's own /stop ended the run."""


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        client: MasterClient,
        worker_id: str,
        worker_url: str | None,
        stop_event: threading.Event,
        progress: Progress,
        log_std_offset: float = 0.0,
        events: Events | None = None,
        progress_s: float = 0.0,
    ) -> None:
        """`config` is this worker's own (its entropy_coef); `log_std_offset` widens the Gaussian
        policy it acts and learns with (a3c_http/algos/exploration.py). A progress line goes to
        `events` every `progress_s` seconds (0: never)."""
        self.config = config
        self.client = client
        self.worker_id = worker_id
        self.worker_url = worker_url
        self.stop_event = stop_event
        self.progress = progress
        self.log_std_offset = log_std_offset
        self.model: ActorCritic | None = None
        # What acts and is scored: the model, its widened Gaussian, or an epsilon-greedy Q-network.
        self.policy: Any = None
        self.algorithm: Algorithm | None = None  # the run's (a3c_http/algos/)
        self.pipeline: Pipeline | None = None  # the pushes in flight
        self._rollout_started = time.monotonic()
        self.version = 0
        self.layout: wire.Layout | None = None
        # the model's weights (a3c_http/optim/flatnet.py `bind`)
        self.flat: torch.Tensor | None = None
        self.last_reply = time.monotonic()
        self.events = events or Events(logging.getLogger("a3c.worker"), None, worker_id)
        self.progress_clock = ProgressClock(progress_s)
        self._logged_steps = 0  # env steps at the last progress line

    def run(self) -> None:
        """Train until told to stop. Raises on failure; the caller reports it."""
        # _Stop: the master ended the run, or this worker's /stop: a clean end.
        with contextlib.suppress(_Stop):
            self._train()

    def _train(self) -> None:
        cfg = self.config
        seed = worker_seed(cfg.seed or 0, self.worker_id)
        torch.manual_seed(seed)
        self._http(self.client.worker_started, self.worker_id, self.worker_url)
        self.model = model = model_for(cfg)
        self.policy = policy = widened(model, self.log_std_offset)
        # The run's wire dtype: gradients go up in it, weights come back in it.
        self.layout = wire.Layout.of(model, cfg.wire_dtype)
        self.flat = bind(model, self.layout)  # loading weights is one copy into it
        if getattr(cfg, "shards", 1) > 1:  # its gradients go to parameter-server shards
            self.client.use_shards(self.layout)
        collector = RolloutCollector.for_config(cfg, seed)
        self.algorithm = algorithm = algorithm_for(cfg, model, policy)
        self.policy = algorithm.policy
        self.pipeline = pipeline = Pipeline(algorithm.pushes_in_flight())
        try:
            self._load(self._http(self.client.get_weights, self.layout))
            self.last_reply = time.monotonic()
            last_heartbeat = time.monotonic()
            while not self.stop_event.is_set():
                self._rollout_started = time.monotonic()
                # The algorithm's acting policy: the model, its widened Gaussian, or a value-based
                # worker's epsilon-greedy Q-network.
                rollout = collector.collect(
                    algorithm.policy, cfg.t_max, self.version, algorithm.bootstraps_on_worker
                )
                self.progress.time_rollout_s += time.monotonic() - self._rollout_started
                self.progress.env_steps += rollout.num_steps
                algorithm.on_rollout(self, rollout)
                # Quiet: no reply (refusals are not replies) and no heartbeat for a while.
                if time.monotonic() - max(self.last_reply, last_heartbeat) >= (
                    cfg.heartbeat_interval_s
                ):
                    last_heartbeat = time.monotonic()
                    self._heartbeat(algorithm)
                seconds = self.progress_clock.due()
                if seconds is not None:
                    self._log_progress(seconds)
            self._count_replies(pipeline.drain(), ending=True)  # this worker's /stop
        except _Stop:
            # What is on the wire was taken (or refused) by the master: count it like the rest.
            self._count_replies(pipeline.drain(), ending=True)
            raise
        finally:
            collector.close()

    def _log_progress(self, seconds: float) -> None:
        """The progress line: env steps per second over the `seconds` since the last one."""
        p = self.progress
        rate = (p.env_steps - self._logged_steps) / seconds
        self._logged_steps = p.env_steps
        self.events.info(
            "progress",
            "progress",
            episodes=p.episodes,
            env_steps=p.env_steps,
            steps_per_s=round(rate, 1),
            last_return=p.last_reward,
            updates=p.updates,
        )

    # -- exchanges with the master --------------------------------------------------------------

    def _http(self, call, *args, **kwargs):
        started = time.monotonic()
        try:
            return call(*args, **kwargs)
        except Conflict as exc:
            if exc.stop:
                raise _Stop from None
            raise
        except Stopped:  # this worker's /stop or SIGTERM while the master did not answer
            raise _Stop from None
        finally:
            self.progress.time_http_s += time.monotonic() - started

    def _load(self, weights: Weights | None) -> None:
        if weights is None:
            return
        if weights.vector is None:  # an experience push's reply: the worker's are the newest
            if weights.stop:
                raise _Stop
            return
        self.flat.copy_(weights.vector)
        self.version = weights.version
        if weights.stop:
            raise _Stop

    def _note_episodes(self, episodes: list) -> None:
        """Finished episodes in this worker's own progress."""
        p = self.progress
        for ep in episodes:
            p.episodes += 1
            p.steps += ep.length
            p.last_reward = ep.reward
        p.recent_returns.extend(ep.reward for ep in episodes)
        elapsed = time.monotonic() - p.started_at
        p.steps_per_s = round(p.env_steps / elapsed, 1) if elapsed else None
        if p.recent_returns:
            p.metrics["rollout/ep_rew_mean"] = sum(p.recent_returns) / len(p.recent_returns)
        if p.steps_per_s is not None:
            p.metrics["time/fps"] = p.steps_per_s

    def _stats(self) -> dict[str, Any]:
        p = self.progress
        return {
            "episodes": p.episodes,
            "steps": p.steps,
            "env_steps": p.env_steps,
            "steps_per_s": p.steps_per_s,
            "last_reward": p.last_reward,
            "metrics": dict(p.metrics),
        }

    # -- the port the algorithm works through (a3c_http/algos/base.py WorkerPort) ---------------

    @contextlib.contextmanager
    def learning(self) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.progress.time_learn_s += time.monotonic() - started

    def note_metrics(self, metrics: dict[str, float]) -> None:
        self.progress.metrics.update(metrics)

    def push_gradients(self, update: GradientUpdate, rollout: Rollout, wait_s: float) -> None:
        """Hand one push to the pipeline, then take the replies that are in (waiting while more
        than the algorithm's pushes in flight are out) and load the newest weights they bring."""
        self._note_episodes(rollout.episodes)
        self.note_metrics(update.metrics)
        with self.learning():
            # The rollout's observation and return moments travel with the gradients; the master
            # merges them into the shared statistics, which come back with the weights.
            vector = self.layout.flatten(update.gradients | rollout.statistics)
        report = {
            "episodes": [[ep.reward, ep.length] for ep in rollout.episodes],
            "stats": self._stats(),
        }
        self.pipeline.add(
            self.client.push_gradients_async(
                self.worker_id,
                self.version,
                vector,
                self.layout,
                loss=update.loss,
                grad_norm=update.norm,
                wait_s=wait_s,
                report=report,
            )
        )
        self.pipeline.computed(time.monotonic() - self._rollout_started)
        self._take_replies()

    def push_experience(self, rollout: Rollout) -> None:
        """Hand the rollout to the pipeline as one experience push, then take the replies that
        are in (waiting while more than the algorithm's pushes in flight are out) and load the
        newest weights they bring."""
        self._note_episodes(rollout.episodes)
        report = {
            "episodes": [[ep.reward, ep.length] for ep in rollout.episodes],
            "stats": self._stats(),
        }
        self.pipeline.add(
            self.client.push_experience_async(
                self.worker_id,
                rollout.policy_version,
                rollout_tensors(rollout, type(self.algorithm).own_tensors),
                self.layout,
                report=report,
            )
        )
        self.pipeline.computed(time.monotonic() - self._rollout_started)
        self._take_replies()

    def report_episodes(self, episodes: list[Episode]) -> bool:
        improved = False
        for ep in episodes:
            reply = self._http(self.client.episode, self.worker_id, ep.reward, ep.length)
            self._note_episodes([ep])
            improved = improved or bool(reply["improved"])
            if reply["stop"]:
                raise _Stop
        return improved

    def push_weights(self, temporary: bool) -> None:
        weights = self.model.state_dict()
        call = self.client.push_weights
        reply = self._http(call, self.worker_id, weights, temporary, self.layout)
        if not temporary:
            self.version = int(reply["data"]["model_version"])
            self.progress.updates += 1

    def pull_weights(self) -> None:
        self._load(self._http(self.client.get_weights, self.layout, self.version))

    def target_weights(self, if_not_version: int | None) -> Weights | None:
        return self._http(self.client.get_target_weights, self.layout, if_not_version)

    # -- replies -------------------------------------------------------------------------------

    def _take_replies(self) -> None:
        """Take the replies that are in and load the newest weights they bring."""
        pipeline = self.pipeline
        started = time.monotonic()
        try:
            done = pipeline.completed()
        finally:
            self.progress.time_http_s += time.monotonic() - started
        refused = self.progress.refused
        newest, stop = self._count_replies(done)
        self.progress.in_flight = len(pipeline)
        self.progress.in_flight_limit = pipeline.limit
        self.progress.round_trip_s = pipeline.round_trip_s
        if stop:
            raise _Stop
        if newest is not None and newest.version > self.version:
            self._load(newest)
        elif newest is None and self.progress.refused > refused:
            # Only refusals (too stale, or outliers): catch up with the master now, even with
            # pushes in flight. Their replies may be refusals too, and every rollout computed
            # on the old weights meanwhile would be refused in turn.
            self.pull_weights()

    def _count_replies(self, done: list, ending: bool = False) -> tuple[Weights | None, bool]:
        """Count the replies of `done` pushes; the newest weights among them, and whether one
        said the run is over. `ending`: the run is ending, a failed push is not the worker's
        failure any more."""
        newest: Weights | None = None
        stop = False
        for future in done:
            try:
                weights = future.result()
            except Conflict as exc:
                # Too stale, or an outlier: those gradients are dropped; the next reply, or the
                # current weights, bring the worker up to date.
                stop = stop or exc.stop
                self.progress.refused += 0 if exc.stop else 1
                continue
            except Stopped:
                stop = True
                continue
            except A3CError:
                if ending:
                    continue
                raise
            self.progress.updates += 1
            self.last_reply = time.monotonic()
            stop = stop or weights.stop
            if newest is None or weights.version > newest.version:
                newest = weights
        return newest, stop

    def _heartbeat(self, algorithm: Algorithm) -> None:
        stop = self._http(self.client.heartbeat, self.worker_id, **self._stats())
        if stop:
            raise _Stop
        algorithm.on_heartbeat(self)
