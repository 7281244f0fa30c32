"""The original design (algo `best_weights`, seeds/003): each worker learns with its own
optimizer from its own rollouts; when one of its episodes beats the run's best score it sends its
weights, which become the global weights, and at each heartbeat it sends its weights to its slot
and adopts the global ones if they are newer (another worker's best). Kept so that its behaviour
can be compared with A3C's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from a3c_http.algos.a3c.algorithm import rollout_loss
from a3c_http.algos.base import Algorithm, Sends, WorkerPort
from a3c_http.config.training import TrainConfig
from a3c_http.envs.rollout import Rollout
from a3c_http.models.normalize import merge_moments
from a3c_http.optim.optimizers import make_optimizer


class BestWeights(Algorithm):
    name = "best_weights"
    sends = Sends.WEIGHTS

    def __init__(self, config: TrainConfig, model: nn.Module, policy: Any) -> None:
        super().__init__(config, model, policy)
        self.optimizer = make_optimizer(model.parameters(), config)

    def on_rollout(self, port: WorkerPort, rollout: Rollout) -> None:
        if port.report_episodes(rollout.episodes):
            # The weights that played the record episode become the global weights.
            port.push_weights(temporary=False)
        with port.learning():
            self.optimizer.zero_grad(set_to_none=True)
            terms = rollout_loss(self.policy, rollout, self.config)
            port.note_metrics(terms.as_floats())
            terms.total.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
            merge_moments(self.model, rollout.statistics)

    def on_heartbeat(self, port: WorkerPort) -> None:
        port.push_weights(temporary=True)
        port.pull_weights()
