/*
 * test_jsonv.c - the incremental JSON object validator: valid and invalid
 * documents, every prefix of a valid document, split feeding, copies of the
 * state, the depth cap, the whitespace cap of a sampling state, numbers,
 * escapes and UTF-8, and random mutations checked against a small
 * recursive-descent reference written here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "runtime/jsonv.h"

/* ---- reference: a whole-document validator, recursive descent ---------- */

struct ref {
    const unsigned char *s;
    size_t n, i;
    int depth;
};

static void ref_ws(struct ref *r) {
    while (r->i < r->n && strchr(" \t\r\n", r->s[r->i]) && r->s[r->i]) r->i++;
}

static bool ref_lit(struct ref *r, const char *lit) {
    size_t k = strlen(lit);
    if (r->n - r->i < k || memcmp(r->s + r->i, lit, k) != 0) return false;
    r->i += k;
    return true;
}

static bool ref_digits(struct ref *r) {
    size_t start = r->i;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    return r->i > start;
}

static bool ref_number(struct ref *r) {
    if (r->i < r->n && r->s[r->i] == '-') r->i++;
    if (r->i < r->n && r->s[r->i] == '0')
        r->i++;
    else if (r->i >= r->n || r->s[r->i] < '1' || r->s[r->i] > '9' || !ref_digits(r))
        return false;
    if (r->i < r->n && r->s[r->i] == '.') {
        r->i++;
        if (!ref_digits(r)) return false;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
        if (!ref_digits(r)) return false;
    }
    return true;
}

static long ref_hex4(struct ref *r) {
    if (r->n - r->i < 4) return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int c = r->s[r->i++];
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Decodes one UTF-8 character by computing its code point and checking the
 * shortest-form and range rules (a different method from the validator's
 * byte ranges). */
static bool ref_utf8(struct ref *r) {
    unsigned c = r->s[r->i++];
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (extra < 0 || c >= 0xF8) return false;
    unsigned long cp = c & (0x3F >> extra);
    for (int k = 0; k < extra; k++) {
        if (r->i >= r->n || (r->s[r->i] & 0xC0) != 0x80) return false;
        cp = (cp << 6) | (r->s[r->i++] & 0x3F);
    }
    static const unsigned long min[4] = {0, 0x80, 0x800, 0x10000};
    return cp >= min[extra] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
}

static bool ref_string(struct ref *r) {
    if (r->i >= r->n || r->s[r->i] != '"') return false;
    r->i++;
    while (r->i < r->n) {
        unsigned char c = r->s[r->i];
        if (c == '"') {
            r->i++;
            return true;
        }
        if (c < 0x20) return false;
        if (c == '\\') {
            r->i++;
            if (r->i >= r->n) return false;
            c = r->s[r->i++];
            if (c == 'u') {
                long u = ref_hex4(r);
                if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF)) return false;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    if (!ref_lit(r, "\\u")) return false;
                    long lo = ref_hex4(r);
                    if (lo < 0xDC00 || lo > 0xDFFF) return false;
                }
            } else if (!strchr("\"\\/bfnrt", c) || c == 0) {
                return false;
            }
        } else if (c >= 0x80) {
            if (!ref_utf8(r)) return false;
        } else {
            r->i++;
        }
    }
    return false;
}

static bool ref_value(struct ref *r);

static bool ref_container(struct ref *r, bool array) {
    if (++r->depth > SP_JSONV_MAX_DEPTH) return false;
    r->i++;
    ref_ws(r);
    char close = array ? ']' : '}';
    if (r->i < r->n && r->s[r->i] == close) {
        r->i++;
        r->depth--;
        return true;
    }
    for (;;) {
        if (!array) {
            if (!ref_string(r)) return false;
            ref_ws(r);
            if (r->i >= r->n || r->s[r->i] != ':') return false;
            r->i++;
        }
        if (!ref_value(r)) return false;
        ref_ws(r);
        if (r->i >= r->n) return false;
        if (r->s[r->i] == ',') {
            r->i++;
            ref_ws(r);
            continue;
        }
        if (r->s[r->i] != close) return false;
        r->i++;
        r->depth--;
        return true;
    }
}

static bool ref_value(struct ref *r) {
    ref_ws(r);
    if (r->i >= r->n) return false;
    switch (r->s[r->i]) {
    case '{':
        return ref_container(r, false);
    case '[':
        return ref_container(r, true);
    case '"':
        return ref_string(r);
    case 't':
        return ref_lit(r, "true");
    case 'f':
        return ref_lit(r, "false");
    case 'n':
        return ref_lit(r, "null");
    default:
        return ref_number(r);
    }
}

static bool ref_valid(const char *s, size_t n) {
    struct ref r = {(const unsigned char *)s, n, 0, 0};
    ref_ws(&r);
    if (r.i >= n || s[r.i] != '{') return false;
    if (!ref_container(&r, false)) return false;
    ref_ws(&r);
    return r.i == n;
}

/* ---- helpers ------------------------------------------------------------ */

/* 1: complete, 0: valid prefix, -1: rejected. */
static int check(const char *s, size_t n) {
    struct sp_jsonv v;
    sp_jsonv_init(&v);
    if (!sp_jsonv_feed(&v, s, n)) return -1;
    return sp_jsonv_complete(&v) ? 1 : 0;
}

static int checks(const char *s) { return check(s, strlen(s)); }

static const char *valid_docs[] = {
    "{}",
    " \t\r\n{ \n}\n ",
    "{\"a\":1}",
    "{\"a\": [1, 2.5, -3e10, true, false, null, \"x\", {}, []]}",
    "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"celsius\"}}",
    "{\"n\":-0,\"m\":0.0,\"e\":1e5,\"f\":1.5E-3,\"g\":-12.25e+07,\"h\":0e0,\"i\":10}",
    "{\"s\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u00E9\\uD83D\\uDE00\"}",
    "{\"cjk\":\"\xe4\xbd\xa0\xe5\xa5\xbd\",\"emoji\":\"\xf0\x9f\x98\x80\",\"\xc3\xa9\":\"\xef\xbf\xbd\"}",
    "{\"nested\":{\"a\":{\"b\":[[[{\"c\":[]}]]]}}}",
    "{\"\":\"\"}",
    "{\"a\":[],\"b\":{},\"c\":[{}],\"d\":\"}\"}",
    "{ \"k\" : [ 1 , 2 ] , \"l\" : { } }",
    "{\"max\":\"\xf4\x8f\xbf\xbf\",\"e0\":\"\xe0\xa0\x80\",\"ed\":\"\xed\x9f\xbf\"}",
};

static void test_valid_documents(void **state) {
    (void)state;
    for (size_t d = 0; d < sizeof valid_docs / sizeof *valid_docs; d++) {
        const char *doc = valid_docs[d];
        size_t n = strlen(doc);
        assert_true(ref_valid(doc, n));
        if (checks(doc) != 1) fail_msg("not complete: %s", doc);
    }
}

/* Every prefix is accepted; only those reaching the closing brace are complete. */
static void test_every_prefix(void **state) {
    (void)state;
    for (size_t d = 0; d < sizeof valid_docs / sizeof *valid_docs; d++) {
        const char *doc = valid_docs[d];
        size_t n = strlen(doc);
        size_t close = strrchr(doc, '}') - doc;
        for (size_t k = 0; k <= n; k++) {
            int r = check(doc, k);
            if (r < 0) fail_msg("prefix %zu of %s rejected", k, doc);
            assert_int_equal(r, k > close ? 1 : 0);
        }
    }
}

/* Feeding in pieces, and from copies of the state, agrees with one feed. */
static void test_split_and_copy(void **state) {
    (void)state;
    struct sp_rng rng;
    sp_rng_seed(&rng, 7);
    for (size_t d = 0; d < sizeof valid_docs / sizeof *valid_docs; d++) {
        const char *doc = valid_docs[d];
        size_t n = strlen(doc);
        for (int trial = 0; trial < 50; trial++) {
            struct sp_jsonv v;
            sp_jsonv_init(&v);
            size_t i = 0;
            while (i < n) {
                size_t step = 1 + sp_rng_next(&rng) % 5;
                if (step > n - i) step = n - i;
                // a probe on a copy leaves the original untouched
                struct sp_jsonv probe = v;
                assert_false(sp_jsonv_feed(&probe, "\x01", 1));
                assert_true(sp_jsonv_feed(&v, doc + i, step));
                i += step;
            }
            assert_true(sp_jsonv_complete(&v));
        }
    }
}

static void test_invalid_documents(void **state) {
    (void)state;
    // rejected as soon as the bad byte arrives
    static const char *bad[] = {
        "[]",
        "\"a\"",
        "1",
        "null",
        "x",
        "{,}",
        "{\"a\"}",
        "{\"a\" 1}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":1 \"b\":2}",
        "{\"a\":[1,]}",
        "{\"a\":[,1]}",
        "{\"a\":[1}",
        "{\"a\":{]}",
        "{a:1}",
        "{'a':1}",
        "{\"a\":tru}",
        "{\"a\":nul }",
        "{\"a\":True}",
        "{\"a\":truex}",
        "{} {}",
        "{}x",
        "{\"a\":\"\x01\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":\"line\nbreak\"}",
        "{\"a\":1}}",
        "{\"a\":NaN}",
        "{\"a\":Infinity}",
        "{\"a\" : : 1}",
        "{\"a\":1]",
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        assert_false(ref_valid(bad[k], strlen(bad[k])));
        if (checks(bad[k]) != -1) fail_msg("accepted: %s", bad[k]);
    }
    // valid prefixes that never closed
    static const char *incomplete[] = {"",           "  ",        "{",       "{\"a\"", "{\"a\":", "{\"a\":[1,2",
                                       "{\"a\":\"x", "{\"a\":{}", "{\"a\":1"};
    for (size_t k = 0; k < sizeof incomplete / sizeof *incomplete; k++)
        if (checks(incomplete[k]) != 0) fail_msg("not a bare prefix: %s", incomplete[k]);
}

static void test_numbers(void **state) {
    (void)state;
    static const char *good[] = {
        "0",        "-0",     "1e5",    "1.5E-3", "1E+2", "-0.0", "123456789012345678901234567890",
        "0.000001", "9e-999", "-1.0e0", "10",     "0E0"};
    static const char *bad[] = {"01",  "-01",  "00",  "1.",   ".5",    "+1",  "1e",    "1e+", "-",
                                "0x1", "1.e5", "--1", "1ee5", "1e5.5", "- 1", "1.5.5", "0-1"};
    char doc[128];
    for (size_t k = 0; k < sizeof good / sizeof *good; k++) {
        snprintf(doc, sizeof doc, "{\"n\":%s}", good[k]);
        if (checks(doc) != 1) fail_msg("number rejected: %s", good[k]);
        snprintf(doc, sizeof doc, "{\"n\":[%s,%s ]}", good[k], good[k]);
        assert_int_equal(checks(doc), 1);
    }
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        snprintf(doc, sizeof doc, "{\"n\":%s}", bad[k]);
        assert_false(ref_valid(doc, strlen(doc)));
        if (checks(doc) != -1) fail_msg("number accepted: %s", bad[k]);
    }
    // a number at the end of the text is still open
    assert_int_equal(checks("{\"n\":1"), 0);
    assert_int_equal(checks("{\"n\":1e"), 0);
    assert_int_equal(checks("{\"n\":-"), 0);
    assert_int_equal(checks("{\"n\":0"), 0);
    assert_int_equal(checks("{\"n\":0 "), 0);
}

static void test_escapes(void **state) {
    (void)state;
    static const char *good[] = {"\\\"",
                                 "\\\\",
                                 "\\/",
                                 "\\b",
                                 "\\f",
                                 "\\n",
                                 "\\r",
                                 "\\t",
                                 "\\u0000",
                                 "\\u00e9",
                                 "\\uFFFF",
                                 "\\uD83D\\uDE00",
                                 "\\udbff\\udfff",
                                 "a\\u0041b"};
    static const char *bad[] = {"\\x",     "\\a",      "\\U0041",        "\\u12G4",    "\\u12",
                                "\\uDE00", "\\uD83Dx", "\\uD83D\\u0041", "\\uD83D\\n", "\\uD83D\\uD83D",
                                "\\'",     "\\0"};
    char doc[128];
    for (size_t k = 0; k < sizeof good / sizeof *good; k++) {
        snprintf(doc, sizeof doc, "{\"s\":\"%s\"}", good[k]);
        assert_true(ref_valid(doc, strlen(doc)));
        if (checks(doc) != 1) fail_msg("escape rejected: %s", good[k]);
        snprintf(doc, sizeof doc, "{\"%s\":0}", good[k]); // keys too
        assert_int_equal(checks(doc), 1);
    }
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        snprintf(doc, sizeof doc, "{\"s\":\"%s\"}", bad[k]);
        assert_false(ref_valid(doc, strlen(doc)));
        if (checks(doc) != -1) fail_msg("escape accepted: %s", bad[k]);
    }
}

static void test_utf8(void **state) {
    (void)state;
    static const char *bad[] = {
        "\x80",             // a continuation byte alone
        "\xc0\x80",         // overlong NUL
        "\xc1\xbf",         // overlong
        "\xe0\x80\x80",     // overlong 3-byte
        "\xe0\x9f\xbf",     // overlong 3-byte
        "\xed\xa0\x80",     // UTF-16 surrogate D800
        "\xed\xbf\xbf",     // surrogate DFFF
        "\xf0\x80\x80\x80", // overlong 4-byte
        "\xf0\x8f\xbf\xbf", // overlong 4-byte
        "\xf4\x90\x80\x80", // above U+10FFFF
        "\xf5\x80\x80\x80", // invalid lead
        "\xff",             // invalid lead
        "\xe4\xbd",         // cut short by the closing quote
        "\xc3\x28",         // lead followed by ASCII
    };
    char doc[64];
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        snprintf(doc, sizeof doc, "{\"s\":\"%s\"}", bad[k]);
        assert_false(ref_valid(doc, strlen(doc)));
        if (checks(doc) != -1) fail_msg("bad UTF-8 accepted (case %zu)", k);
    }
    // a character cut between two feeds is fine
    struct sp_jsonv v;
    sp_jsonv_init(&v);
    assert_true(sp_jsonv_feed(&v, "{\"s\":\"\xf0\x9f", 8));
    assert_true(sp_jsonv_feed(&v, "\x98\x80\"}", 4));
    assert_true(sp_jsonv_complete(&v));
}

static void test_depth_cap(void **state) {
    (void)state;
    char doc[4 * SP_JSONV_MAX_DEPTH + 16];
    // SP_JSONV_MAX_DEPTH levels: the object and 63 arrays inside it
    size_t n = 0;
    n += (size_t)sprintf(doc + n, "{\"a\":");
    for (int k = 1; k < SP_JSONV_MAX_DEPTH; k++) doc[n++] = '[';
    for (int k = 1; k < SP_JSONV_MAX_DEPTH; k++) doc[n++] = ']';
    doc[n++] = '}';
    assert_int_equal(check(doc, n), 1);
    assert_true(ref_valid(doc, n));
    // one more level is refused at the bracket that opens it
    n = 0;
    n += (size_t)sprintf(doc + n, "{\"a\":");
    for (int k = 0; k < SP_JSONV_MAX_DEPTH; k++) doc[n++] = '[';
    assert_int_equal(check(doc, n - 1), 0);
    assert_int_equal(check(doc, n), -1);
    // the same with objects, and depth is reported
    struct sp_jsonv v;
    sp_jsonv_init(&v);
    for (int k = 0; k < SP_JSONV_MAX_DEPTH; k++) {
        assert_true(sp_jsonv_feed(&v, k ? "\"k\":{" : "{", k ? 5 : 1));
        assert_int_equal(sp_jsonv_depth(&v), k + 1);
    }
    struct sp_jsonv deeper = v;
    assert_false(sp_jsonv_feed(&deeper, "\"k\":{", 5));
    for (int k = 0; k < SP_JSONV_MAX_DEPTH; k++) assert_true(sp_jsonv_feed(&v, "}", 1));
    assert_true(sp_jsonv_complete(&v));
    assert_int_equal(sp_jsonv_depth(&v), 0);
}

/* A state for sampling caps whitespace runs between tokens (before, inside
 * and after the object); spaces inside strings are content, and a token
 * ends a run. The plain validator takes any run. */
static int check_sampling(const char *s, size_t n) {
    struct sp_jsonv v;
    sp_jsonv_init_sampling(&v);
    if (!sp_jsonv_feed(&v, s, n)) return -1;
    return sp_jsonv_complete(&v) ? 1 : 0;
}

static void test_whitespace_cap(void **state) {
    (void)state;
    char doc[6 * SP_JSONV_MAX_WS + 64];
    const char *const around[][2] = {{"", "{}"}, {"{", "}"}, {"{\"a\":", "1}"}, {"{\"a\":1", "}"}, {"{}", ""}};
    for (size_t k = 0; k < sizeof around / sizeof *around; k++)
        for (int extra = 0; extra < 2; extra++) {
            int n = sprintf(doc, "%s", around[k][0]);
            for (int i = 0; i < SP_JSONV_MAX_WS + extra; i++) doc[n++] = " \n\t\r"[i % 4];
            n += sprintf(doc + n, "%s", around[k][1]);
            int want = extra ? -1 : 1;
            if (check_sampling(doc, (size_t)n) != want)
                fail_msg("%s + %d whitespace + %s: want %d", around[k][0], SP_JSONV_MAX_WS + extra, around[k][1], want);
            assert_int_equal(check(doc, (size_t)n), 1);
            assert_true(ref_valid(doc, (size_t)n));
        }
    // two full runs with a token between them, and a long string of spaces
    int n = sprintf(doc, "{");
    for (int i = 0; i < SP_JSONV_MAX_WS; i++) doc[n++] = ' ';
    n += sprintf(doc + n, "\"");
    for (int i = 0; i < 3 * SP_JSONV_MAX_WS; i++) doc[n++] = ' ';
    n += sprintf(doc + n, "\":");
    for (int i = 0; i < SP_JSONV_MAX_WS; i++) doc[n++] = ' ';
    n += sprintf(doc + n, "0}");
    assert_int_equal(check_sampling(doc, (size_t)n), 1);
    // a run split across feeds is still one run
    struct sp_jsonv v;
    sp_jsonv_init_sampling(&v);
    for (int i = 0; i < SP_JSONV_MAX_WS; i++) assert_true(sp_jsonv_feed(&v, " ", 1));
    struct sp_jsonv more = v;
    assert_false(sp_jsonv_feed(&more, " ", 1));
    assert_true(sp_jsonv_feed(&v, "{", 1));
}

/* Random edits of valid documents: the validator accepts exactly what the
 * reference accepts, and never rejects a prefix of a document the reference
 * says is valid. */
static void test_random_mutations(void **state) {
    (void)state;
    static const char alphabet[] = "{}[]:,\"\\ 0123456789-+.eEtrufalsn\x01\n\xc3\xa9\xed\xf0\x80\xbfu";
    struct sp_rng rng;
    sp_rng_seed(&rng, 2024);
    char buf[512];
    int n_valid = 0, n_invalid = 0;
    for (int trial = 0; trial < 200000; trial++) {
        const char *doc = valid_docs[sp_rng_next(&rng) % (sizeof valid_docs / sizeof *valid_docs)];
        size_t n = strlen(doc);
        memcpy(buf, doc, n);
        int edits = 1 + (int)(sp_rng_next(&rng) % 3);
        for (int e = 0; e < edits; e++) {
            size_t pos = n ? sp_rng_next(&rng) % n : 0;
            char c = alphabet[sp_rng_next(&rng) % (sizeof alphabet - 1)];
            switch (sp_rng_next(&rng) % 3) {
            case 0:
                if (n) buf[pos] = c;
                break;
            case 1:
                if (n + 1 < sizeof buf) {
                    memmove(buf + pos + 1, buf + pos, n - pos);
                    buf[pos] = c;
                    n++;
                }
                break;
            default:
                if (n) {
                    memmove(buf + pos, buf + pos + 1, n - pos - 1);
                    n--;
                }
            }
        }
        bool ref = ref_valid(buf, n);
        struct sp_jsonv v;
        sp_jsonv_init(&v);
        bool ok = true;
        for (size_t i = 0; i < n && ok; i++) {
            ok = sp_jsonv_feed(&v, buf + i, 1);
            if (!ok && ref) fail_msg("prefix of a valid document rejected at %zu: %.*s", i, (int)n, buf);
        }
        bool got = ok && sp_jsonv_complete(&v);
        if (got != ref) fail_msg("validator %d, reference %d: %.*s", got, ref, (int)n, buf);
        // one feed of the whole text agrees with byte-by-byte feeding
        assert_int_equal(check(buf, n), ok ? (got ? 1 : 0) : -1);
        if (ref)
            n_valid++;
        else
            n_invalid++;
    }
    // the mutations exercised both sides
    assert_true(n_valid > 1000);
    assert_true(n_invalid > 1000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_documents),
        cmocka_unit_test(test_every_prefix),
        cmocka_unit_test(test_split_and_copy),
        cmocka_unit_test(test_invalid_documents),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_depth_cap),
        cmocka_unit_test(test_whitespace_cap),
        cmocka_unit_test(test_random_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
