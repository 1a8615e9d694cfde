"""The event loop: arrivals, a gateway, routing, a ``Fleet`` of replicas, and periodic callbacks.

``simulate(workload, profile, replicas=N)`` runs a fixed fleet. The autoscaling layer builds an
``Engine`` with ``initial_replicas=0`` and drives the fleet through its hooks::

    engine = Engine(workload, profile, EngineConfig(seed=1))
    engine.every(1.0, tick)                 # tick(now) may call the hooks below
    rid = engine.fleet.add_replica(now)     # serving from now; held gateway requests flow to it
    engine.fleet.drain_replica(rid, now)    # gets no new requests, finishes what it holds
    aborted = engine.fleet.remove_replica(rid, now)   # the pod is gone; its requests are aborted
    engine.fleet.metrics(rid, now)          # ReplicaMetrics, vLLM names
    result = engine.run()

Events are ordered by (time, priority, sequence): replica steps ending first (so finishes free room
before anything else looks), then timers, then arrivals. Randomness only from explicit generators
seeded by ``EngineConfig.seed``. With no routable replica, arrivals wait at the gateway (bounded by
``gateway_limit``; beyond it they are rejected, as an overloaded ingress would); requests longer than
``max_model_len`` are rejected at arrival, outputs are capped to fit (vLLM's ``length`` finish).

Overload rejection (``EngineConfig.waiting_tokens_limit``): the gateway answers 429 to a request
when the prompt tokens already waiting in its pool (held at the gateway plus every routable
replica's vLLM queue, preempted requests at their recompute length), with this request's added,
would exceed the limit per routable replica (at least one). Rejected requests never reach a
replica; ``overload_rejected`` in the result's extra counts them apart from other rejections.

Pools (``Engine.add_pool``): several Deployments of one model behind one route, each a ``Fleet`` with
its own replicas and gateway queue; ``Engine.route_by(fn)`` picks each request's pool (``fn(rid,
now)``, e.g. by the route's weights); a request whose pool has no routable replica waits in that
pool's queue. The default is one pool, ``engine.fleet``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from scaler.profiles import PerformanceProfile
from simulator.replica import Replica, ReplicaMetrics
from simulator.results import REJECTED, LatencyHistogram, RequestLog, SimulationResult
from simulator.router import Router
from simulator.workload import Workload

_STEP, _TIMER, _ARRIVAL = 0, 1, 2

__all__ = ["Engine", "EngineConfig", "Fleet", "ReplicaMetrics", "simulate"]


@dataclass(frozen=True)
class EngineConfig:
    """Engine options; validated on construction."""

    router: str = "auto"
    seed: int = 0
    gateway_limit: int = 100_000
    waiting_tokens_limit: float | None = None
    """429 beyond this many waiting prompt tokens per routable replica of a pool (None: no limit)."""
    kv_sample_s: float = 10.0
    horizon_s: float = 86_400.0
    """Stop this long after the last arrival even if requests remain (a fleet that never serves them)."""

    def __post_init__(self) -> None:
        Router(self.router)
        if not (isinstance(self.gateway_limit, int) and self.gateway_limit >= 0):
            raise ValueError(f"gateway_limit={self.gateway_limit!r}: must be an integer >= 0")
        limit = self.waiting_tokens_limit
        if limit is not None and not (isinstance(limit, (int, float)) and not isinstance(limit, bool)
                                      and math.isfinite(limit) and limit > 0):
            raise ValueError(f"waiting_tokens_limit={limit!r}: must be None or a finite number of tokens > 0")
        for name in ("kv_sample_s", "horizon_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0 seconds")


class Fleet:
    """The replicas of one pool (one Deployment) of the model; the hooks the autoscaling layer calls.

    Replica ids are unique across the engine's pools, so ``metrics``/``in_flight`` take any id.
    """

    def __init__(self, engine: Engine, name: str = "default") -> None:
        self._engine = engine
        self.name = name
        self.replicas: dict[int, Replica] = {}
        self.routable: list[Replica] = []
        self.gateway: deque[int] = deque()
        """Requests of this pool held at the gateway (no routable replica yet, or queued behind those)."""
        self.gateway_tokens = 0
        self.retired_gpu_seconds = 0.0
        self.retired_prefix = [0, 0]  # prefix-cache query and hit tokens of removed replicas

    def add_replica(self, now: float) -> int:
        """A new replica serving from ``now``; requests held at the gateway go to the pool at once."""
        e = self._engine
        rid = e._new_replica_id()
        rep = Replica(rid, e.profile, e.log, e.itl, now, e.prefix)
        self.replicas[rid] = e.replicas[rid] = rep
        self.routable.append(rep)
        e.flush_gateway(now, self)
        return rid

    def waiting_tokens(self) -> int:
        """Prompt tokens waiting in this pool: at the gateway and in every routable replica's queue."""
        return self.gateway_tokens + sum(r.waiting_tokens for r in self.routable)

    def drain_replica(self, rid: int, now: float) -> None:
        """Stop routing to ``rid``; it keeps serving what it holds."""
        rep = self._get(rid)
        rep.draining = True
        self.routable = [r for r in self.routable if r.id != rid]

    def remove_replica(self, rid: int, now: float) -> int:
        """Delete ``rid`` now: its running and waiting requests are aborted; returns how many."""
        rep = self._get(rid)
        aborted = rep.abort_all(now)
        rep.version += 1  # its pending step event is stale
        self.routable = [r for r in self.routable if r.id != rid]
        del self.replicas[rid], self._engine.replicas[rid]
        self.retired_gpu_seconds += (now - rep.added_s) * rep.profile.tensor_parallel
        if rep.prefix is not None:
            self.retired_prefix[0] += rep.prefix.query_tokens
            self.retired_prefix[1] += rep.prefix.hit_tokens
        return len(aborted)

    def metrics(self, rid: int, now: float) -> ReplicaMetrics:
        return self._engine.replica(rid).metrics(now)

    def in_flight(self, rid: int) -> int:
        rep = self._engine.replica(rid)
        return rep.n + len(rep.waiting)

    def gpu_seconds(self, now: float) -> float:
        """GPU time of every replica so far (tensor-parallel replicas count each GPU)."""
        live = sum((now - r.added_s) * r.profile.tensor_parallel for r in self.replicas.values())
        return self.retired_gpu_seconds + live

    def prefix_tokens(self) -> tuple[int, int]:
        """Prefix-cache (query, hit) tokens of this pool's replicas, removed ones included."""
        queries, hits = self.retired_prefix
        for r in self.replicas.values():
            if r.prefix is not None:
                queries, hits = queries + r.prefix.query_tokens, hits + r.prefix.hit_tokens
        return queries, hits

    def prefix_hit_rate(self) -> float | None:
        """Share of prompt tokens served from the prefix cache (None without prefix data)."""
        queries, hits = self.prefix_tokens()
        return hits / queries if queries else None

    def _get(self, rid: int) -> Replica:
        try:
            return self.replicas[rid]
        except KeyError:
            raise KeyError(f"replica {rid!r} is not in the fleet (live: {sorted(self.replicas)})") from None


class Engine:
    """One simulation; ``run()`` once. See the module docstring for the hooks."""

    def __init__(self, workload: Workload, profile: PerformanceProfile, config: EngineConfig | None = None,
                 initial_replicas: int = 0) -> None:
        self.config = config or EngineConfig()
        self.profile = profile
        self.workload = workload
        inp = workload.input_tokens
        out = np.minimum(workload.output_tokens, np.maximum(profile.max_model_len - inp, 1))
        self.log = RequestLog(workload.arrival_s, inp, out)
        self._too_long = set(np.flatnonzero(inp >= profile.max_model_len).tolist())
        self.itl = LatencyHistogram()
        ids, offsets = workload.block_ids, workload.block_offsets  # both or neither (Workload checks)
        self.prefix = (ids, offsets, workload.block_tokens) if ids is not None and offsets is not None else None
        self.router = Router(self.config.router, np.random.default_rng([self.config.seed, 1]),
                             prefix=self.prefix[:2] if self.prefix is not None else None,
                             prompt_tokens=inp)
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._timers: list[Callable[[float], None]] = []
        self._next_arrival = 0
        self._unresolved = len(workload)
        self._kv: list[tuple[float, float, float, int]] = []
        self._ran = False
        self.replicas: dict[int, Replica] = {}
        """Every pool's replicas by id (step events find their replica here)."""
        self._next_id = 0
        self.overload_rejected = 0
        self.fleet = Fleet(self)
        self.pools: dict[str, Fleet] = {self.fleet.name: self.fleet}
        self._split: Callable[[int, float], Fleet] | None = None
        for _ in range(initial_replicas):
            self.fleet.add_replica(0.0)
        self.every(self.config.kv_sample_s, self._sample_kv)

    # ----- hooks ------------------------------------------------------------------------------------
    def every(self, period_s: float, fn: Callable[[float], None], start: float | None = None) -> None:
        """Call ``fn(now)`` every ``period_s`` from ``start`` (default: now) while the run lasts."""
        if not period_s > 0:
            raise ValueError(f"every(period_s={period_s!r}): must be > 0 seconds")
        idx = len(self._timers)

        def tick(now: float) -> None:
            fn(now)
            self._push(now + period_s, _TIMER, idx, 0)

        self._timers.append(tick)
        self._push(self.now if start is None else start, _TIMER, idx, 0)

    def at(self, t: float, fn: Callable[[float], None]) -> None:
        """Call ``fn(t)`` once at time ``t`` (e.g. a pod becoming ready)."""
        self._timers.append(fn)
        self._push(t, _TIMER, len(self._timers) - 1, 0)

    def add_pool(self, name: str) -> Fleet:
        """A second (third...) Deployment behind the same route; ``route_by`` decides who gets what."""
        if not name or name in self.pools:
            raise ValueError(f"add_pool(name={name!r}): must be a new, non-empty name (have {sorted(self.pools)})")
        self.pools[name] = Fleet(self, name)
        return self.pools[name]

    def route_by(self, split: Callable[[int, float], Fleet]) -> None:
        """Each arriving request goes to the pool ``split(rid, now)`` returns (default: ``self.fleet``)."""
        self._split = split

    def replica(self, rid: int) -> Replica:
        try:
            return self.replicas[rid]
        except KeyError:
            raise KeyError(f"replica {rid!r} is not in the fleet (live: {sorted(self.replicas)})") from None

    def _new_replica_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    @property
    def gateway(self) -> deque[int]:
        """The default pool's gateway queue."""
        return self.fleet.gateway

    @property
    def gateway_waiting(self) -> int:
        return sum(len(f.gateway) for f in self.pools.values())

    # ----- loop -------------------------------------------------------------------------------------
    def _push(self, t: float, prio: int, a: int, b: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, prio, self._seq, a, b))

    def _schedule_replica(self, rep: Replica, t: float | None) -> None:
        if t is not None:
            rep.version += 1
            self._push(t, _STEP, rep.id, rep.version)

    def flush_gateway(self, now: float, fleet: Fleet | None = None) -> None:
        fleet = fleet or self.fleet
        while fleet.gateway and fleet.routable:
            rid = fleet.gateway.popleft()
            fleet.gateway_tokens -= self.log.input_l[rid]
            self._route(rid, now, fleet)

    def _route(self, rid: int, now: float, fleet: Fleet) -> None:
        rep = self.router.pick(fleet.routable, rid, now)
        self._schedule_replica(rep, rep.enqueue(rid, now))

    def _arrive(self, rid: int, now: float, fleet: Fleet) -> None:
        log = self.log
        if self._too_long and rid in self._too_long:
            log.status[rid] = REJECTED
            return
        limit = self.config.waiting_tokens_limit
        if limit is not None and fleet.waiting_tokens() + log.input_l[rid] > limit * max(1, len(fleet.routable)):
            log.status[rid] = REJECTED  # 429: the queue is at its limit
            self.overload_rejected += 1
        elif fleet.routable and not fleet.gateway:
            self._route(rid, now, fleet)
        elif len(fleet.gateway) < self.config.gateway_limit:
            fleet.gateway.append(rid)
            fleet.gateway_tokens += log.input_l[rid]
        else:
            log.status[rid] = REJECTED

    def _sample_kv(self, now: float) -> None:
        reps = list(self.replicas.values())
        if reps:
            usage = [r.metrics(now).kv_cache_usage_perc for r in reps]
            self._kv.append((now, float(np.mean(usage)), float(np.max(usage)), len(reps)))

    def run(self, until: float | None = None, progress: Callable[[int], None] | None = None) -> SimulationResult:
        """Run to the end (every request resolved, or ``until``); returns the result. Once per engine."""
        if self._ran:
            raise RuntimeError("Engine.run() was already called: build a new Engine for another run")
        self._ran = True
        started = time.perf_counter()
        n_req = len(self.workload)
        arrivals = [*self.workload.arrival_s.tolist(), float("inf")]  # Python floats: cheap compares
        last_arrival = arrivals[n_req - 1] if n_req else 0.0
        stop = until if until is not None else last_arrival + self.config.horizon_s
        heap, replicas, timers, default = self._heap, self.replicas, self._timers, self.fleet
        pick, too_long, split = self.router.pick, self._too_long, self._split
        plain = self.config.waiting_tokens_limit is None  # no limit to check: the inlined common case
        nxt = 0
        events = 0
        last = 0.0
        while True:
            t_arr = arrivals[nxt]
            if heap and (heap[0][0] < t_arr or (heap[0][0] == t_arr and heap[0][1] < _ARRIVAL)):
                t, prio, _, a, b = heapq.heappop(heap)
                if t > stop:
                    self.now = stop
                    break
                self.now = t
                if prio == _STEP:
                    rep = replicas.get(a)
                    if rep is None or rep.version != b:
                        continue
                    last = t
                    t_next = rep.on_event(t)
                    if t_next is not None:
                        rep.version += 1
                        self._seq += 1
                        heapq.heappush(heap, (t_next, _STEP, self._seq, a, rep.version))
                else:
                    timers[a](t)
                    if nxt >= n_req and not self._busy():
                        break
            elif nxt < n_req:
                if t_arr > stop:
                    self.now = stop
                    break
                self.now = last = t_arr
                fleet = default if split is None else split(nxt, t_arr)
                if plain and fleet.routable and not fleet.gateway and nxt not in too_long:  # the common case
                    rep = pick(fleet.routable, nxt, t_arr)
                    t_next = rep.enqueue(nxt, t_arr)
                    if t_next is not None:
                        rep.version += 1
                        self._seq += 1
                        heapq.heappush(heap, (t_next, _STEP, self._seq, rep.id, rep.version))
                else:
                    self._arrive(nxt, t_arr, fleet)
                nxt += 1
            else:
                break
            events += 1
            if progress is not None and events % 4096 == 0:
                progress(nxt)
        self._next_arrival = nxt
        if progress is not None:
            progress(nxt)
        end = last if until is None else self.now
        return SimulationResult(
            log=self.log, itl=self.itl, end_s=end, gpu_seconds=sum(f.gpu_seconds(end) for f in self.pools.values()),
            wall_seconds=time.perf_counter() - started, kv_usage=np.array(self._kv, dtype=np.float64).reshape(-1, 4),
            preemptions=int(self.log.preemptions.sum()), profile=self.profile.name,
            extra={"prefix_cache_hit_rate": self._prefix_hit_rate(), "overload_rejected": self.overload_rejected})

    def _prefix_hit_rate(self) -> float | None:
        """Share of prompt tokens served from the prefix cache over every pool (None without prefix data)."""
        tokens = [f.prefix_tokens() for f in self.pools.values()]
        queries, hits = sum(q for q, _ in tokens), sum(h for _, h in tokens)
        return hits / queries if queries else None

    def _busy(self) -> bool:
        """Anything left to do once arrivals are over: a replica stepping or requests held."""
        if self.gateway_waiting and len(self._timers) > 1:
            return True
        return any(not r.idle for r in self.replicas.values())


ENGINES = ("auto", "compiled", "python")


def simulate(workload: Workload, profile: PerformanceProfile, replicas: int = 1, router: str = "auto",
             seed: int = 0, progress: Callable[[int], None] | None = None,
             waiting_tokens_limit: float | None = None, engine: str = "auto") -> SimulationResult:
    """A fixed fleet of ``replicas`` serving ``workload`` from time 0; pure for a given seed.

    ``engine``: ``python`` runs this module's ``Engine`` (the reference); ``compiled`` the same model
    compiled (``simulator.fast_engine``: least-tokens or round-robin routing, no prefix blocks); ``auto``
    (default) the compiled one where it applies and numba imports, else the reference. Results are
    bit-identical either way.
    """
    if not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas={replicas!r}: must be an integer >= 1")
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: must be one of {list(ENGINES)}")
    config = EngineConfig(router=router, seed=seed, waiting_tokens_limit=waiting_tokens_limit)
    if engine != "python":
        fast = _compiled(workload, router, required=engine == "compiled")
        if fast is not None:
            return fast(workload, profile, replicas, router=router, progress=progress,
                        waiting_tokens_limit=waiting_tokens_limit, kv_sample_s=config.kv_sample_s,
                        horizon_s=config.horizon_s)
    return Engine(workload, profile, config, initial_replicas=replicas).run(progress=progress)


def _compiled(workload: Workload, router: str, required: bool) -> Callable[..., SimulationResult] | None:
    """``fast_engine.simulate_fixed`` when it can run this simulation (None: use ``Engine``)."""
    try:
        from simulator import fast_engine
    except ImportError as exc:  # numba missing or broken: the reference engine still runs
        if required:
            raise ValueError(f"engine='compiled': numba is not importable ({exc}); pip install numba") from None
        return None
    if fast_engine.supports(workload, router):
        return fast_engine.simulate_fixed
    if required:
        raise ValueError(f"engine='compiled': router={router!r}"
                         f"{' on a workload with prefix blocks' if workload.block_ids is not None else ''} is not "
                         f"compiled (allowed: routers {list(fast_engine.FAST_ROUTERS)}, no prefix blocks)")
    return None
