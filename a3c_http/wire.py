"""Tensors on the wire: one safetensors file per body, one float32 tensor per parameter, named as
in the model's `state_dict()`.

safetensors is a plain header plus raw bytes, so decoding runs no code (unlike pickle or
`torch.load`). `decode` checks everything a peer could get wrong before anything touches a model.

`Layout` is the hot path's form of the same file: every entry of a model, parameters first, packed
in one float32 vector. Its bodies are a fixed header and that vector's bytes, so encoding is one
copy, and decoding a body laid out the same way (ours always are) is one header comparison and one
copy; a body in any other valid layout (another safetensors writer) is read the general way. The
header's `__metadata__` (safetensors' own string map) may carry what travels with the tensors: a
gradient push's finished episodes and statistics (API.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

# Re-exported: the names of the contract live in a3c_http.protocol.
from a3c_http.protocol import CONTENT_TYPE, VERSION_HEADER

__all__ = [
    "CONTENT_TYPE",
    "VERSION_HEADER",
    "Layout",
    "Spec",
    "WireError",
    "decode",
    "encode",
    "spec_of",
]

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


# safetensors' own bound on a header (100 MB); ours are about 100 bytes per tensor.
_MAX_HEADER = 100_000_000


class Layout:
    """The entries of a model (`names`, with their `shapes`) at fixed offsets of one float32
    vector of `numel` values: the parameters first (the optimizer's region, `n_params` values),
    then the buffers (the running statistics of a3c_http/normalize.py, if any)."""

    def __init__(self, entries: Sequence[tuple[str, tuple[int, ...]]], n_params: int) -> None:
        self.names = [name for name, _ in entries]
        self.shapes = {name: tuple(shape) for name, shape in entries}
        self.slices: dict[str, slice] = {}
        offset = 0
        for name, shape in entries:
            size = int(np.prod(shape, dtype=np.int64))
            self.slices[name] = slice(offset, offset + size)
            offset += size
        self.numel = offset
        self.n_params = n_params
        self._entries = {
            name: {
                "dtype": "F32",
                "shape": list(self.shapes[name]),
                "data_offsets": [4 * s.start, 4 * s.stop],
            }
            for name, s in self.slices.items()
        }
        self.header = self._header(None)

    @classmethod
    def of(cls, model: torch.nn.Module) -> Layout:
        params = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
        buffers = [(name, tuple(b.shape)) for name, b in model.named_buffers()]
        return cls(params + buffers, sum(int(np.prod(s, dtype=np.int64)) for _, s in params))

    @property
    def spec(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)

    def _header(self, metadata: Mapping[str, str] | None) -> bytes:
        head = dict(self._entries)
        if metadata:
            head["__metadata__"] = dict(metadata)
        raw = json.dumps(head, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors' own padding: the data starts 8-aligned
        return len(raw).to_bytes(8, "little") + raw

    def flatten(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One vector of `tensors` (which must have this layout's names) in layout order."""
        return torch.cat([tensors[name].detach().reshape(-1) for name in self.names]).to(
            torch.float32
        )

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The entries of `flat`, by name, as views (no copy)."""
        return {name: flat[s].view(self.shapes[name]) for name, s in self.slices.items()}

    def encode(self, flat: torch.Tensor, metadata: Mapping[str, str] | None = None) -> bytes:
        """A safetensors file of `flat` (a vector of `numel` float32 values): one copy."""
        header = self.header if not metadata else self._header(metadata)
        return header + flat.detach().to(torch.float32).contiguous().numpy().tobytes()

    def decode(self, data: bytes) -> tuple[torch.Tensor, dict[str, str]]:
        """The vector of a safetensors body (a copy, in layout order) and its metadata. Checks
        what `decode` checks; raises `WireError` naming the first problem."""
        if len(data) < 8:
            raise WireError("body is not a valid safetensors file: shorter than its 8-byte header")
        size = int.from_bytes(data[:8], "little")
        if size > min(_MAX_HEADER, len(data) - 8):
            raise WireError("body is not a valid safetensors file: its header overruns the body")
        try:
            head = json.loads(data[8 : 8 + size])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise WireError(f"body is not a valid safetensors file: header: {exc}") from None
        if not isinstance(head, dict):
            raise WireError("body is not a valid safetensors file: the header is not an object")
        metadata = head.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise WireError("not a valid safetensors file: __metadata__ must map str to str")
        if head == self._entries and len(data) - 8 - size == 4 * self.numel:
            values = np.frombuffer(data, dtype="<f4", count=self.numel, offset=8 + size).copy()
        else:  # another writer's layout: read and check it the general way
            values = self.flatten(decode(data, self.shapes)).numpy()
        flat = torch.from_numpy(values)
        if not np.isfinite(values).all():  # numpy's check: a tenth of torch's time here
            bad = next(n for n, s in self.slices.items() if not torch.isfinite(flat[s]).all())
            raise WireError(f"tensor {bad!r} holds NaN or infinite values")
        return flat, metadata
