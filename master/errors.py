"""The error every part of the master's state raises for a request that does not fit the run."""

from __future__ import annotations


class StateConflict(Exception):
    """The request does not fit the run's state (409). `stop` tells a worker to end."""

    def __init__(self, message: str, stop: bool = False) -> None:
        super().__init__(message)
        self.stop = stop
