/* fuzz_chat_parse.c - libFuzzer target: arbitrary model output through the
 * chat output parser of every format, pushed whole and in pieces (the two
 * must agree), and through the JSON validator. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/status.h"
#include "runtime/jsonv.h"
#include "server/chat_parse.h"

static void parse_pieces(const struct sp_chat_parse_opts *o, const uint8_t *data, size_t size, size_t step,
                         struct sp_chat_result *r) {
    struct sp_chat_parser *p;
    SP_ASSERT(sp_chat_parser_new(o, &p) == SP_OK);
    for (size_t i = 0; i < size; i += step) {
        size_t n = size - i < step ? size - i : step;
        SP_ASSERT(sp_chat_parser_push(p, (const char *)data + i, n) == SP_OK);
        size_t ne;
        const struct sp_chat_event *ev = sp_chat_parser_events(p, &ne);
        sp_chat_result_add(r, ev, ne);
    }
    SP_ASSERT(sp_chat_parser_finish(p) == SP_OK);
    size_t ne;
    const struct sp_chat_event *ev = sp_chat_parser_events(p, &ne);
    sp_chat_result_add(r, ev, ne);
    sp_chat_parser_free(p);
}

static bool same_buf(const struct sp_buf *a, const struct sp_buf *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    struct sp_chat_parse_opts o = {.format = (enum sp_chat_format)(data[0] % SP_CHAT_FORMAT_COUNT),
                                   .in_reasoning = data[1] & 1, .id_seed = 7};
    size_t step = 1 + (data[1] >> 1) % 7;
    data += 2;
    size -= 2;
    struct sp_chat_result whole, pieces;
    memset(&whole, 0, sizeof whole);
    memset(&pieces, 0, sizeof pieces);
    SP_ASSERT(sp_chat_parse(&o, (const char *)data, size, &whole) == SP_OK);
    parse_pieces(&o, data, size, step, &pieces);
    SP_ASSERT(same_buf(&whole.content, &pieces.content));
    SP_ASSERT(same_buf(&whole.reasoning, &pieces.reasoning));
    SP_ASSERT(whole.n_tool_calls == pieces.n_tool_calls);
    sp_chat_result_free(&whole);
    sp_chat_result_free(&pieces);
    struct sp_jsonv v;
    sp_jsonv_init(&v);
    if (sp_jsonv_feed(&v, data, size)) (void)sp_jsonv_complete(&v);
    return 0;
}
