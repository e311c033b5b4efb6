// The Field console: plain JavaScript, no build step, nothing loaded from elsewhere.
//
// Two streams, both read with fetch() so that the token travels in the Authorization
// header (never in a URL), each reconnecting by itself:
//   * GET /v1/console/stream: a "snapshot" event once a second and on every change;
//   * the signed-in agent's subscription named "console" (all events, its own included),
//     read over its SSE stream and resumed from the last cursor after a break.
// The recent past is read from the log: for the operator, from GET /v1/events (the log
// from its start, see loadOlderFromLog); for an agent, through that same subscription: a
// second SSE stream of it, resumed from an earlier cursor, read up to where the live stream
// began and then dropped (see loadOlder). Cursors keep the past and the live stream apart.
// Every id is a link to a view built from a read the API allows (GET /v1/agents,
// GET /v1/conflicts, REPLAY, SUBSCRIBE list, the snapshot); every action is the API's own
// operation, sent with the signed-in token after a confirmation.
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
  /** Most events the list holds (older ones are dropped, and can be read again). */
  const MAX_EVENTS = 1000;
  /** Events one page of the past holds (at sign-in, and at each "Older events"). */
  const HISTORY_PAGE = 50;
  /** Log positions the first read of the past goes back; each further read doubles it. */
  const HISTORY_WINDOW = 200;
  /** Reads one page of the past makes at most (the last goes back 200 × 2^11 positions). */
  const HISTORY_READS = 12;
  /** Seconds of rate samples the page keeps for its charts (the longest window). */
  const KEEP_SECONDS = 3600;
  const CONFLICT_STATUSES = "detected,resolving,escalated,resolved";
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
    for (const child of children.flat(Infinity)) {
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
  /** The latest snapshot (the detail views read it). */
  let latest = null;
  /** Rate samples by time (Unix seconds), kept for KEEP_SECONDS: the charts' data. */
  const samples = new Map();
  /** The Field's last hour in samples of HOUR_STEP seconds (GET /v1/console/history), by
   *  the time each step ended: the longer windows' data before the one-second samples. */
  const hour = new Map();
  /** Seconds one sample of the hour covers, and between two reads of it. */
  const HOUR_STEP = 10;

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
      controller.abort();  // a reader that stopped early lets the stream go at once
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

  /** A request to one of the Field's other endpoints (GET lists, the operator's tokens and
   *  sources), with the signed-in token; the JSON body it answers. */
  async function api(s, method, path, body) {
    const headers = { Authorization: `Bearer ${s.token}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const answer = await response.json().catch(() => null);
    if (!response.ok) throw new HttpError(response.status, answer);
    return answer;
  }

  /** A cursor's log position (cursors are "<field tag>-<position>"), or null. */
  function position(cursor) {
    const match = /-(\d+)$/.exec(cursor || "");
    return match ? Number(match[1]) : null;
  }

  function cursorAt(s, at) {
    return `${s.tag}-${at}`;
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
   *  signed out, resuming from the last cursor after a break. The first connection starts
   *  live at the end of the log; its "resume" frame says where, and the past is read up to
   *  there (loadOlder), so no event is in both. */
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
          s.cursor = null;
          // nothing before the subscription's creation is owed to it: the past starts there
          // (the operator reads the past from the log itself: it starts at the log's start)
          s.tag = answer.cursor.slice(0, answer.cursor.lastIndexOf("-"));
          s.created = s.viewer.operator ? 0 : position(answer.cursor);
        }
        const since = s.cursor ? `?since=${encodeURIComponent(s.cursor)}` : "";
        const url = `/v1/subscriptions/${encodeURIComponent(s.subscription)}/events${since}`;
        await readStream(s, url, (name, data) => {
          const body = JSON.parse(data);
          if (name === "resume" || name === "live") {
            attempt = 0;
            setLink("events", "live");
            if (name === "resume" && body.recovered === false) note(`Resumed live: ${body.reason}`);
            if (name === "resume" && !s.cursor) {
              s.cursor = body.from;
              if (s.before === null) {
                s.before = position(body.from) + 1;  // the past: everything up to "from"
                loadOlder(s);
              }
            }
          } else if (name === "end") {
            s.subscription = null;  // cancelled or expired: subscribe again
          } else if (name === "overflow") {
            const cursor = body.cursors && body.cursors[s.subscription];
            if (cursor) s.cursor = cursor;
          } else if (name === "shutdown") {
            if (body.cursor) s.cursor = body.cursor;  // the server stops: resume there
          } else if (name !== "message" && body.subscription_id === s.subscription) {
            s.cursor = body.cursor;
            addEvent(s, body);
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

  /** One page of the past: the newest HISTORY_PAGE events before position s.before, read
   *  from the log by streams of the console subscription resumed from earlier and earlier
   *  cursors (each read from "after" stops at s.before, or where the log ends). */
  async function loadOlder(s) {
    if (s.loading || !s.subscription || s.before === null || s.before <= s.created + 1) {
      return showHistory(s);
    }
    s.loading = true;
    s.historyError = "";
    showHistory(s);
    if (s.viewer.operator) return loadOlderFromLog(s);
    const found = [];
    let window = HISTORY_WINDOW;
    let before = s.before;
    let reads = 0;
    try {
      while (s.alive && reads++ < HISTORY_READS) {
        const after = Math.max(s.created, before - window);
        found.unshift(...(await readPast(s, after, before)));
        before = after + 1;  // read: every position above "after"
        if (found.length >= HISTORY_PAGE || after <= s.created) break;
        window *= 2;  // not enough yet: the stretch below, twice as long
      }
      if (!s.alive) return;
      const kept = found.slice(-HISTORY_PAGE);
      // what was read and not kept is read again by the next page
      s.before = found.length > HISTORY_PAGE ? position(kept[0].cursor) : before;
      addPast(s, kept);
    } catch (error) {
      s.historyError = `The past could not be read: ${error.message}`;
    } finally {
      s.loading = false;
      if (s.alive) showHistory(s);
    }
  }

  /** The operator's page of the past: GET /v1/events before position s.before, newest
   *  first, until a page is full or the log starts (each request reads a bounded stretch
   *  of the log, so a page may take a few). */
  async function loadOlderFromLog(s) {
    const found = [];
    let before = s.before;
    let reads = 0;
    try {
      while (s.alive && before > 1 && found.length < HISTORY_PAGE && reads++ < HISTORY_READS) {
        const page = await api(s, "GET",
          `/v1/events?limit=${HISTORY_PAGE - found.length}&before=${encodeURIComponent(cursorAt(s, before))}`);
        found.push(...page.events);
        before = page.next ? position(page.next) : 1;  // 1: nothing is before the log's start
      }
      if (!s.alive) return;
      s.before = before;
      addPast(s, found.reverse());
    } catch (error) {
      s.historyError = `The past could not be read: ${error.message}`;
    } finally {
      s.loading = false;
      if (s.alive) showHistory(s);
    }
  }

  /** The console subscription's notifications after position "after" and before "before",
   *  oldest first: its SSE stream resumed from that cursor, dropped once it passes "before"
   *  or goes live. */
  async function readPast(s, after, before) {
    const read = [];
    const url = `/v1/subscriptions/${encodeURIComponent(s.subscription)}/events` +
      `?since=${encodeURIComponent(cursorAt(s, after))}`;
    const done = new Error("read");
    try {
      await readStream(s, url, (name, data) => {
        const body = JSON.parse(data);
        if (name === "resume" && body.recovered === false) throw new Error(body.reason);
        if (name === "live" || name === "end" || name === "overflow" || name === "shutdown") throw done;
        if (name === "resume" || name === "message" || body.subscription_id !== s.subscription) return;
        if (position(body.cursor) >= before) throw done;
        read.push(body);
      });
    } catch (error) {
      if (error !== done) throw error;
    }
    return read;
  }

  function showHistory(s) {
    const button = $("events-older");
    const more = s.before !== null && s.before > s.created + 1;
    button.hidden = !more;
    button.disabled = Boolean(s.loading);
    button.textContent = s.loading ? "Reading the log…" : "Older events";
    $("history-note").className = s.historyError ? "note bad" : "note";
    $("history-note").textContent = s.loading ? ""
      : s.historyError ? s.historyError
      : more ? "Older events are in the log."
        : s.before === null ? ""
          : s.viewer && s.viewer.operator ? "That is everything since the log began."
            : "That is everything since this console first subscribed.";
  }

  // -- signing in and out ---------------------------------------------------------------

  async function signIn(token) {
    if (!token) return signInError("Paste a token first.");
    if (session) signOut();
    const s = {
      token, alive: true, controllers: new Set(), viewer: null, epoch: 0, sequence: 0,
      subscription: null, cursor: null, tag: "", created: 0, before: null, loading: false,
      historyError: "", seen: new Set(),
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
    $("operator-card").hidden = !s.viewer.operator;
    refreshOperator(s);
    renderEvents(s);
    followEvents(s);
    followHour(s);
    const linked = /^#(\w+)\/(.+)$/.exec(location.hash);
    if (linked && TITLES[linked[1]]) openDetail(s, linked[1], decodeURIComponent(linked[2]));
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
    latest = null;
    $("operator-card").hidden = true;
    for (const id of ["tokens", "sources"]) $(id).replaceChildren();
    for (const id of ["token-secret", "source-secret"]) {
      $(id).hidden = true;
      $(id).replaceChildren();
    }
    samples.clear();
    hour.clear();
    $("events").replaceChildren();
    $("events-older").hidden = true;
    $("history-note").textContent = "";
    closeDialogs();
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
    latest = snapshot;
    s.viewer = snapshot.viewer;
    const field = snapshot.field;
    s.epoch = Math.max(s.epoch, field.epoch);
    const v = snapshot.viewer;
    $("who").textContent = v.operator
      ? "signed in as the operator (authority 10)"
      : `signed in as ${v.id} · ${v.role} · authority ${v.authority} (${AUTHORITY[v.authority] || "custom"})`;
    renderField(field, snapshot.agents);
    keepSamples(snapshot.history);
    renderActivity(Date.parse(snapshot.at) / 1000);
    renderNodes(field);
    renderAgents(snapshot.agents);
    renderConflicts(s, snapshot.conflicts, v);
    renderSubscriptions(s, snapshot.subscriptions, v);
  }

  /** Every node of the Field this server knows of (the status's nodes), this one first. */
  function nodesOf(field) {
    const own = field.node;
    if (!own) return [];
    const nodes = field.nodes || [{ ...own, seen_seconds_ago: 0, live: true }];
    return [...nodes].sort((a, b) => (b.id === own.id) - (a.id === own.id) || (a.id < b.id ? -1 : 1));
  }

  function renderNodes(field) {
    const own = field.node;
    const nodes = nodesOf(field);
    if (!nodes.length) {
      $("nodes").replaceChildren(emptyRow(5, "This server does not say which node it is."));
      return;
    }
    $("nodes").replaceChildren(...nodes.map((n) => h("tr", { "data-node": n.id, class: n.live ? "" : "gone" },
      h("td", { "data-label": "Node" }, ref("node", n.id), n.id === own.id ? " (this server)" : ""),
      h("td", { "data-label": "Position" }, number(n.position)),
      h("td", { "data-label": "Lag", class: "lag" }, `${number(n.lag)} ${n.lag === 1 ? "entry" : "entries"}`),
      h("td", { "data-label": "Last heard" }, n.id === own.id ? "now" : n.live
        ? `${duration(n.seen_seconds_ago)} ago` : `not live (${duration(n.seen_seconds_ago)} ago)`),
      h("td", { "data-label": "Delivery lease" }, n.delivery_owner ? "held" : "not held",
        n.id === own.id ? ` · term ${own.delivery_term}` : ""))));
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

  /** Keep the snapshot's rate samples (the last two minutes) with those seen before, for
   *  KEEP_SECONDS: the longer windows show what this page has seen since it opened. */
  function keepSamples(history) {
    for (const sample of history) samples.set(sample.t, sample);
    const since = (history.length ? history[history.length - 1].t : Date.now() / 1000) - KEEP_SECONDS;
    for (const t of samples.keys()) {
      if (t < since) samples.delete(t);
      else break;  // a Map keeps its keys in insertion order: oldest first
    }
  }

  /** Read the Field's last hour of rates now and every HOUR_STEP seconds while signed in
   *  (the server samples them whether or not a console is open). */
  async function followHour(s) {
    while (s.alive) {
      try {
        const answer = await api(s, "GET", "/v1/console/history");
        hour.clear();
        for (const sample of answer.samples) hour.set(sample.t, { ...sample, step: answer.step_seconds });
        if (latest) renderActivity(Date.parse(latest.at) / 1000);
      } catch {
        // the next read tries again; the charts keep what the snapshots bring meanwhile
      }
      await new Promise((resolve) => setTimeout(resolve, HOUR_STEP * 1000));
    }
  }

  /** The one-second samples, and before the first of them the hour's: each of those as
   *  one sample a second over its step, so that every window's bars are alike. */
  function chartSamples() {
    const seconds = [...samples.values()].sort((a, b) => a.t - b.t);
    const first = seconds.length ? seconds[0].t : Infinity;
    const before = [];
    for (const sample of [...hour.values()].sort((a, b) => a.t - b.t)) {
      for (let k = sample.step - 1; k >= 0; k -= 1) {
        const t = sample.t - k;
        if (t < first) before.push({ ...sample, t });
      }
    }
    return [...before, ...seconds];
  }

  function renderActivity(now) {
    const all = chartSamples();
    const last = all.length && all[all.length - 1].t >= now - 2 ? all[all.length - 1] : null;
    $("c-ops").textContent = last ? `${last.operations_per_s.toFixed(1)} ops/s` : "–";
    $("c-op-latency").textContent = last && last.operation_latency_ms
      ? `answered in ${last.operation_latency_ms.mean.toFixed(2)} ms on average` : "";
    // no batch committed in the last second: nothing was delivered, nothing to time
    $("c-latency").textContent = !last ? "–"
      : last.delivery_latency_ms ? `${last.delivery_latency_ms.mean.toFixed(2)} ms` : "idle";
    const span = Number($("chart-window").value);
    const seen = all.length ? now - all[0].t : 0;
    $("chart-span").textContent = span > 120 && seen < span - 2 * HOUR_STEP
      ? `The Field has sampled for ${duration(seen)} since it started.` : "";
    chart("ops", all, now, span, (p) => p.operations_per_s, "ops/s");
    chart("latency", all, now, span, (p) => (p.delivery_latency_ms ? p.delivery_latency_ms.mean : null), "ms");
  }

  /** A bar chart of the last "span" seconds: one bar a second (a bucket of several seconds,
   *  their mean, for the longer windows), the newest on the right, a time with no sample left
   *  empty; the y axis from 0 to a round number at or above the highest bar. */
  function chart(name, all, now, span, value, unit) {
    const svg = $(`chart-${name}`);
    const width = 300;
    const height = 60;
    const bucket = Math.max(1, Math.ceil(span / 360));
    const slots = Math.ceil(span / bucket);
    const sums = new Map();
    for (const sample of all) {
      const age = now - sample.t;
      const v = value(sample);
      if (age < 0 || age > span || v === null) continue;
      const slot = Math.floor(age / bucket);
      const sum = sums.get(slot) || [0, 0];
      sums.set(slot, [sum[0] + v, sum[1] + 1]);
    }
    const bars = [...sums].map(([slot, [total, n]]) => [slot, total / n]);
    const top = niceCeiling(Math.max(0, ...bars.map(([, v]) => v)));
    const step = width / slots;
    let d = "";
    for (const [slot, v] of bars) {
      const x = width - (slot + 1) * step;
      const bar = v > 0 ? Math.max(1, (v / top) * height) : 0;
      if (x >= 0 && bar) d += `M${x.toFixed(2)} ${height}v${(-bar).toFixed(2)}h${(step * 0.8).toFixed(2)}v${bar.toFixed(2)}z`;
    }
    const ns = "http://www.w3.org/2000/svg";
    const grid = document.createElementNS(ns, "line");  // half way up the axis
    for (const [k, v] of Object.entries({ x1: 0, x2: width, y1: height / 2, y2: height / 2, class: "grid" })) {
      grid.setAttribute(k, String(v));
    }
    const title = document.createElementNS(ns, "title");
    title.textContent = `${bucket === 1 ? "one bar a second" : `one bar per ${bucket} s (their mean)`}; ` +
      `axis from 0 to ${axisNumber(top)} ${unit}, over the last ${duration(span)}`;
    const children = [title, grid];
    if (d) {
      const path = document.createElementNS(ns, "path");
      path.setAttribute("d", d);
      children.push(path);
    }
    svg.replaceChildren(...children);
    svg.setAttribute("aria-label", `${svg.getAttribute("aria-label").split(",")[0]}, last ${duration(span)}, up to ${axisNumber(top)} ${unit}`);
    $(`chart-${name}-max`).textContent = `${axisNumber(top)} ${unit}`;
    $(`chart-${name}-x`).replaceChildren(...[span, span / 2, 0].map((age) =>
      h("span", {}, age ? `−${age >= 60 ? `${age / 60} min` : `${age} s`}` : "now")));
  }

  /** The least of 1, 2, 5 × 10^k at or above v (1 for nothing). */
  function niceCeiling(v) {
    if (!(v > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 5, 10]) if (m * power >= v) return m * power;
    return 10 * power;
  }

  function axisNumber(v) {
    return v >= 1 ? number(v) : String(Number(v.toPrecision(2)));
  }

  function renderAgents(agents) {
    $("agents-count").textContent = agents.total > agents.listed.length
      ? `${agents.listed.length} of ${number(agents.total)} shown` : `${number(agents.total)}`;
    const rows = agents.listed.map(({ agent: a, connections }) => h("tr", { "data-agent": a.id },
      h("td", { "data-label": "Agent" }, ref("agent", a.id)),
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
        h("p", { class: "meta" }, `${label} · `, ref("unit", u.id), ` · ${u.type} by `, ref("agent", u.agent_id),
          `${confidence} · ${u.status}`),
        h("p", {}, u.content),
        mayResolve ? h("button", {
          type: "button", class: "keep", "data-keep": key, title: `Resolve: keep ${u.id}, supersede the other`,
          onclick: (e) => merge(s, c, "authority", u.id, e.currentTarget),
        }, `Keep ${label}`) : null);
    };
    return h("li", { class: "conflict", "data-conflict": c.id },
      h("div", { class: "conflict-head" },
        h("strong", {}, c.type), h("span", { class: `badge ${c.status}` }, c.status), ref("conflict", c.id)),
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

  function renderSubscriptions(s, subscriptions, viewer) {
    const shown = subscriptions.listed.length;
    $("subscriptions-count").textContent = subscriptions.total > shown
      ? `${shown} of ${number(subscriptions.total)} shown`
      : `${number(subscriptions.total)}${viewer.operator ? "" : " of yours"}`;
    const rows = subscriptions.listed.map((item) => {
      const sub = item.subscription;
      return h("tr", { "data-subscription": sub.id },
        h("td", { "data-label": "Subscription", title: sub.id }, ref("subscription", sub.id, sub.name || sub.id)),
        h("td", { "data-label": "Agent" }, ref("agent", sub.agent_id)),
        h("td", { "data-label": "Events", title: sub.events.join(", ") },
          sub.events.length === EVENTS.length ? "all" : sub.events.join(", ")),
        h("td", { "data-label": "Readers" }, kinds(item.readers) || "none"),
        h("td", { "data-label": "Lag", class: "lag" }, item.lag === null ? "–" : number(item.lag)),
        h("td", { "data-label": "Outbox" }, number(item.outbox)),
        h("td", { "data-label": "Delivery" }, delivery(sub, item.replaying)),
        h("td", { "data-label": "Actions", class: "actions" }, subscriptionActions(s, sub)));
    });
    const key = JSON.stringify(subscriptions.listed.map((i) => [i.subscription.id, i.readers, i.lag, i.outbox,
      i.replaying, i.subscription.delivery]));
    if (key === s.subscriptionsKey) return;  // unchanged: keep the buttons under the pointer
    s.subscriptionsKey = key;
    $("subscriptions").replaceChildren(...(rows.length ? rows : [emptyRow(8, "No active subscription.")]));
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

  /** A live notification: the newest. */
  function addEvent(s, notification) {
    if (s.seen.has(notification.cursor)) return;
    s.seen.add(notification.cursor);
    notification.received = new Date();
    events.unshift(notification);
    const list = $("events");
    if (!filter || notification.event === filter) list.prepend(eventItem(s, notification));
    trimEvents(s);
    countEvents();
  }

  /** Notifications read from the log, oldest first, all older than those shown. */
  function addPast(s, notifications) {
    const list = $("events");
    for (const n of notifications.slice().reverse()) {
      if (s.seen.has(n.cursor)) continue;
      s.seen.add(n.cursor);
      n.past = true;
      events.push(n);
      if (!filter || n.event === filter) list.append(eventItem(s, n));
    }
    trimEvents(s);
    countEvents();
  }

  /** Keep at most MAX_EVENTS, dropping the oldest (the next "Older events" reads them). */
  function trimEvents(s) {
    if (events.length <= MAX_EVENTS) return;
    for (const n of events.splice(MAX_EVENTS)) s.seen.delete(n.cursor);
    s.before = position(events[events.length - 1].cursor);
    renderEvents(s);
    showHistory(s);
  }

  function renderEvents(s) {
    const shown = events.filter((n) => !filter || n.event === filter);
    $("events").replaceChildren(...shown.map((n) => eventItem(s, n)));
    countEvents();
  }

  function countEvents() {
    const shown = $("events").childElementCount;
    $("events-count").textContent = shown === events.length
      ? `${shown} shown` : `${shown} of ${events.length} shown`;
  }

  /** Kinds of entity a notification names that have a view of their own. */
  const ENTITY_KIND = { memory_unit: "unit", conflict: "conflict", agent: "agent", task: "task", session: "session" };

  function eventItem(s, n) {
    // the operator has no role, interests or task: its relevance says nothing, so none is shown
    const relevant = s.viewer && !s.viewer.operator;
    const score = Number(n.relevance_score);
    const about = n.entity && ENTITY_KIND[n.entity.type]
      ? [n.entity.type.replace("_", " "), " ", ref(ENTITY_KIND[n.entity.type], n.entity.id)] : null;
    return h("li", { class: n.past ? "event past" : "event", "data-event": n.event, "data-cursor": n.cursor },
      h("div", { class: "event-head" },
        h("span", { class: "event-name" }, n.event),
        relevant ? h("span", { class: "score", title: "Relevance to you, from 0 to 1" },
          h("meter", { min: 0, max: 1, value: score, "aria-label": "relevance" }), ` ${score.toFixed(2)}`) : null,
        n.requires_action ? h("span", { class: "action", title: "You are expected to act on it" }, "action needed") : null,
        n.received
          ? h("time", { datetime: n.received.toISOString() }, n.received.toLocaleTimeString())
          : h("span", { class: "from-log", title: "Read from the log when the page opened or paged back" }, "from the log")),
      h("p", { class: "summary" }, n.summary),
      relevant ? h("p", { class: "why", title: "Why the Field finds it relevant" }, n.relevance_reason) : null,
      h("p", { class: "why" }, "by ", n.agent_id ? ref("agent", n.agent_id) : "the Field",
        ` · epoch ${n.epoch}`, about ? [" · ", about] : null));
  }

  // -- links and detail views -------------------------------------------------------------

  /** A link to the view of one entity: kind "agent", "unit", "conflict", "task", "session",
   *  "subscription" or "node". */
  function ref(kind, id, text) {
    return h("a", { href: `#${kind}/${encodeURIComponent(id)}`, class: "ref", "data-kind": kind, "data-id": id },
      h("code", {}, text === undefined ? id : text));
  }

  const TITLES = {
    agent: "Agent", unit: "Memory unit", conflict: "Conflict", task: "Task", session: "Session",
    subscription: "Subscription", node: "Node",
  };

  /** Open the view of one entity: its reads are made now, with the signed-in token. */
  async function openDetail(s, kind, id) {
    const dialog = $("detail");
    const body = $("detail-body");
    dialog.dataset.kind = kind;
    dialog.dataset.id = id;
    $("detail-title").replaceChildren(`${TITLES[kind] || kind} `, h("code", {}, id));
    body.replaceChildren(h("p", { class: "hint" }, "Reading…"));
    if (!dialog.open) dialog.showModal();
    $("detail-title").focus();
    history.replaceState(null, "", `#${kind}/${encodeURIComponent(id)}`);  // a reload opens it again
    const view = { agent: agentView, unit: unitView, conflict: conflictView, task: replayView,
      session: replayView, subscription: subscriptionView, node: nodeView }[kind];
    let parts;
    try {
      parts = await view(s, id, kind);
    } catch (error) {
      parts = [h("p", { class: "note bad" }, `Could not read it: ${error.message}`)];
    }
    if (dialog.open && dialog.dataset.kind === kind && dialog.dataset.id === id) {
      body.replaceChildren(...parts);
    }
  }

  function closeDialogs() {
    for (const id of ["confirm", "detail"]) if ($(id).open) $(id).close();
  }

  /** A list of label → value pairs (values may be nodes). */
  function facts(pairs) {
    return h("dl", { class: "facts" }, pairs.filter(([, v]) => v !== undefined).map(([k, v]) =>
      h("div", {}, h("dt", {}, k), h("dd", {}, v === null || v === "" ? "–" : v))));
  }

  function section(title, ...content) {
    return h("section", { class: "detail-part" }, h("h3", {}, title), ...content);
  }

  async function agentView(s, id) {
    const [agents, conflicts] = await Promise.all([
      api(s, "GET", `/v1/agents?id=${encodeURIComponent(id)}`),
      api(s, "GET", `/v1/conflicts?involving_agent=${encodeURIComponent(id)}&status=${CONFLICT_STATUSES}&limit=100`),
    ]);
    const a = agents.agents[0];
    const parts = [];
    if (!a) {
      parts.push(h("p", { class: "note" }, "No agent of this id is registered now (it deregistered, or never was)."));
    } else {
      parts.push(facts([
        ["Role", a.role],
        ["Status", h("span", { class: `badge ${a.status}` }, a.status)],
        ["Authority", `${a.authority} · ${AUTHORITY[a.authority] || "custom"}`],
        ["Interests", a.interests.length ? a.interests.join(", ") : "none"],
        ["Current task", a.current_task_id ? ref("task", a.current_task_id) : null],
        ["Registered at epoch", number(a.registered_epoch)],
        ["Push connections now", kinds(connectionsOf(id)) || "none"],
        ["Last event it caused (of those loaded)", lastHeard(id)],
      ]));
    }
    if (a && s.viewer && s.viewer.operator) parts.push(agentActions(s, a));
    const failures = events.filter((n) => n.event === "agent.failed" && n.entity && n.entity.id === id);
    parts.push(section("Failures",
      a && a.failure_reason ? h("p", { class: "reason" }, `Failed now: ${a.failure_reason}`) : null,
      failures.length ? h("ul", { class: "plain" }, failures.map((n) =>
        h("li", {}, `epoch ${n.epoch}: `, (n.detail && n.detail.reason) || n.summary)))
        : h("p", { class: "hint" }, "No agent.failed event among the events loaded.")));
    const units = events.filter((n) => n.event === "memory.recorded" && n.agent_id === id);
    parts.push(section(`Units it recorded (${units.length} among the events loaded)`,
      units.length ? h("ul", { class: "plain" }, units.slice(0, 50).map((n) =>
        h("li", {}, ref("unit", n.memory_unit_id), " ", n.summary)))
        : h("p", { class: "hint" }, "None among the events loaded; “Older events” reads further back.")));
    parts.push(section(`Conflicts involving it (${conflicts.conflicts.length}${conflicts.next ? "+" : ""})`,
      conflictList(conflicts.conflicts)));
    const subs = ((latest && latest.subscriptions.listed) || []).filter((i) => i.subscription.agent_id === id);
    parts.push(section(`Subscriptions (${subs.length})`,
      subs.length ? h("ul", { class: "plain" }, subs.map((i) => h("li", {},
        ref("subscription", i.subscription.id, i.subscription.name || i.subscription.id),
        ` · ${eventsOf(i.subscription)} · lag ${i.lag === null ? "–" : i.lag}`)))
        : h("p", { class: "hint" }, "None you may see.")));
    return parts;
  }

  /** The operator's actions on an agent: declare it failed, deregister it. */
  function agentActions(s, a) {
    const where = h("p", { class: "note", role: "status", id: "agent-result" });
    const buttons = [];
    if (a.status !== "failed") {
      buttons.push(h("button", {
        type: "button", class: "secondary fail-agent", title: "POST /v1/agents/{id}/fail",
        onclick: (e) => act(where, e.currentTarget,
          ["Declare the agent failed?", `${a.id} is marked failed as if it had gone silent: its open tasks ` +
            "go back to pending and their creators are told. It recovers when it is heard from again.", "Declare failed"],
          async () => {
            const answer = await api(s, "POST", `/v1/agents/${encodeURIComponent(a.id)}/fail`, {});
            return answer.status === "failed" ? `${a.id}: declared failed.` : `${a.id} was failed already.`;
          }),
      }, "Declare failed"));
    }
    buttons.push(h("button", {
      type: "button", class: "danger deregister", title: "DEREGISTER, as the operator",
      onclick: (e) => act(where, e.currentTarget,
        ["Deregister the agent?", `${a.id} is removed: its token stops working, its tasks go back to ` +
          "pending, it leaves its sessions and its subscriptions are cancelled. Its units stay.", "Deregister"],
        async () => {
          await operation(s, "DEREGISTER", { agent_id: a.id });
          return `${a.id}: deregistered.`;
        }),
    }, "Deregister"));
    return section("Actions", h("div", { class: "actions" }, buttons), where);
  }

  function connectionsOf(id) {
    const row = latest && latest.agents.listed.find((x) => x.agent.id === id);
    return row ? row.connections : {};
  }

  function lastHeard(id) {
    const n = events.find((x) => x.agent_id === id);
    if (!n) return "none among the events loaded";
    return `${n.event}, epoch ${n.epoch}${n.received ? `, at ${n.received.toLocaleTimeString()}` : ""}`;
  }

  function conflictList(conflicts) {
    if (!conflicts.length) return h("p", { class: "hint" }, "None.");
    return h("ul", { class: "plain" }, conflicts.map((c) => h("li", {},
      ref("conflict", c.id), " ", h("span", { class: `badge ${c.status}` }, c.status), ` ${c.type}: `,
      ref("unit", c.unit_a), " × ", ref("unit", c.unit_b))));
  }

  /** REPLAY of one target: its timeline (one hop of links), or its summary when the
   *  timeline would be too large. */
  async function replay(s, type, id) {
    try {
      return await operation(s, "REPLAY", { target_type: type, target_id: id, depth: "detailed" });
    } catch (error) {
      if (error.body && error.body.code === "REPLAY_TOO_LARGE") {
        return operation(s, "REPLAY", { target_type: type, target_id: id, depth: "summary" });
      }
      throw error;
    }
  }

  function timeline(answer) {
    const rows = answer.timeline.map((e) => h("tr", {},
      h("td", { "data-label": "Epoch" }, number(e.epoch)),
      h("td", { "data-label": "Event" }, e.event_type),
      h("td", { "data-label": "By" }, e.agent_id === "field" ? "the Field" : ref("agent", e.agent_id)),
      h("td", { "data-label": "What" }, e.description,
        e.memory_unit_id ? [" ", ref("unit", e.memory_unit_id)] : null,
        e.task_id ? [" ", ref("task", e.task_id)] : null)));
    return [
      h("p", { class: "summary" }, answer.summary),
      h("p", { class: "hint" }, `${answer.timeline.length} of ${answer.total_events} events, read from the log (REPLAY)`),
      h("div", { class: "table-wrap" }, h("table", { class: "rows timeline" },
        h("thead", {}, h("tr", {}, h("th", {}, "Epoch"), h("th", {}, "Event"), h("th", {}, "By"), h("th", {}, "What"))),
        h("tbody", {}, rows))),
    ];
  }

  async function allConflicts(s) {
    return (await api(s, "GET", `/v1/conflicts?status=${CONFLICT_STATUSES}&limit=1000`)).conflicts;
  }

  async function unitView(s, id) {
    const [answer, conflicts] = await Promise.all([replay(s, "memory_unit", id), allConflicts(s)]);
    const mine = conflicts.filter((c) => c.unit_a === id || c.unit_b === id);
    const linked = [...new Set(answer.timeline.map((e) => e.memory_unit_id).filter((u) => u && u !== id))];
    return [
      section("Related units", linked.length
        ? h("ul", { class: "plain" }, linked.map((u) => h("li", {}, ref("unit", u))))
        : h("p", { class: "hint" }, "None: no relation links it to another unit.")),
      section(`Conflicts (${mine.length})`, conflictList(mine)),
      section("Timeline", ...timeline(answer)),
    ];
  }

  async function conflictView(s, id) {
    const [answer, conflicts] = await Promise.all([replay(s, "conflict", id), allConflicts(s)]);
    const c = conflicts.find((x) => x.id === id);
    return [
      c ? facts([
        ["Type", c.type],
        ["Status", h("span", { class: `badge ${c.status}` }, c.status)],
        ["Units", [ref("unit", c.unit_a), " × ", ref("unit", c.unit_b)]],
        ["Description", c.description],
        ["Detected by", c.detected_by],
        ["Epoch", number(c.epoch)],
        ["Resolution", c.resolution ? [c.resolution.rationale || "",
          c.resolution.winner_id ? [" · kept ", ref("unit", c.resolution.winner_id)] : null] : null],
      ]) : h("p", { class: "hint" }, "Not among the first 1000 conflicts; its timeline follows."),
      section("Timeline", ...timeline(answer)),
    ];
  }

  async function replayView(s, id, kind) {
    return timeline(await replay(s, kind, id));
  }

  /** A subscription as the latest snapshot lists it, or as SUBSCRIBE list shows one of
   *  the viewer's own. */
  async function subscriptionView(s, id) {
    let item = latest && latest.subscriptions.listed.find((i) => i.subscription.id === id);
    if (!item) {
      const answer = await operation(s, "SUBSCRIBE", { action: "list" });
      const sub = answer.subscriptions.find((x) => x.id === id);
      if (!sub) return [h("p", { class: "note" }, "Not an active subscription you may see (cancelled, or another agent's).")];
      item = { subscription: sub, readers: {}, outbox: 0, lag: null, replaying: false };
    }
    const sub = item.subscription;
    const d = sub.delivery;
    const f = sub.filter;
    return [
      facts([
        ["Name", sub.name || null],
        ["Agent", ref("agent", sub.agent_id)],
        ["Status", sub.status],
        ["Events", eventsOf(sub)],
        ["Least relevance", String(sub.min_relevance)],
        ["Debounce", sub.debounce_ms ? `${sub.debounce_ms} ms` : "none"],
        ["Its own events too", sub.include_own ? "yes" : "no"],
        ["Timeout", sub.timeout || "none"],
        ["Created at epoch", number(sub.created_epoch)],
        ["Readers now", kinds(item.readers) || "none"],
        ["Lag", item.lag === null ? "– (nothing reads it now)" : number(item.lag)],
        ["Outbox", number(item.outbox)],
        ["Replaying", item.replaying ? "yes" : "no"],
      ]),
      section("Filter", f ? facts([
        ["Expression", h("code", {}, f.expression)],
        ["Errors", number(f.errors)],
        ["Last error", f.last_error || null],
      ]) : h("p", { class: "hint" }, "None: every matching event.")),
      section("Delivery", d ? facts([
        ["Type", d.type],
        ["URL", d.url || null],
        ["State", h("span", { class: `badge ${d.state}` }, d.state)],
        ["Acknowledged cursor", d.acked_cursor || null],
        ["Owed", number(d.owed)],
        ["Failed attempts", number(d.attempts)],
        ["Last status", d.last_status === null || d.last_status === undefined ? null : String(d.last_status)],
        ["Last error", d.last_error || null],
        ["Next attempt", d.next_attempt_at || null],
      ]) : h("p", { class: "hint" }, "Read as a stream by its agent.")),
      h("div", { class: "actions" }, subscriptionActions(s, sub)),
    ];
  }

  function eventsOf(sub) {
    return sub.events.length === EVENTS.length ? "all events" : sub.events.join(", ");
  }

  async function nodeView(s, id) {
    const field = latest.field;
    const node = field.node;
    if (!node || node.id !== id) {
      const other = nodesOf(field).find((n) => n.id === id);
      if (!other) return [h("p", { class: "note" }, "This server knows of no such node now.")];
      return [facts([
        ["Position", `${number(other.position)}, as it last said`],
        ["Lag", `${number(other.lag)} behind this server's log head (${number(node.log_head)})`],
        ["Last heard", `${duration(other.seen_seconds_ago)} ago`],
        ["Live", other.live ? "yes" : "no: it has not said it runs for five cluster intervals"],
        ["Sends the deliveries", other.delivery_owner ? "yes (holds the delivery lease)" : "no"],
      ])];
    }
    return [facts([
      ["Position", number(node.position)],
      ["Log head", number(node.log_head)],
      ["Lag", number(node.lag)],
      ["Sends the deliveries", node.delivery_owner ? "yes (holds the delivery lease)" : "no"],
      ["Delivery term", number(node.delivery_term)],
      ["Log", `${field.log.backend}, ${field.log.writable ? "writable" : "refusing writes"}`],
      ["Writer queue", number(field.writer.queued)],
      ["Uptime", duration(field.uptime_seconds)],
    ])];
  }

  // -- actions ---------------------------------------------------------------------------

  /** Ask before doing: resolves true when the viewer confirms. */
  function confirmAction(title, text, ok) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = ok;
    return new Promise((resolve) => {
      const finish = (yes) => {
        $("confirm-ok").removeEventListener("click", onOk);
        $("confirm-cancel").removeEventListener("click", onCancel);
        dialog.removeEventListener("close", onCancel);
        if (dialog.open) dialog.close();
        resolve(yes);
      };
      const onOk = () => finish(true);
      const onCancel = () => finish(false);
      $("confirm-ok").addEventListener("click", onOk);
      $("confirm-cancel").addEventListener("click", onCancel);
      dialog.addEventListener("close", onCancel);
      dialog.showModal();
      $("confirm-cancel").focus();
    });
  }

  /** Run one action after its confirmation, saying what came of it in "where". */
  async function act(where, button, question, run) {
    if (!(await confirmAction(...question))) return;
    if (button) button.disabled = true;
    try {
      const text = await run();
      where.className = "note";
      where.textContent = text;
    } catch (error) {
      where.className = "note bad";
      where.textContent = error.message;
    } finally {
      if (button) button.disabled = false;
    }
  }

  /** Cancel (and resume the delivery of) a subscription: its own agent may, and the
   *  operator may on any. */
  function subscriptionActions(s, sub) {
    if (!s.viewer || (sub.agent_id !== s.viewer.id && !s.viewer.operator)) return [];
    const own = sub.agent_id === s.viewer.id;
    const where = $("subscription-result");
    const label = sub.name || sub.id;
    const out = [];
    const d = sub.delivery;
    if (d && (d.state === "failing" || d.state === "suspended")) {
      out.push(h("button", {
        type: "button", class: "resume", title: "SUBSCRIBE resume: start over from the acknowledged cursor",
        onclick: (e) => act(where, e.currentTarget,
          ["Resume the delivery?", `The ${d.type} delivery of ${label} is ${d.state}; it starts over from its acknowledged cursor.`, "Resume"],
          async () => {
            await operation(s, "SUBSCRIBE", { action: "resume", subscription: { id: sub.id } });
            refreshDetail(s);
            return `${label}: delivery resumed.`;
          }),
      }, "Resume delivery"));
    }
    out.push(h("button", {
      type: "button", class: "secondary cancel-sub", title: "SUBSCRIBE unsubscribe",
      onclick: (e) => act(where, e.currentTarget,
        ["Cancel the subscription?", `${label} stops notifying (what it owed until now is still delivered). ` +
          (!own ? `It is ${sub.agent_id}'s; the log names the operator as who cancelled it. ` : "") +
          (own && sub.name === "console" ? "This page subscribes again at once." : ""), "Cancel subscription"],
        async () => {
          await operation(s, "SUBSCRIBE", { action: "unsubscribe", subscription: { id: sub.id } });
          if ($("detail").open && $("detail").dataset.id === sub.id) $("detail").close();
          return `${label}: cancelled.`;
        }),
    }, "Cancel"));
    return out;
  }

  function refreshDetail(s) {
    const dialog = $("detail");
    if (dialog.open) openDetail(s, dialog.dataset.kind, dialog.dataset.id);
  }

  /** The operator's card: registration tokens and sources, read now. */
  async function refreshOperator(s) {
    if (!s.viewer || !s.viewer.operator) return;
    try {
      const [tokens, sources] = await Promise.all([
        api(s, "GET", "/v1/registration-tokens"), api(s, "GET", "/v1/sources"),
      ]);
      renderTokens(s, tokens);
      renderSources(s, sources.sources);
    } catch (error) {
      const where = $("operator-result");
      where.className = "note bad";
      where.textContent = `Could not read tokens and sources: ${error.message}`;
    }
  }

  function renderTokens(s, answer) {
    $("tokens-policy").textContent = `registration: ${answer.registration}`;
    const items = answer.registration_tokens.map((t) => h("li", { class: "token", "data-token": t.id },
      h("div", { class: "conflict-head" }, h("code", {}, t.id),
        h("span", {}, `${t.uses_left} of ${t.uses} uses left`),
        h("span", {}, `authority ≤ ${t.authority}`),
        t.expired ? h("span", { class: "badge failed" }, "expired") : null),
      h("p", { class: "why" }, t.note || "no note", ` · expires ${t.expires_at || "never"} · issued ${t.created_at}`),
      h("button", {
        type: "button", class: "secondary revoke", title: "DELETE /v1/registration-tokens/{id}",
        onclick: (e) => act($("operator-result"), e.currentTarget,
          ["Revoke the registration token?", `${t.id} (${t.note || "no note"}) registers no one once revoked.`, "Revoke"],
          async () => {
            await api(s, "DELETE", `/v1/registration-tokens/${encodeURIComponent(t.id)}`);
            await refreshOperator(s);
            return `${t.id}: revoked.`;
          }),
      }, "Revoke")));
    $("tokens").replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "No registration token is held.")]));
  }

  function renderSources(s, sources) {
    const items = sources.map((src) => h("li", { class: "source", "data-source": src.name },
      h("div", { class: "conflict-head" }, h("strong", {}, src.name), h("span", { class: "badge" }, src.scheme),
        h("span", {}, `${src.counts.accepted} accepted, ${src.counts.filtered} filtered, ${src.counts.refused} refused`)),
      h("p", { class: "why" }, `events to ${src.events_url}`),
      src.filter ? h("p", { class: "why" }, "filter ", h("code", {}, src.filter)) : null,
      h("button", {
        type: "button", class: "secondary remove", title: "DELETE /v1/sources/{name}",
        onclick: (e) => act($("operator-result"), e.currentTarget,
          ["Remove the source?", `${src.name} takes no more events; its delivery ids are forgotten.`, "Remove"],
          async () => {
            await api(s, "DELETE", `/v1/sources/${encodeURIComponent(src.name)}`);
            await refreshOperator(s);
            return `${src.name}: removed.`;
          }),
      }, "Remove")));
    $("sources").replaceChildren(...(items.length ? items : [h("li", { class: "empty" }, "No source is defined.")]));
  }

  function showSecret(where, label, secret) {
    where.hidden = false;
    where.replaceChildren(h("p", {}, `${label} (shown this once: copy it now)`), h("code", { class: "secret-value" }, secret));
  }

  function issueToken(s) {
    const uses = Number($("token-uses").value);
    const authority = Number($("token-authority").value);
    const expires = $("token-expires").value.trim();
    const note = $("token-note").value.trim();
    const body = { uses, authority, expires_at: expires || null, note: note || null };
    return act($("operator-result"), null,
      ["Issue a registration token?", `It lets ${uses} agent${uses === 1 ? "" : "s"} register, at authority ${authority} at most` +
        `${expires ? `, until ${expires}` : ""}.`, "Issue"],
      async () => {
        const answer = await api(s, "POST", "/v1/registration-tokens", body);
        const t = answer.registration_token;
        showSecret($("token-secret"), `Token ${t.id}`, t.token);
        $("token-note").value = "";
        await refreshOperator(s);
        return `${t.id}: issued.`;
      });
  }

  function defineSource(s) {
    const name = $("source-name").value.trim();
    const filterText = $("source-filter").value.trim();
    const body = {
      name, scheme: $("source-scheme").value, filter: filterText || null,
      unit: { type: $("source-type").value, content: $("source-content").value },
    };
    return act($("operator-result"), null,
      ["Define the source?", `${name} (${body.scheme}) turns each signed event that passes its filter into a unit. ` +
        "Defining an existing name replaces it.", "Define"],
      async () => {
        const answer = await api(s, "POST", "/v1/sources", body);
        if (answer.source.secret) showSecret($("source-secret"), `Secret of ${name}`, answer.source.secret);
        await refreshOperator(s);
        return `${name}: ${answer.replaced ? "replaced" : "defined"}; events go to ${answer.source.events_url}.`;
      });
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
      if (session) renderEvents(session);
    });
    $("events-older").addEventListener("click", () => session && loadOlder(session));
    $("signin-form").addEventListener("submit", (event) => {
      event.preventDefault();
      signIn($("token").value.trim());
    });
    $("signout").addEventListener("click", () => signOut());
    // every id is a link to its view
    document.addEventListener("click", (event) => {
      const link = event.target instanceof Element && event.target.closest("a.ref");
      if (!link || !session || event.ctrlKey || event.metaKey || event.shiftKey) return;
      event.preventDefault();
      openDetail(session, link.dataset.kind, link.dataset.id);
    });
    $("detail-close").addEventListener("click", () => $("detail").close());
    $("detail").addEventListener("close", () => history.replaceState(null, "", location.pathname));
    $("chart-window").addEventListener("change", () => {
      if (latest) renderActivity(Date.parse(latest.at) / 1000);
    });
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      if (session) issueToken(session);
    });
    $("source-form").addEventListener("submit", (event) => {
      event.preventDefault();
      if (session) defineSource(session);
    });
    const kept = sessionStorage.getItem(TOKEN_KEY);
    if (kept) signIn(kept);
  }

  start();
})();
