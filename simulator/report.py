"""``report.md`` + ``report.html`` with matplotlib PNGs for one comparison of autoscaling policies.

Plots: for each policy, demand (replicas the load needs, from the capacity model) against ready and
starting replicas over time; p95 TTFT per minute over time; TTFT CDFs; and the side-by-side table.
With an ``oracle`` run, its two numbers (feasible schedule and lower bound) are stated apart, with a
table and a figure of cost versus miss budget (``report_oracle``).
Inputs are ``AutoscaleResult``-like objects (``summary``, ``timeline``, ``arrival_s``, ``ttft_s``),
so the report never reruns a simulation.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from simulator.figures import save_figure

TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("gpu_hours", "GPU-hours", "{:.2f}"),
    ("ttft_p95", "p95 TTFT (s)", "{:.2f}"),
    ("ttft_p99", "p99 TTFT (s)", "{:.2f}"),
    ("slo_attainment", "SLO attainment", "{:.3f}"),
    ("ttft_late_share", "late first tokens", "{:.3f}"),
    ("rejected", "rejected", "{:d}"),
    ("aborted", "aborted", "{:d}"),
    ("scale_events", "scale events", "{:d}"),
    ("mean_replicas", "mean replicas", "{:.2f}"),
    ("max_replicas", "max replicas", "{:d}"),
)


class ResultLike(Protocol):
    summary: Mapping[str, Any]
    timeline: Mapping[str, np.ndarray]
    arrival_s: np.ndarray
    ttft_s: np.ndarray


def _cell(summary: Mapping[str, Any], key: str, fmt: str) -> str:
    value = summary.get(key)
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    try:
        return fmt.format(int(value) if "d}" in fmt else float(value))
    except (TypeError, ValueError):
        return str(value)


def table_rows(results: Mapping[str, ResultLike]) -> tuple[list[str], list[list[str]]]:
    """Header and one row per policy, in the given order."""
    header = ["policy", *(label for _, label, _ in TABLE_COLUMNS)]
    rows = [[name, *(_cell(r.summary, key, fmt) for key, _, fmt in TABLE_COLUMNS)] for name, r in results.items()]
    return header, rows


def markdown_table(results: Mapping[str, ResultLike]) -> str:
    header, rows = table_rows(results)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _p95_per_minute(arrival: np.ndarray, ttft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(ttft)
    if not ok.any():
        return np.array([]), np.array([])
    minute = np.floor(arrival[ok] / 60.0).astype(np.int64)
    values = ttft[ok]
    order = np.argsort(minute, kind="stable")
    minute, values = minute[order], values[order]
    edges = np.flatnonzero(np.diff(minute)) + 1
    groups = np.split(values, edges)
    starts = minute[np.r_[0, edges]]
    return starts.astype(float), np.array([np.percentile(g, 95) for g in groups])


def _legend_and_grid(ax: Any, loc: str) -> None:
    ax.legend(fontsize=8, loc=loc)
    ax.grid(alpha=0.3)


def plot(results: Mapping[str, ResultLike], out_dir: Path, slo_ttft_s: float) -> list[str]:
    """Write the PNGs; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    files = []
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.4 * len(names) + 0.6), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        tl = results[name].timeline
        t = np.asarray(tl["t"]) / 60.0
        if "demand" in tl:
            ax.plot(t, tl["demand"], color="black", lw=1.0, label="demand (replicas needed)")
        ax.step(t, tl["ready"], where="post", color="tab:blue", lw=1.2, label="ready")
        ax.step(t, np.asarray(tl["ready"]) + np.asarray(tl["starting"]), where="post", color="tab:orange", lw=1.0,
                ls="--", label="ready + starting")
        ax.set_ylabel("replicas")
        ax.set_title(name, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("time (min)")
    files.append(save_figure(fig, out_dir, "replicas.png"))

    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name in names:
        minutes, p95 = _p95_per_minute(np.asarray(results[name].arrival_s), np.asarray(results[name].ttft_s))
        ax.plot(minutes, p95, lw=1.0, label=name)
    ax.axhline(slo_ttft_s, color="red", ls=":", lw=1.0, label=f"SLO {slo_ttft_s:g} s")
    ax.set_yscale("log")
    ax.set_xlabel("time (min)")
    ax.set_ylabel("p95 TTFT per minute (s)")
    _legend_and_grid(ax, "upper left")
    files.append(save_figure(fig, out_dir, "ttft_over_time.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in names:
        ttft = np.asarray(results[name].ttft_s)
        ttft = ttft[np.isfinite(ttft)]
        if ttft.size:
            levels = np.linspace(0.0, 1.0, 1001)
            ax.plot(np.quantile(ttft, levels), levels, lw=1.2, label=name)
    ax.axvline(slo_ttft_s, color="red", ls=":", lw=1.0)
    ax.axhline(0.95, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    _legend_and_grid(ax, "lower right")
    files.append(save_figure(fig, out_dir, "ttft_cdf.png"))
    return files


Section = tuple[str, list[str], list[str]]
"""(heading, markdown lines, PNG file names already written beside the report)."""


def write_report(results: Mapping[str, ResultLike], out_dir: str | Path, title: str, slo_ttft_s: float,
                 notes: Sequence[str] = (), before: Sequence[Section] = (),
                 after: Sequence[Section] = ()) -> dict[str, Path]:
    """Write report.md, report.html and the PNGs into ``out_dir``; returns their paths. ``before`` and
    ``after`` are extra sections around the policies' table and plots (the fixed stage, rollouts)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from simulator.report_oracle import budget_table, oracle_notes, plot_budget

    pngs = plot(results, out, slo_ttft_s)
    oracle = results.get("oracle")
    oracle_text = oracle_notes(oracle.summary, slo_ttft_s) if oracle is not None else []
    budget_rows = budget_table(oracle.summary) if oracle is not None else []
    budget_png = plot_budget(results, out)
    md = [f"# {title}", ""]
    for note in notes:
        md += [note, ""]
    for heading, lines, images in before:
        md += [f"## {heading}", "", *lines, "", *(f"![{p}]({p})" for p in images), ""]
    md += (["## Autoscaling policies", ""] if before or after else []) + [markdown_table(results), ""]
    if oracle_text:
        md += ["## The oracle: a feasible schedule and a lower bound", ""]
        for note in oracle_text:
            md += [f"- {note}"]
        md += ["", *budget_rows, ""]
    if budget_png:
        md += [f"![{budget_png}]({budget_png})", ""]
    md += [f"![{p}]({p})" for p in pngs]
    for heading, lines, images in after:
        md += ["", f"## {heading}", "", *lines, "", *(f"![{p}]({p})" for p in images)]
    (out / "report.md").write_text("\n".join(md) + "\n")
    header, rows = table_rows(results)
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)

    def section(heading: str, lines: list[str], images: list[str]) -> str:
        return (f"<h2>{html.escape(heading)}</h2>" + html_block(lines)
                + "".join(f"<p><img src='{p}' alt='{p}'></p>" for p in images))

    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}</style>"
        "</head><body><h1>" + html.escape(title) + "</h1>"
        + "".join(f"<p>{html.escape(n)}</p>" for n in notes if n)
        + "".join(section(*s) for s in before)
        + ("<h2>Autoscaling policies</h2>" if before or after else "")
        + f"<table><tr>{cells}</tr>{body}</table>"
        + ("<h2>The oracle: a feasible schedule and a lower bound</h2><ul>"
           + "".join(f"<li>{html.escape(n)}</li>" for n in oracle_text) + "</ul>" if oracle_text else "")
        + _html_rows(budget_rows)
        + (f"<p><img src='{budget_png}' alt='{budget_png}'></p>" if budget_png else "")
        + "".join(f"<p><img src='{p}' alt='{p}'></p>" for p in pngs)
        + "".join(section(*s) for s in after)
        + "</body></html>"
    )
    (out / "report.html").write_text(page)
    files = [*pngs, *([budget_png] if budget_png else [])]
    extra = [p for _, _, images in (*before, *after) for p in images]
    return {"md": out / "report.md", "html": out / "report.html", **{p: out / p for p in [*files, *extra]}}


def html_block(lines: list[str]) -> str:
    """Markdown tables become HTML tables, code fences <pre>, other lines paragraphs."""
    out: list[str] = []
    table: list[list[str]] = []
    code: list[str] | None = None
    for line in [*lines, ""]:
        if code is not None:
            if line.startswith("```"):
                out.append("<pre>" + html.escape("\n".join(code)) + "</pre>")
                code = None
            else:
                code.append(line)
            continue
        if line.startswith("|"):
            if not line.startswith("|---"):
                table.append([c.strip() for c in line.strip("|").split("|")])
            continue
        if table:
            head = "".join(f"<th>{html.escape(c)}</th>" for c in table[0])
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in table[1:])
            out.append(f"<table><tr>{head}</tr>{rows}</table>")
            table = []
        if line.startswith("```"):
            code = []
        elif line:
            out.append(f"<p>{html.escape(line)}</p>")
    return "".join(out)


def _html_rows(rows: Sequence[str]) -> str:
    """A Markdown table (header, rule, rows) as an HTML table."""
    return html_block(list(rows)) if rows else ""
