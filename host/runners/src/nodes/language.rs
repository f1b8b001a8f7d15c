//! The languages: their type names, the property holding the code, and the command
//! line with the prelude that turns inputs into variables and defines `set_result`.

use crate::config::RunnersConfig;

/// Prefix of the stdout line through which `set_result` hands the result to the host.
/// It starts with an ASCII record separator so ordinary output never matches it.
pub const RESULT_MARKER: &str = "\u{1e}heddle-result ";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    Python,
    JavaScript,
    Bash,
    /// A shell command (`sh -c`).
    Shell,
    Ruby,
    Lua,
}

impl Language {
    pub const ALL: [Language; 6] = [
        Language::Python,
        Language::JavaScript,
        Language::Bash,
        Language::Shell,
        Language::Ruby,
        Language::Lua,
    ];

    pub fn type_name(self) -> &'static str {
        match self {
            Language::Python => "code.python",
            Language::JavaScript => "code.javascript",
            Language::Bash => "code.bash",
            Language::Shell => "code.shell",
            Language::Ruby => "code.ruby",
            Language::Lua => "code.lua",
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Language::Python => "Python",
            Language::JavaScript => "JavaScript",
            Language::Bash => "Bash",
            Language::Shell => "shell",
            Language::Ruby => "Ruby",
            Language::Lua => "Lua",
        }
    }

    /// The property holding the source text.
    pub(super) fn code_property(self) -> &'static str {
        match self {
            Language::Shell => "command",
            _ => "code",
        }
    }

    pub(super) fn default_image(self, c: &RunnersConfig) -> &str {
        match self {
            Language::Python => &c.images.python,
            Language::JavaScript => &c.images.javascript,
            Language::Bash | Language::Shell => &c.images.bash,
            Language::Ruby => &c.images.ruby,
            Language::Lua => &c.images.lua,
        }
    }

    pub(super) fn from_type(t: &str) -> Option<Language> {
        Language::ALL.into_iter().find(|l| l.type_name() == t)
    }

    /// The command line. The user's code travels in `HEDDLE_CODE` for Python,
    /// JavaScript, Ruby and Lua (so no interpreter option parsing can touch it) and after
    /// a one-line prelude for the shells (so line numbers in their errors stay right).
    pub(super) fn argv(self, code: &str) -> (Vec<String>, Option<String>) {
        match self {
            Language::Python => (
                vec![
                    "python3".into(),
                    "-u".into(),
                    "-c".into(),
                    PY_PRELUDE.into(),
                ],
                Some(code.into()),
            ),
            Language::JavaScript => (
                vec!["node".into(), "-e".into(), JS_PRELUDE.into()],
                Some(code.into()),
            ),
            Language::Bash => (
                vec!["bash".into(), "-c".into(), format!("{SH_PRELUDE}{code}")],
                None,
            ),
            Language::Shell => (
                vec!["sh".into(), "-c".into(), format!("{SH_PRELUDE}{code}")],
                None,
            ),
            Language::Ruby => (
                vec!["ruby".into(), "-e".into(), RUBY_PRELUDE.into()],
                Some(code.into()),
            ),
            Language::Lua => (
                vec!["lua".into(), "-e".into(), LUA_PRELUDE.into()],
                Some(code.into()),
            ),
        }
    }
}

const PY_PRELUDE: &str = r#"import json as _hj, os as _ho, sys as _hs
inputs = {_k[10:]: _hj.loads(_v) for _k, _v in _ho.environ.items() if _k.startswith("HEDDLE_IN_")}
def set_result(value):
    try:
        _t = _hj.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError("set_result: NaN and Infinity are not JSON numbers") from None
    _hs.stdout.write("\x1eheddle-result " + _t + "\n")
    _hs.stdout.flush()
_hcode = _ho.environ.pop("HEDDLE_CODE", "")
globals().update(inputs)
exec(compile(_hcode, "<code>", "exec"), globals())
"#;

const JS_PRELUDE: &str = r#"const inputs = {};
for (const [k, v] of Object.entries(process.env)) if (k.startsWith("HEDDLE_IN_")) inputs[k.slice(10)] = JSON.parse(v);
const _finite = (k, v) => { if (typeof v === "number" && !Number.isFinite(v)) throw new RangeError("set_result: NaN and Infinity are not JSON numbers"); return v; };
const set_result = (v) => { process.stdout.write("\x1eheddle-result " + JSON.stringify(v === undefined ? null : v, _finite) + "\n"); };
const code = process.env.HEDDLE_CODE || ""; delete process.env.HEDDLE_CODE;
const names = Object.keys(inputs).filter((n) => /^[A-Za-z_$][\w$]*$/.test(n));
const AsyncFunction = (async () => {}).constructor;
let fn;
try { fn = new AsyncFunction("inputs", "set_result", "setResult", "require", ...names, code); }
catch (e) { console.error(String(e && e.stack || e)); process.exit(1); }
fn(inputs, set_result, set_result, require, ...names.map((n) => inputs[n]))
  .catch((e) => { console.error(String(e && e.stack || e)); process.exitCode = 1; });
"#;

/// Inputs become local variables of the code's binding (names a Ruby local can have:
/// lower case or `_` first; all are in `inputs`). Standard output is synchronous so
/// lines stream as they are written.
const RUBY_PRELUDE: &str = r#"require "json"
$stdout.sync = true
inputs = ENV.select { |k, _| k.start_with?("HEDDLE_IN_") }.to_h { |k, v| [k[10..], JSON.parse(v)] }
def set_result(value)
  text = begin
    JSON.generate(value)
  rescue JSON::GeneratorError => e
    raise ArgumentError, "set_result: NaN and Infinity are not JSON numbers", cause: nil if e.message =~ /NaN|Infinity/
    raise
  end
  $stdout.write("\x1eheddle-result " + text + "\n")
end
_hb = binding
inputs.each { |k, v| _hb.local_variable_set(k, v) if k.match?(/\A[a-z_]\w*\z/) }
eval(ENV.delete("HEDDLE_CODE") || "", _hb, "<code>", 1)
"#;

/// Lua cannot list the environment, so the input names come in `HEDDLE_INPUTS`.
/// JSON is lua-cjson's (`null` decodes to `cjson.null`; an empty table encodes as
/// `{}`); whole numbers arrive as Lua integers, as they would in a JSON library that
/// kept them. Inputs become globals; the code is a chunk named `code`, so errors say
/// `code:LINE:`.
const LUA_PRELUDE: &str = r#"local cjson = require("cjson")
cjson.encode_invalid_numbers(false)
io.stdout:setvbuf("line")
local function integral(v)
  if type(v) == "number" then return math.tointeger(v) or v end
  if type(v) == "table" then for k, x in pairs(v) do v[k] = integral(x) end end
  return v
end
inputs = {}
for name in (os.getenv("HEDDLE_INPUTS") or ""):gmatch("%S+") do
  local value = integral(cjson.decode(os.getenv("HEDDLE_IN_" .. name)))
  inputs[name] = value
  _G[name] = value
end
function set_result(value)
  local ok, text = pcall(cjson.encode, value)
  if not ok then
    if tostring(text):find("NaN or Inf") then error("set_result: NaN and Infinity are not JSON numbers", 2) end
    error("set_result: " .. tostring(text), 2)
  end
  io.stdout:write("\30heddle-result " .. text .. "\n")
end
local chunk, err = load(os.getenv("HEDDLE_CODE") or "", "=code", "t")
if not chunk then io.stderr:write(err, "\n") os.exit(1) end
chunk()
"#;

const SH_PRELUDE: &str = r#"set_result() { printf '\036heddle-result %s\n' "$1"; }; "#;
