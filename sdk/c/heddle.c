// Heddle SDK for C: implements the `heddle:node` exports over the HEDDLE_NODES table,
// on top of the bindings generated from the WIT at build time (node_package.h).
//
// Ownership follows the canonical ABI as wit-bindgen's C generator lays it out: export
// parameters belong to us (freed here), export results are malloc'd and freed by the
// generated post-return function, import arguments are only borrowed by the host.
#include "heddle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node_package.h"

typedef node_package_string_t str_t;
typedef heddle_node_types_value_t value_t;
typedef heddle_node_types_tuple2_string_value_t entry_t;
typedef heddle_node_types_entries_t entries_t;

struct heddle_call {
    const heddle_node *node;
    const entries_t *inputs;
    const entries_t *properties;
    entry_t *defaults; // declared defaults, parsed on first use
    size_t defaults_len;
    entry_t *out;
    size_t out_len, out_cap;
    char *message;   // set once failed
    char *signature;
    bool with_candidate;
    char **temps;
    size_t temps_len, temps_cap;
};

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) abort(); // out of guest memory: the host reports the trap
    return q;
}

static void str_copy(str_t *dst, const char *s, size_t len) {
    dst->len = len;
    dst->ptr = NULL;
    if (len) {
        dst->ptr = xrealloc(NULL, len);
        memcpy(dst->ptr, s, len);
    }
}

static void str_copy_c(str_t *dst, const char *s) { str_copy(dst, s ? s : "", s ? strlen(s) : 0); }

// A borrowed view, for import arguments only.
static str_t str_view(const char *s) {
    str_t v = {(uint8_t *)s, s ? strlen(s) : 0};
    return v;
}

static bool str_eq(const str_t *a, const char *b) {
    size_t n = strlen(b);
    return a->len == n && memcmp(a->ptr, b, n) == 0;
}

static char *vformat(const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) n = 0;
    char *buf = xrealloc(NULL, (size_t)n + 1);
    vsnprintf(buf, (size_t)n + 1, fmt, ap);
    return buf;
}

static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

// ---- values ----------------------------------------------------------------------

// A default written as JSON text becomes the matching scalar variant when it is one.
static void value_from_json_text(value_t *v, const char *json) {
    size_t n = strlen(json);
    char *end;
    if (strcmp(json, "null") == 0) {
        v->tag = HEDDLE_NODE_TYPES_VALUE_NULL;
        return;
    }
    if (strcmp(json, "true") == 0 || strcmp(json, "false") == 0) {
        v->tag = HEDDLE_NODE_TYPES_VALUE_BOOLEAN;
        v->val.boolean = json[0] == 't';
        return;
    }
    errno = 0;
    long long i = strtoll(json, &end, 10);
    if (n && *end == '\0' && errno == 0) {
        v->tag = HEDDLE_NODE_TYPES_VALUE_S64;
        v->val.s64 = i;
        return;
    }
    double d = strtod(json, &end);
    if (n && *end == '\0') {
        v->tag = HEDDLE_NODE_TYPES_VALUE_F64;
        v->val.f64 = d;
        return;
    }
    if (n >= 2 && json[0] == '"' && json[n - 1] == '"' && !memchr(json + 1, '\\', n - 2) &&
        !memchr(json + 1, '"', n - 2)) {
        v->tag = HEDDLE_NODE_TYPES_VALUE_STRING;
        str_copy(&v->val.string, json + 1, n - 2);
        return;
    }
    v->tag = HEDDLE_NODE_TYPES_VALUE_JSON;
    str_copy(&v->val.json, json, n);
}

static const heddle_port *declared_port(const heddle_node *node, const char *name) {
    const heddle_port *lists[2] = {node->inputs, node->properties};
    for (int l = 0; l < 2; l++)
        for (const heddle_port *p = lists[l]; p && p->name; p++)
            if (strcmp(p->name, name) == 0) return p;
    return NULL;
}

static const value_t *find(heddle_call *c, const char *name) {
    for (size_t i = 0; i < c->inputs->len; i++)
        if (str_eq(&c->inputs->ptr[i].f0, name)) return &c->inputs->ptr[i].f1;
    for (size_t i = 0; i < c->properties->len; i++)
        if (str_eq(&c->properties->ptr[i].f0, name)) return &c->properties->ptr[i].f1;
    // Not given: the declared default, when there is one.
    for (size_t i = 0; i < c->defaults_len; i++)
        if (str_eq(&c->defaults[i].f0, name)) return &c->defaults[i].f1;
    const heddle_port *p = c->node ? declared_port(c->node, name) : NULL;
    if (!p || !p->default_json) return NULL;
    c->defaults = xrealloc(c->defaults, (c->defaults_len + 1) * sizeof(entry_t));
    entry_t *e = &c->defaults[c->defaults_len++];
    str_copy_c(&e->f0, name);
    memset(&e->f1, 0, sizeof e->f1);
    value_from_json_text(&e->f1, p->default_json);
    return &e->f1;
}

// Reading one value, whatever list it came from: false when absent or of another case.
static bool value_bool(const value_t *v, bool *out) {
    if (!v || v->tag != HEDDLE_NODE_TYPES_VALUE_BOOLEAN) return false;
    *out = v->val.boolean;
    return true;
}

static bool value_int(const value_t *v, int64_t *out) {
    if (!v || v->tag != HEDDLE_NODE_TYPES_VALUE_S64) return false;
    *out = v->val.s64;
    return true;
}

static bool value_float(const value_t *v, double *out) {
    if (!v) return false;
    if (v->tag == HEDDLE_NODE_TYPES_VALUE_F64) *out = v->val.f64;
    else if (v->tag == HEDDLE_NODE_TYPES_VALUE_S64) *out = (double)v->val.s64;
    else return false;
    return true;
}

static bool value_str(const value_t *v, const char **s, size_t *len) {
    if (!v || v->tag != HEDDLE_NODE_TYPES_VALUE_STRING) return false;
    *s = (const char *)v->val.string.ptr;
    *len = v->val.string.len;
    return true;
}

static bool value_json(const value_t *v, const char **json, size_t *len) {
    if (!v || v->tag != HEDDLE_NODE_TYPES_VALUE_JSON) return false;
    *json = (const char *)v->val.json.ptr;
    *len = v->val.json.len;
    return true;
}

// A string kept until the run function returns.
static const char *keep(heddle_call *c, char *copy) {
    if (c->temps_len == c->temps_cap) {
        c->temps_cap = c->temps_cap ? 2 * c->temps_cap : 4;
        c->temps = xrealloc(c->temps, c->temps_cap * sizeof(char *));
    }
    c->temps[c->temps_len++] = copy;
    return copy;
}

static char *cstr(const char *s, size_t n) {
    char *copy = xrealloc(NULL, n + 1);
    if (n) memcpy(copy, s, n);
    copy[n] = '\0';
    return copy;
}

bool heddle_has(heddle_call *c, const char *name) {
    const value_t *v = find(c, name);
    return v && v->tag != HEDDLE_NODE_TYPES_VALUE_NULL;
}

bool heddle_get_bool(heddle_call *c, const char *name, bool *out) { return value_bool(find(c, name), out); }

bool heddle_get_int(heddle_call *c, const char *name, int64_t *out) { return value_int(find(c, name), out); }

bool heddle_get_float(heddle_call *c, const char *name, double *out) { return value_float(find(c, name), out); }

bool heddle_get_str(heddle_call *c, const char *name, const char **s, size_t *len) {
    return value_str(find(c, name), s, len);
}

const char *heddle_get_cstr(heddle_call *c, const char *name) {
    const char *s;
    size_t n;
    if (!heddle_get_str(c, name, &s, &n)) return NULL;
    return keep(c, cstr(s, n));
}

bool heddle_get_bytes(heddle_call *c, const char *name, const uint8_t **p, size_t *len) {
    const value_t *v = find(c, name);
    if (!v || v->tag != HEDDLE_NODE_TYPES_VALUE_BYTES) return false;
    *p = v->val.bytes.ptr;
    *len = v->val.bytes.len;
    return true;
}

bool heddle_get_json(heddle_call *c, const char *name, const char **json, size_t *len) {
    return value_json(find(c, name), json, len);
}

// ---- outputs -------------------------------------------------------------------

// Appends `name` to a list of named values (or reuses its slot: setting the same name
// twice replaces the first value), returning the value to fill in.
static value_t *entries_push(entry_t **ptr, size_t *len, size_t *cap, const char *name) {
    for (size_t i = 0; i < *len; i++) {
        if (str_eq(&(*ptr)[i].f0, name)) {
            heddle_node_types_value_free(&(*ptr)[i].f1);
            return &(*ptr)[i].f1;
        }
    }
    if (*len == *cap) {
        *cap = *cap ? 2 * *cap : 4;
        *ptr = xrealloc(*ptr, *cap * sizeof(entry_t));
    }
    entry_t *e = &(*ptr)[(*len)++];
    str_copy_c(&e->f0, name);
    memset(&e->f1, 0, sizeof e->f1);
    return &e->f1;
}

static value_t *push(heddle_call *c, const char *name) { return entries_push(&c->out, &c->out_len, &c->out_cap, name); }

static void fill_bool(value_t *v, bool b) {
    v->tag = HEDDLE_NODE_TYPES_VALUE_BOOLEAN;
    v->val.boolean = b;
}

static void fill_int(value_t *v, int64_t i) {
    v->tag = HEDDLE_NODE_TYPES_VALUE_S64;
    v->val.s64 = i;
}

static void fill_float(value_t *v, double d) {
    v->tag = HEDDLE_NODE_TYPES_VALUE_F64;
    v->val.f64 = d;
}

static void fill_str(value_t *v, const char *s, size_t len) {
    v->tag = HEDDLE_NODE_TYPES_VALUE_STRING;
    str_copy(&v->val.string, s, len);
}

static void fill_json(value_t *v, const char *json) {
    v->tag = HEDDLE_NODE_TYPES_VALUE_JSON;
    str_copy_c(&v->val.json, json);
}

void heddle_set_null(heddle_call *c, const char *name) { push(c, name)->tag = HEDDLE_NODE_TYPES_VALUE_NULL; }

void heddle_set_bool(heddle_call *c, const char *name, bool b) { fill_bool(push(c, name), b); }

void heddle_set_int(heddle_call *c, const char *name, int64_t i) { fill_int(push(c, name), i); }

void heddle_set_float(heddle_call *c, const char *name, double d) { fill_float(push(c, name), d); }

void heddle_set_str_n(heddle_call *c, const char *name, const char *s, size_t len) {
    fill_str(push(c, name), s, len);
}

void heddle_set_str(heddle_call *c, const char *name, const char *s) { heddle_set_str_n(c, name, s, strlen(s)); }

void heddle_set_bytes(heddle_call *c, const char *name, const uint8_t *p, size_t len) {
    value_t *v = push(c, name);
    v->tag = HEDDLE_NODE_TYPES_VALUE_BYTES;
    v->val.bytes.len = len;
    v->val.bytes.ptr = NULL;
    if (len) {
        v->val.bytes.ptr = xrealloc(NULL, len);
        memcpy(v->val.bytes.ptr, p, len);
    }
}

void heddle_set_json(heddle_call *c, const char *name, const char *json) { fill_json(push(c, name), json); }

void heddle_set_json_built(heddle_call *c, const char *name, heddle_json *j) {
    heddle_set_json(c, name, heddle_json_text(j));
    heddle_json_free(j);
}

// ---- errors --------------------------------------------------------------------

static bool family_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
}

static bool code_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("_.-/*[]$", ch));
}

const char *heddle_signature_problem(const char *sig) {
    const char *colon = strchr(sig, ':');
    if (!colon) return "no ':' between family and code";
    size_t family = (size_t)(colon - sig);
    bool ok = family >= 1 && family <= 24 && sig[0] >= 'a' && sig[0] <= 'z';
    for (size_t i = 1; ok && i < family; i++) ok = family_char(sig[i]);
    if (!ok) return "the family before ':' must be a lowercase letter then at most 23 of a-z 0-9 _ -";
    const char *code = colon + 1;
    size_t n = strlen(code);
    // Parts separated by single colons: never first, last or doubled.
    ok = n >= 1 && n <= 64 && code[0] != ':' && code[n - 1] != ':';
    for (size_t i = 0; ok && i < n; i++)
        ok = code_char(code[i]) || (code[i] == ':' && code[i + 1] != ':');
    if (!ok)
        return "the code after ':' must be 1 to 64 of A-Z a-z 0-9 _ . - / * [ ] $, with ':' only "
               "between two parts";
    if ((family == 5 && !strncmp(sig, "limit", 5)) || (family == 4 && !strncmp(sig, "trap", 4)))
        return "the families `limit` and `trap` are reserved for failures the host detects";
    return NULL;
}

const char *heddle_error_message(heddle_call *c) { return c->message; }

// Fails the call with a message from the host, as it is (no format string).
static void fail_with(heddle_call *c, const char *signature, const uint8_t *msg, size_t len) {
    free(c->message);
    free(c->signature);
    c->message = cstr((const char *)msg, len);
    c->signature = strdup(signature);
    c->with_candidate = false;
}

bool heddle_fail_at(const char *file, int line, heddle_call *c, bool candidate,
                    const char *signature, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *message = vformat(fmt, ap);
    va_end(ap);
    free(c->message);
    free(c->signature);
    c->signature = NULL;
    c->with_candidate = candidate;
    const char *why = signature ? heddle_signature_problem(signature) : NULL;
    if (!why) {
        c->message = message;
        if (signature) c->signature = strdup(signature);
        return false;
    }
    heddle_json quoted = {0};
    heddle_json_string(&quoted, signature);
    c->message = format("invalid failure signature %s: %s (write family:code, e.g. \"json:parse\") "
                        "at %s:%d; the error was: %s",
                        heddle_json_text(&quoted), why, file, line, message);
    heddle_json_free(&quoted);
    free(message);
    return false;
}

// ---- host ----------------------------------------------------------------------

void heddle_log(heddle_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    str_t s = str_view(msg);
    heddle_node_host_log((heddle_node_host_log_level_t)level, &s);
    free(msg);
}

static bool emit(const char *handle, value_t *v) {
    str_t h = str_view(handle);
    str_t err = {0};
    bool ok = heddle_node_host_emit(&h, v, &err);
    if (!ok) node_package_string_free(&err);
    return ok;
}

bool heddle_emit_int(const char *handle, int64_t i) {
    value_t v = {.tag = HEDDLE_NODE_TYPES_VALUE_S64, .val.s64 = i};
    return emit(handle, &v);
}

bool heddle_emit_float(const char *handle, double d) {
    value_t v = {.tag = HEDDLE_NODE_TYPES_VALUE_F64, .val.f64 = d};
    return emit(handle, &v);
}

bool heddle_emit_str(const char *handle, const char *s) {
    value_t v = {.tag = HEDDLE_NODE_TYPES_VALUE_STRING};
    v.val.string = str_view(s);
    return emit(handle, &v);
}

bool heddle_emit_json(const char *handle, const char *json) {
    value_t v = {.tag = HEDDLE_NODE_TYPES_VALUE_JSON};
    v.val.json = str_view(json);
    return emit(handle, &v);
}

bool heddle_cancelled(void) { return heddle_node_host_cancelled(); }

bool heddle_deadline_ms(uint64_t *ms) { return heddle_node_host_deadline_ms(ms); }

char *heddle_secret(const char *name) {
    str_t n = str_view(name), out = {0};
    if (!heddle_node_host_get_secret(&n, &out)) return NULL;
    char *s = xrealloc(NULL, out.len + 1);
    memcpy(s, out.ptr, out.len);
    s[out.len] = '\0';
    node_package_string_free(&out);
    return s;
}

void heddle_report_cost(double usd) { heddle_node_host_report_cost(usd); }

void heddle_record_asset(const char *id) {
    str_t s = str_view(id);
    heddle_node_host_record_asset(&s);
}

// ---- named values ----------------------------------------------------------------

struct heddle_values {
    entry_t *ptr;
    size_t len, cap;
    char **names; // NUL-terminated copies handed out by heddle_values_name
};

heddle_values *heddle_values_new(void) {
    heddle_values *v = xrealloc(NULL, sizeof *v);
    memset(v, 0, sizeof *v);
    return v;
}

void heddle_values_free(heddle_values *v) {
    if (!v) return;
    entries_t e = {v->ptr, v->len};
    heddle_node_types_entries_free(&e);
    if (v->names)
        for (size_t i = 0; i < v->len; i++) free(v->names[i]);
    free(v->names);
    free(v);
}

size_t heddle_values_len(const heddle_values *v) { return v ? v->len : 0; }

const char *heddle_values_name(const heddle_values *v, size_t i) {
    if (!v || i >= v->len) return NULL;
    heddle_values *m = (heddle_values *)v; // the names cache is not the values
    if (!m->names) {
        m->names = xrealloc(NULL, m->len * sizeof(char *));
        memset(m->names, 0, m->len * sizeof(char *));
    }
    if (!m->names[i]) m->names[i] = cstr((const char *)v->ptr[i].f0.ptr, v->ptr[i].f0.len);
    return m->names[i];
}

static value_t *values_push(heddle_values *v, const char *name) {
    if (v->names) { // the cache is sized to the list: drop it before the list grows
        for (size_t i = 0; i < v->len; i++) free(v->names[i]);
        free(v->names);
        v->names = NULL;
    }
    return entries_push(&v->ptr, &v->len, &v->cap, name);
}

static const value_t *values_find(const heddle_values *v, const char *name) {
    for (size_t i = 0; v && i < v->len; i++)
        if (str_eq(&v->ptr[i].f0, name)) return &v->ptr[i].f1;
    return NULL;
}

void heddle_values_set_null(heddle_values *v, const char *name) { values_push(v, name)->tag = HEDDLE_NODE_TYPES_VALUE_NULL; }
void heddle_values_set_bool(heddle_values *v, const char *name, bool b) { fill_bool(values_push(v, name), b); }
void heddle_values_set_int(heddle_values *v, const char *name, int64_t i) { fill_int(values_push(v, name), i); }
void heddle_values_set_float(heddle_values *v, const char *name, double d) { fill_float(values_push(v, name), d); }
void heddle_values_set_str_n(heddle_values *v, const char *name, const char *s, size_t len) {
    fill_str(values_push(v, name), s, len);
}
void heddle_values_set_str(heddle_values *v, const char *name, const char *s) {
    heddle_values_set_str_n(v, name, s, strlen(s));
}
void heddle_values_set_json(heddle_values *v, const char *name, const char *json) { fill_json(values_push(v, name), json); }

bool heddle_values_has(const heddle_values *v, const char *name) {
    const value_t *x = values_find(v, name);
    return x && x->tag != HEDDLE_NODE_TYPES_VALUE_NULL;
}
bool heddle_values_get_bool(const heddle_values *v, const char *name, bool *out) { return value_bool(values_find(v, name), out); }
bool heddle_values_get_int(const heddle_values *v, const char *name, int64_t *out) { return value_int(values_find(v, name), out); }
bool heddle_values_get_float(const heddle_values *v, const char *name, double *out) {
    return value_float(values_find(v, name), out);
}
bool heddle_values_get_str(const heddle_values *v, const char *name, const char **s, size_t *len) {
    return value_str(values_find(v, name), s, len);
}
bool heddle_values_get_json(const heddle_values *v, const char *name, const char **json, size_t *len) {
    return value_json(values_find(v, name), json, len);
}

static void base64(heddle_json *into, const uint8_t *p, size_t n) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t out_len = 4 * ((n + 2) / 3);
    char *out = xrealloc(NULL, out_len + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[o++] = digits[w >> 18 & 63];
        out[o++] = digits[w >> 12 & 63];
        out[o++] = i + 1 < n ? digits[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? digits[w & 63] : '=';
    }
    heddle_json_string_n(into, out, o);
    free(out);
}

bool heddle_values_get_as_json(const heddle_values *v, const char *name, heddle_json *into) {
    const value_t *x = values_find(v, name);
    if (!x) return false;
    switch (x->tag) {
    case HEDDLE_NODE_TYPES_VALUE_NULL: heddle_json_null(into); break;
    case HEDDLE_NODE_TYPES_VALUE_BOOLEAN: heddle_json_bool(into, x->val.boolean); break;
    case HEDDLE_NODE_TYPES_VALUE_S64: heddle_json_int(into, x->val.s64); break;
    case HEDDLE_NODE_TYPES_VALUE_F64: heddle_json_float(into, x->val.f64); break;
    case HEDDLE_NODE_TYPES_VALUE_STRING:
        heddle_json_string_n(into, (const char *)x->val.string.ptr, x->val.string.len);
        break;
    case HEDDLE_NODE_TYPES_VALUE_BYTES:
        heddle_json_begin_object(into);
        heddle_json_key(into, "$bytes");
        base64(into, x->val.bytes.ptr, x->val.bytes.len);
        heddle_json_end_object(into);
        break;
    case HEDDLE_NODE_TYPES_VALUE_JSON:
        heddle_json_raw(into, (const char *)x->val.json.ptr, x->val.json.len);
        break;
    default: return false;
    }
    return true;
}

// ---- controllers -----------------------------------------------------------------

#define CONTROL_CONTEXT "_control_context"

bool heddle_control_context(heddle_call *c, const char **json, size_t *len) {
    return heddle_get_json(c, CONTROL_CONTEXT, json, len);
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

// Past the string starting at the quote `p` (NULL when unterminated).
static const char *skip_string(const char *p, const char *end) {
    for (p++; p < end; p++) {
        if (*p == '\\') p++;
        else if (*p == '"') return p + 1;
    }
    return NULL;
}

// Past the JSON value at `p` (NULL when malformed): strings skipped as strings, so
// brackets inside them do not count.
static const char *skip_value(const char *p, const char *end) {
    int depth = 0;
    while (p < end) {
        if (*p == '"') {
            p = skip_string(p, end);
            if (!p) return NULL;
            if (depth == 0) return p;
            continue;
        }
        if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') {
            if (depth == 0) return p; // the end of the object holding a scalar
            if (--depth == 0) return p + 1;
        } else if (depth == 0 && (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) {
            return p;
        }
        p++;
    }
    return depth == 0 ? p : NULL;
}

static void put_utf8(char **o, uint32_t cp) {
    char *q = *o;
    if (cp < 0x80) *q++ = (char)cp;
    else if (cp < 0x800) *q++ = (char)(0xC0 | cp >> 6), *q++ = (char)(0x80 | (cp & 63));
    else if (cp < 0x10000)
        *q++ = (char)(0xE0 | cp >> 12), *q++ = (char)(0x80 | (cp >> 6 & 63)), *q++ = (char)(0x80 | (cp & 63));
    else
        *q++ = (char)(0xF0 | cp >> 18), *q++ = (char)(0x80 | (cp >> 12 & 63)), *q++ = (char)(0x80 | (cp >> 6 & 63)),
        *q++ = (char)(0x80 | (cp & 63));
    *o = q;
}

static uint32_t hex4(const char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char h = p[i];
        v = v << 4 | (uint32_t)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
    }
    return v;
}

// The string at `p` .. `q` (quotes included) decoded, NUL-terminated.
static char *decode_string(const char *p, const char *q) {
    char *out = xrealloc(NULL, (size_t)(q - p) + 1), *o = out; // decoding never grows it
    for (p++, q--; p < q; p++) {
        if (*p != '\\') {
            *o++ = *p;
            continue;
        }
        p++;
        switch (*p) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            if (q - p < 5) break;
            uint32_t cp = hex4(p + 1);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && q - p >= 7 && p[1] == '\\' && p[2] == 'u') {
                uint32_t lo = hex4(p + 3);
                if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00), p += 6;
            }
            put_utf8(&o, cp);
            break;
        }
        default: *o++ = *p; // \" \\ \/
        }
    }
    *o = '\0';
    return out;
}

const char *heddle_control_target(heddle_call *c, size_t i) {
    const char *json;
    size_t len;
    if (!heddle_control_context(c, &json, &len)) return NULL;
    const char *end = json + len, *p = skip_ws(json, end);
    if (p >= end || *p != '{') return NULL;
    p = skip_ws(p + 1, end);
    for (size_t k = 0; p < end && *p == '"'; k++) {
        const char *key_end = skip_string(p, end);
        if (!key_end) return NULL;
        if (k == i) return keep(c, decode_string(p, key_end));
        p = skip_ws(key_end, end);
        if (p >= end || *p != ':') return NULL;
        p = skip_value(skip_ws(p + 1, end), end);
        if (!p) return NULL;
        p = skip_ws(p, end);
        if (p < end && *p == ',') p = skip_ws(p + 1, end);
    }
    return NULL;
}

#ifdef HEDDLE_NODE_CONTROL

bool heddle_control_send(heddle_call *c, const char *target, const heddle_values *overrides, uint64_t *ticket) {
    str_t t = str_view(target);
    heddle_node_host_entries_t props = {overrides ? overrides->ptr : NULL, overrides ? overrides->len : 0};
    str_t err = {0};
    if (heddle_node_host_control_send(&t, &props, ticket, &err)) return true;
    fail_with(c, "control:refused", err.ptr, err.len);
    node_package_string_free(&err);
    return false;
}

heddle_values *heddle_control_reply(heddle_call *c, uint64_t ticket) {
    heddle_node_host_entries_t out = {0};
    str_t err = {0};
    if (!heddle_node_host_control_reply(ticket, &out, &err)) {
        fail_with(c, "control:failed", err.ptr, err.len);
        node_package_string_free(&err);
        return NULL;
    }
    heddle_values *v = heddle_values_new();
    v->ptr = out.ptr;
    v->len = v->cap = out.len;
    return v;
}

#else // built against heddle:node 0.1: no control events to send

#define UNSUPPORTED                                                                                              \
    "this package was built against heddle:node 0.1, which has no control events; build it against 0.2 (the " \
    "default of `heddle package build`)"

bool heddle_control_send(heddle_call *c, const char *target, const heddle_values *overrides, uint64_t *ticket) {
    (void)target, (void)overrides, (void)ticket;
    fail_with(c, "control:unsupported", (const uint8_t *)UNSUPPORTED, strlen(UNSUPPORTED));
    return false;
}

heddle_values *heddle_control_reply(heddle_call *c, uint64_t ticket) {
    (void)ticket;
    fail_with(c, "control:unsupported", (const uint8_t *)UNSUPPORTED, strlen(UNSUPPORTED));
    return NULL;
}

#endif

// ---- exports -------------------------------------------------------------------

static size_t count_ports(const heddle_port *p) {
    size_t n = 0;
    while (p && p[n].name) n++;
    return n;
}

static void port_decls(heddle_node_types_list_port_decl_t *out, const heddle_port *p) {
    out->len = count_ports(p);
    out->ptr = out->len ? xrealloc(NULL, out->len * sizeof *out->ptr) : NULL;
    for (size_t i = 0; i < out->len; i++) {
        heddle_node_types_port_decl_t *d = &out->ptr[i];
        str_copy_c(&d->name, p[i].name);
        str_copy_c(&d->type, p[i].type ? p[i].type : "any");
        d->required = p[i].required;
        d->default_.is_some = p[i].default_json != NULL;
        if (p[i].default_json) value_from_json_text(&d->default_.val, p[i].default_json);
        str_copy_c(&d->description, p[i].description);
    }
}

void exports_heddle_node_node_describe(exports_heddle_node_node_list_node_decl_t *ret) {
    size_t n = 0;
    while (HEDDLE_NODES[n].type_name) n++;
    ret->len = n;
    ret->ptr = n ? xrealloc(NULL, n * sizeof *ret->ptr) : NULL;
    for (size_t i = 0; i < n; i++) {
        const heddle_node *src = &HEDDLE_NODES[i];
        heddle_node_types_node_decl_t *d = &ret->ptr[i];
        str_copy_c(&d->type_name, src->type_name);
        str_copy_c(&d->title, src->title ? src->title : src->type_name);
        str_copy_c(&d->description, src->description);
        port_decls(&d->inputs, src->inputs);
        port_decls(&d->properties, src->properties);
        size_t no = 0;
        while (src->outputs && src->outputs[no].name) no++;
        d->outputs.len = no;
        d->outputs.ptr = no ? xrealloc(NULL, no * sizeof *d->outputs.ptr) : NULL;
        for (size_t j = 0; j < no; j++) {
            str_copy_c(&d->outputs.ptr[j].name, src->outputs[j].name);
            str_copy_c(&d->outputs.ptr[j].type, src->outputs[j].type ? src->outputs[j].type : "any");
            d->outputs.ptr[j].correlation = (heddle_node_types_output_correlation_t)src->outputs[j].correlation;
            str_copy_c(&d->outputs.ptr[j].description, src->outputs[j].description);
        }
        d->retry_safe = src->retry_safe;
        d->streaming_output = src->streaming_output;
        d->streaming_input = src->streaming_input;
        d->reuse_instance = src->reuse_instance;
        size_t nc = 0;
        while (src->capabilities && src->capabilities[nc].target) nc++;
        d->capabilities.len = nc;
        d->capabilities.ptr = nc ? xrealloc(NULL, nc * sizeof *d->capabilities.ptr) : NULL;
        for (size_t j = 0; j < nc; j++) {
            d->capabilities.ptr[j].kind = (heddle_node_types_capability_kind_t)src->capabilities[j].kind;
            str_copy_c(&d->capabilities.ptr[j].target, src->capabilities[j].target);
            str_copy_c(&d->capabilities.ptr[j].reason, src->capabilities[j].reason);
        }
    }
}

#ifdef HEDDLE_NODE_CONTROL
// heddle:node 0.2: the type names that run once per control event.
void exports_heddle_node_node_controlled(node_package_list_string_t *ret) {
    size_t n = 0;
    for (size_t i = 0; HEDDLE_NODES[i].type_name; i++) n += HEDDLE_NODES[i].controlled;
    ret->len = n;
    ret->ptr = n ? xrealloc(NULL, n * sizeof *ret->ptr) : NULL;
    for (size_t i = 0, k = 0; HEDDLE_NODES[i].type_name; i++)
        if (HEDDLE_NODES[i].controlled) str_copy_c(&ret->ptr[k++], HEDDLE_NODES[i].type_name);
}
#endif

bool exports_heddle_node_node_invoke(node_package_string_t *type_name, exports_heddle_node_node_entries_t *inputs,
                                     exports_heddle_node_node_entries_t *properties,
                                     exports_heddle_node_node_entries_t *ret,
                                     exports_heddle_node_node_node_error_t *err) {
    const heddle_node *node = NULL;
    for (size_t i = 0; HEDDLE_NODES[i].type_name; i++) {
        if (str_eq(type_name, HEDDLE_NODES[i].type_name)) {
            node = &HEDDLE_NODES[i];
            break;
        }
    }
    heddle_call call = {.node = node, .inputs = inputs, .properties = properties};
    bool ok;
    if (!node) {
        ok = heddle_fail(&call, "heddle:unknown-type", "this package has no node type %.*s", (int)type_name->len,
                         (const char *)type_name->ptr);
    } else {
        ok = node->run(&call);
        if (!ok && !call.message) heddle_fail(&call, NULL, "%s failed", node->type_name);
    }
    if (ok) {
        ret->ptr = call.out;
        ret->len = call.out_len;
    } else {
        memset(err, 0, sizeof *err);
        str_copy_c(&err->message, call.message);
        err->signature.is_some = call.signature != NULL;
        if (call.signature) str_copy_c(&err->signature.val, call.signature);
        if (call.with_candidate) {
            err->candidate.is_some = true;
            err->candidate.val.ptr = call.out;
            err->candidate.val.len = call.out_len;
        } else {
            entries_t outs = {call.out, call.out_len};
            heddle_node_types_entries_free(&outs);
        }
    }
    free(call.message);
    free(call.signature);
    entries_t defaults = {call.defaults, call.defaults_len};
    heddle_node_types_entries_free(&defaults);
    for (size_t i = 0; i < call.temps_len; i++) free(call.temps[i]);
    free(call.temps);
    node_package_string_free(type_name);
    exports_heddle_node_node_entries_free(inputs);
    exports_heddle_node_node_entries_free(properties);
    return ok;
}
