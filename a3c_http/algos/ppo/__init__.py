"""PPO: workers fill a queue with rollouts that one learner takes in clipped-surrogate epochs
(seed 002)."""
