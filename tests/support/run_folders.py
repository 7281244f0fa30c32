"""A run folder as a master saves it, made in-process for the tests of what reads one (export, the
Python API's `load_policy`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from a3c_http.algos.registry import model_for, train_config
from a3c_http.config.training import TrainConfig
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.store.runstore import RunStore, Snapshot
from a3c_http.wire import tensors as wire


def make_run(folder: Path, **fields: Any) -> tuple[TrainConfig, ActorCritic]:
    """A run folder as a master saves it, with random weights: the policy head scaled up so that
    its outputs differ between observations (and Pendulum's means pass the Box's bounds), and
    running statistics far from the identity, so that their folding shows. CartPole's policy is
    a controller of the raw observation (`balance`): it plays long episodes only with the
    statistics applied."""
    config = train_config(seed=11, max_steps=None, **fields).resolved()
    torch.manual_seed(0)
    model = model_for(config)
    with torch.no_grad():
        head = next(getattr(model, n) for n in ("q_head", "policy_head", "actor_mean", "actor_out")
                    if hasattr(model, n))  # fmt: skip
        head.weight.mul_(300.0)
        if config.normalize_obs:
            n = model.obs_rms.mean.numel()
            model.obs_rms.mean.copy_(torch.linspace(-0.3, 0.4, n))
            model.obs_rms.var.copy_(torch.linspace(0.2, 4.0, n))
            model.obs_rms.count.fill_(5000.0)
        if config.env_id == "CartPole-v1" and hasattr(model, "policy_torso"):  # an MLP policy
            balance(model)
    store = RunStore.acquire(folder)
    store.save(Snapshot(
        config={**config.model_dump(), "run_id": "r1"},
        state={"run_id": "r1", "model_version": 42},
        weights=wire.encode(model.state_dict()),
    ))
    store.close()
    return config, model.eval()


def balance(model: ActorCritic) -> None:
    """Push right when pole angle + angular velocity > 0 (several hundred steps an
    episode), through the normalisation: the torso passes the normalised observation
    n = (x - mean) / std through nearly linearly (tanh(0.01 n)), and the head turns it back into
    the raw x, whose sign the logits then take."""
    gains = torch.tensor([0.0, 0.0, 1.0, 1.0])
    std = (model.obs_rms.var + 1e-8).sqrt()
    torso, head = model.policy_torso[0], model.policy_head
    torso.weight.copy_(0.01 * torch.eye(4))
    torso.bias.zero_()
    head.weight.zero_()
    head.bias.zero_()
    head.weight[1] = gains * std / 0.01
    head.bias[1] = (gains * model.obs_rms.mean).sum()
