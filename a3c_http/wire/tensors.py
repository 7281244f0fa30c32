"""Tensors on the wire: one safetensors file per body, one tensor per parameter, named as in the
model's `state_dict()`, float32 (or the parameters as bfloat16 in a run of `wire_dtype` bfloat16).

safetensors is a plain header plus raw bytes, so decoding runs no code (unlike pickle or
`torch.load`). `decode` checks everything a peer could get wrong before anything touches a model.

`Layout` is the hot path's form of the same file: every entry of a model, parameters first, packed
in one float32 vector. Encoding is one copy; decoding a body in our own layout is one header
comparison and one copy, and any other valid layout is parsed, checked and gathered (a copy per
tensor). The header's `__metadata__` may carry a push's finished episodes and statistics
(docs/http-api.md).

bfloat16: only the parameters' tensors travel as BF16; every vector in memory stays float32, and
the buffers (a3c_http/models/normalize.py's running statistics) stay F32 in the same file, first
in the data so each tensor is aligned, because bfloat16 would round their counts and means
(docs/performance.md, "Smaller tensors on the wire"). A body must be in its run's dtype, else 422.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import from_json
from safetensors.torch import save as st_save

# Re-exported: the names of the contract live in a3c_http.wire.protocol.
from a3c_http.wire.protocol import CONTENT_TYPE, VERSION_HEADER

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


def decode(data: bytes | bytearray | memoryview, spec: Spec) -> dict[str, torch.Tensor]:
    """Parse a safetensors body and check it against `spec`: the same names, the same shapes,
    every tensor float32, every value finite (`Layout.decode`'s reading, whose checks and
    messages these are). Raises `WireError` naming the first problem."""
    layout = Layout(list(spec.items()), n_params=0)
    layout._dtype_note = ""  # a file, not a run's push
    body = data if isinstance(data, bytes | bytearray) else bytes(data)
    return layout.views(layout.decode(body)[0])


# safetensors' own bound on a header (100 MB); ours are about 100 bytes per tensor.
_MAX_HEADER = 100_000_000
# Other writers' headers a layout keeps read (`Layout.decode`): 64 of 64 KiB at most, 4 MiB.
_READ_HEADERS = 64
_READ_HEADER_BYTES = 64 * 1024
# A run's wire dtypes (TrainConfig.wire_dtype): safetensors' name, torch's, a value's bytes and its
# rounding error relative to float32 (to nearest even: half of bfloat16's last place, 2**-8).
WIRE_DTYPES: dict[str, tuple[str, torch.dtype, int, float]] = {
    "float32": ("F32", torch.float32, 4, 0.0),
    "bfloat16": ("BF16", torch.bfloat16, 2, 2.0**-8),
}


# safetensors' dtypes (all it reads): the name a message gives each, and a value's bits.
_SAFETENSORS_DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 8),
    "F4": ("float4_e2m1", 4),
    "F6_E2M3": ("float6_e2m3", 6),
    "F6_E3M2": ("float6_e3m2", 6),
    "U8": ("uint8", 8),
    "I8": ("int8", 8),
    "F8_E5M2": ("float8_e5m2", 8),
    "F8_E4M3": ("float8_e4m3fn", 8),
    "F8_E8M0": ("float8_e8m0fnu", 8),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 8),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 8),
    "I16": ("int16", 16),
    "U16": ("uint16", 16),
    "F16": ("float16", 16),
    "BF16": ("bfloat16", 16),
    "I32": ("int32", 32),
    "U32": ("uint32", 32),
    "F32": ("float32", 32),
    "C64": ("complex64", 64),
    "F64": ("float64", 64),
    "I64": ("int64", 64),
    "U64": ("uint64", 64),
}


def _invalid(why: str) -> WireError:
    return WireError(f"body is not a valid safetensors file: {why}")


# safetensors' `__metadata__`: str to str, read from its JSON (`Layout._own_header`).
_METADATA = TypeAdapter(dict[str, str], config=ConfigDict(strict=True))


def is_metadata(value: object) -> bool:
    """Whether `value` is what safetensors' `__metadata__` may be: a map of str to str."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


class Layout:
    """The entries of a model (`names`, with their `shapes`) at fixed offsets of one float32
    vector of `numel` values: the parameters first (the optimizer's region, `n_params` values),
    then the buffers (the running statistics of a3c_http/models/normalize.py, if any). `dtype`: what
    the parameters travel as (`WIRE_DTYPES`); the buffers are always float32 (`dtypes`: each
    entry's dtype in a body)."""

    def __init__(
        self,
        entries: Sequence[tuple[str, tuple[int, ...]]],
        n_params: int,
        dtype: str = "float32",
    ) -> None:
        if dtype not in WIRE_DTYPES:
            raise ValueError(f"wire dtype {dtype!r}: expected one of {sorted(WIRE_DTYPES)}")
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
        self.dtype = dtype
        code, torch_dtype, width, self.relative_error = WIRE_DTYPES[dtype]
        # Entries' bytes: float32, the vector in order; else F32 buffers, then the parameters.
        at = self._params_at = 0 if dtype == "float32" else 4 * (offset - n_params)
        self.nbytes = 4 * offset if dtype == "float32" else at + width * n_params
        self._entries: dict[str, dict] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        for name, s in self.slices.items():
            if dtype == "float32":
                kind, begin, end = "F32", 4 * s.start, 4 * s.stop
            elif s.start >= n_params:  # a buffer
                kind, begin, end = "F32", 4 * (s.start - n_params), 4 * (s.stop - n_params)
            else:
                kind, begin, end = code, at + width * s.start, at + width * s.stop
            self._entries[name] = {
                "dtype": kind,
                "shape": list(self.shapes[name]),
                "data_offsets": [begin, end],
            }
            self.dtypes[name] = torch_dtype if kind == code else torch.float32
        self._own_places = [(e["dtype"], *e["data_offsets"]) for e in self._entries.values()]
        # Other writers' checked headers: (header, data bytes) -> entries' places and metadata, so
        # a client that sends the same header every push is read as cheaply as our own.
        self._read_headers: dict[tuple[bytes, int], tuple[list, dict[str, str]]] = {}
        statistics = "" if dtype == "float32" else ", the running statistics as F32"
        self._dtype_note = (
            f" (this run's wire_dtype is {dtype}: the parameters travel as {code}{statistics})"
        )
        # The header: these entries' JSON, made once, then any metadata (`_header`, `_own_header`).
        self._entries_json = json.dumps(self._entries, separators=(",", ":")).encode()
        self._metadata_key = b',"__metadata__":' if self._entries else b'"__metadata__":'
        self.header = self._header(None)

    @classmethod
    def of(cls, model: torch.nn.Module, dtype: str = "float32") -> Layout:
        params = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
        buffers = [(name, tuple(b.shape)) for name, b in model.named_buffers()]
        n_params = sum(int(np.prod(s, dtype=np.int64)) for _, s in params)
        return cls(params + buffers, n_params, dtype)

    @property
    def body_bytes(self) -> int:
        """The size of a body of this layout without metadata."""
        return len(self.header) + self.nbytes

    @property
    def spec(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)

    def _header(self, metadata: Mapping[str, str] | None) -> bytes:
        # A push's header differs from the next one's only in its metadata (its report), which
        # follows the entries as json.dumps of the whole would place it.
        raw = self._entries_json
        if metadata:
            extra = json.dumps(dict(metadata), separators=(",", ":")).encode()
            raw = raw[:-1] + self._metadata_key + extra + b"}"
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
        """A safetensors file of `flat` (a vector of `numel` float32 values): one copy (in
        bfloat16, one conversion of the parameters)."""
        header = self.header if not metadata else self._header(metadata)
        if self.dtype == "float32":
            # join copies the vector's memory straight after the header: one pass over it
            return b"".join((header, memoryview(flat.detach().to(torch.float32).numpy())))
        flat = flat.detach().to(torch.float32)
        params = flat[: self.n_params].to(torch.bfloat16).view(torch.int16)
        buffers = flat[self.n_params :].contiguous()
        return b"".join((header, buffers.numpy().tobytes(), params.numpy().tobytes()))

    def decode(
        self, data: bytes | bytearray, finite_params: bool = True
    ) -> tuple[torch.Tensor, dict[str, str]]:
        """The vector of a safetensors body (in layout order) and its metadata, from any writer:
        the file must be valid as safetensors reads one (a header of tensors that tile its data
        exactly), hold this layout's names and no other, each of its shape and dtype (`dtypes`),
        every value finite. Raises `WireError` naming the first problem. A float32 body in this
        layout given as a bytearray becomes the vector without a copy (the caller hands its
        memory over). `finite_params=False` skips the finiteness check of the parameters' region
        for a caller who checks it otherwise (the master's gradient norm); buffers are always
        checked."""
        if not data:
            raise WireError("empty body: expected a safetensors file")
        if len(data) < 8:
            raise _invalid("shorter than its 8-byte header")
        size = int.from_bytes(data[:8], "little")
        if size > min(_MAX_HEADER, len(data) - 8):
            raise _invalid("its header overruns the body")
        metadata = self._own_header(data, size)
        if metadata is not None:
            return self._vector(data, 8 + size, finite_params), metadata
        key = (bytes(data[8 : 8 + size]), len(data) - 8 - size)
        known = self._read_headers.get(key)
        if known is None:
            known = self._read_header(key[0], key[1])
            if size <= _READ_HEADER_BYTES:
                if len(self._read_headers) >= _READ_HEADERS:
                    self._read_headers.pop(next(iter(self._read_headers)), None)
                self._read_headers[key] = known
        places, metadata = known
        if places == self._own_places:  # another writer's header of our layout
            return self._vector(data, 8 + size, finite_params), dict(metadata)
        return self._checked(self._gather(data, 8 + size, places), finite_params), dict(metadata)

    def _read_header(self, raw: bytes, nbytes: int) -> tuple[list, dict[str, str]]:
        """Where each entry is in a body whose header (after its length) is `raw` and whose data
        is `nbytes` bytes (`_places`), and the header's metadata. Raises `WireError`."""
        try:
            head = from_json(raw)  # pydantic's parser: half json.loads's time
        except ValueError as exc:
            raise _invalid(f"header: {exc}") from None
        if not isinstance(head, dict):
            raise _invalid("the header is not an object")
        metadata = head.pop("__metadata__", None) or {}
        if not is_metadata(metadata):
            raise _invalid("__metadata__ must map str to str")
        return self._places(head, nbytes), metadata

    def _places(self, head: dict, nbytes: int) -> list[tuple[str, int, int]]:
        """Where each entry's bytes are in a body's data of `nbytes` bytes whose header's tensors
        are `head`, checked as safetensors checks a file (each tensor's entry well formed, of a
        known dtype, its bytes as many as its shape and dtype make, the tensors one after the
        other from byte 0 to the end), then against this layout: the same names, each of its
        dtype and shape. Per entry in layout order: its wire dtype and its bytes' span."""
        spans = []
        for name, info in head.items():
            kind = info.get("dtype") if type(info) is dict else None
            if type(kind) is not str or kind not in _SAFETENSORS_DTYPES:
                raise _invalid(f"tensor {name!r} has no safetensors dtype: {kind!r}")
            shape, offsets = info.get("shape"), info.get("data_offsets")
            bits = _SAFETENSORS_DTYPES[kind][1]
            if type(shape) is not list or type(offsets) is not list or len(offsets) != 2:
                raise _invalid(f"tensor {name!r} needs a shape and two data_offsets")
            for n in (*shape, *offsets):
                if type(n) is not int or n < 0:
                    raise _invalid(f"tensor {name!r}: {n!r} in its shape or data_offsets")
            for n in shape if 0 not in shape else (0,):
                bits *= n
                if bits > 8 * nbytes:  # more than the data holds (refused below): stop there
                    break
            if bits % 8 or offsets[1] - offsets[0] != bits // 8:
                raise _invalid(f"tensor {name!r} spans {offsets}: not its shape and dtype's bytes")
            spans.append((offsets[0], offsets[1], name))
        end = 0
        for begin, stop, name in sorted(spans):
            if begin != end:
                raise _invalid(f"tensor {name!r} starts at byte {begin}, expected {end}")
            end = stop
        if end != nbytes:
            raise _invalid(f"its tensors' data is {end} bytes, the body's {nbytes}")
        missing = [name for name in self.names if name not in head]
        unexpected = sorted(name for name in head if name not in self.shapes)
        if missing or unexpected:
            parts = []
            if missing:
                parts.append(f"missing tensors {sorted(missing)}")
            if unexpected:
                parts.append(f"unexpected tensors {unexpected}")
            raise WireError("tensor names do not match the model: " + "; ".join(parts))
        places = []
        for name in self.names:
            info, expected = head[name], self._entries[name]
            if info["dtype"] != expected["dtype"]:
                raise WireError(
                    f"tensor {name!r} has dtype {_SAFETENSORS_DTYPES[info['dtype']][0]}, expected "
                    f"{_SAFETENSORS_DTYPES[expected['dtype']][0]}" + self._dtype_note
                )
            if info["shape"] != expected["shape"]:
                raise WireError(
                    f"tensor {name!r} has shape {info['shape']}, expected {expected['shape']}"
                )
            places.append((info["dtype"], *info["data_offsets"]))
        return places

    def _gather(self, data: bytes | bytearray, start: int, places: list) -> np.ndarray:
        """One new float32 vector of the entries whose data begins at `start` (`_places`): a
        copy per F32 tensor into its slice, a conversion per BF16 one (the upper half of the
        float32 of the same value), nothing else allocated."""
        values = np.empty(self.numel, dtype=np.float32)
        into, source = memoryview(values).cast("B"), memoryview(data)[start:]
        for (kind, begin, end), s in zip(places, self.slices.values(), strict=True):
            if kind == "F32":  # a memoryview's copy: a fifth of numpy's time for small tensors
                into[4 * s.start : 4 * s.stop] = source[begin:end]
            else:
                halves = np.frombuffer(source[begin:end], dtype="<u2")
                np.left_shift(halves, 16, out=values[s].view(np.uint32), dtype=np.uint32)
        return values

    def _own_header(self, data: bytes | bytearray, size: int) -> dict[str, str] | None:
        """The metadata of a header of `size` bytes that is this layout's own, as `_header`
        writes it: these entries byte for byte, then metadata or none (a push's report, the
        master's weights), for a body of this layout's size. Only the metadata is parsed. None
        for any other header (more keys after the entries, say): it is parsed (`decode`)."""
        entries = self._entries_json[:-1]
        if len(data) - 8 - size != self.nbytes or not data.startswith(entries, 8):
            return None
        rest = bytes(data[8 + len(entries) : 8 + size]).rstrip(b" ")
        if rest == b"}":
            return {}
        if not (rest.startswith(self._metadata_key) and rest.endswith(b"}")):
            return None
        try:  # pydantic's parser: about 4x faster than json.loads and a check
            return _METADATA.validate_json(rest[len(self._metadata_key) : -1])
        except ValidationError:
            return None

    def _vector(self, data: bytes | bytearray, start: int, finite_params: bool) -> torch.Tensor:
        """The vector of a body in this layout whose data begins at `start` (`decode`)."""
        if self.dtype == "float32":
            values = np.frombuffer(data, dtype="<f4", count=self.numel, offset=start)
            if not values.flags.writeable:  # bytes: the vector gets memory of its own
                values = values.copy()
        else:
            values = self._from_bfloat16(data, start)
        return self._checked(values, finite_params)

    def _checked(self, values: np.ndarray, finite_params: bool) -> torch.Tensor:
        flat = torch.from_numpy(values)
        checked = values if finite_params else values[self.n_params :]
        if not np.isfinite(checked).all():  # numpy's check: a tenth of torch's time here
            raise WireError(self.non_finite(flat))
        return flat

    def non_finite(self, flat: torch.Tensor) -> str:
        """What holds a NaN or an infinity in a vector of this layout (which must have one)."""
        bad = next(n for n, s in self.slices.items() if not torch.isfinite(flat[s]).all())
        return f"tensor {bad!r} holds NaN or infinite values"

    def _from_bfloat16(self, data: bytes, start: int) -> np.ndarray:
        """The float32 vector of a bfloat16 body in this layout whose data begins at `start`:
        the buffers copied, the parameters converted (a bfloat16 is the upper half of the
        float32 of the same value)."""
        n = self.n_params
        values = np.empty(self.numel, dtype=np.float32)
        values[n:] = np.frombuffer(data, dtype="<f4", count=self.numel - n, offset=start)
        halves = np.frombuffer(data, dtype="<u2", count=n, offset=start + self._params_at)
        np.left_shift(halves, 16, out=values[:n].view(np.uint32), dtype=np.uint32)
        return values
