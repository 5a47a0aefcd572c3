"""The Typer app: one module per group of commands. Parse, compute, render; no math here.

`main(argv)` runs one command line in this process (entry.run: the output contract's exit
codes and error line around the app)."""

from .app import app
from .entry import run as main

__all__ = ["app", "main"]
