"""Named tensors of any dtype on the wire: the body of `POST /experience` (a worker's rollout for
the learner beside the master, docs/http-api.md).

A body is a plain safetensors file, as gradients and weights are, whose `__metadata__` may carry
the rollout's report. Unlike a model's tensors (a3c_http/wire/tensors.py `Layout`), a rollout's
have their own dtypes (uint8 frames, int64 actions, bool flags) and shapes that depend on the run,
so the reader takes what to expect per name (`Expected`) and checks the body against it before a
tensor is used: safetensors' own parser validates the file (no code runs), then every name, dtype
and shape, every floating value's finiteness, and every value's range where the run's spaces bound
it (an action inside the action space, an observation inside a bounded observation space).
`WireError` names the first problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from pydantic_core import from_json
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.wire.tensors import WireError, is_metadata


@dataclass(frozen=True)
class Expected:
    """What one named tensor must be: its shape, one of `dtypes`, and with bounds every value in
    `[low, high]` (a number, or a tensor that broadcasts over the trailing dimensions: one bound
    per element of an observation, of the tensor's dtype; -inf or inf where that side is open).
    `within` names the range in the refusal, such as "the action space Discrete(2)"."""

    shape: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    low: float | torch.Tensor | None = field(default=None, compare=False)
    high: float | torch.Tensor | None = field(default=None, compare=False)
    within: str = ""


def encode_tensors(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None
) -> bytes:
    """One safetensors file of `tensors` as they are (dtype and shape), with `metadata`."""
    return st_save(
        {name: t.detach().contiguous().cpu() for name, t in tensors.items()},
        metadata=dict(metadata) if metadata else None,
    )


def decode_tensors(
    body: bytes, expected: Mapping[str, Expected]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of a safetensors `body` and its metadata, checked against `expected`: the same
    names, each of its shape and one of its dtypes, every floating value finite and every value
    within its bounds. Raises `WireError` naming the first problem."""
    if not body:
        raise WireError("empty body: expected a safetensors file")
    try:
        tensors = st_load(bytes(body))
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as exc:
        raise WireError(f"body is not a valid safetensors file: {exc}") from None
    size = int.from_bytes(body[:8], "little")
    try:
        metadata = from_json(bytes(body[8 : 8 + size])).get("__metadata__") or {}
    except ValueError:  # safetensors read it: cannot happen, but never a 500
        metadata = None
    if not is_metadata(metadata):
        raise WireError("body is not a valid safetensors file: __metadata__ must map str to str")
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        parts = [f"missing tensors {missing}"] if missing else []
        parts += [f"unexpected tensors {unexpected}"] if unexpected else []
        raise WireError("tensor names do not match the rollout: " + "; ".join(parts))
    for name, want in expected.items():
        tensor = tensors[name]
        if tensor.dtype not in want.dtypes:
            kinds = " or ".join(str(d).removeprefix("torch.") for d in want.dtypes)
            got = str(tensor.dtype).removeprefix("torch.")
            raise WireError(f"tensor {name!r} has dtype {got}, expected {kinds}")
        if tuple(tensor.shape) != want.shape:
            raise WireError(
                f"tensor {name!r} has shape {list(tensor.shape)}, expected {list(want.shape)}"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise WireError(f"tensor {name!r} holds NaN or infinite values")
        _check_bounds(name, tensor, want)
    return tensors, metadata


def _check_bounds(name: str, tensor: torch.Tensor, want: Expected) -> None:
    """WireError naming the first value of `tensor` outside `want`'s bounds, if one is, and the
    bounds of its element."""
    checks = [beyond(tensor, bound) for bound, beyond in ((want.low, torch.lt),
              (want.high, torch.gt)) if bound is not None]  # fmt: skip
    if not checks:  # no bounds: nothing to look at (an Atari rollout's frames are 14 MB)
        return
    outside = checks[0] if len(checks) == 1 else checks[0] | checks[1]
    if not bool(outside.any()):
        return
    at = [int(i) for i in outside.nonzero()[0]]

    def side(bound: float | torch.Tensor | None) -> float | None:
        if isinstance(bound, torch.Tensor):  # the bound of the value's element
            bound = bound[tuple(at[len(at) - bound.dim() :])].item()
        return None if bound is None or abs(bound) == float("inf") else bound

    low, high = side(want.low), side(want.high)
    span = (
        f"from {low:g} to {high:g}" if low is not None and high is not None
        else f"at least {low:g}" if low is not None else f"at most {high:g}"
    )  # fmt: skip
    raise WireError(
        f"tensor {name!r} holds {tensor[tuple(at)].item():g} at {at}, outside "
        f"{want.within or 'its bounds'} ({span})"
    )
