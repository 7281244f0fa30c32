"""Benchmark: would applying several waiting gradients in one optimizer step save the master time?

    .venv/bin/python scripts/bench_batched_step.py [--model default,1M] [--k 1,2,3,4]

A3C applies each gradient in its own RMSprop step. k gradients that arrive together (a read of
the fronts' channel brings about 2.6 at saturation on this project's 2-core machine) can be
applied in one step with the same result up to rounding, because their steps depend on one
another only through RMSprop's mean square v, which is linear in the squared gradients:

    v_i = alpha^i v_0 + (1 - alpha) sum_{j<=i} alpha^(i-j) g_j^2     (i = 1 .. k)
    p_k = p_0 - lr sum_i g_i / (sqrt(v_i) + eps)

so every v_i comes out of one matrix product over the k squared gradients, and the k steps of the
weights out of one sum. This keeps A3C's semantics exactly (unlike one step on the gradients' sum
or mean, which RMSprop would see as one large gradient; the mean is `sync` mode). The question is
only its cost: this script times k steps of the master's own optimizer (a3c_http/algos/a3c.py
`PlainRMSprop.apply`, one flat parameter vector as the master steps it) against the batched step
of the same k gradients, one torch thread, medians of 7 rounds, and prints the largest
difference of the weights between the two (float32 rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from a3c_http.algos.a3c import make_optimizer  # noqa: E402
from a3c_http.config.training import TrainConfig  # noqa: E402
from a3c_http.models.actor_critic import model_for  # noqa: E402
from a3c_http.wire.tensors import Layout  # noqa: E402

MODELS = {"default": [64, 64], "1M": [700, 700]}
ROUNDS = 7


def batched_step(p: torch.Tensor, v: torch.Tensor, grads: torch.Tensor, weights: torch.Tensor,
                 decay: torch.Tensor, lr: float, eps: float) -> None:
    """The k RMSprop steps of the rows of `grads` at once (the module's docstring)."""
    means = torch.addmm(decay.unsqueeze(1) * v.unsqueeze(0), weights, grads * grads)
    v.copy_(means[-1])
    p.sub_(torch.div(grads, means.sqrt_().add_(eps)).sum(0), alpha=lr)


def measure(hidden: list[int], k: int, per_round: int) -> dict:
    config = TrainConfig(hidden_sizes=hidden)
    n = Layout.of(model_for(config)).n_params
    gen = torch.Generator().manual_seed(k)
    grads = torch.randn(k, n, generator=gen) * (0.4 / n**0.5)  # norms of a clipped push
    param = torch.nn.Parameter(torch.randn(n, generator=gen) * 0.1)
    optimizer = make_optimizer([param], config)  # the master's: PlainRMSprop by default
    group = optimizer.param_groups[0]
    alpha, eps, lr = group["alpha"], group["eps"], group["lr"]
    idx = torch.arange(k)
    ages = (idx[:, None] - idx[None, :]).clamp(min=0).to(torch.float64)
    weights = torch.where(idx[:, None] >= idx[None, :], (1 - alpha) * alpha**ages, 0.0).float()
    decay = (alpha ** (idx + 1).to(torch.float64)).float()

    def sequential() -> None:
        for g in grads:
            param.grad = g
            optimizer.apply()
        param.grad = None

    # The same k gradients from the same state: how far the batched step lands from k steps.
    sequential()  # creates the optimizer's state (a mean square of the first steps)
    p0, v0 = param.detach().clone(), optimizer.state[param]["square_avg"].clone()
    sequential()
    p1, v1 = p0.clone(), v0.clone()
    batched_step(p1, v1, grads, weights, decay, lr, eps)
    difference = float((param.detach() - p1).abs().max())
    p, v = p0.clone(), v0.clone()
    seq_us, batch_us = [], []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(per_round):
            sequential()
        seq_us.append((time.perf_counter() - started) / per_round * 1e6)
        started = time.perf_counter()
        for _ in range(per_round):
            batched_step(p, v, grads, weights, decay, lr, eps)
        batch_us.append((time.perf_counter() - started) / per_round * 1e6)
    seq, batch = statistics.median(seq_us), statistics.median(batch_us)
    return {"params": n, "k": k, "k_steps_us": round(seq, 1),
            "one_batched_step_us": round(batch, 1), "ratio": round(batch / seq, 3),
            "max_weight_difference": difference}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default,1M", help="comma-separated, of default, 1M")
    parser.add_argument("--k", default="1,2,3,4", help="gradients applied together")
    args = parser.parse_args()
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    if not models or any(m not in MODELS for m in models):
        parser.error(f"--model {args.model!r}: give one or more of {', '.join(MODELS)}")
    try:
        ks = [int(x) for x in args.k.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--k {args.k!r}: give comma-separated whole numbers")
    if not ks or any(not 1 <= k <= 64 for k in ks):
        parser.error(f"--k {args.k!r}: give numbers from 1 to 64")
    torch.set_num_threads(1)  # as the master steps
    print("model    params     k  k steps us  one batched us  ratio  max weight difference")
    for name in models:
        for k in ks:
            r = measure(MODELS[name], k, per_round=2000 if name == "default" else 20)
            print(f"{name:8} {r['params']:>9,} {k:>3} {r['k_steps_us']:>11,.1f} "
                  f"{r['one_batched_step_us']:>15,.1f} {r['ratio']:>6.2f}  "
                  f"{r['max_weight_difference']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
