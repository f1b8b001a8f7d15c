// Heddle SDK for C: the JSON builder declared in heddle.h. Separate from heddle.c
// because it needs nothing from the generated bindings (and so is testable natively).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heddle.h"

static void put(heddle_json *j, const char *s, size_t n) {
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 64;
        while (cap < j->len + n + 1) cap *= 2;
        char *b = realloc(j->buf, cap);
        if (!b) abort(); // out of guest memory: the host reports the trap
        j->buf = b;
        j->cap = cap;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = '\0';
}

static void puts_(heddle_json *j, const char *s) { put(j, s, strlen(s)); }

// Before a value or a key: a comma when something precedes it at this level.
static void sep(heddle_json *j) {
    if (j->need_comma) put(j, ",", 1);
}

static void quoted(heddle_json *j, const char *s, size_t n) {
    put(j, "\"", 1);
    size_t run = 0; // bytes copied as they are, flushed before each escape
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (ch < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", ch);
                esc = u;
            }
        }
        if (!esc) {
            run++;
            continue;
        }
        put(j, s + i - run, run);
        run = 0;
        puts_(j, esc);
    }
    put(j, s + n - run, run);
    put(j, "\"", 1);
}

void heddle_json_begin_object(heddle_json *j) {
    sep(j);
    put(j, "{", 1);
    j->need_comma = false;
}

void heddle_json_end_object(heddle_json *j) {
    put(j, "}", 1);
    j->need_comma = true;
}

void heddle_json_begin_list(heddle_json *j) {
    sep(j);
    put(j, "[", 1);
    j->need_comma = false;
}

void heddle_json_end_list(heddle_json *j) {
    put(j, "]", 1);
    j->need_comma = true;
}

void heddle_json_key(heddle_json *j, const char *key) {
    sep(j);
    quoted(j, key ? key : "", key ? strlen(key) : 0);
    put(j, ":", 1);
    j->need_comma = false; // the value follows the key without a comma
}

void heddle_json_string_n(heddle_json *j, const char *s, size_t len) {
    sep(j);
    quoted(j, s ? s : "", s ? len : 0);
    j->need_comma = true;
}

void heddle_json_string(heddle_json *j, const char *s) {
    heddle_json_string_n(j, s, s ? strlen(s) : 0);
}

void heddle_json_int(heddle_json *j, int64_t v) {
    char b[24];
    sep(j);
    snprintf(b, sizeof b, "%lld", (long long)v);
    puts_(j, b);
    j->need_comma = true;
}

void heddle_json_float(heddle_json *j, double v) {
    if (!isfinite(v)) {
        heddle_json_null(j);
        return;
    }
    // The shortest precision that reads back as the same double; a trailing ".0"
    // keeps an integral float a float on the other side.
    char b[40];
    for (int p = 15; p <= 17; p++) {
        snprintf(b, sizeof b, "%.*g", p, v);
        if (strtod(b, NULL) == v) break;
    }
    if (!strpbrk(b, ".eE")) strcat(b, ".0");
    sep(j);
    puts_(j, b);
    j->need_comma = true;
}

void heddle_json_bool(heddle_json *j, bool v) {
    sep(j);
    puts_(j, v ? "true" : "false");
    j->need_comma = true;
}

void heddle_json_null(heddle_json *j) {
    sep(j);
    puts_(j, "null");
    j->need_comma = true;
}

void heddle_json_raw(heddle_json *j, const char *json, size_t len) {
    sep(j);
    if (json && len) put(j, json, len);
    else puts_(j, "null"); // nothing is no JSON value: keep the text well formed
    j->need_comma = true;
}

const char *heddle_json_text(heddle_json *j) { return j->buf ? j->buf : ""; }

void heddle_json_free(heddle_json *j) {
    free(j->buf);
    *j = (heddle_json){0};
}
