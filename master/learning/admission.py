"""What a worker's push must pass to be admitted: the master's checks, in the order a push meets
them. Each says why something is refused, or None; its caller counts the refusal and answers.

- Its tensors (`gradient_problem`, `weights_problem`), once decoded and before anything of the push
  is counted: gradients finite and within `max_grad_norm`, whole weights usable as the global
  weights; else 422 (`Invalid`), the body refused whole.
- Its report (`RunLimits`): the episodes and env steps a worker claims must be plausible, else 422
  and nothing of the push is counted (master/run/ledger.py, master/run/reports.py).
- Its request number (`X-A3C-Seq`, `SeqWindow`): a number already taken is a retry, answered as
  before and not counted again.
- Its version (`staleness_problem`): gradients of the running run, no staler than `max_staleness`
  (in sync mode, of the current version); else 409.
- Its size (`OutlierFilter`, Gorila's safeguard): a loss or gradient norm far above its worker's
  recent ones is refused, 409, so one diverging worker cannot wreck the global network.

The parameter server (master/learning/parameter_server.py) keeps the request and outlier windows
of the updates and makes every call of them under its lock (the ledger keeps those of the reports,
master/run/records.py); nothing here locks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call

from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import env_spec
from a3c_http.models.normalize import statistics_problem
from a3c_http.optim.flatnet import FlatNetwork

# -- tensors -----------------------------------------------------------------------------------


def gradient_problem(
    net: FlatNetwork, vector: torch.Tensor, config: TrainConfig, limits: RunLimits
) -> tuple[float, str | None]:
    """The norm of the gradients in a gradient vector, and what is wrong with the vector (None:
    nothing): a NaN or an infinity (named: the decoder leaves that check to this one pass), a norm
    above `max_grad_norm` (workers clip before they send; the norm a worker reports before
    clipping is only a hint, for the outlier check), or batch statistics that do not fit one
    rollout (a3c_http/models/normalize.py `batch_problem`)."""
    norm = net.gradient_norm(vector)
    if not math.isfinite(norm) and not bool(torch.isfinite(net.gradient(vector)).all()):
        return norm, net.wire.non_finite(vector)
    why = norm_problem(norm, config, net.wire.relative_error)
    if why is None:
        return norm, net.batch_problem(vector, limits.rollout_steps)
    return norm, why


def norm_problem(norm: float, config: TrainConfig, relative_error: float) -> str | None:
    """Why a gradient of `norm` cannot have been clipped to max_grad_norm, or None."""
    # clip_grad_norm_ leaves at most max_grad_norm, give or take float32's rounding; in a run of
    # wire_dtype bfloat16, rounding each value to bfloat16 (a relative error of at most 2**-8)
    # can raise the norm by that much more, and no more.
    bound = config.max_grad_norm * (1 + 1e-3) * (1 + relative_error) + 1e-6
    if norm <= bound:
        return None
    return (
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


# -- reports -----------------------------------------------------------------------------------

# Far beyond any worker (a CartPole worker makes about 10,000 a second).
MAX_ENV_STEPS_PER_S = 1_000_000
# An episode of an environment without a time limit (the schemas' own bound on a length).
MAX_LENGTH = 1_000_000_000


@dataclass(frozen=True)
class RunLimits:
    """The bounds a run holds every worker report to (the run's counters, best score, "solved"
    and `max_steps` are made of them): a rollout finishes at most `t_max x num_envs` episodes and
    its statistics count at most as many samples; an episode is at most as long as the
    environment's time limit, when it has one; a worker's env steps grow at most
    `MAX_ENV_STEPS_PER_S` a second plus one rollout."""

    rollout_steps: int  # t_max x num_envs: the samples of one rollout
    max_length: int  # the longest episode: the environment's time limit, else MAX_LENGTH

    @classmethod
    def of(cls, config: TrainConfig) -> RunLimits:
        spec = env_spec(config.env_id)
        limit = config.env_kwargs.get("max_episode_steps", spec.max_episode_steps)
        max_length = int(limit) if isinstance(limit, int) and limit > 0 else MAX_LENGTH
        return cls(config.t_max * config.num_envs, max_length)

    def episodes_problem(self, episodes: Iterable[tuple[float, int]], pushed: bool) -> str | None:
        """What is implausible about these finished episodes, or None. `pushed`: they came with
        one rollout's gradients, so at most `rollout_steps` of them."""
        episodes = list(episodes)
        if pushed and len(episodes) > self.rollout_steps:
            return (
                f"{len(episodes)} episodes in one rollout: a rollout of t_max x num_envs = "
                f"{self.rollout_steps} steps finishes at most {self.rollout_steps}"
            )
        for _, length in episodes:
            if length > self.max_length:
                return (
                    f"an episode of {length} steps: this environment's episodes end after at "
                    f"most {self.max_length}"
                )
        return None

    def env_steps_problem(self, claimed: int, before: int, seconds: float) -> str | None:
        """What is implausible about a worker's claim of `claimed` env steps in all, `seconds`
        after it claimed `before`, or None."""
        most = before + MAX_ENV_STEPS_PER_S * max(seconds, 1.0) + self.rollout_steps
        if claimed <= most:
            return None
        return (
            f"env_steps {claimed}: this worker reported {before} {seconds:.1f} s ago, and a worker "
            f"takes at most {MAX_ENV_STEPS_PER_S:,} env steps a second"
        )


# -- request numbers ---------------------------------------------------------------------------

WIDTH = 256
_FULL = (1 << WIDTH) - 1


class SeqWindow:
    """Which of a worker's request numbers were taken. Pushes in flight over several connections
    arrive out of order (7 may land before 6), so the window keeps the highest number taken and one
    bit for each of the `WIDTH` numbers below it (the anti-replay window of IPsec, RFC 4303). A
    number older than the window counts as taken: a retry that late is far staler than
    `max_staleness` allows, and an episode report is never counted twice."""

    __slots__ = ("high", "mask")

    def __init__(self, high: int = 0, mask: int = _FULL) -> None:
        self.high = high
        self.mask = mask  # bit i: number high - i was taken

    def seen(self, seq: int) -> bool:
        if seq > self.high:
            return False
        back = self.high - seq
        return back >= WIDTH or bool(self.mask >> back & 1)

    def add(self, seq: int) -> None:
        if seq > self.high:
            shift = seq - self.high
            self.mask = (self.mask << shift | 1) & _FULL if shift < WIDTH else 1
            self.high = seq
        elif self.high - seq < WIDTH:
            self.mask |= 1 << (self.high - seq)

    def to_json(self) -> list[Any]:
        return [self.high, format(self.mask, "x")]

    @classmethod
    def from_json(cls, data: Any) -> SeqWindow:
        """From `to_json`, or the single number an earlier version saved (every number up to it
        taken)."""
        if isinstance(data, list):
            return cls(int(data[0]), int(data[1], 16))
        return cls(int(data or 0))


# -- staleness ---------------------------------------------------------------------------------


def staleness_problem(
    version: int, current: int, first: int, max_staleness: int, sync: bool
) -> str | None:
    """Why gradients computed on `version` may not be applied to the weights of version `current`,
    in a run that began at version `first`, or None: they are of an earlier run, of a version the
    master never had, more than `max_staleness` versions old, or (`sync`) not of `current`."""
    if version < first:
        why = f"from an earlier run (this run began at version {first})"
    elif version > current:
        why = "from a version this master never had"
    elif sync and version != current:
        why = f"{current - version} versions old (algo a2c takes the current one)"
    elif current - version > max_staleness:
        why = f"{current - version} versions old (max_staleness={max_staleness})"
    else:
        return None
    return (
        f"gradients computed on version {version} are {why}; current version is "
        f"{current}: pull the weights and compute them again"
    )


# -- outliers ----------------------------------------------------------------------------------
#
# Each worker's updates are judged against a window of its own last `WINDOW` ones, once the window
# holds `outlier_warmup`: no client can move the window that judges another, and the absolute
# bound of `gradient_problem` holds from the first update. Both values are judged by the logarithm
# of their size, and only far ABOVE the usual: norms span orders of magnitude (a healthy run's are
# roughly log-normal) and a small one does no harm; a loss's level moves a lot as a run learns and
# the policy loss changes sign. A refused update joins the window too, clipped to the threshold it
# crossed: a burst of outliers cannot make itself look usual at once, yet a run whose level really
# moves is followed within a few dozen updates. A spread below `MIN_LOG_STD` counts as that, so a
# window of (nearly) identical values does not make every other value an outlier.

# Enough for a stable spread, few enough to follow a run whose losses and norms drift as it learns
# (with the defaults, 100 updates are a few seconds of a CartPole run).
WINDOW = 100
# The least spread a window is given: a std of 0.1 of the log (values within about 10 %).
MIN_LOG_STD = 0.1
# The log of zero would be -inf: a norm or loss this small is taken as this.
_TINY = 1e-12


def log_norm(norm: float) -> float:
    return math.log(max(abs(norm), _TINY))


class Window:
    """The last `WINDOW` values, with their mean and spread kept as running sums: judging an
    update costs the same whatever the window's size (the parameter server does it under its
    lock, at every push). The sums are made afresh every `WINDOW` values, so rounding cannot
    drift."""

    def __init__(self, values: Iterable[float] = ()) -> None:
        self.values: deque[float] = deque(maxlen=WINDOW)
        self.clear()
        for value in values:
            self.append(value)

    def __len__(self) -> int:
        return len(self.values)

    def clear(self) -> None:
        self.values.clear()
        self._sum = self._squares = 0.0
        self._since_exact = 0

    def append(self, value: float) -> None:
        if len(self.values) == WINDOW:
            old = self.values[0]
            self._sum -= old
            self._squares -= old * old
        self.values.append(value)
        self._sum += value
        self._squares += value * value
        self._since_exact += 1
        if self._since_exact >= WINDOW:
            self._sum = math.fsum(self.values)
            self._squares = math.fsum(v * v for v in self.values)
            self._since_exact = 0

    def mean_std(self, floor: float) -> tuple[float, float]:
        """Mean and (population) standard deviation, at least `floor`."""
        n = len(self.values)
        mean = self._sum / n
        return mean, max(math.sqrt(max(self._squares / n - mean * mean, 0.0)), floor)


def _judge(
    window: Window, raw: float, what: str, sigma: float, warmup: int
) -> tuple[str | None, float]:
    """Why `raw` (a norm or a loss) is far above the window, or None; and the log of its size,
    clipped to the threshold, as it joins the window when the update is refused."""
    value = log_norm(raw)
    if len(window) < max(warmup, 1):
        return None, value
    mean, std = window.mean_std(MIN_LOG_STD)
    threshold = mean + sigma * std
    if value <= threshold:
        return None, value
    return (
        f"{what} {raw:.4g} refused as an outlier: the log of its size {value:.3f} is more than "
        f"outlier_sigma={sigma:g} standard deviations above the mean of the last {len(window)} "
        f"updates (mean {mean:.3f}, std {std:.3f}, threshold {threshold:.3f}, a size of "
        f"{math.exp(threshold):.4g})"
    ), threshold


class _Windows:
    """One worker's windows: its gradient norms and its losses (logs of their sizes)."""

    def __init__(self, log_norms: Iterable[float] = (), losses: Iterable[float] = ()) -> None:
        self.log_norms = Window(log_norms)
        self.losses = Window(losses)


class OutlierFilter:
    """Every worker's outlier windows, and how many updates they refused in this run."""

    def __init__(self) -> None:
        self.windows: dict[str, _Windows] = {}
        self.refused = 0  # updates refused as outliers in this run

    def reset(self) -> None:
        self.windows.clear()
        self.refused = 0

    def judge(
        self, worker_id: str, norm: float, loss: float | None, sigma: float | None, warmup: int
    ) -> str | None:
        """Why an update of `worker_id` with this gradient norm and loss (None: not reported) is
        an outlier against that worker's window, or None when it is not (or the check is off,
        `sigma` None, or the window still warming up). A refusal is counted, and its values join
        the window clipped to the thresholds."""
        if sigma is None:
            return None
        windows = self._of(worker_id)
        why, norm_seen = _judge(windows.log_norms, norm, "gradient norm", sigma, warmup)
        loss_seen = None
        if loss is not None:
            why_loss, loss_seen = _judge(windows.losses, loss, "loss", sigma, warmup)
            why = why or why_loss
        if why is not None:
            self.refused += 1
            self._record(windows, norm_seen, loss_seen)
        return why

    def accept(self, worker_id: str, norm: float, loss: float | None) -> None:
        """An update was taken: it joins its worker's window."""
        self._record(
            self._of(worker_id), log_norm(norm), None if loss is None else log_norm(loss)
        )

    def _of(self, worker_id: str) -> _Windows:
        # One entry per worker of the registry (bounded by A3C_MAX_WORKERS: only registered
        # workers get this far).
        windows = self.windows.get(worker_id)
        if windows is None:
            windows = self.windows[worker_id] = _Windows()
        return windows

    @staticmethod
    def _record(windows: _Windows, log_norm_value: float, log_loss: float | None) -> None:
        windows.log_norms.append(log_norm_value)
        if log_loss is not None:
            windows.losses.append(log_loss)

    # -- persistence (with the parameter server's state) ---------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "updates_refused_outlier": self.refused,
            "outlier_windows": {
                worker_id: {"log_norms": list(w.log_norms.values), "losses": list(w.losses.values)}
                for worker_id, w in self.windows.items()
            },
        }

    def restore(self, state: dict[str, Any]) -> None:
        # A folder saved with one window for all workers ("outlier_window") starts afresh: its
        # values belong to no worker in particular.
        self.windows = {
            str(worker_id): _Windows(
                map(float, w.get("log_norms", [])), map(float, w.get("losses", []))
            )
            for worker_id, w in (state.get("outlier_windows") or {}).items()
        }
        self.refused = int(state.get("updates_refused_outlier", 0))
