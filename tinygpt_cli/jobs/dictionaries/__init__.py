"""Dictionary files, read into the analyses' types and written from them: tinygpt's own SAEs,
transcoders, tuned lenses and direction files (saes.py, transcoders.py, lens.py,
directions.py), SAELens' folders (saelens.py) and Gemma Scope 2's (gemmascope.py); each
checked (shapes, finite numbers, the weights it was made for) before an analysis sees it."""
