"""Tensors <-> safetensors bytes: the round trip and every way a peer can get a body wrong."""

from __future__ import annotations

import io
import json
import pickle
import struct

import pytest
import torch
from safetensors.numpy import save as np_save
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from a3c_http.algos.registry import train_config
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.wire import tensors as wire

SPEC = {"layer.weight": (2, 3), "layer.bias": (2,)}


def good_tensors() -> dict[str, torch.Tensor]:
    return {
        "layer.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7,
        "layer.bias": torch.tensor([-1.5, 2.25]),
    }


def test_round_trip() -> None:
    tensors = good_tensors()
    data = wire.encode(tensors)
    assert isinstance(data, bytes) and data
    out = wire.decode(data, SPEC)
    assert set(out) == set(tensors)
    for name, t in tensors.items():
        assert out[name].dtype == torch.float32
        assert torch.equal(out[name], t)


def test_round_trip_of_a_model_state_dict() -> None:
    torch.manual_seed(0)
    model = ActorCritic(obs_dim=3, action_dim=1, discrete=False, hidden_sizes=(8,))
    spec = wire.spec_of(model)
    assert set(spec) == set(model.state_dict()) and "log_std" in spec
    out = wire.decode(wire.encode(model.state_dict()), spec)
    other = ActorCritic(obs_dim=3, action_dim=1, discrete=False, hidden_sizes=(8,))
    other.load_state_dict(out)
    for name, t in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], t)


def test_encode_converts_to_contiguous_float32() -> None:
    tensors = {
        "layer.weight": torch.ones(3, 2, dtype=torch.float64).t(),  # non-contiguous, float64
        "layer.bias": torch.zeros(2, requires_grad=True),
    }
    out = wire.decode(wire.encode(tensors), SPEC)
    assert torch.equal(out["layer.weight"], torch.ones(2, 3))
    assert out["layer.weight"].dtype == torch.float32


def decode_error(data: bytes) -> str:
    with pytest.raises(wire.WireError) as info:
        wire.decode(data, SPEC)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_empty_body() -> None:
    assert "empty" in decode_error(b"")


@pytest.mark.parametrize(
    "data",
    [
        b"this is not a safetensors file at all",
        b"\x01\x02",
        b"\x00" * 16,
        b'{"layer.weight": [1, 2, 3]}',
    ],
)
def test_garbage_bytes(data: bytes) -> None:
    assert "not a valid safetensors" in decode_error(data)


def test_pickle_is_refused_not_loaded() -> None:
    class Boom:
        def __reduce__(self):  # would run on unpickling
            return (exec, ("raise SystemExit('unpickled!')",))

    for obj in ({"layer.weight": [1.0] * 6, "layer.bias": [0.0, 0.0]}, {"x": Boom()}):
        assert "not a valid safetensors" in decode_error(pickle.dumps(obj))


def test_pickled_tensors_via_torch_save_are_refused() -> None:
    buf = io.BytesIO()
    torch.save(good_tensors(), buf)
    assert "not a valid safetensors" in decode_error(buf.getvalue())


@pytest.mark.parametrize("cut", [1, 4, 20])
def test_truncated_safetensors(cut: int) -> None:
    data = wire.encode(good_tensors())
    assert "not a valid safetensors" in decode_error(data[:-cut])


def test_truncated_header() -> None:
    data = wire.encode(good_tensors())
    assert "not a valid safetensors" in decode_error(data[:12])


def test_missing_tensor() -> None:
    tensors = good_tensors()
    del tensors["layer.bias"]
    message = decode_error(wire.encode(tensors))
    assert "missing" in message and "layer.bias" in message
    assert "unexpected" not in message


def test_extra_tensor() -> None:
    tensors = good_tensors() | {"sneaky": torch.zeros(1)}
    message = decode_error(wire.encode(tensors))
    assert "unexpected" in message and "sneaky" in message
    assert "missing" not in message


def test_missing_and_extra_both_named() -> None:
    tensors = good_tensors()
    tensors["layer.biass"] = tensors.pop("layer.bias")
    message = decode_error(wire.encode(tensors))
    assert "layer.bias'" in message and "layer.biass" in message


def test_wrong_shape() -> None:
    tensors = good_tensors()
    tensors["layer.weight"] = torch.zeros(3, 2)
    message = decode_error(wire.encode(tensors))
    assert "layer.weight" in message and "shape" in message
    assert "[3, 2]" in message and "[2, 3]" in message


def test_same_numel_other_rank_is_a_wrong_shape() -> None:
    tensors = good_tensors()
    tensors["layer.weight"] = torch.zeros(6)
    assert "shape" in decode_error(wire.encode(tensors))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int64])
def test_wrong_dtype(dtype: torch.dtype) -> None:
    # wire.encode always writes float32: build the body with safetensors directly.
    tensors = good_tensors()
    tensors["layer.bias"] = tensors["layer.bias"].to(dtype)
    message = decode_error(st_save(tensors))
    assert "layer.bias" in message and "dtype" in message and "float32" in message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values(bad: float) -> None:
    tensors = good_tensors()
    tensors["layer.weight"][1, 2] = bad
    message = decode_error(wire.encode(tensors))
    assert "layer.weight" in message and "NaN or infinite" in message


def test_bytearray_and_memoryview_are_accepted() -> None:
    data = wire.encode(good_tensors())
    for view in (bytearray(data), memoryview(data)):
        out = wire.decode(view, SPEC)  # type: ignore[arg-type]
        assert torch.equal(out["layer.bias"], good_tensors()["layer.bias"])


# -- Layout: the hot path's form of the same file ------------------------------------------------

LAYOUT = wire.Layout(list(SPEC.items()), n_params=8)


def test_a_layout_body_is_a_safetensors_file_and_reads_back_with_its_metadata() -> None:
    vector = LAYOUT.flatten(good_tensors())
    report = '{"episodes": [[1.5, 10]], "name": "a \\"quoted\\" one"}'  # as a push's report
    body = LAYOUT.encode(vector, {"a3c": report})
    out, metadata = LAYOUT.decode(body)
    assert torch.equal(out, vector) and metadata == {"a3c": report}
    # Any safetensors reader takes it, and any writer's file is read by the layout.
    assert all(torch.equal(wire.decode(body, SPEC)[n], t) for n, t in good_tensors().items())
    assert all(torch.equal(st_load(body)[n], t) for n, t in good_tensors().items())
    assert torch.equal(LAYOUT.decode(LAYOUT.encode(vector))[0], vector)  # the header unparsed
    assert torch.equal(LAYOUT.decode(wire.encode(good_tensors()))[0], vector)
    assert len(LAYOUT.encode(vector)) == len(LAYOUT.header) + 4 * LAYOUT.numel


@pytest.mark.parametrize(
    "header",
    [
        b'"__metadata__":{"a3c":"x"},"extra":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        b'"__metadata__":{"a3c":1}}',
        b'"__metadata__":["a3c"]}',
        b'"__metadata__":{"a3c":"x"}',
    ],
)
def test_a_push_header_that_only_begins_as_the_layouts_is_judged_whole(header: bytes) -> None:
    """The metadata after the layout's own entries is all the master parses of a push's header;
    what does not end as one object there is read and judged as any other file."""
    raw = LAYOUT._entries_json[:-1] + b"," + header
    raw += b" " * (-len(raw) % 8)
    body = len(raw).to_bytes(8, "little") + raw + bytes(LAYOUT.nbytes)
    with pytest.raises(wire.WireError):
        LAYOUT.decode(body)


def test_a_model_layout_puts_the_parameters_first() -> None:
    from a3c_http.algos.registry import model_for

    model = model_for(train_config(normalize_obs=True))
    layout = wire.Layout.of(model)
    params = [name for name, _ in model.named_parameters()]
    assert layout.names[: len(params)] == params and "obs_rms.mean" in layout.names[len(params) :]
    assert layout.n_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"\x01", "8-byte header"),
        ((10**9).to_bytes(8, "little") + b"{}", "overruns"),
        ((4).to_bytes(8, "little") + b"[1] ", "not an object"),
        ((3).to_bytes(8, "little") + b"{x}", "header"),
    ],
)
def test_a_broken_layout_body_is_a_wire_error(body: bytes, named: str) -> None:
    with pytest.raises(wire.WireError, match=named):
        LAYOUT.decode(body)


def test_the_layout_names_the_tensor_with_non_finite_values_and_bad_metadata() -> None:
    tensors = good_tensors()
    tensors["layer.bias"][1] = float("nan")
    with pytest.raises(wire.WireError, match="'layer.bias' holds NaN"):
        LAYOUT.decode(LAYOUT.encode(LAYOUT.flatten(tensors)))
    with pytest.raises(wire.WireError, match="__metadata__"):
        LAYOUT.decode(st_save(good_tensors(), metadata={"a": "b"}).replace(b'"b"', b"[1]"))


# -- bfloat16 on the wire (wire_dtype) -----------------------------------------------------------

# Two parameters (6 + 2 values) and one buffer of statistics (a count, as normalize.py's).
MIXED = [("layer.weight", (2, 3)), ("layer.bias", (2,)), ("rms.count", ())]
BF16 = wire.Layout(MIXED, n_params=8, dtype="bfloat16")
F32 = wire.Layout(MIXED, n_params=8)


def mixed_vector() -> torch.Tensor:
    # 1 + 2**-8 is halfway between the bfloat16s 1 and 1 + 2**-7: to nearest even, 1; 1 + 3 *
    # 2**-8 halfway between 1 + 2**-7 and 1 + 2**-6: to 1 + 2**-6. The count is not a bfloat16.
    return torch.tensor(
        [1 + 2**-8, 1 + 3 * 2**-8, -0.1, 3.14159, 1e-20, 6e4, 0.0, -2.5, 1_234_567.0]
    )


def test_a_bfloat16_body_rounds_the_parameters_to_nearest_even_and_keeps_the_statistics() -> None:
    vector = mixed_vector()
    body = BF16.encode(vector, {"a3c": "{}"})
    out, metadata = BF16.decode(body)
    assert out.dtype == torch.float32 and metadata == {"a3c": "{}"}
    params = out[:8]
    assert params[0] == 1.0 and params[1] == 1 + 2**-6  # ties to even
    assert torch.equal(params, vector[:8].to(torch.bfloat16).to(torch.float32))
    assert torch.all((params - vector[:8]).abs() <= vector[:8].abs() * 2**-8)
    assert out[8] == 1_234_567.0  # bfloat16 would make it 1,236,992
    plain = BF16.encode(vector)
    assert len(plain) == BF16.body_bytes == len(BF16.header) + 2 * 8 + 4 * 1
    assert len(plain) < len(F32.encode(vector))


def test_a_bfloat16_body_is_a_safetensors_file_of_the_same_names_and_shapes() -> None:
    body = BF16.encode(mixed_vector())
    size = int.from_bytes(body[:8], "little")
    assert json.loads(body[8 : 8 + size]) == {
        # The float32 statistics first, as safetensors' own writer orders them: each aligned.
        "rms.count": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "layer.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [4, 16]},
        "layer.bias": {"dtype": "BF16", "shape": [2], "data_offsets": [16, 20]},
    }
    tensors = st_load(body)
    assert tensors["layer.weight"].dtype == torch.bfloat16
    assert tensors["rms.count"].dtype == torch.float32
    assert {name: tuple(t.shape) for name, t in tensors.items()} == BF16.spec


@pytest.mark.parametrize(
    ("layout", "other", "expected"),
    [(BF16, F32, "expected bfloat16"), (F32, BF16, "expected float32")],
)
def test_a_body_in_another_dtype_than_the_runs_is_refused_naming_the_one_expected(
    layout: wire.Layout, other: wire.Layout, expected: str
) -> None:
    with pytest.raises(wire.WireError) as info:
        layout.decode(other.encode(mixed_vector()))
    assert "'layer.weight' has dtype" in str(info.value) and expected in str(info.value)
    assert f"this run's wire_dtype is {layout.dtype}" in str(info.value)
    # The statistics must be float32 in a bfloat16 body too.
    tensors = BF16.views(mixed_vector())
    with pytest.raises(wire.WireError, match="'rms.count' has dtype bfloat16, expected float32"):
        BF16.decode(st_save({n: t.to(torch.bfloat16) for n, t in tensors.items()}))


def handmade(tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> bytes:
    """A safetensors file written by hand: the tensors' data in the order given, the header's
    entries listed the other way round (any order is valid)."""
    entries, data, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
        entries[name] = {
            "dtype": {torch.float32: "F32", torch.bfloat16: "BF16"}[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        data.append(raw)
        offset += len(raw)
    head = dict(reversed(entries.items()))
    if metadata is not None:
        head = {"__metadata__": metadata, **head}
    raw = json.dumps(head).encode()
    return len(raw).to_bytes(8, "little") + raw + b"".join(data)


def other_writers(layout: wire.Layout, vector: torch.Tensor) -> dict[str, bytes]:
    """Valid bodies of `vector` (in `layout`'s dtypes, with a push's metadata) from writers other
    than the layout's own, none of which lays the tensors out as it does."""
    tensors = {n: t.to(layout.dtypes[n]) for n, t in layout.views(vector).items()}
    backwards = dict(reversed(tensors.items()))
    bodies = {
        "safetensors.torch.save": st_save(backwards, {"a3c": "{}"}),
        "by hand, backwards": handmade(backwards, {"a3c": "{}"}),
        "by hand, in order": handmade(tensors, {"a3c": "{}"}),  # the header's entries reversed
    }
    if layout.dtype == "float32":  # numpy has no bfloat16
        arrays = {n: t.numpy() for n, t in backwards.items()}
        bodies["safetensors.numpy.save"] = np_save(arrays, {"a3c": "{}"})
    return bodies


@pytest.mark.parametrize("layout", [F32, BF16])
def test_another_writers_body_reads_as_the_layouts_own_in_one_gathering(
    layout: wire.Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our own bodies are one header comparison (its JSON unparsed) and one vector; another
    writer's, in any order, are gathered into the same vector, with their metadata."""
    vector = mixed_vector()
    ours = layout.encode(vector, {"a3c": "{}"})
    expected, metadata = layout.decode(ours)
    assert metadata == {"a3c": "{}"}
    parsed, gathered = [], []
    loads, gather = json.loads, wire.Layout._gather
    monkeypatch.setattr(wire.json, "loads", lambda *a, **k: parsed.append(1) or loads(*a, **k))
    monkeypatch.setattr(
        wire.Layout, "_gather", lambda *a, **k: gathered.append(1) or gather(*a, **k)
    )
    assert torch.equal(layout.decode(ours)[0], expected) and parsed == gathered == []
    for writer, body in other_writers(layout, vector).items():
        gathered.clear()
        out, metadata = layout.decode(body)
        assert torch.equal(out, expected), writer
        assert metadata == {"a3c": "{}"}, writer
        assert torch.equal(layout.decode(bytearray(body))[0], expected), writer
        # Data in the layout's own places is one vector whatever the header's order.
        own_places = writer == "by hand, in order" and layout.dtype == "float32"
        assert len(gathered) == (0 if own_places else 2), writer


def test_another_writers_header_is_read_once_and_its_data_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that sends the same header every push has it parsed and checked once: later
    bodies cost the gathering alone. The data is checked every time (its size and its values),
    the caller's metadata is its own, and the headers kept are bounded."""
    layout = wire.Layout(list(F32.spec.items()), F32.n_params)
    vector = mixed_vector()
    body = other_writers(layout, vector)["safetensors.torch.save"]
    parsed = []
    parse = wire.from_json
    monkeypatch.setattr(wire, "from_json", lambda raw: parsed.append(1) or parse(raw))
    first, metadata = layout.decode(body)
    metadata["a3c"] = "changed by the caller"
    again, metadata = layout.decode(body)
    assert torch.equal(first, again) and metadata == {"a3c": "{}"} and len(parsed) == 1
    nan = bytearray(body)
    nan[-4:] = struct.pack("<f", float("nan"))  # the last tensor's last value
    with pytest.raises(wire.WireError, match="NaN or infinite"):
        layout.decode(bytes(nan))
    with pytest.raises(wire.WireError, match="data is"):
        layout.decode(body + bytes(4))  # the same header over more data: checked again
    for i in range(3 * wire._READ_HEADERS):
        layout.decode(st_save(layout.views(vector), {"n": str(i)}))
    assert len(layout._read_headers) == wire._READ_HEADERS


def test_a_model_body_from_any_writer_reads_the_same() -> None:
    from a3c_http.algos.registry import model_for

    layout = wire.Layout.of(model_for(train_config(normalize_obs=True)))
    vector = torch.randn(layout.numel, generator=torch.Generator().manual_seed(0))
    vector[layout.n_params :] = vector[layout.n_params :].abs()
    for writer, body in other_writers(layout, vector).items():
        assert torch.equal(layout.decode(body, finite_params=False)[0], vector), writer


def framed(head: dict, data: bytes) -> bytes:
    raw = json.dumps(head).encode()
    return len(raw).to_bytes(8, "little") + raw + data


WEIGHT = {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
BIAS = {"dtype": "F32", "shape": [2], "data_offsets": [24, 32]}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (framed({"layer.weight": WEIGHT, "layer.bias": BIAS}, bytes(36)), "32 bytes"),
        (framed({"layer.weight": WEIGHT, "layer.bias": BIAS}, bytes(28)), "overruns|32 bytes"),
        (
            framed({"layer.weight": WEIGHT, "layer.bias": {**BIAS, "dtype": "F99"}}, bytes(32)),
            "F99",
        ),
        (
            framed({"layer.weight": WEIGHT, "layer.bias": {**BIAS, "shape": [-2]}}, bytes(32)),
            "shape",
        ),
        (
            framed({"layer.weight": WEIGHT, "layer.bias": {**BIAS, "shape": [True, 2]}}, bytes(32)),
            "shape",
        ),
        (
            framed({"layer.weight": WEIGHT, "layer.bias": {**BIAS, "shape": [2.0]}}, bytes(32)),
            "shape",
        ),
        (
            framed(
                {"layer.weight": WEIGHT, "layer.bias": {**BIAS, "data_offsets": [24]}}, bytes(32)
            ),
            "offsets",
        ),
        (
            framed(
                {"layer.weight": WEIGHT, "layer.bias": {"shape": [2], "data_offsets": [24, 32]}},
                bytes(32),
            ),
            "dtype",
        ),
        (framed({"layer.weight": WEIGHT, "layer.bias": [24, 32]}, bytes(32)), "dtype"),
        # A gap, an overlap, and a span of the wrong size for the shape.
        (
            framed(
                {"layer.weight": WEIGHT, "layer.bias": {**BIAS, "data_offsets": [28, 36]}},
                bytes(36),
            ),
            "starts at byte 28",
        ),
        (
            framed(
                {"layer.weight": WEIGHT, "layer.bias": {**BIAS, "data_offsets": [20, 28]}},
                bytes(28),
            ),
            "starts at byte 20",
        ),
        (
            framed(
                {"layer.weight": WEIGHT, "layer.bias": {**BIAS, "data_offsets": [24, 36]}},
                bytes(36),
            ),
            "spans",
        ),
        ((4).to_bytes(8, "little") + b"[{}]", "not an object"),
        ((4).to_bytes(8, "little") + b"{\xff}", "header"),
    ],
)
def test_a_body_safetensors_refuses_is_refused_naming_why(body: bytes, named: str) -> None:
    for read in (lambda b: LAYOUT.decode(b), lambda b: wire.decode(b, SPEC)):
        with pytest.raises(wire.WireError, match=f"not a valid safetensors file: .*({named})"):
            read(body)
    with pytest.raises(Exception):  # noqa: B017 (safetensors' own reader agrees)
        st_load(body)


def test_another_writers_body_is_refused_for_what_its_tensors_get_wrong() -> None:
    good = good_tensors()
    cases = {
        "missing tensors \\['layer.bias'\\]": {"layer.weight": good["layer.weight"]},
        "unexpected tensors \\['x'\\]": {**good, "x": torch.zeros(1)},
        "'layer.bias' has dtype float64, expected float32": {
            **good,
            "layer.bias": good["layer.bias"].double(),
        },
        "'layer.weight' has shape \\[3, 2\\], expected \\[2, 3\\]": {
            **good,
            "layer.weight": torch.zeros(3, 2),
        },
        "'layer.bias' holds NaN": {**good, "layer.bias": torch.tensor([0.0, float("nan")])},
    }
    for named, tensors in cases.items():
        backwards = dict(reversed(tensors.items()))
        for body in (st_save(backwards), np_save({n: t.numpy() for n, t in backwards.items()})):
            with pytest.raises(wire.WireError, match=named):
                LAYOUT.decode(body)
