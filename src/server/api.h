/*
 * api.h - the OpenAI Responses API (POST /v1/responses) and the Anthropic
 * Messages API (POST /v1/messages, /v1/messages/count_tokens) over the
 * chat-completions path. Private to src/server/.
 *
 * A request of either API is translated into a chat-completions body
 * (messages, tools, tool_choice, response_format, max_tokens, sampling,
 * stop, stream, chat_template_kwargs), which the chat path renders,
 * validates and generates as any chat request. Only the output differs: an
 * sp_api_out turns the chat parser's events (content, reasoning, tool
 * calls) into the API's output items, written as SSE events while they
 * stream and as one JSON body at the end.
 *
 *     cJSON *chat;
 *     struct sp_api_err e;
 *     if (!sp_api_responses_to_chat(body, template_source, &chat, &e)) answer 400 e.param, e.msg;
 *     ... the chat path validates and tokenizes chat ...
 *     struct sp_api_out_info oi = {.api = SP_API_RESPONSES, .request = body, .id = id, ...};
 *     struct sp_api_out *o;
 *     sp_api_out_new(&oi, &o);
 *     streaming:  sp_api_out_begin(o, &sse);
 *                 for each parser push / finish: sp_api_out_events(o, ev, n, &sse);
 *                 sp_api_out_end(o, &progress, &sse);    // or sp_api_out_fail(...)
 *     otherwise:  sp_api_out_parse(o, &parse_opts, text, len);
 *                 sp_api_out_body(o, &progress, &json);
 *     sp_api_out_free(o);
 *
 * The cJSON trees passed in are borrowed for the call; what an sp_api_out
 * keeps, it copies.
 */
#ifndef SP_SERVER_API_H
#define SP_SERVER_API_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/buf.h"
#include "runtime/engine.h"
#include "server/chat_parse.h"
#include "tokenizer/tokenizer.h"

enum sp_api {
    SP_API_CHAT,       // /v1/chat/completions: no sp_api_out
    SP_API_RESPONSES,  // /v1/responses
    SP_API_ANTHROPIC,  // /v1/messages
    SP_API_COUNT
};

/* A request problem: the message and the offending field ("input[2].content"). */
struct sp_api_err {
    char msg[512];
    char param[96];
};

/* The chat-completions body of a Responses request (*chat owned by the
 * caller). template_source (may be NULL) says whether the chat template
 * has an enable_thinking switch for reasoning.effort "none". */
bool sp_api_responses_to_chat(const cJSON *body, const char *template_source, cJSON **chat, struct sp_api_err *e);

/* The chat-completions body of an Anthropic Messages request. count_only:
 * a count_tokens request, which has no max_tokens. */
bool sp_api_anthropic_to_chat(const cJSON *body, const char *template_source, bool count_only, cJSON **chat,
                              struct sp_api_err *e);

/* The name a chat-completions field has in api's requests, for the param
 * of an error the chat path found in a translated request. */
const char *sp_api_param(enum sp_api api, const char *chat_param);

/* The prefix of response ids: "resp_", "msg_". */
const char *sp_api_id_prefix(enum sp_api api);

/* Anthropic's error body {"type": "error", "error": {type, message}}, the
 * type from the HTTP status, into b. */
void sp_api_anthropic_error(struct sp_buf *b, int status, const char *msg);

/* count_tokens' answer {"input_tokens": n} into b. */
void sp_api_anthropic_count(struct sp_buf *b, int64_t n);

struct sp_api_out_info {
    enum sp_api api;              // SP_API_RESPONSES or SP_API_ANTHROPIC
    const cJSON *request;         // the API's request body: parameters echoed, stop sequences
    const char *id;               // the response's id (copied)
    const char *model;            // the model id reported (borrowed: must outlive the writer)
    int64_t created;              // unix seconds
    int64_t prompt_tokens;        // the prompt's length, for events sent before generation starts
    const struct sp_tokenizer *tok;  // counts reasoning tokens (borrowed; may be NULL)
};

struct sp_api_out;

enum sp_status sp_api_out_new(const struct sp_api_out_info *info, struct sp_api_out **out);
void sp_api_out_free(struct sp_api_out *o);

/* The events that open a stream (response.created and response.in_progress;
 * message_start), appended to sse. */
void sp_api_out_begin(struct sp_api_out *o, struct sp_buf *sse);

/* Adds parser events to the output; with sse non-NULL, also appends the
 * SSE events that stream them (an item opened, closed, a delta). */
void sp_api_out_events(struct sp_api_out *o, const struct sp_chat_event *ev, size_t n, struct sp_buf *sse);

/* The end of a generation that finished (stop or length): closes the open
 * item and appends the closing events (response.completed or
 * response.incomplete; message_delta and message_stop). */
void sp_api_out_end(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *sse);

/* A generation that failed or was stopped: appends response.failed, or
 * Anthropic's error event (overloaded_error when code is
 * "server_shutdown", else api_error). */
void sp_api_out_fail(struct sp_api_out *o, const char *code, const char *msg, const struct sp_req_progress *p,
                     struct sp_buf *sse);

/* Parses a whole generated text into the output (no SSE). */
enum sp_status sp_api_out_parse(struct sp_api_out *o, const struct sp_chat_parse_opts *popts, const char *text,
                                size_t len);

/* The whole response object of a non-streaming request into b. */
void sp_api_out_body(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *b);

#endif
