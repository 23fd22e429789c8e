/* model_text.c - tokenizers and chat templates of folders and GGUF files (model_text.h). */
#include "runtime/model_text.h"

#include <string.h>

#include "core/alloc.h"
#include "core/file.h"
#include "format/gguf.h"
#include "format/gguf_model.h"
#include "format/gguf_vocab.h"

bool sp_model_has_tokenizer(const char *model) {
    if (sp_gguf_model_file(model)) {
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
    if (!sp_gguf_model_file(model)) return sp_tokenizer_load(model, out);
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
    if (!sp_gguf_model_file(model)) return sp_chat_template_load(model, name, out);
    struct sp_gguf_file *f;
    enum sp_status st = sp_gguf_open(model, &f);
    if (st != SP_OK) return st;
    char *src, *bos, *eos;
    if ((st = sp_gguf_chat_template(f, name, &src, &bos, &eos)) == SP_OK) {
        if ((st = sp_chat_template_from_string(src, strlen(src), bos, eos, out)) != SP_OK)
            sp_error_prefix("%s: ", model);
        else if (name && strcmp(name, "default") != 0)
            st = sp_chat_template_name(out, name);
        sp_free(src);
        sp_free(bos);
        sp_free(eos);
    }
    sp_gguf_close(f);
    return st;
}
