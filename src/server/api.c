/*
 * api.c - the output of the Responses and Anthropic APIs as a list of items
 * built from the chat parser's events, handed to each API's writer; and the
 * small helpers both request translations share.
 */
#include "server/api_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

/* ---- helpers ---- */

bool sp_api_fail(struct sp_api_err *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    return false;
}

const cJSON *sp_api_field(const cJSON *o, const char *k) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

void sp_api_name_tool(cJSON *chat, const char *name) {
    cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name);
}

bool sp_api_template_thinks(const char *template_source) {
    return template_source && strstr(template_source, "enable_thinking");
}

void sp_api_add_text_part(cJSON *msg, const char *text) {
    cJSON *parts = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!cJSON_IsArray(parts)) {
        cJSON_DeleteItemFromObjectCaseSensitive(msg, "content");
        parts = cJSON_AddArrayToObject(msg, "content");
        if (!parts) return;
    }
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddItemToArray(parts, p);
}

void sp_api_set_kwarg(cJSON *chat, const char *key, cJSON *value) {
    cJSON *kw = cJSON_GetObjectItemCaseSensitive(chat, "chat_template_kwargs");
    if (!kw) kw = cJSON_AddObjectToObject(chat, "chat_template_kwargs");
    if (!kw) {
        cJSON_Delete(value);
        return;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(kw, key);
    cJSON_AddItemToObject(kw, key, value);
}

void sp_api_sse(struct sp_buf *sse, const char *event, const struct sp_buf *json) {
    sp_buf_printf(sse, "event: %s\ndata: ", event);
    sp_buf_append(sse, json->data ? json->data : "{}", json->data ? json->len : 2);
    sp_buf_puts(sse, "\n\n");
}

int64_t sp_api_reasoning_tokens(const struct sp_api_out *o, const struct sp_req_progress *p) {
    int64_t n = 0;
    for (int i = 0; i < o->n_items && o->tok; i++) {
        const struct sp_api_item *it = &o->items[i];
        if (it->kind != SP_API_ITEM_REASONING || !it->text.len) continue;
        struct sp_ids ids = {0};
        if (sp_tokenizer_encode(o->tok, it->text.data, it->text.len, 0, &ids) == SP_OK) n += ids.n;
        sp_ids_free(&ids);
    }
    return n < p->completion_tokens ? n : p->completion_tokens;
}

bool sp_api_has_tool_calls(const struct sp_api_out *o) {
    for (int i = 0; i < o->n_items; i++)
        if (o->items[i].kind == SP_API_ITEM_TOOL) return true;
    return false;
}

const char *sp_api_param(enum sp_api api, const char *chat_param) {
    static const char *const names[][3] = {
        /* chat field            Responses               Anthropic */
        {"messages", "input", "messages"},
        {"max_tokens", "max_output_tokens", "max_tokens"},
        {"response_format", "text.format", "response_format"},
        {"chat_template_kwargs", "reasoning", "thinking"},
        {"reasoning_effort", "reasoning.effort", "thinking"},
        {"stop", "stop", "stop_sequences"},
    };
    if (!chat_param || api == SP_API_CHAT) return chat_param;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(names[i][0], chat_param)) return names[i][api == SP_API_RESPONSES ? 1 : 2];
    return chat_param;
}

const char *sp_api_id_prefix(enum sp_api api) {
    return api == SP_API_RESPONSES ? "resp_" : api == SP_API_ANTHROPIC ? "msg_" : "chatcmpl-";
}

/* ---- the output ---- */

enum sp_status sp_api_out_new(const struct sp_api_out_info *info, struct sp_api_out **out) {
    *out = NULL;
    struct sp_api_out *o = sp_calloc(1, sizeof *o, SP_MEM_SERVER);
    if (!o) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    o->api = info->api;
    snprintf(o->id, sizeof o->id, "%s", info->id);
    o->model = info->model;
    o->created = info->created;
    o->prompt_tokens = info->prompt_tokens;
    o->tok = info->tok;
    o->open = -1;
    if (o->api == SP_API_RESPONSES) {
        o->echo = sp_api_responses_echo(info->request);
        if (!o->echo) goto nomem;
    } else {
        const cJSON *st = sp_api_field(info->request, "stop_sequences");
        for (const cJSON *x = cJSON_IsArray(st) ? st->child : NULL; x && o->n_stops < SP_MAX_STOPS; x = x->next) {
            if (!cJSON_IsString(x) || !*x->valuestring) continue;
            if (!(o->stops[o->n_stops] = sp_strdup(x->valuestring, SP_MEM_SERVER))) goto nomem;
            o->n_stops++;
        }
    }
    *out = o;
    return SP_OK;
nomem:
    sp_api_out_free(o);
    return sp_errorf(SP_ERR_NOMEM, "out of memory");
}

void sp_api_out_free(struct sp_api_out *o) {
    if (!o) return;
    for (int i = 0; i < o->n_items; i++) {
        sp_free(o->items[i].name);
        sp_buf_free(&o->items[i].text);
    }
    sp_free(o->items);
    for (int i = 0; i < o->n_stops; i++) sp_free(o->stops[i]);
    cJSON_Delete(o->echo);
    sp_free(o);
}

static void hook_open(struct sp_api_out *o, int i, struct sp_buf *sse) {
    if (o->api == SP_API_RESPONSES)
        sp_api_responses_open(o, i, sse);
    else
        sp_api_anthropic_open(o, i, sse);
}

static void hook_delta(struct sp_api_out *o, int i, const char *text, size_t len, struct sp_buf *sse) {
    if (o->api == SP_API_RESPONSES)
        sp_api_responses_delta(o, i, text, len, sse);
    else
        sp_api_anthropic_delta(o, i, text, len, sse);
}

static void hook_close(struct sp_api_out *o, int i, struct sp_buf *sse) {
    if (o->api == SP_API_RESPONSES)
        sp_api_responses_close(o, i, sse);
    else
        sp_api_anthropic_close(o, i, sse);
}

static void close_open(struct sp_api_out *o, bool incomplete, struct sp_buf *sse) {
    if (o->open < 0) return;
    o->items[o->open].incomplete = incomplete;
    hook_close(o, o->open, sse);
    o->open = -1;
}

/* A new item of the kind, opened (the one before it closed); its index, or
 * -1 when out of memory. Item ids: the kind's prefix, then the response
 * id's random part and the item's number. */
static int open_item(struct sp_api_out *o, enum sp_api_item_kind kind, const struct sp_chat_event *ev,
                     struct sp_buf *sse) {
    close_open(o, false, sse);
    if (o->n_items == o->cap_items) {
        int cap = o->cap_items ? 2 * o->cap_items : 4;
        struct sp_api_item *v = o->items ? sp_realloc(o->items, (size_t)cap * sizeof *v)
                                         : sp_malloc((size_t)cap * sizeof *v, SP_MEM_SERVER);
        if (!v) return -1;
        o->items = v;
        o->cap_items = cap;
    }
    int i = o->n_items;
    struct sp_api_item *it = &o->items[i];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    const char *rnd = strchr(o->id, '_');
    rnd = rnd ? rnd + 1 : o->id;
    if (kind == SP_API_ITEM_TOOL) {
        it->tool_index = ev->tool_index;
        snprintf(it->call_id, sizeof it->call_id, "%s", ev->id ? ev->id : "");
        it->name = sp_strndup(ev->text, ev->len, SP_MEM_SERVER);
        if (!it->name) return -1;
        const char *cid = strncmp(it->call_id, "call_", 5) ? it->call_id : it->call_id + 5;
        if (o->api == SP_API_ANTHROPIC)
            snprintf(it->id, sizeof it->id, "toolu_%s", cid);
        else
            snprintf(it->id, sizeof it->id, "fc_%s", cid);
    } else if (o->api == SP_API_RESPONSES) {
        snprintf(it->id, sizeof it->id, "%s%s%02x", kind == SP_API_ITEM_MESSAGE ? "msg_" : "rs_", rnd, i & 0xff);
    }
    o->n_items++;
    o->open = i;
    hook_open(o, i, sse);
    return i;
}

void sp_api_out_begin(struct sp_api_out *o, struct sp_buf *sse) {
    if (o->api == SP_API_RESPONSES)
        sp_api_responses_begin(o, sse);
    else
        sp_api_anthropic_begin(o, sse);
}

void sp_api_out_events(struct sp_api_out *o, const struct sp_chat_event *ev, size_t n, struct sp_buf *sse) {
    for (size_t k = 0; k < n; k++) {
        const struct sp_chat_event *e = &ev[k];
        int i = -1;
        switch (e->kind) {
        case SP_CHAT_EV_CONTENT:
        case SP_CHAT_EV_REASONING: {
            enum sp_api_item_kind kind = e->kind == SP_CHAT_EV_CONTENT ? SP_API_ITEM_MESSAGE : SP_API_ITEM_REASONING;
            i = o->open >= 0 && o->items[o->open].kind == kind ? o->open : open_item(o, kind, e, sse);
            break;
        }
        case SP_CHAT_EV_TOOL_BEGIN:
            open_item(o, SP_API_ITEM_TOOL, e, sse);
            continue;  // the name is not arguments text
        case SP_CHAT_EV_TOOL_ARGS:
            for (int t = o->n_items - 1; t >= 0 && i < 0; t--)
                if (o->items[t].kind == SP_API_ITEM_TOOL && o->items[t].tool_index == e->tool_index) i = t;
            break;
        default:
            break;
        }
        if (i < 0 || !e->len) continue;
        sp_buf_append(&o->items[i].text, e->text, e->len);
        hook_delta(o, i, e->text, e->len, sse);
    }
}

void sp_api_out_end(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *sse) {
    close_open(o, p->finish == SP_FINISH_LENGTH, sse);
    if (o->api == SP_API_RESPONSES)
        sp_api_responses_end(o, p, sse);
    else
        sp_api_anthropic_end(o, p, sse);
}

void sp_api_out_fail(struct sp_api_out *o, const char *code, const char *msg, const struct sp_req_progress *p,
                     struct sp_buf *sse) {
    close_open(o, true, sse);
    if (o->api == SP_API_RESPONSES)
        sp_api_responses_fail(o, code, msg, p, sse);
    else
        sp_api_anthropic_fail(o, code, msg, p, sse);
}

enum sp_status sp_api_out_parse(struct sp_api_out *o, const struct sp_chat_parse_opts *popts, const char *text,
                                size_t len) {
    struct sp_chat_parser *ps;
    enum sp_status st = sp_chat_parser_new(popts, &ps);
    if (st != SP_OK) return st;
    size_t n;
    const struct sp_chat_event *ev;
    if (len && (st = sp_chat_parser_push(ps, text, len)) == SP_OK) {
        ev = sp_chat_parser_events(ps, &n);
        sp_api_out_events(o, ev, n, NULL);
    }
    if (st == SP_OK && (st = sp_chat_parser_finish(ps)) == SP_OK) {
        ev = sp_chat_parser_events(ps, &n);
        sp_api_out_events(o, ev, n, NULL);
    }
    sp_chat_parser_free(ps);
    return st;
}

void sp_api_out_body(struct sp_api_out *o, const struct sp_req_progress *p, struct sp_buf *b) {
    close_open(o, p->finish == SP_FINISH_LENGTH, NULL);
    if (o->api == SP_API_RESPONSES)
        sp_api_responses_body(o, p, b);
    else
        sp_api_anthropic_body(o, p, b);
}
