"""Which replica gets a request: what the gateway in front of the vLLM pods does.

- ``least-tokens`` (default): fewest outstanding tokens (prompt + output of the requests it holds and
  has not finished), ties to the oldest replica. Like a token-aware gateway (e.g. the Gateway API
  inference extension); it spreads a 30k-token prompt differently from a 100-token one.
- ``round-robin``: in turn, like a plain Kubernetes Service (kube-proxy) under steady load.
- ``random``: uniformly at random from the router's own ``numpy.random.Generator``.
Draining replicas never get new requests (the engine passes only routable ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Protocol

import numpy as np

ROUTERS = ("least-tokens", "round-robin", "random")
_outstanding = attrgetter("outstanding_tokens")


class Routable(Protocol):
    id: int
    outstanding_tokens: int


class Router:
    """Picks one of the routable replicas for each request; deterministic for a seed."""

    def __init__(self, name: str = "least-tokens", rng: np.random.Generator | None = None) -> None:
        if name not in ROUTERS:
            raise ValueError(f"router={name!r}: must be one of {list(ROUTERS)}")
        self.name = name
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._turn = 0

    def pick(self, replicas: Sequence[Routable]) -> Routable:
        """The replica for the next request (``replicas`` non-empty, in id order)."""
        if self.name == "least-tokens":
            return min(replicas, key=_outstanding)  # the first of equals: the oldest
        if self.name == "round-robin":
            self._turn += 1
            return replicas[(self._turn - 1) % len(replicas)]
        return replicas[int(self.rng.integers(len(replicas)))]
