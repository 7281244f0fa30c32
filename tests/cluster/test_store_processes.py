"""The run folder against real processes: a saving process killed at random moments leaves one
whole snapshot, and a master under several uvicorn worker processes refuses to run."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from a3c_http.local.cluster import ROOT, free_port
from a3c_http.store.runstore import RunStore
from tests.support.store import numbers_in

KILL_LOOP = """
import sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from tests.support.store import numbered
from a3c_http.store.runstore import RunStore
s = RunStore.acquire(Path(sys.argv[1]))
loaded = s.load()
n = loaded.state["n"] if loaded else 0
print("ready", flush=True)
n += 1
s.save(numbered(n))
print("saved", flush=True)
while True:
    n += 1
    s.save(numbered(n))
"""


@pytest.mark.integration  # a real process, killed
def test_kill_9_in_the_middle_of_saves_leaves_one_whole_snapshot(tmp_path: Path) -> None:
    """SIGKILL a process that saves snapshots as fast as it can, at seeded random moments, again
    and again: every time, what is on disk loads as one whole snapshot, and the killed owner's
    lock does not keep the next process out. The first process is killed at any moment, even
    before its first save; each later one once it has saved (so that the run moves on however
    slow the machine is), in the middle of the saves that follow."""
    rng = random.Random(3)
    seen: list[int] = []
    for attempt in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-c", KILL_LOOP, str(tmp_path), str(ROOT)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            if attempt > 0:
                assert proc.stdout.readline().strip() == "saved"
            time.sleep(rng.uniform(0.0, 0.08))  # a random moment to kill at, not a synchronisation
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc.stdout.close()
        if RunStore(tmp_path).load() is None:
            assert not seen, "a saved snapshot disappeared"
            continue  # killed before its first save was committed
        found = numbers_in(tmp_path)
        assert len(found) == 1, f"a mix of snapshots {found}"
        seen.append(found.pop())
    assert seen == sorted(seen) and seen[-1] > seen[0], seen  # it saved, and never went back


@pytest.mark.integration
def test_uvicorn_with_several_worker_processes_refuses_to_run_a_master(tmp_path: Path) -> None:
    """`uvicorn master.app:app --workers 2` would interleave two masters' state: the process
    that loses the run folder says why and ends the whole server, the owner saving first."""
    env = {**os.environ, "A3C_RUN_DIR": str(tmp_path / "run")}
    cmd = [sys.executable, "-m", "uvicorn", "master.app:app", "--port", str(free_port())]
    server = subprocess.Popen(
        [*cmd, "--workers", "2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so that no child can outlive the test
    )
    try:
        output, _ = server.communicate(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    assert "another master started by the same `uvicorn --workers N`" in output, output
    assert "Traceback" not in output
    assert RunStore(tmp_path / "run").load() is not None  # the owner saved as it shut down
