/* detok.c - incremental decoding by re-decoding a short window of ids. */
#include "tokenizer/detok.h"

#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "tokenizer/decoder.h"
#include "tokenizer/pretok.h"

struct sp_detok {
    const struct sp_tokenizer *t;
    unsigned flags;
    struct sp_ids win;    // ids since the last cut
    bool at_start;        // win begins the text
    bool whole;           // the decoder cannot run on windows: win is never cut
    size_t emitted;       // bytes of decode(win) already emitted
    struct sp_buf shown;  // those bytes, to check that later decodes keep them
    struct sp_buf raw, text;  // scratch
    struct sp_buf pend;   // clean-up mode: text not yet cleaned and emitted
    struct sp_dec_work work;  // reused by every decode
};

enum sp_status sp_detok_new(const struct sp_tokenizer *t, unsigned flags, struct sp_detok **out) {
    *out = NULL;
    struct sp_detok *d = sp_calloc(1, sizeof *d, SP_MEM_TOKENIZER);
    if (!d) return sp_errorf(SP_ERR_NOMEM, "detokenizer: out of memory");
    enum sp_status st = sp_dec_work_init(&d->work);
    if (st != SP_OK) {
        sp_free(d);
        return st;
    }
    d->t = t;
    d->flags = flags & SP_TOK_SKIP_SPECIAL;
    d->whole = !sp_tokenizer_windowable(t);
    d->at_start = true;
    *out = d;
    return SP_OK;
}

void sp_detok_free(struct sp_detok *d) {
    if (!d) return;
    sp_ids_free(&d->win);
    sp_buf_free(&d->shown);
    sp_buf_free(&d->raw);
    sp_buf_free(&d->text);
    sp_buf_free(&d->pend);
    sp_dec_work_free(&d->work);
    sp_free(d);
}

void sp_detok_reset(struct sp_detok *d) {
    d->win.n = 0;
    d->at_start = true;
    d->emitted = 0;
    sp_buf_clear(&d->shown);
    sp_buf_clear(&d->pend);
}

/* Passes valid text on to out, through the clean-up hold-back when the
 * tokenizer cleans spaces. final: nothing more will follow. */
static enum sp_status deliver(struct sp_detok *d, const char *s, size_t n, bool final, struct sp_buf *out) {
    if (!sp_tokenizer_cleans_spaces(d->t)) return sp_buf_append(out, s, n);
    enum sp_status st = sp_buf_append(&d->pend, s, n);
    if (st != SP_OK) return st;
    size_t k = final ? d->pend.len : sp_cleanup_safe_prefix(d->pend.data, d->pend.len);
    if (k == 0) return SP_OK;
    if ((st = sp_cleanup_spaces(d->pend.data, k, out)) != SP_OK) return st;
    memmove(d->pend.data, d->pend.data + k, d->pend.len - k);
    d->pend.len -= k;
    d->pend.data[d->pend.len] = 0;
    return SP_OK;
}

static bool all_skipped(const struct sp_detok *d) {
    if (!(d->flags & SP_TOK_SKIP_SPECIAL)) return false;
    for (int64_t i = 0; i < d->win.n; i++)
        if (!sp_tokenizer_is_special(d->t, d->win.v[i])) return false;
    return true;
}

enum sp_status sp_detok_push(struct sp_detok *d, int32_t id, struct sp_buf *out) {
    enum sp_status st;
    size_t len;
    if (!sp_tokenizer_token(d->t, id, &len))
        return sp_errorf(SP_ERR_ARG, "token id %d is outside the vocabulary (size %lld)", id,
                         (long long)sp_tokenizer_vocab_size(d->t));
    if ((st = sp_ids_push(&d->win, id)) != SP_OK) return st;
    sp_buf_clear(&d->raw);
    if ((st = sp_tokenizer_decode_raw(d->t, d->win.v, d->win.n, d->flags, d->at_start, &d->work, &d->raw)) != SP_OK) {
        d->win.n--;
        return st;
    }
    const char *r = d->raw.data ? d->raw.data : "";
    if (d->raw.len < d->emitted || memcmp(r, d->shown.data ? d->shown.data : "", d->emitted) != 0)
        return sp_errorf(SP_ERR_STATE, "detokenizer: the decoder changed text it had already produced");
    if (d->raw.len == 0 && all_skipped(d)) {
        d->win.n = 0;  // only skipped tokens: nothing to keep
        return SP_OK;
    }
    size_t tail = sp_utf8_incomplete_tail(r, d->raw.len);
    size_t upto = d->raw.len - tail;
    if (upto <= d->emitted) return SP_OK;
    sp_buf_clear(&d->text);
    if ((st = sp_utf8_sanitize(r + d->emitted, upto - d->emitted, &d->text)) != SP_OK) return st;
    if ((st = deliver(d, d->text.data, d->text.len, false, out)) != SP_OK) return st;
    if (tail == 0 && !d->whole) {
        /* Complete text: later ids decode as a continuation. */
        d->win.n = 0;
        d->at_start = false;
        d->emitted = 0;
        sp_buf_clear(&d->shown);
        return SP_OK;
    }
    if ((st = sp_buf_append(&d->shown, r + d->emitted, upto - d->emitted)) != SP_OK) return st;
    d->emitted = upto;
    return SP_OK;
}

/* Appends the held-back text; with `final`, also empties the clean-up
 * hold-back (flush), else copies it (peek). */
static enum sp_status rest(struct sp_detok *d, bool final, struct sp_buf *out) {
    enum sp_status st;
    sp_buf_clear(&d->raw);
    if ((st = sp_tokenizer_decode_raw(d->t, d->win.v, d->win.n, d->flags, d->at_start, &d->work, &d->raw)) != SP_OK)
        return st;
    sp_buf_clear(&d->text);
    if (d->raw.len > d->emitted && (st = sp_utf8_sanitize(d->raw.data + d->emitted, d->raw.len - d->emitted, &d->text)) != SP_OK)
        return st;
    if (final) return deliver(d, d->text.data ? d->text.data : "", d->text.len, true, out);
    if (!sp_tokenizer_cleans_spaces(d->t)) return sp_buf_append(out, d->text.data ? d->text.data : "", d->text.len);
    struct sp_buf all = SP_BUF_INIT;
    sp_buf_append(&all, d->pend.data ? d->pend.data : "", d->pend.len);
    sp_buf_append(&all, d->text.data ? d->text.data : "", d->text.len);
    st = all.failed ? sp_errorf(SP_ERR_NOMEM, "detokenizer: out of memory") : sp_cleanup_spaces(all.data ? all.data : "", all.len, out);
    sp_buf_free(&all);
    return st;
}

enum sp_status sp_detok_peek(struct sp_detok *d, struct sp_buf *out) { return rest(d, false, out); }

enum sp_status sp_detok_flush(struct sp_detok *d, struct sp_buf *out) {
    enum sp_status st = rest(d, true, out);
    sp_detok_reset(d);
    return st;
}
