// Draws a graph document as SVG: node positions from the document's UI properties
// when every node has one, else a layered layout computed from the edges.

const SVG = "http://www.w3.org/2000/svg";
export const NODE_W = 164;
export const NODE_H = 66;
const GAP_X = 50;
const GAP_Y = 26;
const MARGIN = 24;

function el(name, attrs = {}, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function uiPosition(n) {
  const p = n.ui_properties && n.ui_properties.position;
  return p && Number.isFinite(p.x) && Number.isFinite(p.y) ? p : null;
}

/** Layers by longest path from the sources, ordered to reduce crossings. */
function layered(doc) {
  const ids = doc.nodes.map((n) => n.id);
  const known = new Set(ids);
  const preds = new Map(ids.map((id) => [id, []]));
  const succs = new Map(ids.map((id) => [id, []]));
  for (const e of doc.edges) {
    if (!known.has(e.source) || !known.has(e.target) || e.source === e.target) continue;
    preds.get(e.target).push(e.source);
    succs.get(e.source).push(e.target);
  }
  const layer = new Map();
  const visiting = new Set();
  const depth = (id) => {
    if (layer.has(id)) return layer.get(id);
    if (visiting.has(id)) return 0; // a cycle: cut it here
    visiting.add(id);
    const d = preds.get(id).reduce((m, p) => Math.max(m, depth(p) + 1), 0);
    visiting.delete(id);
    layer.set(id, d);
    return d;
  };
  ids.forEach(depth);
  const layers = [];
  for (const id of ids) (layers[layer.get(id)] ||= []).push(id);
  // Barycenter sweeps: each node towards the mean position of its neighbours.
  const order = new Map();
  const index = () => layers.forEach((l) => l.forEach((id, i) => order.set(id, i)));
  index();
  const mean = (ns, own) => (ns.length ? ns.reduce((s, n) => s + order.get(n), 0) / ns.length : own);
  for (let sweep = 0; sweep < 6; sweep++) {
    const down = sweep % 2 === 0;
    const seq = down ? layers.slice(1) : layers.slice(0, -1).reverse();
    for (const l of seq) {
      const key = new Map(l.map((id) => [id, mean(down ? preds.get(id) : succs.get(id), order.get(id))]));
      l.sort((a, b) => key.get(a) - key.get(b));
      l.forEach((id, i) => order.set(id, i));
    }
  }
  const tallest = Math.max(...layers.map((l) => l.length));
  const pos = new Map();
  layers.forEach((l, li) => {
    // Centre each layer against the tallest one.
    const offset = ((tallest - l.length) * (NODE_H + GAP_Y)) / 2;
    l.forEach((id, i) => pos.set(id, { x: MARGIN + li * (NODE_W + GAP_X), y: MARGIN + offset + i * (NODE_H + GAP_Y) }));
  });
  return pos;
}

/**
 * How much a document's positions must be spread so no two of this page's boxes
 * overlap (an editor's nodes may be drawn smaller or placed closer than these): the
 * least factor that separates every pair along one axis. Null when none up to 6 does
 * (nodes on the same spot), or for a graph too large to check pair by pair.
 */
function spread(ps) {
  if (ps.length > 400) return null;
  let factor = 1;
  for (let i = 0; i < ps.length; i++) {
    for (let j = i + 1; j < ps.length; j++) {
      const dx = Math.abs(ps[i].x - ps[j].x), dy = Math.abs(ps[i].y - ps[j].y);
      const need = Math.min(dx ? (NODE_W + GAP_Y) / dx : Infinity, dy ? (NODE_H + GAP_Y) / dy : Infinity);
      factor = Math.max(factor, need);
    }
  }
  return factor <= 6 ? factor : null;
}

export function layout(doc) {
  let pos;
  const ps = doc.nodes.map(uiPosition);
  const factor = doc.nodes.length && ps.every(Boolean) ? spread(ps) : null;
  if (factor) {
    const minX = Math.min(...ps.map((p) => p.x));
    const minY = Math.min(...ps.map((p) => p.y));
    pos = new Map(doc.nodes.map((n, i) => [n.id, {
      x: Math.round((ps[i].x - minX) * factor) + MARGIN,
      y: Math.round((ps[i].y - minY) * factor) + MARGIN,
    }]));
  } else {
    pos = layered(doc);
  }
  let w = 0, h = 0;
  for (const p of pos.values()) {
    w = Math.max(w, p.x + NODE_W + MARGIN);
    h = Math.max(h, p.y + NODE_H + MARGIN);
  }
  return { pos, width: w, height: h };
}

function shorten(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/**
 * Renders `doc` into `container`; returns update(stateOf) that restyles each node from
 * stateOf(id) → {state, label, detail}. `onSelect(id)` is called on a click.
 */
export function draw(container, doc, onSelect) {
  const { pos, width, height } = layout(doc);
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": "run graph" });
  const defs = el("defs", {}, svg);
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" }, defs);
  el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa3b1" }, marker);
  const edges = el("g", {}, svg);
  const edgeEls = [];
  for (const e of doc.edges) {
    const a = pos.get(e.source), b = pos.get(e.target);
    if (!a || !b) continue;
    const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x - 2, y2 = b.y + NODE_H / 2;
    const dx = Math.max(30, (x2 - x1) / 2);
    const cls = ["edge", e.edge_type === "control" ? "control" : "", e.when ? "conditional" : ""].join(" ");
    const path = el("path", { class: cls, d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`, "marker-end": "url(#arrow)" }, edges);
    el("title", {}, path).textContent = `${e.source}.${e.sourceHandle} → ${e.target}.${e.targetHandle}${e.when ? ` when ${e.when}` : ""}`;
    edgeEls.push({ e, path });
  }
  const nodes = el("g", {}, svg);
  const nodeEls = new Map();
  for (const n of doc.nodes) {
    const p = pos.get(n.id);
    const g = el("g", { class: "node st-pending", transform: `translate(${p.x},${p.y})`, "data-node": n.id, tabindex: "0" }, nodes);
    el("rect", { class: "box", width: NODE_W, height: NODE_H, rx: 8 }, g);
    el("rect", { class: "bar", width: 6, height: NODE_H - 2, x: 1, y: 1, rx: 3 }, g);
    const title = el("text", { class: "title", x: 16, y: 21 }, g);
    title.textContent = shorten(n.name || n.id, 22);
    const type = el("text", { class: "type", x: 16, y: 37 }, g);
    type.textContent = shorten(n.type, 28);
    const status = el("text", { class: "status", x: 16, y: 55 }, g);
    status.textContent = "pending";
    const tip = el("title", {}, g);
    tip.textContent = `${n.id} (${n.type})`;
    g.addEventListener("click", () => onSelect(n.id));
    g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") onSelect(n.id); });
    nodeEls.set(n.id, { g, status, tip, node: n });
  }
  container.replaceChildren(svg);
  return (stateOf, selected) => {
    for (const [id, { g, status, tip, node }] of nodeEls) {
      const s = stateOf(id);
      g.setAttribute("class", `node st-${s.state}${id === selected ? " selected" : ""}`);
      g.dataset.state = s.state;
      g.dataset.label = s.label;
      status.textContent = shorten(s.detail ? `${s.label} · ${s.detail}` : s.label, 30);
      tip.textContent = `${node.id} (${node.type}): ${s.label}${s.reason ? ` — ${s.reason}` : ""}`;
    }
    for (const { e, path } of edgeEls) {
      path.classList.toggle("hot", stateOf(e.target).state === "running");
    }
  };
}
