"""The allowed values of one number, declared once and read three ways: check, sentence, JSON Schema.

The policy validates its fields with it, the metadata parser reads its keys with it, the docs' key table
and the chart's values schema show it: so a range written in one place is the range everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NOUNS = {"number": "a number", "integer": "an integer", "duration": "a duration in seconds (or with unit ms/s/m/h)"}


@dataclass(frozen=True)
class Limit:
    """A closed or open interval of finite numbers (integers only with ``integer``)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False

    def admits(self, value: object) -> bool:
        """``value`` is a finite number (an ``int`` when ``integer``; never a bool) inside the interval."""
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def bounds(self) -> str:
        """The interval alone, e.g. ``> 0 and <= 3600`` (empty when unbounded)."""
        parts = [] if self.low is None else [f"{'>' if self.low_open else '>='} {self.low:g}"]
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return " and ".join(parts)

    def text(self, kind: str = "number") -> str:
        """What is allowed, as an error or the docs say it: ``a number > 0 and <= 3600``."""
        noun = NOUNS["integer" if self.integer else kind]
        bounds = self.bounds()
        return f"{noun} {bounds}" if bounds else noun.replace("a ", "a finite ", 1).replace("an ", "a finite ", 1)

    def json_schema(self) -> dict[str, Any]:
        """The interval as JSON Schema keywords (``minimum``/``exclusiveMinimum``, ...)."""
        schema: dict[str, Any] = {"type": "integer" if self.integer else "number"}
        if self.low is not None:
            schema["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        if self.high is not None:
            schema["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        return schema
