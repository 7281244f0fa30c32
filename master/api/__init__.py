"""The master's HTTP API: one router per concern, the request schemas, the shared dependencies, the
metrics, the run's history and the dashboard page."""
