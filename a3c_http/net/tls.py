"""TLS and mutual TLS for every connection of a cluster, from four settings that every process
reads from its environment (the master, each worker, the master's receivers, a worker's push
process, `a3c-train`, the Python API):

- `A3C_TLS_CERT`, `A3C_TLS_KEY`: this host's certificate (PEM, chain allowed) and key. With them,
  `a3c-master` and `a3c-worker` serve HTTPS, and every call this process makes presents the
  certificate when the peer asks for one (mutual TLS);
- `A3C_TLS_CA`: the CA bundle that every call verifies its peer against (unset: the system's,
  which `SSL_CERT_FILE` may name) and, under mutual TLS, that a client's certificate must chain
  to;
- `A3C_TLS_MUTUAL=true`: the services accept no connection without such a client certificate
  (the TLS handshake fails: nothing of HTTP is read), and the token still applies on top.

Any of them set, TLS is *configured*: an `http://` URL (A3C_MASTER_URL, workers.txt, the body of
POST /train, `a3c-train --master`) is refused with one line (`require_https`), and a URL without a
scheme is https. Only the standard library's `ssl` is used: a context is made once per process
and per settings (`current().client_context()`), and handed to httpx as `verify`.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

VARIABLES = ("A3C_TLS_CERT", "A3C_TLS_KEY", "A3C_TLS_CA", "A3C_TLS_MUTUAL")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


# How long a service that serves TLS waits, once told to stop, for its open connections before it
# saves and exits (`TLS.uvicorn_kwargs`): a client's request ends well within it, and an idle
# client that never answers the TLS shutdown would hold it for 30 s, past Kubernetes' grace.
TLS_SHUTDOWN_S = 5

class TLSError(ValueError):
    """The TLS settings cannot work (a file missing or unreadable, a key that does not match its
    certificate, mutual TLS without a CA, a plain URL while TLS is configured); one line that
    names the variable."""


@dataclass(frozen=True)
class TLS:
    """One process's TLS settings; `TLS()` is plain HTTP."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    mutual: bool = False

    @property
    def configured(self) -> bool:
        return bool(self.cert or self.ca or self.mutual)

    @property
    def serves(self) -> bool:
        """True when a service with these settings serves HTTPS."""
        return self.cert is not None

    @property
    def scheme(self) -> str:
        return "https" if self.configured else "http"

    def check(self) -> TLS:
        """Raises TLSError unless the files are there and make working contexts."""
        if (self.cert is None) != (self.key is None):
            raise TLSError("A3C_TLS_CERT and A3C_TLS_KEY go together: set both or neither")
        if self.mutual and not (self.cert and self.ca):
            raise TLSError(
                "A3C_TLS_MUTUAL=true needs A3C_TLS_CA (the CA client certificates must be "
                "signed by) and this host's own A3C_TLS_CERT and A3C_TLS_KEY"
            )
        for name, path in (("A3C_TLS_CERT", self.cert), ("A3C_TLS_KEY", self.key),
                           ("A3C_TLS_CA", self.ca)):
            if path is not None and not os.access(path, os.R_OK):
                why = "no such file" if not path.exists() else "not readable"
                raise TLSError(f"{name}={str(path)!r}: cannot read it ({why})")
        self.client_context()
        if self.serves:
            self.server_context()
        return self

    def client_context(self) -> ssl.SSLContext:
        """The context of every call this process makes: verifies the peer's certificate and
        name against A3C_TLS_CA (else the system's CAs) and presents this host's certificate."""
        return self._client_context

    @cached_property
    def _client_context(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        except (ssl.SSLError, OSError) as exc:
            raise TLSError(f"A3C_TLS_CA={str(self.ca)!r}: not a PEM CA bundle ({exc})") from None
        if self.cert and self.key:
            self._load_pair(context)
        return context

    def server_context(self) -> ssl.SSLContext:
        """A server's context as uvicorn makes it of `uvicorn_kwargs`: this host's certificate
        and, under mutual TLS, client certificates of A3C_TLS_CA required."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._load_pair(context)
        if self.mutual:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(str(self.ca))
        return context

    def _load_pair(self, context: ssl.SSLContext) -> None:
        try:
            context.load_cert_chain(str(self.cert), str(self.key))
        except (ssl.SSLError, OSError) as exc:
            raise TLSError(
                f"A3C_TLS_CERT={str(self.cert)!r} with A3C_TLS_KEY={str(self.key)!r}: not a PEM "
                f"certificate and its key ({getattr(exc, 'reason', None) or exc})"
            ) from None

    def uvicorn_kwargs(self) -> dict[str, Any]:
        """uvicorn's settings for a service with these settings (none: plain HTTP): its ssl_*
        ones, and a bound on its graceful shutdown (TLS_SHUTDOWN_S), which an idle client
        stalls under TLS: closing its connection waits for the client's close_notify, up to 30 s
        of asyncio's, and one that does not read (a pooled connection) sends none."""
        if not self.serves:
            return {}
        kwargs: dict[str, Any] = {
            "ssl_certfile": str(self.cert),
            "ssl_keyfile": str(self.key),
            "timeout_graceful_shutdown": TLS_SHUTDOWN_S,
        }
        if self.mutual:
            kwargs.update(ssl_ca_certs=str(self.ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
        return kwargs

    def uvicorn_args(self) -> list[str]:
        """The same as uvicorn's command-line flags."""
        names = {"ssl_certfile": "--ssl-certfile", "ssl_keyfile": "--ssl-keyfile",
                 "ssl_ca_certs": "--ssl-ca-certs", "ssl_cert_reqs": "--ssl-cert-reqs",
                 "timeout_graceful_shutdown": "--timeout-graceful-shutdown"}  # fmt: skip
        args: list[str] = []
        for key, value in self.uvicorn_kwargs().items():
            args += [names[key], str(int(value) if key == "ssl_cert_reqs" else value)]
        return args

    def require_https(self, url: str, source: str) -> None:
        """Raises TLSError for an `http://` URL (from `source`) while TLS is configured."""
        if self.configured and url.strip().lower().startswith("http://"):
            raise TLSError(
                f"{source}: {url.strip()} is plain http:// while TLS is configured "
                f"({', '.join(self.set_variables())}): the token and the tensors would cross "
                "the network in clear; use https://"
            )

    def set_variables(self) -> list[str]:
        values = (self.cert, self.key, self.ca, self.mutual)
        return [name for name, value in zip(VARIABLES, values, strict=True) if value]


def from_environ(environ: Mapping[str, str] | None = None) -> TLS:
    """The TLS settings of an environment (this process's by default), checked; made and checked
    once for the same values (the files are read then)."""
    env = os.environ if environ is None else environ
    return _checked(tuple(env.get(name, "").strip() for name in VARIABLES))


@functools.lru_cache(maxsize=16)
def _checked(values: tuple[str, ...]) -> TLS:
    cert, key, ca, mutual = values
    if mutual.lower() not in _TRUE + _FALSE:
        raise TLSError(f"A3C_TLS_MUTUAL={mutual!r}: expected true or false")
    paths = [Path(v) if v else None for v in (cert, key, ca)]
    return TLS(*paths, mutual=mutual.lower() in _TRUE).check()


def current() -> TLS:
    """This process's TLS settings (read again only when its environment changed)."""
    return from_environ()
