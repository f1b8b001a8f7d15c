// jsonkit: a Heddle node package written in JavaScript.
// `./heddle.js` is supplied by the build (sdk/js/heddle.js).
import { definePackage, NodeError, emit, log } from "./heddle.js";

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
]);
