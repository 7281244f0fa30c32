"""`a3c-master` and `a3c-worker`: `uvicorn master.app:app` and `uvicorn worker.app:app` with the
flags docs/http-api.md documents, the master on port 33333 and a worker on 8001 unless told
otherwise.

Everything else is set as for uvicorn itself, through the A3C_* environment variables
(docs/configuration.md, "Environment variables"); with A3C_TLS_CERT and A3C_TLS_KEY they serve
HTTPS, and with A3C_TLS_MUTUAL they require client certificates (a3c_http/net/tls.py): what
`uvicorn` would need as its --ssl-* flags. The app is imported from the installed
packages, never from the current directory (as `uvicorn` would with its default `--app-dir .`).
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys

import uvicorn

from a3c_http.net import tls

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
MASTER_PORT, WORKER_PORT = 33333, 8001  # the ports each binds unless told otherwise
# The first parameter-server shard's port where a fixed one is wanted (A3C_SHARDS_PORT in the
# Kubernetes base and compose.yaml; a shard started on another host, docs/guide/scaling.md).
SHARD_PORT = 33340


def parser(prog: str, what: str, port: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=f"Run {what} (uvicorn); its settings are the A3C_* environment variables.",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (127.0.0.1); a private interface, or 0.0.0.0 in a container, "
        "only with A3C_TOKEN set",
    )
    p.add_argument("--port", type=int, default=port, help=f"port to bind ({port})")
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=None,
        help="uvicorn's own log level (info); our loggers take A3C_LOG_LEVEL",
    )
    p.add_argument(
        "--http",
        choices=("auto", "h11", "httptools"),
        default="auto",
        help="uvicorn's HTTP implementation (auto: httptools where installed)",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        default=None,
        metavar="IPS",
        help="comma-separated addresses of proxies whose X-Forwarded-* headers are trusted "
        "(uvicorn's default: $FORWARDED_ALLOW_IPS, else 127.0.0.1)",
    )
    p.add_argument(
        "--timeout-graceful-shutdown",
        type=int,
        default=None,
        metavar="S",
        help="on SIGTERM, wait at most this many seconds for open requests (default: until "
        f"they end; {tls.TLS_SHUTDOWN_S} when serving TLS, where an idle client would hold it "
        "for 30 s)",
    )
    return p


def serve(app: str, prog: str, what: str, port: int, argv: list[str] | None) -> int:
    args = parser(prog, what, port).parse_args(argv)
    try:
        served = tls.current()
    except tls.TLSError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if _in_use(args.host, args.port):
        print(
            f"{prog}: {args.host}:{args.port} is in use (another {prog} serving there? stop "
            f"it, or give this one --port)",
            file=sys.stderr,
        )
        return 2
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        http=args.http,
        forwarded_allow_ips=args.forwarded_allow_ips,
        **{
            "timeout_graceful_shutdown": args.timeout_graceful_shutdown,
            **served.uvicorn_kwargs(),  # HTTPS with A3C_TLS_CERT and A3C_TLS_KEY
            **({"timeout_graceful_shutdown": args.timeout_graceful_shutdown}
               if args.timeout_graceful_shutdown is not None else {}),
        },  # fmt: skip
    )
    return 0


def _in_use(host: str, port: int) -> bool:
    """Whether another socket holds `host`:`port` (uvicorn would exit on a bare `[Errno 98]`);
    any other reason a bind fails is uvicorn's to report."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def master(argv: list[str] | None = None) -> int:
    """`a3c-master`: the master service."""
    return serve("master.app:app", "a3c-master", "the a3c-http master", MASTER_PORT, argv)


def worker(argv: list[str] | None = None) -> int:
    """`a3c-worker`: a worker service."""
    return serve("worker.app:app", "a3c-worker", "an a3c-http worker", WORKER_PORT, argv)
