"""The services on this host: the process harness that starts and ends the master and workers
of a local cluster, for `a3c-train`, `a3c_http.train`, the quickstart, the benchmarks and the
tests (`cluster.py`)."""
