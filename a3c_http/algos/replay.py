"""A bounded replay memory of transitions, uniform or prioritized (Schaul et al. 2016), as
asynchronous DQN's workers keep their own and Ape-X's learner keeps one for every actor.

Transitions are stored in preallocated tensors of `capacity` rows, the oldest overwritten first,
so the memory never grows past what its first `add` sets out (`nbytes`). Sampling draws row i with
probability p_i^alpha / sum_j p_j^alpha from a sum tree (alpha 0: uniform) and weights it by
(N P(i))^-beta / max_j (N P(j))^-beta, the importance weights that correct the bias (beta annealed
towards 1 by the caller). New rows without a priority get the highest seen so far, so each is
sampled at least once soon; `update` sets the priorities of sampled rows from their TD errors.
A TD error beyond `MAX_PRIORITY` or not finite (no learning network's: a crafted or broken
transition, whose step was clipped to nothing or undone) gives its row the lowest priority, so
no value can overflow the tree's sums, and no such row can take over the sampling.
"""

from __future__ import annotations

import numpy as np
import torch

# The largest TD error taken as one: above any of a learning Q-network's, far below what could
# overflow the sum of a full replay's priorities.
MAX_PRIORITY = 1e6


class SumTree:
    """Priorities of `capacity` leaves whose prefix sums are searched in O(log capacity)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 1
        while self.size < capacity:
            self.size *= 2
        self.tree = np.zeros(2 * self.size)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def set(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Set leaves `index` to `priority` (repeated indices: the last value wins)."""
        index = np.asarray(index, dtype=np.int64)
        _, last = np.unique(index[::-1], return_index=True)
        chosen = len(index) - 1 - last
        node = index[chosen] + self.size
        self.tree[node] = np.asarray(priority, dtype=np.float64)[chosen]
        while node[0] > 1:  # every leaf is as deep: their parents, level by level to the root
            node = np.unique(node // 2)
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]

    def get(self, index: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(index, dtype=np.int64) + self.size]

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The leaves where each prefix sum `mass` (in [0, total)) falls."""
        node = np.ones(len(mass), dtype=np.int64)
        mass = np.asarray(mass, dtype=np.float64).copy()
        while node[0] < self.size:
            left = 2 * node
            go_right = mass >= self.tree[left]
            mass = np.where(go_right, mass - self.tree[left], mass)
            node = np.where(go_right, left + 1, left)
        return np.minimum(node - self.size, self.capacity - 1)


class Replay:
    """A bounded replay of named tensors (the module's docstring). `alpha` 0 samples uniformly."""

    def __init__(self, capacity: int, alpha: float = 0.0, eps: float = 1e-6) -> None:
        if capacity < 1:
            raise ValueError(f"a replay holds at least one transition, not {capacity}")
        self.capacity = capacity
        self.alpha = alpha
        self.eps = eps
        self.tree = SumTree(capacity)
        self.rows: dict[str, torch.Tensor] = {}
        self.next = 0  # the row the next transition goes to
        self.count = 0  # rows filled
        self.max_priority = 1.0

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        """The memory the stored tensors take (all of it, from the first add)."""
        return sum(t.numel() * t.element_size() for t in self.rows.values())

    def add(
        self, transitions: dict[str, torch.Tensor], priorities: torch.Tensor | None = None
    ) -> None:
        """Store `[B, ...]` tensors (the same names each time), with their priorities (such as
        the actors' initial TD errors) or the highest so far."""
        n = len(next(iter(transitions.values())))
        if n == 0:
            return
        if not self.rows:
            self.rows = {
                name: torch.zeros((self.capacity, *t.shape[1:]), dtype=t.dtype)
                for name, t in transitions.items()
            }
        if n > self.capacity:  # only the newest fit
            transitions = {k: v[-self.capacity :] for k, v in transitions.items()}
            priorities = None if priorities is None else priorities[-self.capacity :]
            n = self.capacity
        index = (self.next + np.arange(n)) % self.capacity
        torch_index = torch.from_numpy(index)
        for name, t in transitions.items():
            self.rows[name][torch_index] = t.to(self.rows[name].dtype)
        if priorities is None:
            self.tree.set(index, np.full(n, self.max_priority) ** self.alpha)
        else:
            self.update(index, priorities)
        self.next = int((self.next + n) % self.capacity)
        self.count = min(self.count + n, self.capacity)

    def sample(
        self, batch_size: int, beta: float = 0.0, generator: np.random.Generator | None = None
    ) -> tuple[dict[str, torch.Tensor], np.ndarray, torch.Tensor]:
        """`batch_size` rows drawn by priority (stratified over the tree's mass): the tensors,
        the rows' indices (for `update`) and their importance weights `[B]` (ones for beta 0)."""
        if self.count == 0:
            raise ValueError("the replay is empty")
        rng = generator or np.random.default_rng()
        if self.alpha == 0:  # uniform: no tree to walk, every weight 1
            index = rng.integers(0, self.count, batch_size)
            torch_index = torch.from_numpy(index)
            batch = {name: t[torch_index] for name, t in self.rows.items()}
            return batch, index, torch.ones(batch_size)
        total = self.tree.total
        bounds = np.linspace(0.0, total, batch_size + 1)
        mass = rng.uniform(bounds[:-1], bounds[1:])
        index = self.tree.find(np.minimum(mass, np.nextafter(total, 0)))
        index = np.minimum(index, self.count - 1)
        probs = self.tree.get(index) / total
        if beta > 0:
            weights = (self.count * probs) ** (-beta)
            weights = weights / weights.max()
        else:
            weights = np.ones(batch_size)
        torch_index = torch.from_numpy(index)
        batch = {name: t[torch_index] for name, t in self.rows.items()}
        return batch, index, torch.as_tensor(weights, dtype=torch.float32)

    def update(self, index: np.ndarray, priorities: torch.Tensor) -> None:
        """New priorities (such as absolute TD errors) of rows `index` that `sample` gave:
        the lowest (`eps`) where one is beyond MAX_PRIORITY or not finite."""
        if self.alpha == 0:  # uniform: the priorities shape nothing
            return
        p = priorities.detach().double().abs().cpu().numpy()
        p = np.where(p <= MAX_PRIORITY, p + self.eps, self.eps)  # NaN compares false
        self.max_priority = max(self.max_priority, float(p.max()))
        self.tree.set(index, p**self.alpha)
