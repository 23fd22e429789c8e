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
enum { TYPE_NORMAL = 1, TYPE_UNKNOWN = 2, TYPE_CONTROL = 3, TYPE_USER = 4, TYPE_UNUSED = 5 };

/* Ling's tokenizer.json regex as llama.cpp quotes it, its possessive
 * quantifiers kept (PCRE2 has them); no normalizer, as llama.cpp reads
 * these files. */
#define BAILING_REGEX                                                                                                \
    "'(?i:[sdmt]|ll|ve|re)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?+\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]++[\\\\r\\\\n]*|" \
    "\\\\s*[\\\\r\\\\n]|\\\\s+(?!\\\\S)|\\\\s+"

/* Byte-level BPE ("gpt2") vocabularies: llama.cpp's pre-tokenizer types
 * (tokenizer.ggml.pre) and what the tokenizer.json each stands for holds
 * around the model: its Split regex (isolated, then ByteLevel without its
 * own regex; written as JSON string contents), normalizer and
 * ignore_merges. */
static const struct bpe_pre {
    const char *pre;
    const char *regex;       // JSON string contents
    const char *normalizer;  // JSON, or NULL
    bool ignore_merges;
} bpe_pres[] = {
    /* Qwen2, Qwen2.5, Qwen3 */
    {"qwen2",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
     "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+",
     "{\"type\": \"NFC\"}", false},
    /* Llama 3 */
    {"llama-bpe",
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
     "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+",
     NULL, true},
    /* Ling 2.0, Ling 1.x and LLaDA-MoE */
    {"bailingmoe2", BAILING_REGEX, NULL, false},
    {"bailingmoe", BAILING_REGEX, NULL, false},
    {"llada-moe", BAILING_REGEX, NULL, false},
    /* gpt-oss (o200k) */
    {"gpt-4o",
     "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{Lu}\\\\p{Lt}\\\\p{Lm}\\\\p{Lo}\\\\p{M}]*[\\\\p{Ll}\\\\p{Lm}\\\\p{Lo}\\\\p{M}]+(?i:'s|"
     "'t|'re|'ve|'m|'ll|'d)?|"
     "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{Lu}\\\\p{Lt}\\\\p{Lm}\\\\p{Lo}\\\\p{M}]+[\\\\p{Ll}\\\\p{Lm}\\\\p{Lo}\\\\p{M}]*(?i:'s|"
     "'t|'re|'ve|'m|'ll|'d)?|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n/]*|\\\\s*[\\\\r\\\\n]+|"
     "\\\\s+(?!\\\\S)|\\\\s+",
     NULL, true},
};
static const char BYTELEVEL[] =
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}";

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

/* The added tokens: unknown and control pieces special, user-defined ones not. */
static void jw_added(struct sp_jw *w, const struct vocab *v) {
    sp_jw_key(w, "added_tokens");
    sp_jw_arr(w);
    for (int64_t i = 0; i < v->n; i++) {
        int64_t t = type_of(v, i);
        if (t != TYPE_UNKNOWN && t != TYPE_CONTROL && t != TYPE_USER) continue;
        sp_jw_obj(w);
        sp_jw_key(w, "id");
        sp_jw_int(w, i);
        sp_jw_key(w, "content");
        jw_piece(w, v, i);
        sp_jw_key(w, "special");
        sp_jw_bool(w, t != TYPE_USER);
        sp_jw_end(w);
    }
    sp_jw_end(w);
}

/* The model's vocabulary object: each piece (but unused ones) and its id. */
static enum sp_status jw_vocab(struct sp_jw *w, const struct sp_gguf_file *f, const struct vocab *v) {
    char *key = NULL;
    enum sp_status st = SP_OK;
    sp_jw_key(w, "vocab");
    sp_jw_obj(w);
    for (int64_t i = 0; i < v->n && st == SP_OK; i++) {
        if (type_of(v, i) == TYPE_UNUSED) continue;
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
        sp_jw_key(w, key);
        sp_jw_int(w, i);
    }
    sp_jw_end(w);
    sp_free(key);
    return st;
}

/* A byte-level BPE vocabulary (tokenizer.ggml.model "gpt2") as the
 * tokenizer.json of pre-tokenizer type pre, its merges the GGUF's
 * ("left right", in rank order). */
static enum sp_status bpe_json(const struct sp_gguf_file *f, const struct vocab *v, const struct bpe_pre *pre,
                               struct sp_buf *out) {
    const struct sp_gguf_kv *merges;
    enum sp_status st = sp_gguf_get_arr(f, "tokenizer.ggml.merges", SP_GGUF_VTYPE_STRING, &merges);
    if (st != SP_OK) return st;
    struct sp_buf pt = SP_BUF_INIT;
    sp_buf_printf(&pt,
                  "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
                  "\"%s\"}, \"behavior\": \"Isolated\", \"invert\": false}, %s]}",
                  pre->regex, BYTELEVEL);
    cJSON *pj = NULL, *dj = NULL, *nj = NULL;
    if (pt.failed) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (st == SP_OK) st = sp_json_parse(pt.data, pt.len, "the pre-tokenizer", &pj);
    if (st == SP_OK) st = sp_json_parse(BYTELEVEL, strlen(BYTELEVEL), "the decoder", &dj);
    if (st == SP_OK && pre->normalizer) st = sp_json_parse(pre->normalizer, strlen(pre->normalizer), "the normalizer", &nj);
    sp_buf_free(&pt);
    struct sp_jw w;
    sp_jw_init(&w, out, 0);
    sp_jw_obj(&w);
    jw_added(&w, v);
    sp_jw_key(&w, "normalizer");
    if (nj)
        sp_jw_cjson(&w, nj);
    else
        sp_jw_null(&w);
    sp_jw_key(&w, "pre_tokenizer");
    sp_jw_cjson(&w, pj);
    sp_jw_key(&w, "decoder");
    sp_jw_cjson(&w, dj);
    sp_jw_key(&w, "model");
    sp_jw_obj(&w);
    sp_jw_key(&w, "type");
    sp_jw_str(&w, "BPE");
    sp_jw_key(&w, "byte_fallback");
    sp_jw_bool(&w, false);
    sp_jw_key(&w, "ignore_merges");
    sp_jw_bool(&w, pre->ignore_merges);
    if (st == SP_OK) st = jw_vocab(&w, f, v);
    sp_jw_key(&w, "merges");
    sp_jw_arr(&w);
    for (int64_t i = 0; i < merges->count && st == SP_OK; i++) {
        struct sp_gguf_str m = sp_gguf_arr_str(merges, i);
        const char *sp = memchr(m.data, ' ', m.len);
        if (!sp || sp == m.data || sp + 1 == m.data + m.len || memchr(sp + 1, ' ', (size_t)(m.data + m.len - sp - 1))) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: tokenizer.ggml.merges[%lld] \"%.*s\" is not two pieces and a space",
                           f->path, (long long)i, (int)(m.len < 60 ? m.len : 60), m.data);
            break;
        }
        sp_jw_strn(&w, m.data, m.len);
    }
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_jw_end(&w);
    if (st == SP_OK && out->failed) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    cJSON_Delete(pj);
    cJSON_Delete(dj);
    cJSON_Delete(nj);
    return st;
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
    struct sp_jw w;
    sp_jw_init(&w, out, 0);
    sp_jw_obj(&w);
    jw_added(&w, v);
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
    st = jw_vocab(&w, f, v);
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

/* The pre-tokenizer type of a byte-level BPE vocabulary. */
static enum sp_status bpe_pre_of(const struct sp_gguf_file *f, const struct bpe_pre **out) {
    struct sp_gguf_str pre;
    enum sp_status st = sp_gguf_get_str(f, "tokenizer.ggml.pre", &pre);
    if (st == SP_ERR_NOT_FOUND)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: a \"gpt2\" vocabulary without tokenizer.ggml.pre (its pre-tokenizer)",
                         f->path);
    if (st != SP_OK) return st;
    for (size_t i = 0; i < sizeof bpe_pres / sizeof *bpe_pres; i++)
        if (strlen(bpe_pres[i].pre) == pre.len && !memcmp(bpe_pres[i].pre, pre.data, pre.len)) {
            *out = &bpe_pres[i];
            return SP_OK;
        }
    return sp_errorf(SP_ERR_UNSUPPORTED,
                     "%s: tokenizer.ggml.pre \"%.*s\": the byte-level BPE pre-tokenizers read so far are qwen2 (Qwen2, "
                     "Qwen2.5, Qwen3), llama-bpe (Llama 3), bailingmoe, bailingmoe2 and llada-moe (Ling) and gpt-4o "
                     "(gpt-oss)",
                     f->path, (int)(pre.len < 60 ? pre.len : 60), pre.data);
}

enum sp_status sp_gguf_tokenizer_json(const struct sp_gguf_file *f, char **json, size_t *json_len, char **config,
                                      size_t *config_len) {
    *json = *config = NULL;
    *json_len = *config_len = 0;
    struct sp_gguf_str model;
    struct vocab v = {0};
    enum sp_status st = sp_gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (st != SP_OK) return st;
    bool spm = model.len == 5 && !memcmp(model.data, "llama", 5), bpe = model.len == 4 && !memcmp(model.data, "gpt2", 4);
    if (!spm && !bpe)
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "%s: tokenizer.ggml.model \"%.*s\": the vocabularies read from a GGUF so far are \"llama\" "
                         "(SentencePiece BPE) and \"gpt2\" (byte-level BPE)",
                         f->path, (int)model.len, model.data);
    const struct bpe_pre *pre = NULL;
    if (bpe && (st = bpe_pre_of(f, &pre)) != SP_OK) return st;
    if ((st = sp_gguf_get_arr(f, "tokenizer.ggml.tokens", SP_GGUF_VTYPE_STRING, &v.tokens)) != SP_OK) return st;
    v.n = v.tokens->count;
    if ((spm && (st = sp_gguf_get_arr(f, "tokenizer.ggml.scores", SP_GGUF_VTYPE_FLOAT32, &v.scores)) != SP_OK) ||
        (st = sp_gguf_get_arr(f, "tokenizer.ggml.token_type", SP_GGUF_VTYPE_INT32, &v.types)) != SP_OK)
        return st;
    if ((v.scores && v.scores->count != v.n) || v.types->count != v.n)
        return sp_errorf(SP_ERR_FORMAT,
                         "%s: tokenizer.ggml.scores (%lld) and token_type (%lld) do not match the %lld "
                         "tokens",
                         f->path, (long long)(v.scores ? v.scores->count : v.n), (long long)v.types->count,
                         (long long)v.n);
    /* llama.cpp's defaults: SentencePiece <unk> <s> </s> and a bos; byte-level BPE none of them */
    int64_t unk, bos, eos;
    bool add_bos, add_eos;
    if ((st = opt_int(f, "tokenizer.ggml.unknown_token_id", v.n - 1, spm ? 0 : -1, &unk)) != SP_OK ||
        (st = opt_int(f, "tokenizer.ggml.bos_token_id", v.n - 1, spm ? 1 : -1, &bos)) != SP_OK ||
        (st = opt_int(f, "tokenizer.ggml.eos_token_id", v.n - 1, spm ? 2 : -1, &eos)) != SP_OK ||
        (st = opt_bool(f, "tokenizer.ggml.add_bos_token", spm, &add_bos)) != SP_OK ||
        (st = opt_bool(f, "tokenizer.ggml.add_eos_token", false, &add_eos)) != SP_OK)
        return st;
    if (add_bos && bos < 0) add_bos = false;
    if (add_eos && eos < 0) add_eos = false;
    struct sp_buf jb = SP_BUF_INIT, cb = SP_BUF_INIT;
    if ((st = spm ? spm_json(f, &v, unk, &jb) : bpe_json(f, &v, pre, &jb)) != SP_OK) {
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
    const char *keys[3] = {"bos_token", "eos_token", "unk_token"};
    int64_t ids[3] = {bos, eos, unk};
    for (int k = 0; k < 3; k++)
        if (ids[k] >= 0) {
            sp_jw_key(&w, keys[k]);
            jw_piece(&w, &v, ids[k]);
        }
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
