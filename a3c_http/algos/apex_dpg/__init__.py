"""Ape-X DPG (Horgan et al. 2018, seed 004): many actors, each with its own exploration noise, feed
one prioritized replay beside the master; one learner trains a deterministic actor, its critic and
their target networks (with twin critics, delayed actor updates and target smoothing: TD3)."""
