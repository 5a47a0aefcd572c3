"""The Typer app: one module per group of commands. Parse, compute, render; no math here."""

from .app import app, main

__all__ = ["app", "main"]
