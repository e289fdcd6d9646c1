"""The stats job's HTML report: one self-contained file, plots embedded as PNG (base64)."""

from __future__ import annotations

import base64
import html
import io
from datetime import UTC, datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory only

import matplotlib.pyplot as plt
import pandas as pd

__all__ = ["MAX_QUEUES", "write_report"]

MAX_QUEUES = 12  # queues with their own section (the busiest); all are in the overview
_FLOWS = [
    ("enqueued", "#1f77b4"),
    ("taken", "#ff7f0e"),
    ("acked", "#2ca02c"),
    ("released", "#9467bd"),
    ("dead_lettered", "#d62728"),
    ("expired", "#8c564b"),
]
_DEPTH = [("ready", "#2ca02c"), ("delayed", "#1f77b4"), ("reserved", "#ff7f0e")]
_STATS_SHOWN = [
    "ready",
    "delayed",
    "reserved",
    "total",
    "oldest_ready_age_ms",
    "enqueued",
    "acked",
    "dead_lettered",
    "dead_letter_pending",
    "expired",
    "purged",
]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; } .sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.warn { background: #fff3f3; border-left: 4px solid #d62728; padding: 0.5em 1em; }
.ok { background: #f3fff3; border-left: 4px solid #2ca02c; padding: 0.5em 1em; }
img { max-width: 100%; } section { margin-bottom: 2.5em; }
"""


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return (
        '<img alt="plot" src="data:image/png;base64,'
        + base64.b64encode(buf.getvalue()).decode()
        + '">'
    )


def _overview(table: pd.DataFrame) -> str:
    """Depth per queue over time: which stage piles up."""
    fig, ax = plt.subplots(figsize=(11, 3.6))
    for queue, rows in table.groupby("queue"):
        depth = rows["ready"].fillna(0) + rows["delayed"].fillna(0) + rows["reserved"].fillna(0)
        ax.step(rows["minute"], depth, where="post", label=str(queue), linewidth=1.6)
    ax.set_title("Messages in each queue (ready + delayed + reserved), end of minute")
    ax.set_ylabel("messages")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize="small", ncol=4)
    fig.autofmt_xdate()
    return _png(fig)


def _queue_plots(rows: pd.DataFrame) -> str:
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.4))
    flows, depth, waits, receives = axes.flat
    for name, color in _FLOWS:
        flows.plot(rows["minute"], rows[name], label=name, color=color, linewidth=1.4)
    flows.set_title("Per minute")
    flows.legend(fontsize="x-small", ncol=2)
    filled = rows[[n for n, _ in _DEPTH]].ffill().fillna(0)
    depth.stackplot(
        rows["minute"],
        *[filled[n] for n, _ in _DEPTH],
        labels=[n for n, _ in _DEPTH],
        colors=[c for _, c in _DEPTH],
        step="post",
        alpha=0.8,
    )
    age = depth.twinx()
    age.plot(rows["minute"], rows["oldest_ready_age_ms"] / 1000, color="#333", linestyle=":")
    age.set_ylabel("oldest ready (s, dotted)")
    depth.set_title("Depth by state, end of minute")
    depth.legend(loc="upper left", fontsize="x-small")
    for col, style in (("wait", "-"), ("ack", "--")):
        for p, color in (("p50", "#2ca02c"), ("p95", "#ff7f0e"), ("p99", "#d62728")):
            series = rows[f"{col}_{p}_ms"] / 1000
            if series.notna().any():
                waits.plot(rows["minute"], series, style, color=color, label=f"{col} {p}")
    waits.set_title("Time in queue (s): put→first take (—), put→ack (--)")
    if waits.get_legend_handles_labels()[0]:
        waits.legend(fontsize="x-small", ncol=2)
    buckets = ["received_1", "received_2", "received_3_5", "received_6_plus"]
    totals = [int(rows[b].sum()) for b in buckets]
    receives.bar(["1st", "2nd", "3rd-5th", "6th+"], totals, color="#1f77b4")
    receives.set_title("Takes by delivery number")
    for ax in (flows, depth, waits):
        ax.grid(alpha=0.3)
        ax.tick_params(axis="x", labelrotation=30, labelsize="x-small")
    fig.tight_layout()
    return _png(fig)


def _stats_table(summaries: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["queue", *_STATS_SHOWN])
    body = []
    for queue, entry in sorted(summaries.items()):
        stats = entry.get("stats")
        if stats is None:
            continue  # a shard log's own damage (see _damage), not a queue
        cells = "".join(f"<td>{_fmt(stats.get(c))}</td>" for c in _STATS_SHOWN)
        body.append(f"<tr><td>{html.escape(queue)}</td>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _damage(summaries: dict[str, Any]) -> str:
    items = []
    for queue, entry in sorted(summaries.items()):
        damage = entry.get("damage", [])
        first = [d for d in damage if not str(d["reason"]).startswith("after damage")]
        for d in first:
            items.append(
                f"<li>{html.escape(queue)}: {html.escape(d['object'])} at byte {d['offset']}: "
                f"{html.escape(str(d['reason']))} ({_fmt(d['records'])} records)</li>"
            )
        later = len(damage) - len(first)
        if later:
            items.append(
                f"<li>{html.escape(queue)}: {later} later segment(s) discarded after it</li>"
            )
    if not items:
        return '<p class="ok">No damaged records: every segment read checked.</p>'
    return (
        '<div class="warn"><b>Damaged records skipped</b> (as recovery would):<ul>'
        + "".join(items)
        + "</ul></div>"
    )


def _fmt(value: Any) -> str:
    return "-" if value is None else html.escape(str(value))


def write_report(
    path: str, table: pd.DataFrame, summaries: dict[str, Any], *, url: str, as_of_ms: int
) -> None:
    """Write the report for the stats ``table`` (the Parquet rows) and queue summaries."""
    as_of = datetime.fromtimestamp(as_of_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = [
        f"<h1>evq queue statistics</h1><p class='sub'>{html.escape(url)} — as of {as_of}</p>",
        _damage(summaries),
        "<h2>Queues now</h2>",
        _stats_table(summaries),
    ]
    if not table.empty:
        table = table.sort_values(["queue", "minute"])
        parts += ["<h2>Overview</h2>", _overview(table)]
        volume = table.groupby("queue")["enqueued"].sum().sort_values(ascending=False)
        for queue in list(volume.index)[:MAX_QUEUES]:
            rows = table[table["queue"] == queue]
            parts.append(f"<section><h2>Queue {html.escape(str(queue))}</h2>")
            parts.append(_queue_plots(rows))
            parts.append("</section>")
        if len(volume) > MAX_QUEUES:
            parts.append(
                f"<p>{len(volume) - MAX_QUEUES} quieter queues are in the overview only.</p>"
            )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>evq stats</title>"
        f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>"
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
