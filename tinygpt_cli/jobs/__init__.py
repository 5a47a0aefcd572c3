"""The work between a command and its analysis: opening a session (a model and a text), passes
made ahead for --each-line, activation shards over a corpus, where that work runs (this
machine or a Dask cluster, and with how many BLAS threads), the training loop, each analysis's
own work (a module named for the analysis it serves: texts, stories and windows read, caches,
sessions, files; sae.py, transcoder.py, tuned_lens.py and steer.py's passes that train or
evaluate it), and the dictionary files (dictionaries/)."""
