"""Controllers: driving the controlled nodes a control edge from this node reaches.

A node is a controller when a control edge leaves it in the graph (nothing to declare).
Each of its invocations gets the ``_control_context`` input, which :func:`context`
returns as a dict by controlled node id: ``node_type``, ``title``, ``properties``
(each with its ``type``, ``default``, configured ``value``) and the ``run`` action's
schema (``actions.run.properties`` and ``.outputs``)::

    from heddle import control, node

    @node("demo.each_word", inputs={"sentence": "str"}, outputs={"words": "list[str]"})
    def each_word(sentence):
        (target,) = control.context()             # the one node it drives
        tickets = [control.send(target, {"text": w}) for w in sentence.split()]
        return {"words": [t.reply()["text"] for t in tickets]}

:func:`send` queues a ``run`` event with property overrides (for that run only) and
returns a :class:`Ticket`; events sent before any reply is awaited are in flight
together and answered in the order sent. What the host refuses (a node no control edge
reaches, a property the target does not have, a value of the wrong type) raises
:class:`heddle.NodeError` with the host's message, naming both nodes, ``__control__``
and the property, with signature ``control:refused``; a failed reply raises it with
``control:failed``. Uncaught, either fails the node with that message.
"""

import heddle
from componentize_py_types import Err
from heddle import NodeError, from_value, to_value
from wit_world.imports import host

__all__ = ["CONTEXT_INPUT", "Ticket", "context", "targets", "send", "run"]

#: The input the host gives a controller its context on.
CONTEXT_INPUT = "_control_context"


def context():
    """The control context of the running invocation: a dict by controlled node id, or
    ``None`` when no control edge leaves this node."""
    for name, value in heddle._current_inputs:
        if name == CONTEXT_INPUT:
            return from_value(value)
    return None


def targets():
    """The ids of the controlled nodes this node drives (empty when none)."""
    return list(context() or {})


def _host_function(name):
    fn = getattr(host, name, None)
    if fn is None:
        raise NodeError(
            "this package was built against heddle:node 0.1, which has no control "
            "events; build it against 0.2 (the default of `heddle package build`)",
            signature="control:unsupported")
    return fn


class Ticket:
    """A ``run`` event on its way; :meth:`reply` waits for the target's outputs."""

    __slots__ = ("target", "_id")

    def __init__(self, target, ticket):
        self.target = target
        self._id = ticket

    def reply(self):
        """The outputs of the invocation the event caused, a dict by output name.
        Raises NodeError (signature ``control:failed``) when it failed; each ticket is
        answered once."""
        try:
            entries = _host_function("control_reply")(self._id)
        except Err as e:
            raise NodeError(str(e.value), signature="control:failed") from None
        return {name: from_value(v) for name, v in entries}

    def __repr__(self):
        return f"Ticket({self.target!r}, {self._id})"


def send(target, properties=None, /, **overrides):
    """Sends a ``run`` event to the controlled node ``target`` (a node id, as in
    :func:`context`) with property overrides for that run only, from ``properties``
    (a dict) and keyword arguments; returns its :class:`Ticket`. Raises NodeError
    (signature ``control:refused``) with the host's message when refused."""
    props = dict(properties or {})
    props.update(overrides)
    wire = [(str(k), to_value(v)) for k, v in props.items()]
    try:
        ticket = _host_function("control_send")(str(target), wire)
    except Err as e:
        raise NodeError(str(e.value), signature="control:refused") from None
    return Ticket(target, ticket)


def run(target, properties=None, /, **overrides):
    """:func:`send`, then its :meth:`Ticket.reply`."""
    return send(target, properties, **overrides).reply()
