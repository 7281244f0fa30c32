"""The global network and what reaches it: the parameter server, the rounds of sync mode, and what
a push must pass to be admitted (admission.py: request numbers, report limits, tensors, staleness,
outliers)."""
