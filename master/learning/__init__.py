"""The global network and what reaches it: the parameter server, the rounds of sync mode, and the
admission checks every push passes (request windows, limits, screening, outliers)."""
