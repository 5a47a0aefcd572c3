"""tinygpt: a command-line microscope for a small GPT-2-style language model, in NumPy."""

__version__ = "0.1.0"
