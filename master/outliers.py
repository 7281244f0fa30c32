"""Refusing updates far outside the recent ones (Gorila's safeguard): one diverging worker, whose
loss or gradient norm explodes, must not wreck the global network.

The parameter server keeps a window of the last `WINDOW` accepted updates and judges each new one
against it, once the window holds `outlier_warmup` of them:

- the gradient norm (before clipping) by its logarithm, since norms span orders of magnitude and a
  healthy run's norms are roughly log-normal; only a norm far ABOVE the usual is refused (a small
  one cannot do harm);
- the loss by the logarithm of its magnitude, the same way: only a loss whose size is far above
  the usual is refused. (A loss's level moves a lot as a run learns, the value loss growing with
  the returns, and the policy loss changes sign from one update to the next: judged on its linear
  value and on both sides, a healthy CartPole run had 44 % of its updates refused.)

Only accepted updates enter the window, so a burst of outliers cannot make itself look usual. A
spread below a floor counts as the floor, so a window of (nearly) identical values does not turn
every other value into an outlier. It holds no lock: the parameter server guards every call.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

# Updates in the window: enough for a stable spread, few enough to follow a run whose losses and
# norms drift as it learns (with the defaults, 100 updates are a few seconds of a CartPole run).
WINDOW = 100
# The least spread a window is given: a std of 0.1 of the log (values within about 10 %).
MIN_LOG_STD = 0.1
# The log of zero would be -inf: a norm or loss this small is taken as this.
_TINY = 1e-12


def log_norm(norm: float) -> float:
    return math.log(max(abs(norm), _TINY))


def _mean_std(values: deque[float], floor: float) -> tuple[float, float]:
    """Mean and (population) standard deviation, at least `floor`. Plain float sums, not
    statistics.pstdev, whose exact fractions cost milliseconds under the parameter server's lock."""
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return mean, max(std, floor)


class OutlierFilter:
    def __init__(self) -> None:
        self.log_norms: deque[float] = deque(maxlen=WINDOW)
        self.losses: deque[float] = deque(maxlen=WINDOW)
        self.refused = 0  # updates refused as outliers in this run

    def reset(self) -> None:
        self.log_norms.clear()
        self.losses.clear()
        self.refused = 0

    def judge(
        self, norm: float, loss: float | None, sigma: float | None, warmup: int
    ) -> str | None:
        """Why an update with this gradient norm and loss (None: not reported) is an outlier, or
        None when it is not (or the check is off, `sigma` None, or the window still warming up).
        A refusal is counted."""
        if sigma is None:
            return None
        why = self._judge_norm(norm, sigma, warmup)
        if why is None and loss is not None:
            why = self._judge_loss(loss, sigma, warmup)
        if why is not None:
            self.refused += 1
        return why

    def _judge_norm(self, norm: float, sigma: float, warmup: int) -> str | None:
        if len(self.log_norms) < max(warmup, 1):
            return None
        mean, std = _mean_std(self.log_norms, MIN_LOG_STD)
        threshold = mean + sigma * std
        value = log_norm(norm)
        if value <= threshold:
            return None
        return (
            f"gradient norm {norm:.4g} refused as an outlier: its log {value:.3f} is more than "
            f"outlier_sigma={sigma:g} standard deviations above the mean log-norm of the last "
            f"{len(self.log_norms)} accepted updates (mean {mean:.3f}, std {std:.3f}, threshold "
            f"{threshold:.3f}, a norm of {math.exp(threshold):.4g})"
        )

    def _judge_loss(self, loss: float, sigma: float, warmup: int) -> str | None:
        if len(self.losses) < max(warmup, 1):
            return None
        mean, std = _mean_std(self.losses, MIN_LOG_STD)
        threshold = mean + sigma * std
        value = log_norm(loss)
        if value <= threshold:
            return None
        return (
            f"loss {loss:.6g} refused as an outlier: the log of its size {value:.3f} is more than "
            f"outlier_sigma={sigma:g} standard deviations above the mean of the last "
            f"{len(self.losses)} accepted updates (mean {mean:.3f}, std {std:.3f}, threshold "
            f"{threshold:.3f}, a loss of size {math.exp(threshold):.4g})"
        )

    def accept(self, norm: float, loss: float | None) -> None:
        """An update was taken: it joins the window."""
        self.log_norms.append(log_norm(norm))
        if loss is not None:
            self.losses.append(log_norm(loss))

    # -- persistence (with the parameter server's state) -----------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "updates_refused_outlier": self.refused,
            "outlier_window": {"log_norms": list(self.log_norms), "losses": list(self.losses)},
        }

    def restore(self, state: dict[str, Any]) -> None:
        window = state.get("outlier_window") or {}
        self.log_norms = deque(map(float, window.get("log_norms", [])), maxlen=WINDOW)
        self.losses = deque(map(float, window.get("losses", [])), maxlen=WINDOW)
        self.refused = int(state.get("updates_refused_outlier", 0))
