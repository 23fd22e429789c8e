/* fuzz_jschema.c - libFuzzer target: the input's first line is a JSON
 * Schema, the rest is text fed to a matcher of the grammar compiled from
 * it. Compiling must succeed or fail with a message; the matcher must agree
 * with itself (a byte it takes is one it said it would take). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "runtime/grammar.h"
#include "server/jschema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    size_t head = nl ? (size_t)(nl - data) : size;
    char *text = malloc(head + 1);
    if (!text) return 0;
    memcpy(text, data, head);
    text[head] = 0;
    cJSON *schema = cJSON_Parse(text);
    free(text);
    struct sp_grammar *g = NULL;
    if (schema && sp_jschema_grammar(schema, "schema", &g) == SP_OK) {
        struct sp_gmatch *m;
        if (sp_gmatch_new(g, &m) == SP_OK) {
            for (size_t i = head + 1; i < size; i++) {
                bool would = sp_gmatch_try(m, data + i, 1);
                SP_ASSERT(would == sp_gmatch_feed(m, data + i, 1));
                if (sp_gmatch_done(m)) SP_ASSERT(sp_gmatch_accepting(m));
            }
            sp_gmatch_free(m);
        }
        sp_grammar_free(g);
    } else if (schema) {
        SP_ASSERT(sp_error_msg()[0] != 0);
    }
    cJSON_Delete(schema);
    return 0;
}
