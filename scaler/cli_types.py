"""Typed command-line values, one converter per kind, for every ``leadscale`` command.

argparse calls a flag's ``type`` with the text given; these convert it or raise
``argparse.ArgumentTypeError`` saying the value and what is allowed (the range in ``scaler.limits``
words), so ``serve``, ``simulate``, ``compare``, ``tune``, ``advise`` and ``replay`` refuse a bad flag in
the same words, and an environment variable (``serve``) in the words of its flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from scaler.limits import Limit


def number(limit: Limit, unit: str = "") -> Callable[[str], float]:
    """A finite float within ``limit`` (``unit``, e.g. "seconds", only for the message)."""
    allowed = limit.text() + (f" ({unit})" if unit else "")

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {allowed}") from None
        if not limit.admits(value):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {allowed}")
        return value

    convert.__name__ = "number"  # argparse names the type in its own messages
    return convert


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An integer within ``low``..``high`` (either end open when None)."""
    limit = Limit(low, high, integer=True)

    def convert(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {limit.text()}") from None
        if not limit.admits(value):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {limit.text()}")
        return value

    convert.__name__ = "integer"
    return convert


positive = number(Limit(0.0, low_open=True))
"""A finite number > 0: rates, scales, SLOs."""
seconds = number(Limit(0.0, low_open=True), "seconds")
"""A finite number of seconds > 0: intervals, timeouts."""
fraction = number(Limit(0.0, 1.0, low_open=True))
"""A share in (0, 1]."""
count = integer(1)
"""An integer >= 1: trials, seeds, steps."""
port = integer(0, 65535)
"""A TCP port; 0 lets the system pick one."""


def boolean(text: str) -> bool:
    """true/false, yes/no, on/off, 1/0 (any case)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: must be true or false")


def choice(*allowed: str) -> Callable[[str], str]:
    """One of ``allowed``, matched without regard to case, returned as declared."""

    def convert(text: str) -> str:
        for value in allowed:
            if text.strip().lower() == value.lower():
                return value
        raise argparse.ArgumentTypeError(f"{text!r}: must be one of {', '.join(allowed)}")

    convert.__name__ = "choice"
    return convert


def key_value(example: str, value_required: bool = True) -> Callable[[str], tuple[str, str]]:
    """``NAME=VALUE`` as a stripped pair (a repeatable flag appends them); ``example`` shows the form."""

    def convert(text: str) -> tuple[str, str]:
        name, sep, value = text.partition("=")
        if not sep or not name.strip() or (value_required and not value.strip()):
            raise argparse.ArgumentTypeError(f"{text!r}: must be NAME=VALUE, e.g. {example}")
        return name.strip(), value.strip()

    convert.__name__ = "NAME=VALUE"
    return convert


def comma_separated(value: str | None) -> tuple[str, ...]:
    """A comma-separated flag (``--scrape-targets``) as its entries, blank ones dropped: read once here by both
    evaluator modes."""
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())
