"""The base of the process settings (a3c_http/config/settings.py): `A3C_*` environment variables,
each checked at start, a bad one a one-line error that names the variable (`from_env`), and the
settings both services read (the token, the HTTP edge's bounds, logs, proxies, TLS)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from a3c_http.net.outbound import environment_proxies
from a3c_http.net.tls import TLS, TLSError
from a3c_http.server.logs import LogFormat, LogLevel
from a3c_http.wire.protocol import DEFAULT_MAX_BODY_BYTES

DEFAULT_MAX_HEADER_BYTES = 64 * 1024

PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# A host name or an IP address as a Host or Origin header carries it, without scheme or port.
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9_.-]*[a-z0-9])?|\[?[0-9a-f:.]+\]?")
# What an HTTP header value carries everywhere: printable ASCII, no spaces.
_TOKEN = re.compile(r"[!-~]*")


class FromEnv(BaseSettings):
    """Settings read from `A3C_<FIELD>` environment variables (an empty one counts as unset),
    validated by pydantic; `from_env` turns a bad one into a one-line error that names it."""

    model_config = SettingsConfigDict(
        env_prefix="A3C_", env_ignore_empty=True, extra="forbid", frozen=True,
        validate_by_name=True,  # a renamed setting's field by its name too (Settings(receivers=2))
    )

    token: str | None = Field(
        None,
        description="Shared secret. When set, every endpoint but GET /healthz (and the static "
        "files of the dashboard and of /docs) needs `Authorization: Bearer <token>` (401 "
        "otherwise). When unset, only loopback clients are served (403 for others), and only "
        "requests whose Host names the service. Printable ASCII without spaces (what a header "
        "carries); anything else stops the service at start.",
    )
    # The token from a file (a mounted Kubernetes or Docker secret, `kubectl create secret
    # --from-file`): its text without the white space around it, the final newline among it.
    token_file: Path | None = Field(
        None,
        description="A file that holds the token (a mounted Kubernetes or Docker secret): its "
        "text without the white space around it (the final newline of `echo` and "
        "`--from-file` is not part of the token). An unreadable file, or one set together with "
        "A3C_TOKEN, stops the service at start with one line that names the file, never its "
        "content.",
    )
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        description="Larger request bodies get 413 before they are read; POST /train refuses "
        "hidden_sizes whose weights would not fit. A worker also reads no larger reply from its "
        "master (its call fails as soon as the body passes it): set it on the workers as on "
        "the master.",
    )
    # The HTTP edge (a3c_http/server/edge.py, a3c_http/tuning/ `bound_request_heads`): names
    # besides loopback ones that a tokenless service answers to and whose pages may call it; the
    # bounds on a request's head (line and headers: size, and time from connecting) and on the time
    # its body may take.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Comma-separated host names (no scheme, no port) that a service without a "
        "token also answers to, besides 127.0.0.1, ::1, localhost and its own address, and "
        "whose pages (Origin) may call it with or without a token: for a name of your own in "
        "/etc/hosts, or a dashboard behind a proxy.",
    )
    max_header_bytes: int = Field(
        DEFAULT_MAX_HEADER_BYTES,
        ge=1024,
        description="A request whose line and headers are larger gets 431 and its connection "
        "closed; what comes beyond the bound is dropped, not kept.",
    )
    header_timeout_s: PositiveSeconds = Field(
        10.0,
        description="A connection that has not sent a whole request line and headers this many "
        "seconds after connecting (or after the first byte of its next request) is closed.",
    )
    body_timeout_s: PositiveSeconds = Field(
        60.0,
        description="A request body not received within this many seconds of the request's "
        "start gets 408 (32 MiB in 60 s needs about 0.5 MB/s).",
    )
    # Logs (a3c_http/server/logs.py): the level and format of our own loggers (uvicorn's keep its
    # --log-level), and how often a progress line is logged while a run goes on (0: never).
    log_level: LogLevel = Field(
        "info",
        description="debug, info, warning or error (any case): the level of our own loggers, "
        "a3c.master and a3c.worker; uvicorn's own lines keep uvicorn's --log-level.",
    )
    log_format: LogFormat = Field(
        "text",
        description="text: lines for people; json: one JSON object per line for a log "
        "collector (our lines; uvicorn's keep its format).",
    )
    log_progress_s: float = Field(
        30.0,
        ge=0,
        le=86_400,
        allow_inf_nan=False,
        description="Seconds between two progress lines while a run goes on; 0: none.",
    )
    # Calls to the other service (a worker's to its master, the master's POST /start_worker) go
    # through the proxy HTTP_PROXY and the like name for the URL; false: straight to it.
    proxy_from_env: bool = Field(
        False,
        description="true: the workers' calls to the master and the master's POST "
        "/start_worker go through the proxy that HTTP_PROXY, HTTPS_PROXY or ALL_PROXY (either "
        "case) names for the URL, unless NO_PROXY lists its host; only http:// and https:// "
        "proxies (another stops the service at start). false: those variables are ignored and "
        "every call goes straight to its host.",
    )

    # TLS (a3c_http/net/tls.py): every process reads the same four variables.
    tls_cert: Path | None = Field(
        None,
        description="This host's certificate (PEM; a chain is allowed). With A3C_TLS_KEY, "
        "a3c-master and a3c-worker serve HTTPS, and under A3C_TLS_MUTUAL it is also the client "
        "certificate this service presents on its own calls. `a3c-certs` makes one.",
    )
    tls_key: Path | None = Field(None, description="The private key of A3C_TLS_CERT (PEM).")
    tls_ca: Path | None = Field(
        None,
        description="The CA bundle (PEM) every call this service makes verifies its peer "
        "against, and under A3C_TLS_MUTUAL the CA a client's certificate must be signed by. "
        "Unset: the system's CAs (SSL_CERT_FILE may name them). With any A3C_TLS_* set, a "
        "plain http:// URL (A3C_MASTER_URL, workers.txt, POST /train's body) is refused and a "
        "URL without a scheme is https.",
    )
    tls_mutual: bool = Field(
        False,
        description="true: mutual TLS. The service accepts no connection without a client "
        "certificate signed by A3C_TLS_CA (the handshake fails before any HTTP is read); the "
        "token still applies. Needs A3C_TLS_CA, A3C_TLS_CERT and A3C_TLS_KEY.",
    )

    @property
    def tls(self) -> TLS:
        """The TLS settings (checked at start)."""
        return TLS(self.tls_cert, self.tls_key, self.tls_ca, self.tls_mutual)

    @model_validator(mode="after")
    def _tls_works(self) -> Self:
        try:
            tls = self.tls.check()
            url = getattr(self, "master_url", None)
            if url:
                tls.require_https(url, "A3C_MASTER_URL")
        except TLSError as exc:
            raise ValueError(str(exc)) from None
        return self

    @classmethod
    def variables(cls, name: str) -> list[str]:
        """The environment variables of field `name`: `A3C_<NAME>`, then the old names a renamed
        setting is still read by (its `validation_alias`)."""
        alias = cls.model_fields[name].validation_alias
        if isinstance(alias, AliasChoices):
            return [str(choice) for choice in alias.choices]
        return [f"{cls.model_config['env_prefix']}{name.upper()}"]

    @classmethod
    def variable(cls, name: str) -> str:
        """The variable that set field `name`: an old name if that is the one set, else
        `A3C_<NAME>` (what an error message names)."""
        names = cls.variables(name)
        return next((v for v in names if os.environ.get(v)), names[0])

    @model_validator(mode="before")
    @classmethod
    def _old_and_new_names_agree(cls, data: Any) -> Any:
        for name in cls.model_fields:
            given = [(v, os.environ[v]) for v in cls.variables(name) if os.environ.get(v)]
            if len({value for _, value in given}) > 1:
                (new, value), (old, other) = given[:2]
                raise ValueError(
                    f"{new}={value!r} and {old}={other!r} (its old name) are both set, to "
                    f"different values: keep {new}"
                )
        return data

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
            raise ValueError(_one_line(cls, exc)) from None


# Settings whose value an error message must not repeat (it would land in a log).
_SECRET = frozenset({"A3C_TOKEN"})


def _one_line(model: type[FromEnv], exc: ValidationError) -> str:
    """`A3C_QUEUE_MAX='0': Input should be greater than or equal to 1; A3C_...`"""
    problems = []
    for error in exc.errors():
        if not error["loc"]:  # a check of several settings, whose message names them
            problems.append(str(error["msg"]).removeprefix("Value error, "))
            continue
        name = _variable(model, str(error["loc"][0]))
        raw = os.environ.get(name)
        shown = f"{name}={raw!r}" if raw is not None and name not in _SECRET else name
        problems.append(f"{shown}: {error['msg']}")
    return "; ".join(problems)


def _variable(model: type[FromEnv], loc: str) -> str:
    """The variable the user set for an error's `loc`: a field's name, or one of its variables."""
    for name in model.model_fields:
        if loc == name or loc in model.variables(name):
            return model.variable(name)
    return f"A3C_{loc.upper()}"
