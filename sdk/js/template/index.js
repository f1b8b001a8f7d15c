// My Heddle nodes, in JavaScript. `./heddle.js` is supplied by the build.
import { definePackage, NodeError, log } from "./heddle.js";

export const node = definePackage([
  {
    type: "myjs.shout", // the node type name used in graphs
    title: "Shout",
    inputs: { text: "str" }, // required inputs: name -> port type
    properties: [{ name: "suffix", type: "str", default: "!" }],
    outputs: { text: "str" },
    retrySafe: true, // pure: a supervisor may re-run it
    run({ text, suffix }) {
      if (!text.trim()) {
        // A recoverable error: a supervisor may substitute the candidate output.
        throw new NodeError("nothing to shout", { signature: "myjs:empty", candidate: { text: "" } });
      }
      log(`shouting ${text.length} characters`);
      return { text: text.toUpperCase() + suffix };
    },
  },
]);
