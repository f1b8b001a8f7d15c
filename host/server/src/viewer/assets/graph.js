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

/** Every box's size unless told otherwise (an opened graph node's is its drawing's). */
const UNIT = { w: NODE_W, h: NODE_H };

/** Layers by longest path from the sources, ordered to reduce crossings. */
function layered(doc, size) {
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
  const extent = (l) => l.reduce((s, id) => s + size(id).h + GAP_Y, 0);
  const tallest = Math.max(...layers.map(extent));
  const pos = new Map();
  let x = MARGIN;
  for (const l of layers) {
    // Centre each layer against the tallest one.
    let y = MARGIN + (tallest - extent(l)) / 2;
    for (const id of l) {
      pos.set(id, { x, y });
      y += size(id).h + GAP_Y;
    }
    x += Math.max(...l.map((id) => size(id).w)) + GAP_X;
  }
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

/**
 * Where each node of `doc` goes and the size of the whole. `size(id)` is a node's box;
 * the document's own positions are used only while every box has the usual size (an
 * opened graph node needs room its author's positions did not leave).
 */
export function layout(doc, size = () => UNIT) {
  let pos;
  const ps = doc.nodes.map(uiPosition);
  const uniform = doc.nodes.every((n) => size(n.id) === UNIT);
  const factor = doc.nodes.length && uniform && ps.every(Boolean) ? spread(ps) : null;
  if (factor) {
    const minX = Math.min(...ps.map((p) => p.x));
    const minY = Math.min(...ps.map((p) => p.y));
    pos = new Map(doc.nodes.map((n, i) => [n.id, {
      x: Math.round((ps[i].x - minX) * factor) + MARGIN,
      y: Math.round((ps[i].y - minY) * factor) + MARGIN,
    }]));
  } else {
    pos = layered(doc, size);
  }
  let w = 0, h = 0;
  for (const [id, p] of pos) {
    w = Math.max(w, p.x + size(id).w + MARGIN);
    h = Math.max(h, p.y + size(id).h + MARGIN);
  }
  return { pos, width: w, height: h };
}

/**
 * One level of a run's graph. `flat` is the graph as the run planned it (every node of
 * a graph node's inner graph at its path, `g/inner`), `groups` the graph nodes' paths.
 * The level `prefix` ("" for the top, else a graph node's path) holds the nodes whose
 * innermost graph node is `prefix`, and each graph node directly inside it as one node
 * (`group: true`); an edge into or out of a graph node is drawn to or from it, named
 * by its port.
 */
export function levelDoc(flat, groups, prefix) {
  const paths = [...groups].sort((a, b) => b.length - a.length); // innermost first
  const owner = (id) => paths.find((p) => id.startsWith(`${p}/`)) ?? "";
  // The node of this level that `id` is or is inside; null for a node elsewhere.
  const at = (id) => {
    for (let o = id; ; ) {
      const up = owner(o);
      if (up === prefix) return o;
      if (up === "") return null;
      o = up;
    }
  };
  const nodes = [];
  const seen = new Set();
  const add = (id, n) => {
    if (seen.has(id)) return;
    seen.add(id);
    nodes.push(n || { id, type: GROUP_TYPE, group: true });
  };
  for (const n of flat.nodes) {
    const m = at(n.id);
    if (m !== null) add(m, m === n.id && !groups.has(m) ? n : null);
  }
  for (const g of groups) if (owner(g) === prefix) add(g, null);
  const edges = [];
  const keys = new Set();
  for (const e of flat.edges) {
    const s = at(e.source), t = at(e.target);
    if (s === null || t === null || s === t) continue;
    const sourceHandle = s === e.source ? e.sourceHandle : e.source.slice(s.length + 1);
    const targetHandle = t === e.target ? e.targetHandle : e.target.slice(t.length + 1);
    const key = [s, sourceHandle, t, targetHandle].join("\u0000");
    if (keys.has(key)) continue;
    keys.add(key);
    edges.push({ ...e, source: s, sourceHandle, target: t, targetHandle });
  }
  return { nodes, edges };
}

/** The node type a graph node is written with. */
export const GROUP_TYPE = "heddle.graph";

function shorten(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** Room above an opened graph node's inner drawing, for its own title and state. */
const GROUP_HEAD = NODE_H - 12;

/**
 * Renders the run's graph into `container`: `flat` as the run planned it, `groups` its
 * graph nodes (path → what `plan.graphs` says of each), `open` the paths of those drawn
 * opened (a box holding their inner graph, itself drawn the same way), the others one
 * box each. Returns update(stateOf, selected) that restyles each node (graph nodes
 * included) from stateOf(id) → {state, label, detail}. `onSelect(id)` is called on a
 * click on a node, `onToggle(path)` on a click on a graph node.
 */
export function draw(container, flat, groups, open, onSelect, onToggle) {
  const paths = new Set(groups.keys());
  const level = (prefix) => {
    const doc = levelDoc(flat, paths, prefix);
    const inner = new Map();
    for (const n of doc.nodes) if (n.group && open.has(n.id)) inner.set(n.id, level(n.id));
    const size = (id) => {
      const l = inner.get(id);
      return l ? { w: Math.max(l.width, NODE_W), h: l.height + GROUP_HEAD } : UNIT;
    };
    return { doc, inner, size, ...layout(doc, size) };
  };
  const top = level("");
  const svg = el("svg", { viewBox: `0 0 ${top.width} ${top.height}`, width: top.width, height: top.height, role: "img", "aria-label": "run graph" });
  const defs = el("defs", {}, svg);
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" }, defs);
  el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa3b1" }, marker);
  const edgeEls = [];
  const nodeEls = new Map();

  const render = (parent, lv, prefix) => {
    const edges = el("g", {}, parent);
    for (const e of lv.doc.edges) {
      const a = lv.pos.get(e.source), b = lv.pos.get(e.target);
      if (!a || !b) continue;
      // Edges meet a box at the height of its title row, an opened graph node's too.
      const x1 = a.x + lv.size(e.source).w, y1 = a.y + NODE_H / 2, x2 = b.x - 2, y2 = b.y + NODE_H / 2;
      const dx = Math.max(30, (x2 - x1) / 2);
      const cls = ["edge", e.edge_type === "control" ? "control" : "", e.when ? "conditional" : ""].join(" ");
      const path = el("path", { class: cls, d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`, "marker-end": "url(#arrow)" }, edges);
      el("title", {}, path).textContent = `${e.source}.${e.sourceHandle} → ${e.target}.${e.targetHandle}${e.when ? ` when ${e.when}` : ""}`;
      edgeEls.push({ e, path });
    }
    const nodes = el("g", {}, parent);
    for (const n of lv.doc.nodes) {
      const p = lv.pos.get(n.id);
      const { w, h } = lv.size(n.id);
      const opened = lv.inner.get(n.id);
      const info = n.group ? groups.get(n.id) || {} : null;
      const g = el("g", { class: "node st-pending", transform: `translate(${p.x},${p.y})`, "data-node": n.id, tabindex: "0" }, nodes);
      if (n.group) {
        g.classList.add("group");
        g.dataset.open = opened ? "true" : "false";
        // A closed graph node is drawn as a stack: more than one node inside.
        if (!opened) el("rect", { class: "stack", width: w, height: h, x: 4, y: 4, rx: 8 }, g);
      }
      el("rect", { class: "box", width: w, height: h, rx: 8 }, g);
      el("rect", { class: "bar", width: 6, height: h - 2, x: 1, y: 1, rx: 3 }, g);
      const title = el("text", { class: "title", x: 16, y: 21 }, g);
      // Inside a graph node, its own id (the whole path is in the tooltip and the panel).
      const own = n.name || (prefix ? n.id.slice(prefix.length + 1) : n.id);
      title.textContent = n.group ? `${opened ? "▾" : "▸"} ${shorten(own, 20)}` : shorten(own, 22);
      const type = el("text", { class: "type", x: 16, y: 37 }, g);
      type.textContent = n.group ? shorten(`graph ${info.graph || ""}`, opened ? 60 : 28) : shorten(n.type, 28);
      const status = el("text", { class: "status", x: 16, y: 55 }, g);
      status.textContent = "pending";
      const tip = el("title", {}, g);
      const what = n.group ? `graph node, ${info.graph || "?"}; click to ${opened ? "close" : "open"}` : n.type;
      tip.textContent = `${n.id} (${what})`;
      const act = (ev) => {
        // A node inside an opened graph node is inside its element too.
        ev.stopPropagation();
        if (n.group) onToggle(n.id);
        else onSelect(n.id);
      };
      g.addEventListener("click", act);
      g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") act(ev); });
      nodeEls.set(n.id, { g, status, tip, what });
      if (opened) render(el("g", { class: "inner", transform: `translate(0,${GROUP_HEAD})` }, g), opened, n.id);
    }
  };
  render(svg, top, "");
  container.replaceChildren(svg);
  return (stateOf, selected) => {
    for (const [id, { g, status, tip, what }] of nodeEls) {
      const s = stateOf(id);
      g.classList.remove(...[...g.classList].filter((c) => c.startsWith("st-") || c === "selected"));
      g.classList.add(`st-${s.state}`);
      if (id === selected) g.classList.add("selected");
      g.dataset.state = s.state;
      g.dataset.label = s.label;
      status.textContent = shorten(s.detail ? `${s.label} · ${s.detail}` : s.label, 30);
      tip.textContent = `${id} (${what}): ${s.label}${s.reason ? ` — ${s.reason}` : ""}`;
    }
    for (const { e, path } of edgeEls) {
      path.classList.toggle("hot", stateOf(e.target).state === "running");
    }
  };
}
