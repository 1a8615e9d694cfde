"""Build trigger metadata for tests: a known-good map with some keys changed or removed."""

from __future__ import annotations


def with_changes(base: dict[str, str], changes: dict[str, str | None]) -> dict[str, str]:
    """A copy of ``base`` where each key of ``changes`` is set, or removed when its value is None."""
    out = dict(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out
