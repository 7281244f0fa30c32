"""Ape-X DQN (seed 004): many epsilon-greedy actors feed one prioritized replay beside the
master; one learner samples it and sends priorities back."""
