"""The facade's part for runs that learn from experience (`algo` ppo, impala and apex): starting
the learner beside the master (master/learning/learner_process.py), starting it again when it fails,
and taking the workers' rollouts (`POST /experience`, master/ingress/updates.py). A mixin of
`ClusterState` (master/state.py), whose ledger, parameter server and learner process it uses; the
facade's lock order holds (a part never calls another while it holds its own lock)."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import ValidationError

from a3c_http.algos.registry import algorithm_class, learns_from_experience
from a3c_http.config.training import TrainConfig
from a3c_http.models.normalize import batch_problem
from a3c_http.server.service import describe_error
from a3c_http.wire import tensors as wire
from a3c_http.wire.named_tensors import Expected, decode_tensors
from a3c_http.wire.protocol import ROLLOUT_METADATA
from master.api.schemas import RolloutReport
from master.errors import Invalid, StateConflict
from master.learning.learner_loop import Publication
from master.learning.learner_needs import SharedMemoryShort, check_shared_memory, resolve_device
from master.learning.learner_process import MAX_FAILURES_IN_A_ROW, LearnerProcess
from master.learning.parameter_server import ParameterServer
from master.learning.rounds import Outcome
from master.run.events import WARNING
from master.run.ledger import RunLedger


def rollout_expectation(config: TrainConfig, model: Any) -> dict[str, Expected]:
    """What every rollout of a run that learns from experience holds (its algorithm's own
    per-step tensors among them, and its own bounds: an ExperienceAlgorithm's `expected`)."""
    return algorithm_class(config).expected(config, model)


def check_learner_fits(config: TrainConfig, model: Any, expected: dict[str, Expected]) -> None:
    """SharedMemoryShort when the master host's shared memory cannot hold the slots of
    `config`'s learner (its rollouts hold `expected`) and `model`'s weights."""
    capacity = algorithm_class(config).learner.queue_capacity(config)  # an ExperienceAlgorithm
    weights = 4 * sum(t.numel() for t in model.state_dict().values())  # float32
    check_shared_memory(expected, capacity, weights)


def rollout_report(metadata: dict[str, str]) -> RolloutReport | None:
    """The rollout report in a gradient body's metadata (its `a3c` entry), if there is one."""
    text = metadata.get(ROLLOUT_METADATA)
    if text is None:
        return None
    try:
        return RolloutReport.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(describe_error(e) for e in exc.errors())
        raise wire.WireError(
            f"the {ROLLOUT_METADATA!r} metadata of the body is not a rollout report: {problems}"
        ) from None


class LearnerRuns:
    ledger: RunLedger
    params: ParameterServer
    learner: LearnerProcess
    _expected: dict[str, Expected]

    def finish(self, reason: str) -> bool: ...  # ClusterState's
    def _after_change(self, result: Any) -> Any: ...  # ClusterState's

    def _start_learner(
        self,
        resumed: bool = False,
        restart: bool = False,
        expected: dict[str, Expected] | None = None,
    ) -> None:
        """For a run that learns from experience: what its rollouts hold, and, while it runs,
        its learner from the parameter server's weights, optimizer state, target network and
        version (`restart`: the newest it published, after its learner failed). A resumed or
        restarted run whose device this host lacks learns on the CPU (logged)."""
        with self.learner.lifecycle:  # a finish that stops the learner waits, or comes first
            self._start_learner_held(resumed, restart, expected)

    def _start_learner_held(
        self, resumed: bool, restart: bool, expected: dict[str, Expected] | None
    ) -> None:
        config = self.ledger.config
        if config is None or not learns_from_experience(config):
            return
        if not restart:  # a new run's (made by start_run), or a resumed one's
            self._expected = expected or rollout_expectation(config, self.params.net.model)
        if self.ledger.run_state != "running":
            return
        if resumed or restart:
            try:
                resolve_device(config.device)
            except ValueError as exc:
                message = f"{exc}: the learner runs on the CPU"
                self.ledger.events.add(WARNING, "learner_device", message)
                config = config.model_copy(update={"device": "cpu"})
        net = self.params.net
        target = self.params.target
        saved_target = (
            (target.vector, target.version)
            if (resumed or restart) and target.vector is not None and target.version is not None
            else None
        )
        try:
            if resumed:  # a new run's was checked by start_run, a restart's slots are kept
                check_learner_fits(config, net.model, self._expected)
            self.learner.start(
                config, net.snapshot(), self.params.optimizer_state(), self.params.version,
                saved_target,
                restart=restart, expected=self._expected,
            )  # fmt: skip
        except SharedMemoryShort as exc:
            self.learner.error = f"{exc}; then restart the master, which resumes the run"
            self.ledger.events.add(WARNING, "learner_not_started", self.learner.error)

    def _publish(self, version: int, weights: torch.Tensor, publication: Publication) -> None:
        """The learner's weights of `version` and what else `publication` brings."""
        self.params.publish(version, weights, publication.optimizer_state, publication.target)

    def _learner_failed(self, error: str) -> None:
        """The learner process ended on `error` (called from the thread that read it): started
        again from the newest weights it published, with a warning in the master's log; the
        run ends only after MAX_FAILURES_IN_A_ROW failures with no update between them."""
        failures = self.learner.failures_in_a_row
        if self.ledger.run_state != "running":  # it ended meanwhile
            return
        if failures >= MAX_FAILURES_IN_A_ROW:
            self.finish(
                f"the learner failed {failures} times in a row with no update between: {error}"
            )
            return
        version = self.params.version
        message = (
            f"the learner failed ({error}); started again from version {version}, the rollouts "
            "in its queue lost"
        )
        self.ledger.events.add(WARNING, "learner_restarted", message, failures=failures)
        self.ledger.events.flush()
        try:
            self._start_learner(restart=True)
        except Exception as exc:  # whatever stops a learner from starting ends the run, named
            # (where letting it pass would leave a run that neither learns nor ends)
            self.finish(f"the learner failed ({error}) and could not be started again: {exc}")

    def _take_experience(
        self,
        worker_id: str,
        version: int,
        body: bytes,
        run_id: str | None,
        seq: int | None,
        refusal: StateConflict | None,
        config: TrainConfig,
        wait: bool = True,
    ) -> tuple[Outcome, dict[str, Any]]:
        """An admitted experience push (`ClusterState.apply_update`): checked (every tensor's
        name, dtype, shape, finiteness and range, the statistics, the report), its finished
        episodes counted, and queued for the learner. Refused as `apply_update` says; a report
        of a run that refuses rollouts (a finished one) is counted as a gradient push's is;
        LearnerBusy when the learner's queue stayed full for EXPERIENCE_HOLD_S (the worker counts
        as alive while it waits); `wait` False: WouldWait, nothing taken, where it would wait."""
        tensors, metadata = self._checked_experience(body, config, version)
        report = rollout_report(metadata)
        episodes, stats = (report.episodes, report.stats) if report else ([], None)
        stats = stats.model_dump() if stats else None
        duplicate = not self.params.claim(worker_id, seq)
        taken = False

        def alive() -> None:  # while the push waits for the learner
            self.ledger.touch_worker(worker_id)

        slot = None
        try:
            if not duplicate and refusal is None:
                slot = self.learner.reserve(alive, wait)
            try:
                # Counted as a gradient push's are, also when the run refuses the rollout.
                run_summary = self._after_change(
                    self.ledger.report_rollout(worker_id, episodes, stats, run_id, seq)
                )
                if not duplicate:
                    if refusal is not None:
                        raise refusal
                    taken = True
                    assert slot is not None  # reserved: neither a duplicate nor refused
                    self.learner.submit(
                        slot, tensors, version, self.ledger.env_steps(), alive,
                        self._hold_s(config),
                    )  # fmt: skip
            finally:
                if slot is not None and not taken:
                    self.learner.release(slot)
        except Invalid:
            self.params.count_invalid()
            raise
        finally:
            if not duplicate:
                self.params.settle(worker_id, seq, taken)
        if duplicate and not run_summary["duplicate"]:
            self.ledger.count_duplicate(worker_id)
        newest = self.params.weights() if self.params.version > version else None
        weights = newest or (None, self.params.version)
        return Outcome.ready(weights, duplicate), run_summary

    def _hold_s(self, config: TrainConfig) -> float:
        """How long an experience push that does not complete the learner's batch waits for
        the next update: with `max_in_flight` 0 and at least `queue_size` running workers (who
        will complete it), up to `sync_timeout_s`, so that every worker acts with the newest
        weights (synchronous PPO); else not at all."""
        if config.max_in_flight > 0:  # the learner corrects for the lag instead
            return 0.0
        running, _ = self.ledger.round_expectation()
        return config.sync_timeout_s if len(running) >= config.queue_size else 0.0

    def _checked_experience(
        self, body: bytes, config: TrainConfig, version: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The tensors and metadata of an experience body, checked (WireError or Invalid, and
        counted as a refused update, when they do not pass)."""
        why = None
        if version > self.params.version:
            why = f"X-Model-Version {version} is newer than the master's weights"
        try:
            tensors, metadata = decode_tensors(body, self._expected)
        except wire.WireError:
            self.params.count_invalid()
            raise
        if why is None and self.params.model is not None:
            samples = config.t_max * config.num_envs
            why = batch_problem(self.params.model, tensors, samples)
        if why is not None:
            self.params.count_invalid()
            raise Invalid(f"{why}; nothing taken")
        return tensors, metadata

    def _learner_status(self) -> dict[str, Any] | None:
        """The learner's figures in a run that has one (ppo, impala, apex, apex_dpg, sac), else
        None."""
        config = self.ledger.config
        if config is None or not learns_from_experience(config):
            return None
        return self.learner.status()
