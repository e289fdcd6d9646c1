// evq dashboard: the queue list (GET v1/queues, polled), each queue's counts (one-shot
// watches of "queue:NAME" on the v1/ws WebSocket, re-armed after every event) and the
// shards' recovery reports (GET v1/status, polled). Requests are relative to the page, so
// the page works behind a path prefix. A token in the fragment (#token=...) is sent as
// "Authorization: Bearer ..." on fetches and as ?token=... on the WebSocket.
"use strict";

(function () {
  const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
  const token = fragment.get("token");
  // What the charts show: 5 minutes, or #window=SECONDS (10 s to 1 h).
  const WINDOW_MS = windowFrom(fragment.get("window"));
  // The queue list and the shards' states follow the server's events (sys:queues and
  // sys:shards on the same WebSocket); these slow polls only back them up.
  const LIST_EVERY_MS = 30000;
  const STATUS_EVERY_MS = 30000;
  const SYS_KEYS = { "sys:queues": () => refreshList(), "sys:shards": () => refreshStatus() };
  const sysVersions = {};
  const TICK_MS = 1000; // charts scroll and ages grow between events
  const FIELDS = ["ready", "delayed", "reserved", "total", "oldest_ready_age", "dead_lettered", "paused"];
  const INTERNAL = "__evq";

  const queues = new Map(); // name -> {row, cells, canvas, version, value, at, samples, seen}
  // Only the rows on screen are drawn (a thousand charts redrawn every second would keep
  // the page busy): each row's ``seen`` follows it in and out of view.
  const onScreen = new IntersectionObserver((entries) => {
    for (const e of entries) {
      const q = queues.get(e.target.dataset.queue);
      if (!q) continue;
      q.seen = e.isIntersecting;
      if (q.seen) {
        if (q.value) showCounts(e.target.dataset.queue, q);
        window.evqChart.draw(q.canvas, q.samples, Date.now(), WINDOW_MS);
      }
    }
  });
  const state = { ws: null, backoff: 500, listProblem: null, statusProblem: null, wsProblem: null };
  let lastStatus = "";

  // ------------------------------------------------------------------ helpers

  function windowFrom(text) {
    const seconds = Number(text);
    if (!text || !Number.isFinite(seconds)) return 5 * 60 * 1000;
    return Math.min(3600, Math.max(10, seconds)) * 1000;
  }

  function windowLabel(ms) {
    const s = Math.round(ms / 1000);
    if (s % 60 !== 0) return `last ${s} s`;
    return s === 60 ? "last minute" : `last ${s / 60} minutes`;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    if (seconds < 10) return `${seconds.toFixed(1)} s`;
    if (seconds < 60) return `${Math.floor(seconds)} s`;
    const m = Math.floor(seconds / 60);
    if (m < 60) return `${m} m ${Math.floor(seconds % 60)} s`;
    const h = Math.floor(m / 60);
    if (h < 24) return `${h} h ${m % 60} m`;
    return `${Math.floor(h / 24)} d ${h % 24} h`;
  }

  const problems = {}; // other parts of the page (console.js): their problem, by part

  function showProblem() {
    const box = document.getElementById("problem");
    const text = [state.listProblem, state.statusProblem, state.wsProblem, ...Object.values(problems)].filter(Boolean);
    box.hidden = text.length === 0;
    box.textContent = text.join(" · ");
  }

  async function getJson(path) {
    return request("GET", path);
  }

  // One API call with the page's token; its JSON answer ({} for none). Raises an Error
  // whose message is the API's error code and message (and ``status``).
  async function request(method, path, body) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    if (resp.ok) return resp.status === 204 ? {} : resp.json();
    let detail = `${resp.status} ${resp.statusText}`;
    try {
      const doc = await resp.json();
      if (doc && doc.error) detail = `${resp.status} ${doc.error.code}: ${doc.error.message}`;
    } catch (e) {
      // not an API error body
    }
    if (resp.status === 401 || resp.status === 403) {
      detail += token ? " (the token in the URL is not accepted)" : " (open the page as /#token=YOUR_TOKEN)";
    }
    const error = new Error(`${path}: ${detail}`);
    error.status = resp.status;
    throw error;
  }

  // ------------------------------------------------------------------ queues

  function addQueue(name) {
    const cells = {};
    const row = el("tr", { "data-queue": name, class: name.startsWith(INTERNAL) ? "internal" : "" });
    const open = name.startsWith(INTERNAL) ? name : el("a", { href: window.evqDash.link({ queue: name }) }, name);
    row.append(el("td", { class: "name" }, open));
    for (const field of FIELDS) {
      cells[field] = el("td", { "data-field": field }, "…");
      row.append(cells[field]);
    }
    const canvas = el("canvas", { "data-chart": name });
    row.append(el("td", { class: "chart" }, canvas));
    const q = { row, cells, canvas, version: null, value: undefined, at: 0, samples: [], seen: false };
    queues.set(name, q);
    onScreen.observe(row);
    const body = document.querySelector("#queues tbody");
    const after = [...body.children].find((r) => r.dataset.queue > name);
    body.insertBefore(row, after || null);
    watch(name);
  }

  function removeQueue(name) {
    const q = queues.get(name);
    queues.delete(name);
    onScreen.unobserve(q.row);
    q.row.remove();
    send({ op: "unwatch", key: `queue:${name}` });
  }

  function showCounts(name, q) {
    const v = q.value;
    q.row.classList.toggle("gone", v === null);
    for (const field of FIELDS) {
      const cell = q.cells[field];
      if (!v) {
        cell.textContent = "—";
        continue;
      }
      if (field === "paused") {
        cell.textContent = v.paused ? "paused" : "";
        q.row.classList.toggle("paused", Boolean(v.paused));
      } else if (field === "oldest_ready_age") {
        const grown = v[field] === null ? null : v[field] + (Date.now() - q.at) / 1000;
        cell.textContent = age(grown);
      } else {
        cell.textContent = String(v[field]);
        cell.classList.toggle("num-zero", v[field] === 0);
      }
    }
  }

  function onQueueEvent(name, version, value) {
    const q = queues.get(name);
    if (!q) return; // unwatched meanwhile
    q.version = version;
    q.value = value;
    q.at = Date.now();
    if (value) {
      q.samples.push({ t: q.at, ready: value.ready, reserved: value.reserved, delayed: value.delayed });
      q.samples = window.evqChart.visible(q.samples, q.at - WINDOW_MS);
    }
    q.row.dataset.version = String(version);
    if (q.seen || q.cells.ready.textContent === "…") showCounts(name, q); // its first counts: always
    if (window.evqDash.onQueueValue) window.evqDash.onQueueValue(name, value);
    if (q.seen) window.evqChart.draw(q.canvas, q.samples, Date.now(), WINDOW_MS);
    watch(name); // watches are one-shot: re-arm with the version just received
  }

  async function refreshList() {
    try {
      const doc = await getJson("v1/queues");
      const names = new Set(doc.queues);
      for (const name of [...queues.keys()]) if (!names.has(name)) removeQueue(name);
      for (const name of doc.queues) if (!queues.has(name)) addQueue(name);
      document.getElementById("queue-count").textContent = `(${queues.size})`;
      document.getElementById("no-queues").hidden = queues.size > 0;
      state.listProblem = null;
    } catch (e) {
      state.listProblem = e.message;
    }
    showProblem();
  }

  // ------------------------------------------------------------------ WebSocket

  function wsUrl() {
    const url = new URL("v1/ws", location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    url.hash = "";
    if (token) url.searchParams.set("token", token);
    return url.href;
  }

  function send(doc) {
    if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(JSON.stringify(doc));
  }

  function watch(name) {
    const q = queues.get(name);
    const doc = { op: "watch", key: `queue:${name}` };
    if (q && q.version !== null) doc.version = q.version;
    send(doc);
  }

  function setLive(text, kind) {
    const badge = document.getElementById("live");
    badge.textContent = text;
    badge.className = `badge ${kind}`;
    document.body.dataset.ws = kind === "ok" ? "open" : "closed";
  }

  function connect() {
    const ws = new WebSocket(wsUrl());
    state.ws = ws;
    ws.onopen = () => {
      state.backoff = 500;
      state.wsProblem = null;
      showProblem();
      setLive("live", "ok");
      for (const name of queues.keys()) watch(name); // a new connection starts with no watches
      for (const key of Object.keys(SYS_KEYS)) {
        send({ op: "watch", key, version: sysVersions[key] || 0 });
      }
    };
    ws.onmessage = (msg) => {
      const doc = JSON.parse(msg.data);
      if (doc.op === "event" && doc.key.startsWith("queue:")) {
        onQueueEvent(doc.key.slice("queue:".length), doc.version, doc.value);
      } else if (doc.op === "event" && SYS_KEYS[doc.key]) {
        const first = !sysVersions[doc.key];
        sysVersions[doc.key] = doc.version;
        send({ op: "watch", key: doc.key, version: doc.version }); // one-shot: re-arm
        if (!first) SYS_KEYS[doc.key](); // the server says something changed: look now
      } else if (doc.op === "error") {
        state.wsProblem = `watch ${doc.key || ""}: ${doc.code}: ${doc.message}`;
        showProblem();
      }
    };
    ws.onclose = (e) => {
      if (state.ws !== ws) return;
      state.ws = null;
      setLive("reconnecting", "warn");
      if (e.code === 4008 || e.code >= 4400) {
        state.wsProblem = `WebSocket closed: ${e.code} ${e.reason}`;
        showProblem();
      }
      setTimeout(connect, state.backoff);
      state.backoff = Math.min(state.backoff * 2, 10000);
    };
  }

  // ------------------------------------------------------------------ recovery

  function discardedCell(report) {
    if (report.clean) return el("td", { class: "discarded clean" }, "nothing");
    const list = el("ul");
    for (const d of report.discarded) {
      const records = d.records === null ? "unknown records" : `${d.records} record(s)`;
      list.append(el("li", {}, `${d.object} from byte ${d.offset}, ${records}: ${d.reason}`));
    }
    return el("td", { class: "discarded" }, list);
  }

  function reportRow(shard, r) {
    const kind = r.clean ? "" : "damaged";
    const internal = r.queue.startsWith(INTERNAL) ? " internal" : "";
    return el(
      "tr",
      { class: kind + internal, "data-report": r.queue },
      el("td", {}, shard.index),
      el("td", { class: "name" }, r.queue),
      el("td", {}, r.epoch),
      el("td", {}, r.snapshot ? `seq ${r.snapshot_seq}` : "none"),
      el("td", {}, r.segments_replayed),
      el("td", { "data-field": "records_replayed" }, r.records_replayed),
      el("td", {}, r.last_seq),
      el("td", {}, `${r.duration_ms} ms`),
      discardedCell(r),
    );
  }

  // The shard's log itself (every queue of the shard writes to it): what its recovery read
  // and what it discarded or cut, as one more row above the shard's queues.
  function logRow(shard, log) {
    const kind = log.discarded.length ? "damaged" : "";
    const repaired = log.repaired.length ? ` (cut: ${log.repaired.join("; ")})` : "";
    const cell = discardedCell({ clean: !log.discarded.length, discarded: log.discarded });
    if (repaired) cell.append(repaired);
    return el(
      "tr",
      { class: `${kind} log`, "data-report": `log-${shard.index}` },
      el("td", {}, shard.index),
      el("td", { class: "name" }, `shard ${shard.index} log`),
      el("td", {}, log.epoch),
      el("td", {}, ""),
      el("td", {}, log.segments),
      el("td", { "data-field": "records_replayed" }, log.records),
      el("td", {}, ""),
      el("td", {}, `${log.duration_ms} ms`),
      cell,
    );
  }

  function shardCard(shard) {
    const card = el("div", { class: "shard", "data-shard": shard.index });
    const badge = el("span", { class: `badge ${shard.ready ? "ok" : "warn"}` });
    badge.textContent = shard.ready ? "ready" : `recovering ${shard.recovering}`;
    card.append(el("strong", {}, `shard ${shard.index} `), badge, ` ${shard.queues} queue(s)`);
    for (const [queue, error] of Object.entries(shard.failed)) {
      card.append(el("div", { class: "failed" }, `${queue} failed: ${error}`));
    }
    return card;
  }

  function showStatus(doc) {
    const server = document.getElementById("server");
    server.textContent = doc.ready ? "ready" : "recovering";
    server.className = `badge ${doc.ready ? "ok" : "warn"}`;
    document.getElementById("shards").replaceChildren(...doc.shards.map(shardCard));
    const rows = [];
    for (const shard of doc.shards) {
      if (shard.log) rows.push(logRow(shard, shard.log));
      const sorted = [...shard.reports].sort((a, b) => a.queue.localeCompare(b.queue));
      for (const r of sorted) rows.push(reportRow(shard, r));
    }
    document.querySelector("#recovery tbody").replaceChildren(...rows);
    document.getElementById("no-reports").hidden = rows.length > 0;
  }

  async function refreshStatus() {
    try {
      const doc = await getJson("v1/status");
      const text = JSON.stringify(doc);
      if (text !== lastStatus) showStatus(doc);
      lastStatus = text;
      state.statusProblem = null;
    } catch (e) {
      state.statusProblem = e.message;
      const server = document.getElementById("server");
      const denied = e.status === 401 || e.status === 403;
      server.textContent = denied ? "no access" : e.status ? `error ${e.status}` : "unreachable";
      server.className = "badge bad";
    }
    showProblem();
  }

  // ------------------------------------------------------------------ clock

  function tick() {
    const now = Date.now();
    for (const [name, q] of queues) {
      if (!q.seen) continue;
      if (q.value) showCounts(name, q);
      window.evqChart.draw(q.canvas, q.samples, now, WINDOW_MS);
    }
    document.getElementById("updated").textContent = new Date(now).toLocaleTimeString();
  }

  function every(ms, fn) {
    fn();
    setInterval(fn, ms);
  }

  document.querySelector("#queues th.chart").textContent = windowLabel(WINDOW_MS);
  connect();
  every(LIST_EVERY_MS, refreshList);
  every(STATUS_EVERY_MS, refreshStatus);
  every(TICK_MS, tick);
  window.addEventListener("hashchange", () => {
    const now = new URLSearchParams(location.hash.replace(/^#/, "")).get("token");
    if (now !== token) location.reload(); // a new token; other changes are console.js's
  });

  window.evqDash = {
    el,
    getJson,
    request,
    token,
    link: (params) => `#${new URLSearchParams({ ...(token ? { token } : {}), ...params })}`,
    problem: (part, text) => {
      if (text) problems[part] = text;
      else delete problems[part];
      showProblem();
    },
    onQueueValue: null,
  };
})();
