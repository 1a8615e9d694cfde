"""What a restarted scaler's warm-up costs (``scaler.warmup``), against what it replaces, on a real Prometheus.

An hour (plus a rate window) of ``--objects`` models' metrics, two replicas each, is backfilled into a real
Prometheus with ``promtool`` (the Debian ``prometheus`` package). Then, side by side on the same machine:

- **reading the hour**: ``PrometheusSource.history`` (one range query per signal for the whole group)
  against its peer, an instant ``fetch`` at each of the same 241 instants (what a warm-up without range
  queries would send);
- **replaying it**: CPU seconds per object of ``warmup.replay`` over the 241 snapshots, against its peer,
  the CPU a live scaler spent deciding the same object over the same hour (720 rounds of 5 s, each on the
  snapshot of its time; ``--live-objects`` of them, the reads not counted).

    python benchmarks/bench_warmup.py [--objects 32]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.openmetrics import openmetrics, steady_replica  # noqa: E402

from scaler import evaluation, warmup  # noqa: E402
from scaler.metadata import parse_metadata  # noqa: E402
from scaler.sources.prometheus import PrometheusSource  # noqa: E402
from simulator.observe import metrics_of  # noqa: E402

SPAN_S = 3660
SCRAPE_S = 15


def meta(k: int) -> dict[str, str]:
    return {"model": f"model-{k:04d}", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000",
            "maxNumSeqs": "256", "kvCacheTokens": "200000"}


def snapshot(rid: int, t: float) -> dict[str, Any]:
    """Replica ``rid``'s /metrics at ``t``: a load that wobbles around 1.5 requests/s, 2,400-token prompts."""
    done = math.floor(1.5 * t + 40 * math.sin(t / 300 + rid))
    shares = (0.6, 0.25, 0.12, 0.02, 0.01)
    return steady_replica(t, done, [float(math.floor(done * sum(shares[: i + 1]))) for i in range(len(shares))])


def best_of(repeats: int, run: Any) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=32, help="models in the history (one read's worth: 32)")
    parser.add_argument("--live-objects", type=int, default=4, help="objects the live peer decides over the hour")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if shutil.which("promtool") is None:
        raise SystemExit("bench_warmup: promtool not found (apt-get install prometheus)")
    from support.prometheus import PrometheusServer

    replicas = 2
    taken = [(k * replicas + r, float(t), metrics_of(snapshot(r, float(t))))
             for t in range(0, SPAN_S + 1, SCRAPE_S) for k in range(args.objects) for r in range(replicas)]
    with tempfile.TemporaryDirectory(prefix="bench-warmup-") as tmp:
        root = Path(tmp)
        start = (int(time.time()) // 3600 - 4) * 3600
        text = openmetrics(start, taken, [], model=lambda rid: meta(rid // replicas)["model"])
        (root / "samples.om").write_text(text)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "samples.om"),
                        str(root / "data")], check=True, capture_output=True, timeout=600)
        with PrometheusServer(scrape_interval_s=15, data_dir=root / "data", ready_timeout_s=120) as prom:
            configs = [parse_metadata(meta(k)) for k in range(args.objects)]
            targets = [c.target("llm") for c in configs]
            first, last = warmup.window(start + SPAN_S - 0.5, warmup.DEFAULT_SPAN_S)
            instants = [first + k * warmup.SPACING_S for k in range(round((last - first) / warmup.SPACING_S) + 1)]
            source = PrometheusSource(prom.url, timeout_s=30)
            history = source.history(targets, first, last, warmup.SPACING_S)
            range_s = best_of(args.repeats, lambda: source.history(targets, first, last, warmup.SPACING_S))
            instant_s = best_of(1, lambda: [PrometheusSource(prom.url, timeout_s=30, evaluation_time=at).fetch(
                targets, now=at) for at in instants])

            replay_cpu = []
            for config, target in zip(configs, targets, strict=True):
                snapshots = warmup.snapshots_of(history, target, None)
                began = time.process_time()
                done = warmup.replay(warmup.Replay(config, "bench", 60.0), snapshots)
                replay_cpu.append(time.process_time() - began)
                assert done.used >= len(instants) - 5, (done.used, len(instants))

            # the peer: a live scaler's rounds over the same hour, every 5 s on the snapshot of its time
            live_at = [first + 5.0 * k for k in range(round((last - first) / 5.0) + 1)]
            lived = PrometheusSource(prom.url, timeout_s=30).history(targets[:args.live_objects], live_at[0],
                                                                     live_at[-1], 5.0)
            live_cpu = []
            for config, target in zip(configs[:args.live_objects], targets[:args.live_objects], strict=True):
                held, began = evaluation.Held(), time.process_time()
                for at, answers in lived:
                    with contextlib.suppress(evaluation.Skipped):  # a live round skips it too
                        held = evaluation.step(config, held, evaluation.usable(answers[target], 60.0), at,
                                               (None, None), "bench")
                live_cpu.append(time.process_time() - began)

    per_replay, per_live = sum(replay_cpu) / len(replay_cpu), sum(live_cpu) / len(live_cpu)
    print(f"history: {args.objects} objects x {len(instants)} instants (an hour at {warmup.SPACING_S:g} s)")
    print(f"{'':<34} {'ours':>10} {'peer':>10} {'ratio':>7}")
    print(f"{'read the hour (s, wall)':<34} {range_s:>10.3f} {instant_s:>10.3f} {range_s / instant_s:>7.3f}"
          "   range queries vs an instant fetch per instant")
    print(f"{'decide over it (CPU s per object)':<34} {per_replay:>10.3f} {per_live:>10.3f} "
          f"{per_replay / per_live:>7.3f}   replay at 15 s vs living through it at 5 s")
    print(f"a restart with 1,000 objects: about {1000 * per_replay:.0f} s of one core, in the background")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
