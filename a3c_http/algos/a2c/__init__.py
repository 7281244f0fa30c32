"""Synchronous A2C: the master waits for one gradient from every worker, averages them and
applies one step."""
