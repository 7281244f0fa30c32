"""Asynchronous DQN on a parameter server (seed 000), Gorila-style (seed 001): workers push
n-step double-Q gradients computed against a target network."""
