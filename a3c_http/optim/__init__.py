"""Optimisers: the flat parameter vector the master's global network lives in, and the optimizer
that steps it."""
