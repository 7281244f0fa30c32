"""a3c-http: A3C and its relatives across machines over HTTP.

The Python API is importable from here (`a3c_http.train`, `a3c_http.attach`,
`a3c_http.load_policy`, `Run`, `Policy`, `TrainError`; a3c_http/api/), loaded on first use: the
services, which import this package too, never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from a3c_http.api import History, Policy, Run, TrainError, attach, load_policy, train

__all__ = ["History", "Policy", "Run", "TrainError", "attach", "load_policy", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from a3c_http import api

        return getattr(api, name)
    raise AttributeError(f"module 'a3c_http' has no attribute {name!r}")
