"""From the master's state to its run folder and back: saving, resuming, and the run's scalars
(computed once in `scalars.py`, written to TensorBoard and to Weights & Biases)."""
