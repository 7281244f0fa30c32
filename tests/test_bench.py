"""scripts/bench.py: the steady-state rate, the load generator's bodies and the bar on made-up
figures, and one quick run of the `wire` section end to end (it starts a master)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from a3c_http import wire
from a3c_http.config import TrainConfig
from a3c_http.model import model_for
from scripts.bench import bar
from scripts.bench_load import ready_bodies
from scripts.bench_steps import steady_rate

ROOT = Path(__file__).resolve().parent.parent


def test_the_steady_rate_leaves_out_the_start_up() -> None:
    # 1,000 steps/s once running; the first sample (start-up) is below 10 % of the budget.
    samples = [(0.0, 0), (5.0, 500), (6.0, 1_500), (8.0, 3_500)]
    assert steady_rate(samples, budget=10_000) == (1_000.0, True)
    # Fewer than two samples past 10 %: the rate over all of them, not called steady.
    assert steady_rate(samples[:3], budget=10_000) == (250.0, False)
    assert steady_rate(samples[:1], budget=10_000) == (None, False)


def test_the_ready_made_gradients_fit_the_model_and_report_their_true_norm() -> None:
    layout = wire.Layout.of(model_for(TrainConfig()))
    spec = layout.spec
    bodies = ready_bodies(layout, count=3)
    assert len({b.data for b in bodies}) == 3
    for body in bodies:
        tensors = wire.decode(body.data, spec)
        norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors.values()))
        assert norm == pytest.approx(body.norm, rel=1e-4)
        assert 0.25 < body.norm < 1.0 and 0.5 < body.loss < 2.0


def _level(workers: int, pushes: float, p99: float, errors: dict, lost: int) -> dict:
    return {"workers": workers, "pushes_per_s": pushes, "p99_ms": p99, "errors": errors,
            "lost": lost}


def test_the_bar_judges_each_goal_and_leaves_the_unmeasured_open() -> None:
    figures = {
        "throughput": {"cluster_1": {"ratio": 0.95}},
        "master": {"models": {"default": {"levels": [
            _level(16, 1_200.0, 30.0, {}, 0), _level(64, 900.0, 80.0, {"409": 2}, 0),
        ]}}},
        "wire": {"models": {"default": {"request_ratio": 1.04, "reply_ratio": 1.06}}},
    }
    assert [g["met"] for g in bar(figures)] == [
        None,  # solve: not measured
        True,  # throughput 0.95
        False,  # 16 workers: p99 30 ms
        False,  # 64 workers: two 409s
        False,  # wire: the reply is 6 % over
        None,  # latency at 20 ms: not measured
        None,  # solved at 5 ms: not measured
    ]
    assert [g["measured"] for g in bar({})] == ["not measured"] * 7


@pytest.mark.integration
def test_the_wire_section_writes_its_figures_for_both_models_and_dtypes(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "scripts/bench.py", "--sections", "wire", "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures = json.loads(out.read_text())
    models = figures["wire"]["models"]
    assert set(models) == {"default", "1M", "default bf16", "1M bf16"}
    for name, model in models.items():
        assert model["raw_bytes"] == 4 * model["params"]
        # One exchange carries the whole body each way, and headers on top; in bfloat16 a
        # body holds 2 bytes a parameter.
        share = 1 if model["wire_dtype"] == "float32" else 0.5
        assert model["request_bytes"] > model["body_bytes"] > share * model["raw_bytes"]
        assert model["reply_bytes"] > share * model["raw_bytes"]
        assert model["encode_ms"] > 0 and model["decode_ms"] > 0
        if share < 1:
            assert model["body_bytes"] < 0.6 * models[name.removesuffix(" bf16")]["body_bytes"]
    wire_goal = next(g for g in figures["bar"] if g["goal"].startswith("wire"))
    assert wire_goal["met"] is not None
