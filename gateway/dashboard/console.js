// evq console: one queue's page (#queue=NAME), one message's (#queue=NAME&message=ID) and
// the cluster's (#cluster: shards, their queues and recovery, the gateways that serve),
// over the native API with the page's token (app.js: window.evqDash). A queue's page shows
// its settings and its messages by state, a page at a time with the browse cursor, and acts
// on it: pause or resume, purge (after typing its name), redrive (at a rate, its task's
// progress followed). A message's page shows its body (JSON pretty-printed, text, or bytes
// as hex), attributes, times, receive count, failure reasons and lease, and runs it now or
// deletes it (a reserved one by force). The server checks every permission: a read token
// sees, an admin token acts; a refusal shows in the page's problem line.
"use strict";

(function () {
  const dash = window.evqDash;
  const { el } = dash;
  const PAGE = 100; // messages per page
  const STATES = ["ready", "delayed", "reserved"];
  const DEAD = "dead-lettered"; // the tab of this queue's messages on its dead-letter queue
  const SOURCE_QUEUE = "evq.source_queue"; // the attribute a dead letter names its queue by
  const SCAN_PAGES = 50; // dead-letter queue pages of PAGE read at most for one page shown
  const view = { queue: null, state: "ready", cursors: [null], paused: false, dlq: null, timer: null };
  const HOUR_MS = 3600 * 1000;
  const HISTORY_EVERY_MS = 30 * 1000; // the chart of the last hour is read again this often

  function route() {
    const f = new URLSearchParams(location.hash.replace(/^#/, ""));
    return {
      queue: f.get("queue"),
      message: f.get("message"),
      state: f.get("state"),
      cluster: f.has("cluster"),
    };
  }

  function link(params) {
    const f = new URLSearchParams();
    if (dash.token) f.set("token", dash.token);
    for (const [k, v] of Object.entries(params)) if (v) f.set(k, v);
    return `#${f.toString()}`;
  }
  dash.link = link;

  function when(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    return new Date(seconds * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  function problem(text) {
    dash.problem("console", text);
  }

  async function act(label, fn) {
    try {
      const result = await fn();
      problem(null);
      return result;
    } catch (e) {
      problem(`${label}: ${e.message}`);
      return undefined;
    }
  }

  function q(name) {
    return `v1/queues/${encodeURIComponent(name)}`;
  }

  // ------------------------------------------------------------------ a queue's page

  async function showQueue(name, state) {
    view.queue = name;
    view.cursors = [null];
    const box = document.getElementById("queue-view");
    box.replaceChildren(el("p", { class: "muted" }, "loading…"));
    const info = await act("queue", () => dash.getJson(q(name)));
    if (!info) return;
    view.dlq = info.settings.dead_letter_queue || null;
    const states = view.dlq ? [...STATES, DEAD] : STATES;
    view.state = states.includes(state) ? state : "ready";
    view.paused = Boolean(info.stats.paused);
    const title = el("h2", {}, el("a", { href: link({}), class: "back" }, "queues"), " / ", name);
    const badge = el("span", { id: "paused-badge", class: "badge" });
    title.append(" ", badge);
    const actions = el("div", { class: "actions" });
    const pause = el("button", { id: "pause", type: "button" });
    pause.onclick = () => togglePause(name);
    const purge = el("button", { id: "purge", type: "button", class: "danger" }, "Purge…");
    purge.onclick = () => purgeQueue(name);
    const rate = el("input", { id: "redrive-rate", type: "number", min: 1, max: 500, value: 50 });
    const to = el("input", { id: "redrive-to", type: "text", placeholder: "to: each one's source" });
    const redrive = el("button", { id: "redrive", type: "button" }, "Redrive");
    redrive.onclick = () => startRedrive(name, Number(rate.value) || null, to.value.trim() || null);
    if (view.state === DEAD) redrive.disabled = true; // this queue is no dead-letter queue
    const progress = el("span", { id: "redrive-progress", class: "muted" });
    actions.append(pause, purge, el("span", { class: "sep" }), "rate/s ", rate, to, redrive, progress);
    const settings = settingsForm(name, info.settings);
    const counts = el("p", { id: "queue-counts", class: "muted" });
    const chart = el("canvas", { id: "history-chart" });
    const rates = el("span", { id: "history-rates", class: "muted" });
    const tabs = el("div", { class: "tabs" });
    for (const s of states) {
      const tab = el("a", { href: link({ queue: name, state: s }), "data-state": s }, s);
      if (s === view.state) tab.className = "on";
      tabs.append(tab);
    }
    const table = el("table", { id: "messages" });
    const pager = el("div", { class: "pager" });
    const selected = el("div", { class: "actions" });
    const redriveSome = el("button", { id: "redrive-selected", type: "button" }, "Redrive selected");
    redriveSome.onclick = () => {
      const ids = [...document.querySelectorAll("#messages tbody input:checked")].map((c) => c.value);
      const from = view.state === DEAD ? view.dlq : name; // ticked on its dead-letter queue
      if (ids.length) startRedrive(from, Number(rate.value) || null, to.value.trim() || null, ids);
      else problem("redrive: select messages first");
    };
    selected.append(redriveSome);
    box.replaceChildren(
      title, counts, actions,
      el("h3", {}, "Last hour ", rates), chart,
      el("h3", {}, "Settings"), settings,
      el("h3", {}, "Messages"), tabs, table, selected, pager,
    );
    showPaused();
    showQueueCounts(info.stats);
    await Promise.all([showPage(), showHistory(name)]);
    if (view.timer !== null) clearInterval(view.timer);
    view.timer = setInterval(() => showHistory(name), HISTORY_EVERY_MS);
  }

  // The queue's counts a minute at a time over the last hour, kept by its shard (GET
  // v1/queues/NAME/history), drawn as the list's charts are; its time is the server's (the
  // last sample is the counts now), so the browser's clock does not shift it.
  async function showHistory(name) {
    const doc = await act("history", () => dash.getJson(`${q(name)}/history`));
    const chart = document.getElementById("history-chart");
    if (!doc || name !== view.queue || !chart) return;
    const samples = doc.samples.map((s) => ({ ...s, t: s.at * 1000 }));
    const now = samples[samples.length - 1];
    // the window ends a minute past now: the counts now are its last minute's bar
    window.evqChart.draw(chart, samples, now.t + 60000, HOUR_MS);
    chart.dataset.history = String(samples.length - 1); // the minutes' samples, "now" apart
    const hourAgo = samples.find((s) => s.t >= now.t - HOUR_MS) || now;
    const minutes = Math.max(1, (now.t - hourAgo.t) / 60000);
    const rate = (field) => ((now[field] - hourAgo[field]) / minutes).toFixed(1);
    document.getElementById("history-rates").textContent =
      `· put ${rate("enqueued")}/min, acked ${rate("acked")}/min over ${Math.round(minutes)} min`;
  }

  function showQueueCounts(stats) {
    const counts = document.getElementById("queue-counts");
    if (!counts || !stats) return;
    const parts = ["ready", "delayed", "reserved", "dead_lettered"].map((k) => `${k} ${stats[k]}`);
    counts.textContent = parts.join(" · ");
  }

  // the queue's counts as the list's watch brings them (app.js)
  dash.onQueueValue = (name, value) => {
    if (name !== view.queue || !value) return;
    view.paused = Boolean(value.paused);
    showPaused();
    showQueueCounts(value);
  };

  function showPaused() {
    const badge = document.getElementById("paused-badge");
    const button = document.getElementById("pause");
    if (!badge || !button) return;
    badge.textContent = view.paused ? "paused" : "taking";
    badge.className = `badge ${view.paused ? "warn" : "ok"}`;
    button.textContent = view.paused ? "Resume" : "Pause";
  }

  async function togglePause(name) {
    const verb = view.paused ? "resume" : "pause";
    const doc = await act(verb, () => dash.request("POST", `${q(name)}/${verb}`));
    if (doc) {
      view.paused = doc.paused;
      showPaused();
    }
  }

  async function purgeQueue(name) {
    const typed = window.prompt(`Purge deletes every message of ${name}. Type the queue's name to go on:`);
    if (typed !== name) {
      problem(typed === null ? null : `purge: "${typed}" is not ${name}; nothing was purged`);
      return;
    }
    const doc = await act("purge", () => dash.request("POST", `${q(name)}/purge`));
    if (doc) {
      document.getElementById("redrive-progress").textContent = `purged ${doc.purged}`;
      view.cursors = [null];
      await showPage();
    }
  }

  // The settings a queue may change after creation: an input each (a standard queue's
  // "fair": a checkbox); Save sends the changed ones (empty: null, no limit). The others are
  // shown.
  const EDITABLE = new Set([
    "visibility_timeout", "max_receives", "dead_letter_queue", "retention", "max_message_bytes",
    "delay", "idempotency_window", "max_messages", "take_rate", "put_rate", "max_in_flight",
  ]);

  function settingsForm(name, settings) {
    const table = el("table", { id: "settings", class: "kv" });
    const inputs = {};
    for (const [k, v] of Object.entries(settings)) {
      if (k === "meta") continue;
      const shown = v === null ? "" : String(v);
      let cell;
      if (k === "fair" && !settings.fifo) {
        inputs[k] = el("input", { type: "checkbox", "data-setting": k });
        inputs[k].checked = v === true;
        inputs[k].dataset.was = String(v === true);
        cell = el("td", {}, inputs[k]);
      } else if (EDITABLE.has(k)) {
        inputs[k] = el("input", { type: "text", value: shown, placeholder: "—", "data-setting": k });
        inputs[k].dataset.was = shown;
        cell = el("td", {}, inputs[k]);
      } else {
        cell = el("td", { "data-setting": k }, shown || "—");
      }
      table.append(el("tr", {}, el("th", {}, k), cell));
    }
    const save = el("button", { id: "save-settings", type: "button" }, "Save settings");
    save.onclick = async () => {
      const changes = {};
      for (const [k, input] of Object.entries(inputs)) {
        if (input.type === "checkbox") {
          if (String(input.checked) !== input.dataset.was) changes[k] = input.checked;
          continue;
        }
        const text = input.value.trim();
        if (text === input.dataset.was) continue;
        if (text === "") changes[k] = null;
        else if (k === "dead_letter_queue") changes[k] = text;
        else changes[k] = Number(text);
      }
      if (!Object.keys(changes).length) return;
      const doc = await act("settings", () => dash.request("PATCH", q(name), changes));
      if (doc) {
        for (const [k, input] of Object.entries(inputs)) {
          const v = doc.settings[k];
          if (input.type === "checkbox") {
            input.checked = v === true;
            input.dataset.was = String(v === true);
          } else {
            input.value = input.dataset.was = v === null ? "" : String(v);
          }
        }
        save.dataset.saved = String(Date.now());
      }
    };
    return el("div", {}, table, el("div", { class: "actions" }, save));
  }

  async function startRedrive(name, rate, to, ids) {
    const body = {};
    if (rate) body.rate = rate;
    if (to) body.to = to;
    if (ids) body.ids = ids;
    const doc = await act("redrive", () => dash.request("POST", `${q(name)}/redrive`, body));
    if (!doc) return;
    const here = view.queue; // the page it was started from
    const out = document.getElementById("redrive-progress");
    const follow = async () => {
      const task = await act("redrive", () => dash.getJson(`v1/tasks/${encodeURIComponent(doc.task)}`));
      if (!task) return;
      out.textContent = `${task.id}: ${task.done}/${task.total} ${task.state}`;
      out.dataset.state = task.state;
      if (task.state === "running" && view.queue === here) setTimeout(follow, 500);
      else if (view.queue === here) await showPage();
    };
    await follow();
  }

  // This queue's dead letters: its dead-letter queue's messages that name it as their source,
  // read a page of PAGE at a time from the cursor ``after`` until PAGE of them are found (or
  // SCAN_PAGES were read: "Next page" goes on from there).
  async function deadLettered(name, dlq, after) {
    const messages = [];
    let next = after;
    for (let i = 0; i < SCAN_PAGES && messages.length < PAGE; i++) {
      const params = new URLSearchParams({ state: "ready", limit: String(PAGE) });
      if (next) params.set("after", next);
      const doc = await dash.getJson(`${q(dlq)}/messages?${params}`);
      messages.push(...doc.messages.filter((m) => (m.attributes || {})[SOURCE_QUEUE] === name));
      next = doc.next;
      if (!next) break;
    }
    return { messages, next };
  }

  async function showPage() {
    const name = view.queue;
    const after = view.cursors[view.cursors.length - 1];
    const dead = view.state === DEAD;
    const from = dead ? view.dlq : name; // the queue the listed messages are in
    const params = new URLSearchParams({ state: view.state, limit: String(PAGE) });
    if (after) params.set("after", after);
    const doc = await act("browse", () =>
      dead ? deadLettered(name, view.dlq, after) : dash.getJson(`${q(name)}/messages?${params}`),
    );
    if (!doc || name !== view.queue) return;
    const table = document.getElementById("messages");
    const when_ = view.state === "reserved" ? "lease expires" : "active at";
    const head = el("tr", {}, ...["", "id", "receives", when_, "body", "last failure"].map((h) => el("th", {}, h)));
    const rows = doc.messages.map((m) => {
      const time = view.state === "reserved" ? m.lease_expires_at : m.activate_at;
      const failure = m.failures && m.failures.length ? m.failures[m.failures.length - 1].reason : "";
      return el(
        "tr",
        { "data-message": m.id },
        el("td", { class: "pick" }, el("input", { type: "checkbox", value: m.id })),
        el("td", { class: "name" }, el("a", { href: link({ queue: from, message: m.id }) }, m.id)),
        el("td", {}, m.receive_count),
        el("td", {}, when(time)),
        el("td", { class: "body" }, preview(m)),
        el("td", { class: "failure" }, failure),
      );
    });
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    const pager = document.querySelector("#queue-view .pager");
    const page = view.cursors.length;
    const first = el("button", { id: "first-page", type: "button", disabled: page === 1 }, "First page");
    first.onclick = () => { view.cursors = [null]; showPage(); };
    const next = el("button", { id: "next-page", type: "button", disabled: !doc.next }, "Next page");
    next.onclick = () => { view.cursors.push(doc.next); showPage(); };
    const shown = el("span", { id: "page-number", class: "muted" }, `page ${page} · ${doc.messages.length} message(s)`);
    pager.replaceChildren(first, next, shown);
  }

  function preview(m) {
    if (m.body_b64 !== undefined) return `${atob(m.body_b64).length} bytes`;
    const text = String(m.body);
    return text.length > 80 ? `${text.slice(0, 80)}…` : text;
  }

  // ------------------------------------------------------------------ a message's page

  function bodyView(m) {
    if (m.body_b64 !== undefined) {
      const bytes = Array.from(atob(m.body_b64), (c) => c.charCodeAt(0));
      const lines = [];
      for (let i = 0; i < bytes.length; i += 16) {
        const hex = bytes.slice(i, i + 16).map((b) => b.toString(16).padStart(2, "0")).join(" ");
        lines.push(`${i.toString(16).padStart(8, "0")}  ${hex}`);
      }
      return { kind: "bytes", text: lines.join("\n") };
    }
    try {
      const doc = JSON.parse(m.body);
      if (doc !== null && typeof doc === "object") return { kind: "json", text: JSON.stringify(doc, null, 2) };
    } catch (e) {
      // not JSON: text
    }
    return { kind: "text", text: m.body };
  }

  async function showMessage(name, id) {
    view.queue = name;
    const box = document.getElementById("queue-view");
    const m = await act("message", () => dash.getJson(`${q(name)}/messages/${encodeURIComponent(id)}`));
    const back = el("a", { href: link({ queue: name }), class: "back" }, name);
    const title = el("h2", {}, el("a", { href: link({}), class: "back" }, "queues"), " / ", back, " / ", id);
    if (!m) {
      box.replaceChildren(title, el("p", { class: "muted" }, "no such message (taken and acked, or deleted)"));
      return;
    }
    const body = bodyView(m);
    const fields = [
      ["state", m.state],
      ["activate at", when(m.activate_at)],
      ["enqueued at", when(m.enqueued_at)],
      ["receive count", m.receive_count],
      ["lease expires", when(m.lease_expires_at)],
      ["group", m.group || "—"],
    ];
    const table = el("table", { id: "message-fields", class: "kv" });
    for (const [k, v] of fields) table.append(el("tr", {}, el("th", {}, k), el("td", { "data-field": k }, String(v))));
    const attrs = el("table", { id: "attributes", class: "kv" });
    for (const [k, v] of Object.entries(m.attributes || {})) {
      attrs.append(el("tr", {}, el("th", {}, k), el("td", {}, typeof v === "string" ? v : JSON.stringify(v))));
    }
    const failures = el("ol", { id: "failures" });
    for (const f of m.failures || []) failures.append(el("li", {}, `${when(f.at)}: ${f.reason}`));
    const runNow = el("button", { id: "run-now", type: "button", disabled: m.state === "reserved" }, "Run now");
    runNow.onclick = async () => {
      const doc = await act("run now", () => dash.request("PATCH", `${q(name)}/messages/${encodeURIComponent(id)}`, { delay: 0 }));
      if (doc) await showMessage(name, id);
    };
    const del = el("button", { id: "delete", type: "button", class: "danger" }, m.state === "reserved" ? "Delete (force)" : "Delete");
    del.onclick = async () => {
      if (!window.confirm(`Delete message ${id} of ${name}?`)) return;
      const force = m.state === "reserved" ? "?force=true" : "";
      const done = await act("delete", () => dash.request("DELETE", `${q(name)}/messages/${encodeURIComponent(id)}${force}`));
      if (done !== undefined) location.hash = link({ queue: name, state: m.state });
    };
    const edit = el("div", { class: "edit" });
    if (body.kind !== "bytes") {
      const area = el("textarea", { id: "new-body", rows: 6 });
      area.value = m.body;
      const save = el("button", { id: "save-body", type: "button", disabled: m.state === "reserved" }, "Save body");
      save.onclick = async () => {
        const doc = await act("edit", () => dash.request("PATCH", `${q(name)}/messages/${encodeURIComponent(id)}`, { body: area.value }));
        if (doc) await showMessage(name, id);
      };
      edit.append(area, el("div", { class: "actions" }, save));
    }
    box.replaceChildren(
      title,
      el("div", { class: "actions" }, runNow, del),
      table,
      el("h3", {}, `Body (${body.kind})`),
      el("pre", { id: "body", "data-kind": body.kind }, body.text),
      edit,
      el("h3", {}, "Attributes"),
      attrs,
      el("h3", {}, "Failures"),
      m.failures && m.failures.length ? failures : el("p", { class: "muted" }, "none"),
    );
  }

  // ------------------------------------------------------------------ the cluster page

  // The shards (their state, queues and recovery) and the gateways that serve: GET
  // v1/admin/shards and v1/status (whose gateways are those that published themselves in
  // the shards' store lately: gateway/presence.py). A running resize or restart shows its
  // task's progress. Read-only: resizing stays with the CLI and the API.
  async function showCluster() {
    const box = document.getElementById("queue-view");
    box.replaceChildren(el("p", { class: "muted" }, "loading…"));
    const [shards, status] = await Promise.all([
      act("shards", () => dash.getJson("v1/admin/shards")),
      act("status", () => dash.getJson("v1/status")),
    ]);
    if (!shards || !status) return;
    const title = el("h2", {}, el("a", { href: link({}), class: "back" }, "queues"), " / cluster");
    const gateways = status.gateways || [];
    let text = `${shards.count} shard(s) · map generation ${shards.generation} · ${gateways.length} gateway(s)`;
    const moving = shards.moves || shards.restarted;
    if (shards.task) text += ` · task ${shards.task} running${moving ? ` (${moving.done}/${moving.total})` : ""}`;
    const summary = el("p", { id: "cluster-summary", class: "muted" }, text);

    const recovered = new Map(status.shards.map((s) => [s.index, s]));
    const shardRows = shards.shards.map((s) => {
      const st = recovered.get(s.index) || {};
      const names = el("td", { class: "name" });
      for (const name of s.queues.slice(0, 8)) {
        names.append(el("a", { href: link({ queue: name }) }, name), " ");
      }
      if (s.queues.length > 8) names.append(`… ${s.queues.length - 8} more`);
      const reports = (st.reports || []).length;
      const damaged = (st.reports || []).filter((r) => !r.clean).length;
      return el(
        "tr",
        { "data-shard": s.index, "data-state": s.state },
        el("td", {}, s.index),
        el("td", {}, el("span", { class: `badge ${s.state === "ready" ? "ok" : "warn"}` }, s.state)),
        el("td", { "data-field": "queues" }, s.queues.length),
        el("td", {}, st.recovering ? `${st.recovering} recovering` : "—"),
        el("td", {}, st.log ? `${st.log.records} records, ${st.log.duration_ms} ms` : "—"),
        el("td", {}, `${reports} report(s)${damaged ? `, ${damaged} damaged` : ""}`),
        el("td", {}, s.reason || ""),
        names,
      );
    });
    const shardTable = el(
      "table",
      { id: "cluster-shards" },
      el("thead", {}, el("tr", {}, ...["shard", "state", "queues", "recovery", "log replay", "reports", "reason"].map((h) => el("th", {}, h)), el("th", { class: "name" }, "holds"))),
      el("tbody", {}, ...shardRows),
    );

    const gatewayRows = gateways.map((g) =>
      el(
        "tr",
        { "data-gateway": g.id, class: g.self ? "self" : "" },
        el("td", { class: "name" }, g.listen || "—", g.self ? " (this one)" : ""),
        el("td", {}, g.host),
        el("td", {}, g.pid),
        el("td", { "data-field": "processes" }, g.processes),
        el("td", { "data-field": "watchers" }, g.watchers),
        el("td", {}, g.requests_in_flight),
        el("td", {}, when(g.started_at)),
        el("td", {}, `${g.last_seen_s} s ago`),
        el("td", { class: "name" }, g.id),
      ),
    );
    const gatewayTable = el(
      "table",
      { id: "cluster-gateways" },
      el("thead", {}, el("tr", {}, ...["listens", "host", "pid", "processes", "watchers", "in flight", "up since", "seen", "id"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...gatewayRows),
    );
    box.replaceChildren(
      title,
      summary,
      el("h3", {}, "Shards"),
      shardTable,
      el("h3", {}, "Gateways"),
      gatewayTable,
      el("p", { class: "muted" }, "Each shard's recovery report, queue by queue, is on the queues page under Recovery."),
    );
  }

  // ------------------------------------------------------------------ routing

  async function render() {
    document.body.dataset.rendered = ""; // set again once this view is drawn
    if (view.timer !== null) {
      clearInterval(view.timer); // a queue's chart is read again only while its page shows
      view.timer = null;
    }
    const r = route();
    const list = document.getElementById("list-view");
    const box = document.getElementById("queue-view");
    const other = Boolean(r.queue || r.cluster);
    list.hidden = other;
    box.hidden = !other;
    document.body.dataset.view = r.message ? "message" : r.queue ? "queue" : r.cluster ? "cluster" : "list";
    if (!other) {
      view.queue = null;
      document.body.dataset.rendered = location.hash;
      return;
    }
    if (!r.queue) {
      view.queue = null;
      await showCluster();
    } else if (r.message) await showMessage(r.queue, r.message);
    else await showQueue(r.queue, r.state);
    document.body.dataset.rendered = location.hash;
  }

  dash.render = render;
  document.getElementById("cluster-link").href = link({ cluster: "1" }); // the token kept
  window.addEventListener("hashchange", render);
  render();
})();
