"""What happens on a clock or beside the requests: housekeeping, evaluation while training, and
starting the workers of a run."""
