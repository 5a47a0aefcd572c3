"""The console script of installs made before the package's floors (issue 47): their
`tinygpt` script imports main from here. The command line's entry point is cli/entry.py;
pyproject.toml names that one, and a reinstall no longer comes here."""

from .cli.entry import main

__all__ = ["main"]
