"""Two certificates about a workload: a lower bound on GPU-hours, and whether a causal policy can meet the SLO.

**The lower bound** (``lower_bound``). Notation: windows ``w`` of length ``L_w`` (60 s), SLO ``S``,
``B`` the most late first tokens a run may have and still meet p95 TTFT <= S, ``n0`` the shared warm
fleet (Ready at 0 without a cold start), ``d_1, d_2, ...`` the run's cold-start draws (the k-th pod
created gets ``d_k``), ``m_w(n)`` the *optimistic* miss curve (``oracle_curves``: the window's
arrivals alone on ``n`` replicas empty at its start, prompts stripped of everything a prefix cache
could serve). Claim: every schedule ``sigma`` the simulator can run that meets the SLO costs at least

    LB = max_{mu >= 0} [ min over paths n_w with sum_w m_w(n_w) <= B of
                         ( sum_w L_w n_w + mu * sum_w max(0, n_w - n_{w-1}) ) ]  -  E*(mu),

``n_{-1} = n0``, where ``E[R]`` is the least cold-start GPU time of R pods turning Ready
(``oracle_dp.cold_start_floor``) and ``E*`` its conjugate. Proof sketch: let ``N_w`` be the number of
pods of ``sigma`` that serve (Ready or draining) at some time in ``[start_w, end_w + S)``, the only
time a first token of window w can come and be on time. Then

1. **misses**: window w's late first tokens under ``sigma`` are at least ``m_w(N_w)``: ``sigma``
   serves them with at most ``N_w`` replicas, which also carry earlier windows' work, see later
   windows' arrivals, and have no better prefix cache than the stripped prompts assume. Summing,
   ``sum_w m_w(N_w) <= B``, so ``(N_w)`` is a path of the program.
2. **replica time**: ``sigma`` holds at least ``sum_w L_w N_w`` GPU-seconds of Ready pods (see A4).
3. **cold starts**: each increase of ``N`` needs a pod that was not serving before, and only the
   ``n0`` warm pods serve without a cold start, so at least ``A = sum_w max(0, N_w - N_{w-1})`` pods
   turn Ready and ``sigma`` pays ``>= E[A]`` for their cold starts, on top of 2; and
   ``E[A] >= mu A - E*(mu)`` for every ``mu`` (Fenchel-Young).

So cost(sigma) >= sum_w L_w N_w + mu A - E*(mu) >= the bracket for every ``mu``, hence >= LB. The
program is solved exactly by ``oracle_dp.budget_path`` with misses rounded *down* (which only
enlarges the feasible set); ``mu`` is searched by golden section (the bracket is concave in ``mu``).
No pod beyond ``n0`` serves in window w unless some draw ``d_k < end_w + S`` (``cap``).

Assumptions, and their direction:

- **A1 (monotone simulator)**, not provable, tested: more replicas, less carried-over work, later
  arrivals removed and a better prefix cache never make a first token later. The simulator is
  deterministic but not a closed form; scheduling and routing anomalies are possible in principle.
  The curves are forced monotone (running minimum from below, the lone-request floor above the
  largest fleet simulated), so an anomaly in one simulated point cannot raise the bound.
- **A2 (prefix cache)**: at a window's start no replica's cache holds more than every block carried
  before it (and a request may also hit blocks first carried in the next ``S`` seconds); the optimistic
  replay cuts those leading runs from the prompts and simulates hits inside the window with the
  prefix-aware router (``oracle_curves.strip_cacheable``). Optimistic, given A1.
- **A3 (who counts)**: misses are counted among requests that get a first token, and the schedule
  aborts none (an abort removes a request from the p95). Prompts the engine rejects for length are
  out of every schedule's p95 alike. A schedule that aborts late requests on purpose is not covered.
- **A4 (window alignment)**, not provable in general: step 2 holds exactly for schedules whose
  serving pods change on the 60 s grid; a pod serving only part of a window is credited the whole
  window in 1 but held for less than ``L_w``. Extending every pod to whole windows gives a schedule
  with no more misses that costs at most ``2 L_w`` more per pod, so an unaligned schedule costs at
  least ``LB - 2 L_w x (its pods)``; no simulated policy comes near that (tests compare ``LB`` itself
  to every policy's GPU-hours), and the feasible schedule is aligned.
- **A5 (cancelled pods)**: a pod deleted before it is Ready held its GPU for at least one tick
  (policies change the spec once a tick), which is all ``E`` charges for skipping a draw; with
  ``skip_cost_s=None`` no pod may be cancelled and ``E`` is the plain sum of the first draws.
- Replica time after the last window and drains are not counted (only lowers the bound).

**The causal bound** (``causal_ready_times``, ``causal_misses``): a causal policy cannot provision
for load it has not seen. Definition: a *reasonable causal* policy holds no more pods than the largest
requirement ``n_req(w')`` of the windows begun so far (``n_req``: the smallest fleet on which the
window's warm-started curve shows no avoidable miss), starts pods only when that requirement rises,
and its k-th pod is Ready its draw ``d_k`` after creation. The *envelope* is the most generous such
policy: it learns each window's whole requirement the instant the window begins, creates the
missing pods at once, deletes none, and every window starts with no work carried in (perfect catch-up
between windows: each is judged on its optimistic curve, or replayed alone with the envelope's Ready
times where its fleet changes inside it). Its late first tokens are, by A1, at most those of any
reasonable causal policy; ``causal_min_late_share`` is their share and ``causally_feasible`` says
whether they fit the SLO's budget. Not covered: a policy that holds more than any seen load needed
(a large fixed fleet: causal, and able to meet the SLO at a cost the definition excludes on purpose),
or one that starts and cancels pods to reach shorter draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator.oracle_dp import budget_path, conjugate, golden_max


@dataclass(frozen=True)
class Bound:
    """The bound in GPU-seconds, the ``mu`` that gave it and the path of the program at that ``mu``."""

    gpu_seconds: float
    mu: float
    replicas: np.ndarray
    misses: int


def ready_cap(edges: np.ndarray, draws: np.ndarray, n0: int, slo_ttft_s: float) -> np.ndarray:
    """Per window, the most pods that can serve in it: the warm fleet plus the draws short enough to
    end before the window's last on-time first token."""
    sorted_draws = np.sort(np.asarray(draws, dtype=float))
    return n0 + np.searchsorted(sorted_draws, edges[1:] + slo_ttft_s, side="left")


def lower_bound(table: np.ndarray, lengths: np.ndarray, budget: int, n0: int, floor: np.ndarray, cap: np.ndarray,
                mu_max: float) -> Bound:
    """``LB`` of the module docstring for ``table[w, n]`` = optimistic ``m_w(n)``, ``floor`` = ``E[0..R]``
    (``cold_start_floor``, R at least the most adds any path can make), ``cap`` = ``ready_cap``;
    ``mu`` is searched in [0, ``mu_max``]."""
    width = table.shape[1]
    start = min(n0, width - 1)
    if floor.size < table.shape[0] * (width - 1) + 1:
        raise ValueError(f"oracle bound: floor has {floor.size} entries, needs one per possible add "
                         f"({table.shape[0] * (width - 1) + 1})")

    def value(mu: float) -> float:
        path = budget_path(table, lengths, budget, start, mu, round_up=False, cap=cap)
        return -math.inf if path is None else path.cost - conjugate(floor, mu)

    mu, best = golden_max(value, 0.0, mu_max, evals=22)
    path = budget_path(table, lengths, budget, start, mu, round_up=False, cap=cap)
    if path is None or not math.isfinite(best):
        raise ValueError(f"oracle bound: no fleet path keeps misses within budget={budget} "
                         "(the miss curves were scanned too little)")
    return Bound(max(best, 0.0), mu, path.replicas, path.misses)


def required_fleet(table: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Per window, the smallest fleet whose curve shows no miss above the window's floor."""
    ok = table <= floor[:, None]
    return np.where(ok.any(axis=1), np.argmax(ok, axis=1), table.shape[1] - 1)


def causal_ready_times(required: np.ndarray, edges: np.ndarray, n0: int, draws: np.ndarray) -> np.ndarray:
    """When each pod beyond the warm fleet turns Ready in the causal envelope: at the start of a window
    whose requirement exceeds every earlier one, the difference is created, and the k-th pod created
    is Ready its draw ``d_k`` later (the stream's order, as for every policy)."""
    held, k, ready = n0, 0, []
    for w, need in enumerate(np.asarray(required, dtype=np.int64)):
        for _ in range(int(need) - held):
            ready.append(float(edges[w]) + float(draws[k]))
            k += 1
        held = max(held, int(need))
    return np.array(ready)


def causal_misses(table: np.ndarray, edges: np.ndarray, n0: int, ready: np.ndarray, slo_ttft_s: float,
                  replay: Callable[[int, int, np.ndarray], int]) -> np.ndarray:
    """Late first tokens per window under the envelope, each window from an empty start (``table``:
    the optimistic curves). A window whose fleet changes before its last on-time first token is
    replayed (``replay(w, fleet at its start, Ready times after it, relative)``)."""
    out = np.zeros(table.shape[0], dtype=np.int64)
    for w in range(table.shape[0]):
        a, b = float(edges[w]), float(edges[w + 1]) + slo_ttft_s
        at_start = n0 + int(np.sum(ready <= a))
        inside = ready[(ready > a) & (ready < b)]
        width = table.shape[1] - 1
        out[w] = table[w, min(at_start, width)] if inside.size == 0 else replay(w, at_start, np.sort(inside) - a)
    return out
