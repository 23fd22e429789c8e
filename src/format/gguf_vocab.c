/* gguf_vocab.c - GGUF vocabularies as tokenizer.json (gguf_vocab.h). */
#include "format/gguf_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/json.h"
#include "core/strmap.h"
#include "format/gguf.h"

/* llama.cpp's token types */
enum { TYPE_NORMAL = 1, TYPE_UNKNOWN = 2, TYPE_CONTROL = 3, TYPE_USER = 4 };

/* What Hugging Face's converter gives a SentencePiece BPE vocabulary around the model. */
static const char SPM_NORMALIZER[] =
    "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}, {\"type\": "
    "\"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}";
static const char SPM_DECODER[] =
    "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, "
    "\"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": "
    "\" \", \"start\": 1, \"stop\": 0}]}";

/* The vocabulary's arrays. */
struct vocab {
    const struct sp_gguf_kv *tokens, *scores, *types;
    int64_t n;
};

struct merge {
    int64_t l, r, merged;
    float score;
};

static int merge_cmp(const void *a, const void *b) {
    const struct merge *x = a, *y = b;
    /* the higher score of the merged piece first; then by ids */
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->merged != y->merged) return x->merged < y->merged ? -1 : 1;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return x->r < y->r ? -1 : (x->r > y->r);
}

static int64_t type_of(const struct vocab *v, int64_t i) {
    int64_t t = TYPE_NORMAL;
    if (v->types && !sp_gguf_arr_int(v->types, i, &t)) t = -1;
    return t;
}

/* Every split of a normal piece into two normal pieces, best first. */
static enum sp_status spm_merges(const struct vocab *v, struct merge **out, int64_t *n_out) {
    struct sp_strmap ids;
    sp_strmap_init(&ids, SP_MEM_TOKENIZER);
    struct merge *m = NULL;
    int64_t nm = 0, cap = 0;
    enum sp_status st = SP_OK;
    for (int64_t i = 0; i < v->n && st == SP_OK; i++) {
        if (type_of(v, i) != TYPE_NORMAL) continue;
        struct sp_gguf_str s = sp_gguf_arr_str(v->tokens, i);
        st = sp_strmap_put(&ids, s.data, s.len, i);
    }
    for (int64_t i = 0; i < v->n && st == SP_OK; i++) {
        if (type_of(v, i) != TYPE_NORMAL) continue;
        struct sp_gguf_str s = sp_gguf_arr_str(v->tokens, i);
        for (size_t k = 1; k < s.len; k++) {
            int64_t l, r;
            if (!sp_strmap_get(&ids, s.data, k, &l) || !sp_strmap_get(&ids, s.data + k, s.len - k, &r)) continue;
            if (nm == cap) {
                cap = cap ? cap * 2 : 4096;
                struct merge *g =
                    m ? sp_realloc(m, (size_t)cap * sizeof *m) : sp_malloc((size_t)cap * sizeof *m, SP_MEM_TOKENIZER);
                if (!g) {
                    st = sp_errorf(SP_ERR_NOMEM, "out of memory");
                    break;
                }
                m = g;
            }
            m[nm++] = (struct merge){l, r, i, v->scores ? (float)sp_gguf_arr_float(v->scores, i) : 0.0f};
        }
    }
    sp_strmap_free(&ids);
    if (st != SP_OK) {
        sp_free(m);
        return st;
    }
    if (nm) qsort(m, (size_t)nm, sizeof *m, merge_cmp);
    *out = m;
    *n_out = nm;
    return SP_OK;
}

static void jw_piece(struct sp_jw *w, const struct vocab *v, int64_t i) {
    struct sp_gguf_str s = sp_gguf_arr_str(v->tokens, i);
    sp_jw_strn(w, s.data, s.len);
}

static enum sp_status spm_json(const struct sp_gguf_file *f, const struct vocab *v, int64_t unk, struct sp_buf *out) {
    struct merge *m = NULL;
    int64_t nm = 0;
    enum sp_status st = spm_merges(v, &m, &nm);
    if (st != SP_OK) return st;
    cJSON *norm = NULL, *dec = NULL;
    if ((st = sp_json_parse(SPM_NORMALIZER, strlen(SPM_NORMALIZER), "the normalizer", &norm)) != SP_OK ||
        (st = sp_json_parse(SPM_DECODER, strlen(SPM_DECODER), "the decoder", &dec)) != SP_OK) {
        cJSON_Delete(norm);
        sp_free(m);
        return st;
    }
    char *key = NULL;
    struct sp_jw w;
    sp_jw_init(&w, out, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "added_tokens");
    sp_jw_arr(&w);
    for (int64_t i = 0; i < v->n; i++) {
        int64_t t = type_of(v, i);
        if (t != TYPE_UNKNOWN && t != TYPE_CONTROL && t != TYPE_USER) continue;
        sp_jw_obj(&w);
        sp_jw_key(&w, "id");
        sp_jw_int(&w, i);
        sp_jw_key(&w, "content");
        jw_piece(&w, v, i);
        sp_jw_key(&w, "special");
        sp_jw_bool(&w, t != TYPE_USER);
        sp_jw_end(&w);
    }
    sp_jw_end(&w);
    sp_jw_key(&w, "normalizer");
    sp_jw_cjson(&w, norm);
    sp_jw_key(&w, "pre_tokenizer");
    sp_jw_null(&w);
    sp_jw_key(&w, "decoder");
    sp_jw_cjson(&w, dec);
    sp_jw_key(&w, "model");
    sp_jw_obj(&w);
    sp_jw_key(&w, "type");
    sp_jw_str(&w, "BPE");
    sp_jw_key(&w, "unk_token");
    jw_piece(&w, v, unk);
    sp_jw_key(&w, "fuse_unk");
    sp_jw_bool(&w, true);
    sp_jw_key(&w, "byte_fallback");
    sp_jw_bool(&w, true);
    sp_jw_key(&w, "vocab");
    sp_jw_obj(&w);
    for (int64_t i = 0; i < v->n && st == SP_OK; i++) {
        struct sp_gguf_str s = sp_gguf_arr_str(v->tokens, i);
        if (memchr(s.data, 0, s.len)) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%lld] holds a NUL byte", f->path, (long long)i);
            break;
        }
        sp_free(key);
        if (!(key = sp_strndup(s.data, s.len, SP_MEM_TOKENIZER))) {
            st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            break;
        }
        sp_jw_key(&w, key);
        sp_jw_int(&w, i);
    }
    sp_jw_end(&w);
    sp_jw_key(&w, "merges");
    sp_jw_arr(&w);
    for (int64_t i = 0; i < nm; i++) {
        sp_jw_arr(&w);
        jw_piece(&w, v, m[i].l);
        jw_piece(&w, v, m[i].r);
        sp_jw_end(&w);
    }
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_jw_end(&w);
    if (st == SP_OK && out->failed) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    sp_free(key);
    cJSON_Delete(norm);
    cJSON_Delete(dec);
    sp_free(m);
    return st;
}

/* An optional integer key: def where missing. */
static enum sp_status opt_int(const struct sp_gguf_file *f, const char *key, int64_t max, int64_t def, int64_t *out) {
    enum sp_status st = sp_gguf_get_int(f, key, 0, max, out);
    if (st == SP_ERR_NOT_FOUND) {
        sp_error_clear();
        *out = def;
        return SP_OK;
    }
    return st;
}

static enum sp_status opt_bool(const struct sp_gguf_file *f, const char *key, bool def, bool *out) {
    enum sp_status st = sp_gguf_get_bool(f, key, out);
    if (st == SP_ERR_NOT_FOUND) {
        sp_error_clear();
        *out = def;
        return SP_OK;
    }
    return st;
}

enum sp_status sp_gguf_tokenizer_json(const struct sp_gguf_file *f, char **json, size_t *json_len, char **config,
                                      size_t *config_len) {
    *json = *config = NULL;
    *json_len = *config_len = 0;
    struct sp_gguf_str model;
    struct vocab v = {0};
    enum sp_status st = sp_gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (st != SP_OK) return st;
    if (!(model.len == 5 && !memcmp(model.data, "llama", 5)))
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "%s: tokenizer.ggml.model \"%.*s\": only \"llama\" (SentencePiece BPE) "
                         "vocabularies are read from a GGUF so far",
                         f->path, (int)model.len, model.data);
    if ((st = sp_gguf_get_arr(f, "tokenizer.ggml.tokens", SP_GGUF_VTYPE_STRING, &v.tokens)) != SP_OK) return st;
    v.n = v.tokens->count;
    if ((st = sp_gguf_get_arr(f, "tokenizer.ggml.scores", SP_GGUF_VTYPE_FLOAT32, &v.scores)) != SP_OK ||
        (st = sp_gguf_get_arr(f, "tokenizer.ggml.token_type", SP_GGUF_VTYPE_INT32, &v.types)) != SP_OK)
        return st;
    if (v.scores->count != v.n || v.types->count != v.n)
        return sp_errorf(SP_ERR_FORMAT,
                         "%s: tokenizer.ggml.scores (%lld) and token_type (%lld) do not match the %lld "
                         "tokens",
                         f->path, (long long)v.scores->count, (long long)v.types->count, (long long)v.n);
    int64_t unk, bos, eos;
    bool add_bos, add_eos;
    if ((st = opt_int(f, "tokenizer.ggml.unknown_token_id", v.n - 1, 0, &unk)) != SP_OK ||
        (st = opt_int(f, "tokenizer.ggml.bos_token_id", v.n - 1, 1, &bos)) != SP_OK ||
        (st = opt_int(f, "tokenizer.ggml.eos_token_id", v.n - 1, 2, &eos)) != SP_OK ||
        (st = opt_bool(f, "tokenizer.ggml.add_bos_token", true, &add_bos)) != SP_OK ||
        (st = opt_bool(f, "tokenizer.ggml.add_eos_token", false, &add_eos)) != SP_OK)
        return st;
    struct sp_buf jb = SP_BUF_INIT, cb = SP_BUF_INIT;
    if ((st = spm_json(f, &v, unk, &jb)) != SP_OK) {
        sp_buf_free(&jb);
        return st;
    }
    struct sp_jw w;
    sp_jw_init(&w, &cb, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "add_bos_token");
    sp_jw_bool(&w, add_bos);
    sp_jw_key(&w, "add_eos_token");
    sp_jw_bool(&w, add_eos);
    sp_jw_key(&w, "bos_token");
    jw_piece(&w, &v, bos);
    sp_jw_key(&w, "eos_token");
    jw_piece(&w, &v, eos);
    sp_jw_key(&w, "unk_token");
    jw_piece(&w, &v, unk);
    struct sp_gguf_str tmpl;
    if (sp_gguf_get_str(f, "tokenizer.chat_template", &tmpl) == SP_OK) {
        sp_jw_key(&w, "chat_template");
        sp_jw_strn(&w, tmpl.data, tmpl.len);
    }
    sp_error_clear();
    sp_jw_end(&w);
    if (jb.failed || cb.failed) {
        sp_buf_free(&jb);
        sp_buf_free(&cb);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    *json_len = jb.len;
    *json = sp_buf_take(&jb);
    *config_len = cb.len;
    *config = sp_buf_take(&cb);
    return SP_OK;
}

/* The text of the token whose id is at key (0 .. n-1), or NULL where the key is missing. */
static enum sp_status token_text(const struct sp_gguf_file *f, const struct sp_gguf_kv *tokens, const char *key,
                                 char **out) {
    int64_t id;
    enum sp_status st = sp_gguf_get_int(f, key, 0, tokens->count - 1, &id);
    if (st == SP_ERR_NOT_FOUND) {
        sp_error_clear();
        return SP_OK;
    }
    if (st != SP_OK) return st;
    struct sp_gguf_str s = sp_gguf_arr_str(tokens, id);
    return (*out = sp_strndup(s.data, s.len, SP_MEM_TOKENIZER)) ? SP_OK : sp_errorf(SP_ERR_NOMEM, "out of memory");
}

enum sp_status sp_gguf_chat_template(const struct sp_gguf_file *f, const char *name, char **src, char **bos,
                                     char **eos) {
    *src = *bos = *eos = NULL;
    char key[160];
    bool named = name && strcmp(name, "default") != 0;
    snprintf(key, sizeof key, "tokenizer.chat_template%s%s", named ? "." : "", named ? name : "");
    struct sp_gguf_str s;
    const struct sp_gguf_kv *tokens;
    enum sp_status st = sp_gguf_get_str(f, key, &s);
    if (st == SP_ERR_NOT_FOUND) return sp_errorf(SP_ERR_NOT_FOUND, "%s: no %s in the GGUF's metadata", f->path, key);
    if (st != SP_OK) return st;
    if (!(*src = sp_strndup(s.data, s.len, SP_MEM_TOKENIZER))) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (sp_gguf_get_arr(f, "tokenizer.ggml.tokens", SP_GGUF_VTYPE_STRING, &tokens) != SP_OK) {
        sp_error_clear();  // no vocabulary: a template without bos / eos texts
        return SP_OK;
    }
    if ((st = token_text(f, tokens, "tokenizer.ggml.bos_token_id", bos)) != SP_OK ||
        (st = token_text(f, tokens, "tokenizer.ggml.eos_token_id", eos)) != SP_OK) {
        sp_free(*src);
        sp_free(*bos);
        *src = *bos = NULL;
    }
    return st;
}
