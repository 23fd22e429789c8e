/*
 * chat_parse.c - incremental parsing of generated text into content,
 * reasoning and tool calls (see chat_parse.h for the formats and rules).
 *
 * The parser keeps the text it has not consumed yet in one buffer; a mode
 * (and, inside a tool call, a phase) says which tags end the current part.
 * Each step looks for the earliest complete tag in the unconsumed text,
 * emits what precedes it, and switches mode; without a complete tag it emits
 * all but the longest tail that is the start of a tag. Held modes (a tool
 * call body that must be seen whole, a harmony header, a Qwen3-Coder value)
 * leave their text in place and only remember how far they have searched.
 */
#include "server/chat_parse.h"

#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/json.h"
#include "core/rng.h"
#include "runtime/jsonv.h"

enum mode {
    M_PLAIN,     // everything is content
    M_CONTENT,   // think formats: content; <tool_call> opens a call
    M_REASONING, // inside <think>
    M_HERMES,    // inside <tool_call>, JSON body (phase: enum hermes_phase)
    M_XML,       // inside <tool_call>, Qwen3-Coder body (phase: enum xml_phase)
    M_HOLD,      // inside <tool_call>, a body that is only judged at </tool_call>
    M_DS,        // inside DeepSeek's tool calls block (phase: enum ds_phase)
    M_H_HEADER,  // harmony: a message header, up to <|message|>
    M_H_BODY,    // harmony: a message body (route says where it goes)
};

enum hermes_phase {
    HJ_PREFIX, // before {"name": "...", "arguments":
    HJ_ARGS,   // streaming the arguments object
    HJ_TAIL,   // after the arguments: the rest of the body is dropped
};

enum ds_phase {
    DS_BETWEEN, // before a call (or the end of the block)
    DS_HEAD,    // at <｜tool▁call▁begin｜>, before <｜tool▁sep｜>
    DS_ARGS,    // the arguments, up to <｜tool▁call▁end｜>
};

enum xml_phase {
    X_START,      // before <function=NAME>
    X_PARAMS,     // between parameters
    X_PNAME,      // after <parameter=, before >
    X_PVALUE,     // a parameter value
    X_AFTER_FUNC, // after </function>
};

enum route { R_CONTENT, R_REASONING, R_ARGS };

#define NAME_MAX_LEN 256 // longer function or parameter names mean the output is not a call

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";
static const char CALL_OPEN[] = "<tool_call>";
static const char CALL_CLOSE[] = "</tool_call>";
static const char DS_CALLS_BEGIN[] = "<｜tool▁calls▁begin｜>";
static const char DS_CALLS_END[] = "<｜tool▁calls▁end｜>";
static const char DS_CALL_BEGIN[] = "<｜tool▁call▁begin｜>";
static const char DS_CALL_END[] = "<｜tool▁call▁end｜>";
static const char DS_SEP[] = "<｜tool▁sep｜>";
static const char DS_EOS[] = "<｜end▁of▁sentence｜>";
#define LEN(lit) (sizeof(lit) - 1)

/* Harmony's tokens, in the order step_h_body handles them. */
enum { HT_END, HT_CALL, HT_RETURN, HT_EOT, HT_START, HT_CHANNEL, HT_MESSAGE, HT_CONSTRAIN, HT_SOT, HT_COUNT };
static const char *const H_TOKENS[HT_COUNT] = {"<|end|>",       "<|call|>",      "<|return|>",
                                               "<|endoftext|>", "<|start|>",     "<|channel|>",
                                               "<|message|>",   "<|constrain|>", "<|startoftext|>"};

/* An event with its text as offsets into parser->text (which moves as it grows). */
struct ev {
    enum sp_chat_event_kind kind;
    int tool;
    size_t off, len;
    size_t id_off; // TOOL_BEGIN only
};

/* What a JSON minifier knows about the bytes it has seen. */
struct mini {
    int depth;
    bool str, esc;
};

struct sp_chat_parser {
    struct sp_chat_parse_opts opts;
    struct sp_buf in; // text received; in.data[pos..in.len) is not consumed yet
    size_t pos;
    size_t scanned; // held modes: bytes after pos already searched for the end tag
    enum mode mode;
    int phase;
    enum route route; // harmony body
    bool lstrip;      // newlines at pos belong to the tag before them
    bool think_ok;    // <think> may still open reasoning (nothing else seen yet)
    bool finished;
    enum sp_status err;

    int n_tools;
    struct sp_buf absorbed; // the newlines <tool_call> took, given back if the call fails
    struct mini args;       // hermes: the arguments object streaming out
    struct sp_buf pname;    // qwen3-coder: the parameter being read
    const cJSON *props;     // qwen3-coder: "properties" of the current function's schema
    int n_params;
    struct sp_buf scratch;

    struct sp_buf text; // event texts and ids
    struct ev *evs;
    size_t n_evs, cap_evs;
    struct sp_chat_event *pub;
    size_t cap_pub;
};

/* ---- small helpers ------------------------------------------------------ */

static bool is_nl(char c) { return c == '\n' || c == '\r'; }
static bool is_space(char c) { return c == ' ' || c == '\t' || is_nl(c); }

static size_t rstrip_nl(const char *s, size_t k) {
    while (k && is_nl(s[k - 1])) k--;
    return k;
}

/* The earliest complete occurrence in s[0..n) of any of the tags: its offset
 * and index. */
static bool find_tag(const char *s, size_t n, const char *const *tags, int n_tags, size_t *at, int *which) {
    bool found = false;
    for (int t = 0; t < n_tags && n; t++) {
        const char *hit = memmem(s, n, tags[t], strlen(tags[t]));
        if (hit && (!found || (size_t)(hit - s) < *at)) {
            *at = (size_t)(hit - s);
            *which = t;
            found = true;
        }
    }
    return found;
}

/* The length of the longest tail of s[0..n) that is a proper prefix of one
 * of the tags: the bytes that must wait for more text. */
static size_t partial_tag(const char *s, size_t n, const char *const *tags, int n_tags) {
    size_t best = 0;
    for (int t = 0; t < n_tags; t++) {
        size_t tl = strlen(tags[t]);
        for (size_t l = tl - 1 < n ? tl - 1 : n; l > best; l--) {
            if (memcmp(s + n - l, tags[t], l) == 0) {
                best = l;
                break;
            }
        }
    }
    return best;
}

/* Where searching s[0..n) for tags no longer than max_len can resume after
 * a search found nothing. */
static size_t resume_at(size_t n, size_t max_len) { return n >= max_len ? n - (max_len - 1) : 0; }

enum { MATCH, NEED_MORE, MISMATCH };

/* Matches lit at s[*i]: MATCH (and advances), NEED_MORE when s ends inside
 * it, MISMATCH. */
static int expect(const char *s, size_t n, size_t *i, const char *lit) {
    size_t l = strlen(lit), have = n - *i < l ? n - *i : l;
    if (memcmp(s + *i, lit, have) != 0) return MISMATCH;
    if (have < l) return NEED_MORE;
    *i += l;
    return MATCH;
}

static size_t skip_space(const char *s, size_t n, size_t i) {
    while (i < n && is_space(s[i])) i++;
    return i;
}

/* Appends s[0..n) to out without whitespace outside strings; with
 * stop_at_close, stops after the bracket that brings the depth back to 0.
 * Returns the bytes read. */
static size_t minify(struct mini *m, const char *s, size_t n, struct sp_buf *out, bool stop_at_close) {
    size_t i = 0, start = 0;
    while (i < n) {
        char c = s[i++];
        if (m->str) {
            if (m->esc)
                m->esc = false;
            else if (c == '\\')
                m->esc = true;
            else if (c == '"')
                m->str = false;
        } else if (is_space(c)) {
            sp_buf_append(out, s + start, i - 1 - start);
            start = i;
        } else if (c == '"') {
            m->str = true;
        } else if (c == '{' || c == '[') {
            m->depth++;
        } else if ((c == '}' || c == ']') && --m->depth == 0 && stop_at_close) {
            break;
        }
    }
    sp_buf_append(out, s + start, i - start);
    return i;
}

/* Whether v[0..n) is exactly one valid JSON value (whitespace around it allowed). */
static bool is_json_value(const char *v, size_t n) {
    struct sp_jsonv j;
    sp_jsonv_init(&j);
    if (!sp_jsonv_feed(&j, "{\"v\":", 5) || !sp_jsonv_feed(&j, v, n) || !sp_jsonv_feed(&j, "}", 1) ||
        !sp_jsonv_complete(&j))
        return false;
    // "1,\"w\":2" is valid inside the wrapper but is not one value
    struct mini m = {0};
    for (size_t i = 0; i < n; i++) {
        char c = v[i];
        if (m.str) {
            if (m.esc)
                m.esc = false;
            else if (c == '\\')
                m.esc = true;
            else if (c == '"')
                m.str = false;
        } else if (c == '"') {
            m.str = true;
        } else if (c == '{' || c == '[') {
            m.depth++;
        } else if (c == '}' || c == ']') {
            m.depth--;
        } else if (c == ',' && m.depth == 0) {
            return false;
        }
    }
    return true;
}

/* ---- events ------------------------------------------------------------- */

static void note(struct sp_chat_parser *p, enum sp_status st) {
    if (st != SP_OK && p->err == SP_OK) p->err = st;
}

/* Appends an event; false when out of memory. */
static bool push_ev(struct sp_chat_parser *p, struct ev e) {
    if (p->n_evs == p->cap_evs) {
        size_t cap = p->cap_evs ? 2 * p->cap_evs : 16;
        struct ev *a = p->evs ? sp_realloc(p->evs, cap * sizeof *a) : sp_malloc(cap * sizeof *a, SP_MEM_SERVER);
        if (!a) {
            note(p, SP_ERR_NOMEM);
            return false;
        }
        p->evs = a;
        p->cap_evs = cap;
    }
    p->evs[p->n_evs++] = e;
    return true;
}

/* A piece of content, reasoning or arguments (of the latest call), merged
 * into the previous event when that is the same kind. */
static void emit(struct sp_chat_parser *p, enum sp_chat_event_kind kind, const char *s, size_t n) {
    if (!n || p->err) return;
    int tool = kind == SP_CHAT_EV_TOOL_ARGS ? p->n_tools - 1 : -1;
    size_t off = p->text.len;
    note(p, sp_buf_append(&p->text, s, n));
    if (p->err) return;
    struct ev *last = p->n_evs ? &p->evs[p->n_evs - 1] : NULL;
    if (last && last->kind == kind && last->tool == tool && last->off + last->len == off) {
        last->len += n;
        return;
    }
    push_ev(p, (struct ev){.kind = kind, .tool = tool, .off = off, .len = n});
}

static void emit_str(struct sp_chat_parser *p, enum sp_chat_event_kind kind, const char *s) {
    emit(p, kind, s, strlen(s));
}

/* "call_" and 24 letters and digits drawn from the seed and the call's index. */
static void make_id(uint64_t seed, int index, char out[32]) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    struct sp_rng r;
    sp_rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(index + 1)));
    memcpy(out, "call_", 5);
    for (int i = 0; i < 24; i++) out[5 + i] = alnum[sp_rng_next(&r) % (sizeof alnum - 1)];
    out[29] = '\0';
}

/* Starts tool call number n_tools: an event carrying its name and id. */
static void emit_begin(struct sp_chat_parser *p, const char *name, size_t n) {
    if (p->err) return;
    char id[32];
    make_id(p->opts.id_seed, p->n_tools, id);
    size_t id_off = p->text.len;
    note(p, sp_buf_append(&p->text, id, strlen(id) + 1));
    size_t off = p->text.len;
    note(p, sp_buf_append(&p->text, name, n));
    if (p->err) return;
    if (push_ev(p,
                (struct ev){.kind = SP_CHAT_EV_TOOL_BEGIN, .tool = p->n_tools, .off = off, .len = n, .id_off = id_off}))
        p->n_tools++;
}

/* ---- think formats: content and reasoning ------------------------------- */

/* Drops newlines owed to the tag before; false when the text ran out first. */
static bool do_lstrip(struct sp_chat_parser *p) {
    if (!p->lstrip) return true;
    while (p->pos < p->in.len && is_nl(p->in.data[p->pos])) p->pos++;
    if (p->pos == p->in.len) return false;
    p->lstrip = false;
    return true;
}

static void enter_tool(struct sp_chat_parser *p) {
    p->mode = p->opts.format == SP_CHAT_FORMAT_QWEN3_CODER   ? M_XML
              : p->opts.format == SP_CHAT_FORMAT_DEEPSEEK_V3 ? M_DS
                                                             : M_HERMES;
    p->phase = 0;
    p->scanned = 0;
}

static void end_tool(struct sp_chat_parser *p) {
    p->mode = M_CONTENT;
    p->lstrip = true;
    sp_buf_clear(&p->absorbed);
}

/* At the very start of the output, <think> opens reasoning (or, when the
 * prompt already opened it, is dropped). Returns 1 when it was consumed, 0
 * when more text must come first, -1 when the output starts otherwise. */
static int opening_think(struct sp_chat_parser *p, const char *s, size_t n, bool final) {
    if (!p->think_ok) return -1;
    if (n >= LEN(THINK_OPEN) && memcmp(s, THINK_OPEN, LEN(THINK_OPEN)) == 0) {
        p->pos += LEN(THINK_OPEN);
        p->mode = M_REASONING;
        p->lstrip = true;
        p->think_ok = false;
        return 1;
    }
    if (n < LEN(THINK_OPEN) && memcmp(s, THINK_OPEN, n) == 0 && !final) return 0;
    p->think_ok = false;
    return -1;
}

static bool step_content(struct sp_chat_parser *p, bool final) {
    if (!do_lstrip(p)) return false;
    const char *s = p->in.data + p->pos;
    size_t n = p->in.len - p->pos;
    int think = opening_think(p, s, n, final);
    if (think >= 0) return think == 1;
    static const char *const xml_tags[] = {CALL_OPEN};
    static const char *const ds_tags[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_EOS};
    bool ds = p->opts.format == SP_CHAT_FORMAT_DEEPSEEK_V3;
    const char *const *tags = ds ? ds_tags : xml_tags;
    int n_tags = ds ? 3 : 1;
    size_t at = 0;
    int which = 0;
    if (find_tag(s, n, tags, n_tags, &at, &which)) {
        if (ds && which == 2) { // the end-of-sentence token is not text
            emit(p, SP_CHAT_EV_CONTENT, s, at);
            p->pos += at + LEN(DS_EOS);
            return true;
        }
        size_t k = rstrip_nl(s, at);
        emit(p, SP_CHAT_EV_CONTENT, s, k);
        sp_buf_clear(&p->absorbed);
        note(p, sp_buf_append(&p->absorbed, s + k, at - k));
        // a call that comes without the block's opening token keeps its own
        p->pos += at + (ds && which == 1 ? 0 : strlen(tags[which]));
        enter_tool(p);
        return true;
    }
    size_t k = final ? n : rstrip_nl(s, n - partial_tag(s, n, tags, n_tags));
    emit(p, SP_CHAT_EV_CONTENT, s, k);
    p->pos += k;
    return false;
}

static bool step_reasoning(struct sp_chat_parser *p, bool final) {
    if (!do_lstrip(p)) return false;
    const char *s = p->in.data + p->pos;
    size_t n = p->in.len - p->pos;
    int think = opening_think(p, s, n, final);
    if (think >= 0) return think == 1;
    static const char *const tags[] = {THINK_CLOSE, DS_EOS};
    int n_tags = p->opts.format == SP_CHAT_FORMAT_DEEPSEEK_V3 ? 2 : 1;
    size_t at = 0;
    int which = 0;
    if (find_tag(s, n, tags, n_tags, &at, &which)) {
        emit(p, SP_CHAT_EV_REASONING, s, rstrip_nl(s, at));
        p->pos += at + strlen(tags[which]);
        if (which == 0) {
            p->mode = M_CONTENT;
            p->lstrip = true;
        }
        return true;
    }
    size_t k = final ? n : rstrip_nl(s, n - partial_tag(s, n, tags, n_tags));
    emit(p, SP_CHAT_EV_REASONING, s, k);
    p->pos += k;
    return false;
}

/* ---- tool call bodies judged whole -------------------------------------- */

/* A held body that ended (at </tool_call> or at the end of the text): a
 * hermes call when it parses as one (true), else content, tags included. */
static bool judge_body(struct sp_chat_parser *p, const char *body, size_t n, bool closed) {
    if (p->opts.format == SP_CHAT_FORMAT_HERMES) {
        cJSON *root = NULL;
        if (sp_json_parse(body, n, "tool call", &root) == SP_OK && cJSON_IsObject(root)) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(root, "arguments");
            if (!args) args = cJSON_GetObjectItemCaseSensitive(root, "parameters");
            if (cJSON_IsString(name) && name->valuestring[0]) {
                emit_begin(p, name->valuestring, strlen(name->valuestring));
                if (!args) {
                    emit_str(p, SP_CHAT_EV_TOOL_ARGS, "{}");
                } else if (cJSON_IsString(args)) {
                    emit_str(p, SP_CHAT_EV_TOOL_ARGS, args->valuestring); // already JSON text
                } else {
                    char *text = cJSON_PrintUnformatted(args);
                    if (text)
                        emit_str(p, SP_CHAT_EV_TOOL_ARGS, text);
                    else
                        note(p, SP_ERR_NOMEM);
                    cJSON_free(text);
                }
                cJSON_Delete(root);
                return true;
            }
        }
        cJSON_Delete(root);
        sp_error_clear();
    }
    emit(p, SP_CHAT_EV_CONTENT, p->absorbed.data, p->absorbed.len);
    emit_str(p, SP_CHAT_EV_CONTENT, CALL_OPEN);
    emit(p, SP_CHAT_EV_CONTENT, body, n);
    if (closed) emit_str(p, SP_CHAT_EV_CONTENT, CALL_CLOSE);
    return false;
}

static bool step_hold(struct sp_chat_parser *p, bool final) {
    const char *s = p->in.data + p->pos;
    size_t n = p->in.len - p->pos;
    static const char *const tags[] = {CALL_CLOSE};
    size_t at = 0;
    int which = 0;
    if (find_tag(s + p->scanned, n - p->scanned, tags, 1, &at, &which)) {
        at += p->scanned;
        bool call = judge_body(p, s, at, true);
        p->pos += at + LEN(CALL_CLOSE);
        end_tool(p);
        p->lstrip = call; // text after a failed call keeps its newlines
        return true;
    }
    if (final) {
        judge_body(p, s, n, false);
        p->pos += n;
        end_tool(p);
        return true;
    }
    p->scanned = resume_at(n, LEN(CALL_CLOSE));
    return false;
}

static void to_hold(struct sp_chat_parser *p) {
    p->mode = M_HOLD;
    p->scanned = 0;
}

/* ---- hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> --- */

/* Matches ws { ws "name" ws : ws "NAME" ws , ws "arguments" ws : ws { at
 * the start of s[0..n): the name (no escapes) and the offset of the
 * arguments' opening brace. */
static int match_call_prefix(const char *s, size_t n, size_t *name_at, size_t *name_len, size_t *args_at) {
    static const char *const before_name[] = {"{", "\"name\"", ":", "\""};
    static const char *const after_name[] = {",", "\"arguments\"", ":", "{"};
    size_t i = 0;
    for (int k = 0; k < 4; k++) {
        i = skip_space(s, n, i);
        int m = expect(s, n, &i, before_name[k]);
        if (m != MATCH) return m;
    }
    *name_at = i;
    while (i < n && s[i] != '"') {
        if (s[i] == '\\' || (unsigned char)s[i] < 0x20 || i - *name_at >= NAME_MAX_LEN) return MISMATCH;
        i++;
    }
    if (i == n) return NEED_MORE;
    *name_len = i - *name_at;
    if (*name_len == 0) return MISMATCH;
    i++;
    for (int k = 0; k < 4; k++) {
        i = skip_space(s, n, i);
        int m = expect(s, n, &i, after_name[k]);
        if (m != MATCH) return m;
    }
    *args_at = i - 1;
    return MATCH;
}

static bool step_hermes(struct sp_chat_parser *p, bool final) {
    const char *s = p->in.data + p->pos;
    size_t n = p->in.len - p->pos;
    static const char *const tags[] = {CALL_CLOSE};
    size_t at = 0;
    int which = 0;
    bool closed = find_tag(s, n, tags, 1, &at, &which);
    switch ((enum hermes_phase)p->phase) {
    case HJ_PREFIX: {
        size_t name_at, name_len, args_at;
        int m = match_call_prefix(s, closed ? at : n, &name_at, &name_len, &args_at);
        if (m == MATCH) {
            emit_begin(p, s + name_at, name_len);
            p->args = (struct mini){0};
            p->pos += args_at;
            p->phase = HJ_ARGS;
            return true;
        }
        if (m == MISMATCH || closed || final) {
            to_hold(p);
            return true;
        }
        return false;
    }
    case HJ_ARGS: {
        size_t end = closed ? at : final ? n : n - partial_tag(s, n, tags, 1);
        sp_buf_clear(&p->scratch);
        size_t used = minify(&p->args, s, end, &p->scratch, true);
        emit(p, SP_CHAT_EV_TOOL_ARGS, p->scratch.data, p->scratch.len);
        p->pos += used;
        if (used < end || (used > 0 && p->args.depth == 0)) {
            p->phase = HJ_TAIL;
            return true;
        }
        if (closed) {
            p->pos += LEN(CALL_CLOSE);
            end_tool(p);
            return true;
        }
        if (final) {
            end_tool(p);
            return true;
        }
        return false;
    }
    case HJ_TAIL:
        if (closed) {
            p->pos += at + LEN(CALL_CLOSE);
            end_tool(p);
            return true;
        }
        if (final) {
            p->pos += n;
            end_tool(p);
            return true;
        }
        p->pos += n - partial_tag(s, n, tags, 1);
        return false;
    }
    return false;
}

/* ---- qwen3-coder: <function=f><parameter=p>VALUE</parameter></function> - */

/* The "properties" object of the named function in opts.tools, or NULL. */
static const cJSON *find_props(const cJSON *tools, const char *name, size_t n) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!fn) fn = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || strlen(nm->valuestring) != n || memcmp(nm->valuestring, name, n) != 0) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        return cJSON_GetObjectItemCaseSensitive(params, "properties");
    }
    return NULL;
}

enum param_type { PT_UNKNOWN, PT_STRING, PT_BOOL, PT_OTHER };

bool sp_chat_param_is_text(const cJSON *prop) {
    static const char *const strings[] = {"string", "str", "text", "varchar", "char", "enum"};
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(prop, "type");
    for (size_t i = 0; cJSON_IsString(type) && i < sizeof strings / sizeof *strings; i++)
        if (strcasecmp(type->valuestring, strings[i]) == 0) return true;
    return false;
}

/* The schema type of the current parameter: the string family
 * (sp_chat_param_is_text), boolean, another declared type, or none
 * declared. */
static enum param_type param_type(const struct sp_chat_parser *p) {
    if (!p->props || !p->pname.data) return PT_UNKNOWN;
    const cJSON *prop = cJSON_GetObjectItemCaseSensitive(p->props, p->pname.data);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(prop, "type");
    if (!cJSON_IsString(type)) return PT_UNKNOWN;
    if (sp_chat_param_is_text(prop)) return PT_STRING;
    if (strcasecmp(type->valuestring, "boolean") == 0 || strcasecmp(type->valuestring, "bool") == 0) return PT_BOOL;
    return PT_OTHER;
}

static bool text_is(const char *v, size_t n, const char *word) {
    return n == strlen(word) && strncasecmp(v, word, n) == 0;
}

/* Emits ,"NAME":VALUE (no comma for the first) for the value text v[0..n). */
static void emit_param(struct sp_chat_parser *p, const char *v, size_t n) {
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    struct sp_buf *b = &p->scratch;
    sp_buf_clear(b);
    if (p->n_params++) sp_buf_putc(b, ',');
    sp_json_escape(b, p->pname.data ? p->pname.data : "", p->pname.len);
    sp_buf_putc(b, ':');
    enum param_type t = param_type(p);
    if (text_is(v, n, "null")) { // any case, whatever the type, as the reference does
        sp_buf_puts(b, "null");
    } else if (t == PT_BOOL) {
        sp_buf_puts(b, text_is(v, n, "true") || text_is(v, n, "1") ? "true" : "false");
    } else if (t == PT_STRING || !is_json_value(v, n)) {
        sp_json_escape(b, v, n);
    } else {
        struct mini m = {0};
        minify(&m, v, n, b, false);
    }
    note(p, b->failed ? SP_ERR_NOMEM : SP_OK);
    emit(p, SP_CHAT_EV_TOOL_ARGS, b->data, b->len);
}

static void close_xml_call(struct sp_chat_parser *p) {
    emit_str(p, SP_CHAT_EV_TOOL_ARGS, "}");
    p->phase = X_AFTER_FUNC;
}

static bool step_xml(struct sp_chat_parser *p, bool final) {
    const char *s = p->in.data + p->pos;
    size_t n = p->in.len - p->pos;
    size_t at = 0;
    int which = 0;
    switch ((enum xml_phase)p->phase) {
    case X_START: {
        // ws <function=NAME>, all of it seen before anything is consumed
        size_t i = skip_space(s, n, 0);
        int m = expect(s, n, &i, "<function=");
        if (m == MATCH) {
            size_t lim = n - i < NAME_MAX_LEN + 1 ? n - i : NAME_MAX_LEN + 1;
            const char *gt = memchr(s + i, '>', lim);
            const char *bad = memchr(s + i, '\n', gt ? (size_t)(gt - (s + i)) : lim);
            if (!bad) bad = memchr(s + i, '<', gt ? (size_t)(gt - (s + i)) : lim);
            if (gt && !bad && gt > s + i) {
                size_t len = (size_t)(gt - (s + i));
                emit_begin(p, s + i, len);
                emit_str(p, SP_CHAT_EV_TOOL_ARGS, "{");
                p->props = find_props(p->opts.tools, s + i, len);
                p->n_params = 0;
                p->pos += i + len + 1;
                p->phase = X_PARAMS;
                return true;
            }
            m = bad || gt || lim == NAME_MAX_LEN + 1 ? MISMATCH : NEED_MORE;
        }
        if (m == MISMATCH || final) {
            to_hold(p);
            return true;
        }
        return false;
    }
    case X_PARAMS: {
        static const char *const tags[] = {"<parameter=", "</function>", CALL_CLOSE};
        if (find_tag(s, n, tags, 3, &at, &which)) {
            p->pos += at + strlen(tags[which]);
            if (which == 0) {
                p->phase = X_PNAME;
            } else {
                close_xml_call(p);
                if (which == 2) end_tool(p);
            }
            return true;
        }
        if (final) {
            p->pos += n;
            close_xml_call(p);
            end_tool(p);
            return true;
        }
        p->pos += n - partial_tag(s, n, tags, 3); // text between parameters is not part of the call
        return false;
    }
    case X_PNAME: {
        const char *gt = memchr(s, '>', n < NAME_MAX_LEN + 1 ? n : NAME_MAX_LEN + 1);
        if (gt) {
            sp_buf_clear(&p->pname);
            note(p, sp_buf_append(&p->pname, s, (size_t)(gt - s)));
            p->pos += (size_t)(gt - s) + 1;
            p->phase = X_PVALUE;
            p->scanned = 0;
            return true;
        }
        if (final || n > NAME_MAX_LEN) {
            p->phase = X_PARAMS; // not a parameter after all; X_PARAMS skips the text
            return true;
        }
        return false;
    }
    case X_PVALUE: {
        static const char *const tags[] = {"</parameter>", "<parameter=", "</function>", CALL_CLOSE};
        if (find_tag(s + p->scanned, n - p->scanned, tags, 4, &at, &which)) {
            at += p->scanned;
            emit_param(p, s, at);
            p->pos += at + (which == 0 ? strlen(tags[0]) : 0);
            p->phase = X_PARAMS;
            return true;
        }
        if (final) {
            emit_param(p, s, n);
            p->pos += n;
            close_xml_call(p);
            end_tool(p);
            return true;
        }
        p->scanned = resume_at(n, LEN(CALL_CLOSE));
        return false;
    }
    case X_AFTER_FUNC: {
        static const char *const tags[] = {CALL_CLOSE, "<function="};
        if (find_tag(s, n, tags, 2, &at, &which)) {
            if (which == 0) {
                p->pos += at + LEN(CALL_CLOSE);
                end_tool(p);
            } else {
                // another function in the same <tool_call>
                p->pos += at;
                sp_buf_clear(&p->absorbed);
                p->phase = X_START;
            }
            return true;
        }
        if (final) {
            p->pos += n;
            end_tool(p);
            return true;
        }
        p->pos += n - partial_tag(s, n, tags, 2);
        return false;
    }
    }
    return false;
}

/* ---- deepseek v3.1: <｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜> */

static bool step_ds(struct sp_chat_parser *p, bool final) {
    const char *s = p->in.data + p->pos;
    size_t n = p->in.len - p->pos;
    size_t at = 0;
    int which = 0;
    switch ((enum ds_phase)p->phase) {
    case DS_BETWEEN: {
        static const char *const tags[] = {DS_CALL_BEGIN, DS_CALLS_END, DS_EOS};
        if (find_tag(s, n, tags, 3, &at, &which)) {
            p->pos += at; // only whitespace is expected between calls
            if (which == 0) {
                p->phase = DS_HEAD;
            } else {
                p->pos += strlen(tags[which]);
                end_tool(p);
            }
            return true;
        }
        p->pos += final ? n : n - partial_tag(s, n, tags, 3);
        if (final) end_tool(p);
        return final;
    }
    case DS_HEAD: {
        // s starts with <｜tool▁call▁begin｜>; the name runs to <｜tool▁sep｜>
        size_t b = LEN(DS_CALL_BEGIN), lim = n - b < NAME_MAX_LEN + LEN(DS_SEP) ? n - b : NAME_MAX_LEN + LEN(DS_SEP);
        const char *sep = memmem(s + b, lim, DS_SEP, LEN(DS_SEP));
        size_t i = b, e = sep ? (size_t)(sep - s) : 0;
        while (i < e && is_space(s[i])) i++;
        while (e > i && is_space(s[e - 1])) e--;
        if (sep && e > i) {
            emit_begin(p, s + i, e - i);
            p->pos += (size_t)(sep - s) + LEN(DS_SEP);
            p->phase = DS_ARGS;
            return true;
        }
        if (sep || final || lim == NAME_MAX_LEN + LEN(DS_SEP)) {
            // an empty name, no name, or cut short: not a call; the token is dropped
            p->pos += b;
            p->phase = DS_BETWEEN;
            return true;
        }
        return false;
    }
    case DS_ARGS: {
        static const char *const tags[] = {DS_CALL_END, DS_CALL_BEGIN, DS_CALLS_END, DS_EOS};
        if (find_tag(s, n, tags, 4, &at, &which)) {
            emit(p, SP_CHAT_EV_TOOL_ARGS, s, at);
            p->pos += at + (which == 0 ? LEN(DS_CALL_END) : 0);
            p->phase = DS_BETWEEN;
            return true;
        }
        size_t k = final ? n : n - partial_tag(s, n, tags, 4);
        emit(p, SP_CHAT_EV_TOOL_ARGS, s, k);
        p->pos += k;
        if (final) end_tool(p);
        return final;
    }
    }
    return false;
}

/* ---- harmony ------------------------------------------------------------ */

/* Reads a header (the text between <|start|> and <|message|>): its channel
 * and recipient decide where the body goes. */
static void parse_header(struct sp_chat_parser *p, const char *h, size_t n) {
    const char *ch = memmem(h, n, H_TOKENS[HT_CHANNEL], strlen(H_TOKENS[HT_CHANNEL]));
    bool analysis = false;
    if (ch) {
        ch += strlen(H_TOKENS[HT_CHANNEL]);
        size_t w = 0;
        while (ch + w < h + n && (ch[w] == '_' || ch[w] == '-' || (ch[w] >= '0' && ch[w] <= '9') ||
                                  ((ch[w] | 0x20) >= 'a' && (ch[w] | 0x20) <= 'z')))
            w++;
        analysis = w == 8 && memcmp(ch, "analysis", 8) == 0;
    }
    const char *to = memmem(h, n, "to=", 3);
    if (to) {
        const char *r = to + 3, *end = r;
        while (end < h + n && !is_space(*end) && *end != '<') end++;
        if (end > r) {
            if (end - r > 10 && memcmp(r, "functions.", 10) == 0) r += 10;
            emit_begin(p, r, (size_t)(end - r));
            p->route = R_ARGS;
            return;
        }
    }
    p->route = analysis ? R_REASONING : R_CONTENT;
}

/* The end of the text inside a header: a header that names a channel was
 * cut short and is dropped; anything else is text the model wrote outside
 * the format, kept as content without the tokens. */
static void header_leftover(struct sp_chat_parser *p, const char *h, size_t n) {
    if (memmem(h, n, H_TOKENS[HT_CHANNEL], strlen(H_TOKENS[HT_CHANNEL]))) return;
    size_t at = 0;
    int which = 0;
    while (find_tag(h, n, H_TOKENS, HT_COUNT, &at, &which)) {
        emit(p, SP_CHAT_EV_CONTENT, h, at);
        size_t l = at + strlen(H_TOKENS[which]);
        h += l;
        n -= l;
    }
    emit(p, SP_CHAT_EV_CONTENT, h, n);
}

static bool step_h_header(struct sp_chat_parser *p, bool final) {
    const char *s = p->in.data + p->pos;
    size_t n = p->in.len - p->pos;
    static const char *const tags[] = {"<|message|>"};
    size_t at = 0;
    int which = 0;
    if (find_tag(s + p->scanned, n - p->scanned, tags, 1, &at, &which)) {
        at += p->scanned;
        parse_header(p, s, at);
        p->pos += at + strlen(tags[0]);
        p->mode = M_H_BODY;
        return true;
    }
    if (final) {
        header_leftover(p, s, n);
        p->pos += n;
        p->mode = M_H_BODY;
        p->route = R_CONTENT;
        return false;
    }
    p->scanned = resume_at(n, strlen(tags[0]));
    return false;
}

static const enum sp_chat_event_kind route_kind[] = {SP_CHAT_EV_CONTENT, SP_CHAT_EV_REASONING, SP_CHAT_EV_TOOL_ARGS};

static bool step_h_body(struct sp_chat_parser *p, bool final) {
    const char *s = p->in.data + p->pos;
    size_t n = p->in.len - p->pos;
    size_t at = 0;
    int which = 0;
    if (find_tag(s, n, H_TOKENS, HT_COUNT, &at, &which)) {
        emit(p, route_kind[p->route], s, at);
        p->pos += at;
        switch (which) {
        case HT_START:
            p->pos += strlen(H_TOKENS[which]);
            /* fall through */
        case HT_CHANNEL: // a header without <|start|>: the token stays in it
            p->mode = M_H_HEADER;
            p->scanned = 0;
            break;
        case HT_END:
        case HT_CALL:
        case HT_RETURN:
        case HT_EOT:
            p->route = R_CONTENT;
            /* fall through */
        default:
            p->pos += strlen(H_TOKENS[which]);
            break;
        }
        return true;
    }
    size_t k = final ? n : n - partial_tag(s, n, H_TOKENS, HT_COUNT);
    emit(p, route_kind[p->route], s, k);
    p->pos += k;
    return false;
}

/* ---- driver ------------------------------------------------------------- */

static bool step(struct sp_chat_parser *p, bool final) {
    switch (p->mode) {
    case M_PLAIN:
        emit(p, SP_CHAT_EV_CONTENT, p->in.data + p->pos, p->in.len - p->pos);
        p->pos = p->in.len;
        return false;
    case M_CONTENT:
        return step_content(p, final);
    case M_REASONING:
        return step_reasoning(p, final);
    case M_HERMES:
        return step_hermes(p, final);
    case M_XML:
        return step_xml(p, final);
    case M_HOLD:
        return step_hold(p, final);
    case M_DS:
        return step_ds(p, final);
    case M_H_HEADER:
        return step_h_header(p, final);
    case M_H_BODY:
        return step_h_body(p, final);
    }
    return false;
}

static void begin_call(struct sp_chat_parser *p) {
    sp_buf_clear(&p->text);
    p->n_evs = 0;
}

/* Runs the steps, then resolves the events' offsets into pointers. */
static enum sp_status run(struct sp_chat_parser *p, bool final) {
    while (p->err == SP_OK && step(p, final)) {
    }
    if (p->err == SP_OK && p->n_evs > p->cap_pub) {
        struct sp_chat_event *e =
            p->pub ? sp_realloc(p->pub, p->n_evs * sizeof *e) : sp_malloc(p->n_evs * sizeof *e, SP_MEM_SERVER);
        if (!e)
            p->err = SP_ERR_NOMEM;
        else
            p->pub = e, p->cap_pub = p->n_evs;
    }
    if (p->err != SP_OK) {
        p->n_evs = 0;
        return sp_errorf(p->err, "chat parser: %s", sp_status_str(p->err));
    }
    for (size_t i = 0; i < p->n_evs; i++) {
        const struct ev *e = &p->evs[i];
        p->pub[i] = (struct sp_chat_event){
            .kind = e->kind,
            .tool_index = e->tool,
            .text = p->text.data + e->off,
            .len = e->len,
            .id = e->kind == SP_CHAT_EV_TOOL_BEGIN ? p->text.data + e->id_off : NULL,
        };
    }
    return SP_OK;
}

enum sp_status sp_chat_parser_new(const struct sp_chat_parse_opts *opts, struct sp_chat_parser **out) {
    *out = NULL;
    if (!opts || (unsigned)opts->format >= SP_CHAT_FORMAT_COUNT)
        return sp_errorf(SP_ERR_ARG, "chat parser: unknown format");
    struct sp_chat_parser *p = sp_calloc(1, sizeof *p, SP_MEM_SERVER);
    if (!p) return sp_errorf(SP_ERR_NOMEM, "chat parser: out of memory");
    p->opts = *opts;
    if (sp_buf_reserve(&p->in, 256) != SP_OK) { // in.data is never NULL from here on
        sp_free(p);
        return sp_errorf(SP_ERR_NOMEM, "chat parser: out of memory");
    }
    switch (opts->format) {
    case SP_CHAT_FORMAT_PLAIN:
        p->mode = M_PLAIN;
        break;
    case SP_CHAT_FORMAT_HARMONY:
        p->mode = opts->in_reasoning ? M_H_BODY : M_H_HEADER;
        p->route = opts->in_reasoning ? R_REASONING : R_CONTENT;
        break;
    default:
        p->mode = opts->in_reasoning ? M_REASONING : M_CONTENT;
        p->think_ok = true;
        p->lstrip = true;
        break;
    }
    *out = p;
    return SP_OK;
}

void sp_chat_parser_free(struct sp_chat_parser *p) {
    if (!p) return;
    sp_buf_free(&p->in);
    sp_buf_free(&p->absorbed);
    sp_buf_free(&p->pname);
    sp_buf_free(&p->scratch);
    sp_buf_free(&p->text);
    sp_free(p->evs);
    sp_free(p->pub);
    sp_free(p);
}

enum sp_status sp_chat_parser_push(struct sp_chat_parser *p, const char *text, size_t len) {
    if (p->finished) return sp_errorf(SP_ERR_STATE, "chat parser: text pushed after finish");
    begin_call(p);
    if (p->pos) {
        memmove(p->in.data, p->in.data + p->pos, p->in.len - p->pos);
        p->in.len -= p->pos;
        p->in.data[p->in.len] = '\0';
        p->pos = 0;
    }
    if (len && sp_buf_append(&p->in, text, len) != SP_OK) return sp_errorf(SP_ERR_NOMEM, "chat parser: out of memory");
    return run(p, false);
}

enum sp_status sp_chat_parser_finish(struct sp_chat_parser *p) {
    if (p->finished) return sp_errorf(SP_ERR_STATE, "chat parser: finished twice");
    p->finished = true;
    begin_call(p);
    return run(p, true);
}

const struct sp_chat_event *sp_chat_parser_events(const struct sp_chat_parser *p, size_t *n) {
    *n = p->n_evs;
    return p->pub;
}

int sp_chat_parser_tool_calls(const struct sp_chat_parser *p) { return p->n_tools; }

/* ---- whole messages ----------------------------------------------------- */

enum sp_status sp_chat_result_add(struct sp_chat_result *r, const struct sp_chat_event *ev, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const struct sp_chat_event *e = &ev[i];
        enum sp_status st = SP_OK;
        switch (e->kind) {
        case SP_CHAT_EV_CONTENT:
            st = sp_buf_append(&r->content, e->text, e->len);
            break;
        case SP_CHAT_EV_REASONING:
            st = sp_buf_append(&r->reasoning, e->text, e->len);
            break;
        case SP_CHAT_EV_TOOL_BEGIN: {
            if (e->tool_index != (int)r->n_tool_calls)
                return sp_errorf(SP_ERR_ARG, "chat result: tool call %d begins out of order", e->tool_index);
            struct sp_chat_tool_call *tc = r->tool_calls ? sp_realloc(r->tool_calls, (r->n_tool_calls + 1) * sizeof *tc)
                                                         : sp_malloc(sizeof *tc, SP_MEM_SERVER);
            if (!tc) return sp_errorf(SP_ERR_NOMEM, "chat result: out of memory");
            r->tool_calls = tc;
            tc += r->n_tool_calls;
            *tc = (struct sp_chat_tool_call){0};
            snprintf(tc->id, sizeof tc->id, "%s", e->id ? e->id : "");
            tc->name = sp_strndup(e->text, e->len, SP_MEM_SERVER);
            if (!tc->name) return sp_errorf(SP_ERR_NOMEM, "chat result: out of memory");
            r->n_tool_calls++;
            break;
        }
        case SP_CHAT_EV_TOOL_ARGS:
            if (e->tool_index < 0 || e->tool_index >= (int)r->n_tool_calls)
                return sp_errorf(SP_ERR_ARG, "chat result: arguments for unknown tool call %d", e->tool_index);
            st = sp_buf_append(&r->tool_calls[e->tool_index].arguments, e->text, e->len);
            break;
        default:
            return sp_errorf(SP_ERR_ARG, "chat result: unknown event kind %d", (int)e->kind);
        }
        if (st != SP_OK) return sp_errorf(st, "chat result: out of memory");
    }
    return SP_OK;
}

void sp_chat_result_free(struct sp_chat_result *r) {
    if (!r) return;
    sp_buf_free(&r->content);
    sp_buf_free(&r->reasoning);
    for (size_t i = 0; i < r->n_tool_calls; i++) {
        sp_free(r->tool_calls[i].name);
        sp_buf_free(&r->tool_calls[i].arguments);
    }
    sp_free(r->tool_calls);
    *r = (struct sp_chat_result){0};
}

enum sp_status sp_chat_parse(const struct sp_chat_parse_opts *opts, const char *text, size_t len,
                             struct sp_chat_result *out) {
    *out = (struct sp_chat_result){0};
    struct sp_chat_parser *p = NULL;
    size_t n = 0;
    const struct sp_chat_event *ev;
    enum sp_status st = sp_chat_parser_new(opts, &p);
    if (st != SP_OK) goto fail;
    if ((st = sp_chat_parser_push(p, text, len)) != SP_OK) goto fail;
    ev = sp_chat_parser_events(p, &n);
    if ((st = sp_chat_result_add(out, ev, n)) != SP_OK) goto fail;
    if ((st = sp_chat_parser_finish(p)) != SP_OK) goto fail;
    ev = sp_chat_parser_events(p, &n);
    if ((st = sp_chat_result_add(out, ev, n)) != SP_OK) goto fail;
fail:
    sp_chat_parser_free(p);
    return st;
}

/* ---- choosing a format -------------------------------------------------- */

const char *sp_chat_format_name(enum sp_chat_format f) {
    static const char *const names[SP_CHAT_FORMAT_COUNT] = {"plain", "hermes", "qwen3_coder", "deepseek_v3", "harmony"};
    return (unsigned)f < SP_CHAT_FORMAT_COUNT ? names[f] : "unknown";
}

enum sp_chat_format sp_chat_format_detect(const char *template_source, const char *model_type) {
    if (template_source && *template_source) {
        if (strstr(template_source, "<|channel|>")) return SP_CHAT_FORMAT_HARMONY;
        if (strstr(template_source, "<function=") && strstr(template_source, "<parameter="))
            return SP_CHAT_FORMAT_QWEN3_CODER;
        if (strstr(template_source, DS_CALLS_BEGIN)) return SP_CHAT_FORMAT_DEEPSEEK_V3;
        if (strstr(template_source, CALL_OPEN) || strstr(template_source, THINK_OPEN)) return SP_CHAT_FORMAT_HERMES;
        return SP_CHAT_FORMAT_PLAIN;
    }
    if (!model_type) return SP_CHAT_FORMAT_PLAIN;
    if (strcmp(model_type, "gpt_oss") == 0) return SP_CHAT_FORMAT_HARMONY;
    if (strncmp(model_type, "deepseek", 8) == 0) return SP_CHAT_FORMAT_DEEPSEEK_V3;
    if (strncmp(model_type, "qwen3", 5) == 0 || strncmp(model_type, "bailing", 7) == 0) return SP_CHAT_FORMAT_HERMES;
    return SP_CHAT_FORMAT_PLAIN;
}

bool sp_chat_prompt_in_reasoning(enum sp_chat_format f, const char *prompt, size_t len) {
    if (f != SP_CHAT_FORMAT_HERMES && f != SP_CHAT_FORMAT_QWEN3_CODER && f != SP_CHAT_FORMAT_DEEPSEEK_V3) return false;
    const char *open = NULL, *close = NULL;
    for (const char *s = prompt; (s = memmem(s, len - (size_t)(s - prompt), THINK_OPEN, LEN(THINK_OPEN)));
         s += LEN(THINK_OPEN))
        open = s;
    if (!open) return false;
    close = memmem(open, len - (size_t)(open - prompt), THINK_CLOSE, LEN(THINK_CLOSE));
    return close == NULL;
}
