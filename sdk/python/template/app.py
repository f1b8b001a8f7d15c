"""My Heddle nodes, in Python. Every node is a function with a @node declaration."""

import heddle
from heddle import NodeError, node, port


@node(
    "mypython.shout",                     # the node type name used in graphs
    title="Shout",
    inputs={"text": "str"},              # required inputs: name -> port type
    properties=[port("suffix", "str", default="!")],
    outputs={"text": "str"},
    retry_safe=True,                     # pure: a supervisor may re-run it
)
def shout(text, suffix):
    if not text.strip():
        # A recoverable error: a supervisor sees the signature (family:code) and may
        # substitute the candidate output instead of failing the run.
        raise NodeError("nothing to shout", signature="mypython:empty", candidate={"text": ""})
    heddle.info(f"shouting {len(text)} characters")
    return {"text": text.upper() + suffix}
