"""A worker: `uvicorn worker.app:app --port 8001`. It waits for `POST /start_worker` from the
master, or with A3C_MASTER_URL joins the master's runs itself (worker/joiner.py), then trains in a
background thread until the run ends; it can serve one run after another.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import torch
from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from a3c_http import tuning
from a3c_http.algos.a3c.config import A3CConfig
from a3c_http.algos.base import Sends
from a3c_http.algos.exploration import Exploration
from a3c_http.algos.registry import AnyTrainConfig, algorithm_class
from a3c_http.config.settings import WorkerSettings
from a3c_http.net.client import A3CError, MasterClient, MasterUnavailable
from a3c_http.net.tls import TLSError
from a3c_http.server import logs
from a3c_http.server.service import (
    JSON_BODY,
    conflict,
    describe_error,
    install_common,
    protected_router,
)
from a3c_http.wire.protocol import METRICS_CONTENT_TYPE as METRICS_TYPE
from a3c_http.wire.protocol import WORKER_ID_PATTERN
from worker.joiner import CannotTrain, Joiner
from worker.metrics import exposition
from worker.trainer import Progress, Trainer

WorkerStatus = Literal["idle", "running", "stopping", "done", "failed"]


class StartIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    master_url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://")
    push_url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://",
        description="Where to send gradient pushes: the master's receivers (A3C_RECEIVERS); unset: "
        "master_url.",
    )
    worker_id: str = Field(min_length=1, max_length=128, pattern=WORKER_ID_PATTERN)
    config: AnyTrainConfig = Field(default_factory=A3CConfig)
    run_id: str | None = Field(None, max_length=64)
    exploration: Exploration | None = Field(
        None,
        description="This worker's exploration settings, derived by the master from its place in "
        "the run's worker list; unset or null: the config's entropy_coef and no log-std offset.",
    )


class WorkerService:
    """The worker's one training slot and what /status shows of it."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.token = settings.token
        self.master_retry_s = settings.master_retry_s
        self._lock = threading.Lock()
        self.state: WorkerStatus = "idle"
        self.worker_id: str | None = None
        self.master_url: str | None = None
        self.run_id: str | None = None
        self.error: str | None = None
        self.master_gone = False  # the last run ended because the master could not be reached
        self.exploration: Exploration | None = None
        self.progress = Progress()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: MasterClient | None = None

    def start(self, body: StartIn, own_url: str | None) -> None:
        try:  # a worker with TLS configured sends nothing over plain HTTP
            for url, source in ((body.master_url, "master_url"), (body.push_url, "push_url")):
                if url:
                    self.settings.tls.require_https(url, source)
        except TLSError as exc:
            raise HTTPException(422, str(exc)) from None
        with self._lock:
            if self.state in ("running", "stopping"):
                raise HTTPException(
                    409, f"already {self.state} for run {self.run_id} of {self.master_url}"
                )
            self.state = "running"
            self.worker_id, self.master_url = body.worker_id, body.master_url
            self.run_id = body.run_id
            self.error, self.master_gone = None, False
            self.exploration = (body.exploration or Exploration()).resolved(body.config)
            self.progress = Progress()
            self._stop = threading.Event()
            events = logs.Events(logging.getLogger("a3c.worker"), body.run_id, body.worker_id)
            settings, cfg = self.settings, body.config
            gradients = algorithm_class(cfg).sends is Sends.GRADIENTS
            push_process = {
                "log_level": settings.log_level,
                "log_format": settings.log_format,
                "worker_id": body.worker_id,
            }
            self._client = MasterClient(
                body.master_url,
                self.token,
                retry_deadline_s=self.master_retry_s,
                run_id=body.run_id,
                stop=self._stop,
                events=events,
                push_threads=min(cfg.max_in_flight, cfg.max_staleness),
                # Gradient pushes, many in flight between a training thread's backward passes,
                # go from the push process; a rollout (one in flight) costs a thread less than a
                # pipe to a process (docs/performance.md, "A worker's own cost").
                push_process=push_process if settings.push_process and gradients else None,
                max_reply_bytes=settings.max_body_bytes,
                proxy_from_env=settings.proxy_from_env,
                push_url=body.push_url,
            )
            self._thread = threading.Thread(
                target=self._train,
                args=(
                    body,
                    self.exploration,
                    own_url,
                    self._client,
                    self._stop,
                    self.progress,
                    events,
                ),
                name=f"a3c-trainer-{body.worker_id}",
                daemon=True,
            )
            self._thread.start()

    def take(self, run: dict[str, Any], master_url: str, own_url: str | None) -> bool:
        """Train in `run`, as a master's POST /join gave it (worker/joiner.py); whether it
        started (not when the slot is taken). CannotTrain: a run this worker cannot train (its
        config does not validate here: an environment whose module is not importable, ...)."""
        try:
            body = StartIn(
                master_url=master_url,
                push_url=run.get("push_url"),
                worker_id=run["worker_id"],
                run_id=run["run_id"],
                config=run["config"],
                exploration=run.get("exploration") or None,
            )
        except ValidationError as exc:  # e.g. an environment whose module is not here
            why = "; ".join(describe_error(e, "run") for e in exc.errors())
            raise CannotTrain(f"this worker cannot train run {run.get('run_id')}: {why}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise CannotTrain(f"the master's run cannot be trained here: {exc}") from None
        try:
            self.start(body, own_url)
        except HTTPException:  # a POST /start_worker took the slot first
            return False
        return True

    def _train(
        self,
        body: StartIn,
        exploration: Exploration,
        own_url: str,
        client: MasterClient,
        stop: threading.Event,
        progress: Progress,
        events: logs.Events,
    ) -> None:
        cfg = body.config
        events.info(
            "worker_started",
            "worker started",
            master_url=body.master_url,
            env_id=cfg.env_id,
            algo=cfg.algo,
            num_envs=cfg.num_envs,
            entropy_coef=exploration.entropy_coef,
        )
        error: str | None = None
        master_gone = False
        unexpected: Exception | bool = False  # the traceback to log with the error, if any
        try:
            torch.set_num_threads(self.settings.torch_threads)  # this thread's intra-op threads
            Trainer(
                exploration.config_for(body.config),
                client,
                body.worker_id,
                own_url,
                stop,
                progress,
                log_std_offset=exploration.log_std_offset,
                events=events,
                progress_s=self.settings.log_progress_s,
            ).run()
        except MasterUnavailable as exc:
            error = f"{exc} (gave up after A3C_MASTER_RETRY_S={self.master_retry_s:g} s)"
            master_gone = True
        except A3CError as exc:
            error = str(exc)
        except Exception as exc:  # an environment or model error: report it, keep serving
            error, unexpected = f"{type(exc).__name__}: {exc}", exc
        # Our own state first: whoever sees the master's record of this end must see ours too.
        with self._lock:
            self.state = "failed" if error else "done"
            self.error, self.master_gone = error, master_gone
        if error:  # with a traceback only for what nobody expected (not a master that is gone)
            events.error("worker_failed", "worker failed", exc_info=unexpected, error=error)
        else:
            events.info(
                "worker_finished",
                "worker finished",
                reason="told to stop" if stop.is_set() else "the master ended the run",
                episodes=progress.episodes,
                env_steps=progress.env_steps,
            )
        try:
            client.retry_deadline_s = min(self.master_retry_s, 10.0)
            client.worker_done(body.worker_id, error)
        except A3CError:
            pass  # the master is gone or the run is over: nothing else to tell
        finally:
            client.close()

    def stop(self) -> None:
        with self._lock:
            if self.state == "running":
                self.state = "stopping"
            self._stop.set()

    def busy(self) -> bool:
        """Whether a run holds the slot (its trainer has not ended yet)."""
        thread = self._thread
        return self.state in ("running", "stopping") or (thread is not None and thread.is_alive())

    def join(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def status(self) -> dict[str, Any]:
        p = self.progress
        return {
            "state": self.state,
            "worker_id": self.worker_id,
            "master_url": self.master_url,
            "run_id": self.run_id,
            "episodes": p.episodes,
            "steps": p.steps,
            "env_steps": p.env_steps,
            "last_reward": p.last_reward,
            "steps_per_s": p.steps_per_s,
            "updates": p.updates,
            "http_retries": self._client.retries if self._client else 0,
            "error": self.error,
            "exploration": self.exploration.model_dump() if self.exploration else None,
            "metrics": {k: round(v, 6) for k, v in p.metrics.items()},
            "time": {
                "rollout_s": round(p.time_rollout_s, 3),
                "learn_s": round(p.time_learn_s, 3),
                "http_s": round(p.time_http_s, 3),
            },
            "exchanges": {
                "in_flight": p.in_flight,
                "in_flight_limit": p.in_flight_limit,
                "round_trip_ms": round(p.round_trip_s * 1000, 3) if p.round_trip_s else None,
                "refused": p.refused,
            },
        }


def create_app(token: str | None = None, settings: WorkerSettings | None = None) -> FastAPI:
    """The worker app; `settings` default to the environment's, `token` overrides theirs."""
    settings = settings or WorkerSettings.from_env()
    logs.configure(settings.log_level, settings.log_format)
    if token is not None:
        settings = settings.model_copy(update={"token": token})
    tuning.keep_freed_memory(settings.max_body_bytes)  # the master's weights, a reply at a time
    service = WorkerService(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        joiner = Joiner(service) if settings.master_url else None
        if joiner is not None:  # A3C_MASTER_URL: this worker joins the master's runs itself
            joiner.start()
        app.state.joiner = joiner
        # As the master does: what start-up built, out of the collector's sight.
        tuning.freeze_startup_objects()
        yield
        # On SIGTERM: stop joining, tell the trainer to stop and give it time to send
        # POST /worker_done (the master then shows this worker as done: it left).
        service.stop()
        if joiner is not None:
            joiner.close()
        service.stop()  # a run the joiner started meanwhile
        service.join(timeout=15)

    # FastAPI's /docs and /redoc load from a CDN: install_common serves /docs from the package.
    app = FastAPI(
        title="a3c-http worker", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.worker = service
    install_common(app, settings)
    router = protected_router()

    @router.get("/status")
    def status() -> dict[str, Any]:
        return service.status()

    @router.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {METRICS_TYPE: {}}, "description": "Prometheus text format"}},
    )
    def metrics() -> Response:
        """This worker's rollout, gradient and HTTP times, for Prometheus to scrape."""
        return Response(exposition(service.status), media_type=METRICS_TYPE)

    @router.post(
        "/start_worker",
        status_code=202,
        responses={**JSON_BODY, **conflict("already running or stopping a run")},
    )
    def start_worker(body: StartIn, request: Request) -> dict[str, Any]:
        service.start(body, str(request.base_url).rstrip("/"))
        return {"data": {"worker_id": body.worker_id, "state": service.state}}

    @router.post("/stop", status_code=202)
    def stop() -> dict[str, Any]:
        service.stop()
        return {"data": {"state": service.state}}

    app.include_router(router)

    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn worker.app:app` builds the app on first access (no side effects on import).
    if name == "app":
        global app
        try:
            app = create_app()
        except ValueError as exc:  # a bad setting: say which, without a traceback
            raise SystemExit(f"a3c-http worker: {exc}") from None
        return app
    raise AttributeError(name)
