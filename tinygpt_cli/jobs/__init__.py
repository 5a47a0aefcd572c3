"""The work between a command and its analysis: opening a session (a model and a text), passes
made ahead for --each-line, activation shards over a corpus, where that work runs (this
machine or a Dask cluster, and with how many BLAS threads), the training loop, each analysis's
reading of texts, caches and files and its passes over a corpus (a module named for the
analysis it serves: means.py for analysis/means.py, sae.py, transcoder.py, ...), and the
dictionary files (dictionaries/)."""
