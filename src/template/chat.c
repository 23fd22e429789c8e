/*
 * chat.c - locating a model's chat template and rendering conversations
 * with the variables transformers passes (see chat.h).
 */
#include "template/chat.h"

#include <string.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/json.h"

#define MAX_TEMPLATE_BYTES ((size_t)4 << 20)
#define MAX_CONFIG_BYTES   ((size_t)64 << 20)

/* A special token as tokenizer_config.json writes it: "text" or
 * {"content": "text", ...}. NULL when absent or null. */
static const char *token_text(const cJSON *cfg, const char *key) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(t)) return t->valuestring;
    if (cJSON_IsObject(t)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(t, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

enum sp_status sp_chat_template_from_string(const char *src, size_t len, const char *bos_token, const char *eos_token,
                                            struct sp_chat_template **out) {
    *out = NULL;
    enum sp_status st;
    struct sp_chat_template *ct = sp_calloc(1, sizeof *ct, SP_MEM_TOKENIZER);
    if (!ct) return sp_errorf(SP_ERR_NOMEM, "out of memory loading a chat template");
    if (!(ct->source = sp_strndup(src, len, SP_MEM_TOKENIZER)) ||
        !(ct->name = sp_strdup("default", SP_MEM_TOKENIZER)) ||
        (bos_token && !(ct->bos_token = sp_strdup(bos_token, SP_MEM_TOKENIZER))) ||
        (eos_token && !(ct->eos_token = sp_strdup(eos_token, SP_MEM_TOKENIZER)))) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory loading a chat template");
        goto fail;
    }
    if ((st = sp_jinja_compile(src, len, &ct->tmpl)) != SP_OK) goto fail;
    ct->content_parts = sp_jinja_loops_over(ct->tmpl, "content");
    *out = ct;
    return SP_OK;
fail:
    sp_chat_template_free(ct);
    return st;
}

/* Picks the template text out of tokenizer_config.json's chat_template. */
static enum sp_status pick_template(const cJSON *value, const char *name, const char **text, const char **chosen) {
    const char *want = name ? name : "default";
    if (cJSON_IsString(value)) {
        if (name && strcmp(name, "default") != 0)
            return sp_errorf(SP_ERR_NOT_FOUND, "tokenizer_config.json has one unnamed chat template, not '%s'", name);
        *text = value->valuestring;
        *chosen = "default";
        return SP_OK;
    }
    if (!cJSON_IsArray(value))
        return sp_errorf(SP_ERR_FORMAT, "tokenizer_config.json: chat_template is a %s, expected a string or a list",
                         sp_json_type_name(value));
    const cJSON *item;
    cJSON_ArrayForEach(item, value) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(item, "name");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(item, "template");
        if (cJSON_IsString(n) && cJSON_IsString(t) && strcmp(n->valuestring, want) == 0) {
            *text = t->valuestring;
            *chosen = n->valuestring;
            return SP_OK;
        }
    }
    return sp_errorf(SP_ERR_NOT_FOUND, "tokenizer_config.json has no chat template named '%s'", want);
}

enum sp_status sp_chat_template_name(struct sp_chat_template **ct, const char *name) {
    char *nm = sp_strdup(name, SP_MEM_TOKENIZER);
    if (!nm) {
        sp_chat_template_free(*ct);
        *ct = NULL;
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    sp_free((*ct)->name);
    (*ct)->name = nm;
    return SP_OK;
}

enum sp_status sp_chat_template_load(const char *model_dir, const char *name, struct sp_chat_template **out) {
    *out = NULL;
    enum sp_status st = SP_OK;
    char *jinja_path = sp_path_join(model_dir, "chat_template.jinja");
    char *cfg_path = sp_path_join(model_dir, "tokenizer_config.json");
    char *src = NULL;
    size_t src_len = 0;
    cJSON *cfg = NULL;
    if (!jinja_path || !cfg_path) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (sp_path_is_file(cfg_path) && (st = sp_json_parse_file(cfg_path, MAX_CONFIG_BYTES, &cfg)) != SP_OK) goto fail;
    const char *chosen = "default";
    if (sp_path_is_file(jinja_path) && (!name || strcmp(name, "default") == 0)) {
        if ((st = sp_read_file(jinja_path, MAX_TEMPLATE_BYTES, &src, &src_len)) != SP_OK) goto fail;
    } else {
        const cJSON *value = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (!value || cJSON_IsNull(value)) {
            st = sp_errorf(SP_ERR_NOT_FOUND, "%s: no chat_template.jinja and no chat_template in tokenizer_config.json",
                           model_dir);
            goto fail;
        }
        const char *text = NULL;
        if ((st = pick_template(value, name, &text, &chosen)) != SP_OK) goto fail;
        src_len = strlen(text);
        if (!(src = sp_strndup(text, src_len, SP_MEM_TOKENIZER))) {
            st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    st = sp_chat_template_from_string(src, src_len, token_text(cfg, "bos_token"), token_text(cfg, "eos_token"), out);
    if (st != SP_OK) {
        sp_error_prefix("%s: ", model_dir);
        goto fail;
    }
    st = sp_chat_template_name(out, chosen);
fail:
    sp_free(src);
    cJSON_Delete(cfg);
    sp_free(jinja_path);
    sp_free(cfg_path);
    return st;
}

void sp_chat_template_free(struct sp_chat_template *ct) {
    if (!ct) return;
    sp_jinja_free(ct->tmpl);
    sp_free(ct->source);
    sp_free(ct->name);
    sp_free(ct->bos_token);
    sp_free(ct->eos_token);
    sp_free(ct);
}

/* Tool-call arguments that are text holding a JSON object, parsed; NULL
 * for anything else. */
static cJSON *parsed_arguments(const cJSON *call) {
    const cJSON *args =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(call, "function"), "arguments");
    if (!cJSON_IsString(args)) return NULL;
    cJSON *parsed = cJSON_Parse(args->valuestring);
    if (cJSON_IsObject(parsed)) return parsed;
    cJSON_Delete(parsed);
    return NULL;
}

/* Content given as a list of {"type": "text", "text": ...} parts, joined
 * with newlines (as vLLM does for templates that expect a string); NULL when
 * some part is not text. */
static cJSON *joined_text(const cJSON *content) {
    if (!cJSON_IsArray(content)) return NULL;
    struct sp_buf b = SP_BUF_INIT;
    const cJSON *part;
    int i = 0;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) {
            sp_buf_free(&b);
            return NULL;
        }
        if (i++) sp_buf_putc(&b, '\n');
        sp_buf_puts(&b, text->valuestring);
    }
    cJSON *s = b.failed ? NULL : cJSON_CreateString(b.data ? b.data : "");
    sp_buf_free(&b);
    return s;
}

/* Applies the request's normalizations to one message (in place when
 * `apply`); returns whether anything is (or would be) changed. */
static bool normalize(cJSON *msg, const struct sp_chat_request *req, bool template_takes_parts, bool apply) {
    bool changed = false;
    cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (req->null_content_as_empty && cJSON_IsNull(content)) {
        changed = true;
        if (apply) cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateString(""));
    } else if (req->flatten_content_parts && !template_takes_parts && cJSON_IsArray(content)) {
        cJSON *joined = joined_text(content);
        if (joined) {
            changed = true;
            if (apply)
                cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", joined);
            else
                cJSON_Delete(joined);
        }
    }
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (req->parse_tool_arguments && cJSON_IsArray(calls)) {
        const cJSON *call;
        cJSON_ArrayForEach(call, calls) {
            cJSON *parsed = parsed_arguments(call);
            if (!parsed) continue;
            changed = true;
            if (apply)
                cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(call, "function"), "arguments",
                                                       parsed);
            else
                cJSON_Delete(parsed);
        }
    }
    return changed;
}

/* A copy of messages with the request's normalizations applied, or NULL
 * when none changes anything. */
static enum sp_status normalized_messages(const struct sp_chat_template *ct, const struct sp_chat_request *req,
                                          cJSON **out) {
    *out = NULL;
    if (!req->parse_tool_arguments && !req->null_content_as_empty && !req->flatten_content_parts) return SP_OK;
    // cJSON's allocator hooks are installed by the first sp_json_parse; make
    // sure that happened before any node is made here, so all are freed alike.
    cJSON *probe;
    if (sp_json_parse("null", 4, "probe", &probe) == SP_OK) cJSON_Delete(probe);
    bool any = false;
    const cJSON *m;
    cJSON_ArrayForEach(m, req->messages) any = any || normalize((cJSON *)m, req, ct->content_parts, false);
    if (!any) return SP_OK;
    cJSON *copy = cJSON_Duplicate(req->messages, true);
    if (!copy) return sp_errorf(SP_ERR_NOMEM, "out of memory rendering a chat template");
    cJSON *mm;
    cJSON_ArrayForEach(mm, copy) normalize(mm, req, ct->content_parts, true);
    *out = copy;
    return SP_OK;
}

enum sp_status sp_chat_render(const struct sp_chat_template *ct, const struct sp_chat_request *req, char **out,
                              size_t *out_len) {
    *out = NULL;
    if (!cJSON_IsArray(req->messages)) return sp_errorf(SP_ERR_ARG, "messages must be an array");
    if (req->kwargs && !cJSON_IsObject(req->kwargs) && !cJSON_IsNull(req->kwargs))
        return sp_errorf(SP_ERR_ARG, "chat template kwargs must be an object");
    enum sp_status st = SP_ERR_NOMEM;
    int64_t n_kw = req->kwargs ? cJSON_GetArraySize(req->kwargs) : 0;
    struct sp_jinja_var *vars = sp_malloc((size_t)(n_kw + 5) * sizeof *vars, SP_MEM_TOKENIZER);
    // The small variables are cJSON nodes on the stack: nothing to allocate or free.
    const cJSON agp = {.type = req->add_generation_prompt ? cJSON_True : cJSON_False};
    const cJSON null = {.type = cJSON_NULL};
    const cJSON bos = {.type = cJSON_String, .valuestring = ct->bos_token};
    const cJSON eos = {.type = cJSON_String, .valuestring = ct->eos_token};
    cJSON *parsed = NULL;
    if (!vars) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory rendering a chat template");
        goto fail;
    }
    if ((st = normalized_messages(ct, req, &parsed)) != SP_OK) goto fail;
    int64_t n = 0;
    vars[n++] = (struct sp_jinja_var){"messages", parsed ? parsed : req->messages};
    vars[n++] = (struct sp_jinja_var){"tools", req->tools ? req->tools : &null};
    vars[n++] = (struct sp_jinja_var){"add_generation_prompt", &agp};
    if (ct->bos_token) vars[n++] = (struct sp_jinja_var){"bos_token", &bos};
    if (ct->eos_token) vars[n++] = (struct sp_jinja_var){"eos_token", &eos};
    // kwargs come last so they override, as **template_kwargs does.
    if (req->kwargs)
        for (const cJSON *c = req->kwargs->child; c; c = c->next)
            if (c->string) vars[n++] = (struct sp_jinja_var){c->string, c};
    st = sp_jinja_render(ct->tmpl, vars, n, &ct->opts, out, out_len);
fail:
    sp_free(vars);
    cJSON_Delete(parsed);
    return st;
}
