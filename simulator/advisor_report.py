"""``report.md`` + ``report.html`` for ``leadscale tune`` / ``advise``: the recommendation and its evidence.

Sections: first, before any autoscaling advice, one replica's capacity at the SLO and what a fixed
two-replica stage would have served (``simulator.stage``); the recommended settings next to the
defaults; the robustness check (each shortlisted candidate's GPU-hours and SLO attainment,
min/mean/max over seeds, on the search and held-out windows); the recommendation against every
baseline policy on the held-out window (the table and plots of ``simulator.report``: demand against
ready and starting replicas, TTFT over time, CDFs); GPU-hours against SLO attainment for every trial
with the Pareto front; the gateway's queue limit (``simulator.queue_limit``: rejected share against
the limit, plotted); the drain settings of the vLLM pods (``scaler.kube.drain.drain_timing``); and,
for ``advise``, what was read from Prometheus (resets, gaps). Inputs are a ``TuneResult`` and those
reports; nothing is re-simulated here.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simulator.manifests import DEFAULT_SETTINGS
from simulator.tuner import TuneResult, beats, pareto_front


def plot_trials(result: TuneResult, path: Path) -> None:
    """GPU-hours against SLO attainment for every trial on the search window, the Pareto front, the pick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = result.inputs.target
    points = [(c.search.gpu_hours, c.search.attainment) for c in result.trials]
    front = pareto_front(points)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = [p for p in points if p[1] >= target]
    bad = [p for p in points if p[1] < target]
    if ok:
        xs, ys = zip(*ok, strict=True)
        ax.scatter(xs, ys, s=18, color="tab:blue", zorder=3, label=f"trial meeting {target:g}")
    if bad:
        xs, ys = zip(*bad, strict=True)
        ax.scatter(xs, ys, s=18, color="tab:grey", alpha=0.6, zorder=3, label="trial missing it")
    ax.plot([points[k][0] for k in front], [points[k][1] for k in front], color="tab:orange", lw=1.2,
            marker="o", ms=4, label="Pareto front")
    best = result.best.search
    ax.scatter([best.gpu_hours], [best.attainment], marker="*", s=200, color="red", zorder=5,
               label=f"recommended (trial {result.best.trial})")
    ax.axhline(target, color="red", ls=":", lw=1.0)
    ax.set_xlabel("GPU-hours (search window)")
    ax.set_ylabel("SLO attainment")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]


def sections(result: TuneResult, history: Mapping[str, Any] | None = None, stage: Any = None, limit: Any = None,
             drain: Mapping[str, Any] | None = None) -> list[tuple[str, list[str]]]:
    """(title, markdown lines) in report order, shared by the .md and the .html."""
    i, best, target = result.inputs, result.best, result.inputs.target
    verdict = ("holds up: every re-run on both windows met the target" if result.holds_up else
               "WARNING: no candidate met the target on every re-run; this is the one with the best worst run")
    intro = [f"Workload `{i.workload.name}` ({len(i.workload)} requests, {i.workload.duration_s:.0f} s), profile "
             f"`{getattr(i.profile, 'name', i.profile)}`, cold start `{i.cold_start}`, SLO TTFT <= {i.slo_ttft_s:g} s "
             f"and TPOT <= {i.slo_tpot_s:g} s, target attainment {target:g}, seed {i.seed}.",
             f"Search window 0-{i.split_s:.0f} s ({len(result.trials)} trials, "
             f"{sum(c.search.attainment >= target for c in result.trials)} meeting the target); held-out window "
             f"{i.split_s:.0f}-{i.workload.duration_s:.0f} s, never seen by the search.",
             f"Recommendation: trial {best.trial}; {verdict}."]
    params = list(asdict(best.settings))
    settings = _table(["setting", "recommended", "default"],
                      [[p, getattr(best.settings, p), getattr(DEFAULT_SETTINGS, p)] for p in params])
    rows = []
    for c in result.robust:
        spread = c.spread(target)
        for window in ("search", "holdout"):
            s = spread.get(window)
            if s:
                g, a = s["gpu_hours"], s["slo_attainment"]
                rows.append([f"trial {c.trial}" + (" (recommended)" if c is best else ""), window, s["runs"],
                             g["min"], g["mean"], g["max"], a["min"], a["mean"], a["max"]])
    robust = _table(["candidate", "window", "runs", "GPU-h min", "GPU-h mean", "GPU-h max", "SLO min", "SLO mean",
                     "SLO max"], rows)
    mine = result.best_holdout()
    base_rows = [["recommended", mine.gpu_hours, mine.attainment, mine.summary.get("ttft_p95"), "-"]]
    base_rows += [[name, run.gpu_hours, run.attainment, run.summary.get("ttft_p95"),
                   "yes" if beats(mine, run, target) else "no"] for name, run in result.baselines.items()]
    baselines = _table(["policy (held-out window)", "GPU-hours", "SLO attainment", "p95 TTFT (s)",
                        "recommended beats it"], base_rows)
    out = []
    if stage is not None:
        out.append((f"Before autoscaling: one replica and a fixed {stage.fixed.replicas}-replica stage", stage.lines()))
    out += [("Summary", intro), ("Recommended settings", settings),
            ("Robustness: re-runs over seeds and the held-out window", robust),
            (f"Against the baselines (held-out window, seed {i.seed})", baselines)]
    if limit is not None:
        out.append(("Overload: the gateway's queue limit (429)", [
            *limit.lines(), "", "Each candidate is one run of the recommended settings on the held-out window, "
            "started from half the warm fleet so that replicas start at once; `queue_limit.png` plots it."]))
    if drain is not None:
        out.append(("Streaming drain: the vLLM pods' shutdown", [
            f"p99 request duration {drain['p99_request_s']:.1f} s (the recommended settings' held-out run): vLLM "
            f"`--shutdown-timeout={drain['shutdown_timeout_s']}`, container `lifecycle.preStop.sleep.seconds: "
            f"{drain['pre_stop_sleep_s']}` (the endpoint removal reaches kube-proxy and the gateway meanwhile), "
            f"`terminationGracePeriodSeconds: {drain['termination_grace_period_s']}`; `vllm-drain.yaml` is the "
            "patch. The simulation drained each removed pod for the same grace."]))
    if history is not None:
        out.append(("Prometheus history", ["```json", json.dumps(history, indent=2, default=str), "```"]))
    return out


def write_report(result: TuneResult, out_dir: str | Path, title: str = "leadscale tune",
                 history: Mapping[str, Any] | None = None, stage: Any = None, limit: Any = None,
                 drain: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Write report.md, report.html and the PNGs into ``out_dir``; returns their paths."""
    from simulator import queue_limit
    from simulator.report import html_block, markdown_table, plot

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plot_trials(result, out / "trials.png")
    runs = {"recommended": result.details["recommended"],
            **{n: r for n, r in result.details.items() if n != "recommended" and r is not None}}
    pngs = ["trials.png", *plot(runs, out, result.inputs.slo_ttft_s)]
    if limit is not None:
        queue_limit.plot(limit, out / "queue_limit.png")
        pngs.append("queue_limit.png")
    parts = sections(result, history, stage, limit, drain)
    md = [f"# {title}", ""]
    for heading, lines in parts:
        md += [f"## {heading}", "", *lines, ""]
    md += ["## Simulated runs on the held-out window", "", markdown_table(runs), ""]
    md += [f"![{p}]({p})" for p in pngs]
    (out / "report.md").write_text("\n".join(md) + "\n")
    body = [f"<h1>{html.escape(title)}</h1>"]
    for heading, lines in parts:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        body.append(html_block(lines))
    body.append("<h2>Simulated runs on the held-out window</h2>" + html_block(markdown_table(runs).splitlines()))
    body += [f"<p><img src='{p}' alt='{p}'></p>" for p in pngs]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
            "</style></head><body>" + "".join(body) + "</body></html>")
    (out / "report.html").write_text(page)
    return {"md": out / "report.md", "html": out / "report.html", **{p: out / p for p in pngs}}
