"""The errors every part of the master's state raises for a request that does not fit the run."""

from __future__ import annotations


class StateConflict(Exception):
    """The request does not fit the run's state (409). `stop` tells a worker to end."""

    def __init__(self, message: str, stop: bool = False) -> None:
        super().__init__(message)
        self.stop = stop


class Invalid(ValueError):
    """The request is well formed but what it says cannot be right (422): an implausible report
    (master/learning/admission.py), gradients beyond their bound, statistics that cannot be merged.
    Nothing of it is taken."""


class NotRegistered(StateConflict):
    """A worker message from an id that is not in the run's registry (409, told to stop): only a
    worker the master started or one that registered (`POST /worker_started`) takes part."""


class Unavailable(Exception):
    """The run cannot take the request for now (503, with Retry-After): a part it needs is being
    started again (master/shards/: a shard that failed). Nothing of the request is taken."""

    retry_after_s = 1
