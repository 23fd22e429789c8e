/* pretok.c - normalizers, pre-tokenizers, byte-level alphabet, patterns. */
#include "tokenizer/pretok.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "tokenizer/tokjson.h"

/* ---- byte-level alphabet ---- */

/* GPT-2 keeps the printable Latin-1 bytes as themselves and moves the other
 * 68 bytes, in order, to U+0100 onwards. */
static bool bytelevel_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

static uint32_t byte_cp[256];
static int16_t cp_byte[0x144];
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;

static void bytelevel_init(void) {
    uint32_t next = 0x100;
    for (int i = 0; i < 0x144; i++) cp_byte[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        byte_cp[b] = bytelevel_printable(b) ? b : next++;
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

uint32_t sp_bytelevel_cp(uint8_t b) {
    pthread_once(&bytelevel_once, bytelevel_init);
    return byte_cp[b];
}

int sp_bytelevel_byte(uint32_t cp) {
    pthread_once(&bytelevel_once, bytelevel_init);
    return cp < 0x144 ? cp_byte[cp] : -1;
}

enum sp_status sp_bytelevel_map(const char *s, size_t n, struct sp_buf *out) {
    pthread_once(&bytelevel_once, bytelevel_init);
    enum sp_status st = sp_buf_reserve(out, 2 * n);
    if (st != SP_OK) return st;
    for (size_t i = 0; i < n; i++) out->len += (size_t)sp_utf8_encode(byte_cp[(unsigned char)s[i]], out->data + out->len);
    out->data[out->len] = 0;
    return SP_OK;
}

bool sp_bytelevel_unmap(const char *s, size_t n, struct sp_buf *out) {
    pthread_once(&bytelevel_once, bytelevel_init);
    size_t len0 = out->len;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = sp_utf8_decode(p + i, n - i, &cp);
        int b = k > 0 && cp < 0x144 ? cp_byte[cp] : -1;
        if (b < 0) {
            out->len = len0;
            if (out->data) out->data[len0] = 0;
            return false;
        }
        sp_buf_putc(out, (char)b);
        i += (size_t)k;
    }
    return true;
}

bool sp_is_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* ---- patterns ---- */

static void *rx_malloc(PCRE2_SIZE n, void *ud) {
    (void)ud;
    return sp_malloc(n, SP_MEM_TOKENIZER);
}
static void rx_free(void *p, void *ud) {
    (void)ud;
    sp_free(p);
}

static pcre2_general_context *gctx;
static pthread_once_t gctx_once = PTHREAD_ONCE_INIT;
static void gctx_init(void) { gctx = pcre2_general_context_create(rx_malloc, rx_free, NULL); }

static pcre2_general_context *rx_gctx(void) {
    pthread_once(&gctx_once, gctx_init);
    return gctx;
}

enum sp_status sp_rx_init(struct sp_rx *rx) {
    memset(rx, 0, sizeof *rx);
    pcre2_general_context *g = rx_gctx();
    if (!g) return sp_errorf(SP_ERR_NOMEM, "regex: out of memory");
    rx->md = pcre2_match_data_create(1, g);
    rx->mc = pcre2_match_context_create(g);
    if (!rx->md || !rx->mc) {
        sp_rx_free(rx);
        return sp_errorf(SP_ERR_NOMEM, "regex: out of memory");
    }
    /* The JIT stack is made only when PCRE2's default 32 KiB runs out
     * (long runs under a backtracking pattern), see sp_pattern_find. */
    return SP_OK;
}

void sp_rx_free(struct sp_rx *rx) {
    if (!rx) return;
    pcre2_match_data_free(rx->md);
    pcre2_match_context_free(rx->mc);
    pcre2_jit_stack_free(rx->js);
    memset(rx, 0, sizeof *rx);
}

enum sp_status sp_pattern_regex(const char *re, const char *where, struct sp_pattern *out) {
    memset(out, 0, sizeof *out);
    int err;
    PCRE2_SIZE off;
    pcre2_compile_context *cc = pcre2_compile_context_create(rx_gctx());
    if (!cc) return sp_errorf(SP_ERR_NOMEM, "regex: out of memory");
    out->re = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, cc);
    pcre2_compile_context_free(cc);
    if (!out->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return sp_errorf(SP_ERR_FORMAT, "%s: regex /%.200s/ at offset %zu: %s", where, re, (size_t)off, (char *)msg);
    }
    out->jit = pcre2_jit_compile(out->re, PCRE2_JIT_COMPLETE) == 0;
    return SP_OK;
}

enum sp_status sp_pattern_parse(const cJSON *pat, const char *where, struct sp_pattern *out) {
    memset(out, 0, sizeof *out);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (cJSON_IsString(s)) {
        out->lit_len = strlen(s->valuestring);
        out->lit = sp_strdup(s->valuestring, SP_MEM_TOKENIZER);
        return out->lit ? SP_OK : sp_errorf(SP_ERR_NOMEM, "%s: out of memory", where);
    }
    if (cJSON_IsString(r)) return sp_pattern_regex(r->valuestring, where, out);
    return sp_errorf(SP_ERR_FORMAT, "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
}

void sp_pattern_free(struct sp_pattern *p) {
    if (!p) return;
    sp_free(p->lit);
    pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

bool sp_pattern_find(const struct sp_pattern *p, const char *s, size_t n, size_t from, struct sp_rx *rx, size_t *ms,
                     size_t *me, enum sp_status *st) {
    if (from > n) return false;
    if (!p->re) {
        if (p->lit_len == 0 || p->lit_len > n - from) return false;
        const char *hit = memmem(s + from, n - from, p->lit, p->lit_len);
        if (!hit) return false;
        *ms = (size_t)(hit - s);
        *me = *ms + p->lit_len;
        return true;
    }
    int rc = p->jit ? pcre2_jit_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, rx->md, rx->mc)
                    : pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, rx->md, rx->mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !rx->js) {
        rx->js = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, rx_gctx());
        if (!rx->js) {
            *st = sp_errorf(SP_ERR_NOMEM, "regex: out of memory for the JIT stack");
            return false;
        }
        pcre2_jit_stack_assign(rx->mc, NULL, rx->js);
        rc = pcre2_jit_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, rx->md, rx->mc);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        *st = sp_errorf(SP_ERR_LIMIT, "regex match failed: %s", (char *)msg);
        return false;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(rx->md);
    *ms = ov[0];
    *me = ov[1];
    return true;
}

enum sp_status sp_pattern_replace(const struct sp_pattern *p, const char *s, size_t n, const char *with,
                                  size_t with_len, struct sp_rx *rx, struct sp_buf *out) {
    enum sp_status st = SP_OK;
    size_t pos = 0, from = 0, ms, me;
    while (sp_pattern_find(p, s, n, from, rx, &ms, &me, &st)) {
        sp_buf_append(out, s + pos, ms - pos);
        sp_buf_append(out, with, with_len);
        pos = me;
        if (me == ms) {  // empty match: step over one character
            if (me >= n) break;
            size_t cl = (size_t)sp_utf8_len((unsigned char)s[me]);
            sp_buf_append(out, s + me, cl);
            pos = me + cl;
        }
        from = pos;
    }
    if (st != SP_OK) return st;
    if (pos < n) sp_buf_append(out, s + pos, n - pos);
    return out->failed ? sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory") : SP_OK;
}

/* ---- normalizers ---- */

enum norm_kind { N_NFC, N_NFD, N_NFKC, N_NFKD, N_PREPEND, N_REPLACE, N_LOWERCASE, N_STRIP };

struct norm_stage {
    enum norm_kind kind;
    char *str;  // Prepend: the prefix; Replace: the content
    size_t str_len;
    struct sp_pattern pat;
    bool left, right;  // Strip
};

struct sp_normalizer {
    struct norm_stage *st;
    int64_t n, cap;
};

/* A boolean field: absent or null -> def; another type is an error. */
static enum sp_status jbool(const cJSON *j, const char *key, bool def, const char *where, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *out = def;
    if (!v || cJSON_IsNull(v)) return SP_OK;
    if (!cJSON_IsBool(v)) return sp_errorf(SP_ERR_FORMAT, "%s.%s must be a boolean", where, key);
    *out = cJSON_IsTrue(v);
    return SP_OK;
}

static enum sp_status norm_add(void *ctx, const cJSON *j, const char *type, const char *where) {
    struct sp_normalizer *nz = ctx;
    enum sp_status st = sp_tokjson_reserve((void **)&nz->st, &nz->cap, nz->n, sizeof *nz->st, where);
    if (st != SP_OK) return st;
    struct norm_stage *s = &nz->st[nz->n];
    memset(s, 0, sizeof *s);
    const char *str = NULL;
    if (strcmp(type, "NFC") == 0) s->kind = N_NFC;
    else if (strcmp(type, "NFD") == 0) s->kind = N_NFD;
    else if (strcmp(type, "NFKC") == 0) s->kind = N_NFKC;
    else if (strcmp(type, "NFKD") == 0) s->kind = N_NFKD;
    else if (strcmp(type, "Lowercase") == 0) s->kind = N_LOWERCASE;
    else if (strcmp(type, "Strip") == 0) {
        s->kind = N_STRIP;
        if ((st = jbool(j, "strip_left", true, where, &s->left)) != SP_OK) return st;
        if ((st = jbool(j, "strip_right", true, where, &s->right)) != SP_OK) return st;
    } else if (strcmp(type, "Prepend") == 0) {
        s->kind = N_PREPEND;
        if (!(str = sp_tokjson_string(j, "prepend"))) return sp_errorf(SP_ERR_FORMAT, "%s: Prepend without a \"prepend\" string", where);
    } else if (strcmp(type, "Replace") == 0) {
        s->kind = N_REPLACE;
        if (!(str = sp_tokjson_string(j, "content"))) return sp_errorf(SP_ERR_FORMAT, "%s: Replace without a \"content\" string", where);
        if ((st = sp_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"), where, &s->pat)) != SP_OK) return st;
    } else {
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: unsupported normalizer type \"%s\"", where, type);
    }
    if (str) {
        s->str_len = strlen(str);
        if (!(s->str = sp_strdup(str, SP_MEM_TOKENIZER))) {
            sp_pattern_free(&s->pat);
            return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", where);
        }
    }
    nz->n++;
    return SP_OK;
}

enum sp_status sp_normalizer_parse(const cJSON *j, const char *where, struct sp_normalizer **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return SP_OK;
    struct sp_normalizer *nz = sp_calloc(1, sizeof *nz, SP_MEM_TOKENIZER);
    if (!nz) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", where);
    enum sp_status st = sp_tokjson_walk(j, "normalizers", where, norm_add, nz);
    if (st != SP_OK) {
        sp_normalizer_free(nz);
        return st;
    }
    *out = nz;
    return SP_OK;
}

void sp_normalizer_free(struct sp_normalizer *nz) {
    if (!nz) return;
    for (int64_t i = 0; i < nz->n; i++) {
        sp_free(nz->st[i].str);
        sp_pattern_free(&nz->st[i].pat);
    }
    sp_free(nz->st);
    sp_free(nz);
}

/* Unicode normalization of text from byte `from` on, through utf8proc with
 * accounted buffers. */
static enum sp_status unicode_norm(struct sp_buf *text, size_t from, utf8proc_option_t opt, struct sp_buf *tmp) {
    const utf8proc_uint8_t *s = (const utf8proc_uint8_t *)text->data + from;
    utf8proc_ssize_t n = (utf8proc_ssize_t)(text->len - from);
    utf8proc_ssize_t cap = n + 16;
    utf8proc_int32_t *cps = NULL;
    utf8proc_ssize_t k;
    for (;;) {
        sp_free(cps);
        cps = sp_malloc((size_t)cap * sizeof *cps + 1, SP_MEM_TOKENIZER);
        if (!cps) return sp_errorf(SP_ERR_NOMEM, "normalizer: out of memory");
        k = utf8proc_decompose(s, n, cps, cap, opt);
        if (k < 0) {
            sp_free(cps);
            return sp_errorf(SP_ERR_FORMAT, "normalizer: %s", utf8proc_errmsg(k));
        }
        if (k <= cap) break;
        cap = k;
    }
    /* Recomposition works in place; reencoding needs 4 bytes per code point,
     * which the int32 buffer itself provides. */
    k = utf8proc_normalize_utf32(cps, k, opt);
    if (k < 0) {
        sp_free(cps);
        return sp_errorf(SP_ERR_FORMAT, "normalizer: %s", utf8proc_errmsg(k));
    }
    sp_buf_clear(tmp);
    enum sp_status st = sp_buf_reserve(tmp, (size_t)k * 4);
    for (utf8proc_ssize_t i = 0; st == SP_OK && i < k; i++) tmp->len += (size_t)sp_utf8_encode((uint32_t)cps[i], tmp->data + tmp->len);
    sp_free(cps);
    if (st != SP_OK) return st;
    text->len = from;
    return sp_buf_append(text, tmp->data, tmp->len);
}

/* ---- NFC with a quick check ---- */

/* quick[cp >> 6] bit (cp & 63): code point cp of the BMP is "NFC-quick":
 * NFC leaves it unchanged, it is a starter (combining class 0) and it never
 * composes with a character before it. Text can be cut before such a
 * character and normalized piece by piece. Computed per 256-code-point
 * block on first use. */
static uint64_t nfc_quick[65536 / 64];
static _Atomic unsigned char nfc_block_ready[256];
static pthread_mutex_t nfc_mu = PTHREAD_MUTEX_INITIALIZER;

static bool nfc_quick_slow(uint32_t cp) {
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    if (p->combining_class != 0) return false;
    if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;  // second of a composition
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11a8 && cp <= 0x11c2)) return false;  // Hangul V, T jamo
    if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) return true;  // no canonical decomposition
    /* A canonical decomposition: quick only if NFC composes it back. */
    utf8proc_int32_t buf[32];
    utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)cp, buf, 32, UTF8PROC_DECOMPOSE, NULL);
    if (k < 0 || k > 32) return false;
    k = utf8proc_normalize_utf32(buf, k, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    return k == 1 && (uint32_t)buf[0] == cp;
}

static bool nfc_quick_cp(uint32_t cp) {
    if (cp < 0x300) return true;
    if (cp >= 0x10000) {
        /* Outside the BMP: quick when it takes no part in normalization. */
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        return p->combining_class == 0 && p->decomp_seqindex == UINT16_MAX && p->comb_index == UINT16_MAX;
    }
    unsigned blk = cp >> 8;
    if (!nfc_block_ready[blk]) {
        pthread_mutex_lock(&nfc_mu);
        if (!nfc_block_ready[blk]) {
            for (uint32_t c = blk << 8; c < (blk + 1) << 8; c++) {
                uint64_t bit = 1ull << (c & 63);
                if (nfc_quick_slow(c)) nfc_quick[c >> 6] |= bit;
                else nfc_quick[c >> 6] &= ~bit;
            }
            nfc_block_ready[blk] = 1;
        }
        pthread_mutex_unlock(&nfc_mu);
    }
    return (nfc_quick[cp >> 6] >> (cp & 63)) & 1;
}

/* Appends the NFC form of s[0..n) to out. */
static enum sp_status nfc_piece(const char *s, size_t n, struct sp_buf *out) {
    utf8proc_int32_t stackbuf[256];
    utf8proc_int32_t *cps = stackbuf;
    utf8proc_ssize_t cap = 256, k;
    for (;;) {
        k = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, cps, cap, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (k < 0) {
            if (cps != stackbuf) sp_free(cps);
            return sp_errorf(SP_ERR_FORMAT, "normalizer: %s", utf8proc_errmsg(k));
        }
        if (k <= cap) break;
        if (cps != stackbuf) sp_free(cps);
        cap = k;
        if (!(cps = sp_malloc((size_t)cap * sizeof *cps, SP_MEM_TOKENIZER))) return sp_errorf(SP_ERR_NOMEM, "normalizer: out of memory");
    }
    k = utf8proc_normalize_utf32(cps, k, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    enum sp_status st = k < 0 ? sp_errorf(SP_ERR_FORMAT, "normalizer: %s", utf8proc_errmsg(k)) : sp_buf_reserve(out, (size_t)k * 4);
    for (utf8proc_ssize_t i = 0; st == SP_OK && i < k; i++) out->len += (size_t)sp_utf8_encode((uint32_t)cps[i], out->data + out->len);
    if (st == SP_OK) out->data[out->len] = 0;
    if (cps != stackbuf) sp_free(cps);
    return st;
}

/* NFC in place: only the stretches around characters that are not
 * NFC-quick go through utf8proc. */
static enum sp_status nfc(struct sp_buf *text, struct sp_buf *tmp) {
    const unsigned char *p = (const unsigned char *)text->data;
    size_t n = text->len, i = 0, done = 0, prev = 0;
    enum sp_status st = SP_OK;
    bool changed = false;
    while (i < n) {
        if (p[i] < 0x80) {
            prev = i++;
            continue;
        }
        uint32_t cp;
        int k = sp_utf8_decode(p + i, n - i, &cp);
        if (k <= 0) return sp_errorf(SP_ERR_ARG, "normalizer: invalid UTF-8");
        if (nfc_quick_cp(cp)) {
            prev = i;
            i += (size_t)k;
            continue;
        }
        /* From the starter before this character to the next quick one. */
        size_t s0 = i > done ? prev : i;
        if (s0 < done) s0 = done;
        size_t e = i + (size_t)k;
        while (e < n) {
            int k2 = sp_utf8_decode(p + e, n - e, &cp);
            if (k2 <= 0) return sp_errorf(SP_ERR_ARG, "normalizer: invalid UTF-8");
            if (nfc_quick_cp(cp)) break;
            e += (size_t)k2;
        }
        if (!changed) sp_buf_clear(tmp);
        changed = true;
        sp_buf_append(tmp, text->data + done, s0 - done);
        if ((st = nfc_piece(text->data + s0, e - s0, tmp)) != SP_OK) return st;
        done = i = prev = e;
    }
    if (!changed) return SP_OK;
    sp_buf_append(tmp, text->data + done, n - done);
    if (tmp->failed) return sp_errorf(SP_ERR_NOMEM, "normalizer: out of memory");
    sp_buf_clear(text);
    return sp_buf_append(text, tmp->data, tmp->len);
}

static enum sp_status norm_stage_run(const struct norm_stage *s, struct sp_buf *text, struct sp_buf *tmp,
                                     struct sp_rx *rx) {
    enum sp_status st = SP_OK;
    switch (s->kind) {
    case N_NFC:
        return nfc(text, tmp);
    case N_NFKC:
    case N_NFD:
    case N_NFKD: {
        /* Below U+0300 nothing decomposes canonically or composes with what
         * precedes it, so NFC/NFD can start at the first such code point. */
        size_t i = 0;
        const unsigned char *p = (const unsigned char *)text->data;
        bool compat = s->kind == N_NFKC || s->kind == N_NFKD;
        while (i < text->len && (p[i] < 0x80 || (!compat && p[i] < 0xcc))) i += (size_t)sp_utf8_len(p[i]);
        if (i >= text->len) return SP_OK;
        /* Restart at the code point before, which a mark may compose with. */
        size_t from = i;
        if (from > 0) {
            from--;
            while (from > 0 && (p[from] & 0xc0) == 0x80) from--;
        }
        utf8proc_option_t opt = UTF8PROC_STABLE;
        if (s->kind == N_NFC) opt |= UTF8PROC_COMPOSE;
        if (s->kind == N_NFD) opt |= UTF8PROC_DECOMPOSE;
        if (s->kind == N_NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        if (s->kind == N_NFKD) opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        return unicode_norm(text, from, opt, tmp);
    }
    case N_LOWERCASE: {
        sp_buf_clear(tmp);
        const unsigned char *p = (const unsigned char *)text->data;
        for (size_t i = 0; i < text->len;) {
            uint32_t cp;
            int k = sp_utf8_decode(p + i, text->len - i, &cp);
            if (k < 0) return sp_errorf(SP_ERR_ARG, "normalizer: invalid UTF-8");
            char enc[4];
            sp_buf_append(tmp, enc, (size_t)sp_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc));
            i += (size_t)k;
        }
        break;
    }
    case N_STRIP: {
        const unsigned char *p = (const unsigned char *)text->data;
        size_t a = 0, b = text->len;
        uint32_t cp;
        int k;
        while (s->left && a < b && (k = sp_utf8_decode(p + a, b - a, &cp)) > 0 && sp_is_space(cp)) a += (size_t)k;
        while (s->right && b > a) {
            size_t c = b - 1;
            while (c > a && (p[c] & 0xc0) == 0x80) c--;
            if ((k = sp_utf8_decode(p + c, b - c, &cp)) <= 0 || !sp_is_space(cp)) break;
            b = c;
        }
        memmove(text->data, text->data + a, b - a);
        text->len = b - a;
        text->data[text->len] = 0;
        return SP_OK;
    }
    case N_PREPEND:
        if (text->len == 0) return SP_OK;
        sp_buf_clear(tmp);
        sp_buf_append(tmp, s->str, s->str_len);
        sp_buf_append(tmp, text->data, text->len);
        break;
    case N_REPLACE:
        sp_buf_clear(tmp);
        if ((st = sp_pattern_replace(&s->pat, text->data, text->len, s->str, s->str_len, rx, tmp)) != SP_OK) return st;
        break;
    }
    if (tmp->failed) return sp_errorf(SP_ERR_NOMEM, "normalizer: out of memory");
    sp_buf_clear(text);
    return sp_buf_append(text, tmp->data ? tmp->data : "", tmp->len);
}

enum sp_status sp_normalize(const struct sp_normalizer *nz, struct sp_buf *text, struct sp_rx *rx) {
    if (!nz) return SP_OK;
    struct sp_buf tmp = SP_BUF_INIT;
    enum sp_status st = SP_OK;
    if (!text->data && (st = sp_buf_reserve(text, 0)) != SP_OK) return st;
    for (int64_t i = 0; i < nz->n && st == SP_OK; i++) st = norm_stage_run(&nz->st[i], text, &tmp, rx);
    sp_buf_free(&tmp);
    return st;
}

/* ---- splits ---- */

/* Records a range over bytes already at text[off..off+len). */
static enum sp_status range_push(struct sp_splits *s, size_t off, size_t len, bool origin) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 64;
        void *nr = s->r ? sp_realloc(s->r, (size_t)cap * sizeof *s->r) : sp_malloc((size_t)cap * sizeof *s->r, SP_MEM_TOKENIZER);
        if (!nr) return sp_errorf(SP_ERR_NOMEM, "pre-tokenizer: out of memory");
        s->r = nr;
        s->cap = cap;
    }
    s->r[s->n++] = (struct sp_range){off, len, origin};
    return SP_OK;
}

enum sp_status sp_splits_add(struct sp_splits *s, const char *p, size_t len, bool origin) {
    size_t off = s->text.len;
    enum sp_status st = sp_buf_append(&s->text, p, len);
    if (st != SP_OK) return st;
    return range_push(s, off, len, origin);
}

enum sp_status sp_splits_set(struct sp_splits *s, const char *text, size_t len, bool origin) {
    sp_buf_clear(&s->text);
    s->n = 0;
    return sp_splits_add(s, text, len, origin);
}

void sp_splits_free(struct sp_splits *s) {
    if (!s) return;
    sp_buf_free(&s->text);
    sp_free(s->r);
    memset(s, 0, sizeof *s);
}

/* ---- pre-tokenizers ---- */

enum behavior { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
enum pt_kind { P_SPLIT, P_BYTELEVEL, P_DIGITS, P_METASPACE, P_WHITESPACE, P_WSPLIT };
enum prepend_scheme { PS_ALWAYS, PS_FIRST, PS_NEVER };

struct pt_stage {
    enum pt_kind kind;
    struct sp_pattern pat;  // Split, ByteLevel (GPT-2 regex), Whitespace
    enum behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex;  // ByteLevel
    bool individual;                   // Digits
    char repl[5];                      // Metaspace replacement character
    size_t repl_len;
    enum prepend_scheme scheme;
    bool split;
};

struct sp_pretok {
    struct pt_stage *st;
    int64_t n, cap;
};

static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static enum sp_status pt_add(void *ctx, const cJSON *j, const char *type, const char *where) {
    struct sp_pretok *pt = ctx;
    enum sp_status st = sp_tokjson_reserve((void **)&pt->st, &pt->cap, pt->n, sizeof *pt->st, where);
    if (st != SP_OK) return st;
    struct pt_stage *s = &pt->st[pt->n];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "Split") == 0) {
        s->kind = P_SPLIT;
        const char *b = sp_tokjson_string(j, "behavior");
        if (!b) return sp_errorf(SP_ERR_FORMAT, "%s: Split without a \"behavior\"", where);
        if (strcmp(b, "Removed") == 0) s->behavior = B_REMOVED;
        else if (strcmp(b, "Isolated") == 0) s->behavior = B_ISOLATED;
        else if (strcmp(b, "MergedWithPrevious") == 0) s->behavior = B_MERGED_PREV;
        else if (strcmp(b, "MergedWithNext") == 0) s->behavior = B_MERGED_NEXT;
        else if (strcmp(b, "Contiguous") == 0) s->behavior = B_CONTIGUOUS;
        else return sp_errorf(SP_ERR_UNSUPPORTED, "%s: unsupported Split behavior \"%s\"", where, b);
        if ((st = jbool(j, "invert", false, where, &s->invert)) != SP_OK) return st;
        if ((st = sp_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"), where, &s->pat)) != SP_OK) return st;
    } else if (strcmp(type, "ByteLevel") == 0) {
        s->kind = P_BYTELEVEL;
        if ((st = jbool(j, "add_prefix_space", true, where, &s->add_prefix_space)) != SP_OK) return st;
        if ((st = jbool(j, "use_regex", true, where, &s->use_regex)) != SP_OK) return st;
        if (s->use_regex && (st = sp_pattern_regex(GPT2_RE, where, &s->pat)) != SP_OK) return st;
        s->behavior = B_ISOLATED;
    } else if (strcmp(type, "Digits") == 0) {
        s->kind = P_DIGITS;
        if ((st = jbool(j, "individual_digits", false, where, &s->individual)) != SP_OK) return st;
        s->behavior = s->individual ? B_ISOLATED : B_CONTIGUOUS;
    } else if (strcmp(type, "Metaspace") == 0) {
        s->kind = P_METASPACE;
        const char *r = sp_tokjson_string(j, "replacement");
        if (!r) r = sp_tokjson_string(j, "str_rep");
        uint32_t cp;
        size_t rl = r ? strlen(r) : 0;
        if (!r || rl == 0 || sp_utf8_decode((const unsigned char *)r, rl, &cp) != (int)rl)
            return sp_errorf(SP_ERR_FORMAT, "%s: Metaspace \"replacement\" must be one character", where);
        memcpy(s->repl, r, rl);
        s->repl_len = rl;
        const char *ps = sp_tokjson_string(j, "prepend_scheme");
        if (ps) {
            if (strcmp(ps, "always") == 0) s->scheme = PS_ALWAYS;
            else if (strcmp(ps, "first") == 0) s->scheme = PS_FIRST;
            else if (strcmp(ps, "never") == 0) s->scheme = PS_NEVER;
            else return sp_errorf(SP_ERR_UNSUPPORTED, "%s: unsupported prepend_scheme \"%s\"", where, ps);
        } else {
            bool aps;
            if ((st = jbool(j, "add_prefix_space", true, where, &aps)) != SP_OK) return st;
            s->scheme = aps ? PS_ALWAYS : PS_NEVER;
        }
        if ((st = jbool(j, "split", true, where, &s->split)) != SP_OK) return st;
        s->behavior = B_MERGED_NEXT;
    } else if (strcmp(type, "Whitespace") == 0) {
        s->kind = P_WHITESPACE;
        s->behavior = B_REMOVED;
        s->invert = true;
        if ((st = sp_pattern_regex("\\w+|[^\\w\\s]+", where, &s->pat)) != SP_OK) return st;
    } else if (strcmp(type, "WhitespaceSplit") == 0) {
        s->kind = P_WSPLIT;
        s->behavior = B_REMOVED;
        if ((st = sp_pattern_regex("\\s+", where, &s->pat)) != SP_OK) return st;
    } else {
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: unsupported pre-tokenizer type \"%s\"", where, type);
    }
    pt->n++;
    return SP_OK;
}

enum sp_status sp_pretok_parse(const cJSON *j, const char *where, struct sp_pretok **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return SP_OK;
    struct sp_pretok *pt = sp_calloc(1, sizeof *pt, SP_MEM_TOKENIZER);
    if (!pt) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", where);
    enum sp_status st = sp_tokjson_walk(j, "pretokenizers", where, pt_add, pt);
    if (st != SP_OK) {
        sp_pretok_free(pt);
        return st;
    }
    *out = pt;
    return SP_OK;
}

void sp_pretok_free(struct sp_pretok *pt) {
    if (!pt) return;
    for (int64_t i = 0; i < pt->n; i++) sp_pattern_free(&pt->st[i].pat);
    sp_free(pt->st);
    sp_free(pt);
}

bool sp_pretok_ends_with_bytelevel(const struct sp_pretok *pt) {
    return pt && pt->n > 0 && pt->st[pt->n - 1].kind == P_BYTELEVEL;
}

/* One piece of a range: [s, e) and whether it is a delimiter match. */
struct piece {
    size_t s, e;
    bool m;
};

struct pieces {
    struct piece *v;
    int64_t n, cap;
};

static enum sp_status piece_add(struct pieces *p, size_t s, size_t e, bool m) {
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 64;
        void *nv = p->v ? sp_realloc(p->v, (size_t)cap * sizeof *p->v) : sp_malloc((size_t)cap * sizeof *p->v, SP_MEM_TOKENIZER);
        if (!nv) return sp_errorf(SP_ERR_NOMEM, "pre-tokenizer: out of memory");
        p->v = nv;
        p->cap = cap;
    }
    p->v[p->n++] = (struct piece){s, e, m};
    return SP_OK;
}

static bool is_numeric(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* Cuts s[0..n) into alternating non-match / match pieces for the stage's
 * delimiter (regex, literal, digits or the Metaspace character). */
static enum sp_status find_pieces(const struct pt_stage *stg, const char *s, size_t n, struct sp_rx *rx,
                                  struct pieces *out) {
    enum sp_status st = SP_OK;
    size_t prev = 0;
    out->n = 0;
    if (stg->kind == P_DIGITS || stg->kind == P_METASPACE) {
        const unsigned char *p = (const unsigned char *)s;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int k = sp_utf8_decode(p + i, n - i, &cp);
            size_t cl = k > 0 ? (size_t)k : 1;
            bool hit = stg->kind == P_DIGITS ? (k > 0 && (cp - '0' < 10u || (cp >= 0x80 && is_numeric(cp))))
                                             : (cl == stg->repl_len && memcmp(s + i, stg->repl, cl) == 0);
            if (hit) {
                if (prev < i && (st = piece_add(out, prev, i, false)) != SP_OK) return st;
                if ((st = piece_add(out, i, i + cl, true)) != SP_OK) return st;
                prev = i + cl;
            }
            i += cl;
        }
    } else {
        size_t from = 0, ms, me;
        while (sp_pattern_find(&stg->pat, s, n, from, rx, &ms, &me, &st)) {
            if (prev < ms && (st = piece_add(out, prev, ms, false)) != SP_OK) return st;
            if ((st = piece_add(out, ms, me, true)) != SP_OK) return st;
            prev = me;
            from = me > ms ? me : me + (me < n ? (size_t)sp_utf8_len((unsigned char)s[me]) : 1);
            if (from > n) break;
        }
        if (st != SP_OK) return st;
    }
    if (prev < n) return piece_add(out, prev, n, false);
    return SP_OK;
}

/* Applies invert and the delimiter behavior to the pieces, in place:
 * afterwards every piece with m == false is kept, m == true is removed. */
static void fold_pieces(struct pieces *p, enum behavior b, bool invert) {
    if (invert)
        for (int64_t i = 0; i < p->n; i++) p->v[i].m = !p->v[i].m;
    int64_t k = 0;
    bool prev = false;
    switch (b) {
    case B_REMOVED:
        return;
    case B_ISOLATED:
        for (int64_t i = 0; i < p->n; i++) p->v[i].m = false;
        return;
    case B_MERGED_PREV:
    case B_CONTIGUOUS:
        for (int64_t i = 0; i < p->n; i++) {
            bool m = p->v[i].m;
            bool join = b == B_MERGED_PREV ? (m && !prev) : (m == prev);
            if (join && k > 0) {
                p->v[k - 1].e = p->v[i].e;
            } else {
                p->v[k] = p->v[i];
                p->v[k].m = false;
                k++;
            }
            prev = m;
        }
        p->n = k;
        return;
    case B_MERGED_NEXT:
        /* Walk backwards: a match joins the piece that follows it. */
        k = p->n;
        for (int64_t i = p->n - 1; i >= 0; i--) {
            bool m = p->v[i].m;
            if (m && !prev && k < p->n) {
                p->v[k].s = p->v[i].s;
            } else {
                k--;
                p->v[k] = p->v[i];
                p->v[k].m = false;
            }
            prev = m;
        }
        memmove(p->v, p->v + k, (size_t)(p->n - k) * sizeof *p->v);
        p->n -= k;
        return;
    }
}

/* Whether a stage only cuts text, never rewrites it. */
static bool stage_pure(const struct pt_stage *stg, bool map_bytes) {
    if (stg->kind == P_METASPACE) return false;
    if (stg->kind == P_BYTELEVEL) return !stg->add_prefix_space && !map_bytes;
    return true;
}

/* Runs one stage from `in` to `out`. A stage that only cuts keeps the text
 * where it is: its ranges point into in's text, which then moves to out. */
static enum sp_status stage_run(const struct pt_stage *stg, struct sp_splits *in, struct sp_splits *out,
                                struct sp_rx *rx, bool map_bytes, struct pieces *pc, struct sp_buf *tmp) {
    enum sp_status st = SP_OK;
    bool pure = stage_pure(stg, map_bytes);
    sp_buf_clear(&out->text);
    out->n = 0;
    for (int64_t r = 0; r < in->n; r++) {
        const char *s = in->text.data + in->r[r].off;
        size_t n = in->r[r].len;
        bool origin = in->r[r].origin;
        /* Stages that rewrite the text before splitting it. */
        if (stg->kind == P_BYTELEVEL && stg->add_prefix_space && (n == 0 || s[0] != ' ')) {
            sp_buf_clear(tmp);
            sp_buf_putc(tmp, ' ');
            if ((st = sp_buf_append(tmp, s, n)) != SP_OK) return st;
            s = tmp->data;
            n = tmp->len;
        } else if (stg->kind == P_METASPACE) {
            sp_buf_clear(tmp);
            bool starts = n >= stg->repl_len && memcmp(s, stg->repl, stg->repl_len) == 0;
            /* A leading space becomes the replacement too, so test for it. */
            if (n > 0 && s[0] == ' ') starts = true;
            if (!starts && (stg->scheme == PS_ALWAYS || (stg->scheme == PS_FIRST && origin)))
                sp_buf_append(tmp, stg->repl, stg->repl_len);
            for (size_t i = 0; i < n; i++) {
                if (s[i] == ' ') sp_buf_append(tmp, stg->repl, stg->repl_len);
                else sp_buf_putc(tmp, s[i]);
            }
            if (tmp->failed) return sp_errorf(SP_ERR_NOMEM, "pre-tokenizer: out of memory");
            s = tmp->data ? tmp->data : "";
            n = tmp->len;
        }
        if (n == 0) continue;
        bool do_split = !(stg->kind == P_BYTELEVEL && !stg->use_regex) && !(stg->kind == P_METASPACE && !stg->split);
        if (do_split) {
            if ((st = find_pieces(stg, s, n, rx, pc)) != SP_OK) return st;
            fold_pieces(pc, stg->behavior, stg->invert);
        } else {
            pc->n = 0;
            if ((st = piece_add(pc, 0, n, false)) != SP_OK) return st;
        }
        bool first = true;
        for (int64_t i = 0; i < pc->n; i++) {
            if (pc->v[i].m || pc->v[i].e == pc->v[i].s) continue;
            bool o = origin && first && pc->v[i].s == 0;
            first = false;
            if (pure) {
                if ((st = range_push(out, in->r[r].off + pc->v[i].s, pc->v[i].e - pc->v[i].s, o)) != SP_OK) return st;
            } else if (stg->kind == P_BYTELEVEL && map_bytes) {
                size_t off = out->text.len;
                if ((st = sp_bytelevel_map(s + pc->v[i].s, pc->v[i].e - pc->v[i].s, &out->text)) != SP_OK) return st;
                if ((st = range_push(out, off, out->text.len - off, o)) != SP_OK) return st;
            } else if ((st = sp_splits_add(out, s + pc->v[i].s, pc->v[i].e - pc->v[i].s, o)) != SP_OK) {
                return st;
            }
        }
    }
    if (pure) {
        struct sp_buf t = in->text;
        in->text = out->text;
        out->text = t;
    }
    return SP_OK;
}

enum sp_status sp_pretok_run(const struct sp_pretok *pt, struct sp_splits *w, struct sp_splits *tmp, struct sp_rx *rx,
                             bool defer_bytelevel) {
    if (!pt) return SP_OK;
    struct pieces pc = {0};
    struct sp_buf scratch = SP_BUF_INIT;
    enum sp_status st = SP_OK;
    for (int64_t i = 0; i < pt->n && st == SP_OK; i++) {
        bool map = !(defer_bytelevel && i == pt->n - 1);
        const struct pt_stage *stg = &pt->st[i];
        if (stg->kind == P_BYTELEVEL && !stg->use_regex && stage_pure(stg, map)) continue;  // nothing to do
        st = stage_run(stg, w, tmp, rx, map, &pc, &scratch);
        struct sp_splits t = *w;
        *w = *tmp;
        *tmp = t;
    }
    sp_free(pc.v);
    sp_buf_free(&scratch);
    return st;
}
