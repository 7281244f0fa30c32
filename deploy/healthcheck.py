#!/usr/bin/env python3
"""The image's HEALTHCHECK: exit 0 when `GET /healthz` of the service in this container answers
200, 1 otherwise. `a3c-healthcheck [PORT ...]`: the ports to try, by default the master's and a
worker's (33333, 8001), so that one image serves both. Standard library only: a slim image has no
curl."""

from __future__ import annotations

import sys
import urllib.request

DEFAULT_PORTS = ("33333", "8001")
TIMEOUT_S = 4.0  # under the HEALTHCHECK's --timeout


def healthy(port: str) -> bool:
    # No proxy: HTTP_PROXY set for a container's other traffic must not receive this request.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/healthz", timeout=TIMEOUT_S) as reply:
            return reply.status == 200
    except (OSError, ValueError):
        return False


def main(argv: list[str]) -> int:
    ports = argv or DEFAULT_PORTS
    if any(healthy(port) for port in ports):
        return 0
    print(f"GET /healthz answered nothing or not 200 on port {', '.join(ports)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
