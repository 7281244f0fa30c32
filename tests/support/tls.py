"""Certificates for the TLS tests, made by `a3c-certs`'s functions (a3c_http/cli/certs.py): the
cluster's CA and a certificate for 127.0.0.1 and localhost, and a CA of a stranger's with one of
its own, which the cluster must not trust."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="a3c-certs needs the `tls` extra (cryptography)")

from a3c_http.cli import certs  # noqa: E402


@dataclass(frozen=True)
class Files:
    ca: Path
    cert: Path  # the cluster's host certificate (127.0.0.1, localhost), signed by `ca`
    key: Path
    stranger_cert: Path  # signed by another CA
    stranger_key: Path

    def env(self, mutual: bool = True) -> dict[str, str]:
        """A3C_TLS_* of a host of the cluster."""
        env = {"A3C_TLS_CERT": str(self.cert), "A3C_TLS_KEY": str(self.key),
               "A3C_TLS_CA": str(self.ca)}
        return {**env, "A3C_TLS_MUTUAL": "true"} if mutual else env


def make_files(folder: Path) -> Files:
    ours, theirs = folder / "cluster", folder / "stranger"
    certs.make_ca(ours)
    host = certs.make_host(ours, "host", ["127.0.0.1", "localhost"])
    certs.make_ca(theirs)
    stranger = certs.make_host(theirs, "host", ["127.0.0.1", "localhost"])
    return Files(ours / "ca.crt", host.cert, host.key, stranger.cert, stranger.key)
