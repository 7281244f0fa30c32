"""A parameter-server shard started by hand or by a host's supervisor, for a master whose
A3C_SHARDS_URLS names it (master/shards/__init__.py):

    A3C_TOKEN=... A3C_SHARDS_SECRET=... uvicorn master.shards.app:app --host 0.0.0.0 --port 33340

It reads the same settings as the master (the token, TLS, body bounds) and takes the master's
own calls only with A3C_SHARDS_SECRET. It holds nothing until the master opens it with a run's
slice; started again after a failure, it holds nothing again, and the master puts every shard
back at one version. A shard the master starts itself (no A3C_SHARDS_URLS) is not this: the
master forks it (master/shards/processes.py)."""

from __future__ import annotations

import torch
from fastapi import FastAPI

from a3c_http import tuning
from a3c_http.config.settings import Settings
from a3c_http.server import logs
from master.shards.server import create_app


def build() -> FastAPI:
    settings = Settings.from_env()
    if not settings.shards_secret:
        raise SystemExit(
            "a3c-http shard: set A3C_SHARDS_SECRET, the secret the master's A3C_SHARDS_SECRET "
            "also holds (its calls to open this shard and apply pushes carry it)"
        )
    logs.configure(settings.log_level, settings.log_format)
    tuning.keep_freed_memory(settings.max_body_bytes)
    torch.set_num_threads(1)
    return create_app(settings, settings.shards_secret)


def __getattr__(name: str) -> FastAPI:
    # `uvicorn master.shards.app:app` builds it on first access: importing has no side effects.
    if name == "app":
        global app
        try:
            app = build()
        except ValueError as exc:  # a bad setting: say which, without a traceback
            raise SystemExit(f"a3c-http shard: {exc}") from None
        return app
    raise AttributeError(name)
