// A run's state as the page shows it: the fold of its log records (the same records
// the server stores), applied one by one as they arrive on the event stream.

const ENDINGS = { completed: "completed", failed: "failed", cancelled: "cancelled", suspended: "paused", running: "interrupted" };
export const TERMINAL = new Set(["completed", "failed", "cancelled"]);
export const GATE_TYPE = "heddle.gate";

export function occKey(o) {
  return `${o.node}\u0000${o.key || ""}\u0000${o.n || 0}`;
}

/** "a[each:item=2]#3", as the command line prints an occurrence. */
export function occLabel(o) {
  let s = o.node;
  if (o.key) s += `[${o.key}]`;
  if (o.n) s += `#${o.n}`;
  return s;
}

/**
 * A pause as {event, reason: {why, node, …}}: the API's run summary gives it flattened
 * ({event, why, …}), a `paused` record as {why, …} under its sequence number.
 */
export function pauseOf(p) {
  if (!p) return null;
  return p.reason && typeof p.reason === "object" ? p : { event: p.event, reason: p };
}

export class RunModel {
  constructor(run) {
    this.id = run.run_id;
    this.graph = run.graph;
    this.created = run.created_ms;
    this.doc = run.document || { nodes: [], edges: [] };
    this.limits = run.limits;
    this.inputs = run.inputs || {};
    this.state = run.state;
    this.error = run.error || null;
    this.pause = pauseOf(run.pause);
    this.lastSeq = -1;
    this.occ = new Map();
    /** The same invocations by node, in the order they appeared (a fan-out's are many). */
    this.byNode = new Map();
    this.interventions = [];
    this.events = [];
    this.openedAt = null;
    this.executionMs = 0;
    this.cancelRequested = false;
    /** Whether the run's ending record has been read (not only reported by a summary). */
    this.ended = false;
    /** Nodes of a finished run that never ran, with the kernel's reason (`skipped` records). */
    this.skipped = new Map();
    /** Nodes with an escalation waiting for a person (from the escalations API). */
    this.pendingNodes = new Set();
    this.byId = new Map(this.doc.nodes.map((n) => [n.id, n]));
  }

  occurrence(o) {
    const k = occKey(o);
    let v = this.occ.get(k);
    if (!v) {
      v = { node: o.node, key: o.key || "", n: o.n || 0, state: "dispatched", started: 0, verdicts: [], escalations: [] };
      this.occ.set(k, v);
      if (!this.byNode.has(o.node)) this.byNode.set(o.node, []);
      this.byNode.get(o.node).push(v);
    }
    return v;
  }

  /** Applies one stored record; records already applied are ignored. */
  apply(r) {
    if (r.seq <= this.lastSeq) return false;
    this.lastSeq = r.seq;
    this.events.push(r);
    if (this.events.length > 400) this.events.shift();
    if (this.openedAt !== null) this.executionMs += Math.max(0, r.at_ms - this.lastAt);
    this.lastAt = r.at_ms;
    switch (r.kind) {
      case "opened":
        this.openedAt = r.at_ms;
        this.state = "running";
        this.error = null;
        // Skips written with an ending a crash cut short: the run goes on.
        this.skipped.clear();
        break;
      case "skipped":
        this.skipped.set(r.node, r.reason);
        break;
      case "dispatched":
        this.occurrence(r.occurrence);
        break;
      case "started": {
        const o = this.occurrence(r.occurrence);
        o.started += 1;
        o.state = "running";
        break;
      }
      case "completed": {
        const o = this.occurrence(r.occurrence);
        Object.assign(o, { state: "completed", outputs: r.outputs, emitted: r.emitted, metrics: r.metrics, error: null });
        break;
      }
      case "failed": {
        const o = this.occurrence(r.occurrence);
        Object.assign(o, { state: "failed", error: r.error, metrics: r.metrics });
        break;
      }
      case "escalated":
        this.occurrence(r.occurrence).escalations.push(r.escalation);
        break;
      case "verdict": {
        const o = this.occurrence(r.occurrence);
        const v = { at: r.at_ms, occurrence: r.occurrence, verdict: r.verdict, by: r.decided_by };
        o.verdicts.push(v);
        this.interventions.push(v);
        break;
      }
      case "reconciled": {
        // A person's answer to a reconcile pause: the work is settled without running it.
        const o = this.occurrence(r.occurrence);
        o.reconciled = { answer: r.answer, by: r.by, note: r.note };
        if (r.answer === "skipped") o.state = "skipped";
        const said = r.answer === "completed" ? "completed with the outputs given (reconciled)" : "skipped (reconciled)";
        const v = { at: r.at_ms, occurrence: r.occurrence, verdict: { verdict: said, note: r.note }, by: r.by };
        o.verdicts.push(v);
        this.interventions.push(v);
        break;
      }
      case "paused":
        this.pause = { event: r.seq, reason: r.pause };
        this.state = "paused";
        this.openedAt = null;
        break;
      case "resumed":
        if (this.pause && this.pause.event === r.pause) this.pause = null;
        break;
      case "cancel_requested":
        this.cancelRequested = true;
        break;
      case "finished":
        this.ended = TERMINAL.has(ENDINGS[r.status]);
        this.state = ENDINGS[r.status] || r.status;
        this.error = r.error || null;
        this.openedAt = null;
        break;
    }
    return true;
  }

  get finished() {
    return TERMINAL.has(this.state);
  }

  /**
   * Takes the server's summary of the run (`GET /api/runs/ID`: state, pause, error)
   * unless it was made from fewer records than the page has applied. The summary is
   * read while the stream runs on, so it can answer after the stream delivered the
   * run's ending; taken as is, it put an ended run back to "running" for good (the
   * stream had ended, so nothing corrected it). Returns whether it was taken.
   */
  summary(run) {
    // `records` counts the records it was made from (sequence numbers 0..records-1).
    if (typeof run.records === "number" && run.records - 1 < this.lastSeq) return false;
    this.state = run.state;
    this.pause = pauseOf(run.pause);
    this.error = run.error || null;
    return true;
  }

  /** The gate the run waits at, with its title and prompt, or null. */
  waitingGate() {
    const why = this.pause && this.pause.reason;
    if (!why || why.why !== "suspend" || this.state !== "paused") return null;
    const node = this.byId.get(why.node);
    if (!node || node.type !== GATE_TYPE) return null;
    const props = node.properties || node.data || {};
    return { node: why.node, title: props.title || why.node, prompt: props.prompt || null };
  }

  occurrencesOf(id) {
    return this.byNode.get(id) || [];
  }

  upstream(id) {
    return this.doc.edges.filter((e) => e.target === id);
  }

  /**
   * A node's state for the graph: one of pending, running, completed, failed, waiting,
   * skipped, interrupted, with a short label and (for a node that never ran in an
   * ended run) why it was skipped.
   */
  nodeState(id, memo = new Map()) {
    if (memo.has(id)) return memo.get(id);
    memo.set(id, { state: "pending", label: "pending" }); // cycles: treat as pending
    const s = this.computeState(id, memo);
    memo.set(id, s);
    return s;
  }

  computeState(id, memo) {
    const occs = this.occurrencesOf(id);
    const done = occs.filter((o) => o.state === "completed").length;
    const failed = occs.filter((o) => o.state === "failed");
    const open = occs.filter((o) => o.state === "running" || o.state === "dispatched");
    const gate = this.waitingGate();
    const count = occs.length > 1 ? ` ${done}/${occs.length}` : "";
    if (gate && gate.node === id) return { state: "waiting", label: "awaiting approval" };
    if (this.pendingNodes.has(id) && !this.finished) return { state: "waiting", label: "awaiting decision" };
    const verdictIs = (v) => occs.some((o) => o.verdicts.some((d) => d.verdict && d.verdict.verdict === v));
    if (verdictIs("reject")) return { state: "cancelled", label: "rejected" };
    const recorded = this.finished && this.skipped.get(id);
    if (recorded) return { state: "skipped", label: "skipped", reason: this.recordedSkip(id, recorded, memo) };
    const skippedBySupervisor = occs.some((o) => o.verdicts.some((v) => v.verdict && v.verdict.verdict === "skip"));
    const reconciledSkip = occs.length && occs.every((o) => o.state === "skipped" || o.state === "completed") && occs.some((o) => o.state === "skipped");
    if (reconciledSkip) return { state: "skipped", label: "skipped", reason: "skipped by a person reconciling its uncertain work" };
    if (open.length && !this.finished && this.state !== "paused" && this.state !== "interrupted") {
      return { state: "running", label: `running${count}` };
    }
    if (failed.length && failed.some((o) => !o.verdicts.some((v) => v.verdict && v.verdict.verdict !== "fail"))) {
      return { state: "failed", label: `failed${occs.length > 1 ? ` ${failed.length}/${occs.length}` : ""}` };
    }
    if (skippedBySupervisor) return { state: "skipped", label: "skipped", reason: "skipped by a supervisor verdict" };
    if (open.length) return { state: "interrupted", label: `stopped${count}` };
    if (occs.length && done === occs.length) return { state: "completed", label: `completed${occs.length > 1 ? ` ×${occs.length}` : ""}` };
    if (occs.length) return { state: "running", label: `running${count}` };
    if (this.isStructural(id)) {
      const s = this.structuralState(id, memo);
      if (s) return s;
    }
    if (!this.finished) return { state: "pending", label: "pending" };
    const reason = this.skipReason(id, memo);
    return { state: "skipped", label: "skipped", reason };
  }

  /**
   * The kernel's own nodes (inputs, constants, foreach, collect, outputs) route values
   * without invocations of their own, so the log has no records of them: their state
   * follows from their neighbours. Null when nothing can be said yet.
   */
  isStructural(id) {
    const n = this.byId.get(id);
    return !!n && n.type.startsWith("heddle.") && n.type !== GATE_TYPE;
  }

  structuralState(id, memo) {
    const downstreamRan = this.doc.edges.some((e) => e.source === id && this.occurrencesOf(e.target).length);
    const ups = this.upstream(id).map((e) => this.nodeState(e.source, memo).state);
    const opened = this.lastSeq >= 0;
    if (downstreamRan || (opened && ups.length === 0)) return { state: "completed", label: "passed on" };
    // A collect is done only once everything before it is: more items may still come.
    if (ups.length && ups.every((u) => u === "completed") && this.ancestorsSettled(id, memo)) {
      return { state: "completed", label: "passed on" };
    }
    if (ups.includes("running")) return { state: "pending", label: "waiting for input" };
    return null;
  }

  /** Whether every node upstream of `id`, however far, has finished (or was skipped). */
  ancestorsSettled(id, memo) {
    const seen = new Set([id]);
    const todo = [id];
    while (todo.length) {
      for (const e of this.upstream(todo.pop())) {
        if (seen.has(e.source)) continue;
        seen.add(e.source);
        const st = this.nodeState(e.source, memo).state;
        if (st !== "completed" && st !== "skipped") return false;
        todo.push(e.source);
      }
    }
    return true;
  }

  /**
   * The words for a recorded skip reason, naming the upstream node when the log shows
   * which one (the same words as an inferred reason).
   */
  recordedSkip(id, reason, memo) {
    const ups = this.upstream(id).map((e) => [e, this.nodeState(e.source, memo)]);
    const failed = ups.find(([, s]) => s.state === "failed");
    const rejected = ups.find(([, s]) => s.label === "rejected");
    switch (reason) {
      case "upstream_failed":
        return failed ? `upstream node ${failed[0].source} failed, so its inputs never came` : "an upstream node failed, so its inputs never came";
      case "cancelled":
        return rejected ? `gate ${rejected[0].source} was rejected` : "the run was cancelled before it could run";
      case "upstream_skipped": return "every upstream node was skipped";
      case "condition": return "an edge's condition (when) chose another branch";
      case "no_input": return "its inputs received nothing (an untaken branch)";
      case "supervisor": return "skipped by a supervisor verdict";
      case "reconciled": return "skipped by a person reconciling its uncertain work";
      default: return String(reason);
    }
  }

  /** Why a node of an ended run never ran, from what happened upstream of it (a log
   * without `skipped` records: one written before they were, or a cancel recorded by
   * another process). */
  skipReason(id, memo) {
    const ups = this.upstream(id);
    const states = ups.map((e) => [e, this.nodeState(e.source, memo)]);
    const failed = states.find(([, s]) => s.state === "failed");
    if (failed) return `upstream node ${failed[0].source} failed, so its inputs never came`;
    const rejected = states.find(([, s]) => s.label === "rejected");
    if (rejected) return `gate ${rejected[0].source} was rejected`;
    if (this.state === "cancelled") return "the run was cancelled before it could run";
    if (states.length && states.every(([, s]) => s.state === "skipped")) return "every upstream node was skipped";
    if (states.some(([e, s]) => e.when && s.state === "completed")) return "an edge's condition (when) chose another branch";
    return "its inputs received nothing (an untaken branch)";
  }

  /** Sums over a node's invocations: count, wall time (ms), fuel. */
  totals(id) {
    let calls = 0, wallUs = 0, fuel = null;
    for (const o of this.occurrencesOf(id)) {
      if (o.state === "completed" || o.state === "failed") calls += 1;
      if (o.metrics) {
        wallUs += o.metrics.wall_us || 0;
        if (o.metrics.fuel != null) fuel = (fuel || 0) + o.metrics.fuel;
      }
    }
    return { calls, wallMs: wallUs / 1000, fuel };
  }

  /** The run's outputs: what each heddle.output node received, as far as the log says. */
  outputs() {
    const out = [];
    for (const n of this.doc.nodes.filter((n) => n.type === "heddle.output")) {
      const e = this.upstream(n.id)[0];
      if (!e) continue;
      const v = this.valueAt(e.source, e.sourceHandle, new Set());
      if (v !== undefined) out.push({ name: (n.properties && n.properties.name) || n.name || n.id, value: v });
    }
    return out;
  }

  /**
   * The value node `id` sent on `handle`: from its recorded outputs, or through the
   * kernel's own nodes (a collect gathers its input's values in order; an input or a
   * constant holds its value). Undefined when the log does not know it yet.
   */
  valueAt(id, handle, seen) {
    if (seen.has(id)) return undefined;
    seen.add(id);
    const node = this.byId.get(id);
    const occs = this.occurrencesOf(id).filter((o) => o.state === "completed");
    if (occs.length) {
      const vals = occs.map((o) => (o.outputs || []).find(([k]) => k === handle)).filter(Boolean).map(([, v]) => v);
      return vals.length === 1 ? vals[0] : vals.length ? vals : undefined;
    }
    if (!node) return undefined;
    const props = node.properties || node.data || {};
    if (node.type === "heddle.input") {
      const name = props.name || node.name || node.id;
      return name in this.inputs ? this.inputs[name] : props.value;
    }
    if (node.type === "heddle.constant") return props.value;
    // Only a collect is followed further back (once the run completed, it gathered
    // every item); any other node's value is what its own records say, or unknown.
    const e = this.upstream(id)[0];
    if (node.type !== "heddle.collect" || !e || this.state !== "completed") return undefined;
    const v = this.valueAt(e.source, e.sourceHandle, seen);
    return v === undefined ? [] : Array.isArray(v) && this.occurrencesOf(e.source).length > 1 ? v : [v];
  }
}
