"""A run's policy as one standalone file: `a3c-export RUN_DIR OUT [--format torchscript|onnx]`.

The file takes RAW observations, as the environment (with the wrappers of the run's config:
`preprocess`, `frame_stack`) gives them, in their own dtype (float32, or uint8/bool images), and
returns the action as the run's algorithm plays its policy, as its evaluation does
(a3c_http/policy/evaluation.py): a discrete action as an int64 index, a Box's float32, clipped to
it. A policy played greedily (a Q-network's: the highest value) takes the observation alone; one
played as it samples (an actor-critic's) takes the draw's noise beside it, `noise` `[B]` uniform
in [0, 1) for a discrete action (the first action whose cumulative probability passes it) or
`[B, action dims]` standard normal for a Box (scaling the Gaussian's std about its mean): random
noise samples the policy, the noise of the project's evaluation (`OUT.json`'s `noise`) plays its
very episodes, and 0.5 or zeros play near its most likely action. The observation statistics of
a normalising run are folded in, so its user needs nothing of this project:

- `torchscript`: `torch.jit.load(OUT)` in plain PyTorch;
- `onnx`: any ONNX runtime (`onnxruntime.InferenceSession(OUT)`), inputs and outputs named as
  below, the batch axis dynamic. Writing it needs the `onnx` package (the `export` extra).

Both take a batch: `obs` `[B, *observation shape]` (and `noise`) -> `action` `[B]` (discrete) or
`[B, action dims]` (Box). A recurrent policy (config `core: "lstm"`) carries its memory through
the caller: `(obs[, noise], h, c) -> (action, h, c)`, `h` and `c` float32 `[B, lstm_size]`, zeros
before an episode's first step (the row of an environment whose episode begins is set to zeros
again).

Beside OUT, `OUT.json` says what a user needs (the module `describe`): the environment, its
wrappers, the observation's shape and dtype, the action space, the inputs and outputs, the
recurrent state and the seeds of the project's evaluation; the same JSON travels inside the file
(TorchScript: the extra file `a3c_policy.json`; ONNX: the metadata entry `a3c_policy`).

Exit codes: 0 written; 2 nothing written: a RUN_DIR that is not a run folder with weights, a
config or weights that do not load, an environment whose package is not installed (one line on
stderr, which says what to install); 1 nothing written: `--format onnx` without the onnx
package.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from a3c_http.algos.registry import algorithm_class
from a3c_http.config.files import RunFolderError, read_run
from a3c_http.config.training import TrainConfig
from a3c_http.envs.make import MissingDependency, env_for
from a3c_http.models.actor_critic import ActorCritic
from a3c_http.policy.evaluation import EVAL_SEED_OFFSET, load_model
from a3c_http.store.runstore import atomic_write
from a3c_http.wire.tensors import WireError

__all__ = ["FORMATS", "METADATA", "CannotExport", "PlayedPolicy", "describe", "export", "main"]

FORMATS = ("torchscript", "onnx")
# The name of the description inside the file (TorchScript extra file, ONNX metadata key).
METADATA = "a3c_policy"
ONNX_OPSET = 17
# The batch of the example the module is traced with: 2, not 1, so that no exporter takes the
# batch size for a constant.
EXAMPLE_BATCH = 2


class CannotExport(Exception):
    """The run folder cannot be exported; `str()` is the one line the command prints.
    `exit_code`: 2 for the run folder (its config, weights, environment), 1 for the exporter."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class PlayedPolicy(nn.Module):
    """The acting part of a run's network, as evaluation acts: raw observations in (and, for a
    policy played as it samples, the draw's noise: `ActorCritic.drawn`), the action out (greedy
    or drawn, clipped to the Box as evaluation's `_fit` clips it), the recurrent state in and out
    when there is one. Traced, so the file holds only the operations of this one network (its
    encoder, normalisation and core), not the model's branches."""

    def __init__(
        self,
        model: ActorCritic,
        observation_space: gym.Space,
        action_space: gym.Space,
        sampled: bool = False,
    ):
        super().__init__()
        self.model = model
        self.sampled = sampled
        # As rollout.obs_tensor: float observations (float64 too) enter as float32, the others
        # (uint8, bool) as they are; the network casts and scales them itself.
        self.float_obs = bool(np.issubdtype(observation_space.dtype, np.floating))
        self.box = isinstance(action_space, gym.spaces.Box)
        if self.box:
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor, *rest: torch.Tensor) -> Any:
        if self.float_obs:
            obs = obs.to(torch.float32)
        noise, state = (rest[0], rest[1:]) if self.sampled else (None, rest)
        if state and self.model.lstm_first:  # the value's LSTM: not part of acting
            state = (*state, torch.zeros_like(state[0]), torch.zeros_like(state[1]))
        dist, _, state = self.model.act(obs, tuple(state), value=False)  # no value to play
        state = state[:2]
        action = self.model.greedy(dist) if noise is None else self.model.drawn(dist, noise)
        if self.box:  # np.clip(action, low, high), as evaluation does
            action = torch.minimum(torch.maximum(action, self.low), self.high)
        return (action, *state) if state else action


def load_run(run_dir: Path) -> tuple[TrainConfig, ActorCritic, dict[str, Any]]:
    """A run folder's config, its network with the saved weights (parameters and running
    statistics) and its state; CannotExport says what is wrong."""
    try:
        config, snap = read_run(run_dir)
        model = load_model(config, snap.weights)
    except (RunFolderError, MissingDependency) as exc:
        raise CannotExport(str(exc)) from None
    except (WireError, RuntimeError) as exc:
        raise CannotExport(f"{run_dir}: its weights do not load: {exc}") from None
    return config, model, snap.state


def describe(
    config: TrainConfig, model: ActorCritic, env: gym.Env, fmt: str, state: dict[str, Any]
) -> dict[str, Any]:
    """What a user of the exported file needs to know (the module's docstring)."""
    obs_space, action_space = env.observation_space, env.action_space
    if isinstance(action_space, gym.spaces.Box):
        action = {
            "type": "box", "shape": list(action_space.shape), "dtype": "float32",
            "low": action_space.low.tolist(), "high": action_space.high.tolist(),
            "env_dtype": str(action_space.dtype),
        }
    else:
        action = {"type": "discrete", "n": int(action_space.n), "dtype": "int64"}
    recurrent = model.recurrent
    floating = bool(np.issubdtype(obs_space.dtype, np.floating))
    sampled = algorithm_class(config).plays == "sample"
    noise = ["noise"] if sampled else []
    box = isinstance(action_space, gym.spaces.Box)
    return {
        "format": fmt,
        "env_id": config.env_id,
        "env_kwargs": config.env_kwargs,
        "wrappers": {"preprocess": config.preprocess, "frame_stack": config.frame_stack},
        # dtype: the environment's; input_dtype: the file's (float observations enter as float32,
        # which ONNX, unlike TorchScript, holds the caller to).
        "observation": {
            "shape": list(obs_space.shape), "dtype": str(obs_space.dtype),
            "input_dtype": "float32" if floating else str(obs_space.dtype),
        },
        "action": action,
        "inputs": ["obs", *noise, "h", "c"] if recurrent else ["obs", *noise],
        "outputs": ["action", "h_out", "c_out"] if recurrent else ["action"],
        "recurrent": (
            {"core": "lstm", "state_size": model.core.hidden_size, "dtype": "float32",
             "initial_state": "zeros, and zeros again in an environment's row when its episode "
             "begins"}
            if recurrent else None
        ),
        "policy": (
            "sampled: the action `noise` draws from the policy (`noise`)" if sampled
            else "greedy: the most likely action, or the Gaussian's mean clipped to the Box"
        ),
        "noise": (
            {
                "shape": ["batch", int(np.prod(action_space.shape))] if box else ["batch"],
                "dtype": "float32",
                "draws": (
                    "a Box's action: mean + std * noise, noise standard normal" if box
                    else "the first action whose cumulative probability passes noise, uniform "
                    "in [0, 1)"
                ),
                "evaluation": "episode i of the project's evaluation draws its steps' noise from "
                "numpy.random.default_rng([eval seed of episode i, 1]) in turn: "
                + ("standard_normal(action dims, dtype=float32)" if box else "random()"),
            }
            if sampled else None
        ),
        "normalize_obs": config.normalize_obs,
        "eval_seeds": f"episode i of the project's evaluation is reset with seed "
        f"(seed + {EVAL_SEED_OFFSET} + i) % 2**31",
        "seed": config.seed,
        "run_id": state.get("run_id"),
        "model_version": state.get("model_version"),
    }


def export(run_dir: Path, out: Path, fmt: str = "torchscript") -> dict[str, Any]:
    """Write the policy of the run in `run_dir` to `out` (and its description to `out`.json);
    the description. CannotExport when it cannot."""
    if fmt not in FORMATS:
        raise CannotExport(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    config, model, state = load_run(run_dir)
    env = env_for(config)  # load_model made one already: its packages are there
    try:
        meta = describe(config, model, env, fmt, state)
        sampled = meta["noise"] is not None
        policy = PlayedPolicy(model, env.observation_space, env.action_space, sampled).eval()
        policy.requires_grad_(False)  # or the file's actions would need .detach() before .numpy()
        example = _example(model, env.observation_space, meta["noise"])
    finally:
        env.close()
    text = json.dumps(meta, indent=2)
    with torch.no_grad(), warnings.catch_warnings():
        # PyTorch warns that TorchScript and the TorchScript-based ONNX exporter are deprecated;
        # both work, and need neither onnxscript nor the seconds torch.export takes.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", ".*is deprecated", category=FutureWarning)
        warnings.filterwarnings("ignore", ".*jit.*deprecated")
        body = _torchscript(policy, example, text) if fmt == "torchscript" else _onnx(
            policy, example, meta, text
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, body)
    atomic_write(sidecar(out), (text + "\n").encode())
    return meta


def sidecar(out: Path) -> Path:
    """Where the description of `out` is written: `out` with `.json` appended."""
    return out.with_name(out.name + ".json")


def _example(
    model: ActorCritic, obs_space: gym.Space, noise: dict[str, Any] | None
) -> tuple[torch.Tensor, ...]:
    obs = torch.zeros((EXAMPLE_BATCH, *obs_space.shape), dtype=_torch_dtype(obs_space.dtype))
    if obs.is_floating_point():
        obs = obs.float()
    draws = () if noise is None else (torch.full((EXAMPLE_BATCH, *noise["shape"][1:]), 0.5),)
    return (obs, *draws, *model.initial_state(EXAMPLE_BATCH)[:2])  # the policy's (h, c)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def _torchscript(policy: PlayedPolicy, example: tuple[torch.Tensor, ...], text: str) -> bytes:
    traced = torch.jit.trace(policy, example, check_trace=False)
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer, _extra_files={METADATA + ".json": text})
    return buffer.getvalue()


def _onnx(
    policy: PlayedPolicy, example: tuple[torch.Tensor, ...], meta: dict[str, Any], text: str
) -> bytes:
    try:
        import onnx
    except ImportError:
        raise CannotExport(
            "--format onnx needs the onnx package, which is not installed here: "
            "pip install 'a3c-http[export]' (onnx, and onnxruntime to run the file)",
            exit_code=1,
        ) from None
    batch = {0: "batch"}
    buffer = io.BytesIO()
    # The TorchScript-based exporter (dynamo=False): see `export`'s warnings.
    torch.onnx.export(
        policy,
        example,
        buffer,
        input_names=meta["inputs"],
        output_names=meta["outputs"],
        dynamic_axes={name: batch for name in meta["inputs"] + meta["outputs"]},
        opset_version=ONNX_OPSET,
        dynamo=False,
    )
    proto = onnx.load_from_string(buffer.getvalue())
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA, text
    return proto.SerializeToString()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="a3c-export",
        description="Write a run's policy, played as its evaluation plays it, as one file that "
        "takes raw observations "
        "(TorchScript for plain PyTorch, or ONNX), and its description beside it (OUT.json).",
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder (runs/latest)")
    parser.add_argument("out", type=Path, metavar="OUT", help="the file to write (policy.pt)")
    parser.add_argument("--format", choices=FORMATS, default="torchscript", help="(torchscript)")
    args = parser.parse_args(argv)
    try:
        meta = export(args.run_dir, args.out, args.format)
    except CannotExport as exc:
        print(f"a3c-export: error: {exc}", file=sys.stderr)
        return exc.exit_code
    shape = "x".join(str(n) for n in meta["observation"]["shape"])
    ins, outs = meta["inputs"], meta["outputs"]
    takes = " -> ".join(names[0] if len(names) == 1 else f"({', '.join(names)})"
                        for names in (ins, outs))  # fmt: skip
    print(
        f"{args.out}: {meta['format']} policy of {meta['env_id']} (model version "
        f"{meta['model_version']}), {takes}, obs [B, {shape}] {meta['observation']['dtype']}; "
        f"described in {sidecar(args.out)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
