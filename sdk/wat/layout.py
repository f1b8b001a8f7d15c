#!/usr/bin/env python3
# Writes sdk/wat/cases.wat: the module's code, and the data describe() returns laid out
# by the canonical ABI (wit/README.md, "Layouts"). Edit the node's ports here and run
#   python3 sdk/wat/layout.py
# rather than the data segments of cases.wat by hand.
import os
import struct
BASE = 1024
buf = bytearray()
notes = []  # (offset, comment)

def here(): return BASE + len(buf)
def align(a):
    while len(buf) % a: buf.append(0)

strings = {}
def s(text):
    if text in strings: return strings[text]
    b = text.encode()
    addr = here(); buf.extend(b)
    strings[text] = (addr, len(b))
    return strings[text]

NODE = "byo.cases"
inputs = [("b","bool"),("i","int"),("f","float"),("n","number"),("s","str"),("l","list[int]"),("o","object"),("a","any")]
props = [("p","str")]
outputs = [n for n,_ in inputs] + ["p", "properties"]
# strings first
for t in [NODE, "Value cases", "Answers, for every entry of `inputs`, the case of the WIT `value` variant it arrived as (0 null, 1 boolean, 2 s64, 3 f64, 4 string, 5 bytes, 6 json), and under `properties` how many entries `properties` held.", "int", "the case the input arrived as", "how many entries `properties` held", "", "properties", "cases computed"]:
    s(t)
for n,t in inputs + props:
    s(n); s(t)
align(8)
ports_in = here()
def port(name, ty):
    align(8)
    start = here()
    na, nl = s_get(name); ta, tl = s_get(ty)
    da, dl = strings[""]
    # layout: name(0..8) type(8..16) required(16) pad default option at 24: disc(24) pad, value at 32: disc(32) pad payload(40..48), description(48..56)
    rec = struct.pack("<II", na, nl) + struct.pack("<II", ta, tl) + bytes([0]) + bytes(7) + bytes([0]) + bytes(7) + bytes(16) + struct.pack("<II", da, dl)
    assert len(rec) == 56
    buf.extend(rec)
    notes.append((start, f"port-decl `{name}: {ty}` (56 bytes: name, type, required=0, default=none, description)"))
def s_get(t): return strings[t]
for n,t in inputs: port(n,t)
ports_props = here()
for n,t in props: port(n,t)
align(4)
outs = here()
for n in outputs:
    da, dl = strings["the case the input arrived as" if n != "properties" else "how many entries `properties` held"]
    start = here()
    na, nl = s_get(n) if n in strings else s(n)
    ia, il = strings["int"]
    rec = struct.pack("<IIII", na, nl, ia, il) + bytes([0]) + bytes(3) + struct.pack("<II", da, dl)
    assert len(rec) == 28
    buf.extend(rec)
    notes.append((start, f"output-decl `{n}: int` (28 bytes: name, type, correlation=single, description)"))
align(4)
decl = here()
ta, tl = strings[NODE]; tia, til = strings["Value cases"]
desc = [k for k in strings if k.startswith("Answers")][0]
dea, del_ = strings[desc]
rec = struct.pack("<IIIIIIIIIIII", ta, tl, tia, til, dea, del_, ports_in, len(inputs), outs, len(outputs), ports_props, len(props)) + bytes([1,0,0,0]) + struct.pack("<II", 0, 0)
assert len(rec) == 60
buf.extend(rec)
notes.append((decl, "node-decl (60 bytes: type-name, title, description, inputs, outputs, properties, retry-safe=1, streaming-output, streaming-input, reuse-instance, capabilities)"))
align(4)
ret = here()
buf.extend(struct.pack("<II", decl, 1))
notes.append((ret, "describe's result: list<node-decl> as (pointer, length)"))

PROPS = strings["properties"]
LOG = strings["cases computed"]
def esc(b): return "".join("\\%02x" % c for c in b)
out = []
out.append(""";; A Heddle node package in plain WebAssembly text: no SDK, no language
;; toolchain, no WASI. `wit/README.md` ("Bring your own language") walks through it;
;; `tests/byo_language.rs` builds it with wasm-tools and runs it.
;;
;;   wasm-tools component embed wit --world node-package cases.wat -o cases.core.wasm
;;   wasm-tools component new cases.core.wasm -o cases.wasm
;;
;; The data segments at the end are written by layout.py (edit the ports there).
;;
;; One node type, `byo.cases`: for every entry of `inputs` it answers the case of the WIT
;; `value` variant the entry arrived as (0 null, 1 boolean, 2 s64, 3 f64, 4 string,
;; 5 bytes, 6 json), under the entry's own name, and under `properties` how many entries
;; `properties` held. The core module imports only the host's `log`; it exports what the
;; `node-package` world needs: `memory`, `cabi_realloc` and the two functions of
;; `heddle:node/node@0.1.0`.
(module
  ;; host.log(level: log-level, message: string): the enum is an i32, a string two.
  (import "heddle:node/host@0.1.0" "log" (func $log (param i32 i32 i32)))

  (memory (export "memory") 1)

  ;; A bump allocator: every invocation runs in a fresh instance, so nothing is freed.
  ;; The host calls it to place the strings and lists it passes in.
  (global $heap (mut i32) (i32.const 8192))
  (func $realloc (export "cabi_realloc")
    (param $old i32) (param $old_size i32) (param $align i32) (param $new_size i32)
    (result i32)
    (local $ptr i32) (local $pages i32)
    ;; round the heap up to $align (a power of two)
    (local.set $ptr
      (i32.and
        (i32.add (global.get $heap) (i32.sub (local.get $align) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get $align))))
    (global.set $heap (i32.add (local.get $ptr) (local.get $new_size)))
    ;; grow the memory when the heap passed its end; trap if it cannot grow
    (local.set $pages
      (i32.sub
        (i32.shr_u (i32.add (global.get $heap) (i32.const 65535)) (i32.const 16))
        (memory.size)))
    (if (i32.gt_s (local.get $pages) (i32.const 0))
      (then
        (if (i32.eq (memory.grow (local.get $pages)) (i32.const -1))
          (then unreachable))))
    ;; a realloc of an earlier block keeps its contents
    (if (local.get $old)
      (then (memory.copy (local.get $ptr) (local.get $old) (local.get $old_size))))
    (local.get $ptr))

  ;; describe() -> list<node-decl>: a list is two flat values, more than one result,
  ;; so the function returns a pointer to them (the static block at the end of the data).
  (func (export "heddle:node/node@0.1.0#describe") (result i32)
    (i32.const %d))

  ;; invoke(type-name: string, inputs: entries, properties: entries)
  ;;   -> result<entries, node-error>
  ;; Six i32 parameters (pointer and length of each); the result is returned through a
  ;; pointer to its block: the case byte at 0 (0 ok, 1 error), the payload at 4.
  ;; entries = list<tuple<string, value>>: 24 bytes an entry, 8-aligned: the name's
  ;; pointer and length at 0 and 4, the value's case byte at 8, its payload at 16
  ;; (s64 and f64 as 8 bytes; string, bytes and json as pointer and length).
  (func (export "heddle:node/node@0.1.0#invoke")
    (param $type_ptr i32) (param $type_len i32)
    (param $in_ptr i32) (param $in_len i32)
    (param $props_ptr i32) (param $props_len i32)
    (result i32)
    (local $out i32) (local $i i32) (local $src i32) (local $dst i32) (local $ret i32)
    (local.set $out
      (call $realloc (i32.const 0) (i32.const 0) (i32.const 8)
        (i32.mul (i32.add (local.get $in_len) (i32.const 1)) (i32.const 24))))
    (block $done
      (loop $each
        (br_if $done (i32.ge_u (local.get $i) (local.get $in_len)))
        (local.set $src (i32.add (local.get $in_ptr) (i32.mul (local.get $i) (i32.const 24))))
        (local.set $dst (i32.add (local.get $out) (i32.mul (local.get $i) (i32.const 24))))
        ;; the output is named like the input (the host copies the name out)
        (i32.store (local.get $dst) (i32.load (local.get $src)))
        (i32.store offset=4 (local.get $dst) (i32.load offset=4 (local.get $src)))
        ;; value s64 (case 2) holding the input's case byte
        (i32.store8 offset=8 (local.get $dst) (i32.const 2))
        (i64.store offset=16 (local.get $dst)
          (i64.extend_i32_u (i32.load8_u offset=8 (local.get $src))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $each)))
    ;; and ("properties", s64 how many properties came)
    (local.set $dst (i32.add (local.get $out) (i32.mul (local.get $in_len) (i32.const 24))))
    (i32.store (local.get $dst) (i32.const %d))
    (i32.store offset=4 (local.get $dst) (i32.const %d))
    (i32.store8 offset=8 (local.get $dst) (i32.const 2))
    (i64.store offset=16 (local.get $dst) (i64.extend_i32_u (local.get $props_len)))
    ;; log-level info is 2 (trace, debug, info, warn, error)
    (call $log (i32.const 2) (i32.const %d) (i32.const %d))
    (local.set $ret (call $realloc (i32.const 0) (i32.const 0) (i32.const 4) (i32.const 36)))
    (i32.store8 (local.get $ret) (i32.const 0))
    (i32.store offset=4 (local.get $ret) (local.get $out))
    (i32.store offset=8 (local.get $ret) (i32.add (local.get $in_len) (i32.const 1)))
    (local.get $ret))
""" % (ret, PROPS[0], PROPS[1], LOG[0], LOG[1]))
out.append(""";; What describe() returns, laid out by the canonical ABI (little-endian; a string or
;; a list is an i32 pointer and an i32 length; a record's fields at their alignment).
""")
# emit data: strings segment then each record segment with comment
note_at = dict(notes)
starts = sorted(note_at)
first = starts[0]
out.append(";; the strings\n")
def text_esc(b):
    r = []
    for c in b:
        ch = chr(c)
        if ch in '"\\' or c < 32 or c > 126: r.append("\\%02x" % c)
        else: r.append(ch)
    return "".join(r)
out.append('  (data (i32.const %d) "%s")\n' % (BASE, text_esc(buf[:first - BASE])))
for i, st in enumerate(starts):
    end = starts[i+1] if i+1 < len(starts) else BASE + len(buf)
    out.append("  ;; %d: %s\n" % (st, note_at[st]))
    out.append('  (data (i32.const %d) "%s")\n' % (st, esc(buf[st-BASE:end-BASE])))
out.append(")\n")
text = "".join(out)
# put data inside the module: move the closing paren
text = text.replace("    (local.get $ret))\n;; What", "    (local.get $ret))\n\n  ;; What").replace("\n;; a list is", "\n  ;; a list is").replace(";; the strings\n", "  ;; the strings\n")
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'cases.wat'), 'w').write(text)
