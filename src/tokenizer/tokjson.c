/* tokjson.c - scanning tokenizer.json: vocab and merges into flat tables,
 * every other value through cJSON. */
#include "tokenizer/tokjson.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/json.h"
#include "core/utf8.h"

#define MAX_DEPTH 512

struct scan {
    const char *p, *end, *start;
    const char *what;
    struct sp_tokjson *tj;
};

static enum sp_status fail(struct scan *s, const char *msg) {
    return sp_errorf(SP_ERR_FORMAT, "%s: invalid JSON at byte %zu: %s", s->what, (size_t)(s->p - s->start), msg);
}

static void skip_ws(struct scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static bool eat(struct scan *s, char c) {
    skip_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

static enum sp_status arena_reserve(struct sp_tokjson *tj, size_t extra) {
    if (tj->arena_len + extra <= tj->arena_cap) return SP_OK;
    if (tj->arena_len + extra > UINT32_MAX) return sp_errorf(SP_ERR_LIMIT, "tokenizer.json: strings exceed 4 GiB");
    size_t cap = tj->arena_cap ? tj->arena_cap : 1 << 16;
    while (cap < tj->arena_len + extra) cap *= 2;
    char *na = tj->arena ? sp_realloc(tj->arena, cap) : sp_malloc(cap, SP_MEM_TOKENIZER);
    if (!na) return sp_errorf(SP_ERR_NOMEM, "tokenizer.json: out of memory for strings");
    tj->arena = na;
    tj->arena_cap = cap;
    return SP_OK;
}

static bool hex4(const char *p, const char *end, uint32_t *v) {
    if (end - p < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int h = sp_hex_digit(p[i]);
        if (h < 0) return false;
        *v = (*v << 4) | (uint32_t)h;
    }
    return true;
}

/* Reads a JSON string (the opening quote next) into the arena. Lone
 * surrogates become U+FFFD. */
static enum sp_status read_string(struct scan *s, struct sp_tokjson_str *out) {
    if (!eat(s, '"')) return fail(s, "expected a string");
    const char *q = s->p;
    while (q < s->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
    /* Decoded text is never longer than its escaped form. */
    size_t room = (size_t)(q - s->p) + 16;
    enum sp_status st = arena_reserve(s->tj, room);
    if (st != SP_OK) return st;
    struct sp_tokjson *tj = s->tj;
    out->off = (uint32_t)tj->arena_len;
    memcpy(tj->arena + tj->arena_len, s->p, (size_t)(q - s->p));
    tj->arena_len += (size_t)(q - s->p);
    s->p = q;
    for (;;) {
        if (s->p >= s->end) return fail(s, "unterminated string");
        char c = *s->p;
        if (c == '"') {
            s->p++;
            break;
        }
        if ((unsigned char)c < 0x20) return fail(s, "control character in a string");
        if ((st = arena_reserve(tj, 4)) != SP_OK) return st;
        if (c != '\\') {
            tj->arena[tj->arena_len++] = c;
            s->p++;
            continue;
        }
        if (s->end - s->p < 2) return fail(s, "unterminated escape");
        char e = s->p[1];
        s->p += 2;
        const char *simple = "\"\"\\\\//b\bf\fn\nr\rt\t";
        const char *hit = NULL;
        for (const char *m = simple; *m; m += 2)
            if (*m == e) hit = m;
        if (hit) {
            tj->arena[tj->arena_len++] = hit[1];
            continue;
        }
        if (e != 'u') return fail(s, "bad escape");
        uint32_t cp;
        if (!hex4(s->p, s->end, &cp)) return fail(s, "bad \\u escape");
        s->p += 4;
        if (cp >= 0xd800 && cp <= 0xdbff) {
            uint32_t lo;
            if (s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u' && hex4(s->p + 2, s->end, &lo) && lo >= 0xdc00 &&
                lo <= 0xdfff) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                s->p += 6;
            } else {
                cp = 0xfffd;
            }
        } else if (cp >= 0xdc00 && cp <= 0xdfff) {
            cp = 0xfffd;
        }
        tj->arena_len += (size_t)sp_utf8_encode(cp, tj->arena + tj->arena_len);
    }
    out->len = (uint32_t)(tj->arena_len - out->off);
    return SP_OK;
}

/* Skips one value of any type, iteratively, checking nesting depth. */
static enum sp_status skip_value(struct scan *s) {
    int depth = 0;
    skip_ws(s);
    do {
        skip_ws(s);
        if (s->p >= s->end) return fail(s, "unexpected end");
        char c = *s->p;
        if (c == '"') {
            s->p++;
            while (s->p < s->end && *s->p != '"') s->p += (*s->p == '\\' && s->end - s->p > 1) ? 2 : 1;
            if (s->p >= s->end) return fail(s, "unterminated string");
            s->p++;
        } else if (c == '{' || c == '[') {
            if (++depth > MAX_DEPTH) return fail(s, "nesting too deep");
            s->p++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return fail(s, "unbalanced bracket");
            depth--;
            s->p++;
        } else if (depth == 0) {  // a number or literal on its own
            while (s->p < s->end && !strchr(",}] \t\r\n", *s->p)) s->p++;
        } else {
            s->p++;  // numbers, literals, ',' and ':' inside containers (cJSON checks them)
        }
    } while (depth > 0);
    return SP_OK;
}

/* Parses the value at the cursor with cJSON and adds it to obj under key. */
static enum sp_status parse_into(struct scan *s, cJSON *obj, const char *key) {
    skip_ws(s);
    const char *v0 = s->p;
    enum sp_status st = skip_value(s);
    if (st != SP_OK) return st;
    cJSON *v;
    if ((st = sp_json_parse(v0, (size_t)(s->p - v0), s->what, &v)) != SP_OK) return st;
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddItemToObject(obj, key, v);
    return SP_OK;
}

static enum sp_status read_key(struct scan *s, char **key) {
    struct sp_tokjson_str k;
    enum sp_status st = read_string(s, &k);
    if (st != SP_OK) return st;
    *key = sp_strndup(s->tj->arena + k.off, k.len, SP_MEM_TOKENIZER);
    s->tj->arena_len = k.off;  // keys do not stay in the arena
    if (!*key) return sp_errorf(SP_ERR_NOMEM, "tokenizer.json: out of memory");
    if (!eat(s, ':')) return fail(s, "expected ':'");
    return SP_OK;
}

static enum sp_status read_vocab(struct scan *s) {
    struct sp_tokjson *tj = s->tj;
    enum sp_status st;
    tj->has_vocab = true;
    if (eat(s, '}')) return SP_OK;
    do {
        st = sp_tokjson_reserve((void **)&tj->vocab, &tj->vocab_cap, tj->n_vocab, sizeof *tj->vocab, "tokenizer.json vocabulary");
        if (st != SP_OK) return st;
        struct sp_tokjson_vocab *e = &tj->vocab[tj->n_vocab];
        if ((st = read_string(s, &e->text)) != SP_OK) return st;
        if (!eat(s, ':')) return fail(s, "expected ':' in model.vocab");
        skip_ws(s);
        int64_t v = 0;
        const char *d0 = s->p;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9' && s->p - d0 < 10) v = v * 10 + (*s->p++ - '0');
        if (s->p == d0 || (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E' || (*s->p >= '0' && *s->p <= '9'))))
            return fail(s, "model.vocab: ids must be integers below 10^10");
        if (v > INT32_MAX - 1) return sp_errorf(SP_ERR_LIMIT, "%s: model.vocab: id %lld too large", s->what, (long long)v);
        e->id = v;
        tj->n_vocab++;
    } while (eat(s, ','));
    if (!eat(s, '}')) return fail(s, "expected ',' or '}' in model.vocab");
    return SP_OK;
}

static enum sp_status read_merges(struct scan *s) {
    struct sp_tokjson *tj = s->tj;
    enum sp_status st;
    tj->has_merges = true;
    if (eat(s, ']')) return SP_OK;
    do {
        st = sp_tokjson_reserve((void **)&tj->merges, &tj->merges_cap, tj->n_merges, sizeof *tj->merges, "tokenizer.json merges");
        if (st != SP_OK) return st;
        struct sp_tokjson_merge *m = &tj->merges[tj->n_merges];
        if (eat(s, '[')) {  // tokenizers >= 0.20: ["a", "b"]
            if ((st = read_string(s, &m->a)) != SP_OK) return st;
            if (!eat(s, ',')) return fail(s, "model.merges: expected a pair");
            if ((st = read_string(s, &m->b)) != SP_OK) return st;
            if (!eat(s, ']')) return fail(s, "model.merges: expected a pair");
        } else {  // older files: "a b"
            struct sp_tokjson_str both;
            if ((st = read_string(s, &both)) != SP_OK) return st;
            const char *t = tj->arena + both.off;
            const char *sp = memchr(t, ' ', both.len);
            if (!sp || memchr(sp + 1, ' ', both.len - (size_t)(sp + 1 - t)))
                return sp_errorf(SP_ERR_FORMAT, "%s: model.merges[%lld]: \"%.*s\" is not two tokens separated by one space",
                                 s->what, (long long)tj->n_merges, (int)(both.len > 64 ? 64 : both.len), t);
            m->a.off = both.off;
            m->a.len = (uint32_t)(sp - t);
            m->b.off = both.off + m->a.len + 1;
            m->b.len = both.len - m->a.len - 1;
        }
        tj->n_merges++;
    } while (eat(s, ','));
    if (!eat(s, ']')) return fail(s, "expected ',' or ']' in model.merges");
    return SP_OK;
}

static enum sp_status read_model(struct scan *s, cJSON *model) {
    enum sp_status st = SP_OK;
    char *key = NULL;
    if (eat(s, '}')) return SP_OK;
    do {
        if ((st = read_key(s, &key)) != SP_OK) goto fail;
        skip_ws(s);
        char c = s->p < s->end ? *s->p : 0;
        if (strcmp(key, "vocab") == 0 && c == '{' && !s->tj->has_vocab) {
            s->p++;
            st = read_vocab(s);
        } else if (strcmp(key, "merges") == 0 && c == '[' && !s->tj->has_merges) {
            s->p++;
            st = read_merges(s);
        } else {
            st = parse_into(s, model, key);
        }
        if (st != SP_OK) goto fail;
        sp_free(key);
        key = NULL;
    } while (eat(s, ','));
    if (!eat(s, '}')) st = fail(s, "expected ',' or '}' in model");
fail:
    sp_free(key);
    return st;
}

enum sp_status sp_tokjson_read(const char *text, size_t len, const char *what, struct sp_tokjson *out) {
    memset(out, 0, sizeof *out);
    struct scan s = {.p = text, .end = text + len, .start = text, .what = what, .tj = out};
    enum sp_status st = SP_OK;
    char *key = NULL;
    /* Parsing "{}" (rather than cJSON_CreateObject) routes cJSON through the
     * accounting allocator before the first node is made. */
    if ((st = sp_json_parse("{}", 2, what, &out->root)) != SP_OK) return st;
    /* Decoded strings never outgrow the document: one allocation. */
    if ((st = arena_reserve(out, len + 16)) != SP_OK) goto fail;
    if (!eat(&s, '{')) {
        st = fail(&s, "the document is not an object");
        goto fail;
    }
    if (!eat(&s, '}')) {
        do {
            if ((st = read_key(&s, &key)) != SP_OK) goto fail;
            skip_ws(&s);
            if (strcmp(key, "model") == 0 && s.p < s.end && *s.p == '{' && !cJSON_HasObjectItem(out->root, "model")) {
                s.p++;
                cJSON *model = cJSON_AddObjectToObject(out->root, "model");
                if (!model) {
                    st = sp_errorf(SP_ERR_NOMEM, "%s: out of memory", what);
                    goto fail;
                }
                st = read_model(&s, model);
            } else {
                st = parse_into(&s, out->root, key);
            }
            if (st != SP_OK) goto fail;
            sp_free(key);
            key = NULL;
        } while (eat(&s, ','));
        if (!eat(&s, '}')) {
            st = fail(&s, "expected ',' or '}'");
            goto fail;
        }
    }
    skip_ws(&s);
    if (s.p != s.end) {
        st = fail(&s, "data after the document");
        goto fail;
    }
    return SP_OK;
fail:
    sp_free(key);
    sp_tokjson_free(out);
    return st;
}

void sp_tokjson_free(struct sp_tokjson *tj) {
    if (!tj) return;
    cJSON_Delete(tj->root);
    sp_free(tj->arena);
    sp_free(tj->vocab);
    sp_free(tj->merges);
    memset(tj, 0, sizeof *tj);
}

const char *sp_tokjson_string(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static enum sp_status walk(const cJSON *j, const char *list_key, const char *where, sp_tokjson_leaf_fn leaf, void *ctx,
                           int depth) {
    if (depth > 32) return sp_errorf(SP_ERR_LIMIT, "%s: sequences nested too deep", where);
    if (!cJSON_IsObject(j)) return sp_errorf(SP_ERR_FORMAT, "%s: expected an object", where);
    const char *type = sp_tokjson_string(j, "type");
    if (!type) return sp_errorf(SP_ERR_FORMAT, "%s: missing \"type\"", where);
    if (strcmp(type, "Sequence") != 0) return leaf(ctx, j, type, where);
    const cJSON *kids = cJSON_GetObjectItemCaseSensitive(j, list_key);
    if (!cJSON_IsArray(kids)) return sp_errorf(SP_ERR_FORMAT, "%s: Sequence without a \"%s\" array", where, list_key);
    int i = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, kids) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s[%d]", where, list_key, i++);
        enum sp_status st = walk(k, list_key, sub, leaf, ctx, depth + 1);
        if (st != SP_OK) return st;
    }
    return SP_OK;
}

enum sp_status sp_tokjson_walk(const cJSON *j, const char *list_key, const char *where, sp_tokjson_leaf_fn leaf,
                               void *ctx) {
    return walk(j, list_key, where, leaf, ctx, 0);
}

enum sp_status sp_tokjson_reserve(void **v, int64_t *cap, int64_t n, size_t size, const char *where) {
    if (n < *cap) return SP_OK;
    int64_t c = *cap ? *cap * 2 : 4;
    void *nv = *v ? sp_realloc(*v, (size_t)c * size) : sp_malloc((size_t)c * size, SP_MEM_TOKENIZER);
    if (!nv) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", where);
    *v = nv;
    *cap = c;
    return SP_OK;
}
