// The API client: every call carries the bearer token from sessionStorage (never a
// URL), and the event stream is read with fetch() because EventSource cannot send it.

const KEY = "heddle.token";

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(t) {
  if (t) sessionStorage.setItem(KEY, t.trim());
  else sessionStorage.removeItem(KEY);
}

/** A refused or failed API call: its HTTP status and the server's message. */
export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

function headers(extra) {
  return { Authorization: `Bearer ${token() || ""}`, ...extra };
}

async function refusal(resp) {
  let body = null;
  try { body = await resp.json(); } catch { /* not JSON */ }
  const msg = (body && body.error) || `${resp.status} ${resp.statusText}`;
  return new ApiError(resp.status, msg, body);
}

/** GET (or the method given) `path` and its JSON answer. */
export async function call(path, { method = "GET", body } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const resp = await fetch(path, init);
  if (!resp.ok) throw await refusal(resp);
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

/** A stored artifact's bytes, as a Blob. */
export async function artifact(run, sha256) {
  const resp = await fetch(`/api/runs/${encodeURIComponent(run)}/artifacts/${sha256}`, { headers: headers() });
  if (!resp.ok) throw await refusal(resp);
  return resp.blob();
}

/**
 * Reads run `run`'s records as Server-Sent Events from after `lastSeq` (-1: from the
 * start), calling `onEvent(kind, data)` for each: a record (kind = its record kind; its
 * `seq` and `kind`, which the server sends only as the event's `id:` and `event:`, put
 * back), or an `escalation` notice between records (no sequence number). Resolves when
 * the server ends the stream (the run is not driven by the server any more) or `signal`
 * aborts it.
 */
export async function stream(run, lastSeq, onEvent, signal) {
  const h = lastSeq >= 0 ? headers({ "Last-Event-ID": String(lastSeq) }) : headers();
  h.Accept = "text/event-stream";
  const resp = await fetch(`/api/runs/${encodeURIComponent(run)}/events`, { headers: h, signal, cache: "no-store" });
  if (!resp.ok) throw await refusal(resp);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
      const lines = block.split(/\r?\n/);
      const field = (name) => lines.filter((l) => l.startsWith(`${name}:`)).map((l) => l.slice(name.length + 1).replace(/^ /, ""));
      const data = field("data").join("\n");
      // Comment-only blocks are keep-alives.
      if (!data) continue;
      const kind = field("event")[0] || "message";
      const value = JSON.parse(data);
      const [id] = field("id");
      if (id !== undefined) Object.assign(value, { seq: Number(id), kind });
      onEvent(kind, value);
    }
  }
}
