// The run viewer's entry: the token, the routes (#/ runs, #/run/ID one run) and the
// runs list. The token may arrive as a fragment (#token=…), which browsers never send
// to the server; it is moved to sessionStorage and removed from the address at once.
import { call, setToken, token, ApiError } from "./api.js";
import { h, badge, when } from "./run.js";
import { showRun } from "./run.js";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const live = document.getElementById("live");
const forget = document.getElementById("forget");
let leave = () => {};

function takeTokenFromFragment() {
  const parts = location.hash.replace(/^#/, "").split("&");
  const t = parts.find((p) => p.startsWith("token="));
  if (!t) return;
  setToken(decodeURIComponent(t.slice(6)));
  const rest = parts.filter((p) => p !== t).join("&");
  history.replaceState(null, "", `${location.pathname}${rest ? `#${rest}` : "#/"}`);
}

function setCrumbs(...items) {
  crumbs.replaceChildren(...items.flatMap((it, i) => (i ? [h("span", { class: "sep" }, "/"), it] : [it])));
}

const ctx = {
  setLive(on) { live.hidden = !on; },
  authFailed(err) { showLogin(err); },
};

function showLogin(err) {
  leave();
  leave = () => {};
  setToken(null);
  ctx.setLive(false);
  forget.hidden = true;
  setCrumbs();
  const input = h("input", { type: "password", id: "token-input", autocomplete: "off", placeholder: "API token" });
  const form = h("form", { class: "card login" },
    h("h1", {}, "Sign in to this Heddle server"),
    err ? h("p", { class: "banner error", id: "auth-error" },
      err.status === 401 ? "The server refused the token (401): nothing is shown without the right one." : `The server could not be reached: ${err.message}`) : null,
    h("p", { class: "muted" }, "Paste the API token `heddle serve` printed on its first start (kept in serve.token beside the run store). It stays in this tab only."),
    h("label", { for: "token-input" }, "Token"), input,
    h("div", { class: "row mt" }, h("button", { class: "primary", type: "submit", id: "token-submit" }, "Open")));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    setToken(input.value);
    route();
  });
  main.replaceChildren(form);
  input.focus();
}

async function showRuns() {
  setCrumbs(h("span", {}, "Runs"));
  const body = h("tbody");
  const card = h("div", { class: "card" }, h("h2", {}, "Runs"),
    h("table", { class: "runs" },
      h("thead", {}, h("tr", {}, ...["State", "Graph", "Run", "Started", "Records"].map((t) => h("th", {}, t)))), body));
  main.replaceChildren(card);
  let stopped = false;
  let timer = null;
  const load = async () => {
    try {
      const runs = await call("/api/runs");
      runs.sort((a, b) => b.created_ms - a.created_ms);
      body.replaceChildren(...runs.map((r) => h("tr", { "data-run": r.run_id, "data-state": r.state },
        h("td", {}, badge(r.state)),
        h("td", {}, h("a", { href: `#/run/${encodeURIComponent(r.run_id)}` }, r.graph)),
        h("td", { class: "mono" }, r.run_id),
        h("td", {}, when(r.created_ms)),
        h("td", {}, String(r.records)))));
      if (!runs.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No runs yet: POST a graph to /api/runs.")));
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) return ctx.authFailed(e);
      card.prepend(h("p", { class: "banner error" }, e.message));
    }
    if (!stopped) timer = setTimeout(load, 2000);
  };
  leave = () => { stopped = true; clearTimeout(timer); };
  await load();
}

function route() {
  leave();
  leave = () => {};
  if (!token()) return showLogin(null);
  forget.hidden = false;
  const m = location.hash.match(/^#\/run\/([^&]+)/);
  if (m) {
    const id = decodeURIComponent(m[1]);
    setCrumbs(h("a", { href: "#/" }, "Runs"), h("span", { class: "mono" }, id));
    leave = showRun(main, id, ctx);
  } else {
    showRuns();
  }
}

forget.addEventListener("click", () => { setToken(null); route(); });
window.addEventListener("hashchange", () => { takeTokenFromFragment(); route(); });
takeTokenFromFragment();
route();
