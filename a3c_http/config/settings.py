"""The process settings read from the environment (`A3C_*`): the master's `Settings` and the
worker's `WorkerSettings`, on the base both share (a3c_http/config/environment.py), each field
checked at start, a bad one a one-line error that names the variable. Each field's `description`
is the reference: docs/configuration.md is generated from them (docs/hooks/reference.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from a3c_http.config.environment import FromEnv, PositiveSeconds
from a3c_http.config.workerlist import PlainUnderTLS, WorkerListError, read_workers_file
from a3c_http.wire.protocol import WORKER_ID_PATTERN


class Settings(FromEnv):
    """The master's settings (see docs/configuration.md)."""

    run_dir: Path = Field(
        Path("runs/latest"),
        description="The run folder. A master started on a folder that holds a run resumes it "
        "(or, if it cannot, starts idle and says why); one master per folder.",
    )
    workers_file: Path = Field(
        Path("workers.txt"),
        description="The workers list. The default file may be absent or list no worker: POST "
        "/train then starts a run that waits for workers that join. A file this variable names "
        "must exist.",
    )
    master_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="The URL the workers the master starts use to reach it. Unset: the base URL "
        "POST /train was sent to (a 422 when that is a loopback address and some workers are "
        "not).",
    )
    persist_interval_s: PositiveSeconds = Field(
        5.0,
        description="At most this many seconds pass between a change and its being on disk "
        "(while saves succeed: a failed save is retried at this pace).",
    )
    queue_max: int = Field(
        10_000,
        ge=1,
        description="Capacity of the moving-average FIFO; when full the oldest value is dropped "
        "and counted.",
    )
    # The most worker ids one run's registry holds (master/run/registry.py).
    max_workers: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="The most worker ids one run's registry holds (workers the master starts, "
        "workers that join with POST /join and workers that register with POST "
        "/worker_started); a new id beyond it gets 409.",
    )
    # quiet: uvicorn's access log leaves out the successful requests of the workers' training
    # loop (hundreds a second); all: every request, as uvicorn logs by default.
    access_log: Literal["quiet", "all"] = Field(
        "quiet",
        description="quiet: uvicorn's access log leaves out the successful requests of the "
        "workers' training loop (/gradients, /episode, /heartbeat, /global_model_weights, "
        "/target_model_weights, /local_model_weights: hundreds a second, which cost 9 to 17 % "
        "of the env steps/s when written) and the 409s of /gradients and /local_model_weights "
        "(refused stale updates, counted in updates_rejected_by); other errors and every other "
        "route are logged. all: every request.",
    )
    # Processes that take the workers' pushes on an address of their own
    # (master/ingress/receivers.py): 0, the master's own process takes them all.
    receivers: int = Field(
        0,
        ge=0,
        le=64,
        validation_alias=AliasChoices("A3C_RECEIVERS", "A3C_FRONTS"),  # and its old name
        description="Receiver processes that take the workers' pushes (gradients and experience) "
        "on an address of their own, around the master's process; 0: the master's process "
        "takes them all.",
    )
    receivers_bind: str | None = Field(
        None,
        validation_alias=AliasChoices("A3C_RECEIVERS_BIND", "A3C_FRONTS_BIND"),  # and its old name
        pattern=r"^(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):\d{1,5}$",
        description="host:port the receivers listen on (all of them on one socket), beside the "
        "master's own port; needed with A3C_RECEIVERS. Workers the master starts are told the "
        "master URL's host with this port (when this host is 0.0.0.0 or ::), or this host.",
    )
    # Where the parameter-server shards of a run with `shards` above 1 listen (master/shards/).
    shards_host: str = Field(
        "127.0.0.1",
        pattern=r"^[0-9A-Za-z:.\-]+$",
        description="The address the master's parameter-server shards (a run's `shards`) listen "
        "on, and that workers are told: one they can reach (this host's address on the "
        "cluster's network where they are on other hosts). 0.0.0.0 or ::: every address, and "
        "workers are told the host they reach the master at.",
    )
    shards_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="The port of the first shard; shard i listens on this port + i (a fixed "
        "range, for firewalls and container ports). 0: each a free port.",
    )
    shards_urls: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Comma-separated URLs of shards started elsewhere (`uvicorn "
        "master.shards.app:app`, on any host, each with this A3C_SHARDS_SECRET), which a run "
        "with `shards` N uses, exactly N of them, instead of starting its own. One that fails "
        "is waited for (its host starts it again) and every shard then put back at one version.",
    )
    shards_secret: str | None = Field(
        None,
        min_length=16,
        description="The secret of the master's own calls to the shards of A3C_SHARDS_URLS "
        "(opening them, the pushes they apply, their state): the same on the master and on "
        "every such shard, and on no worker.",
    )
    # The run's scalars to Weights & Biases too (master/persistence/wandb_sink.py).
    wandb_project: str | None = Field(
        None,
        max_length=128,
        pattern=r"^[^/\\#?%:\s]+$",
        description="The Weights & Biases project (a name without spaces or `/\\#?%:`) the "
        "master logs each run's TensorBoard scalars to, under the same names and env steps: one "
        "W&B run per run, its id and name the run's id, its config the run's; unset: none. Needs "
        "the `wandb` extra (without it the master does not start). W&B's own variables apply: "
        "WANDB_MODE=offline (files only, for `wandb sync`), WANDB_API_KEY, WANDB_ENTITY, "
        "WANDB_DIR (unset: the files go into `<run folder>/wandb/`). A failure of W&B is a "
        "warning; training goes on.",
    )

    @field_validator("wandb_project")
    @classmethod
    def _wandb_installed(cls, v: str | None) -> str | None:
        if v is not None and importlib.util.find_spec("wandb") is None:
            raise ValueError(
                "the wandb package is not installed: install the `wandb` extra "
                "(./scripts/setup_venv.sh wandb, or pip install 'a3c-http[wandb]')"
            )
        return v

    @model_validator(mode="after")
    def _workers_over_tls(self) -> Settings:
        # An http:// worker under TLS: said at start, not at the first POST /train.
        if self.tls.configured:
            try:
                read_workers_file(self.workers_file, missing_ok=True, served=self.tls)
            except PlainUnderTLS as exc:
                raise ValueError(str(exc)) from None
            except WorkerListError:
                pass  # the file's other problems are POST /train's 422
        return self

    @field_validator("shards_urls", mode="before")
    @classmethod
    def _urls(cls, v: Any) -> Any:
        return tuple(u.strip() for u in v.split(",") if u.strip()) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _remote_shards_have_a_secret(self) -> Settings:
        if self.shards_urls and not self.shards_secret:
            raise ValueError(
                f"{self.variable('shards_urls')} needs A3C_SHARDS_SECRET, the secret of the "
                "master's calls to those shards (the same on each of them)"
            )
        for url in self.shards_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{self.variable('shards_urls')}: {url!r} is not an http(s) URL")
        return self

    @model_validator(mode="after")
    def _receivers_have_an_address(self) -> Settings:
        if self.receivers and not self.receivers_bind:
            raise ValueError(
                f"{self.variable('receivers')} needs A3C_RECEIVERS_BIND, the host:port its "
                "receivers listen on (e.g. 0.0.0.0:33334, beside the master's own port)"
            )
        return self


class WorkerSettings(FromEnv):
    """A worker's settings (see docs/configuration.md)."""

    master_retry_s: PositiveSeconds = Field(
        60.0,
        description="How long a worker retries an unreachable master (or a 5xx) before it gives "
        "up as failed.",
    )
    torch_threads: int = Field(1, ge=1, description="PyTorch intra-op threads per worker.")
    # A worker that joins by itself (worker/joiner.py): the master's URL, what it calls itself
    # there (default: its host name and process id; a pod's host name is the pod's name) and,
    # for /status only, where it can be reached.
    master_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+/?$",
        description="The master this worker joins by itself (POST /join) at start, after each "
        "run and after a restart of either; unset, the worker waits for POST /start_worker.",
    )
    worker_name: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=WORKER_ID_PATTERN,
        description="What a worker that joins calls itself, shown in the master's /status "
        "beside the id it is given. Unset: its host name and process id (in Kubernetes the "
        "pod's name).",
    )
    worker_url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://\S+$",
        description="Where a worker that joins can be reached, shown in the master's /status "
        "(the master never calls it).",
    )
    # Gradient pushes go from a child process (a3c_http/net/push_process.py), not from threads of
    # the training process, whose rollouts they would slow; false: from threads.
    push_process: bool = Field(
        True,
        description="true: gradient pushes go from a child process of the worker "
        "(a3c_http/net/push_process.py); false: from threads of the worker's own process. "
        "Rollouts (the algos with a learner: one push in flight) go from a thread either way.",
    )
