/* fuzz_api.c - libFuzzer target: arbitrary request bodies through the
 * Responses and Anthropic translations into chat bodies, and arbitrary
 * model output through their writers, streamed and whole.
 *
 * Input: one byte choosing the API (bit 0), count_tokens (bit 1) and the
 * output's format (the rest); the request JSON; a NUL byte; the model's
 * output. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/json.h"
#include "core/status.h"
#include "server/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    enum sp_api api = data[0] & 1 ? SP_API_ANTHROPIC : SP_API_RESPONSES;
    bool count_only = data[0] & 2;
    enum sp_chat_format fmt = (enum sp_chat_format)((data[0] >> 2) % SP_CHAT_FORMAT_COUNT);
    data++;
    size--;
    const uint8_t *nul = memchr(data, 0, size);
    size_t req_len = nul ? (size_t)(nul - data) : size;
    const char *out = nul ? (const char *)nul + 1 : "";
    size_t out_len = nul ? size - req_len - 1 : 0;
    cJSON *body;
    if (sp_json_parse((const char *)data, req_len, "fuzz", &body) != SP_OK) return 0;
    if (!cJSON_IsObject(body)) {
        cJSON_Delete(body);
        return 0;
    }
    cJSON *chat = NULL;
    struct sp_api_err e;
    bool ok = api == SP_API_RESPONSES ? sp_api_responses_to_chat(body, "enable_thinking", &chat, &e)
                                      : sp_api_anthropic_to_chat(body, "enable_thinking", count_only, &chat, &e);
    SP_ASSERT(ok == (chat != NULL));
    SP_ASSERT(ok || e.msg[0]);
    cJSON_Delete(chat);

    struct sp_api_out_info oi = {.api = api, .request = body, .id = "resp_0123", .model = "m", .prompt_tokens = 3};
    struct sp_api_out *streamed, *whole;
    SP_ASSERT(sp_api_out_new(&oi, &streamed) == SP_OK);
    SP_ASSERT(sp_api_out_new(&oi, &whole) == SP_OK);
    struct sp_chat_parse_opts po = {.format = fmt, .id_seed = 1};
    struct sp_chat_parser *p;
    SP_ASSERT(sp_chat_parser_new(&po, &p) == SP_OK);
    struct sp_buf sse = SP_BUF_INIT, b = SP_BUF_INIT;
    sp_api_out_begin(streamed, &sse);
    size_t n;
    const struct sp_chat_event *ev;
    for (size_t i = 0; i < out_len; i += 5) {
        SP_ASSERT(sp_chat_parser_push(p, out + i, out_len - i < 5 ? out_len - i : 5) == SP_OK);
        ev = sp_chat_parser_events(p, &n);
        sp_api_out_events(streamed, ev, n, &sse);
    }
    SP_ASSERT(sp_chat_parser_finish(p) == SP_OK);
    ev = sp_chat_parser_events(p, &n);
    sp_api_out_events(streamed, ev, n, &sse);
    struct sp_req_progress pr = {.finished = true, .finish = (out_len & 1) ? SP_FINISH_LENGTH : SP_FINISH_STOP,
                                 .prompt_tokens = 3, .completion_tokens = 5, .stop_index = (int)(out_len % 3) - 1};
    sp_api_out_end(streamed, &pr, &sse);
    SP_ASSERT(sp_api_out_parse(whole, &po, out, out_len) == SP_OK);
    sp_api_out_body(whole, &pr, &b);
    /* the body and the stream's events are JSON */
    cJSON *v = cJSON_ParseWithLength(b.data, b.len);
    SP_ASSERT(cJSON_IsObject(v));
    cJSON_Delete(v);
    for (const char *d = sse.data; d && (d = strstr(d, "\ndata: ")); d++) {
        const char *end = strstr(d + 7, "\n\n");
        SP_ASSERT(end);
        v = cJSON_ParseWithLength(d + 7, (size_t)(end - d - 7));
        SP_ASSERT(cJSON_IsObject(v));
        cJSON_Delete(v);
    }
    sp_buf_free(&sse);
    sp_buf_free(&b);
    sp_chat_parser_free(p);
    sp_api_out_free(streamed);
    sp_api_out_free(whole);
    cJSON_Delete(body);
    return 0;
}
