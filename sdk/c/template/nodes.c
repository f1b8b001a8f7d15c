// My Heddle nodes, in C. heddle.h and the WIT bindings are supplied by the build.
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "heddle.h"

static bool run_shout(heddle_call *c) {
    const char *text = heddle_get_cstr(c, "text");
    const char *suffix = heddle_get_cstr(c, "suffix");
    if (!text || !*text)
        // A recoverable error: a supervisor may substitute the candidate output.
        return (heddle_set_str(c, "text", ""),
                heddle_fail_with_candidate(c, "myc:empty", "nothing to shout"));
    size_t n = strlen(text), m = suffix ? strlen(suffix) : 0;
    char *out = malloc(n + m + 1);
    for (size_t i = 0; i < n; i++) out[i] = (char)toupper((unsigned char)text[i]);
    memcpy(out + n, suffix ? suffix : "", m);
    out[n + m] = '\0';
    heddle_set_str(c, "text", out);  // copied: free our buffer
    free(out);
    heddle_log(HEDDLE_INFO, "shouted %zu characters", n);
    return true;
}

const heddle_node HEDDLE_NODES[] = {
    {
        .type_name = "myc.shout",  // the node type name used in graphs
        .title = "Shout",
        .description = "Upper-cases the text and appends the suffix.",  // `heddle nodes` shows it
        .inputs = HEDDLE_PORTS({"text", "str", .required = true}),
        .properties = HEDDLE_PORTS({"suffix", "str", .default_json = "\"!\""}),
        .outputs = HEDDLE_OUTPUTS({"text", "str"}),
        .retry_safe = true,  // pure: a supervisor may re-run it
        .run = run_shout,
    },
    {0},  // end of the table
};
