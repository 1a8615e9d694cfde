"""The oracle's part of a comparison report: which number is which, the gap, cost versus miss budget.

Two oracle figures, never to be confused: ``oracle_gpu_hours`` is a schedule that was simulated and met
the SLO (the ``oracle`` row of the table); ``oracle_lower_bound_gpu_hours`` is a certificate that no
schedule meeting the SLO costs less (``simulator.oracle_bound``), not a schedule. The figure puts both
as curves over the allowed share of late first tokens and every policy as a point (its late share, its
GPU-hours), so policies are compared at matched attainment, not only at the 5 % of p95.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _fmt(value: Any, spec: str = "{:.2f}") -> str:
    return "n/a" if value is None else spec.format(value)


def oracle_notes(summary: Mapping[str, Any], slo_ttft_s: float) -> list[str]:
    """Sentences for the report and the console: both numbers, which is which, the gap, the causal bound."""
    if "oracle_lower_bound_gpu_hours" not in summary:
        return []
    gpu, bound = summary.get("oracle_gpu_hours"), summary.get("oracle_lower_bound_gpu_hours")
    ratio = summary.get("oracle_bound_ratio")
    notes = [
        f"oracle = the best feasible clairvoyant schedule found: {_fmt(gpu)} GPU-h, simulated like every policy "
        f"(p95 TTFT {_fmt(summary.get('ttft_p95'))} s, meets the SLO: "
        f"{'yes' if summary.get('oracle_meets_slo') else 'no'}; {summary.get('oracle_method')} schedule after "
        f"{summary.get('oracle_runs')} full runs; the old headroom-alpha schedule: "
        f"{_fmt(summary.get('oracle_alpha_gpu_hours'))} GPU-h at alpha {_fmt(summary.get('oracle_alpha'), '{:.3f}')}).",
        f"oracle lower bound = {_fmt(bound)} GPU-h: no schedule that meets p95 TTFT <= {slo_ttft_s:g} s on this "
        f"workload with these cold starts costs less (a proof under stated assumptions, docs/autoscaling.md; not "
        f"a schedule). Gap between them: {_fmt(summary.get('oracle_bound_gap_gpu_hours'))} GPU-h "
        f"(x{_fmt(ratio)}).",
    ]
    if "causally_feasible" in summary:
        share = summary.get("causal_min_late_share")
        verdict = ("causally feasible" if summary.get("causally_feasible") else
                   "causally INFEASIBLE: only a fleet held above what the load so far needed (e.g. sized for the "
                   "peak from the start) meets the SLO here; judge autoscalers against this bound, not the oracle")
        notes.append(
            f"causal bound: a reasonable causal policy (it holds no more than the load begun so far needs, and its "
            f"pods start when that need rises) has at least {_fmt(None if share is None else 100 * share, '{:.1f}')} % "
            f"of first tokens late here, against 5 % allowed: {verdict}.")
    return notes


def budget_table(summary: Mapping[str, Any]) -> list[str]:
    """Markdown rows: bound and feasible GPU-hours per allowed late share."""
    curve = summary.get("oracle_budget_curve") or []
    if not curve:
        return []
    rows = ["| allowed late share | lower bound GPU-h | feasible GPU-h (its late share) |", "|---|---|---|"]
    for c in curve:
        late = c.get("feasible_late_share")
        rows.append(f"| {100 * c['late_share']:g} % | {_fmt(c.get('lower_bound_gpu_hours'))} | "
                    f"{_fmt(c.get('feasible_gpu_hours'))} ({_fmt(None if late is None else 100 * late, '{:.1f}')} %) |")
    return rows


def plot_budget(results: Mapping[str, Any], out_dir: Path) -> str | None:
    """``oracle_budget.png``: bound and feasible GPU-hours against the allowed late share, policies as points."""
    oracle = results.get("oracle")
    curve = (oracle.summary.get("oracle_budget_curve") if oracle is not None else None) or []
    if not curve:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulator.figures import save_figure

    share = [100 * c["late_share"] for c in curve]
    bound = [c["lower_bound_gpu_hours"] for c in curve]
    feasible = [(100 * c["late_share"], c["feasible_gpu_hours"]) for c in curve if c["feasible_gpu_hours"] is not None]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(share, bound, "k--", marker="v", label="lower bound (no schedule meeting the share costs less)")
    if feasible:
        xs, ys = zip(*feasible, strict=True)
        ax.plot(xs, ys, "k-", marker="^", label="feasible clairvoyant schedule (simulated)")
        lo = [b for s, b in zip(share, bound, strict=True) if s in xs]
        ax.fill_between(xs, lo, ys, color="grey", alpha=0.2, label="gap")
    for name, r in results.items():
        late, gpu = r.summary.get("ttft_late_share"), r.summary.get("gpu_hours")
        if late is None or gpu is None:
            continue
        ax.scatter([100 * late], [gpu], zorder=3)
        ax.annotate(name, (100 * late, gpu), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axvline(5.0, color="red", ls=":", lw=1.0, label="p95 SLO (5 % late)")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0.0)
    ax.set_xlabel("share of first tokens later than the TTFT SLO (%)")
    ax.set_ylabel("GPU-hours")
    ax.set_title("cost versus miss budget", fontsize=10, loc="left")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return save_figure(fig, out_dir, "oracle_budget.png")
