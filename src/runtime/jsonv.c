/*
 * jsonv.c - the incremental JSON object validator (see jsonv.h).
 *
 * One state byte says what the next byte may be; a 64-bit stack says, for
 * each open container, whether it is an array or an object. Strings, numbers
 * and literals are lexed by the same automaton, so no token is ever buffered.
 */
#include "runtime/jsonv.h"

#include "core/json.h"

enum {
    J_START,     // before the top-level object
    J_OBJ_FIRST, // after '{': a key or '}'
    J_KEY,       // after ',' in an object: a key
    J_COLON,     // after a key
    J_VALUE,     // after ':' or after ',' in an array
    J_ARR_FIRST, // after '[': a value or ']'
    J_AFTER,     // after a value: ',' or the container's closing bracket
    J_DONE,      // the top-level object is closed: only whitespace
    J_STR,       // inside a string
    J_ESC,       // after a backslash
    J_UHEX,      // reading the hex digits of \u (left: digits to go)
    J_LOW_BS,    // after a high surrogate escape: '\' of the low one
    J_LOW_U,     // after that backslash: 'u'
    J_UTF8,      // inside a multi-byte character (left: continuation bytes)
    J_NUM_MINUS, // after '-'
    J_NUM_ZERO,  // integer part is "0"
    J_NUM_INT,   // in integer digits after 1-9
    J_NUM_DOT,   // after '.'
    J_NUM_FRAC,  // in fraction digits
    J_NUM_E,     // after 'e' / 'E'
    J_NUM_ESIGN, // after the exponent's sign
    J_NUM_EXP,   // in exponent digits
    J_LIT,       // inside true / false / null (left: bytes matched)
};

static const char *const literals[3] = {"true", "false", "null"};

void sp_jsonv_init(struct sp_jsonv *v) { *v = (struct sp_jsonv){.state = J_START}; }

void sp_jsonv_init_sampling(struct sp_jsonv *v) { *v = (struct sp_jsonv){.state = J_START, .max_ws = SP_JSONV_MAX_WS}; }

bool sp_jsonv_complete(const struct sp_jsonv *v) { return v->state == J_DONE; }

static inline bool is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Whitespace between tokens, counted against the run's cap if there is one. */
static inline bool ws_ok(struct sp_jsonv *v, unsigned char c) { return is_ws(c) && (!v->max_ws || ++v->ws <= v->max_ws); }

static inline bool top_is_array(const struct sp_jsonv *v) { return (v->stack >> (v->depth - 1)) & 1; }

static inline bool open_container(struct sp_jsonv *v, bool array) {
    if (v->depth >= SP_JSONV_MAX_DEPTH) return false;
    uint64_t bit = (uint64_t)1 << v->depth;
    v->stack = array ? v->stack | bit : v->stack & ~bit;
    v->depth++;
    v->state = array ? J_ARR_FIRST : J_OBJ_FIRST;
    return true;
}

static inline void close_container(struct sp_jsonv *v) {
    v->depth--;
    v->state = v->depth == 0 ? J_DONE : J_AFTER;
}

/* The first byte of a value (whitespace already skipped). */
static inline bool start_value(struct sp_jsonv *v, unsigned char c) {
    switch (c) {
    case '{':
        return open_container(v, false);
    case '[':
        return open_container(v, true);
    case '"':
        v->key = false;
        v->state = J_STR;
        return true;
    case '-':
        v->state = J_NUM_MINUS;
        return true;
    case '0':
        v->state = J_NUM_ZERO;
        return true;
    case 't':
        v->lit = 0;
        break;
    case 'f':
        v->lit = 1;
        break;
    case 'n':
        v->lit = 2;
        break;
    default:
        if (c >= '1' && c <= '9') {
            v->state = J_NUM_INT;
            return true;
        }
        return false;
    }
    v->state = J_LIT;
    v->left = 1;
    return true;
}

/* A byte >= 0x80 inside a string: the lead byte of a UTF-8 sequence. The
 * ranges of the first continuation byte exclude overlong forms, UTF-16
 * surrogates (ED A0..BF) and code points above U+10FFFF. */
static inline bool start_utf8(struct sp_jsonv *v, unsigned char c) {
    v->lo = 0x80;
    v->hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        v->left = 1;
    else if (c == 0xE0)
        v->left = 2, v->lo = 0xA0;
    else if (c == 0xED)
        v->left = 2, v->hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF)
        v->left = 2;
    else if (c == 0xF0)
        v->left = 3, v->lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        v->left = 3;
    else if (c == 0xF4)
        v->left = 3, v->hi = 0x8F;
    else
        return false;
    v->state = J_UTF8;
    return true;
}

bool sp_jsonv_feed(struct sp_jsonv *v, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        switch (v->state) {
        case J_STR:
            // the common case: plain ASCII that needs no attention
            while (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
                if (++i == n) return true;
                c = p[i];
            }
            if (c == '"')
                v->state = v->key ? J_COLON : J_AFTER;
            else if (c == '\\')
                v->state = J_ESC;
            else if (c < 0x20 || !start_utf8(v, c))
                return false;
            break;
        case J_UTF8:
            if (c < v->lo || c > v->hi) return false;
            v->lo = 0x80;
            v->hi = 0xBF;
            if (--v->left == 0) v->state = J_STR;
            break;
        case J_ESC:
            switch (c) {
            case '"':
            case '\\':
            case '/':
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                v->state = J_STR;
                break;
            case 'u':
                v->state = J_UHEX;
                v->left = 4;
                v->cp = 0;
                break;
            default:
                return false;
            }
            break;
        case J_UHEX: {
            int h = sp_hex_digit(c);
            if (h < 0) return false;
            v->cp = (v->cp & 0xFFFF0000u) | ((v->cp & 0xFFFFu) << 4) | (uint32_t)h;
            if (--v->left) break;
            uint32_t unit = v->cp & 0xFFFFu, high = v->cp >> 16;
            if (high) { // this was the second half of a pair
                if (unit < 0xDC00 || unit > 0xDFFF) return false;
                v->cp = 0;
                v->state = J_STR;
            } else if (unit >= 0xD800 && unit <= 0xDBFF) {
                v->cp = unit << 16;
                v->state = J_LOW_BS;
            } else if (unit >= 0xDC00 && unit <= 0xDFFF) {
                return false; // a low surrogate without a high one
            } else {
                v->state = J_STR;
            }
            break;
        }
        case J_LOW_BS:
            if (c != '\\') return false;
            v->state = J_LOW_U;
            break;
        case J_LOW_U:
            if (c != 'u') return false;
            v->state = J_UHEX;
            v->left = 4;
            break;
        case J_START:
            if (c == '{') {
                if (!open_container(v, false)) return false;
            } else if (!ws_ok(v, c)) {
                return false;
            }
            break;
        case J_OBJ_FIRST:
        case J_KEY:
            if (c == '"') {
                v->key = true;
                v->state = J_STR;
            } else if (c == '}' && v->state == J_OBJ_FIRST) {
                close_container(v);
            } else if (!ws_ok(v, c)) {
                return false;
            }
            break;
        case J_COLON:
            if (c == ':')
                v->state = J_VALUE;
            else if (!ws_ok(v, c))
                return false;
            break;
        case J_ARR_FIRST:
            if (c == ']') {
                close_container(v);
                break;
            }
            /* fall through */
        case J_VALUE:
            if (!ws_ok(v, c) && !start_value(v, c)) return false;
            break;
        case J_AFTER:
            if (c == ',') {
                v->state = top_is_array(v) ? J_VALUE : J_KEY;
            } else if (c == '}' || c == ']') {
                if (top_is_array(v) != (c == ']')) return false;
                close_container(v);
            } else if (!ws_ok(v, c)) {
                return false;
            }
            break;
        case J_DONE:
            if (!ws_ok(v, c)) return false;
            break;
        case J_NUM_MINUS:
            if (c == '0')
                v->state = J_NUM_ZERO;
            else if (c >= '1' && c <= '9')
                v->state = J_NUM_INT;
            else
                return false;
            break;
        case J_NUM_INT:
            if (c >= '0' && c <= '9') break;
            /* fall through */
        case J_NUM_ZERO:
            if (c == '.')
                v->state = J_NUM_DOT;
            else if (c == 'e' || c == 'E')
                v->state = J_NUM_E;
            else {
                v->state = J_AFTER; // the number ended; c belongs to what follows
                continue;
            }
            break;
        case J_NUM_DOT:
            if (c < '0' || c > '9') return false;
            v->state = J_NUM_FRAC;
            break;
        case J_NUM_FRAC:
            if (c >= '0' && c <= '9') break;
            if (c == 'e' || c == 'E') {
                v->state = J_NUM_E;
                break;
            }
            v->state = J_AFTER;
            continue;
        case J_NUM_E:
            if (c == '+' || c == '-') {
                v->state = J_NUM_ESIGN;
                break;
            }
            /* fall through */
        case J_NUM_ESIGN:
            if (c < '0' || c > '9') return false;
            v->state = J_NUM_EXP;
            break;
        case J_NUM_EXP:
            if (c >= '0' && c <= '9') break;
            v->state = J_AFTER;
            continue;
        case J_LIT:
            if (c != (unsigned char)literals[v->lit][v->left]) return false;
            if (literals[v->lit][++v->left] == '\0') v->state = J_AFTER;
            break;
        default:
            return false;
        }
        if (!is_ws(c)) v->ws = 0;
        i++;
    }
    return true;
}
