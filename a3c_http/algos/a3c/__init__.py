"""A3C: workers compute n-step actor-critic gradients and push them to the master's parameter
server, which applies each one as it arrives (seed 003)."""
