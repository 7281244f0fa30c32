"""Data-parallel learners: the `learners` processes of a run learn as one (PyTorch's
DistributedDataParallel's scheme, on the flat gradient vector).

Each learner holds the same network and optimizer, computes gradients on its share of an update's
environments, and before every optimizer step the gradients are averaged over all of them
(`Team.average`, an all-reduce: gloo on CPUs, NCCL where every learner has a GPU of its own), so
every learner takes the same step and the networks stay equal. Where a learner decides something
the others must decide alike (how many minibatches, whether its replay shard is ready), the team
agrees on it (`Team.agree`).

The processes join as torchrun starts its ranks: `TeamSpec` says a learner's rank, how many there
are and where rank 0 holds the rendezvous (a TCP store on a port the master chose). One learner
(`SOLO`, the default) joins nothing and its calls cost nothing.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# How long a collective waits for the other learners before it raises: a learner that died is
# seen at once (its connections close), one that hangs after this.
TEAM_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TeamSpec:
    """How one learner joins its team: its rank, the team's size, and rank 0's rendezvous."""

    rank: int
    size: int
    address: str = "127.0.0.1"
    port: int = 0


def rendezvous_port(address: str = "127.0.0.1") -> int:
    """A port free on `address` now, for a team's rendezvous (its first learner listens there)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


class Team:
    """One learner alone: nothing to average or agree on."""

    rank = 0
    size = 1

    def average(self, tensor: torch.Tensor) -> None:
        """Replace `tensor` with its mean over the team's learners (in place)."""

    def agree(self, value: int, how: str = "max") -> int:
        """The team's `how` ("max" or "min") of each learner's `value`."""
        return value

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` to every learner, in place (a CPU tensor: the leader's plan)."""

    def close(self) -> None:
        """Leave the team."""


SOLO = Team()

# What the first learner of a team tells the others before each update (`Plan`).
STOP, LEARN = 0, 1


class Plan:
    """The next step of a team (STOP, or LEARN from rollouts in these slots at these env
    steps), told by its first learner to the others: int64s, not a pickle."""

    def __init__(self, most: int) -> None:
        """`most`: the most slots an update takes (`queue_size`)."""
        self.tensor = torch.zeros(3 + most, dtype=torch.int64)

    def tell(self, team: Team, command: int, slots: Sequence[int] = (), env_steps: int = 0) -> None:
        if team.size == 1:
            return
        self.tensor.zero_()
        self.tensor[0], self.tensor[1], self.tensor[2] = command, env_steps, len(slots)
        self.tensor[3 : 3 + len(slots)] = torch.tensor(slots, dtype=torch.int64)
        team.broadcast(self.tensor)

    def hear(self, team: Team) -> tuple[int, list[int], int]:
        team.broadcast(self.tensor)
        command, env_steps, n = (int(v) for v in self.tensor[:3])
        return command, self.tensor[3 : 3 + n].tolist(), env_steps


def backend_for(device: torch.device, gpus: int, size: int) -> str:
    """NCCL where the learners are on CUDA with a GPU each, else gloo (which also serves CUDA
    tensors, through the CPU)."""
    return "nccl" if device.type == "cuda" and gpus >= size else "gloo"


class ProcessTeam(Team):
    """A learner of `spec.size` joined over torch.distributed (the default process group of
    its process: one team a process)."""

    def __init__(self, spec: TeamSpec, device: torch.device) -> None:
        import torch.distributed as dist

        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        self.backend = backend_for(device, gpus, spec.size)
        self.rank, self.size = spec.rank, spec.size
        self._device = device
        dist.init_process_group(
            self.backend,
            init_method=f"tcp://{spec.address}:{spec.port}",
            rank=spec.rank,
            world_size=spec.size,
            timeout=datetime.timedelta(seconds=TEAM_TIMEOUT_S),
        )
        self._dist = dist

    def _through(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` where the backend takes it: gloo's through the CPU."""
        return tensor.cpu() if self.backend == "gloo" and tensor.is_cuda else tensor

    def average(self, tensor: torch.Tensor) -> None:
        moved = self._through(tensor)
        self._dist.all_reduce(moved)
        moved.div_(self.size)
        if moved is not tensor:
            tensor.copy_(moved)

    def agree(self, value: int, how: str = "max") -> int:
        op = {"max": self._dist.ReduceOp.MAX, "min": self._dist.ReduceOp.MIN}[how]
        device = self._device if self.backend == "nccl" else torch.device("cpu")
        held = torch.tensor([value], dtype=torch.int64, device=device)
        self._dist.all_reduce(held, op=op)
        return int(held.item())

    def broadcast(self, tensor: torch.Tensor) -> None:
        if self.backend == "nccl":
            moved = tensor.to(self._device)
            self._dist.broadcast(moved, 0)
            tensor.copy_(moved.cpu())
        else:
            self._dist.broadcast(tensor, 0)

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
