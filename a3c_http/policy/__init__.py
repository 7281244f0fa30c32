"""Using a trained policy: deterministic evaluation of a set of weights, and export to a standalone
file."""
