"""How counts are said in messages and views: "1 token", "4,096 tokens" (never "1 tokens" or
"text(s)"). Neither math nor terminal: analyses' errors and renderers both use it."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 token', '6 tokens', '4,096 tokens'; `plural` where adding an s is wrong."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def held(n: int, share: float) -> str:
    """probs' closing line: 'these 8 hold 70.9% of the chance', 'this one holds 24.5% ...'."""
    who = "this one holds" if n == 1 else f"these {n:,} hold"
    return f"{who} {share:.1%} of the chance"
