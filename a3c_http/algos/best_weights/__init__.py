"""Best weights: each worker trains on its own and pushes its weights; the master keeps the set
that scored best."""
