"""What a worker's tensors may not decide: the checks the parameter server
(master/learning/parameter_server.py) makes of a decoded body before anything of its push is
counted. A body that fails one is refused whole (422, `Invalid`).

A review found that one push could damage a run for good: gradients of 3e38 reported with a norm
of 0.05 made RMSprop's state infinite and froze learning, running statistics with a variance of
-1e30 and a count of 1e30 turned the global variance into -inf (saved, so the run folder no longer
opened), and whole weights of 3e38 became the global weights, on which every worker then failed.
So:

- gradients: their norm, computed here, is at most `max_grad_norm` (workers clip before they
  send; the norm a worker reports before clipping is only a hint, for the outlier check; in a run
  of wire_dtype bfloat16, give or take bfloat16's rounding, 0.4%), and the batch statistics they
  carry fit one rollout (a3c_http/models/normalize.py `batch_problem`);
- whole weights: their statistics hold no negative count or variance, and the network computes
  finite outputs with them for plain observations.
"""

from __future__ import annotations

import math

import torch
from torch.func import functional_call

from a3c_http.config.training import TrainConfig
from a3c_http.models.normalize import statistics_problem
from a3c_http.optim.flatnet import FlatNetwork
from master.learning.limits import RunLimits


def gradient_problem(
    net: FlatNetwork, vector: torch.Tensor, config: TrainConfig, limits: RunLimits
) -> tuple[float, str | None]:
    """The norm of the gradients in a gradient vector, and what is wrong with the vector (None:
    nothing). A NaN or an infinity makes the norm non-finite: then the vector is searched for
    it, and named (the decoder left that check to this one pass)."""
    norm = net.gradient_norm(vector)
    if not math.isfinite(norm) and not bool(torch.isfinite(net.gradient(vector)).all()):
        return norm, net.wire.non_finite(vector)
    # clip_grad_norm_ leaves at most max_grad_norm, give or take float32's rounding; in a run of
    # wire_dtype bfloat16, rounding each value to bfloat16 (a relative error of at most 2**-8)
    # can raise the norm by that much more, and no more.
    bound = config.max_grad_norm * (1 + 1e-3) * (1 + net.wire.relative_error) + 1e-6
    if norm <= bound:
        return norm, net.batch_problem(vector, limits.rollout_steps)
    return norm, (
        f"the gradients' norm is {norm:.4g}, above max_grad_norm={config.max_grad_norm:g}: a "
        "worker clips its gradients to max_grad_norm before it sends them"
    )


def weights_problem(net: FlatNetwork, vector: torch.Tensor) -> str | None:
    """What makes a weights vector unusable as the global weights, or None: negative counts or
    variances in its statistics, or non-finite outputs for plain observations (zeros and +-1:
    weights so large that the network overflows, e.g. 3e38 everywhere)."""
    tensors = net.layout.views(vector)
    model = net.model
    why = statistics_problem(model, tensors)
    if why is not None:
        return why
    probe = torch.zeros(3, *model.obs_shape)
    probe[1], probe[2] = 1.0, -1.0
    with torch.no_grad():
        dist, value = functional_call(model, tensors, (probe,))
        outputs = dist.logits if model.discrete else dist.mean
    if not bool(torch.isfinite(outputs).all() and torch.isfinite(value).all()):
        return "the network's outputs for plain observations are not finite"
    return None
