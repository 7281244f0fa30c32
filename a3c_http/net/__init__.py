"""Calls to another service: the master's client, requests with timeouts and bounded retries, the
outbound httpx transport, and the worker's push process."""
