"""The work between a command and its analysis: opening a session (a model and a text), passes
made ahead for --each-line, activation shards over a corpus, where that work runs (this
machine or a Dask cluster, and with how many BLAS threads), the training loop, the passes over
a corpus that train or evaluate an analysis (a module named for the analysis it serves:
sae.py, transcoder.py, tuned_lens.py, steer.py), and the dictionary files (dictionaries/)."""
