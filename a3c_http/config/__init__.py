"""What a run is told: the training config (its field descriptions are the reference), the process
settings read from the environment, config files, per-task presets, the list of workers, and the
hints for names this project does not know."""
