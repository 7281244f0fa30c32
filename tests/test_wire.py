"""Tensors <-> safetensors bytes: the round trip and every way a peer can get a body wrong."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from safetensors.torch import save as st_save

from a3c_http import wire
from a3c_http.model import ActorCritic

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
    body = LAYOUT.encode(vector, {"a3c": "{}"})
    out, metadata = LAYOUT.decode(body)
    assert torch.equal(out, vector) and metadata == {"a3c": "{}"}
    # Any safetensors reader takes it, and any writer's file is read by the layout.
    assert all(torch.equal(wire.decode(body, SPEC)[n], t) for n, t in good_tensors().items())
    assert torch.equal(LAYOUT.decode(wire.encode(good_tensors()))[0], vector)
    assert len(LAYOUT.encode(vector)) == len(LAYOUT.header) + 4 * LAYOUT.numel


def test_a_model_layout_puts_the_parameters_first() -> None:
    from a3c_http.config import TrainConfig
    from a3c_http.model import model_for

    model = model_for(TrainConfig(normalize_obs=True))
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
