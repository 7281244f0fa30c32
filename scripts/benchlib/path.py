"""Benchmark: the project's files on the path of one update, what a reader follows to understand it.

    .venv/bin/python scripts/bench.py path [--algos ppo,apex] [--json runs/bench_path.json]

For each algorithm that learns from experience: the master (in this process, through Starlette's
TestClient, so the edge, the update route, the facade, the checks and the learner's slot all run)
takes one rollout of the run's shapes, and the algorithm's learner (in this process too) makes one
update from it. A profile hook records the file of every Python call made meanwhile, in every
thread; the project's files (not the libraries', the tests' or the benchmarks') are counted and
listed, for the master's side, the learner's, and both. The worker's side (collect, encode, send)
is not counted. As `bench.py ingest`, it measures whatever checkout this process imports, one from
before the renames of 55802ce included.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from a3c_http.algos.registry import algorithm_class
from scripts.benchlib.ingest import _expected, encode_tensors, model_for, train_config
from scripts.benchlib.report import ROOT, say

try:
    from a3c_http.wire.named_tensors import decode_tensors
except ImportError:  # a checkout from before 55802ce
    from a3c_http.wire.experience import decode_tensors  # type: ignore[no-redef]

_PREFIX = f"{ROOT}/"


class FileTrace:
    """The project's files whose functions are called while `calls` runs, in any thread made
    after this object (the TestClient's event loop and threadpool are made after it)."""

    def __init__(self) -> None:
        self._seen: set[str] | None = None
        threading.setprofile(self._hook)

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or self._seen is None:
            return
        name = frame.f_code.co_filename
        outside = (f"{_PREFIX}.venv/", f"{_PREFIX}tests/", f"{_PREFIX}scripts/")
        if name.startswith(_PREFIX) and not name.startswith(outside):
            self._seen.add(name[len(_PREFIX) :])

    def files(self, calls: Callable[[], Any]) -> set[str]:
        self._seen = set()
        sys.setprofile(self._hook)
        try:
            calls()
        finally:
            sys.setprofile(None)
            seen, self._seen = self._seen, None
        return seen

    def close(self) -> None:
        threading.setprofile(None)


def one_rollout(config: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """What a rollout of `config`'s run holds, and one of its shapes that passes every check."""
    expected = _expected(config)
    tensors = {n: torch.zeros(e.shape, dtype=e.dtypes[0]) for n, e in expected.items()}
    tensors["valid"][:] = True
    for name, value in (("log_probs", -0.69), ("discounts", 0.9), ("stops", 1)):
        if name in tensors:
            tensors[name][:] = value
    return expected, tensors


def measure(algo: str, trace: FileTrace) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from a3c_http.config.settings import Settings
    from master.app import create_app

    run = {"algo": algo, "num_envs": 2, "t_max": 8, "queue_size": 1, "seed": 1}
    if algo == "apex":
        run |= {"learning_starts": 0, "batch_size": 8}
    config = train_config(**run)
    model = model_for(config)
    expected, tensors = one_rollout(config)
    body = encode_tensors(tensors, {"a3c": json.dumps({"episodes": [], "stats": None})})
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(run_dir=Path(tmp) / "run", workers_file=Path(tmp) / "workers.txt")
        with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as c:
            started = c.post("/train", json={**run, "workers": []})
            assert started.status_code == 202, started.text
            c.post("/worker_started", json={"worker_id": "w1"})
            version = c.get("/status").json()["model_version"]
            headers = {
                "Content-Type": "application/octet-stream",
                "X-Worker-Id": "w1",
                "X-Model-Version": str(version),
            }
            replies: list[Any] = []
            master = trace.files(
                lambda: replies.append(c.post("/experience", content=body, headers=headers))
            )
            assert replies[0].status_code in (200, 204), replies[0].text
    decoded, _ = decode_tensors(body, expected)
    learner = algorithm_class(config).learner(config, model, torch.device("cpu"), None)
    learner.learn([decoded], 16)  # a replay's first fill, outside the count
    learning = trace.files(lambda: learner.learn([decoded], 32))
    return {
        "algo": algo,
        "master": sorted(master),
        "learner": sorted(learning),
        "both": len(master | learning),
    }


def main(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", default="ppo,apex", help="comma-separated algo names")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    trace = FileTrace()
    rows = []
    try:
        for algo in args.algos.split(","):
            row = measure(algo.strip(), trace)
            rows.append(row)
            say(
                f"{row['algo']}: {len(row['master'])} files on the master, "
                f"{len(row['learner'])} in the learner's update, {row['both']} in all"
            )
            for side in ("master", "learner"):
                say(f"  {side}: {', '.join(row[side])}")
    finally:
        trace.close()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0
