"""Pod lifecycle on a fake Fleet: phases, deletion order, drain grace and explicit GPU accounting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cluster import Cluster, Phase
from simulator.coldstart import parse_cold_start


class FakeFleet:
    """Records the hooks the cluster calls; ``busy[rid]`` requests are in flight on a replica."""

    def __init__(self) -> None:
        self.next_id = 0
        self.busy: dict[int, int] = {}
        self.calls: list[tuple[str, int, float]] = []

    def add_replica(self, now: float) -> int:
        rid, self.next_id = self.next_id, self.next_id + 1
        self.busy[rid] = 0
        self.calls.append(("add", rid, now))
        return rid

    def drain_replica(self, replica_id: int, now: float) -> None:
        self.calls.append(("drain", replica_id, now))

    def remove_replica(self, replica_id: int, now: float) -> int:
        self.calls.append(("remove", replica_id, now))
        return self.busy.pop(replica_id)


def make(spec: str = "fixed:100", grace: float = 30.0) -> tuple[Cluster, FakeFleet]:
    fleet = FakeFleet()
    cluster = Cluster(fleet, parse_cold_start(spec, pending_fraction=0.4), np.random.default_rng(0),
                      is_idle=lambda rid: fleet.busy.get(rid, 0) == 0, drain_grace_s=grace)
    return cluster, fleet


def run_to(cluster: Cluster, start: int, end: int) -> None:
    for t in range(start, end + 1):
        cluster.advance(float(t))


def test_pending_loading_ready_at_the_cold_start_times() -> None:
    cluster, fleet = make()
    cluster.set_replicas(0.0, 2)
    assert cluster.counts(0.0).pending == 2
    run_to(cluster, 1, 39)
    assert cluster.counts(39.0).pending == 2
    cluster.advance(40.0)
    assert cluster.counts(40.0).loading == 2
    run_to(cluster, 41, 100)
    assert cluster.counts(100.0).ready == 2
    assert [c[0] for c in fleet.calls] == ["add", "add"] and fleet.calls[0][2] == 100.0
    assert cluster.next_event() is None


def test_gpu_time_counts_from_pending_until_gone() -> None:
    cluster, fleet = make()
    cluster.set_replicas(0.0, 1)
    run_to(cluster, 1, 100)
    fleet.busy[0] = 0
    cluster.set_replicas(250.0, 0)  # idle: gone at once
    assert cluster.pods[0].phase is Phase.GONE
    assert cluster.gpu_seconds(1000.0) == pytest.approx(250.0)  # 100 s cold start + 150 s ready


def test_draining_replica_finishes_in_flight_work_or_is_aborted_at_grace() -> None:
    cluster, fleet = make(grace=30.0)
    cluster.set_replicas(0.0, 2)
    run_to(cluster, 1, 100)
    fleet.busy.update({0: 3, 1: 2})
    cluster.set_replicas(200.0, 0)
    assert cluster.counts(200.0).draining == 2
    fleet.busy[1] = 0  # replica 1 finishes its requests at 210 s
    run_to(cluster, 201, 229)
    assert cluster.pods[1].phase is Phase.GONE and cluster.pods[1].gone_at == 201.0
    assert cluster.pods[0].phase is Phase.DRAINING
    cluster.advance(230.0)
    assert cluster.pods[0].phase is Phase.GONE and cluster.aborted == 3
    assert cluster.gpu_seconds(500.0) == pytest.approx(230.0 + 201.0)


def test_scale_down_deletes_starting_pods_first_then_newest_ready() -> None:
    cluster, _ = make("uniform:50,150")
    cluster.set_replicas(0.0, 3)
    run_to(cluster, 1, 150)
    assert cluster.counts(150.0).ready == 3
    newest_ready = max(cluster.pods, key=lambda p: p.ready_at or 0)
    cluster.set_replicas(151.0, 5)  # two new pods Pending
    cluster.set_replicas(152.0, 2)  # removes both Pending pods and the most recently ready one
    phases = [p.phase for p in cluster.pods]
    assert phases[3:] == [Phase.GONE, Phase.GONE]
    assert newest_ready.phase is not Phase.READY
    assert cluster.counts(152.0).ready == 2
    assert cluster.scale_events == 3


def test_oracle_pods_take_the_given_cold_start() -> None:
    cluster, _ = make("lognormal:p50=120,p90=240")
    pod = cluster.create_pod(10.0, cold_start_s=50.0)
    assert pod.due_ready_at == 60.0 and pod.pending_s == pytest.approx(20.0)


def test_timeline_records_changes_only() -> None:
    cluster, _ = make()
    cluster.set_replicas(0.0, 1)
    run_to(cluster, 1, 120)
    assert [(c.at, c.pending, c.loading, c.ready) for c in cluster.timeline] == [
        (0.0, 1, 0, 0), (40.0, 0, 1, 0), (100.0, 0, 0, 1)]


def test_bad_arguments_are_named() -> None:
    cluster, _ = make()
    with pytest.raises(ValueError, match="replicas=-1"):
        cluster.set_replicas(0.0, -1)
    with pytest.raises(ValueError, match="drain_grace_s=-1"):
        make(grace=-1)


def test_same_seed_same_cold_starts() -> None:
    a, _ = make("lognormal:p50=120,p90=240")
    b, _ = make("lognormal:p50=120,p90=240")
    a.set_replicas(0.0, 4)
    b.set_replicas(0.0, 4)
    assert [p.due_ready_at for p in a.pods] == [p.due_ready_at for p in b.pods]


def test_warm_start_is_ready_at_once_without_a_scale_event() -> None:
    cluster, _ = make()
    cluster.warm_start(0.0, 3)
    assert cluster.counts(0.0).ready == 3 and cluster.spec_replicas == 3 and cluster.scale_events == 0
    assert cluster.gpu_seconds(60.0) == pytest.approx(180.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6), st.booleans()), min_size=1, max_size=25))
def test_gpu_seconds_equal_the_integral_of_pods_holding_gpus(ops: list[tuple[int, int, bool]]) -> None:
    """Explicit accounting: the per-pod sum equals the area under the timeline of pods holding GPUs."""
    cluster, fleet = make("uniform:5,30", grace=10.0)
    now = 0.0
    for wait, replicas, busy in ops:
        for _ in range(wait):
            now += 1.0
            cluster.advance(now)
        for rid in list(fleet.busy):
            fleet.busy[rid] = 2 if busy else 0
        cluster.set_replicas(now, replicas)
        assert len(cluster.live()) == replicas == cluster.spec_replicas
    end = now + 1.0
    area = 0.0
    for this, following in zip(cluster.timeline, [*cluster.timeline[1:], None], strict=True):
        until = following.at if following is not None else end
        area += this.holding_gpus * (until - this.at)
    assert cluster.gpu_seconds(end) == pytest.approx(area)
    assert cluster.aborted == sum(p.aborted for p in cluster.pods)
