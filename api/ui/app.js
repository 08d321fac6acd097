// hourglass dashboard: plain JavaScript, no library, nothing fetched but this server's API.
// The token stays in sessionStorage; what the token may not do is not shown.
"use strict";

const TOKEN_KEY = "hourglass.token";
const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(200, Number(params.get("refresh")) || 5000);
const LATENESS_WINDOW_MS = 5 * 60 * 1000; // "over the last minutes": the last 5 of them
const RATE_POINTS = 120;
const ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
const SVG = "http://www.w3.org/2000/svg";

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  caller: null,
  samples: [], // {wall, scheduled, delivered, cancelled, lateness}
  serverNow: null,
  timeline: { span: 24 * 3600e3, from: null, topic: "" }, // from null: follow now
  timer: null,
};

const $ = (id) => document.getElementById(id);

// --- the API -------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, query) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
  }
  const response = await fetch(url, {
    method, headers: { Authorization: `Bearer ${state.token}` }, cache: "no-store",
  });
  const text = await response.text();
  let doc = null;
  try { doc = text ? JSON.parse(text) : null; } catch (e) { doc = null; }
  if (!response.ok) {
    throw new ApiError(response.status, doc && doc.code, doc && doc.detail);
  }
  return doc;
}

// --- formatting ----------------------------------------------------------------------------
const numberFormat = new Intl.NumberFormat(undefined);
function fmtNum(n) { return numberFormat.format(n); }
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `≤ ${ms} ms`;
  return `≤ ${(ms / 1000).toFixed(ms % 1000 ? 1 : 0)} s`;
}
function fmtDuration(ms) {
  const units = [[86400e3, "d"], [3600e3, "h"], [60e3, "min"], [1e3, "s"]];
  for (const [size, name] of units) if (ms >= size && ms % size === 0) return `${ms / size} ${name}`;
  return `${ms} ms`;
}
const timeFormats = {
  full: new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" }),
  seconds: new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" }),
  minutes: new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" }),
  dayTime: new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" }),
  day: new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" }),
  month: new Intl.DateTimeFormat(undefined, { year: "numeric", month: "short" }),
};
function fmtTime(ms) { return timeFormats.full.format(new Date(ms)); }

function setNum(id, value, text) {
  const el = $(id);
  el.dataset.value = String(value);
  el.textContent = text === undefined ? fmtNum(value) : text;
}

function showError(message) {
  const el = $("error");
  el.textContent = message;
  el.hidden = !message;
}

// --- sign-in -------------------------------------------------------------------------------
function may(permission) {
  return state.caller !== null && state.caller.permissions.includes(permission);
}

function globToRegExp(glob) {
  const escaped = glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp(`^${escaped}$`);
}

function mayUseTopic(topic) {
  if (state.caller.role === "admin") return true;
  return state.caller.topics.some((glob) => globToRegExp(glob).test(topic));
}

async function signIn(token) {
  state.token = token;
  try {
    state.caller = await api("GET", "/v1/whoami");
  } catch (err) {
    state.caller = null;
    sessionStorage.removeItem(TOKEN_KEY);
    if (err.status === 401) {
      showError("This token was not accepted (401 UNAUTHORIZED): check that you pasted the " +
                "whole token, then sign in again.");
    } else {
      showError(`Cannot sign in: ${err.message}`);
    }
    render();
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  showError("");
  render();
  refresh();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  state.caller = null;
  state.samples = [];
  render();
}

function render() {
  const signedIn = state.caller !== null;
  $("signin").hidden = signedIn;
  $("who").hidden = !signedIn;
  $("app").hidden = !signedIn;
  if (signedIn) {
    const c = state.caller;
    $("who-text").textContent = `${c.name} · ${c.role} · topics ${c.topics.join(", ")}`;
  }
  for (const section of document.querySelectorAll("[data-needs]")) {
    section.hidden = !signedIn || !may(section.dataset.needs);
  }
  clearInterval(state.timer);
  state.timer = signedIn ? setInterval(refresh, REFRESH_MS) : null;
}

// --- refreshing ----------------------------------------------------------------------------
let refreshing = false;
async function refresh() {
  if (refreshing || state.caller === null) return;
  refreshing = true;
  try {
    if (may("admin")) {
      const overview = await api("GET", "/v1/admin/overview");
      showOverview(overview);
      showCluster(await api("GET", "/v1/cluster"));
      await refreshTimeline();
    }
    $("refreshed").textContent = `updated ${timeFormats.seconds.format(new Date())}`;
    showError("");
  } catch (err) {
    if (err.status === 401) {
      signOut();
      showError("The token is no longer accepted (401 UNAUTHORIZED): sign in again.");
    } else {
      showError(`Refresh failed: ${err.message}`);
    }
  } finally {
    refreshing = false;
  }
}

function showOverview(o) {
  state.serverNow = o.now;
  const sample = { wall: Date.now(), scheduled: o.scheduled, delivered: o.delivered,
                   cancelled: o.cancelled, lateness: o.lateness,
                   disk: o.disk.rocksdbBytes + o.disk.commitlogBytes };
  state.samples.push(sample);
  while (state.samples.length > RATE_POINTS) state.samples.shift();

  const ready = $("ready");
  ready.textContent = o.ready ? "ready" : "not ready";
  ready.className = `big ${o.ready ? "ok" : "bad"}`;
  ready.dataset.value = String(o.ready);
  $("delivery-state").textContent = o.deliveryBlocked ? "blocked by storage failures" : "running";
  setNum("pending", o.pending);
  setNum("parked", o.parked);
  setNum("prepared", o.transactionsPrepared);
  setNum("delivered", o.delivered);
  setNum("cancelled", o.cancelled);
  setNum("queue-batches", o.deliveryQueueBatches);
  setNum("queue-messages", o.deliveryQueueMessages);
  setNum("lag", o.watermarkLagMs, `${fmtNum(o.watermarkLagMs)} ms`);
  setNum("retries", o.retries);
  setNum("disk-rocksdb", o.disk.rocksdbBytes, fmtBytes(o.disk.rocksdbBytes));
  setNum("disk-commitlog", o.disk.commitlogBytes, fmtBytes(o.disk.commitlogBytes));
  setNum("disk-used", o.disk.usedRatio === undefined ? "" : o.disk.usedRatio,
         o.disk.usedRatio === undefined ? "–" : `${Math.round(o.disk.usedRatio * 1000) / 10} %`);
  showDiskTrend();
  showRates();
  showLateness(o.lateness);
  showTopics(o);
  showTransactions(o);
}

function showRates() {
  const s = state.samples;
  for (const name of ["scheduled", "delivered", "cancelled"]) {
    const el = $(`rate-${name}`);
    if (s.length < 2) { el.textContent = "–"; continue; }
    const a = s[s.length - 2];
    const b = s[s.length - 1];
    const rate = (b[name] - a[name]) / Math.max(0.001, (b.wall - a.wall) / 1000);
    el.dataset.value = String(rate);
    el.textContent = fmtNum(Math.round(rate * 10) / 10);
  }
  drawRates();
}

function showDiskTrend() {
  // the data directory's growth per minute over the samples this page holds (RocksDB +
  // CommitLog): about 0 once the log's retention deletes as fast as deliveries append
  const s = state.samples;
  const el = $("disk-trend");
  if (s.length < 2) { el.textContent = "–"; return; }
  const a = s[0];
  const b = s[s.length - 1];
  const minutes = Math.max(0.001, (b.wall - a.wall) / 60000);
  const perMinute = (b.disk - a.disk) / minutes;
  el.dataset.value = String(perMinute);
  el.textContent = `${perMinute < 0 ? "−" : "+"}${fmtBytes(Math.abs(Math.round(perMinute)))}/min`;
}

function quantile(buckets, count, q) {
  if (!count) return null;
  const rank = q * count;
  for (const b of buckets) if (b.count >= rank) return b.le === undefined ? null : b.le;
  return null;
}

function showLateness(now) {
  // the oldest sample inside the window: its cumulative buckets subtracted from now's
  const cutoff = Date.now() - LATENESS_WINDOW_MS;
  const base = state.samples.find((x) => x.wall >= cutoff && x.lateness !== now);
  let buckets = now.buckets;
  let count = now.count;
  let label = "(since the server started)";
  if (base && state.samples.length > 1 && base !== state.samples[state.samples.length - 1]) {
    buckets = now.buckets.map((b, i) => ({ le: b.le, count: b.count - base.lateness.buckets[i].count }));
    count = now.count - base.lateness.count;
    label = `(last ${Math.max(1, Math.round((Date.now() - base.wall) / 60000))} min)`;
  }
  $("lateness-window").textContent = label;
  const p50 = quantile(buckets, count, 0.5);
  const p99 = quantile(buckets, count, 0.99);
  setNum("lateness-p50", p50 === null ? "" : p50, count ? fmtMs(p50) : "no deliveries");
  setNum("lateness-p99", p99 === null ? "" : p99, count ? fmtMs(p99) : "no deliveries");
}

function cell(row, text, cls, value) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  if (value !== undefined) td.dataset.value = String(value);
  row.appendChild(td);
  return td;
}

function showTopics(o) {
  const byTopic = {};
  for (const g of o.groups) (byTopic[g.topic] = byTopic[g.topic] || []).push(g);
  const body = $("topics-table").tBodies[0];
  body.replaceChildren();
  const select = $("timeline-topic");
  const known = new Set([...select.options].map((opt) => opt.value));
  for (const t of o.topics) {
    const groups = byTopic[t.topic] || [];
    const sum = (k) => groups.reduce((n, g) => n + g[k], 0);
    const row = body.insertRow();
    row.dataset.topic = t.topic;
    cell(row, t.topic, "topic");
    cell(row, fmtNum(t.pending), "pending", t.pending);
    cell(row, fmtNum(t.delivered), "delivered", t.delivered);
    cell(row, fmtNum(t.firstOffset ?? 0), "first-offset", t.firstOffset ?? 0);
    cell(row, t.oldestPendingAt === undefined ? "–" : fmtTime(t.oldestPendingAt), "oldest",
         t.oldestPendingAt === undefined ? "" : t.oldestPendingAt);
    cell(row, fmtNum(groups.filter((g) => g.backlog > 0).length), "groups-behind");
    cell(row, fmtNum(sum("leased")), "leased", sum("leased"));
    cell(row, fmtNum(sum("retrying")), "retrying", sum("retrying"));
    cell(row, fmtNum(sum("deadLettered")), "dead-letters", sum("deadLettered"));
    if (!known.has(t.topic)) select.add(new Option(t.topic, t.topic));
  }
  const groupsBody = $("groups-table").tBodies[0];
  groupsBody.replaceChildren();
  for (const g of o.groups) {
    const row = groupsBody.insertRow();
    row.dataset.group = `${g.topic}/${g.group}`;
    cell(row, g.topic);
    cell(row, g.group);
    cell(row, fmtNum(g.backlog), "backlog", g.backlog);
    cell(row, fmtNum(g.leased), "leased", g.leased);
    cell(row, fmtNum(g.retrying), "retrying", g.retrying);
    cell(row, fmtNum(g.deadLettered), "dead-letters", g.deadLettered);
    const actions = cell(row, "");
    if (g.deadLettered > 0 && may("pull") && mayUseTopic(g.topic)) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "redrive";
      button.textContent = "Redrive dead letters";
      button.addEventListener("click", () => redrive(g.topic, g.group, button));
      actions.appendChild(button);
    }
  }
}

async function redrive(topic, group, button) {
  button.disabled = true;
  try {
    const path = `/v1/topics/${encodeURIComponent(topic)}/groups/${encodeURIComponent(group)}/dead-letters:redrive`;
    const url = new URL(path, location.origin);
    const response = await fetch(url, { method: "POST", headers: {
      Authorization: `Bearer ${state.token}`, "Content-Type": "application/json" }, body: "{}" });
    const doc = await response.json();
    button.textContent = response.ok ? `redriven: ${doc.redriven}` : `failed: ${doc.detail}`;
  } finally {
    refresh();
  }
}

function showTransactions(o) {
  const body = $("transactions-table").tBodies[0];
  body.replaceChildren();
  for (const t of o.transactions) {
    const row = body.insertRow();
    row.dataset.group = t.producerGroup;
    cell(row, t.producerGroup);
    cell(row, fmtNum(t.prepared), "prepared", t.prepared);
    cell(row, fmtNum(t.due), "due", t.due);
    cell(row, fmtTime(t.nextCheckAt), "next-check", t.nextCheckAt);
  }
  $("transactions-note").textContent = o.transactions.length ? (o.transactionsTruncated
    ? "Counted over the first 100,000 prepared transactions." : "")
    : "No transaction is waiting.";
}

// --- the cluster (GET /v1/cluster; docs/cluster.md) ---------------------------------------
function showCluster(c) {
  const body = $("cluster-table").tBodies[0];
  body.replaceChildren();
  for (const n of c.nodes) {
    const row = body.insertRow();
    row.dataset.node = n.nodeId;
    cell(row, n.nodeId === c.nodeId ? `${n.nodeId} (this one)` : n.nodeId);
    cell(row, n.role, `role ${{leader: "ok", unreachable: "bad"}[n.role] || ""}`, n.role);
    cell(row, n.url || "");
    cell(row, fmtNum(n.appliedSeq), "applied", n.appliedSeq);
    cell(row, `${fmtNum(n.lagMs)} ms`, "lag", n.lagMs);
  }
  $("cluster-note").textContent = c.nodes.length
    ? `This node is ${c.role}; the leader: ${c.leader ? c.leader.nodeId : "none now (a failover)"}.`
    : "A single node (not started with --cluster).";
}

// --- the due timeline ----------------------------------------------------------------------
async function refreshTimeline() {
  const tl = state.timeline;
  const from = tl.from !== null ? tl.from : state.serverNow;
  const query = { buckets: 60, topic: tl.topic };
  if (from !== null) { query.from = from; query.to = from + tl.span; }
  const doc = await api("GET", "/v1/admin/timeline", query);
  drawTimeline(doc);
}

function niceStep(max, ticks) {
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

const TIME_STEPS = [1e3, 2e3, 5e3, 10e3, 15e3, 30e3, 60e3, 120e3, 300e3, 600e3, 900e3, 1800e3,
  3600e3, 7200e3, 10800e3, 21600e3, 43200e3, 86400e3, 172800e3, 604800e3, 1209600e3,
  2592000e3, 7776000e3, 31536000e3];

function timeTicks(start, end, count) {
  const step = TIME_STEPS.find((s) => (end - start) / s <= count) || TIME_STEPS[TIME_STEPS.length - 1];
  // align to the browser's zone: ticks on local whole minutes / hours / days
  const offset = new Date(start).getTimezoneOffset() * 60e3;
  let t = Math.ceil((start - offset) / step) * step + offset;
  if (step >= 86400e3) { // local midnights
    const d = new Date(start);
    d.setHours(0, 0, 0, 0);
    if (d.getTime() < start) d.setDate(d.getDate() + 1);
    t = d.getTime();
  }
  const out = [];
  for (; t <= end; t += step) out.push(t);
  const fmt = step < 60e3 ? timeFormats.seconds : (end - start) <= 86400e3 && step < 86400e3
    ? timeFormats.minutes : step < 86400e3 ? timeFormats.dayTime
    : step < 2592000e3 ? timeFormats.day : timeFormats.month;
  return out.map((x) => [x, fmt.format(new Date(x))]);
}

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function frame(svg) {
  const width = svg.clientWidth || 900;
  const height = svg.clientHeight || 300;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  return { width, height, left: 64, right: 16, top: 12, bottom: 44 };
}

function yAxis(svg, f, max, title) {
  const step = niceStep(Math.max(max, 1), 5);
  const top = Math.max(step, Math.ceil(max / step) * step);
  const y = (v) => f.height - f.bottom - (v / top) * (f.height - f.top - f.bottom);
  for (let v = 0; v <= top + 1e-9; v += step) {
    svg.appendChild(el("line", { class: "grid", x1: f.left, x2: f.width - f.right, y1: y(v), y2: y(v) }));
    svg.appendChild(el("text", { x: f.left - 6, y: y(v) + 4, "text-anchor": "end" }, fmtNum(v)));
  }
  svg.appendChild(el("text", { class: "axis-title", transform: `translate(14 ${(f.height - f.bottom + f.top) / 2}) rotate(-90)`,
    "text-anchor": "middle" }, title));
  return y;
}

function xAxis(svg, f, start, end, title) {
  const x = (t) => f.left + ((t - start) / (end - start)) * (f.width - f.left - f.right);
  for (const [t, label] of timeTicks(start, end, Math.max(2, Math.floor((f.width - f.left) / 110)))) {
    svg.appendChild(el("line", { class: "grid", x1: x(t), x2: x(t), y1: f.top, y2: f.height - f.bottom }));
    svg.appendChild(el("text", { class: "tick", x: x(t), y: f.height - f.bottom + 16, "text-anchor": "middle",
      "data-time": t }, label));
  }
  svg.appendChild(el("text", { class: "axis-title", x: (f.left + f.width - f.right) / 2, y: f.height - 6,
    "text-anchor": "middle" }, title));
  return x;
}

function drawTimeline(doc) {
  const svg = $("timeline-chart");
  const f = frame(svg);
  svg.dataset.from = doc.from;
  svg.dataset.to = doc.to;
  svg.dataset.bucketMs = doc.bucketMs;
  const max = Math.max(0, ...doc.counts);
  const y = yAxis(svg, f, max, `messages due per ${fmtDuration(doc.bucketMs)}`);
  const x = xAxis(svg, f, doc.from, doc.to, `deliver time (${ZONE})`);
  doc.counts.forEach((count, i) => {
    const start = doc.from + i * doc.bucketMs;
    const end = start + doc.bucketMs;
    const bar = el("rect", { class: "bar", x: x(start) + 0.5, width: Math.max(1, x(end) - x(start) - 1),
      y: y(count), height: Math.max(0, y(0) - y(count)), "data-start": start, "data-end": end,
      "data-count": count });
    bar.appendChild(el("title", {}, `${fmtTime(start)} – ${fmtTime(end)}: ${fmtNum(count)} messages due`));
    bar.addEventListener("click", () => zoomTo(start, end));
    svg.appendChild(bar);
  });
  if (doc.now >= doc.from && doc.now <= doc.to) {
    svg.appendChild(el("line", { class: "now", x1: x(doc.now), x2: x(doc.now), y1: f.top, y2: y(0) }));
    svg.appendChild(el("text", { x: x(doc.now) + 4, y: f.top + 10 }, "now"));
  }
  const inWindow = doc.counts.reduce((a, b) => a + b, 0);
  setNum("timeline-summary", inWindow, `${fmtNum(inWindow)} of ${fmtNum(doc.pending)} pending ` +
    `messages${doc.topic ? ` of ${doc.topic}` : ""} are due between ${fmtTime(doc.from)} and ` +
    `${fmtTime(doc.to)}; bars of ${fmtDuration(doc.bucketMs)}.`);
}

function zoomTo(start, end) {
  state.timeline.from = start;
  state.timeline.span = Math.max(60e3, end - start);
  refreshTimeline().catch((err) => showError(`Timeline: ${err.message}`));
}

function drawRates() {
  const svg = $("rates-chart");
  const f = frame(svg);
  const s = state.samples;
  const points = [];
  for (let i = 1; i < s.length; i += 1) {
    const dt = Math.max(0.001, (s[i].wall - s[i - 1].wall) / 1000);
    points.push({ t: s[i].wall, scheduled: (s[i].scheduled - s[i - 1].scheduled) / dt,
      delivered: (s[i].delivered - s[i - 1].delivered) / dt,
      cancelled: (s[i].cancelled - s[i - 1].cancelled) / dt });
  }
  const start = s.length ? s[0].wall : Date.now() - 60e3;
  const end = Math.max(start + 10e3, Date.now());
  const max = Math.max(0, ...points.flatMap((p) => [p.scheduled, p.delivered, p.cancelled]));
  const y = yAxis(svg, f, max, "messages/s");
  const x = xAxis(svg, f, start, end, `time (${ZONE})`);
  for (const name of ["scheduled", "delivered", "cancelled"]) {
    if (points.length) {
      svg.appendChild(el("polyline", { class: `line-${name}`,
        points: points.map((p) => `${x(p.t)},${y(p[name])}`).join(" ") }));
    }
  }
  let lx = f.left + 8;
  for (const name of ["scheduled", "delivered", "cancelled"]) {
    svg.appendChild(el("line", { class: `line-${name}`, x1: lx, x2: lx + 16, y1: f.top + 6, y2: f.top + 6 }));
    svg.appendChild(el("text", { x: lx + 20, y: f.top + 10 }, name));
    lx += 100;
  }
}

// --- a message -----------------------------------------------------------------------------
async function lookup() {
  const topic = $("lookup-topic").value.trim();
  const msgId = $("lookup-id").value.trim();
  $("cancel-button").hidden = true;
  $("message-info").hidden = true;
  $("message-result").textContent = "";
  try {
    const m = await api("GET", `/v1/topics/${encodeURIComponent(topic)}/messages/${encodeURIComponent(msgId)}`);
    $("message-status").textContent = m.status;
    $("message-deliver-at").textContent = fmtTime(m.deliverAt);
    $("message-deliver-at").dataset.value = String(m.deliverAt);
    $("message-offset").textContent = m.offset === undefined ? "–" : String(m.offset);
    $("message-info").hidden = false;
    $("cancel-button").hidden = !(m.status === "SCHEDULED" && may("cancel") && mayUseTopic(topic));
  } catch (err) {
    $("message-result").textContent = err.status === 404 ? `No message ${msgId} in topic ${topic}.`
      : err.status === 403 ? `This token may not read topic ${topic}.` : err.message;
  }
}

async function cancelMessage() {
  const topic = $("lookup-topic").value.trim();
  const msgId = $("lookup-id").value.trim();
  try {
    const r = await api("DELETE", `/v1/topics/${encodeURIComponent(topic)}/messages/${encodeURIComponent(msgId)}`);
    await lookup();
    $("message-result").textContent = `Cancelled: ${r.msgId} is ${r.status}.`;
  } catch (err) {
    $("message-result").textContent = err.code === "ALREADY_DELIVERED"
      ? "Too late: the message was already delivered." : `Cancel failed: ${err.message}`;
  }
  refresh();
}

// --- wiring --------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("zone").textContent = ZONE;
  $("signin").addEventListener("submit", (e) => {
    e.preventDefault();
    const token = $("token").value.trim();
    $("token").value = "";
    if (token) signIn(token);
  });
  $("signout").addEventListener("click", signOut);
  $("lookup").addEventListener("submit", (e) => { e.preventDefault(); lookup(); });
  $("cancel-button").addEventListener("click", cancelMessage);
  $("timeline-topic").addEventListener("change", (e) => {
    state.timeline.topic = e.target.value;
    refreshTimeline().catch((err) => showError(`Timeline: ${err.message}`));
  });
  for (const button of document.querySelectorAll("[data-span]")) {
    button.addEventListener("click", () => {
      state.timeline.span = Number(button.dataset.span);
      state.timeline.from = null;
      refreshTimeline().catch((err) => showError(`Timeline: ${err.message}`));
    });
  }
  const move = (fraction) => {
    const tl = state.timeline;
    tl.from = (tl.from !== null ? tl.from : state.serverNow) + fraction * tl.span;
    refreshTimeline().catch((err) => showError(`Timeline: ${err.message}`));
  };
  $("pan-back").addEventListener("click", () => move(-0.5));
  $("pan-forward").addEventListener("click", () => move(0.5));
  $("pan-now").addEventListener("click", () => {
    state.timeline.from = null; // follow the server's now again
    refreshTimeline().catch((err) => showError(`Timeline: ${err.message}`));
  });
  $("zoom-out").addEventListener("click", () => {
    const tl = state.timeline;
    const from = tl.from !== null ? tl.from : state.serverNow;
    tl.from = Math.max(0, from - 1.5 * tl.span);
    tl.span = Math.min(tl.span * 4, 3650 * 86400e3);
    refreshTimeline().catch((err) => showError(`Timeline: ${err.message}`));
  });
  render();
  if (state.token) signIn(state.token);
});
