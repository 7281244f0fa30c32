"""Soft Actor-Critic (Haarnoja et al. 2018): actors sample a squashed Gaussian policy and fill the
replay beside the master; one learner trains twin critics, their Polyak-averaged targets, the
actor and the entropy coefficient."""
