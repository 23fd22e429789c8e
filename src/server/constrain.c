/*
 * constrain.c - grammars for response_format and forced tool calls (see
 * constrain.h).
 */
#include "server/constrain.h"

#include <stdio.h>
#include <string.h>

#include "core/buf.h"
#include "core/json.h"
#include "server/jschema.h"

static bool fail(char *msg, size_t cap, const char *text) {
    snprintf(msg, cap, "%s", text);
    return false;
}

bool sp_response_format_grammar(const cJSON *rf, struct sp_grammar **out, char *msg, size_t cap) {
    *out = NULL;
    const cJSON *type = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (!cJSON_IsString(type)) return fail(msg, cap, "'response_format' must be an object with a string 'type'");
    if (!strcmp(type->valuestring, "text")) return true;
    const cJSON *schema = NULL;
    if (!strcmp(type->valuestring, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        if (!cJSON_IsObject(js)) return fail(msg, cap, "'response_format.json_schema' must be an object");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
        if (name && !cJSON_IsString(name)) return fail(msg, cap, "'response_format.json_schema.name' must be a string");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
        if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
            return fail(msg, cap, "'response_format.json_schema.strict' must be a boolean");
        schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (schema && !cJSON_IsObject(schema) && !cJSON_IsBool(schema))
            return fail(msg, cap, "'response_format.json_schema.schema' must be a JSON Schema object");
    } else if (strcmp(type->valuestring, "json_object")) {
        return fail(msg, cap, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
    if (sp_jschema_grammar(schema, "response_format.json_schema.schema", out) != SP_OK)
        return fail(msg, cap, sp_error_msg());
    return true;
}

/* The function object of a tool entry, or NULL. */
static const cJSON *tool_function(const cJSON *t, const char **name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *n = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
    if (!cJSON_IsString(n)) return NULL;
    *name = n->valuestring;
    return f;
}

/* A rule of the literal text. */
static int literal(struct sp_gbuild *b, const char *text, size_t n) {
    int r = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_bytes(b, text, n);
    sp_gb_end(b, r);
    return r;
}

/* Qwen3-Coder's parameters: each declared one, in order (the optional ones
 * may be left out), as <parameter=NAME>\nVALUE\n</parameter>\n, where the
 * value of a string parameter is raw text (one of its enum values when it
 * has them) and any other value is JSON held to the parameter's schema. */
static int xml_params(struct sp_jschema *c, struct sp_gbuild *b, const cJSON *params, const char *where) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required");
    int rest = sp_gb_rule(b);  // the parameters from the current one on
    sp_gb_begin(b);
    sp_gb_end(b, rest);
    int n = cJSON_IsObject(props) ? cJSON_GetArraySize(props) : 0;
    for (int i = n - 1; i >= 0; i--) {
        const cJSON *p = cJSON_GetArrayItem(props, i);
        char at[300];
        snprintf(at, sizeof at, "%s.properties.%s", where, p->string);
        int value;
        const cJSON *en = cJSON_GetObjectItemCaseSensitive(p, "enum");
        if (sp_chat_param_is_text(p) && cJSON_IsArray(en) && en->child) {
            value = sp_gb_rule(b);
            for (const cJSON *v = en->child; v; v = v->next)
                if (cJSON_IsString(v)) {
                    sp_gb_begin(b);
                    sp_gb_lit(b, v->valuestring);
                    sp_gb_end(b, value);
                }
        } else if (sp_chat_param_is_text(p)) {
            value = sp_jschema_text(c, "<");
        } else if ((value = sp_jschema_rule(c, p, at)) < 0) {
            return -1;
        }
        bool required = false;
        for (const cJSON *r = cJSON_IsArray(req) ? req->child : NULL; r; r = r->next)
            required |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        struct sp_buf open = SP_BUF_INIT;
        sp_buf_printf(&open, "<parameter=%s>\n", p->string);
        int next = sp_gb_rule(b);
        sp_gb_begin(b);
        sp_gb_bytes(b, open.data ? open.data : "", open.len);
        sp_gb_ref(b, value);
        sp_gb_lit(b, "\n</parameter>\n");
        sp_gb_ref(b, rest);
        sp_gb_end(b, next);
        if (!required) {
            sp_gb_begin(b);
            sp_gb_ref(b, rest);
            sp_gb_end(b, next);
        }
        sp_buf_free(&open);
        rest = next;
    }
    return rest;
}

/* The arguments of one function in the format's form. */
static int arguments(struct sp_jschema *c, struct sp_gbuild *b, enum sp_chat_format format, const cJSON *fn, int index) {
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    char where[64];
    snprintf(where, sizeof where, "tools[%d].function.parameters", index);
    if (format == SP_CHAT_FORMAT_QWEN3_CODER) return xml_params(c, b, params, where);
    if (!params || (cJSON_IsObject(params) && !params->child)) return sp_jschema_any_object(c);
    return sp_jschema_rule(c, params, where);
}

bool sp_tool_call_grammar(enum sp_chat_format format, const cJSON *tools, const char *name, struct sp_grammar **out,
                          char *msg, size_t cap) {
    *out = NULL;
    if (format != SP_CHAT_FORMAT_HERMES && format != SP_CHAT_FORMAT_HARMONY && format != SP_CHAT_FORMAT_QWEN3_CODER)
        return fail(msg, cap, "this chat format has no way to force a tool call");
    struct sp_gbuild *b = sp_gb_new();
    struct sp_jschema *c = sp_jschema_new(b);
    if (!c) {
        sp_gb_free(b);
        return fail(msg, cap, "out of memory");
    }
    int root = sp_gb_rule(b), index = 0, alts = 0;
    for (const cJSON *t = cJSON_IsArray(tools) ? tools->child : NULL; t; t = t->next, index++) {
        const char *fname;
        const cJSON *fn = tool_function(t, &fname);
        if (!fn || (name && strcmp(fname, name))) continue;
        int args = arguments(c, b, format, fn, index);
        if (args < 0) break;
        sp_gb_begin(b);
        if (!name) {  // the name, then what the format writes between it and the arguments
            struct sp_buf head = SP_BUF_INIT;
            if (format == SP_CHAT_FORMAT_HERMES) {
                struct sp_buf esc = SP_BUF_INIT;
                sp_json_escape(&esc, fname, strlen(fname));  // "name" with its quotes
                sp_buf_append(&head, esc.data + 1, esc.len - 2);
                sp_buf_puts(&head, "\", \"arguments\": ");
                sp_buf_free(&esc);
            } else if (format == SP_CHAT_FORMAT_HARMONY) {
                sp_buf_printf(&head, "%s <|constrain|>json<|message|>", fname);
            } else {
                sp_buf_printf(&head, "%s>\n", fname);
            }
            sp_gb_ref(b, literal(b, head.data ? head.data : "", head.len));
            sp_buf_free(&head);
        }
        sp_gb_ref(b, args);
        sp_gb_end(b, root);
        alts++;
    }
    if (*sp_jschema_error(c)) {
        snprintf(msg, cap, "%s", sp_jschema_error(c));
        sp_jschema_free(c);
        sp_gb_free(b);
        return false;
    }
    sp_jschema_free(c);
    if (!alts) {
        sp_gb_free(b);
        return fail(msg, cap, "'tools' declares no function to call");
    }
    if (sp_gb_finish(b, root, out) != SP_OK) return fail(msg, cap, sp_error_msg());
    return true;
}
