"""The process settings read from the environment (`A3C_*`): the master's `Settings` and the
worker's `WorkerSettings`, each field checked at start, a bad one a one-line error that names the
variable (the README's configuration reference lists them all)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from a3c_http.net.outbound import environment_proxies
from a3c_http.server.logs import LogFormat, LogLevel
from a3c_http.wire.protocol import DEFAULT_MAX_BODY_BYTES, WORKER_ID_PATTERN

DEFAULT_MAX_HEADER_BYTES = 64 * 1024

PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# A host name or an IP address as a Host or Origin header carries it, without scheme or port.
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9_.-]*[a-z0-9])?|\[?[0-9a-f:.]+\]?")
# What an HTTP header value carries everywhere: printable ASCII, no spaces.
_TOKEN = re.compile(r"[!-~]*")


class _FromEnv(BaseSettings):
    """Settings read from `A3C_<FIELD>` environment variables (an empty one counts as unset),
    validated by pydantic; `from_env` turns a bad one into a one-line error that names it."""

    model_config = SettingsConfigDict(
        env_prefix="A3C_", env_ignore_empty=True, extra="forbid", frozen=True
    )

    token: str | None = None
    # The token from a file (a mounted Kubernetes or Docker secret, `kubectl create secret
    # --from-file`): its text without the white space around it, the final newline among it.
    token_file: Path | None = None
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024)
    # The HTTP edge (a3c_http/server/edge.py, a3c_http/server/headerbounds.py): names besides
    # loopback ones that a tokenless service answers to and whose pages may call it; the bounds on a
    # request's head (line and headers: size, and time from connecting) and on the time its body may
    # take.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    max_header_bytes: int = Field(DEFAULT_MAX_HEADER_BYTES, ge=1024)
    header_timeout_s: PositiveSeconds = 10.0
    body_timeout_s: PositiveSeconds = 60.0
    # Logs (a3c_http/server/logs.py): the level and format of our own loggers (uvicorn's keep its
    # --log-level), and how often a progress line is logged while a run goes on (0: never).
    log_level: LogLevel = "info"
    log_format: LogFormat = "text"
    log_progress_s: float = Field(30.0, ge=0, le=86_400, allow_inf_nan=False)
    # Calls to the other service (a worker's to its master, the master's POST /start_worker) go
    # through the proxy HTTP_PROXY and the like name for the URL; false: straight to it.
    proxy_from_env: bool = False

    @model_validator(mode="before")
    @classmethod
    def _token_from_file(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("token_file"):
            return data
        path = Path(data["token_file"])
        if data.get("token"):
            raise ValueError("A3C_TOKEN and A3C_TOKEN_FILE are both set: keep one")
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not text"
            raise ValueError(f"A3C_TOKEN_FILE={str(path)!r}: cannot read it ({why})") from None
        if not token or not _TOKEN.fullmatch(token):
            raise ValueError(
                f"A3C_TOKEN_FILE={str(path)!r}: the token in it must be printable ASCII without "
                "spaces (it travels in a header)"
            )
        return {**data, "token": token}

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _any_case(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("proxy_from_env")
    @classmethod
    def _proxies_usable(cls, v: bool) -> bool:
        if v:
            environment_proxies()  # a proxy we cannot use stops the service now, not a run later
        return v

    @field_validator("token")
    @classmethod
    def _header_safe(cls, v: str | None) -> str | None:
        # Anything else never authenticates: httpx cannot encode it into a header, and servers
        # and proxies differ on what they make of it.
        if v is not None and not _TOKEN.fullmatch(v):
            raise ValueError("must be printable ASCII without spaces (it travels in a header)")
        return v

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_names(cls, v: Any) -> Any:
        names = v.split(",") if isinstance(v, str) else v
        if not isinstance(names, (list, tuple)):
            return v
        hosts = []
        for name in names:
            host = str(name).strip().lower().removesuffix(".")
            if host and not _HOST_NAME.fullmatch(host):
                raise ValueError(
                    f"{str(name).strip()!r} is not a host name: give names such as "
                    "a3c.example.com, comma-separated, without scheme or port"
                )
            if host:
                hosts.append(host.strip("[]"))
        return tuple(hosts)

    @classmethod
    def from_env(cls) -> Self:
        try:
            return cls()
        except ValidationError as exc:
            raise ValueError(_one_line(exc)) from None


# Settings whose value an error message must not repeat (it would land in a log).
_SECRET = frozenset({"A3C_TOKEN"})


def _one_line(exc: ValidationError) -> str:
    """`A3C_QUEUE_MAX='0': Input should be greater than or equal to 1; A3C_...`"""
    problems = []
    for error in exc.errors():
        if not error["loc"]:  # a check of several settings, whose message names them
            problems.append(str(error["msg"]).removeprefix("Value error, "))
            continue
        name = f"A3C_{str(error['loc'][0]).upper()}"
        raw = os.environ.get(name)
        shown = f"{name}={raw!r}" if raw is not None and name not in _SECRET else name
        problems.append(f"{shown}: {error['msg']}")
    return "; ".join(problems)


class Settings(_FromEnv):
    """The master's settings (see the README's configuration reference)."""

    run_dir: Path = Path("runs/latest")
    workers_file: Path = Path("workers.txt")
    master_url: str | None = Field(None, pattern=r"^https?://")
    persist_interval_s: PositiveSeconds = 5.0
    queue_max: int = Field(10_000, ge=1)
    # The most worker ids one run's registry holds (master/run/registry.py).
    max_workers: int = Field(1024, ge=1, le=1_000_000)
    # quiet: uvicorn's access log leaves out the successful requests of the workers' training
    # loop (hundreds a second); all: every request, as uvicorn logs by default.
    access_log: Literal["quiet", "all"] = "quiet"
    # Processes that take the workers' gradient pushes on an address of their own (master/
    # fronts.py): 0, the master's own process takes them all.
    fronts: int = Field(0, ge=0, le=64)
    fronts_bind: str | None = Field(None, pattern=r"^(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):\d{1,5}$")

    @model_validator(mode="after")
    def _fronts_have_an_address(self) -> Settings:
        if self.fronts and not self.fronts_bind:
            raise ValueError(
                "A3C_FRONTS needs A3C_FRONTS_BIND, the host:port its fronts listen on (e.g. "
                "0.0.0.0:33334, beside the master's own port)"
            )
        return self


class WorkerSettings(_FromEnv):
    """A worker's settings (see the README's configuration reference)."""

    master_retry_s: PositiveSeconds = 60.0
    torch_threads: int = Field(1, ge=1)
    # A worker that joins by itself (worker/joiner.py): the master's URL, what it calls itself
    # there (default: its host name and process id; a pod's host name is the pod's name) and,
    # for /status only, where it can be reached.
    master_url: str | None = Field(None, pattern=r"^https?://[^\s/]+/?$")
    worker_name: str | None = Field(None, min_length=1, max_length=128,
                                    pattern=WORKER_ID_PATTERN)
    worker_url: str | None = Field(None, max_length=2048, pattern=r"^https?://\S+$")
    # Gradient pushes go from a child process (a3c_http/net/push_process.py), not from threads of
    # the training process, whose rollouts they would slow; false: from threads.
    push_process: bool = True
