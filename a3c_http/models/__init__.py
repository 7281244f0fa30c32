"""Networks: the encoders (MLP, CNNs), the actor-critic network built from them, and the running
observation and return statistics that several processes build together."""
