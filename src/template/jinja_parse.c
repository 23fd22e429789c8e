/*
 * jinja_parse.c - lexer and recursive-descent parser for the Jinja subset
 * chat templates use. The lexer applies the whitespace rules (`{%-`, `-%}`,
 * trim_blocks, lstrip_blocks) so the tree holds exactly the text to print;
 * the expression grammar and its precedence follow jinja2's parser.
 */
#include "template/jinja_parse.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/json.h"

/* Nesting limits: blocks inside blocks, and expression depth. Both keep the
 * parser (and later the evaluator) well inside the C stack. */
#define MAX_BLOCK_DEPTH 100
#define MAX_EXPR_DEPTH  200

/* ---- lexer ---------------------------------------------------------------- */

enum tok_type {
    T_EOF,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
};

struct token {
    enum tok_type t;
    int line;
    const char *p; // T_TEXT, T_NAME, T_OP, T_STRING (unescaped, arena): the bytes
    size_t n;
    struct sp_jv val; // T_INT, T_FLOAT
};

struct lexer {
    struct sp_jarena *a;
    const char *src;
    size_t len, pos;
    int line;
    bool line_starting; // the last tag ended at the start of a line
    struct token *toks;
    int64_t n, cap;
};

static enum sp_status lex_fail(struct lexer *lx, int line, const char *what) {
    return sp_errorf(SP_ERR_FORMAT, "line %d: %s", line, what);
}

static enum sp_status push(struct lexer *lx, struct token t) {
    if (lx->n == lx->cap) {
        int64_t cap = lx->cap ? lx->cap * 2 : 256;
        struct token *nt = lx->toks ? sp_realloc(lx->toks, (size_t)cap * sizeof *nt)
                                    : sp_malloc((size_t)cap * sizeof *nt, SP_MEM_TOKENIZER);
        if (!nt) return sp_errorf(SP_ERR_NOMEM, "out of memory parsing a template");
        lx->toks = nt;
        lx->cap = cap;
    }
    lx->toks[lx->n++] = t;
    return SP_OK;
}

/* Moves pos forward to `to`, counting lines. */
static void advance(struct lexer *lx, size_t to) {
    for (size_t i = lx->pos; i < to; i++)
        if (lx->src[i] == '\n') lx->line++;
    lx->pos = to;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* Python str.rstrip() of src[start, end): the new end. */
static size_t rstrip_ws(const char *s, size_t start, size_t end) {
    while (end > start) {
        size_t k = end - 1;
        // Step back over a UTF-8 sequence to test the whole code point.
        while (k > start && ((unsigned char)s[k] & 0xc0) == 0x80 && end - k < 4) k--;
        int32_t cp;
        sp_utf8_next(s + k, end - k, &cp);
        if (!sp_unicode_isspace(cp)) break;
        end = k;
    }
    return end;
}

/* Python str.lstrip()-like skip of all whitespace from pos. */
static size_t skip_all_ws(const char *s, size_t pos, size_t len) {
    while (pos < len) {
        int32_t cp;
        size_t l = sp_utf8_next(s + pos, len - pos, &cp);
        if (!sp_unicode_isspace(cp)) break;
        pos += l;
    }
    return pos;
}

/* Applies what a tag's closing marker does to the text after it: `-` eats
 * all whitespace, plain block and comment ends eat one newline
 * (trim_blocks). */
static void after_tag(struct lexer *lx, char sign, bool is_block) {
    size_t p = lx->pos;
    if (sign == '-')
        p = skip_all_ws(lx->src, p, lx->len);
    else if (sign != '+' && is_block && p < lx->len && lx->src[p] == '\n')
        p++;
    lx->line_starting = p > lx->pos ? lx->src[p - 1] == '\n' : false;
    advance(lx, p);
}

/* Emits src[start, end) as text, first applying the opening marker's
 * whitespace rule: `{%-` strips all whitespace before it, a plain `{%` or
 * `{#` strips the indentation of its line (lstrip_blocks). */
static enum sp_status emit_text(struct lexer *lx, size_t start, size_t end, char kind, char sign, int line) {
    if (sign == '-') {
        end = rstrip_ws(lx->src, start, end);
    } else if (kind != '{' && sign != '+') {
        size_t l = end;
        while (l > start && lx->src[l - 1] != '\n') l--;
        if (l > start || lx->line_starting) {
            bool blank = true;
            for (size_t i = l; i < end; i++)
                if (lx->src[i] != ' ' && lx->src[i] != '\t') blank = false;
            if (blank) end = l;
        }
    }
    if (end > start) return push(lx, (struct token){.t = T_TEXT, .line = line, .p = lx->src + start, .n = end - start});
    return SP_OK;
}

/* Unescapes a string literal body with Python's escape rules. */
static enum sp_status lex_string(struct lexer *lx, char q) {
    size_t start = lx->pos + 1, i = start;
    int line = lx->line;
    while (i < lx->len && lx->src[i] != q) i += (lx->src[i] == '\\' && i + 1 < lx->len) ? 2 : 1;
    if (i >= lx->len) return lex_fail(lx, line, "unterminated string literal");
    struct sp_buf b = SP_BUF_INIT;
    for (size_t k = start; k < i; k++) {
        char c = lx->src[k];
        if (c != '\\') {
            sp_buf_putc(&b, c);
            continue;
        }
        char e = lx->src[++k];
        int32_t cp = -1;
        int digits = 0;
        switch (e) {
        case 'n':
            sp_buf_putc(&b, '\n');
            break;
        case 't':
            sp_buf_putc(&b, '\t');
            break;
        case 'r':
            sp_buf_putc(&b, '\r');
            break;
        case 'b':
            sp_buf_putc(&b, '\b');
            break;
        case 'f':
            sp_buf_putc(&b, '\f');
            break;
        case 'v':
            sp_buf_putc(&b, '\v');
            break;
        case 'a':
            sp_buf_putc(&b, '\a');
            break;
        case '\\':
            sp_buf_putc(&b, '\\');
            break;
        case '\'':
            sp_buf_putc(&b, '\'');
            break;
        case '"':
            sp_buf_putc(&b, '"');
            break;
        case '\n':
            break; // line continuation
        case 'x':
            digits = 2;
            break;
        case 'u':
            digits = 4;
            break;
        case 'U':
            digits = 8;
            break;
        default:
            if (e >= '0' && e <= '7') {
                cp = 0;
                int nd = 0;
                while (nd < 3 && k < i && lx->src[k] >= '0' && lx->src[k] <= '7')
                    cp = cp * 8 + (lx->src[k++] - '0'), nd++;
                k--;
                sp_utf8_put(&b, cp);
            } else {
                sp_buf_putc(&b, '\\');
                sp_buf_putc(&b, e);
            }
        }
        if (digits) {
            cp = 0;
            for (int d = 0; d < digits; d++) {
                int h = k + 1 < i ? sp_hex_digit(lx->src[k + 1]) : -1;
                if (h < 0) {
                    sp_buf_free(&b);
                    return lex_fail(lx, line, "truncated \\x, \\u or \\U escape in a string literal");
                }
                cp = cp * 16 + h;
                k++;
            }
            if (cp > 0x10ffff) {
                sp_buf_free(&b);
                return lex_fail(lx, line, "escape out of the Unicode range in a string literal");
            }
            sp_utf8_put(&b, cp);
        }
    }
    if (b.failed) {
        sp_buf_free(&b);
        return sp_errorf(SP_ERR_NOMEM, "out of memory parsing a template");
    }
    char *s = sp_jarena_strdup(lx->a, b.data ? b.data : "", b.len);
    size_t n = b.len;
    sp_buf_free(&b);
    if (!s) return SP_ERR_LIMIT;
    advance(lx, i + 1);
    return push(lx, (struct token){.t = T_STRING, .line = line, .p = s, .n = n});
}

/* Lexes an integer or float literal (digits may be grouped with '_'). */
static enum sp_status lex_number(struct lexer *lx) {
    size_t i = lx->pos;
    int line = lx->line;
    struct sp_buf b = SP_BUF_INIT; // the literal without underscores
    bool is_float = false;
    const char *s = lx->src;
    size_t len = lx->len;
    // Digits with single underscores between them, as Python writes them.
#define DIGITS()                                                                                                       \
    while (i < len && (is_digit(s[i]) || (s[i] == '_' && i + 1 < len && is_digit(s[i + 1])))) {                        \
        if (s[i] != '_') sp_buf_putc(&b, s[i]);                                                                        \
        i++;                                                                                                           \
    }
    DIGITS();
    bool after_dot = lx->pos > 0 && s[lx->pos - 1] == '.'; // foo.0.1 is two lookups
    if (!after_dot && i + 1 < len && s[i] == '.' && is_digit(s[i + 1])) {
        is_float = true;
        sp_buf_putc(&b, s[i++]);
        DIGITS();
    }
    if (!after_dot && i < len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < len && (s[j] == '+' || s[j] == '-')) j++;
        if (j < len && is_digit(s[j])) {
            is_float = true;
            sp_buf_append(&b, s + i, j - i);
            i = j;
            DIGITS();
        }
    }
#undef DIGITS
    if (b.failed) {
        sp_buf_free(&b);
        return sp_errorf(SP_ERR_NOMEM, "out of memory parsing a template");
    }
    struct token t = {.t = is_float ? T_FLOAT : T_INT, .line = line};
    errno = 0;
    if (is_float) {
        t.val = sp_jv_float(strtod(b.data, NULL));
    } else {
        long long v = strtoll(b.data, NULL, 10);
        // Python's integers are unbounded; past 64 bits the nearest double is kept.
        t.val = errno == ERANGE ? sp_jv_float(strtod(b.data, NULL)) : sp_jv_int(v);
    }
    sp_buf_free(&b);
    advance(lx, i);
    return push(lx, t);
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                  "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", ";", NULL};

/* Lexes the inside of `{{ ... }}` or `{% ... %}` up to and including the
 * closing marker. `block` selects which marker closes it. */
static enum sp_status lex_tag(struct lexer *lx, bool block) {
    int depth = 0; // open brackets: a closing marker inside them is an operator
    enum sp_status st;
    for (;;) {
        while (lx->pos < lx->len && is_ws(lx->src[lx->pos])) advance(lx, lx->pos + 1);
        if (lx->pos >= lx->len)
            return lex_fail(lx, lx->line,
                            block ? "unexpected end of template, expected '%}'"
                                  : "unexpected end of template, expected '}}'");
        const char *s = lx->src + lx->pos;
        size_t left = lx->len - lx->pos;
        if (depth == 0) {
            const char *close = block ? "%}" : "}}";
            char sign = 0;
            size_t mlen = 0;
            if (left >= 3 && (s[0] == '-' || (block && s[0] == '+')) && memcmp(s + 1, close, 2) == 0) {
                sign = s[0];
                mlen = 3;
            } else if (left >= 2 && memcmp(s, close, 2) == 0) {
                mlen = 2;
            }
            if (mlen) {
                int line = lx->line;
                advance(lx, lx->pos + mlen);
                if ((st = push(lx, (struct token){.t = block ? T_BLOCK_END : T_VAR_END, .line = line})) != SP_OK)
                    return st;
                after_tag(lx, sign, block);
                return SP_OK;
            }
        }
        char c = s[0];
        if (is_name_start(c)) {
            size_t n = 1;
            while (n < left && is_name_char(s[n])) n++;
            if ((st = push(lx, (struct token){.t = T_NAME, .line = lx->line, .p = s, .n = n})) != SP_OK) return st;
            advance(lx, lx->pos + n);
        } else if (is_digit(c)) {
            if ((st = lex_number(lx)) != SP_OK) return st;
        } else if (c == '\'' || c == '"') {
            if ((st = lex_string(lx, c)) != SP_OK) return st;
        } else {
            const char *op = NULL;
            for (int k = 0; OPS[k]; k++) {
                size_t ol = strlen(OPS[k]);
                if (ol <= left && memcmp(s, OPS[k], ol) == 0) {
                    op = OPS[k];
                    break;
                }
            }
            if (!op) return sp_errorf(SP_ERR_FORMAT, "line %d: unexpected character '%c'", lx->line, c);
            if (*op == '(' || *op == '[' || *op == '{') depth++;
            if ((*op == ')' || *op == ']' || *op == '}') && depth > 0) depth--;
            if ((st = push(lx, (struct token){.t = T_OP, .line = lx->line, .p = op, .n = strlen(op)})) != SP_OK)
                return st;
            advance(lx, lx->pos + strlen(op));
        }
    }
}

/* True when a `{% raw %}` tag starts at pos (just after `{%` and its sign);
 * sets *end to just after its `%}` and *sign to the closing sign. */
static bool match_raw(const char *s, size_t pos, size_t len, const char *word, size_t *end, char *sign) {
    while (pos < len && is_ws(s[pos])) pos++;
    size_t wl = strlen(word);
    if (pos + wl > len || memcmp(s + pos, word, wl) != 0) return false;
    pos += wl;
    if (pos < len && is_name_char(s[pos])) return false;
    while (pos < len && is_ws(s[pos])) pos++;
    *sign = 0;
    if (pos < len && (s[pos] == '-' || s[pos] == '+')) *sign = s[pos++];
    if (pos + 2 > len || memcmp(s + pos, "%}", 2) != 0) return false;
    *end = pos + 2;
    return true;
}

static enum sp_status lex_all(struct lexer *lx) {
    enum sp_status st;
    lx->line_starting = true;
    while (lx->pos < lx->len) {
        const char *s = lx->src;
        size_t t = lx->pos;
        while (t + 1 < lx->len && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= lx->len) {
            // Text up to the end of the template.
            if ((st = emit_text(lx, lx->pos, lx->len, '{', 0, lx->line)) != SP_OK) return st;
            advance(lx, lx->len);
            break;
        }
        char kind = s[t + 1];
        char sign = (t + 2 < lx->len && (s[t + 2] == '-' || s[t + 2] == '+')) ? s[t + 2] : 0;
        if (kind == '{' && sign == '+') sign = 0; // `{{+` is not a marker
        if ((st = emit_text(lx, lx->pos, t, kind, sign, lx->line)) != SP_OK) return st;
        advance(lx, t);
        int line = lx->line;
        size_t body = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t k = body; k + 1 < lx->len; k++)
                if (s[k] == '#' && s[k + 1] == '}') {
                    e = s + k;
                    break;
                }
            if (!e) return lex_fail(lx, line, "unterminated comment");
            char esign = (e > s + body && (e[-1] == '-' || e[-1] == '+')) ? e[-1] : 0;
            advance(lx, (size_t)(e - s) + 2);
            after_tag(lx, esign, true);
            continue;
        }
        size_t raw_end;
        char raw_sign;
        if (kind == '%' && match_raw(s, body, lx->len, "raw", &raw_end, &raw_sign)) {
            advance(lx, raw_end);
            after_tag(lx, raw_sign, true);
            size_t start = lx->pos, k = start;
            size_t end_tag = 0, end_after = 0;
            char open_sign = 0, close_sign = 0;
            for (; k + 1 < lx->len; k++) {
                if (s[k] != '{' || s[k + 1] != '%') continue;
                size_t b2 = k + 2;
                char os = (b2 < lx->len && (s[b2] == '-' || s[b2] == '+')) ? s[b2] : 0;
                if (os) b2++;
                if (match_raw(s, b2, lx->len, "endraw", &end_after, &close_sign)) {
                    end_tag = k;
                    open_sign = os;
                    break;
                }
            }
            if (!end_after) return lex_fail(lx, line, "missing endraw");
            if ((st = emit_text(lx, start, end_tag, '%', open_sign, lx->line)) != SP_OK) return st;
            advance(lx, end_after);
            after_tag(lx, close_sign, true);
            continue;
        }
        if ((st = push(lx, (struct token){.t = kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, .line = line})) != SP_OK)
            return st;
        advance(lx, body);
        if ((st = lex_tag(lx, kind == '%')) != SP_OK) return st;
    }
    return push(lx, (struct token){.t = T_EOF, .line = lx->line});
}

/* ---- parser --------------------------------------------------------------- */

struct parser {
    struct sp_jarena *a;
    struct token *t;
    int64_t pos, n;
    int block_depth, expr_depth;
};

static struct token *cur(struct parser *p) { return &p->t[p->pos]; }
static struct token *peek(struct parser *p, int k) {
    int64_t i = p->pos + k;
    return &p->t[i < p->n ? i : p->n - 1];
}

static bool tok_is(const struct token *t, enum tok_type type, const char *text) {
    if (t->t != type) return false;
    if (!text) return true;
    size_t l = strlen(text);
    return t->n == l && memcmp(t->p, text, l) == 0;
}
static bool is_op(struct parser *p, const char *op) { return tok_is(cur(p), T_OP, op); }
static bool is_name(struct parser *p, const char *name) { return tok_is(cur(p), T_NAME, name); }

static const char *describe(const struct token *t) {
    switch (t->t) {
    case T_EOF:
        return "end of template";
    case T_TEXT:
        return "text";
    case T_VAR_BEGIN:
        return "'{{'";
    case T_VAR_END:
        return "'}}'";
    case T_BLOCK_BEGIN:
        return "'{%'";
    case T_BLOCK_END:
        return "'%}'";
    case T_STRING:
        return "string";
    case T_INT:
    case T_FLOAT:
        return "number";
    default:
        return NULL;
    }
}

static enum sp_status fail_at(struct parser *p, const char *expected) {
    const struct token *t = cur(p);
    const char *d = describe(t);
    if (d) return sp_errorf(SP_ERR_FORMAT, "line %d: expected %s, got %s", t->line, expected, d);
    return sp_errorf(SP_ERR_FORMAT, "line %d: expected %s, got '%.*s'", t->line, expected, (int)t->n, t->p);
}

static enum sp_status expect_op(struct parser *p, const char *op) {
    if (!is_op(p, op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op);
        return fail_at(p, what);
    }
    p->pos++;
    return SP_OK;
}

static enum sp_status expect(struct parser *p, enum tok_type type, const char *what) {
    if (cur(p)->t != type) return fail_at(p, what);
    p->pos++;
    return SP_OK;
}

static struct sp_jnode *node(struct parser *p, enum sp_jnode_kind kind, int line) {
    struct sp_jnode *n = sp_jarena_alloc(p->a, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = line;
    return n;
}

/* A growable list of child nodes, copied into the arena when done. */
struct kids {
    struct sp_jnode **v;
    int64_t n, cap;
};

static enum sp_status kids_push(struct parser *p, struct kids *k, struct sp_jnode *n) {
    if (k->n == k->cap) {
        int64_t cap = k->cap ? k->cap * 2 : 4;
        struct sp_jnode **v = sp_jarena_alloc(p->a, (size_t)cap * sizeof *v);
        if (!v) return SP_ERR_LIMIT;
        if (k->n) memcpy(v, k->v, (size_t)k->n * sizeof *v);
        k->v = v;
        k->cap = cap;
    }
    k->v[k->n++] = n;
    return SP_OK;
}

static char *name_str(struct parser *p, const struct token *t) { return sp_jarena_strdup(p->a, t->p, t->n); }

static enum sp_status parse_expr(struct parser *p, bool with_cond, struct sp_jnode **out);
static enum sp_status parse_tuple(struct parser *p, bool with_cond, bool simplified, struct sp_jnode **out);
static enum sp_status parse_unary(struct parser *p, bool with_filter, struct sp_jnode **out);
static enum sp_status parse_primary(struct parser *p, struct sp_jnode **out);

#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        enum sp_status st_ = (x);                                                                                      \
        if (st_ != SP_OK) return st_;                                                                                  \
    } while (0)
#define NEW(var, kind, line)                                                                                           \
    do {                                                                                                               \
        if (!((var) = node(p, (kind), (line)))) return SP_ERR_LIMIT;                                                   \
    } while (0)

/* Call arguments after '(' up to and including ')': positional expressions
 * and name=value keywords. */
static enum sp_status parse_args(struct parser *p, struct sp_jnode *call) {
    struct kids k = {0};
    TRY(expect_op(p, "("));
    while (!is_op(p, ")")) {
        if (k.n) {
            TRY(expect_op(p, ","));
            if (is_op(p, ")")) break;
        }
        struct sp_jnode *arg;
        if (cur(p)->t == T_NAME && tok_is(peek(p, 1), T_OP, "=")) {
            NEW(arg, SP_JN_KWARG, cur(p)->line);
            if (!(arg->str = name_str(p, cur(p)))) return SP_ERR_LIMIT;
            p->pos += 2;
            TRY(parse_expr(p, true, &arg->a));
        } else {
            TRY(parse_expr(p, true, &arg));
        }
        TRY(kids_push(p, &k, arg));
    }
    p->pos++;
    call->kids = k.v;
    call->nkids = k.n;
    return SP_OK;
}

/* A dotted name as filters and tests are written ("default", "divisibleby"). */
static enum sp_status parse_dotted_name(struct parser *p, const char **out) {
    if (cur(p)->t != T_NAME) return fail_at(p, "a name");
    struct sp_buf b = SP_BUF_INIT;
    sp_buf_append(&b, cur(p)->p, cur(p)->n);
    p->pos++;
    while (is_op(p, ".") && peek(p, 1)->t == T_NAME) {
        sp_buf_putc(&b, '.');
        sp_buf_append(&b, peek(p, 1)->p, peek(p, 1)->n);
        p->pos += 2;
    }
    char *s = b.failed ? NULL : sp_jarena_strdup(p->a, b.data, b.len);
    sp_buf_free(&b);
    if (!s) return SP_ERR_LIMIT;
    *out = s;
    return SP_OK;
}

static enum sp_status parse_subscript(struct parser *p, struct sp_jnode *obj, struct sp_jnode **out) {
    int line = cur(p)->line;
    p->pos++; // '['
    struct sp_jnode *parts[3] = {NULL, NULL, NULL};
    bool slice = false;
    int i = 0;
    for (;;) {
        if (is_op(p, ":")) {
            if (i >= 2) return fail_at(p, "']'");
            slice = true;
            i++;
            p->pos++;
            continue;
        }
        if (is_op(p, "]")) break;
        if (parts[i]) return fail_at(p, "':' or ']'");
        TRY(parse_expr(p, true, &parts[i]));
    }
    p->pos++;
    struct sp_jnode *n;
    if (slice) {
        NEW(n, SP_JN_SLICE, line);
        n->kids = sp_jarena_alloc(p->a, 3 * sizeof *n->kids);
        if (!n->kids) return SP_ERR_LIMIT;
        n->nkids = 3;
        for (int k = 0; k < 3; k++) n->kids[k] = parts[k];
    } else {
        if (!parts[0]) return sp_errorf(SP_ERR_FORMAT, "line %d: empty subscript", line);
        NEW(n, SP_JN_ITEM, line);
        n->b = parts[0];
    }
    n->a = obj;
    *out = n;
    return SP_OK;
}

static enum sp_status parse_postfix(struct parser *p, struct sp_jnode **io) {
    for (;;) {
        int line = cur(p)->line;
        if (is_op(p, ".")) {
            struct token *t = peek(p, 1);
            struct sp_jnode *n;
            if (t->t == T_NAME) {
                NEW(n, SP_JN_ATTR, line);
                if (!(n->str = name_str(p, t))) return SP_ERR_LIMIT;
            } else if (t->t == T_INT) {
                // foo.0 is foo[0]
                NEW(n, SP_JN_ITEM, line);
                NEW(n->b, SP_JN_LITERAL, line);
                n->b->val = t->val;
            } else {
                p->pos++;
                return fail_at(p, "an attribute name");
            }
            n->a = *io;
            p->pos += 2;
            *io = n;
        } else if (is_op(p, "[")) {
            TRY(parse_subscript(p, *io, io));
        } else if (is_op(p, "(")) {
            struct sp_jnode *n;
            NEW(n, SP_JN_CALL, line);
            n->a = *io;
            TRY(parse_args(p, n));
            *io = n;
        } else {
            return SP_OK;
        }
    }
}

/* Filters (`| name(args)`) and tests (`is [not] name args`) after an operand. */
static enum sp_status parse_filter_expr(struct parser *p, struct sp_jnode **io) {
    for (;;) {
        int line = cur(p)->line;
        if (is_op(p, "|")) {
            p->pos++;
            struct sp_jnode *n;
            NEW(n, SP_JN_FILTER, line);
            TRY(parse_dotted_name(p, &n->str));
            if (is_op(p, "(")) TRY(parse_args(p, n));
            n->a = *io;
            *io = n;
        } else if (is_name(p, "is")) {
            p->pos++;
            struct sp_jnode *n;
            NEW(n, SP_JN_TEST, line);
            if (is_name(p, "not")) {
                n->op = 1;
                p->pos++;
            }
            TRY(parse_dotted_name(p, &n->str));
            const struct token *t = cur(p);
            if (is_op(p, "(")) {
                TRY(parse_args(p, n));
            } else if ((t->t == T_NAME || t->t == T_STRING || t->t == T_INT || t->t == T_FLOAT ||
                        tok_is(t, T_OP, "[") || tok_is(t, T_OP, "{")) &&
                       !tok_is(t, T_NAME, "else") && !tok_is(t, T_NAME, "or") && !tok_is(t, T_NAME, "and") &&
                       !tok_is(t, T_NAME, "is") && !tok_is(t, T_NAME, "if") && !tok_is(t, T_NAME, "in") &&
                       !tok_is(t, T_NAME, "not")) {
                // One argument without parentheses: `is divisibleby 3`.
                struct sp_jnode *arg;
                TRY(parse_primary(p, &arg));
                TRY(parse_postfix(p, &arg));
                n->kids = sp_jarena_alloc(p->a, sizeof *n->kids);
                if (!n->kids) return SP_ERR_LIMIT;
                n->kids[0] = arg;
                n->nkids = 1;
            }
            n->a = *io;
            *io = n;
        } else if (is_op(p, "(")) {
            struct sp_jnode *n;
            NEW(n, SP_JN_CALL, line);
            n->a = *io;
            TRY(parse_args(p, n));
            *io = n;
        } else {
            return SP_OK;
        }
    }
}

static enum sp_status parse_primary(struct parser *p, struct sp_jnode **out) {
    struct token *t = cur(p);
    int line = t->line;
    struct sp_jnode *n;
    if (++p->expr_depth > MAX_EXPR_DEPTH) return sp_errorf(SP_ERR_LIMIT, "line %d: expression nested too deeply", line);
    if (t->t == T_NAME) {
        static const struct {
            const char *name;
            enum sp_jv_type t;
            bool b;
        } consts[] = {{"true", SP_JV_BOOL, true},   {"True", SP_JV_BOOL, true}, {"false", SP_JV_BOOL, false},
                      {"False", SP_JV_BOOL, false}, {"none", SP_JV_NONE, 0},    {"None", SP_JV_NONE, 0}};
        for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++) {
            if (tok_is(t, T_NAME, consts[k].name)) {
                NEW(n, SP_JN_LITERAL, line);
                n->val = consts[k].t == SP_JV_BOOL ? sp_jv_bool(consts[k].b) : sp_jv_none();
                p->pos++;
                goto done;
            }
        }
        NEW(n, SP_JN_NAME, line);
        if (!(n->str = name_str(p, t))) return SP_ERR_LIMIT;
        n->len = t->n;
        p->pos++;
    } else if (t->t == T_STRING) {
        // Adjacent string literals concatenate, as in Python.
        struct sp_buf b = SP_BUF_INIT;
        while (cur(p)->t == T_STRING) {
            sp_buf_append(&b, cur(p)->p, cur(p)->n);
            p->pos++;
        }
        char *s = b.failed ? NULL : sp_jarena_strdup(p->a, b.data ? b.data : "", b.len);
        size_t len = b.len;
        sp_buf_free(&b);
        if (!s) return SP_ERR_LIMIT;
        NEW(n, SP_JN_LITERAL, line);
        n->val = sp_jv_strn(s, len);
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        NEW(n, SP_JN_LITERAL, line);
        n->val = t->val;
        p->pos++;
    } else if (tok_is(t, T_OP, "(")) {
        p->pos++;
        if (is_op(p, ")")) {
            p->pos++;
            NEW(n, SP_JN_TUPLE, line);
        } else {
            TRY(parse_tuple(p, true, false, &n));
            TRY(expect_op(p, ")"));
        }
    } else if (tok_is(t, T_OP, "[")) {
        p->pos++;
        NEW(n, SP_JN_LIST, line);
        struct kids k = {0};
        while (!is_op(p, "]")) {
            if (k.n) {
                TRY(expect_op(p, ","));
                if (is_op(p, "]")) break;
            }
            struct sp_jnode *item;
            TRY(parse_expr(p, true, &item));
            TRY(kids_push(p, &k, item));
        }
        p->pos++;
        n->kids = k.v;
        n->nkids = k.n;
    } else if (tok_is(t, T_OP, "{")) {
        p->pos++;
        NEW(n, SP_JN_DICT, line);
        struct kids k = {0};
        while (!is_op(p, "}")) {
            if (k.n) {
                TRY(expect_op(p, ","));
                if (is_op(p, "}")) break;
            }
            struct sp_jnode *pair;
            NEW(pair, SP_JN_PAIR, cur(p)->line);
            TRY(parse_expr(p, true, &pair->a));
            TRY(expect_op(p, ":"));
            TRY(parse_expr(p, true, &pair->b));
            TRY(kids_push(p, &k, pair));
        }
        p->pos++;
        n->kids = k.v;
        n->nkids = k.n;
    } else {
        return fail_at(p, "an expression");
    }
done:
    p->expr_depth--;
    *out = n;
    return SP_OK;
}

static enum sp_status parse_unary(struct parser *p, bool with_filter, struct sp_jnode **out) {
    int line = cur(p)->line;
    struct sp_jnode *n;
    if (is_op(p, "-") || is_op(p, "+")) {
        if (++p->expr_depth > MAX_EXPR_DEPTH)
            return sp_errorf(SP_ERR_LIMIT, "line %d: expression nested too deeply", line);
        NEW(n, SP_JN_UNARY, line);
        n->op = cur(p)->p[0];
        p->pos++;
        TRY(parse_unary(p, false, &n->a));
        p->expr_depth--;
    } else {
        TRY(parse_primary(p, &n));
    }
    TRY(parse_postfix(p, &n));
    if (with_filter) TRY(parse_filter_expr(p, &n));
    *out = n;
    return SP_OK;
}

static enum sp_status binary(struct parser *p, int op, int line, struct sp_jnode *l, struct sp_jnode *r,
                             struct sp_jnode **out) {
    struct sp_jnode *n;
    NEW(n, SP_JN_BINARY, line);
    n->op = op;
    n->a = l;
    n->b = r;
    *out = n;
    return SP_OK;
}

static enum sp_status parse_pow(struct parser *p, struct sp_jnode **out) {
    struct sp_jnode *l, *r;
    TRY(parse_unary(p, true, &l));
    while (is_op(p, "**")) {
        int line = cur(p)->line;
        p->pos++;
        TRY(parse_unary(p, true, &r));
        TRY(binary(p, SP_JOP_POW, line, l, r, &l));
    }
    *out = l;
    return SP_OK;
}

static enum sp_status parse_math2(struct parser *p, struct sp_jnode **out) {
    struct sp_jnode *l, *r;
    TRY(parse_pow(p, &l));
    for (;;) {
        int op = is_op(p, "*")    ? SP_JOP_MUL
                 : is_op(p, "/")  ? SP_JOP_DIV
                 : is_op(p, "//") ? SP_JOP_FLOORDIV
                 : is_op(p, "%")  ? SP_JOP_MOD
                                  : 0;
        if (!op) break;
        int line = cur(p)->line;
        p->pos++;
        TRY(parse_pow(p, &r));
        TRY(binary(p, op, line, l, r, &l));
    }
    *out = l;
    return SP_OK;
}

static enum sp_status parse_concat(struct parser *p, struct sp_jnode **out) {
    struct sp_jnode *l, *r;
    TRY(parse_math2(p, &l));
    while (is_op(p, "~")) {
        int line = cur(p)->line;
        p->pos++;
        TRY(parse_math2(p, &r));
        TRY(binary(p, SP_JOP_CONCAT, line, l, r, &l));
    }
    *out = l;
    return SP_OK;
}

static enum sp_status parse_math1(struct parser *p, struct sp_jnode **out) {
    struct sp_jnode *l, *r;
    TRY(parse_concat(p, &l));
    for (;;) {
        int op = is_op(p, "+") ? SP_JOP_ADD : is_op(p, "-") ? SP_JOP_SUB : 0;
        if (!op) break;
        int line = cur(p)->line;
        p->pos++;
        TRY(parse_concat(p, &r));
        TRY(binary(p, op, line, l, r, &l));
    }
    *out = l;
    return SP_OK;
}

static enum sp_status parse_compare(struct parser *p, struct sp_jnode **out) {
    struct sp_jnode *first;
    int line = cur(p)->line;
    TRY(parse_math1(p, &first));
    struct kids k = {0};
    for (;;) {
        int op = is_op(p, "==")     ? SP_JOP_EQ
                 : is_op(p, "!=")   ? SP_JOP_NE
                 : is_op(p, "<")    ? SP_JOP_LT
                 : is_op(p, "<=")   ? SP_JOP_LE
                 : is_op(p, ">")    ? SP_JOP_GT
                 : is_op(p, ">=")   ? SP_JOP_GE
                 : is_name(p, "in") ? SP_JOP_IN
                                    : 0;
        int skip = 1;
        if (!op && is_name(p, "not") && tok_is(peek(p, 1), T_NAME, "in")) {
            op = SP_JOP_NOTIN;
            skip = 2;
        }
        if (!op) break;
        struct sp_jnode *o;
        NEW(o, SP_JN_COMPARE_OP, cur(p)->line);
        o->op = op;
        p->pos += skip;
        TRY(parse_math1(p, &o->a));
        TRY(kids_push(p, &k, o));
    }
    if (!k.n) {
        *out = first;
        return SP_OK;
    }
    struct sp_jnode *n;
    NEW(n, SP_JN_COMPARE, line);
    n->a = first;
    n->kids = k.v;
    n->nkids = k.n;
    *out = n;
    return SP_OK;
}

static enum sp_status parse_not(struct parser *p, struct sp_jnode **out) {
    if (is_name(p, "not")) {
        int line = cur(p)->line;
        if (++p->expr_depth > MAX_EXPR_DEPTH)
            return sp_errorf(SP_ERR_LIMIT, "line %d: expression nested too deeply", line);
        p->pos++;
        struct sp_jnode *n;
        NEW(n, SP_JN_UNARY, line);
        n->op = 'n';
        TRY(parse_not(p, &n->a));
        p->expr_depth--;
        *out = n;
        return SP_OK;
    }
    return parse_compare(p, out);
}

static enum sp_status parse_and(struct parser *p, struct sp_jnode **out) {
    struct sp_jnode *l;
    TRY(parse_not(p, &l));
    while (is_name(p, "and")) {
        struct sp_jnode *n;
        NEW(n, SP_JN_AND, cur(p)->line);
        p->pos++;
        n->a = l;
        TRY(parse_not(p, &n->b));
        l = n;
    }
    *out = l;
    return SP_OK;
}

static enum sp_status parse_or(struct parser *p, struct sp_jnode **out) {
    struct sp_jnode *l;
    TRY(parse_and(p, &l));
    while (is_name(p, "or")) {
        struct sp_jnode *n;
        NEW(n, SP_JN_OR, cur(p)->line);
        p->pos++;
        n->a = l;
        TRY(parse_and(p, &n->b));
        l = n;
    }
    *out = l;
    return SP_OK;
}

/* expr [if cond [else expr]] when with_cond; the conditional nests to the
 * right, as in Python. */
static enum sp_status parse_expr(struct parser *p, bool with_cond, struct sp_jnode **out) {
    if (++p->expr_depth > MAX_EXPR_DEPTH)
        return sp_errorf(SP_ERR_LIMIT, "line %d: expression nested too deeply", cur(p)->line);
    struct sp_jnode *e;
    TRY(parse_or(p, &e));
    while (with_cond && is_name(p, "if")) {
        struct sp_jnode *n;
        NEW(n, SP_JN_COND, cur(p)->line);
        p->pos++;
        n->a = e;
        TRY(parse_or(p, &n->b));
        if (is_name(p, "else")) {
            p->pos++;
            TRY(parse_expr(p, true, &n->c));
        }
        e = n;
    }
    p->expr_depth--;
    *out = e;
    return SP_OK;
}

/* An expression, or a tuple of them when commas follow (`a, b`). With
 * `simplified`, only names (assignment targets) are accepted. */
static enum sp_status parse_tuple(struct parser *p, bool with_cond, bool simplified, struct sp_jnode **out) {
    int line = cur(p)->line;
    struct kids k = {0};
    bool comma = false;
    for (;;) {
        if (k.n) {
            if (!is_op(p, ",")) break;
            p->pos++;
            comma = true;
        }
        const struct token *t = cur(p);
        if (t->t == T_BLOCK_END || t->t == T_VAR_END || tok_is(t, T_OP, ")") || tok_is(t, T_NAME, "in") ||
            tok_is(t, T_OP, "=") || (k.n && tok_is(t, T_NAME, "if")))
            if (k.n) break;
        struct sp_jnode *e;
        if (simplified) {
            if (t->t != T_NAME) return fail_at(p, "a name");
            NEW(e, SP_JN_NAME, t->line);
            if (!(e->str = name_str(p, t))) return SP_ERR_LIMIT;
            e->len = t->n;
            p->pos++;
        } else {
            TRY(parse_expr(p, with_cond, &e));
        }
        TRY(kids_push(p, &k, e));
    }
    if (!comma) {
        *out = k.v[0];
        return SP_OK;
    }
    struct sp_jnode *n;
    NEW(n, SP_JN_TUPLE, line);
    n->kids = k.v;
    n->nkids = k.n;
    *out = n;
    return SP_OK;
}

/* ---- statements ----------------------------------------------------------- */

static enum sp_status parse_body(struct parser *p, const char *const *ends, struct sp_jnode **out, const char **which);

static enum sp_status end_tag(struct parser *p) { return expect(p, T_BLOCK_END, "'%}'"); }

static enum sp_status parse_if(struct parser *p, int line, struct sp_jnode **out) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct sp_jnode *n;
    NEW(n, SP_JN_IF, line);
    TRY(parse_tuple(p, true, false, &n->a));
    TRY(end_tag(p));
    const char *which;
    TRY(parse_body(p, ends, &n->b, &which));
    if (strcmp(which, "elif") == 0) {
        TRY(parse_if(p, peek(p, -1)->line, &n->c));
        *out = n;
        return SP_OK; // the nested if consumed endif
    }
    if (strcmp(which, "else") == 0) {
        static const char *const ends2[] = {"endif", NULL};
        TRY(end_tag(p));
        TRY(parse_body(p, ends2, &n->c, &which));
    }
    TRY(end_tag(p));
    *out = n;
    return SP_OK;
}

static enum sp_status parse_for(struct parser *p, int line, struct sp_jnode **out) {
    static const char *const ends[] = {"else", "endfor", NULL};
    struct sp_jnode *n;
    NEW(n, SP_JN_FOR, line);
    bool paren = is_op(p, "(");
    if (paren) p->pos++;
    TRY(parse_tuple(p, true, true, &n->a));
    if (paren) TRY(expect_op(p, ")"));
    if (!is_name(p, "in")) return fail_at(p, "'in'");
    p->pos++;
    TRY(parse_tuple(p, false, false, &n->b));
    if (is_name(p, "if")) {
        p->pos++;
        TRY(parse_expr(p, true, &n->c));
    }
    if (is_name(p, "recursive"))
        return sp_errorf(SP_ERR_UNSUPPORTED, "line %d: recursive loops are not supported", line);
    TRY(end_tag(p));
    n->kids = sp_jarena_alloc(p->a, 2 * sizeof *n->kids);
    if (!n->kids) return SP_ERR_LIMIT;
    n->nkids = 2;
    const char *which;
    TRY(parse_body(p, ends, &n->kids[0], &which));
    if (strcmp(which, "else") == 0) {
        static const char *const ends2[] = {"endfor", NULL};
        TRY(end_tag(p));
        TRY(parse_body(p, ends2, &n->kids[1], &which));
    }
    TRY(end_tag(p));
    *out = n;
    return SP_OK;
}

/* Filters after a block set or in a filter block: `| f(args) | g`. */
static enum sp_status parse_filter_chain(struct parser *p, struct sp_jnode *n, bool need_one) {
    struct kids k = {0};
    while (is_op(p, "|") || (need_one && !k.n)) {
        if (is_op(p, "|")) p->pos++;
        struct sp_jnode *f;
        NEW(f, SP_JN_FILTER, cur(p)->line);
        TRY(parse_dotted_name(p, &f->str));
        if (is_op(p, "(")) TRY(parse_args(p, f));
        TRY(kids_push(p, &k, f));
    }
    n->kids = k.v;
    n->nkids = k.n;
    return SP_OK;
}

static enum sp_status parse_set(struct parser *p, int line, struct sp_jnode **out) {
    struct sp_jnode *n;
    NEW(n, SP_JN_SET, line);
    // target: name, name.attr, or a tuple of names
    if (cur(p)->t == T_NAME && tok_is(peek(p, 1), T_OP, ".") && peek(p, 2)->t == T_NAME) {
        NEW(n->a, SP_JN_ATTR, line);
        NEW(n->a->a, SP_JN_NAME, line);
        if (!(n->a->a->str = name_str(p, cur(p)))) return SP_ERR_LIMIT;
        if (!(n->a->str = name_str(p, peek(p, 2)))) return SP_ERR_LIMIT;
        p->pos += 3;
    } else {
        TRY(parse_tuple(p, true, true, &n->a));
    }
    if (is_op(p, "=")) {
        p->pos++;
        TRY(parse_tuple(p, true, false, &n->b));
        TRY(end_tag(p));
    } else {
        static const char *const ends[] = {"endset", NULL};
        if (n->a->kind != SP_JN_NAME) return fail_at(p, "'='");
        TRY(parse_filter_chain(p, n, false));
        TRY(end_tag(p));
        const char *which;
        TRY(parse_body(p, ends, &n->c, &which));
        TRY(end_tag(p));
    }
    *out = n;
    return SP_OK;
}

static enum sp_status parse_params(struct parser *p, struct sp_jnode *n) {
    struct kids k = {0};
    TRY(expect_op(p, "("));
    while (!is_op(p, ")")) {
        if (k.n) TRY(expect_op(p, ","));
        if (cur(p)->t != T_NAME) return fail_at(p, "a parameter name");
        struct sp_jnode *prm;
        NEW(prm, SP_JN_PARAM, cur(p)->line);
        if (!(prm->str = name_str(p, cur(p)))) return SP_ERR_LIMIT;
        p->pos++;
        if (is_op(p, "=")) {
            p->pos++;
            TRY(parse_expr(p, true, &prm->a));
        }
        TRY(kids_push(p, &k, prm));
    }
    p->pos++;
    n->kids = k.v;
    n->nkids = k.n;
    return SP_OK;
}

static enum sp_status parse_macro(struct parser *p, int line, struct sp_jnode **out) {
    static const char *const ends[] = {"endmacro", NULL};
    struct sp_jnode *n;
    NEW(n, SP_JN_MACRO, line);
    if (cur(p)->t != T_NAME) return fail_at(p, "a macro name");
    if (!(n->str = name_str(p, cur(p)))) return SP_ERR_LIMIT;
    p->pos++;
    TRY(parse_params(p, n));
    TRY(end_tag(p));
    const char *which;
    TRY(parse_body(p, ends, &n->a, &which));
    if (cur(p)->t == T_NAME) p->pos++; // `endmacro name`
    TRY(end_tag(p));
    *out = n;
    return SP_OK;
}

static enum sp_status parse_call_block(struct parser *p, int line, struct sp_jnode **out) {
    static const char *const ends[] = {"endcall", NULL};
    struct sp_jnode *n;
    NEW(n, SP_JN_CALLBLOCK, line);
    if (is_op(p, "(")) TRY(parse_params(p, n));
    TRY(parse_expr(p, true, &n->a));
    if (n->a->kind != SP_JN_CALL) return sp_errorf(SP_ERR_FORMAT, "line %d: expected a call after 'call'", line);
    TRY(end_tag(p));
    const char *which;
    TRY(parse_body(p, ends, &n->b, &which));
    TRY(end_tag(p));
    *out = n;
    return SP_OK;
}

static enum sp_status parse_with(struct parser *p, int line, struct sp_jnode **out) {
    static const char *const ends[] = {"endwith", NULL};
    struct sp_jnode *n;
    NEW(n, SP_JN_WITH, line);
    struct kids k = {0};
    while (cur(p)->t != T_BLOCK_END) {
        if (k.n) TRY(expect_op(p, ","));
        struct sp_jnode *s;
        NEW(s, SP_JN_SET, cur(p)->line);
        if (cur(p)->t != T_NAME) return fail_at(p, "a name");
        NEW(s->a, SP_JN_NAME, cur(p)->line);
        if (!(s->a->str = name_str(p, cur(p)))) return SP_ERR_LIMIT;
        p->pos++;
        TRY(expect_op(p, "="));
        TRY(parse_expr(p, true, &s->b));
        TRY(kids_push(p, &k, s));
    }
    n->kids = k.v;
    n->nkids = k.n;
    TRY(end_tag(p));
    const char *which;
    TRY(parse_body(p, ends, &n->a, &which));
    TRY(end_tag(p));
    *out = n;
    return SP_OK;
}

static enum sp_status parse_statement(struct parser *p, struct sp_jnode **out) {
    const struct token *t = cur(p);
    int line = t->line;
    if (t->t != T_NAME) return fail_at(p, "a tag name");
    p->pos++;
    if (tok_is(t, T_NAME, "if")) return parse_if(p, line, out);
    if (tok_is(t, T_NAME, "for")) return parse_for(p, line, out);
    if (tok_is(t, T_NAME, "set")) return parse_set(p, line, out);
    if (tok_is(t, T_NAME, "macro")) return parse_macro(p, line, out);
    if (tok_is(t, T_NAME, "call")) return parse_call_block(p, line, out);
    if (tok_is(t, T_NAME, "with")) return parse_with(p, line, out);
    if (tok_is(t, T_NAME, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        struct sp_jnode *n;
        NEW(n, SP_JN_FILTERBLOCK, line);
        TRY(parse_filter_chain(p, n, true));
        TRY(end_tag(p));
        const char *which;
        TRY(parse_body(p, ends, &n->a, &which));
        TRY(end_tag(p));
        *out = n;
        return SP_OK;
    }
    if (tok_is(t, T_NAME, "generation")) {
        // transformers' assistant-mask marker: renders its body unchanged.
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        TRY(end_tag(p));
        TRY(parse_body(p, ends, out, &which));
        return end_tag(p);
    }
    if (tok_is(t, T_NAME, "break") || tok_is(t, T_NAME, "continue")) {
        struct sp_jnode *n;
        NEW(n, tok_is(t, T_NAME, "break") ? SP_JN_BREAK : SP_JN_CONTINUE, line);
        TRY(end_tag(p));
        *out = n;
        return SP_OK;
    }
    return sp_errorf(SP_ERR_FORMAT, "line %d: unknown or unexpected tag '%.*s'", line, (int)t->n, t->p);
}

/* Parses statements until EOF (ends == NULL) or until a block tag named in
 * ends, which is consumed up to its name; *which is set to that name. */
static enum sp_status parse_body(struct parser *p, const char *const *ends, struct sp_jnode **out, const char **which) {
    if (++p->block_depth > MAX_BLOCK_DEPTH)
        return sp_errorf(SP_ERR_LIMIT, "line %d: blocks nested too deeply", cur(p)->line);
    struct sp_jnode *body;
    NEW(body, SP_JN_BODY, cur(p)->line);
    struct kids k = {0};
    *which = NULL;
    for (;;) {
        struct token *t = cur(p);
        struct sp_jnode *n = NULL;
        if (t->t == T_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1]) last++;
                return sp_errorf(SP_ERR_FORMAT, "line %d: unexpected end of template, expected '%s'", t->line,
                                 ends[last]);
            }
            break;
        } else if (t->t == T_TEXT) {
            NEW(n, SP_JN_TEXT, t->line);
            n->str = t->p;
            n->len = t->n;
            p->pos++;
        } else if (t->t == T_VAR_BEGIN) {
            p->pos++;
            NEW(n, SP_JN_OUTPUT, t->line);
            TRY(parse_tuple(p, true, false, &n->a));
            TRY(expect(p, T_VAR_END, "'}}'"));
        } else if (t->t == T_BLOCK_BEGIN) {
            const struct token *name = peek(p, 1);
            if (ends && name->t == T_NAME) {
                for (int i = 0; ends[i]; i++) {
                    if (tok_is(name, T_NAME, ends[i])) {
                        p->pos += 2;
                        *which = ends[i];
                        goto done;
                    }
                }
            }
            p->pos++;
            TRY(parse_statement(p, &n));
        } else {
            return fail_at(p, "text or a tag");
        }
        TRY(kids_push(p, &k, n));
    }
done:
    body->kids = k.v;
    body->nkids = k.n;
    p->block_depth--;
    *out = body;
    return SP_OK;
}

/* Normalizes newlines to "\n" and drops one trailing newline, as jinja2
 * does with keep_trailing_newline=False. */
static char *normalize(struct sp_jarena *a, const char *src, size_t len, size_t *out_len) {
    char *s = sp_jarena_alloc(a, len + 1);
    if (!s) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[o++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[o++] = src[i];
        }
    }
    if (o && s[o - 1] == '\n') o--;
    s[o] = 0;
    *out_len = o;
    return s;
}

enum sp_status sp_jinja_parse(struct sp_jarena *a, const char *src, size_t len, struct sp_jnode **root) {
    struct lexer lx = {.a = a, .line = 1};
    enum sp_status st;
    lx.src = normalize(a, src, len, &lx.len);
    if (!lx.src) return SP_ERR_LIMIT;
    if ((st = lex_all(&lx)) != SP_OK) goto fail;
    struct parser p = {.a = a, .t = lx.toks, .n = lx.n};
    const char *which;
    st = parse_body(&p, NULL, root, &which);
fail:
    sp_free(lx.toks);
    return st;
}
