"""Per-request records of a replay, their CSV file, and a summary with the simulator's keys.

Times are seconds since the replay started (``t0``, a monotonic clock). ``scheduled_s`` is when the
trace said to send, ``sent_s`` when the request actually left (later if the concurrency guard held
it), ``first_token_s`` when the first generated token arrived, ``finish_s`` when the stream ended.
Token counts are the server's (``usage`` of the last streamed chunk); the trace's are kept beside them.

The summary uses the same key names as ``simulator.results`` (``requests``, ``completed``,
``ttft_p50`` ... ``wall_seconds``) so a replay and a simulation compare key by key; keys a client
cannot observe (queue time inside the server) are ``None``, never NaN.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

STATUSES = ("ok", "http_error", "refused", "timeout", "error", "cancelled", "not_sent")


@dataclass
class RequestRecord:
    """One replayed request (mutable while in flight)."""

    index: int
    endpoint: str = ""
    scheduled_s: float = math.nan
    sent_s: float = math.nan
    accepted_s: float = math.nan
    """When the response headers arrived: the request reached the engine (see the module docstring)."""
    first_token_s: float = math.nan
    finish_s: float = math.nan
    status: str = "not_sent"
    http_status: int = 0
    trace_input_tokens: int = 0
    trace_output_tokens: int = 0
    sent_input_tokens: int = 0
    requested_output_tokens: int = 0
    prompt_tokens: int = -1
    output_tokens: int = -1
    chunks: int = 0
    itl_mean_s: float = math.nan
    itl_p50_s: float = math.nan
    itl_p90_s: float = math.nan
    itl_max_s: float = math.nan
    clipped: bool = False
    error: str = ""

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.sent_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (vLLM's definition)."""
        if self.output_tokens is None or self.output_tokens < 2:
            return math.nan
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


def write_records(path: Path, records: list[RequestRecord]) -> None:
    names = [f.name for f in fields(RequestRecord)]
    with Path(path).open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        for rec in records:
            writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(rec).items()})


def read_records(path: Path) -> list[RequestRecord]:
    """Read ``requests.csv`` back; raises ValueError naming the line and column on bad values."""
    types = {f.name: f.type for f in fields(RequestRecord)}
    out = []
    with Path(path).open(newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            kwargs: dict[str, Any] = {}
            for key, raw in row.items():
                if key not in types:
                    continue
                kind = types[key]
                try:
                    if kind == "float":
                        kwargs[key] = float(raw) if raw != "" else math.nan
                    elif kind == "int":
                        kwargs[key] = int(raw)
                    elif kind == "bool":
                        kwargs[key] = raw in ("True", "true", "1")
                    else:
                        kwargs[key] = raw
                except ValueError as exc:
                    raise ValueError(f"{path}:{line}: column {key}={raw!r} is not a {kind}") from exc
            out.append(RequestRecord(**kwargs))
    return out


def _pct(values: np.ndarray, q: float) -> float | None:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, q)) if values.size else None


def _schedule_lag(records: list[RequestRecord]) -> dict[str, float | None]:
    """How far the replay fell behind its trace: sending (``sent_s - scheduled_s``, the client's own lag)
    and reaching the engine (``accepted_s - scheduled_s``: client and server frontend together). A large
    one means the engine saw another arrival process than the trace's."""
    sent = np.array([r.sent_s - r.scheduled_s for r in records], dtype=float)
    accepted = np.array([r.accepted_s - r.scheduled_s for r in records], dtype=float)
    return {"send_lag_p50_s": _pct(sent, 50), "send_lag_p90_s": _pct(sent, 90),
            "accept_lag_p50_s": _pct(accepted, 50), "accept_lag_p90_s": _pct(accepted, 90)}


def summarize(records: list[RequestRecord], wall_seconds: float, replicas: int, itl: np.ndarray | None = None,
              slo_ttft_s: float = 2.0, slo_tpot_s: float = 0.2) -> dict[str, Any]:
    """Summary with the simulator's keys plus replay-only counts (failures by kind, clipped)."""
    ok = [r for r in records if r.status == "ok"]
    ttft = np.array([r.ttft_s for r in ok], dtype=float)
    tpot = np.array([r.tpot_s for r in ok], dtype=float)
    e2e = np.array([r.e2e_s for r in ok], dtype=float)
    itl_all = np.asarray(itl if itl is not None else [r.itl_mean_s for r in ok], dtype=float)
    out_tokens = sum(max(r.output_tokens, 0) for r in ok)
    in_tokens = sum(max(r.prompt_tokens, 0) for r in ok)
    wall = max(wall_seconds, 1e-9)
    met = [r for r in ok if r.ttft_s <= slo_ttft_s and not (r.tpot_s > slo_tpot_s)]
    sent = [r for r in records if r.status != "not_sent"]
    summary: dict[str, Any] = {"requests": len(records), "sent": len(sent), "completed": len(ok)}
    for status in STATUSES[1:]:
        summary[status] = sum(1 for r in records if r.status == status)
    for name, arr in (("ttft", ttft), ("tpot", tpot), ("itl", itl_all), ("e2e", e2e)):
        for q in (50, 90, 95, 99):
            summary[f"{name}_p{q}"] = _pct(arr, q)
        finite = arr[np.isfinite(arr)]
        summary[f"{name}_mean"] = float(finite.mean()) if finite.size else None
    # the simulator's keys a client cannot observe per request (the queue is inside the server: see
    # server_queue_mean), or that map to the replay's own failure kinds
    summary.update({f"queue_p{q}": None for q in (50, 90, 95, 99)})
    summary.update({
        "queue_mean": None,
        "rejected": summary["refused"],
        "aborted": summary["cancelled"],
        "unfinished": summary["not_sent"] + summary["timeout"] + summary["error"] + summary["http_error"],
        "slo_ttft_s": slo_ttft_s,
        "slo_tpot_s": slo_tpot_s,
        "slo_attainment": (len(met) / len(sent)) if sent else None,
        # rejections apart from misses, as the simulator counts them (its 429s: the gateway's queue limit)
        "rejected_share": (summary["refused"] / len(sent)) if sent else None,
        "slo_attainment_accepted": (len(met) / (len(sent) - summary["refused"]))
        if len(sent) > summary["refused"] else None,
        "slo_missed": len(sent) - summary["refused"] - len(met),
        "overload_rejected": sum(1 for r in records if r.http_status == 429),
        "goodput": len(met) / wall,
        "goodput_requests_per_s": len(met) / wall,
        "goodput_tokens_per_s": sum(max(r.prompt_tokens, 0) + max(r.output_tokens, 0) for r in met) / wall,
        "throughput_tokens_per_s": (in_tokens + out_tokens) / wall,
        "output_tokens_per_s": out_tokens / wall,
        "throughput_requests_per_s": len(ok) / wall,
        "duration_s": wall_seconds,
        "prompt_tokens_per_s": in_tokens / wall,
        "generation_tokens_per_s": out_tokens / wall,
        "prompt_tokens": in_tokens,
        "output_tokens": out_tokens,
        "clipped": sum(1 for r in records if r.clipped),
        "prompt_token_mismatch": sum(1 for r in ok if r.prompt_tokens >= 0 and r.prompt_tokens != r.sent_input_tokens),
        "replicas": replicas,
        **_schedule_lag(records),
        "gpu_hours": replicas * wall / 3600.0,
        "wall_seconds": wall_seconds,
    })
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
