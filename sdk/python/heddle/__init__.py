"""Heddle SDK for node packages written in Python.

Declare each node once, with the decorator, next to the function that runs it::

    from heddle import node, port, NodeError

    @node("demo.greet", title="Greet", inputs={"name": "str"}, outputs={"text": "str"},
          retry_safe=True)
    def greet(name):
        return {"text": f"hello {name}"}

The build (``scripts/package-build DIR``) runs componentize-py, which generates the
``wit_world`` bindings from the ``heddle:node`` WIT and snapshots this module into the
component. Everything here is a thin layer over those generated bindings.

Values: ``None``, ``bool``, ``int``, ``float``, ``str`` and ``bytes`` cross as themselves;
lists and dicts cross as JSON, with ``bytes`` inside them written ``{"$bytes": base64}``.

The build targets ``heddle:node@0.2.0``: ``@node(..., controlled=True)`` declares a
controlled node, and ``heddle.control`` is what a controller drives them with.
"""

import base64
import inspect
import json
import os
import traceback

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
try:
    # The build adds wasi:http to the world, whose `types` interface then shares the name.
    from wit_world.imports import heddle_node_types as wit
except ImportError:
    from wit_world.imports import types as wit

__all__ = [
    "node", "port", "output", "capability", "Node", "NodeError", "EmitError",
    "SignatureError", "check_signature",
    "log", "debug", "info", "warn", "error", "emit", "inputs", "cancelled",
    "deadline_ms", "secret", "report_cost", "record_asset", "control",
]

_MISSING = object()


class NodeError(Exception):
    """A recoverable node failure.

    ``signature`` is a stable name for the kind of failure (``"json:parse"``), so a
    supervisor can recognise repeats; ``candidate`` is the malformed output (a dict of
    output name to value) a supervisor may repair and substitute.
    """

    def __init__(self, message, signature=None, candidate=None):
        if signature is not None:
            why = check_signature(signature)
            if why is not None:
                where = traceback.extract_stack(limit=2)[0]
                raise SignatureError(
                    f"{why} at {os.path.basename(where.filename)}:{where.lineno};"
                    f" the error was: {message}")
        super().__init__(message)
        self.message = message
        self.signature = signature
        self.candidate = candidate


class SignatureError(ValueError):
    """A failure signature the host would not recognise, refused where it is written."""


_FAMILY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_CODE_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-/*[]$")


def check_signature(sig):
    """``None`` when ``sig`` is a signature the host recognises, else why not.

    The shape is ``family:code``: the family a lowercase letter then at most 23 of
    ``a-z 0-9 _ -``, the code 1 to 64 of ``A-Z a-z 0-9 _ . - / * [ ] $ :`` with a ``:``
    only between two parts (``code:exit:1``); the families ``limit`` and ``trap`` belong
    to the host. The host ignores any other signature.
    """
    family, colon, code = str(sig).partition(":")
    if not isinstance(sig, str) or not colon:
        why = "no ':' between family and code"
    elif (not family or not ("a" <= family[0] <= "z") or len(family) > 24
          or not set(family) <= _FAMILY_CHARS):
        why = "the family before ':' must be a lowercase letter then at most 23 of a-z 0-9 _ -"
    elif (not code or len(code) > 64
          or not all(part and set(part) <= _CODE_CHARS for part in code.split(":"))):
        why = ("the code after ':' must be 1 to 64 of A-Z a-z 0-9 _ . - / * [ ] $,"
               " with ':' only between two parts")
    elif family in ("limit", "trap"):
        why = "the families `limit` and `trap` are reserved for failures the host detects"
    else:
        return None
    return f'invalid failure signature {json.dumps(str(sig))}: {why} (write family:code, e.g. "json:parse")'


class EmitError(Exception):
    """The host refused an emitted value (unknown handle, too large, run ending).
    The node should stop and return."""


class Port:
    def __init__(self, name, type="any", required=False, default=_MISSING, description=""):
        self.name = name
        self.type = type
        self.required = required
        self.default = default
        self.description = description

    def decl(self):
        default = None if self.default is _MISSING else to_value(self.default)
        return wit.PortDecl(self.name, self.type, self.required, default, self.description)


class Output:
    def __init__(self, name, type="any", correlation="single", description=""):
        self.name = name
        self.type = type
        self.correlation = correlation
        self.description = description

    def decl(self):
        try:
            corr = wit.OutputCorrelation[self.correlation.upper()]
        except KeyError:
            raise ValueError(
                f"output {self.name!r}: correlation {self.correlation!r} is not one of "
                "single, iteration, chunk, aggregate") from None
        return wit.OutputDecl(self.name, self.type, corr, self.description)


def port(name, type="any", required=False, default=_MISSING, description=""):
    """An input or property port. ``inputs={"x": "int"}`` is short for a required port."""
    return Port(name, type, required, default, description)


def output(name, type="any", correlation="single", description=""):
    """An output port; ``correlation`` is single, iteration, chunk or aggregate."""
    return Output(name, type, correlation, description)


def capability(kind, target, reason):
    """A capability request (files-read, files-write, env, secret, network): asking
    grants nothing, the operator decides."""
    try:
        k = wit.CapabilityKind[kind.upper().replace("-", "_")]
    except KeyError:
        raise ValueError(f"capability kind {kind!r} is not one of "
                         "files-read, files-write, env, secret, network") from None
    return wit.CapabilityRequest(k, target, reason)


def _ports(spec, cls, required_by_default):
    if isinstance(spec, dict):
        if cls is Port:
            return [Port(n, t, required=required_by_default) for n, t in spec.items()]
        return [Output(n, t) for n, t in spec.items()]
    return list(spec)


class _NodeDef:
    def __init__(self, fn, type_name, title, description, inputs, outputs, properties,
                 retry_safe, streaming_output, streaming_input, reuse_instance, capabilities,
                 controlled):
        self.fn = fn
        self.type_name = type_name
        self.title = title
        self.description = description
        self.inputs = _ports(inputs, Port, True)
        self.outputs = _ports(outputs, Output, False)
        self.properties = _ports(properties, Port, False)
        self.retry_safe = retry_safe
        self.streaming_output = streaming_output
        self.streaming_input = streaming_input
        self.reuse_instance = reuse_instance
        self.capabilities = list(capabilities)
        self.controlled = bool(controlled)
        sig = inspect.signature(fn)
        self.takes_all = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
        self.params = set(sig.parameters)
        # Worked out once, when @node runs, rather than on every call (a warm instance
        # serves many; a Port changed after the decorator ran is not seen again):
        # the arguments a call starts from (defaults, None for optional ports) limited to
        # those the function takes, in port order, and the names it takes.
        base = {}
        for p in self.inputs + self.properties:
            if p.default is not _MISSING:
                base[p.name] = p.default
            elif not p.required:
                base[p.name] = None
        self._accepts = None if self.takes_all else frozenset(self.params)
        if self._accepts is not None:
            base = {k: v for k, v in base.items() if k in self._accepts}
        self._base_args = base

    def decl(self):
        return wit.NodeDecl(
            self.type_name, self.title, self.description,
            [p.decl() for p in self.inputs], [o.decl() for o in self.outputs],
            [p.decl() for p in self.properties], self.retry_safe, self.streaming_output,
            self.streaming_input, self.reuse_instance, self.capabilities)

    def run(self, inputs, properties):
        global _current_inputs
        # What `heddle.control.context()` reads during this invocation.
        _current_inputs = inputs
        args = self._base_args.copy()
        accepts = self._accepts
        # Every value is converted (a bad one fails the call whether the function takes
        # it or not); only the names the function takes are passed.
        # A scalar's payload is read in place (`from_value` without the call: a Python
        # call costs more than the rest of the conversion).
        plain = _PLAIN_VALUES
        for name, v in properties:
            v = v.value if type(v) in plain else from_value(v)
            if accepts is None or name in accepts:
                args[name] = v
        for name, v in inputs:  # edge values win over properties
            v = v.value if type(v) in plain else from_value(v)
            if accepts is None or name in accepts:
                args[name] = v
        result = self.fn(**args)
        if type(result) is dict:
            cases = _SCALAR_CASES
            out = []
            for k, v in result.items():
                case = cases.get(type(v))
                out.append((k if type(k) is str else str(k),
                            case(v) if case is not None else to_value(v)))
            return out
        return self._outputs(result)

    def _outputs(self, result):
        if result is None:
            return []
        if isinstance(result, dict):
            return [(k if type(k) is str else str(k), to_value(v)) for k, v in result.items()]
        if len(self.outputs) == 1:
            return [(self.outputs[0].name, to_value(result))]
        raise TypeError(f"{self.type_name} returned {type(result).__name__}; return a dict "
                        "of output name to value (or a bare value when there is one output)")


_NODES = {}

# The raw inputs of the invocation running now (one at a time per instance).
_current_inputs = []


def node(type_name, *, title=None, description="", inputs=(), outputs=(), properties=(),
         retry_safe=False, streaming_output=False, streaming_input=False,
         reuse_instance=False, capabilities=(), controlled=False):
    """Declares a node type run by the decorated function.

    The function receives the node's inputs and properties as keyword arguments (only
    those it names, unless it takes ``**kwargs``) and returns a dict of outputs, a bare
    value when the node has exactly one output, or None. ``retry_safe=True`` tells the
    supervisor a failed invocation may be re-run with the same inputs.
    ``controlled=True`` makes it a controlled node: it runs once per ``run`` event a
    controller sends it (over a control edge into its ``__control__`` handle), with its
    latest inputs and the event's property overrides, and its outputs are the reply.
    """

    def register(fn):
        if type_name in _NODES:
            raise ValueError(f"node type {type_name!r} is declared twice")
        doc = description or (inspect.getdoc(fn) or "")
        _NODES[type_name] = _NodeDef(
            fn, type_name, title or type_name, doc, inputs, outputs, properties,
            retry_safe, streaming_output, streaming_input, reuse_instance, capabilities,
            controlled)
        return fn

    return register


def _error(message, signature=None, candidate=None):
    cand = None
    if candidate is not None:
        cand = [(str(k), to_value(v)) for k, v in dict(candidate).items()]
    return Err(wit.NodeError(str(message), signature, cand))


class Node(exports.Node):
    """The `node` export: describes and runs every node declared with ``@node``."""

    def describe(self):
        return [d.decl() for d in _NODES.values()]

    def controlled(self):
        # heddle:node 0.2: the type names that run once per control event.
        return [d.type_name for d in _NODES.values() if d.controlled]

    def invoke(self, type_name, inputs, properties):
        d = _NODES.get(type_name)
        if d is None:
            raise _error(f"this package has no node type {type_name!r}", "heddle:unknown-type")
        try:
            return d.run(inputs, properties)
        except NodeError as e:
            raise _error(e.message, e.signature, e.candidate) from None
        except Err:
            raise
        except Exception as e:  # any other exception fails the node, not the host
            log(traceback.format_exc(), "debug")
            raise _error(f"{type(e).__name__}: {e}", f"python:{type(e).__name__}") from None


# ---- values --------------------------------------------------------------------

def _json_default(o):
    if isinstance(o, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(o)).decode("ascii")}
    raise TypeError(f"{type(o).__name__} is not a JSON value")


def _json_hook(d):
    if len(d) == 1 and "$bytes" in d and isinstance(d["$bytes"], str):
        return base64.b64decode(d["$bytes"])
    return d


def to_value(v):
    """A Python value as a WIT ``value``."""
    # The common scalars by exact type first: one lookup instead of a chain of isinstance.
    case = _SCALAR_CASES.get(type(v))
    if case is not None:
        return case(v)
    if v is None:
        return wit.Value_Null()
    if isinstance(v, bool):
        return wit.Value_Boolean(v)
    if isinstance(v, int):
        if -(2 ** 63) <= v < 2 ** 63:
            return wit.Value_S64(v)
        return wit.Value_F64(float(v))
    if isinstance(v, float):
        return wit.Value_F64(v)
    if isinstance(v, str):
        return wit.Value_String(v)
    if isinstance(v, (bytes, bytearray)):
        return wit.Value_Bytes(bytes(v))
    if isinstance(v, (list, tuple, dict)):
        return wit.Value_Json(json.dumps(v, default=_json_default, allow_nan=False))
    raise TypeError(f"cannot send a {type(v).__name__} as a node value")


# Looked up once: ``wit.X`` is a module attribute lookup on every use.
_VALUE_NULL = wit.Value_Null
_VALUE_JSON = wit.Value_Json
_SCALAR_CASES = {float: wit.Value_F64, str: wit.Value_String, bool: wit.Value_Boolean}
# The cases whose payload is the Python value itself.
_PLAIN_VALUES = frozenset(
    (wit.Value_Boolean, wit.Value_S64, wit.Value_F64, wit.Value_String, wit.Value_Bytes))


def from_value(v):
    """A WIT ``value`` as a Python value."""
    if isinstance(v, _VALUE_NULL):
        return None
    if isinstance(v, _VALUE_JSON):
        return json.loads(v.value, object_hook=_json_hook)
    return v.value


# ---- host imports --------------------------------------------------------------

_LEVELS = {
    "trace": wit.LogLevel.TRACE, "debug": wit.LogLevel.DEBUG, "info": wit.LogLevel.INFO,
    "warn": wit.LogLevel.WARN, "warning": wit.LogLevel.WARN, "error": wit.LogLevel.ERROR,
}


def log(message, level="info"):
    """A log line in the run's event stream (capped per invocation by the host)."""
    host.log(_LEVELS.get(level, wit.LogLevel.INFO), str(message))


def debug(message):
    log(message, "debug")


def info(message):
    log(message, "info")


def warn(message):
    log(message, "warn")


def error(message):
    log(message, "error")


def emit(handle, value):
    """Streaming output: sends ``value`` downstream on ``handle`` now (the node must be
    declared ``streaming_output=True``). Raises EmitError when the host refuses."""
    try:
        host.emit(handle, to_value(value))
    except Err as e:
        raise EmitError(str(e.value)) from None


def inputs():
    """Streaming input: yields ``(handle, value)`` in arrival order until every input
    is closed or the run is cancelled (the node must be ``streaming_input=True``)."""
    while True:
        item = host.next_input()
        if item is None:
            return
        yield item[0], from_value(item[1])


def cancelled():
    """True once the run was cancelled or the deadline passed: long loops should stop."""
    return host.cancelled()


def deadline_ms():
    """Milliseconds left before the invocation's deadline, or None."""
    return host.deadline_ms()


def secret(name):
    """A secret the operator granted to this package, or None."""
    return host.get_secret(name)


def report_cost(usd):
    """Provider cost of work done for this invocation (makes it not retry-safe)."""
    host.report_cost(float(usd))


def record_asset(asset_id):
    """An asset this invocation created outside the graph (makes it not retry-safe)."""
    host.record_asset(str(asset_id))


# Last: `control` uses the names above.
from heddle import control  # noqa: E402
