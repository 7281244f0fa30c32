"""What the master's weights replies hold, as the client reads them: the weights and the run's
summary (a3c_http/net/client.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from a3c_http.wire import tensors as wire
from a3c_http.wire.protocol import (
    BEST_SCORE_HEADER,
    DUPLICATE_HEADER,
    GLOBAL_EPISODE_HEADER,
    IMPROVED_HEADER,
    MOVING_AVERAGE_HEADER,
    STOP_HEADER,
    VERSION_HEADER,
)


@dataclass(frozen=True)
class Weights:
    """Global weights: `vector` in `layout`'s order (`tensors`: its entries by name, as views).
    A gradient push's reply also carries the run's summary, as `POST /episode` answers them; an
    experience push's reply has no vector when the worker's weights are the newest."""

    vector: torch.Tensor | None
    layout: wire.Layout
    version: int
    stop: bool = False
    run_summary: dict[str, Any] | None = None

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return self.layout.views(self.vector)


def _run_summary(headers: Mapping[str, str]) -> dict[str, Any] | None:
    """The run's summary a weights reply carries; `headers` by lower-case name (httpx's headers,
    or a push process's reply)."""
    if _GLOBAL_EPISODE not in headers:
        return None
    best, average = headers.get(_BEST_SCORE), headers.get(_MOVING_AVERAGE)
    return {
        "global_episode": int(headers[_GLOBAL_EPISODE]),
        "best_score": float(best) if best is not None else None,
        "moving_average": float(average) if average is not None else None,
        "improved": headers.get(_IMPROVED) == "1",
        "stop": headers.get(_STOP) == "1",
        "duplicate": headers.get(_DUPLICATE) == "1",
    }


# The headers `_run_summary` and `_weights` read, by the lower-case names both kinds of headers
# have.
_GLOBAL_EPISODE, _BEST_SCORE, _MOVING_AVERAGE, _IMPROVED, _STOP, _DUPLICATE, _VERSION = (
    name.lower()
    for name in (
        GLOBAL_EPISODE_HEADER, BEST_SCORE_HEADER, MOVING_AVERAGE_HEADER, IMPROVED_HEADER,
        STOP_HEADER, DUPLICATE_HEADER, VERSION_HEADER,
    )
)  # fmt: skip
