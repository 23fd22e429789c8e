/*
 * api_int.h - what api.c shares with the two API writers (api_responses.c,
 * api_anthropic.c): the output as a list of items, and the hooks each API
 * implements to stream and to write it. Private to those three files.
 *
 * An item is what both APIs list in order: a message (Responses: a
 * "message" item with one output_text part; Anthropic: a text block), a
 * reasoning item (a "reasoning" item with one reasoning_text part; a
 * thinking block) or a tool call (a "function_call" item; a tool_use
 * block). api.c opens a new item whenever the parser's events change kind,
 * so the items follow the model's output as it was written.
 */
#ifndef SP_SERVER_API_INT_H
#define SP_SERVER_API_INT_H

#include "core/json.h"
#include "server/api.h"

enum sp_api_item_kind { SP_API_ITEM_MESSAGE, SP_API_ITEM_REASONING, SP_API_ITEM_TOOL };

struct sp_api_item {
    enum sp_api_item_kind kind;
    int tool_index;      // TOOL: the parser's index of the call
    char id[64];         // Responses: "msg_", "rs_", "fc_" ...; Anthropic tool_use: "toolu_..."
    char call_id[40];    // TOOL: the parser's id ("call_...")
    char *name;          // TOOL: the function (owned)
    struct sp_buf text;  // the content, the reasoning, or the arguments JSON
    bool incomplete;     // closed by the length limit
};

struct sp_api_out {
    enum sp_api api;
    char id[48];
    const char *model;
    int64_t created;
    int64_t prompt_tokens;
    const struct sp_tokenizer *tok;
    cJSON *echo;  // Responses: the request's parameters, echoed in the response object
    char *stops[SP_MAX_STOPS];  // Anthropic: the stop sequences (owned), for stop_sequence
    int n_stops;
    int64_t seq;  // Responses: the next event's sequence_number
    struct sp_api_item *items;
    int n_items, cap_items;
    int open;  // the item being streamed, or -1
};

/* Appends "event: NAME\ndata: JSON\n\n" to sse. */
void sp_api_sse(struct sp_buf *sse, const char *event, const struct sp_buf *json);

/* Tokens of the reasoning items' text (at most completion tokens). */
int64_t sp_api_reasoning_tokens(const struct sp_api_out *o, const struct sp_req_progress *p);

/* Whether any item is a tool call. */
bool sp_api_has_tool_calls(const struct sp_api_out *o);

/* Records a request problem; returns false. */
bool sp_api_fail(struct sp_api_err *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* An object field that is present and not null, or NULL. */
const cJSON *sp_api_field(const cJSON *o, const char *k);
/* chat.tool_choice = {"type": "function", "function": {"name": name}}. */
void sp_api_name_tool(cJSON *chat, const char *name);

/* Whether a chat template has an enable_thinking switch (Qwen3's). */
bool sp_api_template_thinks(const char *template_source);

/* Appends text to a message's content parts ([{type: "text", text}]),
 * creating the array: parts keep their boundaries for the chat path. */
void sp_api_add_text_part(cJSON *msg, const char *text);

/* Sets a chat_template_kwargs member of a chat body. */
void sp_api_set_kwarg(cJSON *chat, const char *key, cJSON *value);

/* Hooks: an item opened (i: its index in o->items), a piece of its text
 * added, and its end; then the end of the output, a failure, and the
 * whole body. sse may be NULL where nothing streams. */
void sp_api_responses_begin(struct sp_api_out *o, struct sp_buf *sse);
void sp_api_responses_open(struct sp_api_out *o, int i, struct sp_buf *sse);
void sp_api_responses_delta(struct sp_api_out *o, int i, const char *text, size_t len, struct sp_buf *sse);
void sp_api_responses_close(struct sp_api_out *o, int i, struct sp_buf *sse);
void sp_api_responses_end(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *sse);
void sp_api_responses_fail(struct sp_api_out *o, const char *code, const char *msg, const struct sp_req_progress *p,
                        struct sp_buf *sse);
void sp_api_responses_body(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *b);
/* Copies the parameters a response object echoes. */
cJSON *sp_api_responses_echo(const cJSON *request);

void sp_api_anthropic_begin(struct sp_api_out *o, struct sp_buf *sse);
void sp_api_anthropic_open(struct sp_api_out *o, int i, struct sp_buf *sse);
void sp_api_anthropic_delta(struct sp_api_out *o, int i, const char *text, size_t len, struct sp_buf *sse);
void sp_api_anthropic_close(struct sp_api_out *o, int i, struct sp_buf *sse);
void sp_api_anthropic_end(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *sse);
void sp_api_anthropic_fail(struct sp_api_out *o, const char *code, const char *msg, const struct sp_req_progress *p,
                        struct sp_buf *sse);
void sp_api_anthropic_body(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *b);

#endif
