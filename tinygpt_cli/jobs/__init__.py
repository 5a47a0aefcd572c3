"""The work between a command and its analysis: opening a session (a model and a text),
passes made ahead for --each-line, activation shards over a corpus, where that work runs (this
machine or a Dask cluster, and with how many BLAS threads), the training loop, and each
analysis's reading of texts, caches and files (jobs/means.py for analysis/means.py, ...)."""
