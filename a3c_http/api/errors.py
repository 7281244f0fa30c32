"""The one exception of the Python API (a3c_http/api/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from a3c_http.api.run import Run


class TrainError(Exception):
    """Something a user can mend: an environment no host can make, a config the master refuses
    (its 422 `detail`), a master that cannot be reached or refuses the token, a worker that cannot
    train the run (e.g. cannot import the environment's module), a run folder that does not load.
    `str()` is one line that says what and, where it can, what to do; `run` is the run it
    concerns, when one started."""

    def __init__(self, message: str, run: Run | None = None) -> None:
        super().__init__(message)
        self.run = run
