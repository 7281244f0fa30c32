"""Refusing updates far outside the recent ones (Gorila's safeguard): one diverging worker, whose
loss or gradient norm explodes, must not wreck the global network.

The parameter server keeps, for each worker, a window of its last `WINDOW` updates and judges each
new one of that worker against it, once the window holds `outlier_warmup` of them:

- the gradient norm (before clipping) by its logarithm, since norms span orders of magnitude and a
  healthy run's norms are roughly log-normal; only a norm far ABOVE the usual is refused (a small
  one cannot do harm);
- the loss by the logarithm of its magnitude, the same way: only a loss whose size is far above
  the usual is refused. (A loss's level moves a lot as a run learns, the value loss growing with
  the returns, and the policy loss changes sign from one update to the next: judged on its linear
  value and on both sides, a healthy CartPole run had 44 % of its updates refused.)

A refused update enters the window too, but clipped to the threshold it crossed: a burst of
outliers cannot make itself look usual at once, yet a run whose level really moves (the value
loss grows with the returns, fast when a CartPole agent first balances) is followed within a few
dozen updates instead of being refused for ever. (When only accepted updates entered, a healthy
2-worker CartPole-v1 cluster had 4.5 % of its updates refused even at outlier_sigma=10.) A
spread below a floor counts as the floor, so a window of (nearly) identical values does not turn
every other value into an outlier. It holds no lock: the parameter server guards every call.

One window per worker, not one for all: a diverging worker stands out against its own history as
well (workers differ anyway when their exploration does), and no client can move the window that
judges another. With one shared window, 100 pushes of zero gradients from one client pulled its
mean so low that the next 28 honest pushes of the others were refused. A worker's pushes now move
its own window only, and the absolute bound on every gradient (its norm at most `max_grad_norm`,
master/learning/parameter_server.py) holds from the first update, also while a window warms up.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
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

    # -- persistence (with the parameter server's state) -----------------------------------------

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
