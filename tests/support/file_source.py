"""A signal source read from a JSON file at every fetch: a test steers a scaler in another process.

``{"load": {"llama": 4000.0}, "error": null}``: prompt tokens/s per model (generation a quarter of it);
a model missing from ``load`` or an ``error`` gives a ``SourceError``. The factory is picklable, so it
reaches ``leadscale serve``'s decision process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaler.signals import Signals
from scaler.sources.base import SourceError, Target


def write_load(path: Path, load: dict[str, float], error: str | None = None) -> None:
    """Replace the file whole (a reader never sees half of it)."""
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps({"load": load, "error": error}))
    staged.replace(path)


@dataclass(frozen=True)
class FileSource:
    path: str

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        state = json.loads(Path(self.path).read_text())
        out: dict[Target, Signals | SourceError] = {}
        for t in targets:
            rate = state["load"].get(t.model)
            if state.get("error") or rate is None:
                out[t] = SourceError(state.get("error") or f"no series for {t.model}")
                continue
            out[t] = Signals(at=now, prompt_tokens_per_s=rate, generation_tokens_per_s=rate / 4,
                             requests_waiting=0.0, requests_running=10.0 if rate else 0.0,
                             ready_replicas=1, data_age_s=1.0)
        return out


@dataclass(frozen=True)
class FileSourceFactory:
    """``source_factory`` for an ``Evaluator`` or ``DecisionSettings``: every key reads ``path``."""

    path: str

    def __call__(self, key: Any) -> FileSource:
        return FileSource(self.path)
