"""Typed reads of string-valued config maps that collect problems instead of raising.

KEDA passes trigger metadata as strings; ``Reader`` turns them into numbers, integers, durations and
URLs, records every ``Problem`` (key, value given, what is allowed) and returns the default, so a
parser can report all problems at once. ``scaler.metadata`` is the one user.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from scaler.limits import Limit

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.\-]+")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ms|s|m|h)?")
MAX_VALUE_CHARS = 1024
"""Longest value a key takes unless ``Reader(limits=...)`` says otherwise: no model name or label is longer,
and a megabyte would go into every PromQL of the group it joins."""
SHOWN_CHARS = 160
"""A problem quotes at most this much of a key or value: the whole message must fit gRPC's 8 KiB
trailing metadata (a longer one reaches KEDA as RESOURCE_EXHAUSTED instead of our error)."""


def shorten(text: str | None, limit: int = SHOWN_CHARS) -> str | None:
    """``text`` itself, or its start and its length when longer than ``limit``."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text)} characters]"


@dataclass(frozen=True)
class Problem:
    """One bad key: its name, the value given (None: missing) and what is allowed."""

    key: str
    value: str | None
    allowed: str

    def __post_init__(self) -> None:  # a 1 MB key or value is kept, and quoted, as its start and its length
        object.__setattr__(self, "key", shorten(self.key))
        object.__setattr__(self, "value", shorten(self.value))

    def __str__(self) -> str:
        given = "missing" if self.value is None else f"got {self.value!r}"
        key = self.key if _PLAIN_KEY.fullmatch(self.key) else repr(self.key)  # an empty or odd key stays visible
        return f"{key}: {given}; allowed: {self.allowed}"


class Reader:
    """Typed reads of one metadata map (strings only) that record problems instead of raising."""

    def __init__(self, raw: Mapping[str, str], limits: Mapping[str, int] | None = None) -> None:
        self.raw = raw
        self.limits = dict(limits or {})
        """Longest value per key, where it differs from ``MAX_VALUE_CHARS``."""
        self.problems: list[Problem] = []

    def problem(self, key: str, value: str | None, allowed: str) -> None:
        self.problems.append(Problem(key, value, allowed))

    def text(self, key: str, required: bool = False) -> str | None:
        """The stripped value; empty counts as unset (blank but non-empty, or missing when required: a problem)."""
        value = self.raw.get(key)
        if value is None or not value.strip():
            if required or value:
                self.problem(key, value, "a non-empty string")
            return None
        limit = self.limits.get(key, MAX_VALUE_CHARS)
        if len(value) > limit:
            self.problem(key, value, f"a string of at most {limit} characters")
            return None
        return value.strip()

    def number(self, key: str, default: Any, limit: Limit | None = None, required: bool = False,
               kind: str = "number", allowed: str = "") -> Any:
        """A finite number of ``kind`` (number, integer, duration) within ``limit``, else ``default`` and a
        problem saying ``allowed`` (by default what ``limit`` admits)."""
        text = self.text(key, required=required)
        if text is None:
            return default
        value = _convert(text, kind)
        limit = limit or Limit(integer=kind == "integer")
        if value is None or not limit.admits(value):
            self.problem(key, text, allowed or limit.text(kind))
            return default
        return value

    def url(self, key: str) -> str | None:
        text = self.text(key)
        if text is not None and not _is_url(text):
            self.problem(key, text, "an http:// or https:// URL with a host and no query")
            return None
        return text.rstrip("/") if text and urlsplit(text).path in ("", "/") else text

    def url_list(self, key: str) -> tuple[str, ...]:
        text = self.text(key)
        items = tuple(item.strip() for item in (text or "").split(",") if item.strip())
        if not all(_is_url(item) for item in items):
            self.problem(key, text, "comma-separated http(s):// URLs of pods' /metrics")
            return ()
        return items


def _is_url(text: str) -> bool:
    try:
        parts = urlsplit(text)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment


def _convert(text: str, kind: str) -> float | int | None:
    if kind == "integer":
        return int(text) if re.fullmatch(r"[+-]?[0-9]{1,12}", text) else None
    if kind == "duration":
        match = _DURATION.fullmatch(text)
        return float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"] if match else None
    try:
        return float(text)
    except ValueError:
        return None
