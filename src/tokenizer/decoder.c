/* decoder.c - decoder chains over token pieces, and the space cleanup. */
#include "tokenizer/decoder.h"

#include <string.h>

#include "core/alloc.h"
#include "core/json.h"
#include "core/utf8.h"
#include "tokenizer/tokjson.h"

enum dec_kind { D_BYTELEVEL, D_METASPACE, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP };

struct dec_stage {
    enum dec_kind kind;
    char repl[5];  // Metaspace replacement / Strip content (one character)
    size_t repl_len;
    bool strip_first;      // Metaspace: drop the space the first token starts with
    int64_t start, stop;   // Strip
    struct sp_pattern pat; // Replace
    char *content;
    size_t content_len;
};

struct sp_decoder {
    struct dec_stage *st;
    int64_t n, cap;
};

enum sp_status sp_pieces_add(struct sp_pieces *p, const char *s, size_t len, bool added) {
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 32;
        void *nv = p->v ? sp_realloc(p->v, (size_t)cap * sizeof *p->v) : sp_malloc((size_t)cap * sizeof *p->v, SP_MEM_TOKENIZER);
        if (!nv) return sp_errorf(SP_ERR_NOMEM, "decoder: out of memory");
        p->v = nv;
        p->cap = cap;
    }
    size_t off = p->text.len;
    enum sp_status st = sp_buf_append(&p->text, s, len);
    if (st != SP_OK) return st;
    p->v[p->n++] = (struct sp_piece){off, len, added};
    return SP_OK;
}

void sp_pieces_clear(struct sp_pieces *p) {
    sp_buf_clear(&p->text);
    p->n = 0;
}

void sp_pieces_free(struct sp_pieces *p) {
    if (!p) return;
    sp_buf_free(&p->text);
    sp_free(p->v);
    memset(p, 0, sizeof *p);
}

static enum sp_status one_char(const char *s, const char *what, const char *where, char out[5], size_t *len) {
    uint32_t cp;
    size_t n = s ? strlen(s) : 0;
    if (!s || n == 0 || n > 4 || sp_utf8_decode((const unsigned char *)s, n, &cp) != (int)n)
        return sp_errorf(SP_ERR_FORMAT, "%s: \"%s\" must be one character", where, what);
    memcpy(out, s, n);
    *len = n;
    return SP_OK;
}

static enum sp_status jint(const cJSON *j, const char *key, const char *where, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return SP_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 || v->valuedouble != (double)(int64_t)v->valuedouble)
        return sp_errorf(SP_ERR_FORMAT, "%s.%s must be a small non-negative integer", where, key);
    *out = (int64_t)v->valuedouble;
    return SP_OK;
}

static enum sp_status dec_add(void *ctx, const cJSON *j, const char *type, const char *where) {
    struct sp_decoder *d = ctx;
    enum sp_status st = sp_tokjson_reserve((void **)&d->st, &d->cap, d->n, sizeof *d->st, where);
    if (st != SP_OK) return st;
    struct dec_stage *s = &d->st[d->n];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "ByteLevel") == 0) {
        s->kind = D_BYTELEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        s->kind = D_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        s->kind = D_FUSE;
    } else if (strcmp(type, "Metaspace") == 0) {
        s->kind = D_METASPACE;
        const char *r = sp_tokjson_string(j, "replacement");
        if ((st = one_char(r, "replacement", where, s->repl, &s->repl_len)) != SP_OK) return st;
        const char *ps = sp_tokjson_string(j, "prepend_scheme");
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        if (ps) s->strip_first = strcmp(ps, "never") != 0;
        else s->strip_first = !aps || cJSON_IsTrue(aps);
    } else if (strcmp(type, "Strip") == 0) {
        s->kind = D_STRIP;
        if ((st = one_char(sp_tokjson_string(j, "content"), "content", where, s->repl, &s->repl_len)) != SP_OK) return st;
        if ((st = jint(j, "start", where, &s->start)) != SP_OK) return st;
        if ((st = jint(j, "stop", where, &s->stop)) != SP_OK) return st;
    } else if (strcmp(type, "Replace") == 0) {
        s->kind = D_REPLACE;
        const char *c = sp_tokjson_string(j, "content");
        if (!c) return sp_errorf(SP_ERR_FORMAT, "%s: Replace without a \"content\" string", where);
        if ((st = sp_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"), where, &s->pat)) != SP_OK) return st;
        s->content_len = strlen(c);
        if (!(s->content = sp_strdup(c, SP_MEM_TOKENIZER))) {
            sp_pattern_free(&s->pat);
            return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", where);
        }
    } else {
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: unsupported decoder type \"%s\"", where, type);
    }
    d->n++;
    return SP_OK;
}

enum sp_status sp_decoder_parse(const cJSON *j, const char *where, struct sp_decoder **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return SP_OK;
    struct sp_decoder *d = sp_calloc(1, sizeof *d, SP_MEM_TOKENIZER);
    if (!d) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", where);
    enum sp_status st = sp_tokjson_walk(j, "decoders", where, dec_add, d);
    if (st != SP_OK) {
        sp_decoder_free(d);
        return st;
    }
    *out = d;
    return SP_OK;
}

void sp_decoder_free(struct sp_decoder *d) {
    if (!d) return;
    for (int64_t i = 0; i < d->n; i++) {
        sp_pattern_free(&d->st[i].pat);
        sp_free(d->st[i].content);
    }
    sp_free(d->st);
    sp_free(d);
}

bool sp_decoder_windowable(const struct sp_decoder *d) {
    if (!d) return true;
    bool fused = false;
    for (int64_t i = 0; i < d->n; i++) {
        const struct dec_stage *s = &d->st[i];
        if (s->kind == D_FUSE) fused = true;
        if (s->kind == D_STRIP && s->stop > 0) return false;
        if (s->kind == D_REPLACE && fused) return false;
    }
    return true;
}

/* "<0xAB>" -> 0xAB, else -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = sp_hex_digit(s[3]), lo = sp_hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* One stage: reads `in`, writes `out`. *head_cont: the first piece continues
 * text that lies before the window. */
static enum sp_status stage_run(const struct dec_stage *s, const struct sp_pieces *in, struct sp_pieces *out,
                                bool at_start, bool *head_cont, struct sp_rx *rx, struct sp_buf *tmp) {
    enum sp_status st = SP_OK;
    sp_pieces_clear(out);
    const char *t = in->text.data;
    switch (s->kind) {
    case D_BYTELEVEL:
    case D_BYTEFALLBACK:
        /* Runs of byte tokens (non-added ones for ByteLevel, <0xXX> for
         * ByteFallback) become one piece of raw bytes. */
        for (int64_t i = 0; i < in->n;) {
            const struct sp_piece *p = &in->v[i];
            bool is_run = s->kind == D_BYTELEVEL ? !p->added : byte_token(t + p->off, p->len) >= 0;
            if (!is_run) {
                if ((st = sp_pieces_add(out, t + p->off, p->len, p->added)) != SP_OK) return st;
                i++;
                continue;
            }
            sp_buf_clear(tmp);
            int64_t j = i;
            for (; j < in->n; j++) {
                const struct sp_piece *q = &in->v[j];
                if (s->kind == D_BYTELEVEL) {
                    if (q->added) break;
                    if (!sp_bytelevel_unmap(t + q->off, q->len, tmp)) sp_buf_append(tmp, t + q->off, q->len);
                } else {
                    int b = byte_token(t + q->off, q->len);
                    if (b < 0) break;
                    sp_buf_putc(tmp, (char)b);
                }
            }
            if (tmp->failed) return sp_errorf(SP_ERR_NOMEM, "decoder: out of memory");
            if (i == 0 && j > 1 && !at_start) *head_cont = true;
            if ((st = sp_pieces_add(out, tmp->data ? tmp->data : "", tmp->len, false)) != SP_OK) return st;
            i = j;
        }
        return SP_OK;
    case D_FUSE:
        if (in->n == 0) return SP_OK;
        if (!at_start) *head_cont = true;
        return sp_pieces_add(out, t ? t : "", in->text.len, false);
    case D_METASPACE:
        for (int64_t i = 0; i < in->n; i++) {
            const struct sp_piece *p = &in->v[i];
            sp_buf_clear(tmp);
            for (size_t k = 0; k < p->len;) {
                if (p->len - k >= s->repl_len && memcmp(t + p->off + k, s->repl, s->repl_len) == 0) {
                    sp_buf_putc(tmp, ' ');
                    k += s->repl_len;
                } else {
                    sp_buf_putc(tmp, t[p->off + k++]);
                }
            }
            if (tmp->failed) return sp_errorf(SP_ERR_NOMEM, "decoder: out of memory");
            size_t skip = (i == 0 && at_start && s->strip_first && tmp->len > 0 && tmp->data[0] == ' ') ? 1 : 0;
            if ((st = sp_pieces_add(out, tmp->data ? tmp->data + skip : "", tmp->len - skip, p->added)) != SP_OK) return st;
        }
        return SP_OK;
    case D_REPLACE:
        for (int64_t i = 0; i < in->n; i++) {
            const struct sp_piece *p = &in->v[i];
            sp_buf_clear(tmp);
            if ((st = sp_pattern_replace(&s->pat, t + p->off, p->len, s->content, s->content_len, rx, tmp)) != SP_OK)
                return st;
            if ((st = sp_pieces_add(out, tmp->data ? tmp->data : "", tmp->len, p->added)) != SP_OK) return st;
        }
        return SP_OK;
    case D_STRIP:
        for (int64_t i = 0; i < in->n; i++) {
            const struct sp_piece *p = &in->v[i];
            const char *a = t + p->off;
            size_t n = p->len;
            bool may_start = !(i == 0 && *head_cont);
            for (int64_t k = 0; may_start && k < s->start && n >= s->repl_len && memcmp(a, s->repl, s->repl_len) == 0; k++) {
                a += s->repl_len;
                n -= s->repl_len;
            }
            for (int64_t k = 0; k < s->stop && n >= s->repl_len && memcmp(a + n - s->repl_len, s->repl, s->repl_len) == 0; k++)
                n -= s->repl_len;
            if ((st = sp_pieces_add(out, a, n, p->added)) != SP_OK) return st;
        }
        return SP_OK;
    }
    return SP_OK;
}

enum sp_status sp_dec_work_init(struct sp_dec_work *w) {
    memset(w, 0, sizeof *w);
    return sp_rx_init(&w->rx);
}

void sp_dec_work_free(struct sp_dec_work *w) {
    if (!w) return;
    sp_pieces_free(&w->p);
    sp_pieces_free(&w->other);
    sp_buf_free(&w->tmp);
    sp_rx_free(&w->rx);
}

enum sp_status sp_decoder_run(const struct sp_decoder *d, struct sp_dec_work *w, bool at_start, struct sp_buf *out) {
    enum sp_status st = SP_OK;
    struct sp_pieces *p = &w->p;
    if (!d) {
        for (int64_t i = 0; i < p->n; i++) {
            if (i > 0 || !at_start) sp_buf_putc(out, ' ');
            sp_buf_append(out, p->text.data + p->v[i].off, p->v[i].len);
        }
        return out->failed ? sp_errorf(SP_ERR_NOMEM, "decoder: out of memory") : SP_OK;
    }
    bool head_cont = false;
    for (int64_t i = 0; i < d->n && st == SP_OK; i++) {
        st = stage_run(&d->st[i], &w->p, &w->other, at_start, &head_cont, &w->rx, &w->tmp);
        struct sp_pieces t = w->p;
        w->p = w->other;
        w->other = t;
    }
    for (int64_t i = 0; st == SP_OK && i < p->n; i++) st = sp_buf_append(out, p->text.data + p->v[i].off, p->v[i].len);
    return st;
}

/* ---- clean_up_tokenization_spaces ---- */

static const struct {
    const char *from, *to;
} CLEANUP[] = {{" .", "."},   {" ?", "?"},     {" !", "!"},   {" ,", ","},     {" ' ", "'"},
               {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

enum sp_status sp_cleanup_spaces(const char *s, size_t n, struct sp_buf *out) {
    struct sp_buf a = SP_BUF_INIT, b = SP_BUF_INIT;
    sp_buf_append(&a, s, n);
    for (size_t k = 0; k < sizeof CLEANUP / sizeof CLEANUP[0]; k++) {
        size_t fl = strlen(CLEANUP[k].from), tl = strlen(CLEANUP[k].to);
        sp_buf_clear(&b);
        size_t i = 0;
        while (i < a.len) {
            if (a.len - i >= fl && memcmp(a.data + i, CLEANUP[k].from, fl) == 0) {
                sp_buf_append(&b, CLEANUP[k].to, tl);
                i += fl;
            } else {
                sp_buf_putc(&b, a.data[i++]);
            }
        }
        struct sp_buf t = a;
        a = b;
        b = t;
    }
    bool failed = a.failed || b.failed;
    if (!failed) sp_buf_append(out, a.data ? a.data : "", a.len);
    sp_buf_free(&a);
    sp_buf_free(&b);
    return failed || out->failed ? sp_errorf(SP_ERR_NOMEM, "decoder: out of memory") : SP_OK;
}

size_t sp_cleanup_safe_prefix(const char *s, size_t n) {
    /* A replacement (or a cascade of them: " n ' t" -> "n't") covers a space
     * followed only by characters of the patterns. A cut is safe when the run
     * of such characters just before it holds no space. */
    size_t best = 0;
    bool space = false;
    for (size_t k = 1; k <= n; k++) {
        char c = s[k - 1];
        if (c == 0 || !strchr(" .?!,'ntmsvre", c)) space = false;
        else if (c == ' ') space = true;
        if (!space) best = k;
    }
    return best;
}
