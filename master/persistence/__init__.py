"""From the master's state to its run folder and back: saving, resuming, and the TensorBoard
scalars."""
