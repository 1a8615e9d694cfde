"""Shared test helpers: where ../shared lives, and the CI rule for missing real services."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
TRACES = SHARED / "traces"
PROFILES_DATA = SHARED / "profiles"
SCHEMAS = SHARED / "schemas"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
