"""TensorBoard scalars of the run (master/persistence/scalars.py: which, and under what names),
written by the master into `<run folder>/tensorboard/<run id>/` when the `tensorboard` extra is
installed, stepped by the run's env steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from master.persistence.scalars import Figures


def available() -> bool:
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:  # the `tensorboard` extra is not installed
        return False
    return True


class TensorBoard:
    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        self.root = Path(run_dir) / "tensorboard"
        self._writer: Any = None
        self._run_id: str | None = None

    def write(self, figures: Figures) -> None:
        """Write one tick's points, into the folder of their run."""
        if figures.run_id != self._run_id or self._writer is None:
            self.close()
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.root / figures.run_id))
            self._run_id = figures.run_id
        if not figures.points:
            return  # nothing happened since (a finished run, or an idle one)
        for name, value, step in figures.points:
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
