// jsonkit: a Heddle node package written in JavaScript.
// `./heddle.js` is supplied by the build (sdk/js/heddle.js).
import { control, definePackage, NodeError, emit, log } from "./heddle.js";

export const node = definePackage([
  {
    // a / b: the same two-input node as textstats.ratio and cstrings.ratio, so the SDKs
    // compare in `heddle bench --shape js-chain` and its siblings. Pure: reuseInstance.
    type: "jsonkit.ratio",
    title: "Ratio",
    description: "a / b; dividing by zero is an error with the signature math:div0.",
    inputs: [
      { name: "a", type: "float", required: true },
      { name: "b", type: "float", required: true },
    ],
    outputs: { ratio: "float" },
    retrySafe: true,
    reuseInstance: true,
    run({ a, b }) {
      if (b === 0) throw new NodeError("division by zero", { signature: "math:div0" });
      return { ratio: a / b };
    },
  },
  {
    type: "jsonkit.parse",
    title: "Parse JSON",
    description:
      "Parses JSON text. Bad JSON is a recoverable error whose candidate output is the raw text, for a supervisor to repair.",
    inputs: { text: "str" },
    outputs: { value: "any" },
    retrySafe: true,
    run({ text }) {
      try {
        return { value: JSON.parse(text) };
      } catch (e) {
        throw new NodeError(`invalid JSON: ${e.message}`, {
          signature: "json:parse",
          candidate: { value: text },
        });
      }
    },
  },
  {
    type: "jsonkit.pick",
    title: "Pick fields",
    description: "Keeps only the listed fields of an object (missing ones are skipped).",
    inputs: [
      { name: "object", type: "object", required: true },
      { name: "fields", type: "list[str]", required: true },
    ],
    outputs: { picked: "object", missing: "list[str]" },
    retrySafe: true,
    run({ object, fields }) {
      const picked = {};
      const missing = [];
      for (const f of fields) {
        if (Object.prototype.hasOwnProperty.call(object, f)) picked[f] = object[f];
        else missing.push(f);
      }
      if (missing.length) log(`fields not present: ${missing.join(", ")}`, "warn");
      return { picked, missing };
    },
  },
  {
    type: "jsonkit.entries",
    title: "Object entries",
    description: "Streams each key of an object with its value, as they are read.",
    inputs: { object: "object" },
    outputs: [{ name: "entry", type: "list[any]", correlation: "chunk" }],
    streamingOutput: true,
    run({ object }) {
      for (const [k, v] of Object.entries(object)) emit("entry", [k, v]);
    },
  },
  // ---- a controlled node and a controller (heddle:node 0.2) ----
  {
    type: "jsonkit.wrap",
    title: "Wrap",
    description: "Controlled: runs once per `run` event its controller sends; wraps `value` as { [key]: value }.",
    inputs: [{ name: "value", type: "any", description: "Set by each run event" }],
    properties: [{ name: "key", type: "str", default: "value", description: "The key to wrap it under" }],
    outputs: { object: "object" },
    retrySafe: true,
    controlled: true,
    run: ({ value, key }) => ({ object: { [key]: value } }),
  },
  {
    type: "jsonkit.each_item",
    title: "Each item",
    description:
      "Controller: runs the controlled node its control edge reaches once per item of `items`, the item set as property `property`, every event in flight before it awaits the first reply; `results` are the replies in item order (the target's output when it has one, else an object of its outputs).",
    inputs: { items: "list[any]" },
    properties: [
      { name: "property", type: "str", default: "value", description: "The property each item sets" },
      { name: "target", type: "str", default: "", description: "The node to drive when control edges reach several" },
    ],
    outputs: { results: "list[any]" },
    retrySafe: true,
    run({ items, property, target }) {
      const context = control.context() ?? {};
      if (!target) {
        const ids = Object.keys(context);
        if (ids.length !== 1) {
          throw new NodeError(`wire exactly one controlled node to this one (found ${ids.length}), or name one in \`target\``, {
            signature: "jsonkit:target",
          });
        }
        target = ids[0];
      }
      // All events first: the target answers them in the order sent.
      const tickets = items.map((item) => control.send(target, { [property]: item }));
      const outputs = Object.keys(context[target]?.actions?.run?.outputs ?? {});
      return {
        results: tickets.map((t) => {
          const reply = t.reply();
          return outputs.length === 1 ? reply[outputs[0]] : reply;
        }),
      };
    },
  },
]);
