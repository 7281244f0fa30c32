"""The algorithms' maths, apart from any transport: the A3C loss, per-worker exploration, and the
single-process learner the benchmarks and the learning tests compare with."""
