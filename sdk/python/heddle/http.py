"""Outgoing HTTP from a Python node, through the host's ``wasi:http``.

It reaches only the destinations the operator grants the package (``network`` in
``[packages.NAME]`` of heddle.toml); declare the request with
``capability("network", "https://api.example.com", "why")``. Blocking and simple: one
request, the whole response body in memory (the host caps it at ``max_http_body_bytes``),
no redirects followed (a redirect is the node's next request, judged by the grant like
the first)::

    from heddle import http, node, capability

    @node("demo.forecast", inputs={"city": "str"}, outputs={"forecast": "json"},
          capabilities=[capability("network", "https://api.example.com", "the forecast")])
    def forecast(city):
        res = http.request("GET", f"https://api.example.com/forecast?city={city}")
        res.raise_for_status()          # NodeError with signature http:<status>
        return {"forecast": res.json()}

A failed request raises ``NodeError`` with the same signatures as the Rust SDK and the
``http`` package: ``http:denied`` (not granted: the node's log names the grant to add),
``http:timeout``, ``http:dns``, ``http:connect``, ``http:tls``, ``http:body-too-large``,
``http:too-many``, ``http:request``, ``http:protocol``.
"""

import json as _json
from urllib.parse import urlsplit

from componentize_py_types import Err, Ok
from wit_world.imports import outgoing_handler, streams
from wit_world.imports import wasi_http_types as t

from . import NodeError

__all__ = ["request", "Response"]

# Bytes per write: wasi:io output streams take at most 4096 per blocking write.
_WRITE_CHUNK = 4096
_READ_CHUNK = 65536


class Response:
    """A response: ``status`` (int), ``headers`` (list of (name, value) str pairs, names
    lowercase, in order) and ``body`` (bytes)."""

    def __init__(self, url, status, headers, body):
        self.url = url
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name):
        """The first value of header ``name`` (any case), or ``None``."""
        name = name.lower()
        return next((v for n, v in self.headers if n == name), None)

    @property
    def text(self):
        return self.body.decode("utf-8", errors="replace")

    def json(self):
        try:
            return _json.loads(self.body)
        except ValueError as e:
            raise NodeError(f"{_shown(self.url)}: the body is not JSON: {e}",
                            signature="json:parse") from None

    def raise_for_status(self):
        """Raises ``NodeError`` with signature ``http:<status>`` for a status >= 400, so a
        policy can retry a 503 and not a 404."""
        if self.status >= 400:
            raise NodeError(f"{_shown(self.url)} answered {self.status}",
                            signature=f"http:{self.status}")
        return self


def request(method, url, headers=None, body=None):
    """Sends one request and returns its ``Response``. ``headers``: a dict or a list of
    pairs; ``body``: bytes, str (sent as UTF-8) or ``None``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _bad(url, "the scheme is not http or https")
    if not parts.hostname or "@" in parts.netloc:
        raise _bad(url, "no host, or a user name in it")
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or ())
    if isinstance(body, str):
        body = body.encode()
    if body and not any(str(n).lower() == "content-length" for n, _ in pairs):
        # Declared, so the body goes out whole rather than chunked, and one over the
        # host's cap is refused before a byte of it is sent.
        pairs.append(("content-length", str(len(body))))
    try:
        fields = t.Fields.from_list(
            [(str(n), v.encode() if isinstance(v, str) else bytes(v)) for n, v in pairs])
    except Err as e:
        raise _bad(url, f"a header the host refuses ({type(e.value).__name__})") from None
    req = t.OutgoingRequest(fields)
    req.set_method(_method(method))
    req.set_scheme(t.Scheme_Https() if scheme == "https" else t.Scheme_Http())
    req.set_authority(parts.netloc)
    path = parts.path or "/"
    req.set_path_with_query(path + (f"?{parts.query}" if parts.query else ""))
    out = req.body()
    try:
        future = outgoing_handler.handle(req, None)
    except Err as e:
        raise _failed(url, e.value) from None
    with future:
        try:
            if body:
                with out.write() as stream:
                    for i in range(0, len(body), _WRITE_CHUNK):
                        stream.blocking_write_and_flush(body[i:i + _WRITE_CHUNK])
            t.OutgoingBody.finish(out, None)
        except Err as e:
            # The host ended the request (refused, body over the cap): its answer says why.
            answer = _wait(future)
            if isinstance(answer, Err):
                raise _failed(url, answer.value) from None
            if type(e.value).__name__.startswith("ErrorCode_"):
                raise _failed(url, e.value) from None
            raise _protocol(url, e.value) from None
        answer = _wait(future)
    if isinstance(answer, Err):
        raise _failed(url, answer.value)
    # The body, its stream and the response are dropped child first, as wasi:http asks.
    with answer.value as resp:
        status = resp.status()
        with resp.headers() as fields:
            got = [(n.lower(), v.decode("latin-1")) for n, v in fields.entries()]
        incoming = resp.consume()
        chunks = []
        with incoming.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(_READ_CHUNK))
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise _protocol(url, e.value) from None
        with t.IncomingBody.finish(incoming):
            pass
    return Response(url, status, got, b"".join(chunks))


def _wait(future):
    """The future's answer: ``Ok(response)`` or ``Err(error-code)``."""
    with future.subscribe() as ready:
        ready.block()
    got = future.get()
    if got is None or isinstance(got, Err):
        return Err(t.ErrorCode_InternalError("the response was already taken"))
    return got.value if isinstance(got, Ok) else got


_METHODS = {
    "GET": t.Method_Get, "HEAD": t.Method_Head, "POST": t.Method_Post, "PUT": t.Method_Put,
    "DELETE": t.Method_Delete, "OPTIONS": t.Method_Options, "PATCH": t.Method_Patch,
    "TRACE": t.Method_Trace, "CONNECT": t.Method_Connect,
}


def _method(m):
    m = str(m).upper()
    cls = _METHODS.get(m)
    return cls() if cls else t.Method_Other(m)


# wasi:http error-code -> (signature, what) as the Rust SDK says it.
_KINDS = [
    (("HttpRequestDenied",), "http:denied",
     "the host refused the request (see the node's log for the grant that would allow it)"),
    (("DestinationIpProhibited",), "http:denied",
     "the host refused the address the name resolved to (see the node's log)"),
    (("ConfigurationError",), "http:denied",
     "the host's network configuration for this destination is incomplete (see the node's log)"),
    (("ConnectionLimitReached",), "http:too-many",
     "too many requests of this invocation in flight"),
    (("DnsTimeout", "ConnectionTimeout", "ConnectionReadTimeout", "ConnectionWriteTimeout",
      "HttpResponseTimeout"), "http:timeout", "timed out"),
    (("DnsError", "DestinationNotFound"), "http:dns", "the name did not resolve"),
    (("ConnectionRefused", "ConnectionTerminated", "DestinationUnavailable",
      "DestinationIpUnroutable"), "http:connect", "no connection"),
    (("TlsProtocolError", "TlsCertificateError", "TlsAlertReceived"), "http:tls", "TLS failed"),
    (("HttpRequestBodySize", "HttpResponseBodySize"), "http:body-too-large",
     "a body over the host's limit (`max_http_body_bytes` in [wasm])"),
    (("HttpRequestMethodInvalid", "HttpRequestUriInvalid", "HttpRequestUriTooLong",
      "HttpRequestHeaderSectionSize", "HttpRequestHeaderSize"), "http:request",
     "malformed request"),
]


def _failed(url, code):
    name = type(code).__name__.removeprefix("ErrorCode_")
    for names, signature, what in _KINDS:
        if name in names:
            return NodeError(f"request to {_shown(url)}: {what} ({name})", signature=signature)
    detail = getattr(code, "value", None)
    return NodeError(f"request to {_shown(url)}: {name}{f': {detail}' if detail else ''}",
                     signature="http:protocol")


def _protocol(url, err):
    """A failed body read or write. wasmtime's wasi:http hands those to the guest as an
    io error without an error-code, so the host's words (fixed by its version) are all
    there is to classify by, as the Rust SDK does."""
    inner = getattr(err, "value", None)
    if hasattr(inner, "to_debug_string"):
        text = inner.to_debug_string()
    else:
        text = type(err).__name__ + (f": {inner}" if inner is not None else "")
    low = text.lower()
    if "body size exceeds limit" in low:
        signature = "http:body-too-large"
    elif "timeout" in low:
        signature = "http:timeout"
    elif "connection terminated" in low or "connection error" in low:
        signature = "http:connect"
    else:
        signature = "http:protocol"
    return NodeError(f"request to {_shown(url)}: {text}", signature=signature)


def _bad(url, why):
    return NodeError(f"URL {_shown(url)}: {why}", signature="http:request")


def _shown(url):
    """The URL as messages show it: without the query, which may hold a token."""
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=len(url))
    return url[:cut][:200] + ("?…" if cut < len(url) else "")
