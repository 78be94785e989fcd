// The cmemu web view: one EventSource on /events (a `snapshot`, then `diff`s), no framework.
"use strict";

const state = { devices: {}, events: [], epoch: null, scale: 1, cells: new Map() };
const $ = (id) => document.getElementById(id);
const metricSelect = $("metric");

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) node.append(child);
  return node;
}

const fmtBytes = (b) => {
  if (b === undefined || b === null) return "?";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (b >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return `${b.toFixed(b < 10 && i ? 1 : 0)} ${units[i]}`;
};
const pct = (x) => (x === undefined || x === null ? "?" : `${(100 * x).toFixed(1)}%`);
const bad = (health) => health !== "SERVING" && health !== "UNKNOWN";

// --- the heat map ------------------------------------------------------------------------------

function buildHeatmap(layout) {
  const root = $("heatmap");
  root.replaceChildren();
  state.cells.clear();
  const several = layout.supernodes.length > 1;
  for (const sn of layout.supernodes) {
    const racks = el("div", { class: "racks" });
    for (const rack of sn.racks) {
      const box = el("div", { class: "rack", "data-rack": rack.id }, el("div", { class: "label" }, rack.id));
      for (const node of rack.nodes) {
        const row = el("div", { class: "node", "data-node": node.id }, el("span", { class: "label" }, node.id));
        for (const npu of node.npus) {
          const pkg = el("span", { class: "npu", "data-device": npu.id });
          for (const die of npu.dies) {
            const cell = el("span", { class: "die", "data-die": die, "data-device": npu.id });
            pkg.append(cell);
            if (!state.cells.has(npu.id)) state.cells.set(npu.id, []);
            state.cells.get(npu.id).push(cell);
          }
          row.append(pkg);
        }
        box.append(row);
      }
      racks.append(box);
    }
    root.append(el("div", { class: "supernode", "data-supernode": sn.id },
      several ? el("h3", {}, sn.id) : "", racks));
  }
}

function ramp(x) {  // 0 -> dark blue, 1 -> hot orange
  const v = Math.max(0, Math.min(1, x || 0));
  return `hsl(${220 - 190 * v}, ${55 + 35 * v}%, ${22 + 33 * v}%)`;
}

function paintDevice(id) {
  const cells = state.cells.get(id);
  if (!cells) return;
  const d = state.devices[id] || {};
  const metric = metricSelect.value;
  const share = d.hbm_capacity ? d.hbm_used / d.hbm_capacity : 0;
  const title = `${id}\nhealth ${d.health}${d.reason ? ` (${d.reason})` : ""}\n` +
    `HBM ${fmtBytes(d.hbm_used)} of ${fmtBytes(d.hbm_capacity)} (${pct(share)})\n` +
    `utilisation ${pct(d.utilization)}\n(telemetry is per NPU: both dies show the package)`;
  for (const cell of cells) {
    cell.setAttribute("data-health", d.health || "UNKNOWN");
    cell.classList.toggle("bad", bad(d.health));
    cell.style.background = metric === "hbm" ? ramp(share)
      : metric === "utilization" ? ramp(d.utilization) : "";
    cell.title = `${cell.dataset.die}: ${title}`;
  }
}

function paintAll() {
  for (const id of state.cells.keys()) paintDevice(id);
  const metric = metricSelect.value;
  const legend = $("legend");
  if (metric === "health") {
    legend.replaceChildren(el("i", { style: "background:var(--ok)" }), "SERVING ",
      el("i", { style: "background:var(--bad)" }), "faulted / not serving ",
      el("i", { style: "background:var(--unknown)" }), "unknown");
  } else {
    legend.replaceChildren("0% ", ...[0, .25, .5, .75, 1].map((x) => el("i", { style: `background:${ramp(x)}` })),
      " 100% ", el("i", { style: "background:var(--bad)" }), "faulted");
  }
  updateCounts();
}
metricSelect.addEventListener("change", paintAll);

function updateCounts() {
  const npus = [...state.cells.keys()];
  const dies = npus.reduce((n, id) => n + state.cells.get(id).length, 0);
  const down = npus.filter((id) => bad((state.devices[id] || {}).health)).length;
  $("counts").textContent = `${npus.length} NPUs, ${dies} dies` + (down ? `, ${down} NPUs not serving` : "");
}

// --- the panels --------------------------------------------------------------------------------

function renderPlanes(planes) {
  $("planes").replaceChildren(...Object.entries(planes || {}).map(([p, v]) =>
    el("div", { class: "bar" + (v.links_down ? " down" : ""), title: `${v.links_down} links down, ${v.capacity_gb_s.toFixed(0)} GB/s live` },
      el("span", {}, `p${p}`),
      el("span", { class: "track" }, el("span", { class: "fill", style: `display:block;width:${(100 * v.utilization).toFixed(1)}%` })),
      el("span", { class: "muted" }, pct(v.utilization)))));
}

function renderLinks(links) {
  const rows = (links || []).map((l) => el("tr", { title: `${l.kind}, ${l.capacity_gb_s} GB/s, ${l.active_flows} flows${l.up ? "" : ", DOWN"}` },
    el("td", {}, l.link), el("td", { class: "num" }, fmtBytes(l.bytes)), el("td", { class: "num" }, pct(l.utilization))));
  $("links").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "muted" }, "no traffic yet"))]));
}

function renderFaults(faults) {
  faults = faults || [];
  $("fault-count").textContent = faults.length ? `(${faults.length})` : "";
  const rows = faults.map((f) => el("tr", { "data-fault": f.id },
    el("td", {}, f.kind), el("td", {}, f.target), el("td", { class: "muted" }, f.detail || f.id)));
  $("faults").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "muted" }, "none"))]));
}

function renderFigures(panel, list, figures, labels) {
  $(panel).hidden = !figures;
  if (!figures) return;
  $(list).replaceChildren(...Object.entries(labels).flatMap(([k, label]) => {
    const v = figures[k];
    const text = v === null || v === undefined ? "-" : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(2) : String(v);
    return [el("dt", {}, label), el("dd", {}, text)];
  }));
}

function renderEvents() {
  const items = state.events.slice(-100).reverse().map((e) =>
    el("li", { class: `ev-${e.event}` }, `${new Date(e.wall * 1000).toLocaleTimeString()} ${e.device} ${e.event} ${e.detail || ""}`));
  $("events").replaceChildren(...items);
}

function renderSources(sources) {
  $("sources").textContent = "feeds: " + Object.entries(sources || {}).map(([k, v]) => `${k} ${v}`).join(" · ");
}

function apply(doc, full) {
  if (full) {
    state.devices = doc.devices;
    state.events = doc.events || [];
    state.epoch = doc.epoch_wall_s;
    state.scale = doc.time_scale;
    $("title").textContent = `cmemu ${doc.supernode} (${doc.preset})`;
    buildHeatmap(doc.layout);
    paintAll();
  } else if (doc.devices) {
    Object.assign(state.devices, doc.devices);
    for (const id of Object.keys(doc.devices)) paintDevice(id);
    updateCounts();
  }
  if (doc.events && !full) state.events.push(...doc.events);
  if (doc.events) { state.events = state.events.slice(-200); renderEvents(); }
  if ("planes" in doc) renderPlanes(doc.planes);
  if ("links" in doc) renderLinks(doc.links);
  if ("faults" in doc) renderFaults(doc.faults);
  if ("serving" in doc) renderFigures("serving-panel", "serving", doc.serving, {
    requests_completed: "requests done", requests_in_flight: "in flight", output_tokens_per_s: "output tokens/s",
    ttft_p50_ms: "TTFT p50 (ms)", ttft_p99_ms: "TTFT p99 (ms)", tpot_p50_ms: "TPOT p50 (ms)",
    prefix_hit_share: "prefix hit share", kv_slots_held: "KV slots held", kv_slots: "KV slots" });
  if ("recovery" in doc) renderFigures("recovery-panel", "recovery", doc.recovery, {
    down_now: "devices down now", recovered: "recoveries", last_s: "last (emulated s)",
    mean_s: "mean (emulated s)", max_s: "max (emulated s)" });
  if ("sources" in doc) renderSources(doc.sources);
  document.body.dataset.version = doc.version;
}

// --- the stream ------------------------------------------------------------------------------

function connect() {
  const source = new EventSource("/events");
  const pill = $("connection");
  source.addEventListener("snapshot", (e) => { apply(JSON.parse(e.data), true); pill.dataset.state = "live"; pill.textContent = "live"; });
  source.addEventListener("diff", (e) => apply(JSON.parse(e.data), false));
  source.onerror = () => { pill.dataset.state = "lost"; pill.textContent = "reconnecting"; };
}

setInterval(() => {
  if (state.epoch === null) return;
  const emulated = (Date.now() / 1000 - state.epoch) * state.scale;
  $("clock").textContent = `emulated ${emulated.toFixed(1)} s (x${state.scale})`;
}, 500);

connect();
