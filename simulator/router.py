"""Which replica gets a request: what the gateway in front of the vLLM pods does.

- ``auto`` (default): ``prefix`` when the workload names prefix blocks (e.g. Mooncake's ``hash_ids``),
  else ``least-tokens``.
- ``least-tokens``: fewest tokens held as a gateway sees them, ties to the oldest replica: the prompt
  tokens of the requests it routed there and that have not finished, plus the output tokens streamed
  back so far. The gateway cannot know a request's output length before it is generated, so its own
  true output never counts before its tokens exist. This is the rule of NVIDIA Dynamo's KV router
  ("active blocks": added with the prompt when a request is routed, updated as tokens are generated,
  dropped when it completes), the token-counting gateway whose rule is documented; it spreads a
  30k-token prompt differently from a 100-token one. Replicas keep the count as ``outstanding_tokens``
  (prompt at enqueue, each sampled token, both dropped at the finish) and report it with the steps of a
  lazily applied decode run added (``gateway_tokens(now)``); the compiled engine
  (``fast_replica.gateway_tokens``) keeps the same count, so both route alike.
- ``prefix``: prefix-cache-aware, as deployments serving prefix-heavy traffic route: llm-d's inference
  scheduler (prefix-cache scorer weighed against load scorers), vLLM production-stack's prefix-aware
  router, SGLang's cache-aware router, Mooncake's Conductor (FAST'25: picks the instance with the lowest
  estimated TTFT given its cached prefix and its queue). Rule: the replica with the lowest
  ``gateway_tokens + PREFILL_WEIGHT * (prompt - cached prefix tokens there)`` (the same gateway-visible
  count as ``least-tokens``), i.e. the work it would hold after taking the request, with the prefix it
  already has for free; ties to the oldest. A replica holding a long prefix wins until its backlog
  exceeds the prefill it saves, so one replica is not overloaded. ``PREFILL_WEIGHT = 4``: a prompt token
  still to prefill weighs more than an outstanding token (mostly batched decode); on Mooncake x3 with 8
  replicas weights 1/2/4/16/64 gave hit rates 17/21/25/26/27 % and P95 TTFT 5.7/4.3/3.5/3.5/3.4 s
  (measured when the outstanding term still counted true output lengths), so 4 takes most of the gain
  with the least concentration (docs/simulator.md).
  The cached prefix is read from each replica's prefix cache (an exact index; llm-d and production-stack
  keep an approximate one fed by KV events or by their own routing history).
- ``round-robin``: in turn, like a plain Kubernetes Service (kube-proxy) under steady load.
- ``random``: uniformly at random from the router's own ``numpy.random.Generator``.
Draining replicas never get new requests (the engine passes only routable ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

PREFILL_WEIGHT = 4.0
ROUTERS = ("auto", "least-tokens", "prefix", "round-robin", "random")


class Routable(Protocol):
    id: int

    def gateway_tokens(self, now: float) -> int:
        """Prompt + streamed output tokens of the requests held and not finished, at ``now``."""


_R = TypeVar("_R", bound=Routable)


class Router:
    """Picks one of the routable replicas for each request; deterministic for a seed.

    ``prefix`` (the workload's ``(block_ids, block_offsets)`` and prompt lengths) lets ``prefix`` and
    ``auto`` see each request's blocks; without it both behave as ``least-tokens``.
    """

    def __init__(self, name: str = "auto", rng: np.random.Generator | None = None,
                 prefix: tuple[np.ndarray, np.ndarray] | None = None, prompt_tokens: np.ndarray | None = None) -> None:
        if name not in ROUTERS:
            raise ValueError(f"router={name!r}: must be one of {list(ROUTERS)}")
        self.requested = name
        self.name = name
        if name in ("auto", "prefix"):
            self.name = "prefix" if prefix is not None and prompt_tokens is not None else "least-tokens"
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._turn = 0
        self._blocks: np.ndarray | None
        self._offsets: np.ndarray | None
        self._blocks, self._offsets = prefix if prefix is not None else (None, None)
        self._prompt = prompt_tokens.tolist() if prompt_tokens is not None else []

    def pick(self, replicas: Sequence[_R], rid: int = -1, now: float = 0.0) -> _R:
        """The replica for request ``rid`` arriving at ``now`` (``replicas`` non-empty, in id order)."""
        if self.name == "least-tokens" or (self.name == "prefix" and (rid < 0 or len(replicas) == 1)):
            if len(replicas) == 1:
                return replicas[0]
            return min(replicas, key=lambda rep: rep.gateway_tokens(now))  # the first of equals: the oldest
        if self.name == "prefix":
            return self._pick_prefix(replicas, rid, now)
        if self.name == "round-robin":
            self._turn += 1
            return replicas[(self._turn - 1) % len(replicas)]
        return replicas[int(self.rng.integers(len(replicas)))]

    def _pick_prefix(self, replicas: Sequence[_R], rid: int, now: float) -> _R:
        assert self._blocks is not None and self._offsets is not None
        blocks = self._blocks[self._offsets[rid]: self._offsets[rid + 1]]
        prompt = self._prompt[rid]
        best, best_cost = replicas[0], None
        for rep in replicas:
            cache: Any = getattr(rep, "prefix", None)
            cached = cache.lookup(blocks, prompt, touch=False) if cache is not None and blocks.size else 0
            cost = rep.gateway_tokens(now) + PREFILL_WEIGHT * (prompt - cached)
            if best_cost is None or cost < best_cost:
                best, best_cost = rep, cost
        return best
