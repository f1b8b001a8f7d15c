;; A Heddle node package in plain WebAssembly text: no SDK, no language
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
    (i32.const 2236))

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
    (i32.store (local.get $dst) (i32.const 1318))
    (i32.store offset=4 (local.get $dst) (i32.const 10))
    (i32.store8 offset=8 (local.get $dst) (i32.const 2))
    (i64.store offset=16 (local.get $dst) (i64.extend_i32_u (local.get $props_len)))
    ;; log-level info is 2 (trace, debug, info, warn, error)
    (call $log (i32.const 2) (i32.const 1328) (i32.const 14))
    (local.set $ret (call $realloc (i32.const 0) (i32.const 0) (i32.const 4) (i32.const 36)))
    (i32.store8 (local.get $ret) (i32.const 0))
    (i32.store offset=4 (local.get $ret) (local.get $out))
    (i32.store offset=8 (local.get $ret) (i32.add (local.get $in_len) (i32.const 1)))
    (local.get $ret))

  ;; What describe() returns, laid out by the canonical ABI (little-endian; a string or
  ;; a list is an i32 pointer and an i32 length; a record's fields at their alignment).
  ;; the strings
  (data (i32.const 1024) "byo.casesValue casesAnswers, for every entry of `inputs`, the case of the WIT `value` variant it arrived as (0 null, 1 boolean, 2 s64, 3 f64, 4 string, 5 bytes, 6 json), and under `properties` how many entries `properties` held.intthe case the input arrived ashow many entries `properties` heldpropertiescases computedbbooliffloatnnumbersstrllist[int]oobjectaanyp\00\00\00\00\00")
  ;; 1392: port-decl `b: bool` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1392) "\3e\05\00\00\01\00\00\00\3f\05\00\00\04\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1448: port-decl `i: int` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1448) "\43\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1504: port-decl `f: float` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1504) "\44\05\00\00\01\00\00\00\45\05\00\00\05\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1560: port-decl `n: number` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1560) "\4a\05\00\00\01\00\00\00\4b\05\00\00\06\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1616: port-decl `s: str` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1616) "\51\05\00\00\01\00\00\00\52\05\00\00\03\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1672: port-decl `l: list[int]` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1672) "\55\05\00\00\01\00\00\00\56\05\00\00\09\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1728: port-decl `o: object` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1728) "\5f\05\00\00\01\00\00\00\60\05\00\00\06\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1784: port-decl `a: any` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1784) "\66\05\00\00\01\00\00\00\67\05\00\00\03\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1840: port-decl `p: str` (56 bytes: name, type, required=0, default=none, description)
  (data (i32.const 1840) "\6a\05\00\00\01\00\00\00\52\05\00\00\03\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00\26\05\00\00\00\00\00\00")
  ;; 1896: output-decl `b: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 1896) "\3e\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 1924: output-decl `i: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 1924) "\43\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 1952: output-decl `f: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 1952) "\44\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 1980: output-decl `n: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 1980) "\4a\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 2008: output-decl `s: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 2008) "\51\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 2036: output-decl `l: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 2036) "\55\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 2064: output-decl `o: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 2064) "\5f\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 2092: output-decl `a: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 2092) "\66\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 2120: output-decl `p: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 2120) "\6a\05\00\00\01\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\e7\04\00\00\1d\00\00\00")
  ;; 2148: output-decl `properties: int` (28 bytes: name, type, correlation=single, description)
  (data (i32.const 2148) "\26\05\00\00\0a\00\00\00\e4\04\00\00\03\00\00\00\00\00\00\00\04\05\00\00\22\00\00\00")
  ;; 2176: node-decl (60 bytes: type-name, title, description, inputs, outputs, properties, retry-safe=1, streaming-output, streaming-input, reuse-instance, capabilities)
  (data (i32.const 2176) "\00\04\00\00\09\00\00\00\09\04\00\00\0b\00\00\00\14\04\00\00\d0\00\00\00\70\05\00\00\08\00\00\00\68\07\00\00\0a\00\00\00\30\07\00\00\01\00\00\00\01\00\00\00\00\00\00\00\00\00\00\00")
  ;; 2236: describe's result: list<node-decl> as (pointer, length)
  (data (i32.const 2236) "\80\08\00\00\01\00\00\00")
)
