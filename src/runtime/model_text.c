/* model_text.c - tokenizers and chat templates of folders and GGUF files (model_text.h). */
#include "runtime/model_text.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/file.h"
#include "format/gguf.h"
#include "format/gguf_model.h"
#include "format/gguf_vocab.h"

static bool is_gguf(const char *model) { return sp_gguf_model_path(model) && sp_path_is_file(model); }

bool sp_model_has_tokenizer(const char *model) {
    if (is_gguf(model)) {
        struct sp_gguf_file *f = NULL;
        bool has = sp_gguf_open(model, &f) == SP_OK && sp_gguf_find_kv(f, "tokenizer.ggml.tokens");
        sp_gguf_close(f);
        sp_error_clear();
        return has;
    }
    if (!sp_path_is_dir(model)) return sp_path_is_file(model);
    char *tj = sp_path_join(model, "tokenizer.json");
    bool has = tj && sp_path_is_file(tj);
    sp_free(tj);
    return has;
}

enum sp_status sp_model_tokenizer_load(const char *model, struct sp_tokenizer **out) {
    *out = NULL;
    if (!is_gguf(model)) return sp_tokenizer_load(model, out);
    struct sp_gguf_file *f;
    enum sp_status st = sp_gguf_open(model, &f);
    if (st != SP_OK) return st;
    char *json = NULL, *cfg = NULL;
    size_t json_len = 0, cfg_len = 0;
    st = sp_gguf_tokenizer_json(f, &json, &json_len, &cfg, &cfg_len);
    if (st == SP_OK && (st = sp_tokenizer_load_mem(json, json_len, cfg, cfg_len, out)) != SP_OK)
        sp_error_prefix("%s: ", model);
    sp_free(json);
    sp_free(cfg);
    sp_gguf_close(f);
    return st;
}

enum sp_status sp_model_chat_template_load(const char *model, const char *name, struct sp_chat_template **out) {
    *out = NULL;
    if (!is_gguf(model)) return sp_chat_template_load(model, name, out);
    struct sp_gguf_file *f;
    enum sp_status st = sp_gguf_open(model, &f);
    if (st != SP_OK) return st;
    char key[160], *tok[2] = {NULL, NULL};
    bool named = name && strcmp(name, "default") != 0;
    snprintf(key, sizeof key, "tokenizer.chat_template%s%s", named ? "." : "", named ? name : "");
    struct sp_gguf_str src;
    const struct sp_gguf_kv *tokens;
    if ((st = sp_gguf_get_str(f, key, &src)) != SP_OK) {
        if (st == SP_ERR_NOT_FOUND) st = sp_errorf(SP_ERR_NOT_FOUND, "%s: no %s in the GGUF's metadata", model, key);
        goto done;
    }
    if (sp_gguf_get_arr(f, "tokenizer.ggml.tokens", SP_GGUF_VTYPE_STRING, &tokens) == SP_OK) {
        static const char *const ids[2] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"};
        for (int i = 0; i < 2; i++) {
            int64_t id;
            if (sp_gguf_get_int(f, ids[i], 0, tokens->count - 1, &id) != SP_OK) continue;
            struct sp_gguf_str s = sp_gguf_arr_str(tokens, id);
            if (!(tok[i] = sp_strndup(s.data, s.len, SP_MEM_TOKENIZER))) {
                st = sp_errorf(SP_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
    }
    sp_error_clear();
    if ((st = sp_chat_template_from_string(src.data, src.len, tok[0], tok[1], out)) != SP_OK)
        sp_error_prefix("%s: ", model);
    else if (named)
        st = sp_chat_template_name(out, name);
done:
    sp_free(tok[0]);
    sp_free(tok[1]);
    sp_gguf_close(f);
    return st;
}
