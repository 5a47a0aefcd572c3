"""The one table of short options: a letter means the same thing in every command.

Each letter stands for one meaning, spelt by the long options listed (-n is "how many": rows
of a list, or new tokens of `generate`). A command that has one of these long options offers
its letter too, and no command uses a letter that is not here (tests/test_options.py checks
every command against this table).
"""

from __future__ import annotations

SHORT = {
    "-l": ("--layer",),
    "-H": ("--head",),
    "-p": ("--position",),
    "-n": ("--top", "--max-new-tokens"),  # how many
    "-k": ("--top-k",),  # sampling's k likeliest tokens
    "-P": ("--top-p",),
    "-t": ("--temperature",),
    "-s": ("--seed",),
    "-f": ("--file",),
    "-q": ("--quiet",),
    "-h": ("--help",),
}

LETTER = {long: short for short, longs in SHORT.items() for long in longs}
