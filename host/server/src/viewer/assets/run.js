// One run's page: the graph with live node states, the decisions waiting for a person
// (a gate, supervisor escalations), the selected node's invocations and the run's
// interventions. Records arrive on the event stream; when the server stops driving the
// run (paused, ended, not adopted) the stream ends and the page re-reads the run.
import { call, stream, artifact, ApiError } from "./api.js";
import { RunModel, occLabel } from "./state.js";
import { draw } from "./graph.js";

/** Builds an element: h("div", {class: "x"}, child, "text", …). */
export function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) e.append(c);
  return e;
}

/** Replaces `parent`'s children, skipping empty ones (null, false). */
export function fill(parent, ...children) {
  parent.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

export function badge(state, id) {
  return h("span", { class: `badge st-${state}`, id, "data-state": state }, state);
}

export function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "—";
}

function duration(ms) {
  if (ms < 1) return `${(ms * 1000).toFixed(0)} µs`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

const number = (n) => n.toLocaleString("en-US");
const LIMIT = 600;
const HEX64 = /^[0-9a-f]{64}$/i;

function artifactRefs(v, depth = 0, out = []) {
  if (!v || typeof v !== "object" || depth > 3) return out;
  if (typeof v.sha256 === "string" && HEX64.test(v.sha256)) out.push(v);
  else for (const x of Array.isArray(v) ? v : Object.values(v)) artifactRefs(x, depth + 1, out);
  return out;
}

function showFull(title, text) {
  const d = document.getElementById("full");
  document.getElementById("full-title").textContent = title;
  document.getElementById("full-body").textContent = text;
  document.getElementById("full-close").onclick = () => d.close();
  d.showModal();
}

/** Opens artifact `ref` of run `runId`: its text in the dialog, or a download. */
async function openArtifact(runId, ref, title, download) {
  try {
    const blob = await artifact(runId, ref.sha256);
    if (download) {
      const a = h("a", { href: URL.createObjectURL(blob), download: `${ref.sha256.slice(0, 12)}.bin` });
      document.body.append(a);
      a.click();
      a.remove();
    } else {
      showFull(title, await blob.text());
    }
  } catch (e) {
    showFull(`artifact ${ref.sha256}`, e.message);
  }
}

function link(text, cls, onclick) {
  return h("a", { href: "#", class: cls, onclick: (ev) => { ev.preventDefault(); onclick(); } }, text);
}

/**
 * A value, cut short past LIMIT characters with a link to all of it; a value the run
 * stored as an artifact (`{"$artifact": {sha256, size}}` in the log) links to the
 * artifact, and so does any other artifact reference inside a value.
 */
function valueView(runId, title, v) {
  const whole = v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 1 && v.$artifact;
  if (whole && HEX64.test(whole.sha256 || "")) {
    return h("div", {},
      h("div", { class: "value muted" }, `Stored as an artifact (${whole.size != null ? `${number(whole.size)} bytes` : "size unknown"}), too large to show inline.`),
      h("div", { class: "row" },
        link("show the value", "artifact-link", () => openArtifact(runId, whole, title, false)),
        link("download", "artifact-download", () => openArtifact(runId, whole, title, true))));
  }
  const text = typeof v === "string" ? v : JSON.stringify(v, null, 2);
  const long = text.length > LIMIT;
  const box = h("div", { class: "value" }, h("pre", {}, long ? `${text.slice(0, LIMIT)}…` : text));
  const links = [];
  if (long) links.push(link(`show the full value (${number(text.length)} characters)`, "full-link", () => showFull(title, text)));
  for (const ref of artifactRefs(v)) {
    links.push(link(`artifact ${ref.sha256.slice(0, 12)}…${ref.size != null ? ` (${number(ref.size)} bytes)` : ""}`,
      "artifact-link", () => openArtifact(runId, ref, title, false)));
  }
  return links.length ? h("div", {}, box, h("div", { class: "row" }, links)) : box;
}

function metricsText(m) {
  if (!m) return "";
  const parts = [`wall ${duration((m.wall_us || 0) / 1000)}`];
  if (m.fuel != null) parts.push(`fuel ${number(m.fuel)}`);
  if (m.peak_memory_bytes != null) parts.push(`memory ${number(Math.round(m.peak_memory_bytes / 1024))} KiB`);
  if (m.cost_usd) parts.push(`$${m.cost_usd.toFixed(4)}`);
  return parts.join(" · ");
}

function verdictText(v) {
  const d = v.verdict || {};
  const note = d.note ? ` — “${d.note}”` : "";
  return `${occLabel(v.occurrence)}: ${d.verdict || JSON.stringify(d)} by ${v.by}${note}`;
}

const sleep = (ms, signal) => new Promise((res) => {
  const t = setTimeout(res, ms);
  signal.addEventListener("abort", () => { clearTimeout(t); res(); }, { once: true });
});

/** Shows run `id` in `main`; returns the function that stops its updates. */
export function showRun(main, id, ctx) {
  const abort = new AbortController();
  const signal = abort.signal;
  let model = null;
  let selected = null;
  let update = null;
  let escalations = [];
  let actionSig = null;
  let wake = null; // resolves the wait before the next stream connection
  let frame = 0;

  const head = h("div", { class: "card" });
  const graphBox = h("div");
  const legend = h("div", { class: "legend" }, ...["pending", "running", "waiting", "completed", "failed", "skipped"]
    .map((s) => h("span", {}, h("i", { class: `sw-${s}` }), s)));
  const action = h("div", { class: "card action", id: "action", hidden: true });
  const detail = h("div", { class: "card", id: "detail" });
  const interventions = h("div", { class: "card", id: "interventions" });
  const events = h("div", { class: "card" });
  const banner = h("div");
  fill(main, banner, head, action,
    h("div", { class: "card graph-card" }, graphBox, legend),
    h("div", { class: "layout" }, detail, h("div", {}, interventions, events)));

  const fail = (e) => {
    if (e instanceof ApiError && e.status === 401) { abort.abort(); ctx.authFailed(e); return; }
    fill(banner, h("p", { class: "banner error", id: "run-error-banner" }, e.message));
  };

  const select = (nodeId) => { selected = selected === nodeId ? null : nodeId; render(); };
  // Graph nodes drawn opened, by path. Opening one also selects it (its panel lists
  // its inner nodes); closing one closes those inside it too.
  const open = new Set();
  const redraw = () => { update = draw(graphBox, model.doc, model.groups, open, select, toggle); };
  const toggle = (path) => {
    if (open.has(path)) {
      for (const p of [...open]) if (p === path || p.startsWith(`${path}/`)) open.delete(p);
    } else {
      open.add(path);
    }
    selected = path;
    redraw();
    render();
  };
  // Selects a node inside graph nodes, opening each around it so it is drawn.
  const reveal = (nodeId) => {
    let grew = false;
    for (const p of model.groups.keys()) {
      if (nodeId.startsWith(`${p}/`) && !open.has(p)) { open.add(p); grew = true; }
    }
    if (grew) redraw();
    selected = nodeId;
    render();
  };
  const schedule = () => { if (!frame) frame = requestAnimationFrame(() => { frame = 0; render(); }); };

  function renderHead() {
    const calls = [...model.occ.values()].filter((o) => o.state === "completed" || o.state === "failed").length;
    const stat = (k, v) => h("div", { class: "stat" }, h("div", { class: "k" }, k), h("div", { class: "v" }, v));
    fill(head, 
      h("div", { class: "run-head" }, h("h1", {}, model.graph), badge(model.state, "run-state"), h("span", { class: "id mono" }, model.id),
        h("span", { class: "spacer" }), cancelButton()),
      h("div", { class: "stats" },
        stat("Started", when(model.created)),
        stat("Invocations", number(calls)),
        stat("Execution time", duration(model.executionMs)),
        stat("Records", number(model.lastSeq + 1))),
      model.error ? h("div", { class: "run-error", id: "run-error" }, model.error) : null);
  }

  // Cancelling takes two clicks (the first arms it for a few seconds): a run's work is
  // not thrown away by one stray click, and no browser dialog is needed.
  let cancelArmed = 0;
  function cancelButton() {
    if (model.finished || model.cancelRequested || !["running", "queued", "paused", "interrupted"].includes(model.state)) return null;
    const armed = Date.now() < cancelArmed;
    const b = h("button", { class: "danger", id: "run-cancel", type: "button" }, armed ? "Click again to cancel the run" : "Cancel run");
    b.onclick = async () => {
      if (Date.now() >= cancelArmed) {
        cancelArmed = Date.now() + 4000;
        setTimeout(schedule, 4100);
        return render();
      }
      cancelArmed = 0;
      b.disabled = true;
      try {
        await call(`/api/runs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
        model.cancelRequested = true;
        reload();
      } catch (e) {
        b.disabled = false;
        fail(e);
      }
    };
    return b;
  }

  function renderAction() {
    const gate = model.waitingGate();
    const paused = !gate && model.state === "paused" && model.pause ? model.pause : null;
    const sig = JSON.stringify([gate && gate.node, paused && paused.event, escalations.map((e) => e.id)]);
    if (sig === actionSig) return;
    actionSig = sig;
    action.hidden = !gate && !paused && !escalations.length;
    const parts = [h("h2", {}, "Waiting for you")];
    if (gate) parts.push(gatePanel(gate));
    if (paused) parts.push(pausePanel(paused));
    for (const e of escalations) parts.push(escalationPanel(e));
    fill(action, ...parts);
  }

  function gatePanel(gate) {
    const note = h("textarea", { id: "gate-note", placeholder: "A note for the log (a rejection needs one)" });
    const msg = h("p", { class: "error-text", id: "gate-message" });
    const answer = async (verdict, btn) => {
      if (verdict === "reject" && !note.value.trim()) { msg.textContent = "Say why in the note: a rejection needs one."; return; }
      btn.disabled = true;
      try {
        await call(`/api/runs/${encodeURIComponent(id)}/gates/${encodeURIComponent(gate.node)}/${verdict}`,
          { method: "POST", body: note.value.trim() ? { note: note.value.trim() } : {} });
        msg.textContent = "";
        actionSig = null;
        reload();
      } catch (e) {
        btn.disabled = false;
        msg.textContent = e.message;
      }
    };
    const approve = h("button", { class: "primary", id: "gate-approve", type: "button" }, "Approve");
    const reject = h("button", { class: "danger", id: "gate-reject", type: "button" }, "Reject");
    approve.onclick = () => answer("approve", approve);
    reject.onclick = () => answer("reject", reject);
    return h("div", { class: "gate", "data-gate": gate.node },
      h("div", { class: "title" }, `Gate: ${gate.title}`),
      gate.prompt ? h("p", { class: "prompt" }, gate.prompt) : null,
      h("p", { class: "muted" }, "Approve runs on from the gate; reject cancels the run with your note as the reason."),
      note, h("div", { class: "row mt" }, approve, reject), msg);
  }

  /**
   * A pause other than a gate's: why, and a resume of exactly that pause. A reconcile
   * pause takes one of three answers: run the uncertain work again, record that it
   * completed (with the outputs given), or skip it; the last two say who and why.
   */
  function pausePanel(p) {
    const why = p.reason || {};
    const reconcile = why.why === "reconcile";
    const text = {
      reconcile: () => `Node ${occLabel(why.occurrence)} started and its result was never recorded, so whether its effect happened is unknown. If you know, say so: record that it completed (with its outputs) or skip it; neither runs it. Or run it again.`,
      suspend: () => `Node ${why.node} suspended the run: ${why.reason}`,
      interrupted: () => "The run was interrupted; nothing is uncertain. Resume runs it on.",
      budget: () => `The run's budget ran out: ${why.detail}`,
    }[why.why];
    const msg = h("p", { class: "error-text", id: "resume-message" });
    const send = async (btn, extra) => {
      btn.disabled = true;
      try {
        await call(`/api/runs/${encodeURIComponent(id)}/resume`, { method: "POST", body: { pause: p.event, ...extra } });
        msg.textContent = "";
        actionSig = null;
        reload();
      } catch (e) {
        btn.disabled = false;
        msg.textContent = e.message;
      }
    };
    const resume = h("button", { class: "primary", id: "run-resume", type: "button" }, reconcile ? "Run it again" : "Resume");
    resume.onclick = () => send(resume, {});
    if (!reconcile) {
      return h("div", { class: "pause", "data-pause": p.event },
        h("div", { class: "title" }, "Paused"),
        h("p", { class: "prompt" }, text ? text() : JSON.stringify(why)),
        h("div", { class: "row mt" }, resume), msg);
    }
    const declared = why.declared_outputs || {};
    const outputs = h("textarea", { id: "reconcile-outputs", class: "mono" });
    outputs.value = JSON.stringify(Object.fromEntries(Object.keys(declared).map((k) => [k, null])), null, 2);
    const types = Object.entries(declared).map(([k, d]) => `${k}: ${typeof d === "string" ? d : JSON.stringify(d)}`).join(", ");
    const by = h("input", { type: "text", id: "reconcile-by", placeholder: "Your name (recorded with the answer)" });
    by.value = sessionStorage.getItem("heddle.by") || "";
    const note = h("textarea", { id: "reconcile-note", placeholder: "Why: what tells you whether it happened (recorded with the answer)" });
    const answer = (btn, extra) => {
      if (!note.value.trim()) { msg.textContent = "Say why in the note: an answer is recorded with it."; return; }
      if (by.value.trim()) sessionStorage.setItem("heddle.by", by.value.trim());
      send(btn, { ...extra, note: note.value.trim(), ...(by.value.trim() ? { by: by.value.trim() } : {}) });
    };
    const completed = h("button", { id: "reconcile-completed", type: "button" }, "It completed: record these outputs");
    completed.onclick = () => {
      let given;
      try { given = JSON.parse(outputs.value || "{}"); } catch (err) { msg.textContent = `outputs: ${err.message}`; return; }
      answer(completed, { completed_with: given });
    };
    const skip = h("button", { id: "reconcile-skip", type: "button" }, "Skip it");
    skip.onclick = () => answer(skip, { skip: true });
    return h("div", { class: "pause", "data-pause": p.event },
      h("div", { class: "title" }, "Paused: uncertain work"),
      h("p", { class: "prompt" }, text()),
      h("label", {}, `Its outputs, if it completed${types ? ` (${types})` : ""}`), outputs,
      by, note,
      h("div", { class: "row mt" }, resume, completed, skip), msg);
  }

  function escalationPanel(e) {
    const note = h("input", { type: "text", class: "escalation-note", placeholder: "Note for the log (optional)" });
    const allowed = e.allowed || [];
    const suggested = e.candidate_output || Object.fromEntries(Object.keys(e.declared_outputs || {}).map((k) => [k, null]));
    const outputs = h("textarea", { class: "escalation-outputs" });
    outputs.value = JSON.stringify(suggested, null, 2);
    const msg = h("p", { class: "error-text" });
    const decide = async (verdict, btn) => {
      const body = { verdict };
      if (note.value.trim()) body.note = note.value.trim();
      if (verdict === "substitute") {
        try { body.outputs = JSON.parse(outputs.value || "{}"); } catch (err) { msg.textContent = `outputs: ${err.message}`; return; }
      }
      btn.disabled = true;
      try {
        await call(`/api/runs/${encodeURIComponent(id)}/escalations/${encodeURIComponent(e.id)}`, { method: "POST", body });
        escalations = escalations.filter((x) => x.id !== e.id);
        actionSig = null;
        render();
        refetchEscalations();
      } catch (err) {
        btn.disabled = false;
        msg.textContent = err.message;
        if (err instanceof ApiError && err.status === 404) refetchEscalations();
      }
    };
    const buttons = allowed.map((v) => {
      const b = h("button", { type: "button", "data-verdict": v, class: v === "retry" ? "primary" : v === "fail" ? "danger" : "" }, v.replace("_", " "));
      b.onclick = () => decide(v, b);
      return b;
    });
    const err = e.error || {};
    const left = e.deadline_ms ? Math.max(0, Math.round((e.deadline_ms - Date.now()) / 1000)) : null;
    const where = `${e.node}${e.invocation_key ? `[${e.invocation_key}]` : ""}`;
    return h("div", { class: "escalation", "data-escalation": e.id },
      h("div", { class: "title" }, `Node ${where} failed (attempt ${e.attempt || 1})`),
      h("div", { class: "muted" }, [err.kind, err.signature].filter(Boolean).join(" · ")),
      h("div", { class: "value" }, h("pre", { class: "error-text" }, typeof err === "string" ? err : err.message || "")),
      e.repair_error ? h("p", { class: "error-text" }, `The last substitute was refused: ${e.repair_error}`) : null,
      left !== null ? h("p", { class: "muted" }, `Without a decision it fails in about ${left} s.`) : null,
      note,
      allowed.includes("substitute") ? h("div", {}, h("label", {}, "Outputs for substitute"), outputs) : null,
      h("div", { class: "row mt" }, buttons), msg);
  }

  function renderDetail() {
    if (!selected) {
      const outs = model.outputs();
      const inputs = Object.entries(model.inputs);
      fill(detail, h("h2", {}, "Run"),
        h("p", { class: "muted" }, "Select a node to see its invocations."),
        inputs.length ? h("div", {}, h("label", {}, "Inputs"), ...inputs.map(([k, v]) => h("div", {}, h("span", { class: "mono" }, k), valueView(id, `input ${k}`, v)))) : null,
        h("label", {}, "Outputs"),
        outs.length ? h("div", { id: "run-outputs" }, ...outs.map((o) => h("div", { "data-output": o.name }, h("span", { class: "mono" }, o.name), valueView(id, `output ${o.name}`, o.value))))
          : h("p", { class: "muted" }, model.finished ? "None." : "Not yet."));
      return;
    }
    if (model.groups.has(selected)) return renderGroup();
    const node = model.byId.get(selected);
    if (!node) { selected = null; return renderDetail(); }
    const s = model.nodeState(selected);
    const t = model.totals(selected);
    const occs = model.occurrencesOf(selected);
    const props = node.properties || node.data || {};
    const kv = (k, v) => [h("span", { class: "k" }, k), h("span", {}, v)];
    // Control edges: a controlled node runs once per `run` event of its controllers.
    const controlled = model.doc.edges.filter((e) => (e.edge_type === "control" || e.targetHandle === "__control__") && e.target === selected).map((e) => e.source);
    const controls = model.doc.edges.filter((e) => (e.edge_type === "control" || e.targetHandle === "__control__") && e.source === selected).map((e) => e.target);
    fill(detail, 
      h("h2", {}, "Node"),
      h("div", { class: "run-head" }, h("strong", { class: "mono" }, selected), badge(s.state, "node-state")),
      h("div", { class: "kv mt" },
        kv("type", node.type),
        controlled.length ? kv("runs on", `control events from ${[...new Set(controlled)].join(", ")}`) : null,
        controls.length ? kv("controls", [...new Set(controls)].join(", ")) : null,
        kv("invocations", number(t.calls)),
        kv("wall time", duration(t.wallMs)),
        kv("fuel", t.fuel == null ? "—" : number(t.fuel)),
        s.reason ? kv("skipped", s.reason) : null),
      Object.keys(props).length ? h("div", { class: "mt", id: "node-properties" },
        h("span", { class: "muted" }, "properties"), valueView(id, `${selected} properties`, props)) : null,
      h("div", { class: "mt" }, ...occs.slice(0, 50).map((o) => h("div", { class: "occ" },
        h("div", { class: "head" }, h("span", { class: "mono" }, occLabel(o)), badge(o.state)),
        o.metrics ? h("div", { class: "muted" }, metricsText(o.metrics)) : null,
        o.started > 1 ? h("div", { class: "muted" }, `started ${o.started} times (offered again after an interruption)`) : null,
        o.error ? h("div", { class: "value" }, h("pre", { class: "error-text" }, o.error)) : null,
        ...(o.outputs || []).map(([k, v]) => h("div", {}, h("span", { class: "muted" }, k), valueView(id, `${occLabel(o)}.${k}`, v))),
        // The run events a controller's invocation sent, as its result recorded them.
        ...(o.emitted || []).filter(([k]) => k === "__control_sent__").map(([, v], i) => h("div", { class: "control-sent" },
          h("span", { class: "muted" }, `run event ${i + 1} → ${v && v.target}`), valueView(id, `${occLabel(o)} event ${i + 1}`, v && v.properties))),
        ...o.verdicts.map((v) => h("div", { class: "muted" }, `verdict: ${verdictText(v)}`))))),
      occs.length > 50 ? h("p", { class: "muted" }, `…and ${occs.length - 50} more invocations`) : null);
  }

  /**
   * A graph node: what it includes, and each node inside it with its state, its
   * invocations and their errors one click away.
   */
  function renderGroup() {
    const g = model.groups.get(selected);
    const s = model.nodeState(selected);
    const memo = new Map();
    const kv = (k, v) => [h("span", { class: "k" }, k), h("span", {}, v)];
    const rows = model.inside(selected).map((nid) => {
      const st = model.nodeState(nid, memo);
      const node = model.byId.get(nid);
      const occs = model.occurrencesOf(nid);
      const failed = occs.filter((o) => o.state === "failed" && o.error);
      return h("li", { "data-inner": nid },
        h("div", { class: "occ head" },
          link(nid, "mono inner-link", () => reveal(nid)),
          h("span", { class: "muted" }, node.type),
          badge(st.state)),
        occs.length ? h("div", { class: "muted" }, `${number(occs.length)} invocation${occs.length > 1 ? "s" : ""} · ${st.label}`) : null,
        ...failed.slice(0, 3).map((o) => h("div", { class: "value" }, h("pre", { class: "error-text" }, `${occLabel(o)}: ${o.error}`))));
    });
    fill(detail,
      h("h2", {}, "Graph node"),
      h("div", { class: "run-head" }, h("strong", { class: "mono" }, selected), badge(s.state, "node-state")),
      h("div", { class: "kv mt" },
        kv("graph", g.graph),
        kv("sha256", h("span", { class: "mono" }, g.sha256)),
        kv("state", s.label)),
      h("p", { class: "muted" }, open.has(selected) ? "Drawn opened above; click it to close it." : "Click it above to open it."),
      h("label", {}, "Inside"),
      h("ul", { class: "list", id: "group-nodes" }, rows));
  }

  function renderInterventions() {
    const items = model.interventions.map((v) => h("li", {}, verdictText(v)));
    fill(interventions, h("h2", {}, "Interventions"),
      items.length ? h("ul", { class: "list" }, items) : h("p", { class: "muted" }, "No one has intervened in this run."));
  }

  function renderEvents() {
    const recent = model.events.slice(-40).reverse();
    fill(events, h("h2", {}, "Latest events"),
      h("ul", { class: "list events" }, recent.map((r) => h("li", {},
        h("span", { class: "seq" }, `#${r.seq}`), h("strong", {}, r.kind), " ",
        r.occurrence ? h("span", { class: "mono" }, occLabel(r.occurrence)) : "",
        r.kind === "finished" ? ` ${r.status}${r.error ? `: ${r.error}` : ""}` : "",
        r.kind === "paused" ? ` ${r.pause.why}${r.pause.node ? ` at ${r.pause.node}` : ""}` : ""))));
  }

  function render() {
    if (!model) return;
    model.pendingNodes = new Set(escalations.map((e) => e.node));
    renderHead();
    const memo = new Map();
    update((nid) => {
      const s = model.nodeState(nid, memo);
      const t = model.totals(nid);
      return t.calls && s.state !== "pending" ? { ...s, detail: duration(t.wallMs) } : s;
    }, selected);
    renderAction();
    renderDetail();
    renderInterventions();
    renderEvents();
    ctx.setLive(!model.finished && model.state === "running");
  }

  // Re-reads the run's summary (its state as the server sees it) and wakes the stream.
  async function reload() {
    try {
      const run = await call(`/api/runs/${encodeURIComponent(id)}`);
      if (model.summary(run)) render();
    } catch (e) { fail(e); }
    if (wake) wake();
  }

  // The pending escalations, read again whenever the stream says they may have changed
  // (an escalation notice, an escalated/verdict/failed record) or an answer was given.
  let fetching = null;
  let again = false;
  function refetchEscalations() {
    if (fetching) { again = true; return fetching; }
    fetching = (async () => {
      do {
        again = false;
        try {
          const r = await call(`/api/runs/${encodeURIComponent(id)}/escalations`);
          const next = (r && r.escalations) || [];
          if (JSON.stringify(next.map((e) => e.id)) !== JSON.stringify(escalations.map((e) => e.id))) {
            escalations = next;
            schedule();
          }
        } catch (e) {
          if (e instanceof ApiError && e.status === 401) fail(e);
        }
      } while (again && !signal.aborted);
      fetching = null;
    })();
    return fetching;
  }

  async function follow() {
    let delay = 300;
    let catchUps = 0;
    while (!signal.aborted) {
      try {
        await stream(id, model.lastSeq, (kind, r) => {
          if (kind === "escalation") refetchEscalations();
          else if (model.apply(r)) {
            if (kind === "escalated" || kind === "verdict" || kind === "failed") refetchEscalations();
            schedule();
          }
        }, signal);
        delay = 300;
      } catch (e) {
        if (signal.aborted) return;
        if (e instanceof ApiError) return fail(e);
        delay = Math.min(delay * 2, 3000);
      }
      if (signal.aborted) return;
      if (model.ended) { ctx.setLive(false); return; }
      await reload();
      // Ended on the server but its last records not read yet: read them now (a
      // run whose log has no ending at all is shown as the server reports it).
      if (model.finished && catchUps++ < 3) continue;
      if (model.finished) { ctx.setLive(false); return; }
      // Paused or between owners: look again soon (an answer to a gate wakes this).
      await Promise.race([sleep(delay, signal), new Promise((res) => { wake = res; })]);
      wake = null;
      delay = Math.min(delay * 2, 3000);
    }
  }

  (async () => {
    try {
      const run = await call(`/api/runs/${encodeURIComponent(id)}`);
      model = new RunModel(run);
      redraw();
      render();
      refetchEscalations();
      await follow();
    } catch (e) {
      fail(e);
    }
  })();

  return () => { abort.abort(); ctx.setLive(false); };
}
