"""Taking up the run a master finds in its run folder, or saying why it cannot.

A run folder is the user's data, and a master always opens its own folder again or says why it
cannot. One whose folder holds a run it cannot resume (the saved config no longer validates, e.g.
an env module not in A3C_ENV_MODULES; weights or optimizer state that do not decode or hold NaN;
a run.db that is not a database or misses a table; a state that does not parse) does not exit:
`resume` raises `CannotResume`, whose message names the file, what is wrong and what to do, and
the master (master/state.py) starts idle, logs it, shows it in /status, writes nothing into that
run's files, and moves them to archive/ at its next POST /train (master/persistence/saver.py). A
master restarted once the cause is fixed resumes the run.

After a crash (the run was running and its last save is not a clean shutdown's) the model version
jumps (`versions_to_skip`): the crashed master may have handed out versions after its last
successful save, whose weights are lost, and a version names one set of weights for ever.
"""

from __future__ import annotations

import io
import json
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import ValidationError

from a3c_http.algos.registry import model_for
from a3c_http.config.files import saved_config
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import listed_modules
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.optim.flatnet import non_finite_optimizer_state
from a3c_http.store.runstore import DB, RunStore, Snapshot, find_non_finite
from a3c_http.wire import tensors as wire
from master.learning.parameter_server import ParameterServer
from master.run.ledger import RunLedger

# The least a resumed master's model version jumps after a crash: a few seconds of updates since
# the last save, with room to spare.
VERSIONS_SKIPPED_AFTER_A_CRASH = 1_000_000
# Far above what a master applies (a few thousand updates a second): the jump grows by this many
# versions for every second since the last successful save, so that a long save outage (a full
# disk, saves failing for hours while updates go on) is passed too.
UPDATES_PER_S_BOUND = 100_000


def versions_to_skip(saved_at: float | None, now: float) -> int:
    """How far the model version jumps when a run whose last successful save was at `saved_at`
    is resumed after a crash at `now` (unix times): VERSIONS_SKIPPED_AFTER_A_CRASH, plus
    UPDATES_PER_S_BOUND for every second between them. It rises exactly with time, not rounded:
    a resumed master whose own saves fail (the disk still full) hands out versions above its
    jump, and should it crash too, the next jump, from the same last save, passes them by the
    versions of the time in between."""
    since = max(0.0, now - saved_at) if saved_at is not None else 0.0
    return VERSIONS_SKIPPED_AFTER_A_CRASH + math.ceil(since * UPDATES_PER_S_BOUND)


class CannotResume(Exception):
    """The run in a master's folder cannot be resumed. `str()` is the whole story: which file,
    what is wrong, what to do. `fix`: what would make it resumable (None: nothing; it can only be
    archived). `next_version`: the version a new run of this folder begins after, when known."""

    def __init__(
        self,
        store: RunStore,
        why: str,
        run_id: str | None,
        fix: str | None,
        next_version: int | None = None,
    ) -> None:
        self.file = store.path(DB)
        self.run_id = run_id
        self.next_version = next_version
        # Where POST /train moves the run's files: by its id, or when it is unknown by the time
        # run.db was last written (the same name whichever master finds it, as /status said).
        self.aside = run_id or time.strftime("unresumable-%Y%m%d-%H%M%S", _written(self.file))
        self.archive = store.archive_path(self.aside)
        what = f"{self.file} holds run {run_id}, which" if run_id else str(self.file)
        moved = f"run {run_id} is" if run_id else "its files are"
        new_run = f"POST /train to start a new run; {moved} then moved to {self.archive}/"
        if fix is None:
            todo = f"It cannot be resumed as saved: {new_run}"
        else:
            todo = f"{fix} and restart the master to resume it, or {new_run}"
        super().__init__(f"{what} cannot be resumed: {why}. {todo}")

    def public(self) -> dict[str, Any]:
        """/status's `resume_error`."""
        return {
            "error": str(self),
            "run_id": self.run_id,
            "file": str(self.file),
            "archive_to": str(self.archive),
        }


@dataclass
class _Saved:
    """A saved run, read and checked: everything a master takes up, nothing taken up yet."""

    snapshot: Snapshot
    config: TrainConfig | None
    model: ActorCritic | None
    optimizer: dict[str, Any] | None
    skipped: int
    run_id: str | None
    next_version: int | None  # for a new run, should this one not be taken up after all
    target: torch.Tensor | None = None  # a value-based run's target network


@dataclass(frozen=True)
class Resumed:
    """A run taken up: the model versions skipped (0 but after a crash) and when its last save
    was made (unix time)."""

    skipped: int
    saved_at: float | None


def resume(
    store: RunStore, ledger: RunLedger, params: ParameterServer, now: float
) -> Resumed | None:
    """Take up the run saved in `store`'s folder at `now`; None when it holds none. Raises
    CannotResume, the ledger and the parameter server then possibly half restored (the caller
    starts afresh)."""
    saved = _read(store, now)
    if saved is None:
        return None
    snap, config, state = saved.snapshot, saved.config, saved.snapshot.state
    try:
        elapsed_s = float(state.get("elapsed_s", 0.0))
        ledger.restore(state, elapsed_s, config, snap.queue)
        if config is not None:
            params.restore(
                config, saved.model, state, saved.optimizer, snap.temporary, saved.skipped,
                saved.target,
            )  # fmt: skip
    except Exception as exc:  # a state that parses but does not fit what this master keeps
        why = f"its saved state does not fit this master ({type(exc).__name__}: {exc})"
        raise CannotResume(store, why, saved.run_id, None, saved.next_version) from exc
    ledger.events.run_resumed(
        ledger.run_id, ledger.run_state, ledger.stats, elapsed_s, params.version, saved.skipped
    )
    return Resumed(saved.skipped, _number(state.get("saved_at")))


def _read(store: RunStore, now: float) -> _Saved | None:
    try:
        snap = store.load()
    except (sqlite3.DatabaseError, ValueError) as exc:  # not a database, a table missing, ...
        run_id, next_version = _peek(store, now)
        why = (
            f"SQLite cannot read it ({exc})"
            if isinstance(exc, sqlite3.Error)
            else f"its saved state does not parse ({exc})"
        )
        raise CannotResume(store, why, run_id, None, next_version) from exc
    if snap is None:
        return None
    state = snap.state
    if not isinstance(state, dict) or not isinstance(snap.config, dict):
        run_id, next_version = _peek(store, now)
        why = "its saved state does not parse (not a JSON object)"
        raise CannotResume(store, why, run_id, None, next_version)
    run_id = state.get("run_id") if isinstance(state.get("run_id"), str) else None
    skipped = _skipped(state, now)
    version = _number(state.get("model_version"))
    next_version = int(version) + skipped if version is not None else None

    def cannot(why: str, fix: str | None = None) -> CannotResume:
        return CannotResume(store, why, run_id, fix, next_version)

    bad = find_non_finite(state) or find_non_finite([value for _, value in snap.queue])
    if bad is not None:
        raise cannot(f"its saved state holds {bad}")
    if not snap.weights:  # no run with a network (an idle master's counters): nothing to build
        return _Saved(snap, None, None, None, 0, run_id, next_version)
    try:
        config = saved_config(snap.config)
    except ValidationError as exc:
        raise cannot(f"its config no longer validates: {_problems(exc)}", _fix(exc)) from None
    try:
        model = model_for(config)
    except Exception as exc:  # the environment cannot be made as it was
        raise cannot(f"its environment cannot be built ({exc})", "Fix that") from exc
    try:
        model.load_state_dict(wire.decode(snap.weights, wire.spec_of(model)))
    except (wire.WireError, RuntimeError) as exc:
        raise cannot(f"its global weights (table blobs, 'weights') do not load: {exc}") from None
    try:
        optimizer = torch.load(io.BytesIO(snap.optimizer or b""), weights_only=True)
        bad = non_finite_optimizer_state(optimizer)
    except Exception as exc:  # torch.load's errors have no common type
        why = f"its optimizer state (table blobs, 'optimizer') does not load: {exc}"
        raise cannot(why) from exc
    if bad is not None:
        raise cannot(f"{bad} (table blobs, 'optimizer') holds NaN or infinite values")
    target = None
    if snap.target:
        try:
            target, _ = wire.Layout.of(model).decode(snap.target)
        except wire.WireError as exc:
            raise cannot(
                f"its target network (table blobs, 'target') does not load: {exc}"
            ) from None
    return _Saved(snap, config, model, optimizer, skipped, run_id, next_version, target)


def _written(path: os.PathLike) -> time.struct_time:
    """When `path` was last written (local time), or now when it cannot be read."""
    try:
        return time.localtime(os.stat(path).st_mtime)
    except OSError:
        return time.localtime()


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _skipped(state: dict[str, Any], now: float) -> int:
    """The versions to skip when resuming `state`: none but after a crash."""
    crashed = state.get("run_state") == "running" and not state.get("clean_shutdown", False)
    return versions_to_skip(_number(state.get("saved_at")), now) if crashed else 0


def _peek(store: RunStore, now: float) -> tuple[str | None, int | None]:
    """The run id of a folder whose run does not load and the version a new run of the folder
    begins after, as far as they can still be read."""
    try:
        meta = store.saved_meta()
    except sqlite3.Error:
        return None, None
    found: dict[str, dict[str, Any]] = {}
    for key in ("config", "state"):
        try:
            value = json.loads(meta.get(key, "{}"))
        except ValueError:
            value = None
        found[key] = value if isinstance(value, dict) else {}
    run_id = found["state"].get("run_id") or found["config"].get("run_id")
    version = _number(found["state"].get("model_version"))
    next_version = int(version) + _skipped(found["state"], now) if version is not None else None
    return (run_id if isinstance(run_id, str) else None), next_version


def _problems(exc: ValidationError) -> str:
    """`env_id 'my_envs:Foo-v0': module 'my_envs' is not in A3C_ENV_MODULES, ...`"""
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ())) or "config"
        msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        value = error.get("input")
        shown = f" {value!r}" if isinstance(value, str | int | float) else ""
        problems.append(f"{where}{shown}: {msg}")
    return "; ".join(problems)


def _fix(exc: ValidationError) -> str:
    """What makes a saved config valid again, when it can be said in one setting."""
    for error in exc.errors():
        value = error.get("input")
        if "A3C_ENV_MODULES" in str(error.get("msg")) and isinstance(value, str):
            module = value.rpartition(":")[0]
            listed = ",".join([*listed_modules(), module])
            return f"Set A3C_ENV_MODULES={listed} on the master and every worker"
    return "Fix that"
