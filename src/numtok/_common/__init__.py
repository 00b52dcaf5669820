"""Rules every layer shares: argument checks, the causal shift, the reduction, the log-sum-exp and
the optional dependencies' messages."""
