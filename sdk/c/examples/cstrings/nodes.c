// cstrings: a Heddle node package written in C (see sdk/c/heddle.h).
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "heddle.h"

// CRC-32 (IEEE 802.3), bitwise: small and dependency-free.
static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

static bool run_crc32(heddle_call *c) {
    const char *s;
    size_t n;
    if (!heddle_get_str(c, "text", &s, &n)) return heddle_fail(c, "input:type", "text must be a string");
    heddle_set_int(c, "crc32", (int64_t)crc32((const uint8_t *)s, n));
    heddle_set_int(c, "length", (int64_t)n);
    return true;
}

// Parses a base-10 integer. Trailing garbage is a recoverable error: the candidate is
// the number read so far, which a supervisor may accept or repair.
static bool run_parse_int(heddle_call *c) {
    const char *text = heddle_get_cstr(c, "text");
    if (!text) return heddle_fail(c, "input:type", "text must be a string");
    while (isspace((unsigned char)*text)) text++;
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    if (end == text) return heddle_fail(c, "int:parse", "no digits in \"%s\"", text);
    if (errno == ERANGE) return heddle_fail(c, "int:range", "\"%s\" does not fit in 64 bits", text);
    while (isspace((unsigned char)*end)) end++;
    heddle_set_int(c, "value", v);
    if (*end) {
        heddle_log(HEDDLE_WARN, "trailing characters after %lld: \"%s\"", v, end);
        return heddle_fail_with_candidate(c, "int:trailing", "trailing characters \"%s\" after %lld", end, v);
    }
    return true;
}

// Word statistics as one object output, built with heddle.h's JSON builder (which
// escapes the words, so quotes and newlines in the text are safe).
static bool run_word_stats(heddle_call *c) {
    const char *s;
    size_t n;
    if (!heddle_get_str(c, "text", &s, &n)) return heddle_fail(c, "input:type", "text must be a string");
    size_t words = 0, letters = 0, longest_at = 0, longest_len = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && isspace((unsigned char)s[i])) i++;
        size_t start = i;
        while (i < n && !isspace((unsigned char)s[i])) i++;
        if (i == start) break;
        words++;
        letters += i - start;
        if (i - start > longest_len) longest_at = start, longest_len = i - start;
    }
    heddle_json j = {0};
    heddle_json_begin_object(&j);
    heddle_json_key(&j, "words");
    heddle_json_int(&j, (int64_t)words);
    heddle_json_key(&j, "longest");
    heddle_json_string_n(&j, s + longest_at, longest_len);
    heddle_json_key(&j, "mean_length");
    if (words) heddle_json_float(&j, (double)letters / (double)words);
    else heddle_json_null(&j);
    heddle_json_key(&j, "empty");
    heddle_json_bool(&j, words == 0);
    heddle_json_end_object(&j);
    heddle_set_json_built(c, "stats", &j);
    return true;
}

// a / b: the same two-input node as textstats.ratio and jsonkit.ratio, so the three
// SDKs (and std.math.arith's `div`, its Rust twin) compare in `heddle bench --shape
// c-chain` and its siblings. Pure, so it declares reuse_instance.
static bool run_ratio(heddle_call *c) {
    double a, b;
    if (!heddle_get_float(c, "a", &a) || !heddle_get_float(c, "b", &b))
        return heddle_fail(c, "input:type", "a and b must be numbers");
    if (b == 0) return heddle_fail(c, "math:div0", "division by zero");
    heddle_set_float(c, "ratio", a / b);
    return true;
}

// ---- a controlled node and a controller (heddle:node 0.2) ---------------------------

// Controlled: runs once per `run` event its controller sends. Pads `text` on the right
// with `fill` up to `width` characters (bytes).
static bool run_pad(heddle_call *c) {
    const char *s, *fill;
    size_t n, fill_len;
    int64_t width;
    if (!heddle_get_str(c, "text", &s, &n)) return heddle_fail(c, "input:type", "text must be a string");
    if (!heddle_get_int(c, "width", &width) || width < 0 || width > 4096)
        return heddle_fail(c, "input:type", "width must be an integer from 0 to 4096");
    if (!heddle_get_str(c, "fill", &fill, &fill_len) || fill_len == 0) fill = ".", fill_len = 1;
    size_t total = n < (size_t)width ? (size_t)width : n;
    char *out = malloc(total);
    if (!out) return heddle_fail(c, "pad:memory", "out of memory");
    memcpy(out, s, n);
    for (size_t i = n; i < total; i++) out[i] = fill[(i - n) % fill_len];
    heddle_set_str_n(c, "text", out, total);
    free(out);
    return true;
}

// Controller: runs the node its control edge reaches once per word of `text`, the word
// set as property `property`; every event is in flight before the first reply is
// awaited, and the replies' `output` are collected in word order.
static bool run_each_word(heddle_call *c) {
    const char *s, *property = heddle_get_cstr(c, "property"), *output = heddle_get_cstr(c, "output");
    size_t n;
    if (!heddle_get_str(c, "text", &s, &n)) return heddle_fail(c, "input:type", "text must be a string");
    const char *target = heddle_get_cstr(c, "target");
    if (!target || !*target) {
        target = heddle_control_target(c, 0);
        if (!target || heddle_control_target(c, 1))
            return heddle_fail(c, "cstrings:target", "wire exactly one controlled node to this one, or name one in `target`");
    }
    uint64_t *tickets = malloc((n / 2 + 1) * sizeof *tickets); // at most one word per two bytes, plus one
    size_t count = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && isspace((unsigned char)s[i])) i++;
        size_t start = i;
        while (i < n && !isspace((unsigned char)s[i])) i++;
        if (i == start) break;
        heddle_values *ev = heddle_values_new();
        heddle_values_set_str_n(ev, property ? property : "text", s + start, i - start);
        bool sent = heddle_control_send(c, target, ev, &tickets[count]);
        heddle_values_free(ev);
        if (!sent) {
            free(tickets);
            return false; // the host's message, naming the nodes and the property
        }
        count++;
    }
    heddle_json words = {0};
    heddle_json_begin_list(&words);
    for (size_t k = 0; k < count; k++) {
        heddle_values *reply = heddle_control_reply(c, tickets[k]);
        if (!reply) {
            heddle_json_free(&words);
            free(tickets);
            return false;
        }
        if (!heddle_values_get_as_json(reply, output ? output : "text", &words)) heddle_json_null(&words);
        heddle_values_free(reply);
    }
    heddle_json_end_list(&words);
    heddle_set_json_built(c, "words", &words);
    heddle_set_str(c, "target", target);
    free(tickets);
    return true;
}

const heddle_node HEDDLE_NODES[] = {
    {
        .type_name = "cstrings.crc32",
        .title = "CRC-32",
        .description = "CRC-32 checksum and byte length of a string.",
        .inputs = HEDDLE_PORTS({"text", "str", .required = true}),
        .outputs = HEDDLE_OUTPUTS({"crc32", "int"}, {"length", "int"}),
        .retry_safe = true,
        .run = run_crc32,
    },
    {
        .type_name = "cstrings.parse_int",
        .title = "Parse integer",
        .description = "Parses a base-10 integer; trailing characters are a recoverable error.",
        .inputs = HEDDLE_PORTS({"text", "str", .required = true}),
        .outputs = HEDDLE_OUTPUTS({"value", "int"}),
        .retry_safe = true,
        .run = run_parse_int,
    },
    {
        .type_name = "cstrings.word_stats",
        .title = "Word statistics",
        .description = "Word count, longest word and mean word length of a text, as one object.",
        .inputs = HEDDLE_PORTS({"text", "str", .required = true}),
        .outputs = HEDDLE_OUTPUTS({"stats", "object"}),
        .retry_safe = true,
        .run = run_word_stats,
    },
    {
        .type_name = "cstrings.ratio",
        .title = "Ratio",
        .description = "a / b; dividing by zero is an error with the signature math:div0.",
        .inputs = HEDDLE_PORTS({"a", "float", .required = true}, {"b", "float", .required = true}),
        .outputs = HEDDLE_OUTPUTS({"ratio", "float"}),
        .retry_safe = true,
        .reuse_instance = true,
        .run = run_ratio,
    },
    {
        .type_name = "cstrings.pad",
        .title = "Pad",
        .description = "Controlled: runs once per `run` event its controller sends; pads `text` with `fill` to `width`.",
        .inputs = HEDDLE_PORTS({"text", "str", .default_json = "\"\"", .description = "Set by each run event"}),
        .properties = HEDDLE_PORTS({"width", "int", .default_json = "8"}, {"fill", "str", .default_json = "\".\""}),
        .outputs = HEDDLE_OUTPUTS({"text", "str"}),
        .retry_safe = true,
        .run = run_pad,
        .controlled = true,
    },
    {
        .type_name = "cstrings.each_word",
        .title = "Each word",
        .description = "Controller: runs the controlled node its control edge reaches once per word of `text` "
                       "(property `property` = the word), every event in flight at once, and lists each "
                       "reply's `output` in word order.",
        .inputs = HEDDLE_PORTS({"text", "str", .required = true}),
        .properties = HEDDLE_PORTS({"property", "str", .default_json = "\"text\"", .description = "The property each word sets"},
                                   {"output", "str", .default_json = "\"text\"", .description = "The reply's output to collect"},
                                   {"target", "str", .default_json = "\"\"", .description = "The node to drive when control edges reach several"}),
        .outputs = HEDDLE_OUTPUTS({"words", "list[any]"}, {"target", "str"}),
        .retry_safe = true,
        .run = run_each_word,
    },
    {0},
};
