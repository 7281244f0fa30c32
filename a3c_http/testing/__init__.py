"""Running the services as a user does, for the tests and the benchmarks: a stand-in worker
host and a delaying proxy (the local clusters themselves: a3c_http/local/cluster.py). The
services never import it."""
