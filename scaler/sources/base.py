"""What a signal source is: a batch adapter from targets to ``Signals`` snapshots.

The service groups every scaled object into ``Target`` values and asks each source once per
evaluation round; a source answers per target with either a ``Signals`` or a ``SourceError``.
A ``SourceError`` means "no trustworthy number" (unreachable, erroring, no series, stale): the
service answers ``UNAVAILABLE`` so KEDA's own fallback applies. Sources never invent zeros.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from scaler.signals import Signals

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED_LABELS = frozenset({"model_name", "__name__"})


@dataclass(frozen=True)
class Target:
    """What to measure for one scaled object; hashable, so sources can batch targets that agree."""

    model: str
    prometheus_address: str | None = None
    """None: the server's ``--prometheus-url``."""
    label_matchers: tuple[tuple[str, str], ...] = ()
    """Extra equality matchers, e.g. ``(("namespace", "llm"),)``; keys are label names."""
    activation_query: str | None = None
    """A PromQL demand signal that exists at zero replicas (e.g. a gateway queue)."""
    rate_window_s: float = 60.0
    """Window of ``rate()`` and of the histogram means, in seconds."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"Target.model={self.model!r}: must be a non-empty string")
        if not (isinstance(self.rate_window_s, (int, float)) and math.isfinite(self.rate_window_s)
                and self.rate_window_s > 0):
            raise ValueError(f"Target.rate_window_s={self.rate_window_s!r}: must be a finite number > 0")
        names = []
        for pair in self.label_matchers:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise ValueError(f"Target.label_matchers item {pair!r}: must be a (name, value) pair of strings")
            if not LABEL_NAME.match(pair[0]) or pair[0] in RESERVED_LABELS:
                raise ValueError(f"Target.label_matchers name {pair[0]!r}: must match [a-zA-Z_][a-zA-Z0-9_]* and "
                                 f"not be one of {sorted(RESERVED_LABELS)}")
            names.append(pair[0])
        if len(set(names)) != len(names):
            raise ValueError(f"Target.label_matchers={self.label_matchers!r}: each label name at most once")


class SourceError(Exception):
    """No trustworthy signal for a target; the service answers UNAVAILABLE rather than guess."""


@runtime_checkable
class SignalSource(Protocol):
    """One method: measure many targets at once (sources batch queries across targets)."""

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        """Return one entry per target: its snapshot, or the reason there is none."""
        ...
