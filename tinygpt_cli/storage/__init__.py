"""Files: atomic writes, the cache folder, safetensors and GGUF files and the hub's
snapshots, the rule for files made from a model's weights, and the training text."""
