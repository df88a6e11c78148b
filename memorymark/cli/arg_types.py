"""The command line's value types: what argparse calls to turn one flag's text into a value.

Owns the checks argparse makes before any Settings exist (a whole number, a number, at least 1,
a batch size under the ceiling) and their one-line messages, which never echo a huge input.
Every subcommand's flags (parser, history) share them. Must not know Settings' ranges beyond
these, the engine, or torch.
"""

from __future__ import annotations

import argparse

from memorymark import limits


def whole_number(text: str) -> int:
    """A whole number; Settings checks its range. argparse's own `int` would echo the whole
    text (a 5000-digit one) in its error."""
    try:
        return int(text)
    except ValueError:  # "1e9", "2.5", past Python's 4300-digit limit
        raise argparse.ArgumentTypeError(f"not a whole number: {limits.shown(text)}") from None


def number(text: str) -> float:
    """A number; Settings and Costs refuse nan, inf and values past their ceilings."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {limits.shown(text)}") from None


def positive_whole_number(text: str) -> int:
    """A whole number of at least 1 (a count, an id)."""
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {limits.shown(value)})")
    return value


def batch_size(text: str) -> int:
    """A batch size flag that no Settings field checks (measure's, calibrate's)."""
    value = positive_whole_number(text)
    if value > limits.MAX_BATCH:
        raise argparse.ArgumentTypeError(
            f"must be at most {limits.MAX_BATCH:,} (256x the default largest batch)"
        )
    return value
