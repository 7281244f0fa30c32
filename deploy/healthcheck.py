#!/usr/bin/env python3
"""The image's HEALTHCHECK: exit 0 when `GET /healthz` of the service in this container answers
200, 1 otherwise. `a3c-healthcheck [PORT ...]`: the ports to try, by default the master's and a
worker's (33333, 8001), so that one image serves both. Standard library only: a slim image has no
curl.

With TLS (A3C_TLS_CERT and A3C_TLS_KEY set, as the service itself is given them: docs/guide/tls.md)
it asks https://127.0.0.1:PORT/healthz, verifies the service's certificate against A3C_TLS_CA (the
system's CAs when unset) and presents A3C_TLS_CERT and A3C_TLS_KEY as its client certificate, so
that a service under mutual TLS (A3C_TLS_MUTUAL=true) answers it too. It does not check the host
name: the certificate names the service as others reach it, not as 127.0.0.1, and the address is
this container's own. This is what Kubernetes' exec probes run under TLS (an httpGet probe cannot
present a client certificate): deploy/kubernetes/overlays/tls."""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request

DEFAULT_PORTS = ("33333", "8001")
TIMEOUT_S = 4.0  # under the HEALTHCHECK's --timeout


def tls_context() -> ssl.SSLContext | None:
    """None without TLS; the context of the service's own certificate and CA with it (OSError
    or ssl.SSLError when the files cannot be read)."""
    cert, key = os.environ.get("A3C_TLS_CERT"), os.environ.get("A3C_TLS_KEY")
    if not (cert and key):
        return None
    context = ssl.create_default_context(cafile=os.environ.get("A3C_TLS_CA") or None)
    context.check_hostname = False  # 127.0.0.1 is not a name the certificate has to hold
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(cert, key)
    return context


def check(port: str, context: ssl.SSLContext | None = None) -> str | None:
    """None when GET /healthz on `port` answers 200; what went wrong otherwise."""
    # No proxy: HTTP_PROXY set for a container's other traffic must not receive this request.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    scheme = "https" if context is not None else "http"
    try:
        with opener.open(f"{scheme}://127.0.0.1:{port}/healthz", timeout=TIMEOUT_S) as reply:
            return None if reply.status == 200 else f"port {port}: {reply.status}"
    except urllib.error.HTTPError as exc:
        return f"port {port}: {exc.code}"
    except urllib.error.URLError as exc:
        return f"port {port}: {exc.reason}"
    except (OSError, ValueError) as exc:
        return f"port {port}: {exc}"


def main(argv: list[str]) -> int:
    ports = argv or DEFAULT_PORTS
    try:
        context = tls_context()
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        print(f"A3C_TLS_CERT, A3C_TLS_KEY or A3C_TLS_CA cannot be used: {exc}", file=sys.stderr)
        return 1
    problems = []
    for port in ports:
        problem = check(port, context)
        if problem is None:
            return 0
        problems.append(problem)
    scheme = "https" if context is not None else "http"
    print(f"GET /healthz ({scheme}) answered nothing or not 200: {'; '.join(problems)}",
          file=sys.stderr)  # fmt: skip
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
