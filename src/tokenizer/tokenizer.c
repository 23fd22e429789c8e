/* tokenizer.c - tokenizer.json loading, added tokens, the encode pipeline
 * (added-token split -> normalizer -> pre-tokenizer -> BPE -> post-processor)
 * and whole-sequence decode. */
#include "tokenizer/tokenizer.h"

#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/json.h"
#include "core/strmap.h"
#include "core/utf8.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/pretok.h"
#include "tokenizer/tokjson.h"

#define MAX_JSON_BYTES ((size_t)1 << 30)

/* ---- id arrays ---- */

enum sp_status sp_ids_append(struct sp_ids *a, const int32_t *ids, int64_t n) {
    if (a->n + n > a->cap) {
        int64_t cap = a->cap ? a->cap : 64;
        while (cap < a->n + n) cap *= 2;
        void *nv = a->v ? sp_realloc(a->v, (size_t)cap * sizeof *a->v) : sp_malloc((size_t)cap * sizeof *a->v, SP_MEM_TOKENIZER);
        if (!nv) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory for %lld ids", (long long)(a->n + n));
        a->v = nv;
        a->cap = cap;
    }
    if (n) memcpy(a->v + a->n, ids, (size_t)n * sizeof *ids);
    a->n += n;
    return SP_OK;
}

enum sp_status sp_ids_push(struct sp_ids *a, int32_t id) {
    if (a->n < a->cap) {
        a->v[a->n++] = id;
        return SP_OK;
    }
    return sp_ids_append(a, &id, 1);
}

void sp_ids_free(struct sp_ids *a) {
    if (!a) return;
    sp_free(a->v);
    memset(a, 0, sizeof *a);
}

/* ---- added tokens and their byte trie ---- */

struct added {
    char *text;  // owned
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
    char *norm;  // the normalized form, matched in normalized text (normalized tokens)
    size_t norm_len;
};

struct trie_node {
    int32_t child, sibling;  // first child / next sibling, -1 when none
    int32_t tok;             // index into added[] of the token ending here, or -1
    unsigned char byte;
};

struct trie {
    struct trie_node *v;  // v[0] is the root
    int64_t n, cap;
    uint8_t first[32];  // bitmap of bytes that start some token
};

static enum sp_status trie_node_new(struct trie *tr, unsigned char byte, int32_t *out) {
    if (tr->n == tr->cap) {
        int64_t cap = tr->cap ? tr->cap * 2 : 64;
        void *nv = tr->v ? sp_realloc(tr->v, (size_t)cap * sizeof *tr->v) : sp_malloc((size_t)cap * sizeof *tr->v, SP_MEM_TOKENIZER);
        if (!nv) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory for added tokens");
        tr->v = nv;
        tr->cap = cap;
    }
    tr->v[tr->n] = (struct trie_node){-1, -1, -1, byte};
    *out = (int32_t)tr->n++;
    return SP_OK;
}

static enum sp_status trie_add(struct trie *tr, const char *s, size_t n, int32_t tok) {
    enum sp_status st;
    int32_t node;
    if (n == 0) return SP_OK;
    if (tr->n == 0 && (st = trie_node_new(tr, 0, &node)) != SP_OK) return st;
    tr->first[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << ((unsigned char)s[0] & 7));
    node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t c = tr->v[node].child;
        while (c >= 0 && tr->v[c].byte != b) c = tr->v[c].sibling;
        if (c < 0) {
            if ((st = trie_node_new(tr, b, &c)) != SP_OK) return st;
            tr->v[c].sibling = tr->v[node].child;
            tr->v[node].child = c;
        }
        node = c;
    }
    if (tr->v[node].tok < 0) tr->v[node].tok = tok;  // the first definition wins
    return SP_OK;
}

/* The longest token starting at s[0]: its index (and length), or -1. */
static int32_t trie_match(const struct trie *tr, const char *s, size_t n, size_t *len) {
    if (tr->n == 0 || !(tr->first[(unsigned char)s[0] >> 3] & (1u << ((unsigned char)s[0] & 7)))) return -1;
    int32_t node = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = tr->v[node].child;
        while (c >= 0 && tr->v[c].byte != (unsigned char)s[i]) c = tr->v[c].sibling;
        if (c < 0) break;
        node = c;
        if (tr->v[node].tok >= 0) {
            best = tr->v[node].tok;
            *len = i + 1;
        }
    }
    return best;
}

/* ---- the tokenizer ---- */

struct sp_tokenizer {
    struct sp_bpe *bpe;
    struct sp_normalizer *norm;
    struct sp_pretok *pre;
    struct sp_decoder *dec;
    bool defer_bytelevel;  // the model maps bytes itself (see bpe.h)
    struct added *added;   // (n_added)
    int64_t n_added;
    struct sp_strmap added_ids;  // id (4 bytes) -> index in added[], while loading
    int64_t n_ids;          // one past the largest id
    int32_t *added_of_id;   // (n_ids) index into added[], or -1
    bool *special;          // (n_ids)
    struct trie raw_all, raw_plain;    // tokens matched in the raw text (all / non-special only)
    struct trie norm_all, norm_plain;  // tokens matched in normalized text
    struct sp_ids post_prefix, post_suffix;  // what add-special puts around the sequence
    int32_t bos, eos;
    bool cleanup;
    bool windowable;
};

static enum sp_status added_add(struct sp_tokenizer *t, const char *text, int32_t id, bool special, bool lstrip,
                                bool rstrip, bool single_word, bool normalized) {
    /* The first definition of an id wins: tokenizer.json's comes first. */
    if (sp_strmap_has(&t->added_ids, (const char *)&id, sizeof id)) return SP_OK;
    enum sp_status st = sp_strmap_put(&t->added_ids, (const char *)&id, sizeof id, t->n_added);
    if (st != SP_OK) return st;
    void *na = t->added ? sp_realloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added)
                        : sp_malloc(sizeof *t->added, SP_MEM_TOKENIZER);
    if (!na) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
    t->added = na;
    struct added *a = &t->added[t->n_added];
    memset(a, 0, sizeof *a);
    a->len = strlen(text);
    if (!(a->text = sp_strdup(text, SP_MEM_TOKENIZER))) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
    a->id = id;
    a->special = special;
    a->lstrip = lstrip;
    a->rstrip = rstrip;
    a->single_word = single_word;
    a->normalized = normalized;
    t->n_added++;
    return SP_OK;
}

static bool jflag(const cJSON *o, const char *key, bool def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* added_tokens of tokenizer.json. */
static enum sp_status read_added(struct sp_tokenizer *t, const cJSON *arr) {
    if (!arr || cJSON_IsNull(arr)) return SP_OK;
    if (!cJSON_IsArray(arr)) return sp_errorf(SP_ERR_FORMAT, "added_tokens: expected an array");
    int i = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "content");
        int64_t id;
        if (!cJSON_IsString(c) || !sp_json_is_int(cJSON_GetObjectItemCaseSensitive(o, "id"), &id) || id < 0 || id >= INT32_MAX)
            return sp_errorf(SP_ERR_FORMAT, "added_tokens[%d]: needs a string \"content\" and an integer \"id\"", i);
        bool special = jflag(o, "special", false);
        enum sp_status st = added_add(t, c->valuestring, (int32_t)id, special, jflag(o, "lstrip", false),
                                      jflag(o, "rstrip", false), jflag(o, "single_word", false),
                                      jflag(o, "normalized", !special));
        if (st != SP_OK) return st;
        i++;
    }
    return SP_OK;
}

/* A token named in tokenizer_config.json: "text" or {"content": "text"}. */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static enum sp_status add_post_ids(struct sp_ids *dst, const cJSON *ids_arr, const char *where) {
    const cJSON *x;
    if (!cJSON_IsArray(ids_arr)) return sp_errorf(SP_ERR_FORMAT, "%s: expected an array of ids", where);
    cJSON_ArrayForEach(x, ids_arr) {
        int64_t id;
        if (!sp_json_is_int(x, &id) || id < 0 || id >= INT32_MAX) return sp_errorf(SP_ERR_FORMAT, "%s: bad id", where);
        enum sp_status st = sp_ids_push(dst, (int32_t)id);
        if (st != SP_OK) return st;
    }
    return SP_OK;
}

/* Reads one post-processor into prefix/suffix ids around the sequence. */
static enum sp_status read_post(struct sp_tokenizer *t, const cJSON *j, const char *where, int depth) {
    enum sp_status st;
    if (!j || cJSON_IsNull(j)) return SP_OK;
    if (depth > 8) return sp_errorf(SP_ERR_LIMIT, "%s: nested too deep", where);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type)) return sp_errorf(SP_ERR_FORMAT, "%s: missing \"type\"", where);
    const char *ty = type->valuestring;
    if (strcmp(ty, "ByteLevel") == 0) return SP_OK;  // only trims offsets
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "processors"), *p;
        if (!cJSON_IsArray(ps)) return sp_errorf(SP_ERR_FORMAT, "%s: Sequence without a \"processors\" array", where);
        int i = 0;
        cJSON_ArrayForEach(p, ps) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.processors[%d]", where, i++);
            if ((st = read_post(t, p, sub, depth + 1)) != SP_OK) return st;
        }
        return SP_OK;
    }
    struct sp_ids pre = {0}, suf = {0};
    st = SP_OK;
    if (strcmp(ty, "TemplateProcessing") == 0) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single"), *item;
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
        if (!cJSON_IsArray(single)) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: TemplateProcessing without a \"single\" array", where);
            goto done;
        }
        bool seen_seq = false;
        cJSON_ArrayForEach(item, single) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
            if (sq) {
                if (seen_seq) {
                    st = sp_errorf(SP_ERR_UNSUPPORTED, "%s: a single template with two sequences", where);
                    goto done;
                }
                seen_seq = true;
            } else if (sp) {
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
                const cJSON *def = cJSON_IsString(name) ? cJSON_GetObjectItemCaseSensitive(specials, name->valuestring) : NULL;
                if (!def) {
                    st = sp_errorf(SP_ERR_FORMAT, "%s: special token %s is not in special_tokens", where,
                                   cJSON_IsString(name) ? name->valuestring : "(unnamed)");
                    goto done;
                }
                if ((st = add_post_ids(seen_seq ? &suf : &pre, cJSON_GetObjectItemCaseSensitive(def, "ids"), where)) != SP_OK)
                    goto done;
            } else {
                st = sp_errorf(SP_ERR_FORMAT, "%s: template items are SpecialToken or Sequence", where);
                goto done;
            }
        }
    } else if (strcmp(ty, "BertProcessing") == 0 || strcmp(ty, "RobertaProcessing") == 0) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(j, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(j, "sep");
        int64_t c, s;
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || !sp_json_is_int(cJSON_GetArrayItem(cls, 1), &c) ||
            !sp_json_is_int(cJSON_GetArrayItem(sep, 1), &s) || c < 0 || s < 0 || c >= INT32_MAX || s >= INT32_MAX) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: %s needs \"cls\" and \"sep\" as [text, id]", where, ty);
            goto done;
        }
        if ((st = sp_ids_push(&pre, (int32_t)c)) != SP_OK || (st = sp_ids_push(&suf, (int32_t)s)) != SP_OK) goto done;
    } else {
        st = sp_errorf(SP_ERR_UNSUPPORTED, "%s: unsupported post-processor type \"%s\"", where, ty);
        goto done;
    }
    /* A later processor wraps the earlier one's output. */
    if ((st = sp_ids_append(&pre, t->post_prefix.v, t->post_prefix.n)) != SP_OK) goto done;
    if ((st = sp_ids_append(&t->post_suffix, suf.v, suf.n)) != SP_OK) goto done;
    sp_ids_free(&t->post_prefix);
    t->post_prefix = pre;
    pre = (struct sp_ids){0};
done:
    sp_ids_free(&pre);
    sp_ids_free(&suf);
    return st;
}

static enum sp_status build_tries(struct sp_tokenizer *t) {
    enum sp_status st = SP_OK;
    struct sp_rx rx;
    if ((st = sp_rx_init(&rx)) != SP_OK) return st;
    struct sp_buf nb = SP_BUF_INIT;
    for (int64_t i = 0; i < t->n_added && st == SP_OK; i++) {
        struct added *a = &t->added[i];
        if (!a->normalized || !t->norm) {
            st = trie_add(&t->raw_all, a->text, a->len, (int32_t)i);
            if (st == SP_OK && !a->special) st = trie_add(&t->raw_plain, a->text, a->len, (int32_t)i);
            continue;
        }
        /* Normalized tokens are looked for in normalized text, in their
         * normalized form. */
        sp_buf_clear(&nb);
        if ((st = sp_buf_append(&nb, a->text, a->len)) != SP_OK) break;
        if ((st = sp_normalize(t->norm, &nb, &rx)) != SP_OK) break;
        if (!(a->norm = sp_strndup(nb.data, nb.len, SP_MEM_TOKENIZER))) {
            st = sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
            break;
        }
        a->norm_len = nb.len;
        st = trie_add(&t->norm_all, a->norm, a->norm_len, (int32_t)i);
        if (st == SP_OK && !a->special) st = trie_add(&t->norm_plain, a->norm, a->norm_len, (int32_t)i);
    }
    sp_buf_free(&nb);
    sp_rx_free(&rx);
    return st;
}

static enum sp_status load_parts(struct sp_tokenizer *t, const struct sp_tokjson *tj, const cJSON *cfg) {
    enum sp_status st;
    const cJSON *root = tj->root;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return sp_errorf(SP_ERR_FORMAT, "model: missing or not an object");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (mtype && !cJSON_IsString(mtype)) return sp_errorf(SP_ERR_FORMAT, "model.type must be a string");
    if (mtype && strcmp(mtype->valuestring, "BPE") != 0)
        return sp_errorf(SP_ERR_UNSUPPORTED, "model: unsupported model type \"%s\"", mtype->valuestring);
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(root, "truncation");
    if (tr && !cJSON_IsNull(tr)) return sp_errorf(SP_ERR_UNSUPPORTED, "truncation: only null is supported");
    if ((st = sp_normalizer_parse(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer", &t->norm)) != SP_OK)
        return st;
    if ((st = sp_pretok_parse(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer", &t->pre)) != SP_OK)
        return st;
    if ((st = sp_decoder_parse(cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoder", &t->dec)) != SP_OK) return st;
    if ((st = read_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor", 0)) != SP_OK)
        return st;
    bool bytelevel = sp_pretok_ends_with_bytelevel(t->pre);
    if ((st = sp_bpe_build(tj, model, bytelevel, &t->bpe)) != SP_OK) return st;
    t->defer_bytelevel = sp_bpe_byte_mode(t->bpe);
    if ((st = read_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) != SP_OK) return st;

    /* tokenizer_config.json. */
    const char *bos = NULL, *eos = NULL;
    bool add_bos = false, add_eos = false;
    t->cleanup = false;
    if (cfg) {
        const cJSON *dec = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder");
        const cJSON *e;
        cJSON_ArrayForEach(e, dec) {
            char *end;
            long id = strtol(e->string ? e->string : "", &end, 10);
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
            if (!e->string || end == e->string || *end || id < 0 || id >= INT32_MAX || !cJSON_IsString(c)) continue;
            bool special = jflag(e, "special", false);
            if ((st = added_add(t, c->valuestring, (int32_t)id, special, jflag(e, "lstrip", false), jflag(e, "rstrip", false),
                                jflag(e, "single_word", false), jflag(e, "normalized", !special))) != SP_OK)
                return st;
        }
        bos = config_token(cfg, "bos_token");
        eos = config_token(cfg, "eos_token");
        add_bos = jflag(cfg, "add_bos_token", false);
        add_eos = jflag(cfg, "add_eos_token", false);
        t->cleanup = jflag(cfg, "clean_up_tokenization_spaces", false);
    }

    /* Id space. */
    t->n_ids = sp_bpe_vocab_end(t->bpe);
    for (int64_t i = 0; i < t->n_added; i++)
        if (t->added[i].id + 1 > t->n_ids) t->n_ids = t->added[i].id + 1;
    t->added_of_id = sp_malloc((size_t)(t->n_ids ? t->n_ids : 1) * sizeof *t->added_of_id, SP_MEM_TOKENIZER);
    t->special = sp_calloc((size_t)(t->n_ids ? t->n_ids : 1), sizeof *t->special, SP_MEM_TOKENIZER);
    if (!t->added_of_id || !t->special) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
    for (int64_t i = 0; i < t->n_ids; i++) t->added_of_id[i] = -1;
    for (int64_t i = 0; i < t->n_added; i++) {
        t->added_of_id[t->added[i].id] = (int32_t)i;
        t->special[t->added[i].id] = t->added[i].special;
    }
    if (cfg) {
        const cJSON *extra = cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens"), *x;
        cJSON_ArrayForEach(x, extra) {
            const char *s = cJSON_IsString(x) ? x->valuestring : NULL;
            if (!s && cJSON_IsObject(x) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(x, "content")))
                s = cJSON_GetObjectItemCaseSensitive(x, "content")->valuestring;
            int32_t id = s ? sp_tokenizer_lookup(t, s, strlen(s)) : -1;
            if (id >= 0) t->special[id] = true;
        }
    }
    t->bos = bos ? sp_tokenizer_lookup(t, bos, strlen(bos)) : -1;
    t->eos = eos ? sp_tokenizer_lookup(t, eos, strlen(eos)) : -1;
    if (t->post_prefix.n == 0 && t->post_suffix.n == 0) {
        /* No template: tokenizer_config.json's add_bos_token/add_eos_token. */
        if (add_bos && t->bos >= 0 && (st = sp_ids_push(&t->post_prefix, t->bos)) != SP_OK) return st;
        if (add_eos && t->eos >= 0 && (st = sp_ids_push(&t->post_suffix, t->eos)) != SP_OK) return st;
    }
    for (int64_t i = 0; i < t->post_prefix.n; i++)
        if (t->post_prefix.v[i] >= t->n_ids) return sp_errorf(SP_ERR_FORMAT, "post_processor: id %d outside the vocabulary", t->post_prefix.v[i]);
    for (int64_t i = 0; i < t->post_suffix.n; i++)
        if (t->post_suffix.v[i] >= t->n_ids) return sp_errorf(SP_ERR_FORMAT, "post_processor: id %d outside the vocabulary", t->post_suffix.v[i]);
    t->windowable = sp_decoder_windowable(t->dec);
    return build_tries(t);
}

enum sp_status sp_tokenizer_load_mem(const char *json, size_t json_len, const char *config, size_t config_len,
                                     struct sp_tokenizer **out) {
    enum sp_status st;
    struct sp_tokjson tj;
    cJSON *cfg = NULL;
    *out = NULL;
    struct sp_tokenizer *t = sp_calloc(1, sizeof *t, SP_MEM_TOKENIZER);
    if (!t) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
    t->bos = t->eos = -1;
    sp_strmap_init(&t->added_ids, SP_MEM_TOKENIZER);
    if ((st = sp_tokjson_read(json, json_len, "tokenizer.json", &tj)) != SP_OK) {
        sp_free(t);
        return st;
    }
    if (config && (st = sp_json_parse(config, config_len, "tokenizer_config.json", &cfg)) != SP_OK) goto fail;
    if (cfg && !cJSON_IsObject(cfg)) {
        st = sp_errorf(SP_ERR_FORMAT, "tokenizer_config.json: not an object");
        goto fail;
    }
    if ((st = load_parts(t, &tj, cfg)) != SP_OK) {
        sp_error_prefix("tokenizer.json: ");
        goto fail;
    }
    sp_tokjson_free(&tj);
    cJSON_Delete(cfg);
    sp_strmap_free(&t->added_ids);
    *out = t;
    return SP_OK;
fail:
    sp_tokjson_free(&tj);
    cJSON_Delete(cfg);
    sp_tokenizer_free(t);
    return st;
}

enum sp_status sp_tokenizer_load(const char *path, struct sp_tokenizer **out) {
    enum sp_status st;
    char *json_path = NULL, *cfg_path = NULL, *dir = NULL, *json = NULL, *cfg = NULL;
    size_t json_len = 0, cfg_len = 0;
    *out = NULL;
    if (sp_path_is_dir(path)) {
        json_path = sp_path_join(path, "tokenizer.json");
        cfg_path = sp_path_join(path, "tokenizer_config.json");
    } else {
        json_path = sp_strdup(path, SP_MEM_TOKENIZER);
        const char *slash = strrchr(path, '/');
        dir = slash ? sp_strndup(path, (size_t)(slash - path) + 1, SP_MEM_TOKENIZER) : sp_strdup(".", SP_MEM_TOKENIZER);
        cfg_path = dir ? sp_path_join(dir, "tokenizer_config.json") : NULL;
    }
    if (!json_path || !cfg_path) {
        st = sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (!sp_path_is_file(json_path)) {
        st = sp_errorf(SP_ERR_NOT_FOUND, "%s: no such file (a tokenizer needs tokenizer.json)", json_path);
        goto done;
    }
    if ((st = sp_read_file(json_path, MAX_JSON_BYTES, &json, &json_len)) != SP_OK) goto done;
    if (sp_path_is_file(cfg_path) && (st = sp_read_file(cfg_path, MAX_JSON_BYTES, &cfg, &cfg_len)) != SP_OK) goto done;
    if ((st = sp_tokenizer_load_mem(json, json_len, cfg, cfg_len, out)) != SP_OK) sp_error_prefix("%s: ", path);
done:
    sp_free(json_path);
    sp_free(cfg_path);
    sp_free(dir);
    sp_free(json);
    sp_free(cfg);
    return st;
}

static void trie_free(struct trie *tr) { sp_free(tr->v); }

void sp_tokenizer_free(struct sp_tokenizer *t) {
    if (!t) return;
    sp_bpe_free(t->bpe);
    sp_normalizer_free(t->norm);
    sp_pretok_free(t->pre);
    sp_decoder_free(t->dec);
    for (int64_t i = 0; i < t->n_added; i++) {
        sp_free(t->added[i].text);
        sp_free(t->added[i].norm);
    }
    sp_free(t->added);
    sp_strmap_free(&t->added_ids);
    sp_free(t->added_of_id);
    sp_free(t->special);
    trie_free(&t->raw_all);
    trie_free(&t->raw_plain);
    trie_free(&t->norm_all);
    trie_free(&t->norm_plain);
    sp_ids_free(&t->post_prefix);
    sp_ids_free(&t->post_suffix);
    sp_free(t);
}

/* ---- lookups ---- */

int64_t sp_tokenizer_vocab_size(const struct sp_tokenizer *t) { return t->n_ids; }

const char *sp_tokenizer_token(const struct sp_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids) return NULL;
    if (t->added_of_id[id] >= 0) {
        *len = t->added[t->added_of_id[id]].len;
        return t->added[t->added_of_id[id]].text;
    }
    return sp_bpe_token(t->bpe, id, len);
}

int32_t sp_tokenizer_lookup(const struct sp_tokenizer *t, const char *text, size_t len) {
    for (int64_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && memcmp(t->added[i].text, text, len) == 0) return t->added[i].id;
    return sp_bpe_lookup(t->bpe, text, len);
}

bool sp_tokenizer_is_special(const struct sp_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_ids && t->special[id]; }
int32_t sp_tokenizer_bos(const struct sp_tokenizer *t) { return t->bos; }
int32_t sp_tokenizer_eos(const struct sp_tokenizer *t) { return t->eos; }
bool sp_tokenizer_cleans_spaces(const struct sp_tokenizer *t) { return t->cleanup; }
bool sp_tokenizer_windowable(const struct sp_tokenizer *t) { return t->windowable; }
void sp_tokenizer_clear_cache(const struct sp_tokenizer *t) { sp_bpe_cache_clear(t->bpe); }

/* ---- encode ---- */

/* Per-call working state. */
struct enc {
    const struct sp_tokenizer *t;
    struct sp_rx rx;
    struct sp_bpe_scratch bs;
    struct sp_buf seg;
    struct sp_splits w, tmp;
    int64_t limit;    // out may hold at most this many ids, or -1
    int64_t max_new;  // the caller's limit, for the message
};

/* Stops an encoding that has gone past its limit: a prompt that cannot fit
 * the context is refused after its first limit tokens, not all of them. */
static enum sp_status over_limit(const struct enc *e, const struct sp_ids *out) {
    if (e->limit < 0 || out->n <= e->limit) return SP_OK;
    return sp_errorf(SP_ERR_LIMIT, "the text has more than %lld tokens", (long long)e->max_new);
}

static bool is_word_char(const unsigned char *s, size_t n) {
    uint32_t cp;
    if (sp_utf8_decode(s, n, &cp) <= 0) return false;
    if (cp == '_') return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_NO && !(c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME);
}

/* Start of the character that ends at s[i) (i > 0). */
static size_t char_before(const char *s, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80 && i - j < 4) j--;
    return j;
}

static bool space_at(const char *s, size_t n, size_t i, size_t *len) {
    uint32_t cp;
    int k = sp_utf8_decode((const unsigned char *)s + i, n - i, &cp);
    if (k <= 0 || !sp_is_space(cp)) return false;
    *len = (size_t)k;
    return true;
}

/* Finds the next added token of tr in s[from..n): returns its index, with
 * [*start, *end) the span it takes (lstrip/rstrip whitespace included, never
 * reaching back before `floor`), or -1 when there is none. */
static int32_t find_added(const struct sp_tokenizer *t, const struct trie *tr, const char *s, size_t n, size_t from,
                          size_t floor, size_t *start, size_t *end) {
    if (tr->n == 0) return -1;
    for (size_t i = from; i < n; i++) {
        size_t mlen = 0;
        int32_t k = trie_match(tr, s + i, n - i, &mlen);
        if (k < 0) continue;
        const struct added *a = &t->added[k];
        size_t b = i, e = i + mlen, l;
        if (a->single_word) {
            size_t p = b > 0 ? char_before(s, b) : 0;
            if ((b > 0 && is_word_char((const unsigned char *)s + p, b - p)) ||
                (e < n && is_word_char((const unsigned char *)s + e, n - e)))
                continue;
        }
        if (a->lstrip)
            while (b > floor) {
                size_t p = char_before(s, b);
                if (!space_at(s, n, p, &l) || p + l != b) break;
                b = p;
            }
        if (a->rstrip)
            while (e < n && space_at(s, n, e, &l)) e += l;
        *start = b;
        *end = e;
        return k;
    }
    return -1;
}

static enum sp_status encode_words(struct enc *e, const char *s, size_t n, bool origin, struct sp_ids *out);

/* Text between raw-matched tokens: normalize it, split out the normalized
 * added tokens, and run the rest through pre-tokenizer and model. */
static enum sp_status encode_section(struct enc *e, const struct trie *normt, const char *s, size_t n, bool origin,
                                     struct sp_ids *out) {
    enum sp_status st;
    struct sp_buf *b = &e->seg;
    sp_buf_clear(b);
    if ((st = sp_buf_append(b, s, n)) != SP_OK) return st;
    if ((st = sp_normalize(e->t->norm, b, &e->rx)) != SP_OK) return st;
    size_t seg = 0, start, end;
    int32_t k;
    while ((k = find_added(e->t, normt, b->data, b->len, seg, seg, &start, &end)) >= 0) {
        if (start > seg && (st = encode_words(e, b->data + seg, start - seg, origin && seg == 0, out)) != SP_OK) return st;
        if ((st = sp_ids_push(out, e->t->added[k].id)) != SP_OK || (st = over_limit(e, out)) != SP_OK) return st;
        seg = end;
    }
    return encode_words(e, b->data + seg, b->len - seg, origin && seg == 0, out);
}

/* origin: s starts the whole text (pre-tokenizers that mark the first word). */
static enum sp_status encode_text(struct enc *e, bool parse_special, const char *s, size_t n, bool origin,
                                  struct sp_ids *out) {
    enum sp_status st;
    const struct sp_tokenizer *t = e->t;
    const struct trie *raw = parse_special ? &t->raw_all : &t->raw_plain;
    const struct trie *normt = parse_special ? &t->norm_all : &t->norm_plain;
    size_t seg = 0, start, end;
    int32_t k;
    while ((k = find_added(t, raw, s, n, seg, seg, &start, &end)) >= 0) {
        if (start > seg && (st = encode_section(e, normt, s + seg, start - seg, origin && seg == 0, out)) != SP_OK)
            return st;
        if ((st = sp_ids_push(out, t->added[k].id)) != SP_OK || (st = over_limit(e, out)) != SP_OK) return st;
        seg = end;
    }
    if (n > seg) return encode_section(e, normt, s + seg, n - seg, origin && seg == 0, out);
    return SP_OK;
}

/* Pre-tokenizes normalized text and runs the model on each word. */
static enum sp_status encode_words(struct enc *e, const char *s, size_t n, bool origin, struct sp_ids *out) {
    enum sp_status st;
    if (n == 0) return SP_OK;
    if ((st = sp_splits_set(&e->w, s, n, origin)) != SP_OK) return st;
    if ((st = sp_pretok_run(e->t->pre, &e->w, &e->tmp, &e->rx, e->t->defer_bytelevel)) != SP_OK) return st;
    for (int64_t i = 0; i < e->w.n; i++) {
        const struct sp_range *r = &e->w.r[i];
        if ((st = sp_bpe_encode_word(e->t->bpe, e->w.text.data + r->off, r->len, &e->bs, out)) != SP_OK) return st;
        if ((st = over_limit(e, out)) != SP_OK) return st;
    }
    return SP_OK;
}

enum sp_status sp_tokenizer_encode(const struct sp_tokenizer *t, const char *text, size_t len, unsigned flags,
                                   struct sp_ids *out) {
    return sp_tokenizer_encode_max(t, text, len, flags, -1, out);
}

/* A long text with a limit is first counted a window at a time: one far
 * past the limit (a prompt of megabytes for a context of thousands of
 * tokens) is then refused after about the limit's worth of text, in the
 * memory of one window, instead of after normalizing and pre-tokenizing all
 * of it. A window ends before a space that follows a non-space, which is a
 * word boundary for the pre-tokenizers here, so the windows' counts add up
 * to the whole's; PROBE_SLACK per window covers a cut that is not (no such
 * space in reach, or a tokenizer without word splitting), and the text is
 * refused only past the limit plus that slack: never one that fits. */
#define PROBE_WINDOW ((size_t)64 << 10)
#define PROBE_SLACK 8

static size_t window_end(const char *s, size_t n, size_t want) {
    if (want >= n) return n;
    for (size_t i = want; i > want - PROBE_WINDOW / 2; i--)
        if (s[i] == ' ' && s[i - 1] != ' ' && s[i - 1] != '\t' && s[i - 1] != '\n' && s[i - 1] != '\r') return i;
    while (want > 0 && ((unsigned char)s[want] & 0xc0) == 0x80) want--;
    return want;
}

static enum sp_status probe(struct enc *e, bool parse_special, const char *s, size_t n) {
    struct sp_ids ids = {0};
    struct enc pe = {.t = e->t, .limit = -1, .max_new = -1};
    enum sp_status st = sp_rx_init(&pe.rx);
    int64_t count = 0, slack = 0;
    for (size_t at = 0; st == SP_OK && at < n;) {
        size_t end = window_end(s, n, at + PROBE_WINDOW);
        ids.n = 0;
        if ((st = encode_text(&pe, parse_special, s + at, end - at, at == 0, &ids)) != SP_OK) break;
        count += ids.n;
        slack += PROBE_SLACK;
        if (count > e->max_new + slack)
            st = sp_errorf(SP_ERR_LIMIT, "the text has more than %lld tokens", (long long)e->max_new);
        at = end;
    }
    sp_ids_free(&ids);
    sp_rx_free(&pe.rx);
    sp_bpe_scratch_free(&pe.bs);
    sp_buf_free(&pe.seg);
    sp_splits_free(&pe.w);
    sp_splits_free(&pe.tmp);
    return st;
}

enum sp_status sp_tokenizer_encode_max(const struct sp_tokenizer *t, const char *text, size_t len, unsigned flags,
                                       int64_t max_new, struct sp_ids *out) {
    enum sp_status st;
    if (!text && len) return sp_errorf(SP_ERR_ARG, "tokenizer: NULL text");
    struct enc e = {.t = t, .limit = max_new >= 0 ? out->n + max_new : -1, .max_new = max_new};
    struct sp_buf clean = SP_BUF_INIT;
    if ((st = sp_rx_init(&e.rx)) != SP_OK) return st;
    if (flags & SP_TOK_ADD_SPECIAL && (st = sp_ids_append(out, t->post_prefix.v, t->post_prefix.n)) != SP_OK) goto done;
    const char *s = text ? text : "";
    if (!sp_utf8_valid(s, len)) {
        if ((st = sp_utf8_sanitize(s, len, &clean)) != SP_OK) goto done;
        s = clean.data;
        len = clean.len;
    }
    if (max_new >= 0 && len > PROBE_WINDOW && (st = probe(&e, flags & SP_TOK_PARSE_SPECIAL, s, len)) != SP_OK) goto done;
    st = encode_text(&e, flags & SP_TOK_PARSE_SPECIAL, s, len, true, out);
    if (st == SP_OK && flags & SP_TOK_ADD_SPECIAL) st = sp_ids_append(out, t->post_suffix.v, t->post_suffix.n);
    if (st == SP_OK) st = over_limit(&e, out);
done:
    sp_buf_free(&clean);
    sp_rx_free(&e.rx);
    sp_bpe_scratch_free(&e.bs);
    sp_buf_free(&e.seg);
    sp_splits_free(&e.w);
    sp_splits_free(&e.tmp);
    return st;
}

/* ---- decode ---- */

enum sp_status sp_tokenizer_decode_raw(const struct sp_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags,
                                       bool at_start, struct sp_dec_work *w, struct sp_buf *out) {
    enum sp_status st;
    sp_pieces_clear(&w->p);
    for (int64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = sp_tokenizer_token(t, ids[i], &len);
        if (!s) return sp_errorf(SP_ERR_ARG, "token id %d is outside the vocabulary (size %lld)", ids[i], (long long)t->n_ids);
        if (flags & SP_TOK_SKIP_SPECIAL && t->special[ids[i]]) continue;
        if ((st = sp_pieces_add(&w->p, s, len, t->added_of_id[ids[i]] >= 0)) != SP_OK) return st;
    }
    return sp_decoder_run(t->dec, w, at_start, out);
}

enum sp_status sp_tokenizer_decode(const struct sp_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags,
                                   struct sp_buf *out) {
    struct sp_dec_work w;
    struct sp_buf raw = SP_BUF_INIT, valid = SP_BUF_INIT;
    enum sp_status st = sp_dec_work_init(&w);
    if (st != SP_OK) return st;
    if ((st = sp_tokenizer_decode_raw(t, ids, n, flags, true, &w, &raw)) != SP_OK) goto done;
    if (!t->cleanup) {
        st = sp_utf8_sanitize(raw.data ? raw.data : "", raw.len, out);
        goto done;
    }
    if ((st = sp_utf8_sanitize(raw.data ? raw.data : "", raw.len, &valid)) != SP_OK) goto done;
    st = sp_cleanup_spaces(valid.data ? valid.data : "", valid.len, out);
done:
    if (st == SP_OK && !out->data) st = sp_buf_reserve(out, 0);
    sp_buf_free(&raw);
    sp_buf_free(&valid);
    sp_dec_work_free(&w);
    return st;
}
