"""Tensors on the wire: one safetensors file per body, one float32 tensor per parameter, named as
in the model's `state_dict()`.

safetensors is a plain header plus raw bytes, so decoding runs no code (unlike pickle or
`torch.load`). `decode` checks everything a peer could get wrong before anything touches a model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

# Re-exported: the names of the contract live in a3c_http.protocol.
from a3c_http.protocol import CONTENT_TYPE, VERSION_HEADER

__all__ = ["CONTENT_TYPE", "VERSION_HEADER", "Spec", "WireError", "decode", "encode", "spec_of"]

Spec = Mapping[str, tuple[int, ...]]


class WireError(ValueError):
    """A tensor body that does not fit the model: its message says what is wrong."""


def spec_of(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Names and shapes a body must have to fit `model`."""
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def encode(tensors: Mapping[str, torch.Tensor]) -> bytes:
    return st_save(
        {name: t.detach().to(torch.float32).contiguous().cpu() for name, t in tensors.items()}
    )


def decode(data: bytes, spec: Spec) -> dict[str, torch.Tensor]:
    """Parse a safetensors body and check it against `spec`: the same names, the same shapes,
    float32, every value finite. Raises `WireError` naming the first problem."""
    if not data:
        raise WireError("empty body: expected a safetensors file")
    try:
        tensors = st_load(bytes(data))
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as exc:
        raise WireError(f"body is not a valid safetensors file: {exc}") from None
    missing = sorted(set(spec) - set(tensors))
    unexpected = sorted(set(tensors) - set(spec))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing}")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected}")
        raise WireError("tensor names do not match the model: " + "; ".join(parts))
    for name, shape in spec.items():
        tensor = tensors[name]
        if tensor.dtype != torch.float32:
            raise WireError(f"tensor {name!r} has dtype {tensor.dtype}, expected float32")
        if tuple(tensor.shape) != tuple(shape):
            raise WireError(
                f"tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)}"
            )
        if not bool(torch.isfinite(tensor).all()):
            raise WireError(f"tensor {name!r} holds NaN or infinite values")
    return tensors
