"""Running the services as a user does, for the tests, the benchmarks, the quickstart and the
Python API (a3c_http.train's local clusters): local clusters of uvicorn processes, a stand-in
worker host and a delaying proxy. The services never import it."""
