/*
 * api_responses.c - the OpenAI Responses API (POST /v1/responses): its
 * request as a chat-completions body, and its response object and stream
 * events (response.created ... response.completed) from the output items.
 * Field and event names follow openai-node's types
 * (resources/responses/responses.d.ts); responses are not stored, so
 * previous_response_id and conversation are refused.
 */
#include <stdio.h>
#include <string.h>

#include "server/api_int.h"

/* ---- the request ---- */

/* A message's content: a string, or input_text / output_text parts. */
static bool add_content(cJSON *msg, const cJSON *content, const char *where, struct sp_api_err *e) {
    if (cJSON_IsString(content)) {
        cJSON_AddStringToObject(msg, "content", content->valuestring);
        return true;
    }
    if (!cJSON_IsArray(content))
        return sp_api_fail(e, "input", "%s.content must be a string or an array of content parts", where);
    int k = 0;
    for (const cJSON *p = content->child; p; p = p->next, k++) {
        const cJSON *type = cJSON_IsObject(p) ? sp_api_field(p, "type") : NULL;
        const cJSON *text = cJSON_IsObject(p) ? sp_api_field(p, "text") : NULL;
        if (!cJSON_IsString(type))
            return sp_api_fail(e, "input", "%s.content[%d] must be an object with a string 'type'", where, k);
        const char *t = type->valuestring;
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text"))
            return sp_api_fail(e, "input",
                               "%s.content[%d]: content of type '%s' is not supported "
                               "(only input_text and output_text)",
                               where, k, t);
        if (!cJSON_IsString(text)) return sp_api_fail(e, "input", "%s.content[%d].text must be a string", where, k);
        sp_api_add_text_part(msg, text->valuestring);
    }
    if (!cJSON_GetObjectItemCaseSensitive(msg, "content")) cJSON_AddStringToObject(msg, "content", "");
    return true;
}

/* The assistant message a function_call item belongs to: the last message
 * when it is the assistant's, else a new one. */
static cJSON *assistant_for_call(cJSON *msgs) {
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *role = last ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant")) return last;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddNullToObject(m, "content");
    cJSON_AddItemToArray(msgs, m);
    return m;
}

static bool add_item(cJSON *msgs, const cJSON *it, int i, struct sp_api_err *e) {
    char where[32];
    snprintf(where, sizeof where, "input[%d]", i);
    if (!cJSON_IsObject(it)) return sp_api_fail(e, "input", "%s must be an object", where);
    const cJSON *type = sp_api_field(it, "type");
    const cJSON *role = sp_api_field(it, "role");
    if (type && !cJSON_IsString(type)) return sp_api_fail(e, "input", "%s.type must be a string", where);
    const char *t = type ? type->valuestring : "message";
    if (!strcmp(t, "message")) {
        if (!cJSON_IsString(role))
            return sp_api_fail(e, "input", "%s must have a 'role' (user, assistant, system or developer)", where);
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system"))
            return sp_api_fail(e, "input", "%s.role '%s' is not one of user, assistant, system, developer", where,
                               role->valuestring);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", r);
        return add_content(m, sp_api_field(it, "content"), where, e);
    }
    if (!strcmp(t, "function_call")) {
        const cJSON *call_id = sp_api_field(it, "call_id"), *name = sp_api_field(it, "name");
        const cJSON *args = sp_api_field(it, "arguments");
        if (!cJSON_IsString(call_id) || !cJSON_IsString(name) || !cJSON_IsString(args))
            return sp_api_fail(e, "input", "%s: a function_call needs string 'call_id', 'name' and 'arguments'", where);
        cJSON *m = assistant_for_call(msgs);
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(calls, c);
        cJSON_AddStringToObject(c, "id", call_id->valuestring);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddStringToObject(f, "arguments", args->valuestring);
        return true;
    }
    if (!strcmp(t, "function_call_output")) {
        const cJSON *call_id = sp_api_field(it, "call_id"), *output = sp_api_field(it, "output");
        if (!cJSON_IsString(call_id))
            return sp_api_fail(e, "input", "%s: a function_call_output needs a string 'call_id'", where);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", call_id->valuestring);
        if (!output) return sp_api_fail(e, "input", "%s: a function_call_output needs an 'output'", where);
        return add_content(m, output, where, e);
    }
    if (!strcmp(t, "reasoning")) return true;  // the model's earlier reasoning is not shown to it again
    return sp_api_fail(e, "input", "%s: items of type '%s' are not supported (message, function_call, "
                       "function_call_output and reasoning are)", where, t);
}

static bool add_tools(cJSON *chat, const cJSON *tools, struct sp_api_err *e) {
    if (!cJSON_IsArray(tools)) return sp_api_fail(e, "tools", "'tools' must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *type = cJSON_IsObject(t) ? sp_api_field(t, "type") : NULL;
        if (!cJSON_IsString(type))
            return sp_api_fail(e, "tools", "tools[%d] must be an object with a string 'type'", i);
        if (strcmp(type->valuestring, "function"))
            return sp_api_fail(e, "tools", "tools[%d]: tools of type '%s' are not supported; only function tools are",
                               i, type->valuestring);
        const cJSON *name = sp_api_field(t, "name");
        if (!cJSON_IsString(name) || !*name->valuestring)
            return sp_api_fail(e, "tools", "tools[%d] must have a non-empty string 'name'", i);
        cJSON *ct = cJSON_CreateObject();
        cJSON_AddItemToArray(out, ct);
        cJSON_AddStringToObject(ct, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(ct, "function");
        static const char *const keys[] = {"name", "description", "parameters", "strict"};
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            const cJSON *v = sp_api_field(t, keys[k]);
            if (v) cJSON_AddItemToObject(f, keys[k], cJSON_Duplicate(v, true));
        }
    }
    return true;
}

static bool add_tool_choice(cJSON *chat, const cJSON *tc, struct sp_api_err *e) {
    if (cJSON_IsString(tc) && (!strcmp(tc->valuestring, "auto") || !strcmp(tc->valuestring, "none") ||
                               !strcmp(tc->valuestring, "required"))) {
        cJSON_AddStringToObject(chat, "tool_choice", tc->valuestring);
        return true;
    }
    const cJSON *type = cJSON_IsObject(tc) ? sp_api_field(tc, "type") : NULL;
    const cJSON *name = cJSON_IsObject(tc) ? sp_api_field(tc, "name") : NULL;
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "function") && cJSON_IsString(name) && *name->valuestring) {
        sp_api_name_tool(chat, name->valuestring);
        return true;
    }
    return sp_api_fail(e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                       "{\"type\": \"function\", \"name\": ...}");
}

/* text.format -> response_format */
static bool add_format(cJSON *chat, const cJSON *text, struct sp_api_err *e) {
    if (!cJSON_IsObject(text)) return sp_api_fail(e, "text", "'text' must be an object");
    const cJSON *f = sp_api_field(text, "format");
    if (!f) return true;
    const cJSON *type = cJSON_IsObject(f) ? sp_api_field(f, "type") : NULL;
    if (!cJSON_IsString(type))
        return sp_api_fail(e, "text.format", "'text.format' must be an object with a string 'type'");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return true;
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    if (!strcmp(t, "json_object")) {
        cJSON_AddStringToObject(rf, "type", "json_object");
        return true;
    }
    if (strcmp(t, "json_schema"))
        return sp_api_fail(e, "text.format", "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    const cJSON *name = sp_api_field(f, "name"), *schema = sp_api_field(f, "schema");
    if (!cJSON_IsString(name)) return sp_api_fail(e, "text.format.name", "'text.format.name' must be a string");
    if (!cJSON_IsObject(schema)) return sp_api_fail(e, "text.format.schema", "'text.format.schema' must be an object");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    static const char *const keys[] = {"name", "description", "schema", "strict"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const cJSON *v = sp_api_field(f, keys[k]);
        if (v) cJSON_AddItemToObject(js, keys[k], cJSON_Duplicate(v, true));
    }
    return true;
}

static bool translate(const cJSON *body, const char *tsrc, cJSON *chat, struct sp_api_err *e) {
    if (sp_api_field(body, "previous_response_id"))
        return sp_api_fail(e, "previous_response_id", "responses are not stored, so 'previous_response_id' cannot "
                           "refer to one: send the whole conversation in 'input'");
    if (sp_api_field(body, "conversation"))
        return sp_api_fail(e, "conversation", "conversations are not stored: send the whole conversation in 'input'");
    if (sp_api_field(body, "prompt"))
        return sp_api_fail(e, "prompt",
                           "stored prompts are not supported: send the text in 'input' and 'instructions'");
    const cJSON *bg = sp_api_field(body, "background");
    if (bg && !cJSON_IsFalse(bg)) return sp_api_fail(e, "background", "background responses are not supported");
    /* sampling and the fields sparrow's chat path takes beyond OpenAI's Responses ones */
    static const char *const pass[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                                       "frequency_penalty", "repetition_penalty", "stop", "cache_salt", "stream",
                                       "chat_template_kwargs"};
    for (size_t k = 0; k < sizeof pass / sizeof *pass; k++) {
        const cJSON *v = sp_api_field(body, pass[k]);
        if (v) cJSON_AddItemToObject(chat, pass[k], cJSON_Duplicate(v, true));
    }
    const cJSON *mot = sp_api_field(body, "max_output_tokens");
    if (mot) {
        int64_t v;
        if (!sp_json_is_int(mot, &v) || v < 1)
            return sp_api_fail(e, "max_output_tokens", "'max_output_tokens' must be an integer of at least 1");
        cJSON_AddItemToObject(chat, "max_tokens", cJSON_Duplicate(mot, true));
    }
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *ins = sp_api_field(body, "instructions");
    if (ins) {
        if (!cJSON_IsString(ins)) return sp_api_fail(e, "instructions", "'instructions' must be a string");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", ins->valuestring);
    }
    const cJSON *input = sp_api_field(body, "input");
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
    } else if (cJSON_IsArray(input) && cJSON_GetArraySize(input) > 0) {
        int i = 0;
        for (const cJSON *it = input->child; it; it = it->next, i++)
            if (!add_item(msgs, it, i, e)) return false;
    } else {
        return sp_api_fail(e, "input", "'input' must be a string or a non-empty array of input items");
    }
    const cJSON *tools = sp_api_field(body, "tools");
    if (tools && !add_tools(chat, tools, e)) return false;
    const cJSON *tc = sp_api_field(body, "tool_choice");
    if (tc && !add_tool_choice(chat, tc, e)) return false;
    const cJSON *text = sp_api_field(body, "text");
    if (text && !add_format(chat, text, e)) return false;
    const cJSON *ptc = sp_api_field(body, "parallel_tool_calls");
    if (ptc && !cJSON_IsBool(ptc))
        return sp_api_fail(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    const cJSON *md = sp_api_field(body, "metadata");
    if (md && !cJSON_IsObject(md)) return sp_api_fail(e, "metadata", "'metadata' must be an object");
    const cJSON *reasoning = sp_api_field(body, "reasoning");
    if (reasoning) {
        const cJSON *effort = cJSON_IsObject(reasoning) ? sp_api_field(reasoning, "effort") : NULL;
        if (!cJSON_IsObject(reasoning) || (effort && !cJSON_IsString(effort)))
            return sp_api_fail(e, "reasoning", "'reasoning' must be an object whose 'effort' is a string");
        if (effort) {
            /* Qwen3-style templates have a switch rather than levels: "none" turns thinking off */
            if (!strcmp(effort->valuestring, "none") && sp_api_template_thinks(tsrc))
                sp_api_set_kwarg(chat, "enable_thinking", cJSON_CreateFalse());
            else
                cJSON_AddStringToObject(chat, "reasoning_effort", effort->valuestring);
        }
    }
    return true;
}

bool sp_api_responses_to_chat(const cJSON *body, const char *template_source, cJSON **chat, struct sp_api_err *e) {
    *chat = cJSON_CreateObject();
    if (!*chat) return sp_api_fail(e, NULL, "out of memory");
    if (translate(body, template_source, *chat, e)) return true;
    cJSON_Delete(*chat);
    *chat = NULL;
    return false;
}

cJSON *sp_api_responses_echo(const cJSON *request) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    static const char *const keys[] = {"instructions", "max_output_tokens", "temperature", "top_p", "tools",
                                       "tool_choice", "text", "parallel_tool_calls", "metadata", "reasoning", "user"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const cJSON *v = sp_api_field(request, keys[k]);
        if (v) {
            cJSON_AddItemToObject(o, keys[k], cJSON_Duplicate(v, true));
            continue;
        }
        /* the defaults a response object states */
        if (!strcmp(keys[k], "tools"))
            cJSON_AddArrayToObject(o, "tools");
        else if (!strcmp(keys[k], "tool_choice"))
            cJSON_AddStringToObject(o, "tool_choice", "auto");
        else if (!strcmp(keys[k], "text")) {
            cJSON *format = cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "text"), "format");
            cJSON_AddStringToObject(format, "type", "text");
        } else if (!strcmp(keys[k], "parallel_tool_calls"))
            cJSON_AddTrueToObject(o, "parallel_tool_calls");
        else if (!strcmp(keys[k], "metadata"))
            cJSON_AddObjectToObject(o, "metadata");
        else if (!strcmp(keys[k], "reasoning")) {
            cJSON *r = cJSON_AddObjectToObject(o, "reasoning");
            cJSON_AddNullToObject(r, "effort");
            cJSON_AddNullToObject(r, "summary");
        } else if (strcmp(keys[k], "user"))
            cJSON_AddNullToObject(o, keys[k]);
    }
    return o;
}

/* ---- the response ---- */

static const char *item_status(const struct sp_api_item *it, bool done) {
    return !done ? "in_progress" : it->incomplete ? "incomplete" : "completed";
}

/* A function call's arguments: "{}" for a call that never got any. */
static void write_arguments(struct sp_jw *w, const struct sp_api_item *it) {
    if (it->text.len)
        sp_jw_strn(w, it->text.data, it->text.len);
    else
        sp_jw_str(w, "{}");
}

static void write_part(struct sp_jw *w, const struct sp_api_item *it, bool with_text) {
    sp_jw_obj(w);
    sp_jw_key(w, "type");
    sp_jw_str(w, it->kind == SP_API_ITEM_MESSAGE ? "output_text" : "reasoning_text");
    sp_jw_key(w, "text");
    sp_jw_strn(w, with_text && it->text.data ? it->text.data : "", with_text ? it->text.len : 0);
    if (it->kind == SP_API_ITEM_MESSAGE) {
        sp_jw_key(w, "annotations");
        sp_jw_arr(w);
        sp_jw_end(w);
        sp_jw_key(w, "logprobs");
        sp_jw_arr(w);
        sp_jw_end(w);
    }
    sp_jw_end(w);
}

/* An output item; done: closed, with its whole text (else as first added). */
static void write_item(struct sp_jw *w, const struct sp_api_item *it, bool done) {
    sp_jw_obj(w);
    sp_jw_key(w, "id");
    sp_jw_str(w, it->id);
    sp_jw_key(w, "type");
    sp_jw_str(w, it->kind == SP_API_ITEM_MESSAGE ? "message" : it->kind == SP_API_ITEM_REASONING ? "reasoning"
                                                                                                 : "function_call");
    sp_jw_key(w, "status");
    sp_jw_str(w, item_status(it, done));
    switch (it->kind) {
    case SP_API_ITEM_MESSAGE:
        sp_jw_key(w, "role");
        sp_jw_str(w, "assistant");
        sp_jw_key(w, "content");
        sp_jw_arr(w);
        if (done) write_part(w, it, true);
        sp_jw_end(w);
        break;
    case SP_API_ITEM_REASONING:
        sp_jw_key(w, "summary");
        sp_jw_arr(w);
        sp_jw_end(w);
        sp_jw_key(w, "content");
        sp_jw_arr(w);
        if (done) write_part(w, it, true);
        sp_jw_end(w);
        break;
    case SP_API_ITEM_TOOL:
        sp_jw_key(w, "call_id");
        sp_jw_str(w, it->call_id);
        sp_jw_key(w, "name");
        sp_jw_str(w, it->name ? it->name : "");
        sp_jw_key(w, "arguments");
        if (done)
            write_arguments(w, it);
        else
            sp_jw_str(w, "");
        break;
    }
    sp_jw_end(w);
}

/* The response object. status: "in_progress", "completed", "incomplete",
 * "failed"; p NULL while in progress (no usage yet); error_msg for failed. */
static void write_response(struct sp_jw *w, const struct sp_api_out *o, const char *status,
                           const struct sp_req_progress *p, const char *error_msg) {
    sp_jw_obj(w);
    sp_jw_key(w, "id");
    sp_jw_str(w, o->id);
    sp_jw_key(w, "object");
    sp_jw_str(w, "response");
    sp_jw_key(w, "created_at");
    sp_jw_int(w, o->created);
    sp_jw_key(w, "status");
    sp_jw_str(w, status);
    sp_jw_key(w, "background");
    sp_jw_bool(w, false);
    sp_jw_key(w, "error");
    if (error_msg) {
        sp_jw_obj(w);
        sp_jw_key(w, "code");
        sp_jw_str(w, "server_error");
        sp_jw_key(w, "message");
        sp_jw_str(w, error_msg);
        sp_jw_end(w);
    } else {
        sp_jw_null(w);
    }
    sp_jw_key(w, "incomplete_details");
    if (!strcmp(status, "incomplete")) {
        sp_jw_obj(w);
        sp_jw_key(w, "reason");
        sp_jw_str(w, "max_output_tokens");
        sp_jw_end(w);
    } else {
        sp_jw_null(w);
    }
    sp_jw_key(w, "model");
    sp_jw_str(w, o->model);
    sp_jw_key(w, "output");
    sp_jw_arr(w);
    for (int i = 0; i < o->n_items && p; i++) write_item(w, &o->items[i], true);
    sp_jw_end(w);
    for (const cJSON *x = o->echo ? o->echo->child : NULL; x; x = x->next) {
        sp_jw_key(w, x->string);
        sp_jw_cjson(w, x);
    }
    sp_jw_key(w, "previous_response_id");
    sp_jw_null(w);
    sp_jw_key(w, "store");
    sp_jw_bool(w, false);
    sp_jw_key(w, "truncation");
    sp_jw_str(w, "disabled");
    sp_jw_key(w, "usage");
    if (p) {
        sp_jw_obj(w);
        sp_jw_key(w, "input_tokens");
        sp_jw_int(w, p->prompt_tokens);
        sp_jw_key(w, "input_tokens_details");
        sp_jw_obj(w);
        sp_jw_key(w, "cached_tokens");
        sp_jw_int(w, p->cached_tokens);
        sp_jw_end(w);
        sp_jw_key(w, "output_tokens");
        sp_jw_int(w, p->completion_tokens);
        sp_jw_key(w, "output_tokens_details");
        sp_jw_obj(w);
        sp_jw_key(w, "reasoning_tokens");
        sp_jw_int(w, sp_api_reasoning_tokens(o, p));
        sp_jw_end(w);
        sp_jw_key(w, "total_tokens");
        sp_jw_int(w, p->prompt_tokens + p->completion_tokens);
        sp_jw_end(w);
    } else {
        sp_jw_null(w);
    }
    sp_jw_end(w);
}

/* An event: opens its object with type and sequence_number; event_send
 * closes it and appends it to sse. */
static void event_begin(struct sp_api_out *o, struct sp_jw *w, struct sp_buf *b, const char *type) {
    sp_buf_clear(b);
    sp_jw_init(w, b, 0);
    sp_jw_obj(w);
    sp_jw_key(w, "type");
    sp_jw_str(w, type);
    sp_jw_key(w, "sequence_number");
    sp_jw_int(w, o->seq++);
}

static void event_send(struct sp_jw *w, struct sp_buf *b, struct sp_buf *sse, const char *type) {
    sp_jw_end(w);
    sp_api_sse(sse, type, b);
}

/* item_id, output_index and (for parts) content_index */
static void event_where(struct sp_jw *w, const struct sp_api_item *it, int i, bool part) {
    sp_jw_key(w, "item_id");
    sp_jw_str(w, it->id);
    sp_jw_key(w, "output_index");
    sp_jw_int(w, i);
    if (part) {
        sp_jw_key(w, "content_index");
        sp_jw_int(w, 0);
    }
}

static void response_event(struct sp_api_out *o, struct sp_buf *sse, const char *type, const char *status,
                           const struct sp_req_progress *p, const char *error_msg) {
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    event_begin(o, &w, &b, type);
    sp_jw_key(&w, "response");
    write_response(&w, o, status, p, error_msg);
    event_send(&w, &b, sse, type);
    sp_buf_free(&b);
}

void sp_api_responses_begin(struct sp_api_out *o, struct sp_buf *sse) {
    response_event(o, sse, "response.created", "in_progress", NULL, NULL);
    response_event(o, sse, "response.in_progress", "in_progress", NULL, NULL);
}

void sp_api_responses_open(struct sp_api_out *o, int i, struct sp_buf *sse) {
    if (!sse) return;
    const struct sp_api_item *it = &o->items[i];
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    event_begin(o, &w, &b, "response.output_item.added");
    sp_jw_key(&w, "output_index");
    sp_jw_int(&w, i);
    sp_jw_key(&w, "item");
    write_item(&w, it, false);
    event_send(&w, &b, sse, "response.output_item.added");
    if (it->kind != SP_API_ITEM_TOOL) {
        event_begin(o, &w, &b, "response.content_part.added");
        event_where(&w, it, i, true);
        sp_jw_key(&w, "part");
        write_part(&w, it, false);
        event_send(&w, &b, sse, "response.content_part.added");
    }
    sp_buf_free(&b);
}

void sp_api_responses_delta(struct sp_api_out *o, int i, const char *text, size_t len, struct sp_buf *sse) {
    if (!sse) return;
    const struct sp_api_item *it = &o->items[i];
    const char *type = it->kind == SP_API_ITEM_MESSAGE     ? "response.output_text.delta"
                       : it->kind == SP_API_ITEM_REASONING ? "response.reasoning_text.delta"
                                                           : "response.function_call_arguments.delta";
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    event_begin(o, &w, &b, type);
    event_where(&w, it, i, it->kind != SP_API_ITEM_TOOL);
    sp_jw_key(&w, "delta");
    sp_jw_strn(&w, text, len);
    if (it->kind == SP_API_ITEM_MESSAGE) {
        sp_jw_key(&w, "logprobs");
        sp_jw_arr(&w);
        sp_jw_end(&w);
    }
    event_send(&w, &b, sse, type);
    sp_buf_free(&b);
}

void sp_api_responses_close(struct sp_api_out *o, int i, struct sp_buf *sse) {
    if (!sse) return;
    const struct sp_api_item *it = &o->items[i];
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    if (it->kind == SP_API_ITEM_TOOL) {
        event_begin(o, &w, &b, "response.function_call_arguments.done");
        event_where(&w, it, i, false);
        sp_jw_key(&w, "name");
        sp_jw_str(&w, it->name ? it->name : "");
        sp_jw_key(&w, "arguments");
        write_arguments(&w, it);
        event_send(&w, &b, sse, "response.function_call_arguments.done");
    } else {
        const char *type =
            it->kind == SP_API_ITEM_MESSAGE ? "response.output_text.done" : "response.reasoning_text.done";
        event_begin(o, &w, &b, type);
        event_where(&w, it, i, true);
        sp_jw_key(&w, "text");
        sp_jw_strn(&w, it->text.data ? it->text.data : "", it->text.len);
        if (it->kind == SP_API_ITEM_MESSAGE) {
            sp_jw_key(&w, "logprobs");
            sp_jw_arr(&w);
            sp_jw_end(&w);
        }
        event_send(&w, &b, sse, type);
        event_begin(o, &w, &b, "response.content_part.done");
        event_where(&w, it, i, true);
        sp_jw_key(&w, "part");
        write_part(&w, it, true);
        event_send(&w, &b, sse, "response.content_part.done");
    }
    event_begin(o, &w, &b, "response.output_item.done");
    sp_jw_key(&w, "output_index");
    sp_jw_int(&w, i);
    sp_jw_key(&w, "item");
    write_item(&w, it, true);
    event_send(&w, &b, sse, "response.output_item.done");
    sp_buf_free(&b);
}

static const char *final_status(const struct sp_req_progress *p) {
    return p->finish == SP_FINISH_LENGTH ? "incomplete" : "completed";
}

void sp_api_responses_end(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *sse) {
    const char *status = final_status(p);
    const char *type = !strcmp(status, "completed") ? "response.completed" : "response.incomplete";
    response_event(o, sse, type, status, p, NULL);
}

void sp_api_responses_fail(struct sp_api_out *o, const char *code, const char *msg, const struct sp_req_progress *p,
                           struct sp_buf *sse) {
    response_event(o, sse, "response.failed", "failed", p, msg);
}

void sp_api_responses_body(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *b) {
    struct sp_jw w;
    sp_jw_init(&w, b, 0);
    write_response(&w, o, final_status(p), p, NULL);
}
