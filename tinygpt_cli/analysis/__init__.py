"""Analyses built on the trace: each a pure function of the model's arrays."""
