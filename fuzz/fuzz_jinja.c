/* fuzz_jinja.c - libFuzzer target: arbitrary bytes as a Jinja chat template,
 * compiled and rendered with a small fixed conversation. Both steps must
 * succeed or fail cleanly, within the limits given, and never hang. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "template/jinja.h"

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"héllo\"}]},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"hmm\","
    "  \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
    "   \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static cJSON *ctx;
    static struct sp_jinja_var vars[16];
    static int64_t n_vars;
    if (!ctx) {
        ctx = cJSON_Parse(CONTEXT);
        SP_ASSERT(ctx);
        for (cJSON *c = ctx->child; c && n_vars < 16; c = c->next) vars[n_vars++] = (struct sp_jinja_var){c->string, c};
    }
    struct sp_jinja *t;
    if (sp_jinja_compile((const char *)data, size, &t) != SP_OK) return 0;
    struct sp_jinja_opts o = {.max_loop_iterations = 20000,
                              .max_call_depth = 50,
                              .max_output = 1 << 20,
                              .max_memory = 64 << 20,
                              .now = 1768435200,
                              .utc = true};
    char *out;
    size_t len;
    if (sp_jinja_render(t, vars, n_vars, &o, &out, &len) == SP_OK) {
        SP_ASSERT(len <= o.max_output);
        SP_ASSERT(out[len] == 0);
        sp_free(out);
    } else {
        SP_ASSERT(out == NULL);
    }
    sp_jinja_free(t);
    return 0;
}
