"""textstats: a Heddle node package written in Python."""

import re
from collections import Counter

import heddle
from heddle import NodeError, control, node, output, port

WORD = re.compile(r"[\w']+")


@node(
    "textstats.word_count",
    title="Word count",
    description="Counts words and lines and lists the most frequent words.",
    inputs=[port("text", "str", required=True, description="The text to measure")],
    properties=[port("top", "int", default=3, description="How many frequent words to list")],
    outputs=[output("words", "int"), output("lines", "int"), output("top_words", "list[str]")],
    retry_safe=True,  # pure: re-running with the same text is harmless
)
def word_count(text, top):
    words = [w.lower() for w in WORD.findall(text)]
    ranked = sorted(Counter(words).items(), key=lambda kv: (-kv[1], kv[0]))
    return {
        "words": len(words),
        "lines": len(text.splitlines()) if text else 0,
        "top_words": [w for w, _ in ranked[: max(0, int(top))]],
    }


@node(
    "textstats.ratio",
    title="Ratio",
    description="a / b (words per line, say); dividing by zero is an error with the "
    "signature math:div0.",
    inputs=[port("a", "float", required=True), port("b", "float", required=True)],
    outputs={"ratio": "float"},
    retry_safe=True,
    reuse_instance=True,  # pure: an instance may serve the next invocation
)
def ratio(a, b):
    # The same two-input node as jsonkit.ratio and cstrings.ratio, so the SDKs compare
    # in `heddle bench --shape py-chain` and its siblings.
    if b == 0:
        raise NodeError("division by zero", signature="math:div0")
    return {"ratio": a / b}


@node(
    "textstats.parse_record",
    title="Parse key=value record",
    description="Parses `key=value; key=value` into an object. A malformed field is a "
    "recoverable error whose candidate output holds the fields that did parse.",
    inputs={"line": "str"},
    outputs={"record": "object"},
    retry_safe=True,
)
def parse_record(line):
    record, bad = {}, []
    for part in filter(None, (p.strip() for p in line.split(";"))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            bad.append(part)
            continue
        value = value.strip()
        record[key.strip()] = int(value) if re.fullmatch(r"-?\d+", value) else value
    if bad:
        raise NodeError(
            f"malformed field(s) {bad!r} in {line!r}: expected key=value",
            signature="textstats:parse",
            candidate={"record": record},
        )
    return {"record": record}


@node(
    "textstats.tokens",
    title="Tokens",
    description="Streams each word of the text as it is found.",
    inputs={"text": "str"},
    outputs=[output("token", "str", correlation="chunk")],
    streaming_output=True,
)
def tokens(text):
    n = 0
    for w in WORD.findall(text):
        heddle.emit("token", w)
        n += 1
    heddle.info(f"emitted {n} tokens")


# ---- a controlled node and a controller (heddle:node 0.2) ------------------------


@node(
    "textstats.title_case",
    title="Title case",
    description="Controlled: runs once per `run` event its controller sends, over the "
    "event's `text` override; title-cases it and appends `suffix`.",
    inputs=[port("text", "str", default="", description="Set by each run event")],
    properties=[port("suffix", "str", default="", description="Appended to the text")],
    outputs={"text": "str"},
    retry_safe=True,
    controlled=True,
)
def title_case(text, suffix):
    return {"text": text.title() + suffix}


@node(
    "textstats.each_word",
    title="Each word",
    description="Controller: runs the controlled node its control edge reaches once per "
    "word of `text`, the word set as property `property`, every event in flight before "
    "it awaits the first reply; `replies` are the replies in word order (the target's "
    "output when it has one, else an object of its outputs).",
    inputs={"text": "str"},
    properties=[
        port("property", "str", default="text", description="The property each word sets"),
        port("target", "str", default="",
             description="The node to drive when control edges reach several"),
    ],
    outputs={"replies": "list[any]", "target": "str"},
    retry_safe=True,
)
def each_word(text, property, target):
    targets = control.context() or {}
    if not target:
        if len(targets) != 1:
            raise NodeError(f"wire exactly one controlled node to this one (found "
                            f"{len(targets)}), or name one in `target`",
                            signature="textstats:target")
        (target,) = targets
    # All events first: the target answers them in the order sent.
    tickets = [control.send(target, {property: w}) for w in text.split()]
    outputs = list(targets.get(target, {}).get("actions", {}).get("run", {}).get("outputs", {}))
    replies = []
    for t in tickets:
        reply = t.reply()
        replies.append(reply.get(outputs[0]) if len(outputs) == 1 else reply)
    return {"replies": replies, "target": target}
