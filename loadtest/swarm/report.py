"""The run's summary as aligned "label  text" lines (:func:`table`), one row builder per
section of the JSON summary."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["table"]


def table(doc: dict[str, Any]) -> str:
    """The summary as aligned "label  text" lines."""
    rows: list[tuple[str, str]] = []

    def add(label: str, text: str) -> None:
        rows.append((label, text))

    m, cfg = doc["machine"], doc["config"]
    add("machine", f"{m['nproc']} cores, {m['mem_total_gib']} GiB, load {m['load_start']}")
    add(
        "swarm",
        f"{cfg['n']} {cfg['mode']} watchers on {cfg['keys']} key(s), {cfg['procs']} client "
        f"processes, {cfg['sources']} source addresses",
    )
    srv = doc.get("server", {})
    add("server", f"{srv.get('url')} ({len(doc.get('server_processes', []))} processes)")
    add(
        "latencies",
        "p50/p99/max in ms from the PUT sent, to the kernel's receive time at the "
        "watcher's socket (in the socket) and to the client process handling it (handled)",
    )
    for name, fmt in _ROWS:
        if name in doc:
            for label, text in fmt(doc[name]):
                add(label, text)
    if "failure" in doc:
        add("FAILED", doc["failure"])
    width = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{width}}  {b}" for a, b in rows)


def _connect_rows(c: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (
            "connect",
            f"{c['connected']} in {c['connect_seconds']} s = {c['connect_rate_per_s']}/s; "
            f"{c['armed']} armed after {c['armed_seconds']} s; failed {c['failed']}, "
            f"lost {c['lost']}",
        )
    ]


def _memory_rows(mem: dict[str, Any]) -> list[tuple[str, str]]:
    text = f"{mem['rss_before_mib']} → {mem['rss_after_mib']} MiB: "
    return [("server RSS", text + f"{mem['per_watcher_kib']} KiB per watcher")]


def _idle_rows(i: dict[str, Any]) -> list[tuple[str, str]]:
    text = f"gateway {i['server_cores']} cores, client {i['client_cores']} cores"
    return [("idle", text + f" over {i['wall_s']} s")]


def _unwatched_rows(label: str) -> Any:
    def rows(u: dict[str, Any]) -> list[tuple[str, str]]:
        n = len(u["runs"])
        text = f"median of {n}: {u['runs'][0]['puts']} PUTs in {u['median_seconds']} s "
        text += f"({u['median_puts_per_s']}/s); CPU s gateway {u['median_gateway_cpu_s']}"
        if not math.isnan(u["median_whole_server_cpu_s"]):
            text += f", whole server incl. Ray {u['median_whole_server_cpu_s']}"
        return [(label, text + f"; {u['events']} events")]

    return rows


def _single_rows(sg: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for r in sg["runs"]:
        a, h, x = r["arrived_sent"], r["handled_sent"], r["handled_answered"]
        text = f"in the socket {a['p50_ms']}/{a['p99_ms']}/{a['max_ms']}, handled {h['p50_ms']}/"
        text += f"{h['p99_ms']}/{h['max_ms']} ms (p99 {x['p99_ms']} after the answer; PUT "
        text += f"{r['put_ms']} ms); {r['reached']} reached, {r['short']} short; CPU s gateway "
        out.append(
            ("one change", text + f"{r['cpu']['server_cpu_s']}, client {r['cpu']['client_cpu_s']}")
        )
    m = sg["median"]
    text = f"in the socket {m['arrived_sent_p50_ms']}/{m['arrived_sent_p99_ms']}/"
    text += f"{m['arrived_sent_max_ms']}, handled {m['handled_sent_p50_ms']}/"
    text += f"{m['handled_sent_p99_ms']}/{m['handled_sent_max_ms']} ms after the PUT was sent"
    out.append(("one change, median", text))
    return out


def _burst_rows(b: dict[str, Any]) -> list[tuple[str, str]]:
    text = f"{b['puts']} PUTs in {b['seconds']} s ({b['puts_per_s']}/s, PUT p50/p99 "
    text += f"{b['put_latency']['p50_ms']}/{b['put_latency']['p99_ms']} ms); all at the final "
    text += f"version {b['all_at_final_after_last_put_ms']} ms after the last PUT; "
    return [("burst", text + f"{b['events_per_watcher']} events/watcher")]


def _correct_rows(k: dict[str, Any]) -> list[tuple[str, str]]:
    text = f"{k['at_final_version']}/{k['watchers_requested']} at the final version; "
    text += f"{k['not_at_final_version']} not; lost {k['lost_connections']}; "
    return [("correctness", text + f"errors {k['errors']}")]


_ROWS: list[tuple[str, Any]] = [
    ("connect", _connect_rows),
    ("memory", _memory_rows),
    ("idle", _idle_rows),
    ("unwatched_none", _unwatched_rows("unwatched key, none connected")),
    ("unwatched_connected", _unwatched_rows("unwatched key, all connected")),
    ("single", _single_rows),
    ("burst", _burst_rows),
    ("correctness", _correct_rows),
    ("server_stop", lambda d: [("server stop", json.dumps(d))]),
]
