"""scripts/bench.py and its library scripts/benchlib/: the steady-state rate, the load generator's
bodies and the bar on made-up figures, and one quick run of the `wire` section end to end (it
starts a master); `scale`: a window's figures on made-up readings, its config overrides, and one
quick run end to end; `staleness`: its summary of made-up runs; `load`: its counts on made-up
readings and one short run of simulated actors end to end; `learn`: what an interrupted run keeps;
every command's --help."""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from a3c_http.algos.registry import model_for, train_config
from a3c_http.wire import tensors as wire
from scripts import bench
from scripts.benchlib.actors import mismatches
from scripts.benchlib.bar import bar
from scripts.benchlib.capacity import actor_rate, served_per_core, setups
from scripts.benchlib.cluster import median_round, steady_rate
from scripts.benchlib.load import Level, ready_bodies
from scripts.benchlib.options import config_overrides, number, seed_list
from scripts.benchlib.procs import default_workers, pin_sets, receivers_cores
from scripts.benchlib.scale import OWN_FIELDS, OWN_WHY, add_efficiency, window_figures
from scripts.benchlib.staleness import summary as staleness_summary

ROOT = Path(__file__).resolve().parents[2]


def test_the_steady_rate_leaves_out_the_start_up() -> None:
    # 1,000 steps/s once running; the first sample (start-up) is below 10 % of the budget.
    samples = [(0.0, 0), (5.0, 500), (6.0, 1_500), (8.0, 3_500)]
    assert steady_rate(samples, budget=10_000) == (1_000.0, True)
    # Fewer than two samples past 10 %: the rate over all of them, not called steady.
    assert steady_rate(samples[:3], budget=10_000) == (250.0, False)
    assert steady_rate(samples[:1], budget=10_000) == (None, False)


def test_the_throughput_figures_are_medians_over_the_rounds_and_ratios_within_them() -> None:
    rounds = [
        {"steps_per_s": 17_000.0, "ratio": 0.85, "steady": True},
        {"steps_per_s": 18_000.0, "ratio": 0.95, "steady": False},
        {"steps_per_s": None, "ratio": None, "steady": False},  # a round that measured nothing
        {"steps_per_s": 17_500.0, "ratio": 0.90, "steady": True},
    ]
    median = median_round(rounds)
    # The middle measured round (the lower of two), each round's figures, and the ratios' median
    # (a ratio is within its round: (a) moves from round to round as much as (b)).
    assert median["steps_per_s"] == 17_500.0 and median["steady"] is True
    assert median["rates"] == [17_000.0, 18_000.0, None, 17_500.0]
    assert median["ratios"] == [0.85, 0.95, None, 0.90] and median["ratio"] == 0.9


def test_the_ready_made_gradients_fit_the_model_and_report_their_true_norm() -> None:
    layout = wire.Layout.of(model_for(train_config()))
    spec = layout.spec
    bodies = ready_bodies(layout, count=3)
    assert len({b.data for b in bodies}) == 3
    for body in bodies:
        tensors = wire.decode(body.data, spec)
        norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors.values()))
        assert norm == pytest.approx(body.norm, rel=1e-4)
        assert 0.25 < body.norm < 1.0 and 0.5 < body.loss < 2.0


def test_the_solve_section_alternates_the_learners_and_gives_sb3_cartpoles_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both halves made up (the SB3 half needs the optional `bench` extra): what the section
    hands each learner, and its medians and ratio."""
    from scripts.benchlib import bar as bench
    from scripts.benchlib.tasks import TASKS

    calls = []

    def cluster(seed: int, workers: int, body: dict, cap_s: float) -> dict:
        calls.append(("cluster", seed))
        return {"solved": True, "seconds": 8.0 + seed, "env_steps": 1, "mean_return_100": 480.0}

    def sb3(env_id: str, seed: int, task, cap_s: float) -> dict:
        assert (env_id, task) == ("CartPole-v1", TASKS["CartPole-v1"])
        calls.append(("sb3", seed))
        return {"solved": True, "seconds": 10.0, "env_steps": 1, "mean_return_100": 480.0}

    monkeypatch.setitem(sys.modules, "stable_baselines3", type(sys)("stable_baselines3"))
    monkeypatch.setattr(bench, "fresh_run", cluster)
    monkeypatch.setattr(bench, "run_sb3", sb3)
    out = bench.solve(seeds=2, cap_s=60.0)
    assert calls == [("cluster", 0), ("sb3", 0), ("cluster", 1), ("sb3", 1)]
    assert out["cluster"]["median_s"] == 8.5 and out["ratio"] == 0.85


def _level(
    workers: int, pushes: float, p99: float, errors: dict, lost: int, cpu_ms: float | None = None
) -> dict:
    return {"workers": workers, "pushes_per_s": pushes, "p99_ms": p99, "errors": errors,
            "lost": lost, "master_ms_per_push": cpu_ms}


def test_the_bar_judges_each_goal_and_leaves_the_unmeasured_open() -> None:
    figures = {
        "throughput": {"cluster_1": {"ratio": 0.95}},
        "master": {"models": {
            "default": {"levels": [
                _level(16, 3_200.0, 30.0, {}, 0, 0.38), _level(64, 900.0, 80.0, {"409": 2}, 0),
            ]},
            "1M": {"levels": [_level(1, 240.0, 9.0, {}, 0, 4.5), _level(4, 260.0, 30.0, {}, 0)]},
        }},
        "wire": {"models": {"default": {"request_ratio": 1.04, "reply_ratio": 1.06}}},
    }
    assert [g["met"] for g in bar(figures)] == [
        None,  # solve: not measured
        True,  # throughput 0.95
        False,  # 16 workers: 3,200 pushes/s but p99 30 ms
        True,  # default model: 0.38 ms of CPU a push
        False,  # 1M model: 4.5 ms of CPU a push
        True,  # 1M model: 260 pushes/s at 4 workers
        False,  # 64 workers: two 409s
        False,  # wire: the reply is 6 % over
        None,  # latency at 20 ms: not measured
        None,  # solved at 5 ms: not measured
    ]
    assert [g["measured"] for g in bar({})] == ["not measured"] * 10


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


def _reading(t: float, steps: int, applied: int, by: dict, staleness: int, master: float,
             workers: dict) -> dict:
    status = {"env_steps": steps, "updates_applied": applied, "updates_rejected": sum(by.values()),
              "updates_rejected_by": by, "staleness_total": staleness}
    return {"t": t, "status": status, "master": {10: master, 11: master / 2},
            "master_own": {10: master}, "workers": workers}


def test_a_scale_window_counts_only_its_own_span_and_the_efficiency_is_against_the_fewest() -> None:
    # Before the window: 100 updates at staleness 5 each, 4 stale refusals. In it, 2 s: 200
    # updates at staleness 2, 6 more stale and 2 invalid; worker 21 (a push process) is gone.
    first = _reading(10.0, 5_000, 100, {"stale": 4, "invalid": 0}, 500, 3.0,
                     {20: 1.0, 21: 0.5})
    last = _reading(12.0, 25_000, 300, {"stale": 10, "invalid": 2}, 900, 3.416, {20: 2.5})
    r = window_figures(2, first, last)
    assert (r["env_steps_per_s"], r["env_steps_per_s_per_worker"]) == (10_000.0, 5_000.0)
    assert (r["updates_per_s"], r["pushes_handled"]) == (100.0, 208)
    assert r["refused"] == {"stale": 6, "invalid": 2}
    assert r["refusals_per_s"] == {"stale": 3.0, "invalid": 1.0}
    assert r["staleness_mean"] == 2.0  # not the run's cumulative 900 / 300
    # The master (pid 10) and a receiver of it (11), which used half what the master did.
    assert r["master_cpu_cores"] == pytest.approx(0.312)
    assert r["master_ms_per_push"] == pytest.approx(3.0)  # 0.624 CPU s over 208 pushes
    assert r["master_own_ms_per_push"] == pytest.approx(2.0)  # the master's 0.416 alone
    assert r["master_own_cpu_cores"] == pytest.approx(0.208)
    assert r["workers_cpu_cores"] == pytest.approx(0.75)  # worker 20 alone
    levels = [{"workers": 4, "env_steps_per_s": 6_000.0},
              {"workers": 2, "env_steps_per_s": 4_000.0}]
    add_efficiency(levels)
    assert [(r["efficiency"], r["efficiency_base"]) for r in levels] == [(0.75, 2), (1.0, 2)]
    # The master counts as a core: 16 cores leave 15 for workers.
    assert [default_workers(c) for c in (16, 9, 2, 1)] == [[1, 2, 4, 8, 15], [1, 2, 4, 8], [1], [1]]


def test_pinned_the_master_has_a_core_of_its_own_and_its_receivers_share_the_workers() -> None:
    # taskset's lists, the master's first.
    assert pin_sets(3, list(range(16))) == ["0", "1", "2", "3"]
    assert receivers_cores(list(range(16))) == set(range(1, 16))
    # Past the last core the workers go around again over theirs, not the master's.
    assert pin_sets(4, [0, 1, 2]) == ["0", "1", "2", "1", "2"]
    assert pin_sets(2, [0, 1]) == ["0", "1", "1"]
    assert pin_sets(1, [5]) == ["5", "5"] and receivers_cores([5]) == {5}  # all the cores there are


def test_the_staleness_summary_takes_medians_of_solved_runs_and_counts_the_rest() -> None:
    def run(workers: int, lag: int, solved: bool, steps: int, stale: float) -> dict:
        return {"workers": workers, "lag": lag, "solved": solved, "env_steps": steps,
                "updates": steps // 40, "staleness_mean": stale}

    rows = staleness_summary([
        run(4, 2, True, 200_000, 6.9), run(1, 1, True, 150_000, 0.0),
        run(4, 2, False, 1_000_000, 7.0), run(4, 2, True, 300_000, 6.95),
        run(4, 1, False, 1_000_000, 3.0),
    ])
    assert [(r["workers"], r["lag"], r["runs"], r["solved"]) for r in rows] == [
        (4, 2, 3, 2), (1, 1, 1, 1), (4, 1, 1, 0)]
    four = rows[0]
    assert four["env_steps_median"] == 250_000  # the unsolved run's budget left out
    assert four["env_steps_range"] == [200_000, 300_000]
    assert four["updates_median"] == 6_250
    assert four["env_steps_per_worker"] == 62_500
    assert four["staleness_mean"] == pytest.approx(6.95)  # of every run
    assert rows[2]["env_steps_median"] is rows[2]["env_steps_per_worker"] is None


def test_scale_config_overrides_are_checked_as_the_master_checks_a_config() -> None:
    assert config_overrides('{"max_in_flight": 0}', OWN_FIELDS, OWN_WHY) == {"max_in_flight": 0}
    assert config_overrides("{}", OWN_FIELDS, OWN_WHY) == {}
    for text, says in [
        ("max_in_flight=0", "not JSON"),
        ("[0]", "a JSON object of config fields"),
        ('{"seed": 3}', "seed: set by this script"),
        ('{"hidden_sizes": [8]}', "--model sets hidden_sizes"),
        ('{"max_in_flite": 0}', "did you mean 'max_in_flight'"),
        ('{"max_in_flight": -1}', "max_in_flight: Input should be greater than or equal to 0"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            config_overrides(text, OWN_FIELDS, OWN_WHY)


def test_a_number_option_takes_finite_values_from_its_least() -> None:
    seconds, actors = number(float, 0, more=True), number(int, 1)
    assert seconds("0.5") == 0.5 and actors("1") == 1
    for parse, wrong in ((seconds, "0"), (seconds, "-1"), (seconds, "nan"), (seconds, "inf"),
                         (actors, "0")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(wrong)


def test_learn_takes_a_count_of_seeds_or_the_seeds_themselves() -> None:
    parser = argparse.ArgumentParser(prog="bench.py learn")
    assert seed_list("3", parser) == [0, 1, 2]
    assert seed_list("1,2", parser) == [1, 2] and seed_list("5,", parser) == [5]
    for wrong in ("0", "x", ",", "-1,2"):
        with pytest.raises(SystemExit):
            seed_list(wrong, parser)


def test_an_interrupted_learn_run_keeps_the_runs_it_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Ctrl-C or SIGTERM (the handler raises KeyboardInterrupt) during the third run: the JSON
    holds the two runs before it, the command says so and exits 130, without a traceback."""
    from scripts.benchlib import learn

    finished = {"solved": True, "seconds": 1.0, "env_steps": 1000, "mean_return_100": 500.0}
    calls = iter([finished, finished, KeyboardInterrupt()])

    def run_one(*_: object) -> dict:
        outcome = next(calls)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(learn, "run_one", run_one)
    out = tmp_path / "learn.json"
    assert learn.main(["--tasks", "CartPole-v1", "--seeds", "2", "--json", str(out)]) == 130
    rows = json.loads(out.read_text())["CartPole-v1"]
    assert [(r["learner"], r["seed"]) for r in rows] == [("cluster", 0), ("sb3", 0)]
    assert f"interrupted after 2 finished runs; their figures are in {out}" in (
        capsys.readouterr().out)


@pytest.mark.integration
def test_a_quick_scale_run_writes_a_row_per_number_of_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "scale.json"
    assert bench.main(["scale", "--quick", "--workers", "1,2", "--time-cap", "1", "--config",
                       '{"max_in_flight": 0}', "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "default model (9,155 parameters" in printed and "efficiency" in printed
    figures = json.loads(out.read_text())
    assert figures["meta"]["config"] == {"max_in_flight": 0}
    levels = figures["models"]["default"]["levels"]
    # The override reached the runs: one worker that waits for each reply computes every push
    # on the current weights.
    assert levels[0]["staleness_mean"] == 0
    assert [r["workers"] for r in levels] == [1, 2]
    for r in levels:
        assert r["env_steps"] > 0 and r["updates_per_s"] > 0 and r["window_s"] >= 1.0
        assert r["staleness_mean"] >= 0 and r["master_cpu_cores"] > 0
        assert r["master_ms_per_push"] > 0 and r["workers_cpu_cores"] > 0
        assert r["efficiency_base"] == 1 and r["efficiency"] > 0
        # One seed, capped at 1 s: CartPole-v1 is not solved, and counts at the cap.
        assert [(s["seed"], s["solved"], s["seconds"]) for s in r["solve"]["runs"]] == [
            (0, False, 1.0)]
    assert levels[0]["efficiency"] == 1.0


def _counts(applied: int = 0, rejected: int = 0, taken: int = 0, queued: int = 0) -> dict:
    return {"updates_applied": applied, "updates_rejected": rejected, "rollouts_taken": taken,
            "rollouts_queued": queued}


def test_the_loads_counts_add_up_only_where_every_reply_was_counted_once() -> None:
    level = Level(4, ok=100)
    level.errors.update({"409": 3, "503": 2, "ConnectionResetError": 1})
    before = _counts(applied=7, rejected=1, taken=50, queued=1)
    # Gradients: every 2xx an applied update, every HTTP refusal a rejected one.
    assert mismatches("/gradients", level, before, _counts(applied=107, rejected=6)) == []
    assert mismatches("/gradients", level, before, _counts(applied=106, rejected=6)) == [
        "100 pushes answered 2xx, 99 updates_applied"]
    assert mismatches("/gradients", level, before, _counts(applied=107, rejected=1)) == [
        "5 refusals, 0 updates_rejected"]
    # Experience: every 2xx a rollout the learner took (used or dropped) or holds.
    assert mismatches("/experience", level, before, _counts(taken=150, queued=1)) == []
    assert mismatches("/experience", level, before, _counts(taken=149, queued=2)) == []
    assert mismatches("/experience", level, before, _counts(taken=149, queued=1)) == [
        "100 pushes answered 2xx, 99 rollouts taken or held"]


def test_simulated_actors_push_rollouts_through_a_receiver_and_every_count_adds_up(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "load.json"
    assert bench.main(["load", "--algo", "ppo", "--actors", "8", "--seconds", "1", "--warmup",
                       "0.5", "--receivers", "1", "--json", str(out)]) == 0
    assert "counts: every one adds up" in capsys.readouterr().out
    figures = json.loads(out.read_text())
    assert figures["route"] == "/experience" and figures["5xx"] == 0 and figures["mismatches"] == []
    # The window's own figures (pushes/s, latency) depend on the machine's speed: here only that
    # pushes were answered; a busy 2-core machine may answer none within a 1 s window.
    assert figures["ok"] > 0 and {"pushes_per_s", "p50_ms", "p99_ms"} <= set(figures)
    assert figures["transitions_per_s"] == figures["pushes_per_s"] * figures["env_steps_a_push"]
    assert set(figures["cpu_ms_per_push"]) == {"master", "receivers", "learner"}
    limits = figures["limits"]
    assert limits["copy_ms"] > 0 and limits["step_ms"] > 0 and limits["params"] > 0
    assert limits["reply_bytes"] > 4 * limits["params"]  # float32 weights and their header


def test_one_actor_pushes_once_a_rollout_and_a_core_serves_what_it_takes() -> None:
    config = train_config(num_envs=2, t_max=5)
    rate = actor_rate(config, 0.2)
    # A push a rollout of at most 2 x 5 env steps (fewer where an episode ended in it).
    assert 0 < rate["env_steps_per_s"] <= 10 * rate["pushes_per_s"] * 1.001
    # 0.5 ms a push: 2,000 pushes a second a core; actors of 100 pushes a second: 20 of them.
    assert served_per_core(0.5, 100.0) == 20.0 and served_per_core(None, 100.0) is None
    rows = [{"algo": "a3c", "model": "default", "actors_per_master_core": 20.0,
             "actors_per_learner_core": None},
            {"algo": "apex", "model": "default", "actors_per_master_core": 50.0,
             "actors_per_learner_core": 7.0}]
    assert setups(rows) == [
        {"setup": "Gorila's 100 bundles", "model": "default", "cores": {"master": 5},
         "actor_cores": 100, "hosts": 7},  # 105 cores
        {"setup": "Ape-X's 360 actors", "model": "default", "cores": {"master": 8, "learner": 52},
         "actor_cores": 360, "hosts": 27},  # 420 cores
    ]
    # Through 2 shards, each serving 10 actors a core: 10 cores' worth for each, 20 shard cores.
    sharded = [{**rows[0], "shards": 2, "actors_per_shard_core": 10.0}]
    assert setups(sharded)[0]["cores"] == {"master": 5, "shard": 20}
    assert setups(sharded)[0]["hosts"] == 8  # 125 cores


def test_each_command_of_bench_py_has_its_options_and_an_unknown_one_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/bench.py COMMAND ARGS` is that benchmark; without a command, the bar's sections."""

    options = {"": "--sections", "scale": "--pin", "learn": "--learners", "solve": "--runs",
               "staleness": "--lags", "http": "--n", "push_body": "--workers",
               "tls": "--connects", "ingest": "--pushes", "path": "--algos", "load": "--actors",
               "capacity": "--actor-seconds"}
    assert set(options) == {"", *bench.COMMANDS}
    for command, option in options.items():
        with pytest.raises(SystemExit) as exit_:
            bench.main([command, "--help"] if command else ["--help"])
        assert exit_.value.code == 0
        usage = capsys.readouterr().out
        assert " ".join(["usage: bench.py", *[command][:bool(command)], "[-h]"]) in usage
        assert option in usage
    assert bench.main(["scales"]) == 2
    assert "unknown command 'scales'" in capsys.readouterr().err
