"""Sync A2C across machines (algo `a2c`): each worker computes A3C's gradients of its
rollout (a3c_http/algos/a3c/algorithm.py) and waits for the reply; the master gathers one gradient
of each running worker for the current version and applies their mean in one step, answering every
push of the round with the same new weights (the rounds: master/learning/rounds.py). A round closes
`sync_timeout_s` after its first gradient without the workers that did not send one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from a3c_http.algos.a3c.algorithm import A3C
from a3c_http.algos.base import ParameterServerPort
from a3c_http.config.training import TrainConfig


class SyncA2C(A3C):
    """A3C's worker without pushes in flight, whose replies the master holds until the round
    closes; the master's side joins the round instead of stepping at once."""

    name = "a2c"

    def pushes_in_flight(self) -> int:
        return 0

    def push_wait_s(self) -> float:
        return self.config.sync_timeout_s

    @classmethod
    def apply(
        cls,
        server: ParameterServerPort,
        update: Any,
        config: TrainConfig,
        refusal: Any,
        expected: Callable[[], set[str]],
    ) -> Any:
        return server.join_round(update, config, refusal, expected())
