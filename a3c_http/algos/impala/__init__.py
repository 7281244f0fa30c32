"""IMPALA: workers ship rollouts of a lagging policy; the learner corrects them with V-trace."""
