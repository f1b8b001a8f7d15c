// Heddle SDK for node packages written in C.
//
// The build (`scripts/package-build DIR`) generates the bindings of the `heddle:node`
// WIT (`node_package.h/.c`) at build time, compiles your *.c files with this helper,
// and wraps the module as a component. You declare the nodes in one table and write
// one function per node; this helper implements the `describe` and `invoke` exports.
//
//   static bool run_len(heddle_call *c) {
//       const char *s; size_t n;
//       if (!heddle_get_str(c, "text", &s, &n)) return heddle_fail(c, "input:missing", "no text");
//       heddle_set_int(c, "length", (int64_t)n);
//       return true;
//   }
//   const heddle_node HEDDLE_NODES[] = {
//       { .type_name = "demo.len", .title = "Length",
//         .inputs = HEDDLE_PORTS({ "text", "str", .required = true }),
//         .outputs = HEDDLE_OUTPUTS({ "length", "int" }),
//         .retry_safe = true, .run = run_len },
//       { 0 }  // end of the table
//   };
//
// Memory: strings handed to you (heddle_get_*) live until your run function returns;
// everything you pass to heddle_set_* / heddle_emit_* is copied.
//
// The build targets heddle:node@0.2.0: `.controlled = true` declares a controlled node,
// and heddle_control_* is what a controller drives them with (defined
// HEDDLE_NODE_CONTROL tells your code the WIT built against has them; a build against
// the 0.1 WIT compiles them as failures saying so).
#ifndef HEDDLE_H
#define HEDDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct heddle_call heddle_call;

typedef enum {
    HEDDLE_SINGLE = 0,    // inherits the invocation's lineage (the usual case)
    HEDDLE_ITERATION = 1, // each value emitted is a new item of a child scope
    HEDDLE_CHUNK = 2,     // many values for the same lineage
    HEDDLE_AGGREGATE = 3, // drops the innermost scope (streaming-input nodes only)
} heddle_correlation;

typedef enum {
    HEDDLE_FILES_READ = 0,
    HEDDLE_FILES_WRITE = 1,
    HEDDLE_ENV = 2,
    HEDDLE_SECRET = 3,
    HEDDLE_NETWORK = 4,
} heddle_capability_kind;

typedef enum {
    HEDDLE_TRACE = 0,
    HEDDLE_DEBUG = 1,
    HEDDLE_INFO = 2,
    HEDDLE_WARN = 3,
    HEDDLE_ERROR = 4,
} heddle_log_level;

// An input or property port. `default_json` (optional) is the default as JSON text.
typedef struct {
    const char *name;
    const char *type; // any, bool, int, float, number, str, bytes, object, json, list[T]
    bool required;
    const char *default_json;
    const char *description;
} heddle_port;

typedef struct {
    const char *name;
    const char *type;
    heddle_correlation correlation;
    const char *description;
} heddle_output;

typedef struct {
    heddle_capability_kind kind;
    const char *target;
    const char *reason;
} heddle_capability;

// A node's code: return true on success, or `return heddle_fail(...)`.
typedef bool (*heddle_run_fn)(heddle_call *call);

typedef struct {
    const char *type_name;
    const char *title;
    const char *description;
    const heddle_port *inputs;        // HEDDLE_PORTS(...), or NULL
    const heddle_output *outputs;     // HEDDLE_OUTPUTS(...), or NULL
    const heddle_port *properties;    // HEDDLE_PORTS(...), or NULL
    bool retry_safe;                  // re-running with the same inputs is harmless
    bool streaming_output;
    bool streaming_input;
    bool reuse_instance;
    const heddle_capability *capabilities; // HEDDLE_CAPABILITIES(...), or NULL
    heddle_run_fn run;
    // A controlled node: runs once per `run` event a controller sends it (over a control
    // edge into its `__control__` handle), with its latest inputs and the event's
    // property overrides; its outputs are the reply. Last, so tables written before it
    // existed keep their meaning.
    bool controlled;
} heddle_node;

// Zero-terminated lists for the node table.
#define HEDDLE_PORTS(...) ((const heddle_port[]){__VA_ARGS__, {0}})
#define HEDDLE_OUTPUTS(...) ((const heddle_output[]){__VA_ARGS__, {0}})
#define HEDDLE_CAPABILITIES(...) ((const heddle_capability[]){__VA_ARGS__, {0}})

// Your package defines this table, ended by `{ 0 }`.
extern const heddle_node HEDDLE_NODES[];

// ---- inputs (edge values win over properties) -------------------------------------
bool heddle_has(heddle_call *c, const char *name);          // present and not null
bool heddle_get_bool(heddle_call *c, const char *name, bool *out);
bool heddle_get_int(heddle_call *c, const char *name, int64_t *out);
bool heddle_get_float(heddle_call *c, const char *name, double *out); // ints convert
bool heddle_get_str(heddle_call *c, const char *name, const char **s, size_t *len);
// A NUL-terminated copy, freed after the run function returns; NULL if absent.
const char *heddle_get_cstr(heddle_call *c, const char *name);
bool heddle_get_bytes(heddle_call *c, const char *name, const uint8_t **p, size_t *len);
// Lists and objects arrive as JSON text.
bool heddle_get_json(heddle_call *c, const char *name, const char **json, size_t *len);

// ---- outputs -------------------------------------------------------------------
void heddle_set_null(heddle_call *c, const char *name);
void heddle_set_bool(heddle_call *c, const char *name, bool v);
void heddle_set_int(heddle_call *c, const char *name, int64_t v);
void heddle_set_float(heddle_call *c, const char *name, double v);
void heddle_set_str(heddle_call *c, const char *name, const char *s);
void heddle_set_str_n(heddle_call *c, const char *name, const char *s, size_t len);
void heddle_set_bytes(heddle_call *c, const char *name, const uint8_t *p, size_t len);
void heddle_set_json(heddle_call *c, const char *name, const char *json);

// ---- JSON builder ----------------------------------------------------------------
// Builds JSON text for object and list outputs, with commas and string escaping done
// for you. Start from `heddle_json j = {0};`, write values in order (in an object, a
// key before each value), then hand it to heddle_set_json_built (which frees it) or
// read heddle_json_text and call heddle_json_free. Non-finite floats become null.
//
//   heddle_json j = {0};
//   heddle_json_begin_object(&j);
//   heddle_json_key(&j, "word");  heddle_json_string(&j, w);
//   heddle_json_key(&j, "count"); heddle_json_int(&j, n);
//   heddle_json_end_object(&j);
//   heddle_set_json_built(c, "stats", &j);
typedef struct {
    char *buf;
    size_t len, cap;
    bool need_comma; // a value was written at this level: the next one needs a comma
} heddle_json;

void heddle_json_begin_object(heddle_json *j);
void heddle_json_end_object(heddle_json *j);
void heddle_json_begin_list(heddle_json *j);
void heddle_json_end_list(heddle_json *j);
void heddle_json_key(heddle_json *j, const char *key);
void heddle_json_string(heddle_json *j, const char *s);
void heddle_json_string_n(heddle_json *j, const char *s, size_t len);
void heddle_json_int(heddle_json *j, int64_t v);
void heddle_json_float(heddle_json *j, double v);
void heddle_json_bool(heddle_json *j, bool v);
void heddle_json_null(heddle_json *j);
// A value already written as JSON text (not checked), e.g. a JSON value read from an input.
void heddle_json_raw(heddle_json *j, const char *json, size_t len);
// The text so far (NUL-terminated; "" when empty), valid until the next write or free.
const char *heddle_json_text(heddle_json *j);
void heddle_json_free(heddle_json *j);
// Sets output `name` to the built JSON and frees the builder.
void heddle_set_json_built(heddle_call *c, const char *name, heddle_json *j);

// ---- errors --------------------------------------------------------------------
// Fails the invocation with a recoverable node error (printf-style message) and a
// failure signature (may be NULL). Returns false, so `return heddle_fail(...)` reads well.
//
// A signature names the kind of failure so a supervisor recognises repeats and policy
// rules can match it: `family:code`, the family a lowercase letter then at most 23 of
// `a-z 0-9 _ -`, the code 1 to 64 of `A-Z a-z 0-9 _ . - / * [ ] $ :` with a ':' only
// between two parts (e.g. "json:parse", "http:429"; sdk/README.md, "Failure
// signatures"); `limit:` and `trap:` belong to the host. Any other signature is refused:
// the error then has none, and its message names the signature, why, and your file:line.
#define heddle_fail(c, signature, ...) \
    heddle_fail_at(__FILE__, __LINE__, (c), false, (signature), __VA_ARGS__)
// Same, and the outputs set so far become the candidate output a supervisor may repair.
#define heddle_fail_with_candidate(c, signature, ...) \
    heddle_fail_at(__FILE__, __LINE__, (c), true, (signature), __VA_ARGS__)
bool heddle_fail_at(const char *file, int line, heddle_call *c, bool candidate,
                    const char *signature, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
// NULL when `signature` has the shape above, else why not.
const char *heddle_signature_problem(const char *signature);
// The message of the failure recorded on `c` so far (by heddle_fail or a refused control
// event), or NULL. Returning true from the run function anyway discards it.
const char *heddle_error_message(heddle_call *c);

// ---- host ----------------------------------------------------------------------
void heddle_log(heddle_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Streaming output (declare .streaming_output): false when the host refused the value;
// the node should then return.
bool heddle_emit_int(const char *handle, int64_t v);
bool heddle_emit_float(const char *handle, double v);
bool heddle_emit_str(const char *handle, const char *s);
bool heddle_emit_json(const char *handle, const char *json);
bool heddle_cancelled(void);
// Milliseconds before the deadline; false when there is none.
bool heddle_deadline_ms(uint64_t *ms);
// A granted secret as a malloc'd string (free it), or NULL.
char *heddle_secret(const char *name);
void heddle_report_cost(double usd);
void heddle_record_asset(const char *id);

// ---- named values (control event overrides, control replies) -----------------------
// A list of named values, as a node's outputs are: set them like outputs, read them like
// inputs. Strings read from it live until heddle_values_free.
typedef struct heddle_values heddle_values;
heddle_values *heddle_values_new(void);
void heddle_values_free(heddle_values *v); // NULL is fine
size_t heddle_values_len(const heddle_values *v);
const char *heddle_values_name(const heddle_values *v, size_t i); // NUL-terminated copy, NULL past the end
void heddle_values_set_null(heddle_values *v, const char *name);
void heddle_values_set_bool(heddle_values *v, const char *name, bool b);
void heddle_values_set_int(heddle_values *v, const char *name, int64_t i);
void heddle_values_set_float(heddle_values *v, const char *name, double d);
void heddle_values_set_str(heddle_values *v, const char *name, const char *s);
void heddle_values_set_str_n(heddle_values *v, const char *name, const char *s, size_t len);
void heddle_values_set_json(heddle_values *v, const char *name, const char *json);
bool heddle_values_has(const heddle_values *v, const char *name); // present and not null
bool heddle_values_get_bool(const heddle_values *v, const char *name, bool *out);
bool heddle_values_get_int(const heddle_values *v, const char *name, int64_t *out);
bool heddle_values_get_float(const heddle_values *v, const char *name, double *out); // ints convert
bool heddle_values_get_str(const heddle_values *v, const char *name, const char **s, size_t *len);
bool heddle_values_get_json(const heddle_values *v, const char *name, const char **json, size_t *len);
// The value as JSON text whatever its case (a string quoted, bytes as {"$bytes": ...}),
// appended to a builder: how a controller collects replies into a list output.
bool heddle_values_get_as_json(const heddle_values *v, const char *name, heddle_json *into);

// ---- controllers ------------------------------------------------------------------
// A node is a controller when a control edge leaves it in the graph (nothing to
// declare). Each invocation gets the control context: per controlled node it is wired
// to, by id, its node_type, properties (type, default, configured value) and the `run`
// action's schema, as a JSON object.
//
//   const char *target = heddle_control_target(c, 0);          // the node it drives
//   uint64_t t;
//   heddle_values *ev = heddle_values_new();
//   heddle_values_set_str(ev, "text", word);
//   bool sent = heddle_control_send(c, target, ev, &t);         // queued, not awaited
//   heddle_values_free(ev);
//   if (!sent) return false;                                    // the node fails, host's message
//   heddle_values *reply = heddle_control_reply(c, t);          // the target's outputs
//   if (!reply) return false;
//
// Events sent before any reply is awaited are in flight together and answered in the
// order sent. A refusal (a node no control edge reaches, a property the target does not
// have, a value of the wrong type: the host's message names both nodes, `__control__`
// and the property) or a failed reply fails the call as heddle_fail does (signature
// control:refused or control:failed) and returns false / NULL: `return false` then fails
// the node with that message.

// The control context as JSON text; false when no control edge leaves the node.
bool heddle_control_context(heddle_call *c, const char **json, size_t *len);
// The id of the i-th controlled node in the context (NUL-terminated, freed after the run
// function returns), NULL past the end.
const char *heddle_control_target(heddle_call *c, size_t i);
// Sends a `run` event with `overrides` (may be NULL; copied) to node `target`.
bool heddle_control_send(heddle_call *c, const char *target, const heddle_values *overrides,
                         uint64_t *ticket);
// The reply to a ticket (free it with heddle_values_free), or NULL.
heddle_values *heddle_control_reply(heddle_call *c, uint64_t ticket);

#ifdef __cplusplus
}
#endif
#endif
