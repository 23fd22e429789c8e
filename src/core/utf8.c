/* utf8.c - UTF-8 decoding with WHATWG replacement of invalid bytes. */
#include "core/utf8.h"

/* The range the second byte of a sequence must lie in, per lead byte. */
static void second_range(unsigned char lead, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xbf;
    if (lead == 0xe0) *lo = 0xa0;
    else if (lead == 0xed) *hi = 0x9f;
    else if (lead == 0xf0) *lo = 0x90;
    else if (lead == 0xf4) *hi = 0x8f;
}

int sp_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int need;
    uint32_t v;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 1;
        v = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        v = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        v = c & 0x07;
    } else {
        return -1;
    }
    unsigned char lo, hi;
    second_range(c, &lo, &hi);
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n || s[i] < lo || s[i] > hi) return -i;
        v = (v << 6) | (s[i] & 0x3f);
        lo = 0x80;
        hi = 0xbf;
    }
    *cp = v;
    return need + 1;
}

bool sp_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = sp_utf8_decode(p + i, n - i, &cp);
        if (k < 0) return false;
        i += (size_t)k;
    }
    return true;
}

enum sp_status sp_utf8_sanitize(const char *s, size_t n, struct sp_buf *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;  // run: start of the pending valid stretch
    enum sp_status st = sp_buf_reserve(out, n);
    if (st != SP_OK) return st;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = sp_utf8_decode(p + i, n - i, &cp);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if ((st = sp_buf_append(out, s + run, i - run)) != SP_OK) return st;
        if ((st = sp_buf_append(out, "\xef\xbf\xbd", 3)) != SP_OK) return st;
        i += (size_t)(-k);
        run = i;
    }
    return sp_buf_append(out, s + run, n - run);
}

size_t sp_utf8_incomplete_tail(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    /* A sequence is at most 4 bytes: look for its lead among the last 3. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = p[n - back];
        if (c < 0x80) return 0;
        if (c < 0xc0) continue;  // continuation byte: keep looking for the lead
        int need = (c >= 0xc2 && c <= 0xdf) ? 2 : (c >= 0xe0 && c <= 0xef) ? 3 : (c >= 0xf0 && c <= 0xf4) ? 4 : 0;
        if (need == 0 || (size_t)need <= back) return 0;
        uint32_t cp;
        /* Incomplete only if every byte present so far is acceptable. */
        int k = sp_utf8_decode(p + n - back, back, &cp);
        return (k < 0 && (size_t)(-k) == back) ? back : 0;
    }
    return 0;
}

int sp_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t sp_utf8_next(const char *s, size_t n, int32_t *cp) {
    uint32_t c;
    int k = sp_utf8_decode((const unsigned char *)s, n, &c);
    if (k <= 0) {
        *cp = (unsigned char)s[0];
        return 1;
    }
    *cp = (int32_t)c;
    return (size_t)k;
}

int64_t sp_utf8_count(const char *s, size_t n) {
    int64_t count = 0;
    int32_t cp;
    for (size_t i = 0; i < n; count++) i += (unsigned char)s[i] < 0x80 ? 1 : sp_utf8_next(s + i, n - i, &cp);
    return count;
}

size_t sp_utf8_offset(const char *s, size_t n, int64_t idx) {
    size_t i = 0;
    int32_t cp;
    for (; i < n && idx > 0; idx--) i += (unsigned char)s[i] < 0x80 ? 1 : sp_utf8_next(s + i, n - i, &cp);
    return i;
}

enum sp_status sp_utf8_put(struct sp_buf *b, int32_t cp) {
    if (cp < 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        unsigned char c = (unsigned char)cp;
        return sp_buf_append(b, &c, 1);
    }
    char tmp[4];
    return sp_buf_append(b, tmp, (size_t)sp_utf8_encode((uint32_t)cp, tmp));
}
