// Heddle SDK for node packages written in JavaScript.
//
// The build (`scripts/package-build DIR`) places this file next to your entry module,
// which imports it as "./heddle.js", and runs componentize-js: that generates the
// bindings of the `heddle:node` WIT and snapshots your module into the component.
//
//   import { definePackage, NodeError, log } from "./heddle.js";
//   export const node = definePackage([
//     { type: "demo.greet", title: "Greet", inputs: { name: "str" }, outputs: { text: "str" },
//       retrySafe: true, run: ({ name }) => ({ text: `hello ${name}` }) },
//   ]);
//
// Values: null, booleans, numbers (integers cross as s64, others as f64), strings and
// Uint8Array cross as themselves; arrays and objects cross as JSON, with bytes inside
// them written {"$bytes": base64}.
//
// The build targets heddle:node@0.2.0: `controlled: true` declares a controlled node,
// and `control` is what a controller drives them with.

// `heddle package build` rewrites this version to the one of the WIT it builds against.
import * as host from "heddle:node/host@0.2.0";

/** A recoverable node failure: a stable `signature` lets a supervisor recognise
 * repeats; `candidate` is the malformed output (object of output name to value) a
 * supervisor may repair and substitute. */
export class NodeError extends Error {
  constructor(message, { signature, candidate } = {}) {
    if (signature !== undefined && signature !== null) {
      const why = checkSignature(signature);
      if (why !== null) throw new SignatureError(`${why}; the error was: ${message}`);
    }
    super(message);
    this.name = "NodeError";
    this.signature = signature;
    this.candidate = candidate;
  }
}

/** A failure signature the host would not recognise, refused where it is written. */
export class SignatureError extends TypeError {
  constructor(message) {
    super(message);
    this.name = "SignatureError";
  }
}

const FAMILY = /^[a-z][a-z0-9_-]{0,23}$/;
const CODE_PART = /^[A-Za-z0-9_.\-/*[\]$]+$/;

/** `null` when `sig` is a signature the host recognises, else why not. The shape is
 * `family:code`: the family a lowercase letter then at most 23 of `a-z 0-9 _ -`, the
 * code 1 to 64 of `A-Z a-z 0-9 _ . - / * [ ] $ :` with a `:` only between two parts
 * (`code:exit:1`); the families `limit` and `trap` belong to the host. The host ignores
 * any other signature. */
export function checkSignature(sig) {
  const s = String(sig);
  const colon = s.indexOf(":");
  const family = s.slice(0, colon);
  let why;
  if (typeof sig !== "string" || colon < 0) why = "no ':' between family and code";
  else if (!FAMILY.test(family)) {
    why = "the family before ':' must be a lowercase letter then at most 23 of a-z 0-9 _ -";
  } else if (!validCode(s.slice(colon + 1))) {
    why = "the code after ':' must be 1 to 64 of A-Z a-z 0-9 _ . - / * [ ] $, with ':' only between two parts";
  } else if (family === "limit" || family === "trap") {
    why = "the families `limit` and `trap` are reserved for failures the host detects";
  } else return null;
  return `invalid failure signature ${JSON.stringify(s)}: ${why} (write family:code, e.g. "json:parse")`;
}

function validCode(code) {
  return code.length >= 1 && code.length <= 64 && code.split(":").every((part) => CODE_PART.test(part));
}

/** The host refused an emitted value (unknown handle, too large, run ending). */
export class EmitError extends Error {}

// The arguments of the invocation running now (one at a time per instance), for
// `control.context()`.
let currentArgs = {};

const CORRELATIONS = ["single", "iteration", "chunk", "aggregate"];
const CAPABILITIES = ["files-read", "files-write", "env", "secret", "network"];

function portList(spec, requiredByDefault) {
  if (!spec) return [];
  if (Array.isArray(spec)) return spec;
  return Object.entries(spec).map(([name, type]) => ({ name, type, required: requiredByDefault }));
}

function portDecl(p) {
  return {
    name: p.name,
    type: p.type ?? "any",
    required: !!p.required,
    default: p.default === undefined ? undefined : toValue(p.default),
    description: p.description ?? "",
  };
}

function outputDecl(o) {
  const correlation = o.correlation ?? "single";
  if (!CORRELATIONS.includes(correlation)) {
    throw new Error(`output ${o.name}: correlation ${correlation} is not one of ${CORRELATIONS.join(", ")}`);
  }
  return { name: o.name, type: o.type ?? "any", correlation, description: o.description ?? "" };
}

function capabilityDecl(c) {
  if (!CAPABILITIES.includes(c.kind)) {
    throw new Error(`capability kind ${c.kind} is not one of ${CAPABILITIES.join(", ")}`);
  }
  return { kind: c.kind, target: c.target ?? "", reason: c.reason ?? "" };
}

/**
 * Declares the package's nodes in one place and returns the `node` export.
 *
 * Each definition: { type, title?, description?, inputs?, outputs?, properties?,
 * retrySafe?, streamingOutput?, streamingInput?, reuseInstance?, capabilities?,
 * controlled?, run }. `controlled: true` makes a controlled node: it runs once per `run`
 * event a controller sends it (over a control edge into its `__control__` handle), with
 * its latest inputs and the event's property overrides, and its outputs are the reply.
 * `inputs`/`outputs`/`properties` are `{ name: "type" }` maps (inputs required) or lists
 * of `{ name, type, required, default, description, correlation }`. `run(args)` gets the
 * inputs and properties by name and returns an object of outputs, a bare value when
 * there is exactly one output, or undefined; or a Promise of one of those (an `async
 * run` that awaits `fetch()`): componentize-js runs the event loop until it settles.
 */
export function definePackage(defs) {
  const byType = new Map();
  for (const d of defs) {
    if (!d.type || typeof d.run !== "function") {
      throw new Error(`node definition needs a type and a run function: ${JSON.stringify(d.type)}`);
    }
    if (byType.has(d.type)) throw new Error(`node type ${d.type} is declared twice`);
    const entry = {
      def: d,
      inputs: portList(d.inputs, true),
      outputs: portList(d.outputs, false),
      properties: portList(d.properties, false),
    };
    // Worked out once rather than on every call (a warm instance serves many): the
    // arguments a call starts from, defaults and null for optional ports, in port order.
    // Kept as name and value lists: copied by a loop, which the interpreter runs faster
    // than an object spread (a self-hosted function).
    const base = {};
    for (const p of [...entry.inputs, ...entry.properties]) {
      if (p.default !== undefined) base[p.name] = p.default;
      else if (!p.required) base[p.name] = null;
    }
    entry.baseNames = Object.keys(base);
    entry.baseValues = entry.baseNames.map((k) => base[k]);
    byType.set(d.type, entry);
  }
  return {
    describe() {
      return [...byType.values()].map(({ def, inputs, outputs, properties }) => ({
        typeName: def.type,
        title: def.title ?? def.type,
        description: def.description ?? "",
        inputs: inputs.map(portDecl),
        outputs: outputs.map(outputDecl),
        properties: properties.map(portDecl),
        retrySafe: !!def.retrySafe,
        streamingOutput: !!def.streamingOutput,
        streamingInput: !!def.streamingInput,
        reuseInstance: !!def.reuseInstance,
        capabilities: (def.capabilities ?? []).map(capabilityDecl),
      }));
    },
    // heddle:node 0.2: the type names that run once per control event.
    controlled() {
      return [...byType.values()].filter(({ def }) => !!def.controlled).map(({ def }) => def.type);
    },
    invoke(typeName, inputs, properties) {
      const entry = byType.get(typeName);
      if (!entry) {
        throw guestError(`this package has no node type ${typeName}`, "heddle:unknown-type");
      }
      let result;
      try {
        const args = {};
        const { baseNames, baseValues } = entry;
        for (let i = 0; i < baseNames.length; i++) args[baseNames[i]] = baseValues[i];
        // Indexed loops and the scalar payload read in place: in an interpreter (no JIT
        // in a component) iterators, destructuring and calls are what a call costs.
        for (let i = 0; i < properties.length; i++) {
          const v = properties[i][1];
          args[properties[i][0]] = PLAIN_TAGS.has(v.tag) ? v.val : fromValue(v);
        }
        for (let i = 0; i < inputs.length; i++) {
          // edge values win
          const v = inputs[i][1];
          args[inputs[i][0]] = PLAIN_TAGS.has(v.tag) ? v.val : fromValue(v);
        }
        currentArgs = args;
        result = entry.def.run(args);
      } catch (e) {
        throw failure(e);
      }
      if (result && typeof result.then === "function") {
        return result.then(
          (r) => outputsOrFailure(entry, r),
          (e) => {
            throw failure(e);
          },
        );
      }
      return outputsOrFailure(entry, result);
    },
  };
}

function outputsOrFailure(entry, result) {
  try {
    return toOutputs(entry, result);
  } catch (e) {
    throw failure(e);
  }
}

/** A thrown value as the guest error the host reads. */
function failure(e) {
  if (e instanceof NodeError) return guestError(e.message, e.signature, e.candidate);
  const name = e?.constructor?.name ?? "Error";
  if (e?.stack) log(String(e.stack), "debug");
  return guestError(`${name}: ${e?.message ?? String(e)}`, `js:${name}`);
}

function toOutputs(entry, result) {
  if (result === undefined || result === null) return [];
  if (typeof result === "object" && Object.getPrototypeOf(result) === Object.prototype) {
    const keys = Object.keys(result);
    const out = new Array(keys.length);
    for (let i = 0; i < keys.length; i++) out[i] = [keys[i], toValue(result[keys[i]])];
    return out;
  }
  if (entry.outputs.length === 1) return [[entry.outputs[0].name, toValue(result)]];
  throw new Error(`${entry.def.type} returned a ${typeof result}; return an object of output name to value`);
}

// componentize-js turns a thrown object carrying `payload` into the `err` of a result.
function guestError(message, signature, candidate) {
  const payload = {
    message: String(message),
    signature: signature ?? undefined,
    candidate: candidate == null ? undefined : Object.entries(candidate).map(([k, v]) => [k, toValue(v)]),
  };
  return { payload };
}

// ---- values ---------------------------------------------------------------------

function bytesToBase64(u8) {
  let s = "";
  for (let i = 0; i < u8.length; i++) s += String.fromCharCode(u8[i]);
  return btoa(s);
}

function base64ToBytes(b64) {
  const s = atob(b64);
  const u8 = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) u8[i] = s.charCodeAt(i);
  return u8;
}

const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;

/** A JS value as a WIT `value`. */
export function toValue(v) {
  if (v === null || v === undefined) return { tag: "null" };
  switch (typeof v) {
    case "boolean":
      return { tag: "boolean", val: v };
    case "number":
      // A safe integer is an integer: one test instead of two.
      return Number.isSafeInteger(v)
        ? { tag: "s64", val: BigInt(v) }
        : { tag: "f64", val: v };
    case "bigint":
      if (v < I64_MIN || v > I64_MAX) throw new RangeError(`${v} does not fit in 64 bits`);
      return { tag: "s64", val: v };
    case "string":
      return { tag: "string", val: v };
  }
  if (v instanceof Uint8Array) return { tag: "bytes", val: v };
  return {
    tag: "json",
    val: JSON.stringify(v, (_k, x) => {
      if (x instanceof Uint8Array) return { $bytes: bytesToBase64(x) };
      if (typeof x === "bigint") return Number(x);
      return x;
    }),
  };
}

// The cases whose payload is the JS value itself.
const PLAIN_TAGS = new Set(["boolean", "f64", "string", "bytes"]);

/** A WIT `value` as a JS value; s64 beyond 2^53 stays a BigInt. */
export function fromValue(v) {
  switch (v.tag) {
    case "null":
      return null;
    case "s64": {
      const n = Number(v.val);
      return Number.isSafeInteger(n) ? n : v.val;
    }
    case "json":
      return JSON.parse(v.val, (_k, x) => {
        if (x && typeof x === "object" && !Array.isArray(x)) {
          const keys = Object.keys(x);
          if (keys.length === 1 && keys[0] === "$bytes" && typeof x.$bytes === "string") {
            return base64ToBytes(x.$bytes);
          }
        }
        return x;
      });
    default:
      return v.val;
  }
}

// ---- host imports -----------------------------------------------------------------

const LEVELS = new Set(["trace", "debug", "info", "warn", "error"]);

/** A log line in the run's event stream (capped per invocation by the host). */
export function log(message, level = "info") {
  host.log(LEVELS.has(level) ? level : "info", String(message));
}

/** Streaming output: sends `value` downstream on `handle` now (declare
 * `streamingOutput: true`). Throws EmitError when the host refuses. */
export function emit(handle, value) {
  try {
    host.emit(handle, toValue(value));
  } catch (e) {
    throw new EmitError(String(e?.payload ?? e?.message ?? e));
  }
}

/** Streaming input: yields [handle, value] in arrival order until every input is
 * closed or the run is cancelled (declare `streamingInput: true`). */
export function* inputs() {
  for (;;) {
    const item = host.nextInput();
    if (item === undefined || item === null) return;
    yield [item[0], fromValue(item[1])];
  }
}

/** True once the run was cancelled or the deadline passed: long loops should stop. */
export function cancelled() {
  return host.cancelled();
}

/** Milliseconds left before the invocation's deadline, or undefined. */
export function deadlineMs() {
  const d = host.deadlineMs();
  return d === undefined ? undefined : Number(d);
}

/** A secret the operator granted to this package, or undefined. */
export function secret(name) {
  return host.getSecret(name);
}

/** Provider cost of work done for this invocation (makes it not retry-safe). */
export function reportCost(usd) {
  host.reportCost(Number(usd));
}

/** An asset this invocation created outside the graph (makes it not retry-safe). */
export function recordAsset(id) {
  host.recordAsset(String(id));
}

// ---- controllers ------------------------------------------------------------------

const CONTEXT_INPUT = "_control_context";

function hostFunction(name) {
  const fn = host[name];
  if (typeof fn !== "function") {
    throw new NodeError(
      "this package was built against heddle:node 0.1, which has no control events; build it against 0.2 (the default of `heddle package build`)",
      { signature: "control:unsupported" },
    );
  }
  return fn;
}

function hostMessage(e) {
  return String(e?.payload ?? e?.message ?? e);
}

/** A `run` event on its way; `reply()` waits for the target's outputs. */
export class Ticket {
  constructor(target, id) {
    this.target = target;
    this.id = id;
  }

  /** The outputs of the invocation the event caused, an object by output name. Throws
   * NodeError (signature `control:failed`) when it failed; each ticket is answered once. */
  reply() {
    let entries;
    try {
      entries = hostFunction("controlReply")(this.id);
    } catch (e) {
      if (e instanceof NodeError) throw e;
      throw new NodeError(hostMessage(e), { signature: "control:failed" });
    }
    const out = {};
    for (const [name, v] of entries) out[name] = fromValue(v);
    return out;
  }
}

/**
 * Controllers: driving the controlled nodes a control edge from this node reaches (a
 * node is a controller when a control edge leaves it; nothing to declare).
 *
 *   const [target] = control.targets();
 *   const tickets = words.map((w) => control.send(target, { text: w }));
 *   return { words: tickets.map((t) => t.reply().text) };
 *
 * `send` queues a `run` event with property overrides (for that run only) and returns a
 * Ticket; events sent before any reply is awaited are in flight together and answered
 * in the order sent. What the host refuses (a node no control edge reaches, a property
 * the target does not have, a value of the wrong type) throws NodeError with the host's
 * message, naming both nodes, `__control__` and the property (signature
 * `control:refused`); uncaught, it fails the node with that message.
 */
export const control = {
  CONTEXT_INPUT,

  /** The control context (`_control_context`) of the running invocation, or of `args`
   * when given: an object by controlled node id (`node_type`, `properties` with their
   * type, default and configured value, `actions.run`), or null when no control edge
   * leaves this node. */
  context(args) {
    return (args ?? currentArgs)[CONTEXT_INPUT] ?? null;
  },

  /** The ids of the controlled nodes this node drives (empty when none). */
  targets(args) {
    return Object.keys(control.context(args) ?? {});
  },

  /** Sends a `run` event to the controlled node `target` with `overrides` (an object of
   * property name to value); returns its Ticket. */
  send(target, overrides = {}) {
    const wire = Object.entries(overrides ?? {}).map(([k, v]) => [k, toValue(v)]);
    let id;
    try {
      id = hostFunction("controlSend")(String(target), wire);
    } catch (e) {
      if (e instanceof NodeError) throw e;
      throw new NodeError(hostMessage(e), { signature: "control:refused" });
    }
    return new Ticket(target, id);
  },

  /** `send`, then its `reply()`. */
  run(target, overrides = {}) {
    return control.send(target, overrides).reply();
  },
};
