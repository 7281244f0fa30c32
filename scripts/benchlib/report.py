"""What the benchmarks print and record: progress lines, tables, number formats, and the commit
that was measured."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout
PROGRESS_S = 5.0  # a progress line at least this often


def say(line: str) -> None:
    print(line, flush=True)


@contextlib.contextmanager
def ticker(label: str, every_s: float = PROGRESS_S) -> Iterator[None]:
    """A progress line every `every_s` while the body runs (for calls that print nothing)."""
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            say(f"    ... {label}: {time.monotonic() - started:.0f} s")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def fmt(value: object, spec: str = ",.0f") -> str:
    """A table's cell: "-" for None, yes / no for a bool, `spec` for a number."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec) if isinstance(value, int | float) else str(value)


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """`title`, then the header and rows in aligned columns (the first left, the rest right)."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    say(f"\n{title}")
    for row in [header, *rows]:
        cells = [c.rjust(w) for c, w in zip(row, widths, strict=True)]
        cells[0] = row[0].ljust(widths[0])
        say("  " + "  ".join(cells))


def commit() -> str | None:
    """The checkout's commit (with "+dirty" for uncommitted changes): what was measured."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty.strip() else "")
