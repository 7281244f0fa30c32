"""The benchmarks' library, behind the one command `scripts/bench.py` (its docstring lists the
commands). Each module holds one concern and names what the others use without a leading
underscore:

- report: printing (progress lines, tables, number formats), the checkout's commit, ROOT;
- procs: signals that end a benchmark cleanly, and where its processes run (cores, taskset);
- options: the command-line values the benchmarks share (--config overrides, lists of counts);
- cluster: local clusters and their env steps/s (the bar's `throughput` and `latency`);
- load: simulated workers pushing ready-made gradients to a real master;
- server: the parameter server alone (the bar's `master` and `wire`);
- solve: runs to CartPole-v1's target on a fresh cluster (command `solve`);
- learn: the learning references, SB3 with the RL Zoo's settings (command `learn`);
- bar: every figure of the performance bar (the command without a subcommand);
- scale, staleness, exchanges: the commands `scale`, `staleness` and `http`.
"""
