"""What a Weights & Biases run wrote to its `run-<id>.wandb` file, read back without a server.

wandb has no public reader of these files (its public API asks the server; offline runs are not
there until `wandb sync`). The file is W&B's record log: a 7-byte header (`:W&B`, 0xBEE1, version
0), then 32 KiB blocks of chunks, each with a 7-byte header (CRC, length, type: full, first,
middle, last) as in LevelDB's log format; each record is a `wandb_internal_pb2.Record`, the
protobuf message wandb ships (`wandb.proto`)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = struct.Struct("<4sHB")  # ident, magic, version
CHUNK = struct.Struct("<IHB")  # checksum, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """The file's records (`wandb_internal_pb2.Record`), in order."""
    data = path.read_bytes()
    assert HEADER.unpack_from(data) == (b":W&B", 0xBEE1, 0), f"{path}: not a W&B record log"
    found, parts, pos = [], b"", HEADER.size
    while pos + CHUNK.size <= len(data):
        room = BLOCK - pos % BLOCK
        if room < CHUNK.size:  # a block's tail too short for a chunk header: zeros
            pos += room
            continue
        _, length, kind = CHUNK.unpack_from(data, pos)
        if kind == 0:  # the zeros after the last chunk
            break
        chunk = data[pos + CHUNK.size : pos + CHUNK.size + length]
        pos += CHUNK.size + length
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            found.append(record)
    return found


@dataclass
class OfflineRun:
    """The run (id, name, project, config), its history rows and how it ended (None: it was
    not finished)."""

    run_id: str = ""
    name: str = ""
    project: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None

    def scalars(self, step: str) -> dict[str, list[tuple[int, float]]]:
        """`{name: [(step, value), ...]}` of every row's figures but W&B's own (`_step`, ...) and
        the step key, as TensorBoard's reader gives them."""
        found: dict[str, list[tuple[int, float]]] = {}
        for row in self.history:
            for name, value in row.items():
                if not name.startswith("_") and name != step:
                    found.setdefault(name, []).append((row[step], value))
        return found


def read_run(path: Path) -> OfflineRun:
    run = OfflineRun()
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.name = record.run.run_id, record.run.display_name
            run.project = record.run.project
            for item in record.run.config.update:
                if item.key != "_wandb":
                    run.config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            run.history.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                 for item in record.history.item}  # fmt: skip
            )
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def run_file(wandb_dir: Path, run_id: str) -> Path:
    """The record log of run `run_id` under `wandb_dir` (the folder `wandb/` holds the runs of)."""
    found = sorted(wandb_dir.glob(f"wandb/*run-*-{run_id}/run-{run_id}.wandb"))
    assert len(found) == 1, f"{run_id}: {found} under {wandb_dir}"
    return found[0]
