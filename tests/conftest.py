"""Shared test helpers: where ../shared lives, and the CI rule for missing real services."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
TRACES = SHARED / "traces"
PROFILES_DATA = SHARED / "profiles"
SCHEMAS = SHARED / "schemas"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# A loaded 2-core CI box can take longer than hypothesis' default 200 ms per example: judge the
# property, not the machine's speed. CI draws the same examples every run (derandomize), so a run's
# verdict is the code's and not the draw's; local runs keep exploring and replay what they found.
settings.register_profile("ci", deadline=None, derandomize=True)
if IN_CI:
    settings.load_profile("ci")


def require(condition: bool, what: str) -> None:
    """Skip locally when a real service or file is missing; in CI (CI=true) fail instead."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI needs {what}, and it is missing", pytrace=False)
    pytest.skip(f"{what} is missing")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    require(SHARED.is_dir(), f"the shared data folder {SHARED}")
    return SHARED
