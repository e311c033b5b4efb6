// The Field console: plain JavaScript, no build step, nothing loaded from elsewhere.
//
// Two streams, both read with fetch() so that the token travels in the Authorization
// header (never in a URL), each reconnecting by itself:
//   * GET /v1/console/stream: a "snapshot" event once a second and on every change;
//   * the signed-in agent's subscription named "console" (all events, its own included),
//     read over its SSE stream and resumed from the last cursor after a break.
// The token lives in this tab's sessionStorage only. Everything the Field sends is shown
// with textContent: nothing it says is ever parsed as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "field.console.token";
  const EVENTS = [
    "memory.recorded", "memory.superseded", "memory.contested", "conflict.detected",
    "conflict.resolved", "task.state_changed", "task.assigned", "task.completed",
    "handoff.incoming", "agent.joined", "agent.failed", "session.paused", "session.ended",
  ];
  const MAX_EVENTS = 300;
  const AUTHORITY = { 10: "operator", 8: "session creator", 6: "senior", 4: "standard", 2: "observer", 0: "audit" };

  const $ = (id) => document.getElementById(id);

  /** An element with attributes (a "class" string, "title", "data-*"...) and children
   *  (strings become text nodes, never HTML). */
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const wait = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const backoff = (attempt) => Math.min(15000, 500 * 2 ** attempt) * (0.5 + Math.random() / 2);

  /** The signed-in session (null when signed out). */
  let session = null;
  /** Notifications received, newest first. */
  let events = [];
  let filter = "";
  let conflictsKey = "";

  // -- streams -------------------------------------------------------------------------

  class HttpError extends Error {
    constructor(status, body) {
      super((body && body.message) || `HTTP ${status}`);
      this.status = status;
      this.body = body;
    }
  }

  /** Read a text/event-stream response, calling onEvent(name, data) for each event. */
  async function readStream(s, url, onEvent) {
    const controller = new AbortController();
    s.controllers.add(controller);
    try {
      const response = await fetch(url, {
        headers: { Authorization: `Bearer ${s.token}`, Accept: "text/event-stream" },
        cache: "no-store",
        signal: controller.signal,
      });
      if (!response.ok) {
        throw new HttpError(response.status, await response.json().catch(() => null));
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
          const parsed = parseEvent(block);
          if (parsed && s.alive) onEvent(parsed.name, parsed.data);
        }
      }
    } finally {
      s.controllers.delete(controller);
    }
  }

  function parseEvent(block) {
    let name = "message";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
    }
    return data.length ? { name, data: data.join("\n") } : null;
  }

  /** An operation as the signed-in agent (or the operator), POSTed as an envelope. */
  async function operation(s, name, payload) {
    s.sequence += 1;
    const envelope = {
      protocol: "akashik", version: "0.1.0", id: `console-${Date.now()}-${s.sequence}`,
      operation: name, agent_id: s.viewer.id, session_id: null, epoch: s.epoch, payload,
    };
    const response = await fetch(`/v1/${name.toLowerCase()}`, {
      method: "POST",
      headers: { Authorization: `Bearer ${s.token}`, "Content-Type": "application/json" },
      body: JSON.stringify(envelope),
    });
    const body = await response.json().catch(() => null);
    if (!response.ok) throw new HttpError(response.status, body);
    if (body && Number.isInteger(body.epoch)) s.epoch = Math.max(s.epoch, body.epoch);
    return body;
  }

  /** Read snapshots until signed out; resolves with the first one, rejects if the first
   *  connection is refused. */
  function followSnapshots(s) {
    return new Promise((resolve, reject) => {
      let first = true;
      let attempt = 0;
      const run = async () => {
        while (s.alive) {
          try {
            await readStream(s, "/v1/console/stream", (name, data) => {
              if (name === "snapshot") {
                const snapshot = JSON.parse(data);
                attempt = 0;
                setLink("snapshots", "live");
                if (first) {
                  first = false;
                  resolve(snapshot);
                }
                render(s, snapshot);
              }
              // "end", "shutdown": the stream is over (the token is no longer valid, or
              // the server stops); reconnecting tells which: a refused token signs out
            });
          } catch (error) {
            if (first) return reject(error);
            if (!s.alive) return;
            if (error.status === 401) return signOut(`Signed out: ${error.message}.`);
          }
          if (first) return reject(new Error("the Field closed the console stream"));
          if (!s.alive) return;
          setLink("snapshots", "reconnecting");
          await wait(backoff(attempt++));
        }
      };
      run();
    });
  }

  /** Subscribe (by name: the same subscription every time) and read its stream until
   *  signed out, resuming from the last cursor after a break. */
  async function followEvents(s) {
    let attempt = 0;
    while (s.alive) {
      try {
        if (!s.subscription) {
          const answer = await operation(s, "SUBSCRIBE", {
            action: "subscribe",
            subscription: { name: "console", events: EVENTS, include_own: true },
          });
          s.subscription = answer.subscription_id;
          s.cursor = null;  // from now on: what happened before signing in is not shown
        }
        const since = s.cursor ? `?since=${encodeURIComponent(s.cursor)}` : "";
        const url = `/v1/subscriptions/${encodeURIComponent(s.subscription)}/events${since}`;
        await readStream(s, url, (name, data) => {
          const body = JSON.parse(data);
          if (name === "resume" || name === "live") {
            attempt = 0;
            setLink("events", "live");
            if (name === "resume" && body.recovered === false) note(`Resumed live: ${body.reason}`);
          } else if (name === "end") {
            s.subscription = null;  // cancelled or expired: subscribe again
          } else if (name === "overflow") {
            const cursor = body.cursors && body.cursors[s.subscription];
            if (cursor) s.cursor = cursor;
          } else if (name === "shutdown") {
            if (body.cursor) s.cursor = body.cursor;  // the server stops: resume there
          } else if (name !== "message" && body.subscription_id === s.subscription) {
            s.cursor = body.cursor;
            addEvent(body);
          }
        });
      } catch (error) {
        if (!s.alive) return;
        if (error.status === 401) return signOut(`Signed out: ${error.message}.`);
        const code = error.body && error.body.code;
        if (code === "SUBSCRIPTION_NAME_TAKEN") {
          setLink("events", "off");
          return note("This agent already has another subscription named “console”; " +
            "unsubscribe it to see events here.", true);
        }
        if (["SUBSCRIPTION_NOT_FOUND", "INVALID_TRANSITION", "FORBIDDEN"].includes(code)) {
          s.subscription = null;
        }
        note(`Events: ${error.message}`, true);
      }
      if (!s.alive) return;
      setLink("events", "reconnecting");
      await wait(backoff(attempt++));
    }
  }

  // -- signing in and out ---------------------------------------------------------------

  async function signIn(token) {
    if (!token) return signInError("Paste a token first.");
    if (session) signOut();
    const s = {
      token, alive: true, controllers: new Set(), viewer: null, epoch: 0, sequence: 0,
      subscription: null, cursor: null,
    };
    session = s;
    $("signin-button").disabled = true;
    setLink("snapshots", "connecting");
    let snapshot;
    try {
      snapshot = await followSnapshots(s);
    } catch (error) {
      s.alive = false;
      if (session === s) session = null;
      setLink("snapshots", "off");
      if (error.status === 401) sessionStorage.removeItem(TOKEN_KEY);
      signInError(`Not signed in: ${error.message}`);
      return;
    } finally {
      $("signin-button").disabled = false;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    signInError("");
    $("signin").hidden = true;
    $("console").hidden = false;
    $("signout").hidden = false;
    s.viewer = snapshot.viewer;
    followEvents(s);
  }

  function signOut(message) {
    const s = session;
    session = null;
    sessionStorage.removeItem(TOKEN_KEY);
    if (s) {
      s.alive = false;
      for (const controller of s.controllers) controller.abort();
    }
    events = [];
    conflictsKey = "";
    $("events").replaceChildren();
    $("console").hidden = true;
    $("signout").hidden = true;
    $("signin").hidden = false;
    $("who").textContent = "";
    setLink("snapshots", "off");
    setLink("events", "off");
    signInError(typeof message === "string" ? message : "");
  }

  function signInError(text) {
    $("signin-error").textContent = text;
  }

  function setLink(which, state) {
    const pill = $(`link-${which}`);
    pill.textContent = `${which}: ${state}`;
    pill.className = `pill ${state === "live" ? "live" : state === "off" ? "" : "trouble"}`;
  }

  function note(text, bad) {
    const line = $("events-note");
    line.textContent = text;
    line.className = bad ? "note bad" : "note";
  }

  // -- rendering a snapshot --------------------------------------------------------------

  function render(s, snapshot) {
    s.viewer = snapshot.viewer;
    const field = snapshot.field;
    s.epoch = Math.max(s.epoch, field.epoch);
    const v = snapshot.viewer;
    $("who").textContent = v.operator
      ? "signed in as the operator (authority 10)"
      : `signed in as ${v.id} · ${v.role} · authority ${v.authority} (${AUTHORITY[v.authority] || "custom"})`;
    renderField(field, snapshot.agents);
    renderActivity(snapshot.history, Date.parse(snapshot.at) / 1000);
    renderAgents(snapshot.agents);
    renderConflicts(s, snapshot.conflicts, v);
    renderSubscriptions(snapshot.subscriptions, v);
  }

  function renderField(field, agents) {
    $("s-field-id").textContent = field.field_id;
    $("s-epoch").textContent = number(field.epoch);
    $("s-position").textContent = number(field.log.last_position);
    $("s-level").textContent = field.conformance_level;
    $("s-uptime").textContent = duration(field.uptime_seconds);
    $("s-log").textContent = field.log.writable
      ? `${field.log.backend}, writable`
      : `${field.log.backend}, refusing writes: ${field.log.refusing.message}`;
    const failed = agents.by_status.failed || 0;
    $("s-agents").textContent = `${number(agents.total)}${failed ? ` (${failed} failed)` : ""}`;
    const units = Object.entries(field.counts.memory_units).map(([k, n]) => `${number(n)} ${k}`);
    $("s-units").textContent = units.length ? units.join(", ") : "none";
    const conflicts = field.counts.conflicts;
    $("s-conflicts").textContent = `${number(conflicts.unresolved)} of ${number(conflicts.total)}`;
    $("s-queue").textContent = number(field.writer.queued);
  }

  function renderActivity(history, now) {
    const last = history[history.length - 1];
    $("c-ops").textContent = last ? last.operations_per_s.toFixed(1) : "–";
    $("c-op-latency").textContent = last && last.operation_latency_ms
      ? `answered in ${last.operation_latency_ms.mean.toFixed(2)} ms on average` : "";
    // no batch committed in the last second: nothing was delivered, nothing to time
    $("c-latency").textContent = !last ? "–"
      : last.delivery_latency_ms ? last.delivery_latency_ms.mean.toFixed(2) : "idle";
    sparkline($("chart-ops"), history, now, (p) => p.operations_per_s);
    sparkline($("chart-latency"), history, now, (p) => (p.delivery_latency_ms ? p.delivery_latency_ms.mean : 0));
  }

  /** One bar a second over the last 120 (the newest on the right, a second with no sample
   *  left empty), scaled to the largest; one path for all of them. */
  function sparkline(svg, samples, now, value) {
    const width = 300;
    const height = 60;
    const step = width / 120;
    const values = samples.map(value);
    const top = Math.max(1e-9, ...values);
    let d = "";
    samples.forEach((sample, i) => {
      const x = width - Math.max(1, Math.round(now - sample.t)) * step;
      const bar = values[i] > 0 ? Math.max(1, (values[i] / top) * (height - 4)) : 0;
      if (x >= 0) d += `M${x.toFixed(2)} ${height}v${(-bar).toFixed(2)}h${(step * 0.8).toFixed(2)}v${bar.toFixed(2)}z`;
    });
    const ns = "http://www.w3.org/2000/svg";
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", d);
    const title = document.createElementNS(ns, "title");
    title.textContent = `one bar a second; the highest is ${top.toFixed(2)}`;
    svg.replaceChildren(...(samples.length ? [title, path] : []));
  }

  function renderAgents(agents) {
    $("agents-count").textContent = agents.total > agents.listed.length
      ? `${agents.listed.length} of ${number(agents.total)} shown` : `${number(agents.total)}`;
    const rows = agents.listed.map(({ agent: a, connections }) => h("tr", { "data-agent": a.id },
      h("td", { "data-label": "Agent" }, h("code", {}, a.id)),
      h("td", { "data-label": "Role" }, a.role),
      h("td", { "data-label": "Status" },
        h("span", { class: `badge ${a.status}` }, a.status),
        a.failure_reason ? h("div", { class: "reason" }, a.failure_reason) : null),
      h("td", { "data-label": "Authority" }, `${a.authority} · ${AUTHORITY[a.authority] || "custom"}`),
      h("td", { "data-label": "Connections" }, kinds(connections) || "none")));
    $("agents").replaceChildren(...(rows.length ? rows : [emptyRow(5, "No agent is registered yet.")]));
  }

  function renderConflicts(s, conflicts, viewer) {
    $("conflicts-count").textContent = `${number(conflicts.open)}`;
    $("merge-help").textContent = viewer.may_merge
      ? "Resolve a conflict by keeping one unit (strategy “authority”: the other is superseded), " +
        "or escalate it to the operator."
      : "Resolving conflicts needs authority 6 or more; you can watch them here.";
    $("rationale-label").hidden = !viewer.may_merge;
    const key = JSON.stringify([viewer.id, viewer.may_merge,
      conflicts.listed.map(({ conflict: c }) => [c.id, c.status])]);
    if (key === conflictsKey) return;  // unchanged: keep the buttons under the pointer
    conflictsKey = key;
    const items = conflicts.listed.map((c) => conflictItem(s, c, viewer));
    $("conflicts").replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "No open conflict.")]));
  }

  function conflictItem(s, { conflict: c, units }, viewer) {
    // escalated conflicts are resolved by the operator alone
    const mayResolve = viewer.may_merge && (c.status !== "escalated" || viewer.operator);
    const unit = (key, label) => {
      const u = units[key];
      if (!u) return h("div", { class: "unit" }, h("p", { class: "meta" }, `${label}: ${c[key]} (gone)`));
      const confidence = typeof u.confidence === "number" ? `, confidence ${u.confidence}` : "";
      return h("div", { class: "unit" },
        h("p", { class: "meta" }, `${label} · ${u.type} by ${u.agent_id}${confidence} · ${u.status}`),
        h("p", {}, u.content),
        mayResolve ? h("button", {
          type: "button", class: "keep", "data-keep": key, title: `Resolve: keep ${u.id}, supersede the other`,
          onclick: (e) => merge(s, c, "authority", u.id, e.currentTarget),
        }, `Keep ${label}`) : null);
    };
    return h("li", { class: "conflict", "data-conflict": c.id },
      h("div", { class: "conflict-head" },
        h("strong", {}, c.type), h("span", { class: `badge ${c.status}` }, c.status), h("code", {}, c.id)),
      h("p", { class: "summary" }, c.description),
      h("div", { class: "units" }, unit("unit_a", "A"), unit("unit_b", "B")),
      viewer.may_merge && c.status !== "escalated" ? h("div", { class: "actions" },
        h("button", {
          type: "button", class: "secondary escalate", title: "Hand the decision to the operator",
          onclick: (e) => merge(s, c, "human_escalation", null, e.currentTarget),
        }, "Escalate")) : null,
      c.status === "escalated" && !viewer.operator
        ? h("p", { class: "hint" }, "Escalated: the operator decides.") : null);
  }

  async function merge(s, conflict, strategy, winner, button) {
    const result = $("merge-result");
    const typed = $("rationale").value.trim();
    const rationale = typed || (winner
      ? `Resolved in the console by ${s.viewer.id}: kept ${winner}.`
      : `Escalated in the console by ${s.viewer.id}.`);
    const resolution = winner ? { rationale, winner_id: winner } : { rationale };
    button.disabled = true;
    try {
      const answer = await operation(s, "MERGE", { conflict_id: conflict.id, strategy, resolution });
      result.className = "note";
      result.textContent = `${conflict.id}: ${answer.status}.`;
      $("rationale").value = "";
    } catch (error) {
      result.className = "note bad";
      result.textContent = `${conflict.id}: ${error.message}`;
      button.disabled = false;
    }
  }

  function renderSubscriptions(subscriptions, viewer) {
    const shown = subscriptions.listed.length;
    $("subscriptions-count").textContent = subscriptions.total > shown
      ? `${shown} of ${number(subscriptions.total)} shown`
      : `${number(subscriptions.total)}${viewer.operator ? "" : " of yours"}`;
    const rows = subscriptions.listed.map((item) => {
      const sub = item.subscription;
      return h("tr", { "data-subscription": sub.id },
        h("td", { "data-label": "Subscription", title: sub.id }, sub.name || h("code", {}, sub.id)),
        h("td", { "data-label": "Agent" }, sub.agent_id),
        h("td", { "data-label": "Events", title: sub.events.join(", ") },
          sub.events.length === EVENTS.length ? "all" : sub.events.join(", ")),
        h("td", { "data-label": "Readers" }, kinds(item.readers) || "none"),
        h("td", { "data-label": "Lag", class: "lag" }, item.lag === null ? "–" : number(item.lag)),
        h("td", { "data-label": "Outbox" }, number(item.outbox)),
        h("td", { "data-label": "Delivery" }, delivery(sub, item.replaying)));
    });
    $("subscriptions").replaceChildren(...(rows.length ? rows : [emptyRow(7, "No active subscription.")]));
  }

  function delivery(sub, replaying) {
    const d = sub.delivery;
    if (!d) return replaying ? "stream (replaying)" : "stream";
    return [
      `${d.type} `, h("span", { class: `badge ${d.state}` }, d.state),
      d.last_error ? h("div", { class: "reason" }, d.last_error) : null,
    ];
  }

  // -- events ---------------------------------------------------------------------------

  function addEvent(notification) {
    notification.received = new Date();
    events.unshift(notification);
    if (events.length > MAX_EVENTS) events.length = MAX_EVENTS;
    const list = $("events");
    if (!filter || notification.event === filter) {
      list.prepend(eventItem(notification));
      while (list.childElementCount > MAX_EVENTS) list.lastElementChild.remove();
    }
    countEvents();
  }

  function renderEvents() {
    const shown = events.filter((n) => !filter || n.event === filter);
    $("events").replaceChildren(...shown.map(eventItem));
    countEvents();
  }

  function countEvents() {
    $("events-count").textContent = `${$("events").childElementCount} shown`;
  }

  function eventItem(n) {
    const score = Number(n.relevance_score);
    return h("li", { class: "event", "data-event": n.event },
      h("div", { class: "event-head" },
        h("span", { class: "event-name" }, n.event),
        h("span", { class: "score", title: "Relevance to you, from 0 to 1" },
          h("meter", { min: 0, max: 1, value: score }), ` ${score.toFixed(2)}`),
        n.requires_action ? h("span", { class: "action", title: "You are expected to act on it" }, "action needed") : null,
        h("time", { datetime: n.received.toISOString() }, n.received.toLocaleTimeString())),
      h("p", { class: "summary" }, n.summary),
      h("p", { class: "why", title: "Why the Field finds it relevant" }, n.relevance_reason),
      h("p", { class: "why" }, `by ${n.agent_id || "the Field"} · epoch ${n.epoch}`));
  }

  // -- small things ---------------------------------------------------------------------

  function emptyRow(columns, text) {
    return h("tr", {}, h("td", { colspan: columns, class: "empty" }, text));
  }

  function kinds(counts) {
    const names = { ws: "WebSocket", sse: "SSE", mcp: "MCP" };
    return Object.entries(counts || {}).map(([k, n]) => `${names[k] || k} ${n}`).join(", ");
  }

  function number(n) {
    return typeof n === "number" ? n.toLocaleString("en") : "–";
  }

  function duration(seconds) {
    const s = Math.floor(seconds);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function start() {
    const select = $("event-filter");
    for (const name of EVENTS) select.append(h("option", { value: name }, name));
    select.addEventListener("change", () => {
      filter = select.value;
      renderEvents();
    });
    $("signin-form").addEventListener("submit", (event) => {
      event.preventDefault();
      signIn($("token").value.trim());
    });
    $("signout").addEventListener("click", () => signOut());
    const kept = sessionStorage.getItem(TOKEN_KEY);
    if (kept) signIn(kept);
  }

  start();
})();
