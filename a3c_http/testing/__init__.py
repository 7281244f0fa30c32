"""Running the services as a user does, for the tests, the benchmarks and the quickstart: local
clusters of uvicorn processes, a stand-in worker host and a delaying proxy. The services never
import it."""
