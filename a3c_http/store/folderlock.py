"""Who owns a run folder: one master at a time (a3c_http/store/runstore.py `RunStore.acquire`).

Two locks, both held for the life of the owning process:
- `.a3c.lock`, a filelock: the lock the folder shows and the design names as its owner;
- an exclusive flock on a descriptor of the folder itself. A hand that deletes `.a3c.lock` cannot
  take this one away (a directory has no name inside itself to remove), so a second master is
  refused however the folder was tidied. Where the filesystem cannot lock a directory (NFS),
  `.a3c.lock` alone guards the folder.

`.a3c.owner` names the owner's process for the message a second master gets. The owner puts a
removed lock file or owner file back (`FolderLock.keep`), so the folder looks as documented again.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout

try:
    import fcntl
except ImportError:  # not a POSIX system: .a3c.lock alone guards the folder
    fcntl = None  # type: ignore[assignment]

LOCK = ".a3c.lock"
OWNER = ".a3c.owner"


class RunDirInUse(ValueError):
    """Another master process owns the run folder. `sibling`: that master and this process were
    started by the same parent, as `uvicorn --workers N` does."""

    def __init__(self, run_dir: Path, owner: dict[str, int] | None) -> None:
        self.sibling = (
            owner is not None and owner["pid"] != os.getpid() and owner["ppid"] == os.getppid() != 1
        )
        if self.sibling:
            why = (
                f"the run folder {run_dir} is owned by process {owner['pid']}, another master "
                "started by the same `uvicorn --workers N`: a master is one process, so run "
                "uvicorn without --workers"
            )
        else:
            pid = f" (process {owner['pid']})" if owner else ""
            why = (
                f"the run folder {run_dir} is in use by another master{pid}, which holds "
                f"{run_dir / LOCK}: stop that master, or set A3C_RUN_DIR to another folder"
            )
        super().__init__(why)


def _read_owner(path: Path) -> dict[str, int] | None:
    try:
        owner = json.loads(path.read_text())
        return {"pid": int(owner["pid"]), "ppid": int(owner["ppid"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


class FolderLock:
    """The locks of the master that owns `folder` (`take`), until `release`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._file_lock: FileLock | None = None
        self._lock_file: tuple[int, int] | None = None  # (device, inode) of the .a3c.lock held
        self._folder_fd: int | None = None

    def take(self) -> None:
        """Raises RunDirInUse when another process holds either lock (nothing is held then)."""
        try:
            self._lock_folder()
            self._take_lock_file()
        except BaseException:
            self.release()
            raise

    def _in_use(self) -> RunDirInUse:
        return RunDirInUse(self.folder, _read_owner(self.folder / OWNER))

    def _lock_folder(self) -> None:
        if fcntl is None:
            return
        fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._in_use() from None
        except OSError:  # the filesystem cannot lock a directory: .a3c.lock guards the folder
            os.close(fd)
            return
        self._folder_fd = fd

    def _take_lock_file(self) -> None:
        lock = FileLock(str(self.folder / LOCK), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise self._in_use() from None
        self._file_lock = lock
        held = os.stat(self.folder / LOCK)
        self._lock_file = (held.st_dev, held.st_ino)
        # Only the message of a second master needs it: a full disk must not keep the owner out
        # of its folder (`keep` writes it once there is room).
        with contextlib.suppress(OSError):
            self._write_owner()

    def _write_owner(self) -> None:
        # The lock file itself is no place for it: every process that tries the lock opens it.
        data = json.dumps({"pid": os.getpid(), "ppid": os.getppid()}).encode()
        fd, tmp = tempfile.mkstemp(prefix=f"{OWNER}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.folder / OWNER)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def keep(self) -> bool:
        """Put back `.a3c.lock` (taking it again: the lock on a deleted file guards no name any
        more) and `.a3c.owner` if they were removed. True when something was put back. Raises
        RunDirInUse if another process took the lock file's name meanwhile (a master of an
        earlier version, which does not lock the folder itself)."""
        try:
            found = os.stat(self.folder / LOCK)
            kept = (found.st_dev, found.st_ino) == self._lock_file
        except FileNotFoundError:
            kept = False
        if kept:
            if (self.folder / OWNER).exists():
                return False
            self._write_owner()
            return True
        if self._file_lock is not None:
            self._file_lock.release()
            self._file_lock = None
        self._take_lock_file()
        return True

    def release(self) -> None:
        if self._file_lock is not None:
            self._file_lock.release()
            self._file_lock = None
        if self._folder_fd is not None:
            os.close(self._folder_fd)  # the flock goes with its descriptor
            self._folder_fd = None
