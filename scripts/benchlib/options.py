"""The command-line values the benchmarks share: `--config` overrides of the training config,
numbers with a least value, and comma-separated lists of counts (`--workers 1,2,4`)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from pydantic import ValidationError

from a3c_http.algos.registry import train_config
from a3c_http.server.service import describe_error


def config_overrides(
    text: str, reserved: tuple[str, ...] = (), why: str = "", over: dict | None = None
) -> dict:
    """`--config`: a JSON object of training config fields for every run, checked as the master
    checks a config (over the fields `over`, such as the run's `algo`); the `reserved` fields
    (the caller's own) are refused, with `why`. Raises ValueError naming the problem."""
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(overrides, dict):
        raise ValueError("give a JSON object of config fields, e.g. '{\"max_in_flight\": 0}'")
    taken = sorted(set(overrides) & set(reserved))
    if taken:
        raise ValueError(f"{', '.join(taken)}: {why}")
    try:
        train_config(**(over or {}), **overrides)
    except ValidationError as exc:
        raise ValueError("; ".join(describe_error(e, "config") for e in exc.errors())) from None
    return overrides


def number(kind: type, least: float, more: bool = False) -> Any:
    """An argparse type: a finite `kind` of at least `least` (above it with `more`)."""
    def parse(text: str) -> Any:
        value = kind(text)
        if not math.isfinite(value) or value < least or (more and value == least):
            raise argparse.ArgumentTypeError(
                f"{text}: give a number {'above' if more else 'of at least'} {least}")
        return value

    return parse


def counts(option: str, text: str, parser: argparse.ArgumentParser) -> list[int]:
    """A comma-separated list of numbers of at least 1 given to `option` (`--workers 1,2,4`);
    the parser's error, naming the problem, for anything else."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{option} {text!r}: give numbers, e.g. 1,2,4")
    if not values or min(values) < 1:
        parser.error(f"{option} {text!r}: give one or more numbers of at least 1")
    return values


def seed_list(text: str, parser: argparse.ArgumentParser) -> list[int]:
    """`--seeds`: N (seeds 0 to N-1) or a comma-separated list of seeds (`1,2`, `5,`); the
    parser's error, naming the problem, for anything else."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if "," not in text and len(values) == 1 and values[0] >= 1:
        return list(range(values[0]))
    if "," in text and values and min(values) >= 0:
        return values
    parser.error(f"--seeds {text!r}: give a count (3) or seeds, comma-separated (1,2 or 5,)")
    raise AssertionError  # parser.error exits
