/*
 * api_anthropic.c - the Anthropic Messages API (POST /v1/messages and
 * /v1/messages/count_tokens): its request as a chat-completions body, its
 * message object and stream events (message_start ... message_stop), and
 * its error shape. Names follow @anthropic-ai/sdk's types
 * (resources/messages/messages.d.ts). Usage counts as Anthropic's do:
 * input_tokens are the prompt tokens not read from the prompt cache,
 * cache_read_input_tokens those that were.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "server/api_int.h"

/* ---- the request ---- */

/* A string, or text blocks, as one string (blocks joined by "\n"); out is
 * owned by the caller. */
static bool text_of(const cJSON *v, const char *where, struct sp_buf *out, struct sp_api_err *e) {
    if (cJSON_IsString(v)) {
        sp_buf_puts(out, v->valuestring);
        return true;
    }
    if (!cJSON_IsArray(v)) return sp_api_fail(e, where, "%s must be a string or an array of text blocks", where);
    int k = 0;
    for (const cJSON *b = v->child; b; b = b->next, k++) {
        const cJSON *type = cJSON_IsObject(b) ? sp_api_field(b, "type") : NULL;
        const cJSON *text = cJSON_IsObject(b) ? sp_api_field(b, "text") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return sp_api_fail(e, where, "%s[%d] must be a text block {\"type\": \"text\", \"text\": ...}%s", where, k,
                               cJSON_IsString(type) && strcmp(type->valuestring, "text") ? " (only text is supported)"
                                                                                         : "");
        if (k) sp_buf_putc(out, '\n');
        sp_buf_puts(out, text->valuestring);
    }
    if (!out->data) sp_buf_puts(out, "");
    return !out->failed || sp_api_fail(e, where, "out of memory");
}

static cJSON *new_message(cJSON *msgs, const char *role) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddStringToObject(m, "role", role);
    return m;
}

/* One Anthropic message: a user message becomes its tool results (as tool
 * messages) and then its text; an assistant message its text and tool
 * calls. Thinking blocks are not shown to the model again. */
static bool add_message(cJSON *msgs, const cJSON *m, int i, struct sp_api_err *e) {
    const cJSON *role = cJSON_IsObject(m) ? sp_api_field(m, "role") : NULL;
    if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return sp_api_fail(e, "messages", "messages[%d] must be an object with 'role' \"user\" or \"assistant\"", i);
    bool user = !strcmp(role->valuestring, "user");
    const cJSON *content = sp_api_field(m, "content");
    if (cJSON_IsString(content)) {
        cJSON_AddStringToObject(new_message(msgs, role->valuestring), "content", content->valuestring);
        return true;
    }
    if (!cJSON_IsArray(content))
        return sp_api_fail(e, "messages", "messages[%d].content must be a string or an array of content blocks", i);
    cJSON *text_msg = NULL, *calls = NULL;
    int k = 0;
    for (const cJSON *b = content->child; b; b = b->next, k++) {
        const cJSON *type = cJSON_IsObject(b) ? sp_api_field(b, "type") : NULL;
        if (!cJSON_IsString(type))
            return sp_api_fail(e, "messages", "messages[%d].content[%d] must be an object with a string 'type'", i, k);
        const char *t = type->valuestring;
        if (!strcmp(t, "text")) {
            const cJSON *text = sp_api_field(b, "text");
            if (!cJSON_IsString(text))
                return sp_api_fail(e, "messages", "messages[%d].content[%d].text must be a string", i, k);
            if (!text_msg) text_msg = new_message(msgs, role->valuestring);
            sp_api_add_text_part(text_msg, text->valuestring);
        } else if (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) {
            continue;
        } else if (!strcmp(t, "tool_use") && !user) {
            const cJSON *id = sp_api_field(b, "id"), *name = sp_api_field(b, "name"), *input = sp_api_field(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || (input && !cJSON_IsObject(input)))
                return sp_api_fail(e, "messages", "messages[%d].content[%d]: a tool_use block needs a string 'id' and "
                                   "'name' and an object 'input'", i, k);
            if (!calls) {
                cJSON *am = text_msg ? text_msg : new_message(msgs, "assistant");
                if (!text_msg) cJSON_AddNullToObject(am, "content");
                text_msg = am;
                calls = cJSON_AddArrayToObject(am, "tool_calls");
            }
            cJSON *c = cJSON_CreateObject();
            cJSON_AddItemToArray(calls, c);
            cJSON_AddStringToObject(c, "id", id->valuestring);
            cJSON_AddStringToObject(c, "type", "function");
            cJSON *f = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(f, "name", name->valuestring);
            char *args = input ? cJSON_PrintUnformatted(input) : NULL;
            cJSON_AddStringToObject(f, "arguments", args ? args : "{}");
            cJSON_free(args);
        } else if (!strcmp(t, "tool_result") && user) {
            const cJSON *id = sp_api_field(b, "tool_use_id"), *rc = sp_api_field(b, "content");
            const cJSON *is_error = sp_api_field(b, "is_error");
            if (!cJSON_IsString(id))
                return sp_api_fail(e, "messages",
                                   "messages[%d].content[%d]: a tool_result block needs a string 'tool_use_id'", i, k);
            if (text_msg)
                return sp_api_fail(e, "messages", "messages[%d].content[%d]: tool_result blocks must come before the "
                                   "text of their message", i, k);
            struct sp_buf out = SP_BUF_INIT;
            char where[64];
            snprintf(where, sizeof where, "messages[%d].content[%d].content", i, k);
            if (cJSON_IsTrue(is_error)) sp_buf_puts(&out, "Error: ");
            if (rc && !text_of(rc, where, &out, e)) {
                sp_buf_free(&out);
                return false;
            }
            cJSON *tm = new_message(msgs, "tool");
            cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(tm, "content", out.data ? out.data : "");
            sp_buf_free(&out);
        } else {
            return sp_api_fail(e, "messages", "messages[%d].content[%d]: %s blocks are not supported in %s messages "
                               "(text%s are)", i, k, t, role->valuestring,
                               user ? " and tool_result" : ", tool_use and thinking");
        }
    }
    if (!text_msg && !k) cJSON_AddStringToObject(new_message(msgs, role->valuestring), "content", "");
    return true;
}

static bool add_tools(cJSON *chat, const cJSON *tools, struct sp_api_err *e) {
    if (!cJSON_IsArray(tools)) return sp_api_fail(e, "tools", "'tools' must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        if (!cJSON_IsObject(t)) return sp_api_fail(e, "tools", "tools[%d] must be an object", i);
        const cJSON *type = sp_api_field(t, "type");
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "custom")))
            return sp_api_fail(e, "tools", "tools[%d]: tools of type '%s' are not supported; only custom tools "
                               "{name, description, input_schema} are", i,
                               cJSON_IsString(type) ? type->valuestring : "?");
        const cJSON *name = sp_api_field(t, "name"), *schema = sp_api_field(t, "input_schema");
        const cJSON *desc = sp_api_field(t, "description");
        if (!cJSON_IsString(name) || !*name->valuestring)
            return sp_api_fail(e, "tools", "tools[%d] must have a non-empty string 'name'", i);
        if (!cJSON_IsObject(schema)) return sp_api_fail(e, "tools", "tools[%d].input_schema must be an object", i);
        if (desc && !cJSON_IsString(desc)) return sp_api_fail(e, "tools", "tools[%d].description must be a string", i);
        cJSON *ct = cJSON_CreateObject();
        cJSON_AddItemToArray(out, ct);
        cJSON_AddStringToObject(ct, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(ct, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        if (desc) cJSON_AddStringToObject(f, "description", desc->valuestring);
        cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(schema, true));
    }
    return true;
}

/* auto -> "auto", any -> "required", tool -> the named function, none -> "none" */
static bool add_tool_choice(cJSON *chat, const cJSON *tc, struct sp_api_err *e) {
    const cJSON *type = cJSON_IsObject(tc) ? sp_api_field(tc, "type") : NULL;
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        cJSON_AddStringToObject(chat, "tool_choice", t);
        return true;
    }
    if (!strcmp(t, "any")) {
        cJSON_AddStringToObject(chat, "tool_choice", "required");
        return true;
    }
    const cJSON *name = !strcmp(t, "tool") ? sp_api_field(tc, "name") : NULL;
    if (cJSON_IsString(name) && *name->valuestring) {
        sp_api_name_tool(chat, name->valuestring);
        return true;
    }
    return sp_api_fail(e, "tool_choice", "'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, "
                       "{\"type\": \"none\"} or {\"type\": \"tool\", \"name\": ...}");
}

static bool translate(const cJSON *body, const char *tsrc, bool count_only, cJSON *chat, struct sp_api_err *e) {
    static const char *const pass[] = {"model", "temperature", "top_p", "top_k", "seed", "stream", "cache_salt",
                                       "chat_template_kwargs"};
    for (size_t k = 0; k < sizeof pass / sizeof *pass; k++) {
        const cJSON *v = sp_api_field(body, pass[k]);
        if (v && !(count_only && !strcmp(pass[k], "stream")))
            cJSON_AddItemToObject(chat, pass[k], cJSON_Duplicate(v, true));
    }
    const cJSON *mt = sp_api_field(body, "max_tokens");
    int64_t v;
    if (!mt && !count_only) return sp_api_fail(e, "max_tokens", "'max_tokens' is required");
    if (mt && (!sp_json_is_int(mt, &v) || v < 1))
        return sp_api_fail(e, "max_tokens", "'max_tokens' must be an integer of at least 1");
    if (mt && !count_only) cJSON_AddItemToObject(chat, "max_tokens", cJSON_Duplicate(mt, true));
    const cJSON *ss = sp_api_field(body, "stop_sequences");
    if (ss) {
        if (!cJSON_IsArray(ss)) return sp_api_fail(e, "stop_sequences", "'stop_sequences' must be an array of strings");
        for (const cJSON *x = ss->child; x; x = x->next)
            if (!cJSON_IsString(x)) return sp_api_fail(e, "stop_sequences", "'stop_sequences' must hold only strings");
        cJSON_AddItemToObject(chat, "stop", cJSON_Duplicate(ss, true));
    }
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *sys = sp_api_field(body, "system");
    if (sys) {
        struct sp_buf t = SP_BUF_INIT;
        if (!text_of(sys, "system", &t, e)) {
            sp_buf_free(&t);
            return false;
        }
        cJSON_AddStringToObject(new_message(msgs, "system"), "content", t.data ? t.data : "");
        sp_buf_free(&t);
    }
    const cJSON *ms = sp_api_field(body, "messages");
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0)
        return sp_api_fail(e, "messages", "'messages' must be a non-empty array");
    int i = 0;
    for (const cJSON *m = ms->child; m; m = m->next, i++)
        if (!add_message(msgs, m, i, e)) return false;
    const cJSON *tools = sp_api_field(body, "tools");
    if (tools && !add_tools(chat, tools, e)) return false;
    const cJSON *tc = sp_api_field(body, "tool_choice");
    if (tc && !add_tool_choice(chat, tc, e)) return false;
    const cJSON *th = sp_api_field(body, "thinking");
    if (th) {
        const cJSON *type = cJSON_IsObject(th) ? sp_api_field(th, "type") : NULL;
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive"))
            return sp_api_fail(e, "thinking", "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or "
                               "{\"type\": \"disabled\"}");
        const cJSON *budget = sp_api_field(th, "budget_tokens");
        if (budget && (!sp_json_is_int(budget, &v) || v < 1))
            return sp_api_fail(e, "thinking", "'thinking.budget_tokens' must be a positive integer");
        /* a switch where the template has one (Qwen3's enable_thinking);
         * the budget is not enforced */
        if (sp_api_template_thinks(tsrc))
            sp_api_set_kwarg(chat, "enable_thinking", cJSON_CreateBool(strcmp(t, "disabled") != 0));
    }
    const cJSON *md = sp_api_field(body, "metadata");
    if (md && !cJSON_IsObject(md)) return sp_api_fail(e, "metadata", "'metadata' must be an object");
    return true;
}

bool sp_api_anthropic_to_chat(const cJSON *body, const char *template_source, bool count_only, cJSON **chat,
                              struct sp_api_err *e) {
    *chat = cJSON_CreateObject();
    if (!*chat) return sp_api_fail(e, NULL, "out of memory");
    if (translate(body, template_source, count_only, *chat, e)) return true;
    cJSON_Delete(*chat);
    *chat = NULL;
    return false;
}

/* ---- errors ---- */

void sp_api_anthropic_error(struct sp_buf *b, int status, const char *msg) {
    const char *type = status == 400 || status == 405 ? "invalid_request_error"
                       : status == 401                ? "authentication_error"
                       : status == 403                ? "permission_error"
                       : status == 404                ? "not_found_error"
                       : status == 413                ? "request_too_large"
                       : status == 429                ? "rate_limit_error"
                       : status == 503                ? "overloaded_error"
                                                      : "api_error";
    struct sp_jw w;
    sp_jw_init(&w, b, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "type");
    sp_jw_str(&w, "error");
    sp_jw_key(&w, "error");
    sp_jw_obj(&w);
    sp_jw_key(&w, "type");
    sp_jw_str(&w, type);
    sp_jw_key(&w, "message");
    sp_jw_str(&w, msg);
    sp_jw_end(&w);
    sp_jw_end(&w);
}

void sp_api_anthropic_count(struct sp_buf *b, int64_t n) {
    struct sp_jw w;
    sp_jw_init(&w, b, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "input_tokens");
    sp_jw_int(&w, n);
    sp_jw_end(&w);
}

/* ---- the message ---- */

static void write_usage(struct sp_jw *w, int64_t input, int64_t cached, int64_t output) {
    sp_jw_obj(w);
    sp_jw_key(w, "input_tokens");
    sp_jw_int(w, input);
    sp_jw_key(w, "output_tokens");
    sp_jw_int(w, output);
    sp_jw_key(w, "cache_creation_input_tokens");
    sp_jw_int(w, 0);
    sp_jw_key(w, "cache_read_input_tokens");
    sp_jw_int(w, cached);
    sp_jw_end(w);
}

/* stop_reason and stop_sequence (NULL: null) */
static const char *stop_reason(const struct sp_api_out *o, const struct sp_req_progress *p, const char **seq) {
    *seq = NULL;
    if (p->finish == SP_FINISH_LENGTH) return "max_tokens";
    if (sp_api_has_tool_calls(o)) return "tool_use";
    if (p->finish == SP_FINISH_STOP && !p->stopped_by_eos && p->stop_index >= 0 && p->stop_index < o->n_stops) {
        *seq = o->stops[p->stop_index];
        return "stop_sequence";
    }
    return "end_turn";
}

/* A content block; done: with its whole text and input (else as started). */
static void write_block(struct sp_jw *w, const struct sp_api_item *it, bool done) {
    sp_jw_obj(w);
    sp_jw_key(w, "type");
    const char *text = done && it->text.data ? it->text.data : "";
    size_t len = done ? it->text.len : 0;
    switch (it->kind) {
    case SP_API_ITEM_MESSAGE:
        sp_jw_str(w, "text");
        sp_jw_key(w, "text");
        sp_jw_strn(w, text, len);
        sp_jw_key(w, "citations");
        sp_jw_null(w);
        break;
    case SP_API_ITEM_REASONING:
        sp_jw_str(w, "thinking");
        sp_jw_key(w, "thinking");
        sp_jw_strn(w, text, len);
        sp_jw_key(w, "signature");
        sp_jw_str(w, "");
        break;
    case SP_API_ITEM_TOOL: {
        sp_jw_str(w, "tool_use");
        sp_jw_key(w, "id");
        sp_jw_str(w, it->id);
        sp_jw_key(w, "name");
        sp_jw_str(w, it->name ? it->name : "");
        sp_jw_key(w, "input");
        /* an object; arguments cut short (max_tokens) or not an object give {} */
        cJSON *in = len ? cJSON_ParseWithLength(text, len) : NULL;
        if (cJSON_IsObject(in))
            sp_jw_cjson(w, in);
        else {
            sp_jw_obj(w);
            sp_jw_end(w);
        }
        cJSON_Delete(in);
        break;
    }
    }
    sp_jw_end(w);
}

static void send_event(struct sp_buf *sse, const char *type, struct sp_jw *w, struct sp_buf *b) {
    sp_jw_end(w);
    sp_api_sse(sse, type, b);
}

static void begin_event(struct sp_jw *w, struct sp_buf *b, const char *type) {
    sp_buf_clear(b);
    sp_jw_init(w, b, 0);
    sp_jw_obj(w);
    sp_jw_key(w, "type");
    sp_jw_str(w, type);
}

static void write_message_head(struct sp_jw *w, const struct sp_api_out *o) {
    sp_jw_key(w, "id");
    sp_jw_str(w, o->id);
    sp_jw_key(w, "type");
    sp_jw_str(w, "message");
    sp_jw_key(w, "role");
    sp_jw_str(w, "assistant");
    sp_jw_key(w, "model");
    sp_jw_str(w, o->model);
}

void sp_api_anthropic_begin(struct sp_api_out *o, struct sp_buf *sse) {
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    begin_event(&w, &b, "message_start");
    sp_jw_key(&w, "message");
    sp_jw_obj(&w);
    write_message_head(&w, o);
    sp_jw_key(&w, "content");
    sp_jw_arr(&w);
    sp_jw_end(&w);
    sp_jw_key(&w, "stop_reason");
    sp_jw_null(&w);
    sp_jw_key(&w, "stop_sequence");
    sp_jw_null(&w);
    sp_jw_key(&w, "usage");
    write_usage(&w, o->prompt_tokens, 0, 0);  // the cache's share comes with message_delta
    sp_jw_end(&w);
    send_event(sse, "message_start", &w, &b);
    begin_event(&w, &b, "ping");
    send_event(sse, "ping", &w, &b);
    sp_buf_free(&b);
}

void sp_api_anthropic_open(struct sp_api_out *o, int i, struct sp_buf *sse) {
    if (!sse) return;
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    begin_event(&w, &b, "content_block_start");
    sp_jw_key(&w, "index");
    sp_jw_int(&w, i);
    sp_jw_key(&w, "content_block");
    write_block(&w, &o->items[i], false);
    send_event(sse, "content_block_start", &w, &b);
    sp_buf_free(&b);
}

void sp_api_anthropic_delta(struct sp_api_out *o, int i, const char *text, size_t len, struct sp_buf *sse) {
    if (!sse) return;
    enum sp_api_item_kind kind = o->items[i].kind;
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    begin_event(&w, &b, "content_block_delta");
    sp_jw_key(&w, "index");
    sp_jw_int(&w, i);
    sp_jw_key(&w, "delta");
    sp_jw_obj(&w);
    sp_jw_key(&w, "type");
    sp_jw_str(&w, kind == SP_API_ITEM_MESSAGE ? "text_delta" : kind == SP_API_ITEM_REASONING ? "thinking_delta"
                                                                                             : "input_json_delta");
    sp_jw_key(&w, kind == SP_API_ITEM_MESSAGE ? "text" : kind == SP_API_ITEM_REASONING ? "thinking" : "partial_json");
    sp_jw_strn(&w, text, len);
    sp_jw_end(&w);
    send_event(sse, "content_block_delta", &w, &b);
    sp_buf_free(&b);
}

void sp_api_anthropic_close(struct sp_api_out *o, int i, struct sp_buf *sse) {
    if (!sse) return;
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    begin_event(&w, &b, "content_block_stop");
    sp_jw_key(&w, "index");
    sp_jw_int(&w, i);
    send_event(sse, "content_block_stop", &w, &b);
    sp_buf_free(&b);
}

void sp_api_anthropic_end(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *sse) {
    const char *seq;
    const char *reason = stop_reason(o, p, &seq);
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    begin_event(&w, &b, "message_delta");
    sp_jw_key(&w, "delta");
    sp_jw_obj(&w);
    sp_jw_key(&w, "stop_reason");
    sp_jw_str(&w, reason);
    sp_jw_key(&w, "stop_sequence");
    sp_jw_str(&w, seq);
    sp_jw_end(&w);
    sp_jw_key(&w, "usage");
    write_usage(&w, p->prompt_tokens - p->cached_tokens, p->cached_tokens, p->completion_tokens);
    send_event(sse, "message_delta", &w, &b);
    begin_event(&w, &b, "message_stop");
    send_event(sse, "message_stop", &w, &b);
    sp_buf_free(&b);
}

void sp_api_anthropic_fail(struct sp_api_out *o, const char *code, const char *msg, const struct sp_req_progress *p,
                           struct sp_buf *sse) {
    struct sp_buf b = SP_BUF_INIT;
    sp_api_anthropic_error(&b, code && !strcmp(code, "server_shutdown") ? 503 : 500, msg);
    sp_api_sse(sse, "error", &b);
    sp_buf_free(&b);
}

void sp_api_anthropic_body(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *b) {
    const char *seq;
    const char *reason = stop_reason(o, p, &seq);
    struct sp_jw w;
    sp_jw_init(&w, b, 0);
    sp_jw_obj(&w);
    write_message_head(&w, o);
    sp_jw_key(&w, "content");
    sp_jw_arr(&w);
    for (int i = 0; i < o->n_items; i++) write_block(&w, &o->items[i], true);
    sp_jw_end(&w);
    sp_jw_key(&w, "stop_reason");
    sp_jw_str(&w, reason);
    sp_jw_key(&w, "stop_sequence");
    sp_jw_str(&w, seq);
    sp_jw_key(&w, "usage");
    write_usage(&w, p->prompt_tokens - p->cached_tokens, p->cached_tokens, p->completion_tokens);
    sp_jw_end(&w);
}
