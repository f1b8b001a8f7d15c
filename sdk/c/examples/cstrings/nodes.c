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
    {0},
};
