"""Environments: building gymnasium environments (and what to say when one cannot be built), this
project's own small tasks, and the rollout collector that steps them with batched inference."""
