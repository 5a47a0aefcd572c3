"""The model and its math: the config and its architecture knobs, the block's wiring, the
forward and backward ops, hooks and the trace, the one schema of names, each family's
converter, the tokenizer, sampling and generation, the optimizer. No terminal and no command
here."""
