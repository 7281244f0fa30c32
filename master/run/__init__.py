"""The run's state apart from the parameters: the ledger (run, statistics, registry) under one lock,
the worker registry and its records, the workers' reports, the original design's counters, and the
run's events."""
