/*
 * server.c - OpenAI routes over libmicrohttpd. Each connection has its own
 * thread (MHD_USE_THREAD_PER_CONNECTION), so a route may block waiting for
 * its request's tokens; a hung-up client is noticed by polling the socket
 * between waits and cancels its generation. A thread per connection makes
 * idle connections costly, so they are bounded three ways: a total and a
 * per-address limit enforced at accept (closing, never queueing), and a
 * watchdog that closes a connection still owing its request after
 * request_timeout.
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/json.h"
#include "core/log.h"
#include "core/rng.h"
#include "server/api.h"
#include "server/chat_parse.h"
#include "server/constrain.h"
#include "server/info.h"
#include "server/webui.h"

#define POLL_MS 50
/* Retry-After of a 503: a full queue drains within a few decode steps; a
 * model takes longer to load. */
#define RETRY_BUSY_S "1"
#define RETRY_LOADING_S "5"
/* how long sp_server_stop waits for connections to write their endings */
#define STOP_FLUSH_S 2.0
/* Connections beyond the limit are refused by an accept policy, so the
 * daemon's own limit (at which it stops accepting and new clients wait in
 * the backlog) is set this much higher and never reached. */
#define MHD_LIMIT_MARGIN 64
/* file descriptors kept free of connections: model files, io_uring, logs */
#define FD_RESERVE 128
#define WATCHDOG_MS 100
#define MAX_CACHE_SALT 256
_Static_assert(MAX_CACHE_SALT + 16 < SP_MAX_CACHE_SCOPE, "a salted key scope fits a cache scope");

static const int status_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define N_STATUS (sizeof status_codes / sizeof *status_codes)

struct sp_server {
    struct sp_server_opts o;
    struct MHD_Daemon *d;
    int port;
    /* set once by sp_server_attach */
    atomic_bool ready;
    struct sp_engine *engine;
    const struct sp_tokenizer *tok;
    const struct sp_chat_template *ct;
    struct sp_engine_info info;  // the model's facts, taken once at attach
    /* for /v1/sparrow/info, set once by sp_server_set_plan */
    struct sp_plan plan;
    bool has_plan;
    const char *device, *kernels;
    atomic_ullong status_count[N_STATUS];
    atomic_ullong id_counter;
    int64_t started;
    /* shutdown: draining refuses new work; stopping ends what still runs */
    atomic_bool draining, stopping;
    atomic_int in_flight;  // submitted generations whose response is not yet complete
    int quiesced_fd;       // the listening socket after sp_server_drain, closed after the daemon stops
    /* connections: counted for the accept policy, and watched so that each
     * sends its request within request_timeout */
    int max_conns;
    atomic_int n_conns;
    /* prompts being rendered and tokenized (at most max_tokenizing), and
     * those waiting for their turn */
    pthread_mutex_t tok_mu;
    pthread_cond_t tok_cv;
    int tok_active, tok_waiting;
    pthread_mutex_t socks_mu;
    pthread_cond_t socks_cv;
    struct sock *socks;  // every open connection (guarded by socks_mu)
    bool watchdog_started, watchdog_stop;
    pthread_t watchdog;
};

/* One TCP connection, from accept to close (MHD's socket context). While
 * `reading`, the connection owes a whole request: since `since` (its opening
 * or its previous response's end) it has request_timeout to deliver it. */
struct sock {
    struct sock *prev, *next;
    int fd;
    atomic_bool reading;
    _Atomic double since;
    bool expired;    // shut down by the watchdog
    bool anthropic;  // the request being served is an Anthropic route: errors in Anthropic's shape
};

/* Per-connection state, from the first call of the access handler to the
 * completion notice. */
struct conn {
    struct sp_server *srv;
    struct sp_buf body;
    bool too_big;
    bool counted;     // counted in srv->in_flight until the response completes
    int key;          // the API key's index, or KEY_NONE
    struct job *job;  // a generation in flight (owned; freed at completion)
};

/* ---- connections ---- */

static struct sock *conn_sock(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* A request has arrived whole (reading false), or its response has ended
 * and the connection may send the next (reading true, the clock restarts). */
static void sock_reading(struct MHD_Connection *c, bool reading) {
    struct sock *k = conn_sock(c);
    if (!k) return;
    if (reading) atomic_store(&k->since, sp_now_s());
    atomic_store(&k->reading, reading);
}

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
    struct sp_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->n_conns, 1);
        struct sock *k = sp_calloc(1, sizeof *k, SP_MEM_SERVER);
        *socket_context = k;
        if (!k) return;  // not watched; still counted
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        atomic_store(&k->since, sp_now_s());
        atomic_store(&k->reading, true);
        pthread_mutex_lock(&s->socks_mu);
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->socks_mu);
        return;
    }
    atomic_fetch_sub(&s->n_conns, 1);
    struct sock *k = *socket_context;
    if (!k) return;
    /* unlinked before MHD closes the descriptor, so the watchdog never
     * shuts down a number the kernel has given to another socket */
    pthread_mutex_lock(&s->socks_mu);
    if (k->prev) k->prev->next = k->next;
    else s->socks = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&s->socks_mu);
    sp_free(k);
    *socket_context = NULL;
}

/* Closes connections that owe a request past request_timeout: an idle
 * keep-alive connection, or one sending its headers or body a byte at a
 * time (libmicrohttpd's own timeout counts from the last byte, so a
 * trickle never ends). shutdown() wakes the connection's thread, which
 * sees the end of the stream and closes it. */
static void *watchdog_main(void *arg) {
    struct sp_server *s = arg;
    pthread_mutex_lock(&s->socks_mu);
    while (!s->watchdog_stop) {
        double now = sp_now_s();
        for (struct sock *k = s->socks; k; k = k->next) {
            if (k->expired || k->fd < 0 || !atomic_load(&k->reading)) continue;
            if (now - atomic_load(&k->since) < s->o.request_timeout) continue;
            k->expired = true;
            shutdown(k->fd, SHUT_RDWR);
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += WATCHDOG_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->socks_cv, &s->socks_mu, &until);
    }
    pthread_mutex_unlock(&s->socks_mu);
    return NULL;
}

/* Beyond max_conns a connection is closed at once: the client learns it
 * cannot be served now instead of waiting in the listen backlog. */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
    struct sp_server *s = cls;
    return atomic_load(&s->n_conns) < s->max_conns ? MHD_YES : MHD_NO;
}

/* ---- responses ---- */

static void count_status(struct sp_server *s, int code) {
    for (size_t i = 0; i < N_STATUS; i++)
        if (status_codes[i] == code) atomic_fetch_add(&s->status_count[i], 1);
}

static void add_common_headers(struct sp_server *s, struct MHD_Response *r, const char *ctype) {
    MHD_add_response_header(r, "Content-Type", ctype);
    if (s->o.cors) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", s->o.cors);
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, x-api-key, anthropic-version");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    }
}

/* retry_after: seconds for a Retry-After header, or NULL. */
static enum MHD_Result respond(struct MHD_Connection *c, struct sp_server *s, int code, const char *ctype,
                               const char *body, size_t len, const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    add_common_headers(s, r, ctype);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    /* while shutting down, no connection is kept for a next request */
    if (atomic_load(&s->draining)) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, r);
    MHD_destroy_response(r);
    count_status(s, code);
    return ret;
}

static enum MHD_Result send_body(struct MHD_Connection *c, struct sp_server *s, int code, const char *ctype,
                                 const char *body, size_t len) {
    return respond(c, s, code, ctype, body, len, NULL);
}

static enum MHD_Result send_json(struct MHD_Connection *c, struct sp_server *s, int code, const struct sp_buf *b) {
    if (b->failed) return MHD_NO;
    return send_body(c, s, code, "application/json", b->data ? b->data : "", b->len);
}

/* {"error": {message, type, param, code}} in OpenAI's shape into b. type is
 * OpenAI's class of error ("invalid_request_error", "server_error"); ecode
 * says which error it is ("invalid_value", "context_length_exceeded",
 * "server_busy", ...); param names the offending request field. A NULL
 * param or ecode is written as null. */
static void error_json(struct sp_buf *b, const char *msg, const char *type, const char *param, const char *ecode) {
    struct sp_jw w;
    sp_jw_init(&w, b, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "error");
    sp_jw_obj(&w);
    sp_jw_key(&w, "message");
    sp_jw_str(&w, msg);
    sp_jw_key(&w, "type");
    sp_jw_str(&w, type);
    sp_jw_key(&w, "param");
    sp_jw_str(&w, param);
    sp_jw_key(&w, "code");
    sp_jw_str(&w, ecode);
    sp_jw_end(&w);
    sp_jw_end(&w);
}

static enum MHD_Result send_error_v(struct MHD_Connection *c, struct sp_server *s, int code, const char *type,
                                    const char *param, const char *ecode, const char *retry_after, const char *fmt,
                                    va_list ap) __attribute__((format(printf, 8, 0)));

static enum MHD_Result send_error(struct MHD_Connection *c, struct sp_server *s, int code, const char *type,
                                  const char *param, const char *ecode, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static enum MHD_Result send_error(struct MHD_Connection *c, struct sp_server *s, int code, const char *type,
                                  const char *param, const char *ecode, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result r = send_error_v(c, s, code, type, param, ecode, NULL, fmt, ap);
    va_end(ap);
    return r;
}

/* 503: the server cannot take the request now; Retry-After says when to
 * ask again, so clients back off instead of hammering a full queue. */
static enum MHD_Result send_unavailable(struct MHD_Connection *c, struct sp_server *s, const char *type,
                                        const char *ecode, const char *retry_after, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static enum MHD_Result send_unavailable(struct MHD_Connection *c, struct sp_server *s, const char *type,
                                        const char *ecode, const char *retry_after, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result r = send_error_v(c, s, 503, type, NULL, ecode, retry_after, fmt, ap);
    va_end(ap);
    return r;
}

static enum MHD_Result send_error_v(struct MHD_Connection *c, struct sp_server *s, int code, const char *type,
                                    const char *param, const char *ecode, const char *retry_after, const char *fmt,
                                    va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    struct sp_buf b = SP_BUF_INIT;
    struct sock *k = conn_sock(c);
    if (k && k->anthropic)
        sp_api_anthropic_error(&b, code, msg);
    else
        error_json(&b, msg, type, param, ecode);
    enum MHD_Result r = b.failed ? MHD_NO : respond(c, s, code, "application/json", b.data, b.len, retry_after);
    sp_buf_free(&b);
    return r;
}

/* 400 invalid_request_error: param names the offending field (or NULL),
 * ecode says what is wrong with it (ERR_* below, or NULL). */
#define BAD_REQUEST(c, s, param, ecode, ...) send_error(c, s, 400, "invalid_request_error", param, ecode, __VA_ARGS__)

/* ---- request parameters ---- */

/* The codes of 400s, as OpenAI names them. */
#define ERR_INVALID_VALUE "invalid_value"           // a field of the right type holds a value it may not
#define ERR_INVALID_TYPE "invalid_type"             // a field of the wrong JSON type
#define ERR_MISSING "missing_required_parameter"    // a required field is absent
#define ERR_UNSUPPORTED "unsupported_value"         // a valid value this server or model does not do
#define ERR_CONTEXT "context_length_exceeded"       // the prompt does not fit the context

/* A parameter problem: the message, the offending field and the error code. */
struct perr {
    char msg[512];
    const char *param;
    const char *code;
};

static bool fail_code_v(struct perr *e, const char *param, const char *code, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
static bool fail_code_v(struct perr *e, const char *param, const char *code, const char *fmt, va_list ap) {
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    e->param = param;
    e->code = code;
    return false;
}

/* Fails with a value the field may not hold (ERR_INVALID_VALUE). */
static bool fail_param(struct perr *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail_param(struct perr *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_code_v(e, param, ERR_INVALID_VALUE, fmt, ap);
    va_end(ap);
    return false;
}

/* Fails with the given error code. */
static bool fail_code(struct perr *e, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool fail_code(struct perr *e, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_code_v(e, param, code, fmt, ap);
    va_end(ap);
    return false;
}

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static bool get_number(const cJSON *o, const char *k, double lo, double hi, double *out, struct perr *e) {
    const cJSON *it = field(o, k);
    if (!it) return true;
    if (!cJSON_IsNumber(it))
        return fail_code(e, k, ERR_INVALID_TYPE, "'%s' must be a number, not %s", k, sp_json_type_name(it));
    if (!(it->valuedouble >= lo && it->valuedouble <= hi))
        return fail_param(e, k, "'%s' must be between %g and %g, got %g", k, lo, hi, it->valuedouble);
    *out = it->valuedouble;
    return true;
}

static bool get_integer(const cJSON *o, const char *k, int64_t lo, int64_t hi, int64_t *out, struct perr *e) {
    const cJSON *it = field(o, k);
    int64_t v;
    if (!it) return true;
    if (!sp_json_is_int(it, &v))
        return fail_code(e, k, cJSON_IsNumber(it) ? ERR_INVALID_VALUE : ERR_INVALID_TYPE, "'%s' must be an integer, not %s",
                         k, sp_json_type_name(it));
    if (v < lo || v > hi) return fail_param(e, k, "'%s' must be between %lld and %lld, got %lld", k, (long long)lo, (long long)hi, (long long)v);
    *out = v;
    return true;
}

static bool get_bool(const cJSON *o, const char *k, bool *out, struct perr *e) {
    const cJSON *it = field(o, k);
    if (!it) return true;
    if (!cJSON_IsBool(it))
        return fail_code(e, k, ERR_INVALID_TYPE, "'%s' must be a boolean, not %s", k, sp_json_type_name(it));
    *out = cJSON_IsTrue(it);
    return true;
}

/* ---- tokenizing ---- */

/* Rendering and tokenizing a prompt near the body limit takes a second and
 * some hundred MB; bounding how many run at once bounds that memory, and
 * the rest wait their turn. */
static void tok_enter(struct sp_server *s) {
    pthread_mutex_lock(&s->tok_mu);
    s->tok_waiting++;
    while (s->tok_active >= s->o.max_tokenizing) pthread_cond_wait(&s->tok_cv, &s->tok_mu);
    s->tok_waiting--;
    s->tok_active++;
    pthread_mutex_unlock(&s->tok_mu);
}

static void tok_leave(struct sp_server *s) {
    pthread_mutex_lock(&s->tok_mu);
    s->tok_active--;
    pthread_cond_signal(&s->tok_cv);
    pthread_mutex_unlock(&s->tok_mu);
}

/* The tokens a prompt may have: the engine needs one position to generate. */
static int64_t prompt_room(struct sp_server *s) { return sp_engine_params(s->engine)->n_ctx - 1; }

/* Appends text's ids to out, stopping once it cannot fit the context. */
static bool encode_prompt(struct sp_server *s, const char *text, size_t len, unsigned flags, struct sp_ids *out,
                          const char *param, struct perr *e) {
    int64_t room = prompt_room(s) - out->n;
    enum sp_status st = sp_tokenizer_encode_max(s->tok, text, len, flags, room > 0 ? room : 0, out);
    if (st == SP_ERR_LIMIT)
        return fail_code(e, param, ERR_CONTEXT, "the prompt has more than %lld tokens; the context holds %lld",
                         (long long)prompt_room(s), (long long)prompt_room(s) + 1);
    if (st != SP_OK) return fail_param(e, param, "%s", sp_error_msg());
    return true;
}

/* One choice of a request (n asks for several): its engine request, and
 * what it has generated so far. */
struct choice {
    struct sp_req *req;
    struct sp_req_progress prog;
    struct sp_buf text;             // collected (not streamed)
    struct sp_tok_list toks;        // token records, for logprobs
    struct sp_chat_parser *parser;  // streamed chat: its output split into content, reasoning and tool calls
    bool sent_role;                 // streamed chat: its first delta (with the role) is out
    size_t text_sent;               // streamed text completions: bytes of text so far (for text_offset)
};

/* A generation in flight: the parsed request, its choices, and the
 * streaming state. */
struct job {
    struct sp_server *srv;
    int key;                         // the API key's index, or KEY_NONE
    char scope[SP_MAX_CACHE_SCOPE];  // the prompt-cache scope (gp.cache_scope)
    bool chat, stream, include_usage, want_logprobs;
    int top_logprobs;
    struct sp_gen_params gp;
    char *stop_store[SP_MAX_STOPS];
    struct sp_ids prompt;
    char id[48];
    int64_t created;
    int n;              // choices asked for (n)
    struct choice *ch;  // (n)
    int fd;
    /* streaming */
    struct sp_buf out;  // SSE bytes not yet handed to MHD
    size_t out_pos;
    bool done;
    bool gone_logged;  // the client's hang-up has been logged
    /* chat: splitting the output into content, reasoning and tool calls */
    struct sp_chat_parse_opts popts;
    cJSON *tools;                   // the request's tools (the parsers borrow them)
    char *forced;                   // tool_choice: the start of the reply written for the model, or NULL
    const char *forced_end;         // and its end, once the constrained arguments are complete
    struct sp_api_out *ao;          // Responses / Anthropic requests: their output (NULL: chat completions)
};

static void job_free(struct job *j) {
    if (!j) return;
    for (int i = 0; j->ch && i < j->n; i++) {
        struct choice *c = &j->ch[i];
        if (c->req) {
            sp_req_cancel(c->req);
            sp_req_release(c->req);
        }
        sp_buf_free(&c->text);
        sp_tok_list_free(&c->toks);
        sp_chat_parser_free(c->parser);
    }
    sp_free(j->ch);
    for (int i = 0; i < SP_MAX_STOPS; i++) sp_free(j->stop_store[i]);
    sp_ids_free(&j->prompt);
    sp_buf_free(&j->out);
    sp_grammar_free(j->gp.grammar);
    cJSON_Delete(j->tools);
    sp_free(j->forced);
    sp_api_out_free(j->ao);
    sp_free(j);
}

static bool parse_stop(const cJSON *body, struct job *j, struct perr *e) {
    const cJSON *st = field(body, "stop");
    if (!st) return true;
    if (cJSON_IsString(st)) {
        if (!*st->valuestring) return true;
        j->stop_store[0] = sp_strdup(st->valuestring, SP_MEM_SERVER);
        j->gp.stops[0] = j->stop_store[0];
        j->gp.n_stops = 1;
        return true;
    }
    if (!cJSON_IsArray(st)) return fail_code(e, "stop", ERR_INVALID_TYPE, "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(st) > SP_MAX_STOPS)
        return fail_param(e, "stop", "'stop' may hold at most %d strings", SP_MAX_STOPS);
    for (const cJSON *x = st->child; x; x = x->next) {
        if (!cJSON_IsString(x)) return fail_code(e, "stop", ERR_INVALID_TYPE, "'stop' must hold only strings");
        if (!*x->valuestring) continue;
        j->stop_store[j->gp.n_stops] = sp_strdup(x->valuestring, SP_MEM_SERVER);
        j->gp.stops[j->gp.n_stops] = j->stop_store[j->gp.n_stops];
        j->gp.n_stops++;
    }
    return true;
}

/* The prompt-cache scope: the API key when keys are in use, within it the
 * request's cache_salt when given (as vLLM takes it), else the salt alone,
 * else the one shared scope. Key scopes and salt scopes cannot meet: "k" and
 * "s" prefixes, the key as its index. */
static bool parse_cache_salt(const cJSON *body, struct job *j, struct perr *e) {
    const cJSON *salt = field(body, "cache_salt");
    if (salt && (!cJSON_IsString(salt) || !*salt->valuestring))
        return fail_param(e, "cache_salt", "'cache_salt' must be a non-empty string");
    if (salt && strlen(salt->valuestring) > MAX_CACHE_SALT)
        return fail_param(e, "cache_salt", "'cache_salt' may be at most %d bytes", MAX_CACHE_SALT);
    const char *sv = salt ? salt->valuestring : NULL;
    if (j->key >= 0)
        snprintf(j->scope, sizeof j->scope, "k%d%s%s", j->key, sv ? "/" : "", sv ? sv : "");
    else if (sv)
        snprintf(j->scope, sizeof j->scope, "s/%s", sv);
    else
        j->scope[0] = 0;
    j->gp.cache_scope = j->scope;
    return true;
}

/* Sampling, length, stop, n, seed, logprobs: shared by both completion routes. */
static bool parse_common(const cJSON *body, struct job *j, struct perr *e) {
    struct sp_server *s = j->srv;
    j->gp.sampling = s->o.defaults;
    j->gp.max_tokens = s->o.default_max_tokens;
    j->gp.top_logprobs = -1;
    j->gp.detok_flags = SP_TOK_SKIP_SPECIAL;
    double x;
    int64_t v;
    x = j->gp.sampling.temp;
    if (!get_number(body, "temperature", 0, 2, &x, e)) return false;
    j->gp.sampling.temp = (float)x;
    x = j->gp.sampling.top_p;
    if (!get_number(body, "top_p", 0, 1, &x, e)) return false;
    j->gp.sampling.top_p = (float)x;
    x = j->gp.sampling.min_p;
    if (!get_number(body, "min_p", 0, 1, &x, e)) return false;
    j->gp.sampling.min_p = (float)x;
    v = j->gp.sampling.top_k;
    if (!get_integer(body, "top_k", 0, 1 << 30, &v, e)) return false;
    j->gp.sampling.top_k = (int32_t)v;
    x = j->gp.sampling.presence_penalty;
    if (!get_number(body, "presence_penalty", -2, 2, &x, e)) return false;
    j->gp.sampling.presence_penalty = (float)x;
    x = j->gp.sampling.frequency_penalty;
    if (!get_number(body, "frequency_penalty", -2, 2, &x, e)) return false;
    j->gp.sampling.frequency_penalty = (float)x;
    x = j->gp.sampling.repeat_penalty;
    if (!get_number(body, "repetition_penalty", 0.01, 100, &x, e)) return false;
    if (!get_number(body, "repeat_penalty", 0.01, 100, &x, e)) return false;
    j->gp.sampling.repeat_penalty = (float)x;
    v = -1;
    if (!get_integer(body, "seed", INT64_MIN / 2, INT64_MAX / 2, &v, e)) return false;
    if (field(body, "seed"))
        j->gp.sampling.seed = (uint64_t)v;
    else
        j->gp.sampling.seed = (uint64_t)time(NULL) ^ atomic_fetch_add(&s->id_counter, 1) * 0x9e3779b97f4a7c15ull;
    v = j->gp.max_tokens;
    if (!get_integer(body, "max_tokens", 1, 1 << 30, &v, e)) return false;
    if (!get_integer(body, "max_completion_tokens", 1, 1 << 30, &v, e)) return false;
    j->gp.max_tokens = v;
    v = 1;
    if (!get_integer(body, "n", INT64_MIN / 2, INT64_MAX / 2, &v, e)) return false;
    /* the choices decode together, one slot each */
    int parallel = sp_engine_params(s->engine)->n_slots;
    if (v < 1 || v > parallel)
        return fail_param(e, "n", "'n' must be between 1 and %d (the server's --parallel), got %lld", parallel,
                          (long long)v);
    j->n = (int)v;
    if (!(j->ch = sp_calloc((size_t)j->n, sizeof *j->ch, SP_MEM_SERVER)))
        return fail_code(e, NULL, "out_of_memory", "out of memory");
    if (!get_bool(body, "stream", &j->stream, e)) return false;
    const cJSON *so = field(body, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return fail_code(e, "stream_options", ERR_INVALID_TYPE, "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &j->include_usage, e)) return false;
    }
    if (!parse_stop(body, j, e)) return false;
    return parse_cache_salt(body, j, e);
}

/* Flattens OpenAI content (a string or a list of text parts) to a string
 * inside a copy of the messages, which templates expect. */
static bool normalise_messages(const cJSON *msgs, cJSON **out, struct perr *e) {
    if (!msgs) return fail_code(e, "messages", ERR_MISSING, "'messages' is required: a non-empty array");
    if (!cJSON_IsArray(msgs)) return fail_code(e, "messages", ERR_INVALID_TYPE, "'messages' must be a non-empty array");
    if (cJSON_GetArraySize(msgs) == 0) return fail_param(e, "messages", "'messages' must be a non-empty array");
    cJSON *copy = cJSON_Duplicate(msgs, true);
    if (!copy) return fail_code(e, "messages", "out_of_memory", "out of memory");
    int i = 0;
    for (cJSON *m = copy->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            cJSON_Delete(copy);
            return fail_code(e, "messages", ERR_INVALID_TYPE, "messages[%d] must be an object with a string 'role'", i);
        }
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (content && cJSON_IsArray(content)) {
            struct sp_buf t = SP_BUF_INIT;
            int k = 0;
            for (const cJSON *p = content->child; p; p = p->next, k++) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
                const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
                    !cJSON_IsString(text)) {
                    sp_buf_free(&t);
                    cJSON_Delete(copy);
                    return fail_code(e, "messages", ERR_UNSUPPORTED, "messages[%d].content[%d]: only {\"type\": \"text\", \"text\": ...} parts are supported", i, k);
                }
                if (t.len) sp_buf_putc(&t, '\n');
                sp_buf_puts(&t, text->valuestring);
            }
            cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(t.data ? t.data : ""));
            sp_buf_free(&t);
        } else if (content && !cJSON_IsString(content) && !cJSON_IsNull(content)) {
            cJSON_Delete(copy);
            return fail_code(e, "messages", ERR_INVALID_TYPE, "messages[%d].content must be a string or an array of text parts", i);
        }
    }
    *out = copy;
    return true;
}

static const char *gen_id(struct sp_server *s, const char *prefix, char *buf, size_t cap) {
    uint64_t x = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + atomic_fetch_add(&s->id_counter, 1);
    struct sp_rng r;
    sp_rng_seed(&r, x);
    snprintf(buf, cap, "%s%016llx%08llx", prefix, (unsigned long long)sp_rng_next(&r),
             (unsigned long long)(sp_rng_next(&r) & 0xffffffffu));
    return buf;
}

/* ---- output ---- */

static void write_usage(struct sp_jw *w, const struct sp_req_progress *p) {
    sp_jw_key(w, "usage");
    sp_jw_obj(w);
    sp_jw_key(w, "prompt_tokens");
    sp_jw_int(w, p->prompt_tokens);
    sp_jw_key(w, "completion_tokens");
    sp_jw_int(w, p->completion_tokens);
    sp_jw_key(w, "total_tokens");
    sp_jw_int(w, p->prompt_tokens + p->completion_tokens);
    sp_jw_key(w, "prompt_tokens_details");
    sp_jw_obj(w);
    sp_jw_key(w, "cached_tokens");
    sp_jw_int(w, p->cached_tokens);
    sp_jw_end(w);
    sp_jw_end(w);
}

static const char *finish_reason(const struct sp_req_progress *p, bool tool_calls) {
    if (p->finish == SP_FINISH_LENGTH) return "length";
    return tool_calls ? "tool_calls" : "stop";
}

static void token_text(const struct sp_tokenizer *tok, int32_t id, struct sp_buf *out) {
    sp_buf_clear(out);
    if (tok) sp_tokenizer_decode(tok, &id, 1, 0, out);
}

/* logprobs of chat responses: {"content": [{token, logprob, bytes, top_logprobs}]} */
static void write_chat_logprobs(struct sp_jw *w, const struct sp_tokenizer *tok, const struct sp_tok_list *l,
                                int64_t from) {
    struct sp_buf t = SP_BUF_INIT;
    sp_jw_key(w, "logprobs");
    sp_jw_obj(w);
    sp_jw_key(w, "content");
    sp_jw_arr(w);
    for (int64_t i = from; i < l->n; i++) {
        const struct sp_tok_info *ti = &l->v[i];
        for (int k = -1; k < ti->n_top; k++) {
            int32_t id = k < 0 ? ti->id : ti->top_id[k];
            float lp = k < 0 ? ti->logprob : ti->top_logprob[k];
            if (k == 0) {
                sp_jw_key(w, "top_logprobs");
                sp_jw_arr(w);
            }
            token_text(tok, id, &t);
            sp_jw_obj(w);
            sp_jw_key(w, "token");
            sp_jw_strn(w, t.data ? t.data : "", t.len);
            sp_jw_key(w, "logprob");
            sp_jw_num(w, lp);
            sp_jw_key(w, "bytes");
            sp_jw_arr(w);
            for (size_t b = 0; b < t.len; b++) sp_jw_int(w, (unsigned char)t.data[b]);
            sp_jw_end(w);
            if (k >= 0) sp_jw_end(w);
        }
        if (ti->n_top > 0) sp_jw_end(w);
        else {
            sp_jw_key(w, "top_logprobs");
            sp_jw_arr(w);
            sp_jw_end(w);
        }
        sp_jw_end(w);
    }
    sp_jw_end(w);
    sp_jw_end(w);
    sp_buf_free(&t);
}

/* logprobs of text completions (the legacy form): {"tokens", "token_logprobs",
 * "top_logprobs": [{token: logprob}], "text_offset"} for tokens [from, n). */
static void write_text_logprobs(struct sp_jw *w, const struct sp_tokenizer *tok, const struct sp_tok_list *l, int64_t from,
                                int64_t offset0) {
    struct sp_buf t = SP_BUF_INIT;
    sp_jw_key(w, "logprobs");
    sp_jw_obj(w);
    sp_jw_key(w, "tokens");
    sp_jw_arr(w);
    for (int64_t i = from; i < l->n; i++) {
        token_text(tok, l->v[i].id, &t);
        sp_jw_strn(w, t.data ? t.data : "", t.len);
    }
    sp_jw_end(w);
    sp_jw_key(w, "token_logprobs");
    sp_jw_arr(w);
    for (int64_t i = from; i < l->n; i++) sp_jw_num(w, l->v[i].logprob);
    sp_jw_end(w);
    sp_jw_key(w, "top_logprobs");
    sp_jw_arr(w);
    for (int64_t i = from; i < l->n; i++) {
        sp_jw_obj(w);
        for (int k = 0; k < l->v[i].n_top; k++) {
            token_text(tok, l->v[i].top_id[k], &t);
            sp_jw_key(w, t.data ? t.data : "");
            sp_jw_num(w, l->v[i].top_logprob[k]);
        }
        sp_jw_end(w);
    }
    sp_jw_end(w);
    sp_jw_key(w, "text_offset");
    sp_jw_arr(w);
    int64_t off = offset0;
    for (int64_t i = from; i < l->n; i++) {
        sp_jw_int(w, off);
        token_text(tok, l->v[i].id, &t);
        off += (int64_t)t.len;
    }
    sp_jw_end(w);
    sp_jw_end(w);
    sp_buf_free(&t);
}

static void chunk_begin(struct job *j, struct sp_jw *w) {
    sp_jw_obj(w);
    sp_jw_key(w, "id");
    sp_jw_str(w, j->id);
    sp_jw_key(w, "object");
    sp_jw_str(w, j->chat ? "chat.completion.chunk" : "text_completion");
    sp_jw_key(w, "created");
    sp_jw_int(w, j->created);
    sp_jw_key(w, "model");
    sp_jw_str(w, j->srv->o.model_id);
    sp_jw_key(w, "system_fingerprint");
    sp_jw_str(w, "sparrow");
}

/* One SSE chunk of choice ci. Chat: a delta of `kind` (content,
 * reasoning_content, a tool call's start or arguments) or, with kind < 0,
 * an empty delta; text completions: the text. Carries the finish reason
 * when given and the logprobs of the choice's tokens [tok_from, n) when
 * asked for. */
static void sse_chunk(struct job *j, int ci, int kind, const char *text, size_t len, int tool_index,
                      const char *tool_id, const char *finish, int64_t tok_from) {
    struct choice *c = &j->ch[ci];
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &b, 0);
    chunk_begin(j, &w);
    sp_jw_key(&w, "choices");
    sp_jw_arr(&w);
    sp_jw_obj(&w);
    sp_jw_key(&w, "index");
    sp_jw_int(&w, ci);
    if (j->chat) {
        sp_jw_key(&w, "delta");
        sp_jw_obj(&w);
        if (!c->sent_role) {
            sp_jw_key(&w, "role");
            sp_jw_str(&w, "assistant");
            c->sent_role = true;
        }
        if (kind == SP_CHAT_EV_CONTENT || kind == SP_CHAT_EV_REASONING) {
            sp_jw_key(&w, kind == SP_CHAT_EV_CONTENT ? "content" : "reasoning_content");
            sp_jw_strn(&w, text, len);
        } else if (kind == SP_CHAT_EV_TOOL_BEGIN || kind == SP_CHAT_EV_TOOL_ARGS) {
            sp_jw_key(&w, "tool_calls");
            sp_jw_arr(&w);
            sp_jw_obj(&w);
            sp_jw_key(&w, "index");
            sp_jw_int(&w, tool_index);
            if (kind == SP_CHAT_EV_TOOL_BEGIN) {
                sp_jw_key(&w, "id");
                sp_jw_str(&w, tool_id);
                sp_jw_key(&w, "type");
                sp_jw_str(&w, "function");
            }
            sp_jw_key(&w, "function");
            sp_jw_obj(&w);
            if (kind == SP_CHAT_EV_TOOL_BEGIN) {
                sp_jw_key(&w, "name");
                sp_jw_strn(&w, text, len);
                sp_jw_key(&w, "arguments");
                sp_jw_str(&w, "");
            } else {
                sp_jw_key(&w, "arguments");
                sp_jw_strn(&w, text, len);
            }
            sp_jw_end(&w);
            sp_jw_end(&w);
            sp_jw_end(&w);
        }
        sp_jw_end(&w);
        if (j->want_logprobs && tok_from < c->toks.n) write_chat_logprobs(&w, j->srv->tok, &c->toks, tok_from);
        else {
            sp_jw_key(&w, "logprobs");
            sp_jw_null(&w);
        }
    } else {
        sp_jw_key(&w, "text");
        sp_jw_strn(&w, text, len);
        if (j->want_logprobs && tok_from < c->toks.n) {
            write_text_logprobs(&w, j->srv->tok, &c->toks, tok_from, (int64_t)c->text_sent);
        } else {
            sp_jw_key(&w, "logprobs");
            sp_jw_null(&w);
        }
        c->text_sent += len;
    }
    sp_jw_key(&w, "finish_reason");
    sp_jw_str(&w, finish);
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_buf_puts(&j->out, "data: ");
    sp_buf_append(&j->out, b.data, b.len);
    sp_buf_puts(&j->out, "\n\n");
    sp_buf_free(&b);
}

/* Streams a piece of choice ci's text: through its chat parser as its
 * events, or as is. Token logprobs ride on the first chunk written (or an
 * empty one). */
static void sse_text(struct job *j, int ci, const char *text, size_t len, int64_t tok_from) {
    struct choice *c = &j->ch[ci];
    bool wrote = false;
    if (j->ao) {  // Responses / Anthropic: one choice
        size_t n;
        if (len && sp_chat_parser_push(c->parser, text, len) == SP_OK) {
            const struct sp_chat_event *ev = sp_chat_parser_events(c->parser, &n);
            sp_api_out_events(j->ao, ev, n, &j->out);
        }
        return;
    }
    if (j->chat && c->parser) {
        size_t n = 0;
        /* events belong to the last push: read them only after one */
        if (len && sp_chat_parser_push(c->parser, text, len) == SP_OK) {
            const struct sp_chat_event *ev = sp_chat_parser_events(c->parser, &n);
            for (size_t i = 0; i < n; i++) {
                sse_chunk(j, ci, (int)ev[i].kind, ev[i].text, ev[i].len, ev[i].tool_index, ev[i].id, NULL,
                          wrote ? c->toks.n : tok_from);
                wrote = true;
            }
        }
    } else if (len) {
        sse_chunk(j, ci, SP_CHAT_EV_CONTENT, text, len, 0, NULL, NULL, tok_from);
        wrote = true;
    }
    if (!wrote && j->want_logprobs && tok_from < c->toks.n) sse_chunk(j, ci, -1, "", 0, 0, NULL, NULL, tok_from);
}

/* The last chunks of a choice that finished: the forced call's end, what
 * its parser still holds, and the chunk with its finish reason. */
static void sse_choice_end(struct job *j, int ci) {
    struct choice *c = &j->ch[ci];
    bool calls = false;
    if (j->forced_end && c->prog.finish == SP_FINISH_STOP) sse_text(j, ci, j->forced_end, strlen(j->forced_end), c->toks.n);
    if (c->parser) {
        sp_chat_parser_finish(c->parser);
        size_t n;
        const struct sp_chat_event *ev = sp_chat_parser_events(c->parser, &n);
        if (j->ao)
            sp_api_out_events(j->ao, ev, n, &j->out);
        else
            for (size_t i = 0; i < n; i++)
                sse_chunk(j, ci, (int)ev[i].kind, ev[i].text, ev[i].len, ev[i].tool_index, ev[i].id, NULL, c->toks.n);
        calls = sp_chat_parser_tool_calls(c->parser) > 0;
    }
    if (j->ao)
        sp_api_out_end(j->ao, &c->prog, &j->out);
    else
        sse_chunk(j, ci, -1, "", 0, 0, NULL, finish_reason(&c->prog, calls), c->toks.n);
}

/* An error event in OpenAI's error shape (code NULL: null). */
static void sse_error(struct job *j, const char *type, const char *code, const char *msg) {
    if (j->ao) {
        sp_api_out_fail(j->ao, code, msg, &j->ch[0].prog, &j->out);
        return;
    }
    struct sp_buf b = SP_BUF_INIT;
    error_json(&b, msg, type, NULL, code);
    sp_buf_puts(&j->out, "data: ");
    sp_buf_append(&j->out, b.data, b.len);
    sp_buf_puts(&j->out, "\n\n");
    sp_buf_free(&b);
}

/* The request's usage over its choices: the prompt once (it is prefilled
 * once), the completion tokens of every choice. */
static struct sp_req_progress usage_of(const struct job *j) {
    struct sp_req_progress u = j->ch[0].prog;
    u.completion_tokens = 0;
    for (int i = 0; i < j->n; i++) u.completion_tokens += j->ch[i].prog.completion_tokens;
    return u;
}

static void sse_usage_and_done(struct job *j) {
    if (j->ao) return;  // their streams end with their own last event
    if (j->include_usage) {
        struct sp_buf b = SP_BUF_INIT;
        struct sp_jw w;
        sp_jw_init(&w, &b, 0);
        chunk_begin(j, &w);
        sp_jw_key(&w, "choices");
        sp_jw_arr(&w);
        sp_jw_end(&w);
        struct sp_req_progress u = usage_of(j);
        write_usage(&w, &u);
        sp_jw_end(&w);
        sp_buf_puts(&j->out, "data: ");
        sp_buf_append(&j->out, b.data, b.len);
        sp_buf_puts(&j->out, "\n\n");
        sp_buf_free(&b);
    }
    sp_buf_puts(&j->out, "data: [DONE]\n\n");
}

/* The code of a generation that failed: the model's files changed under the
 * engine (which then fails every request), or the forward pass failed. */
static const char *gen_fail_code(struct sp_server *s) {
    return sp_engine_failed(s->engine, NULL, 0) ? "model_files_changed" : "generation_failed";
}

static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void log_done(struct job *j) {
    struct sp_req_progress p = usage_of(j);
    double decode_s = 0;
    for (int i = 0; i < j->n; i++)
        if (j->ch[i].prog.decode_s > decode_s) decode_s = j->ch[i].prog.decode_s;
    char n[24] = "";
    if (j->n > 1) snprintf(n, sizeof n, " | n %d", j->n);
    sp_log(SP_LOG_INFO,
           "srv  %s | prompt %lld tokens (%lld cached), prefill %.1f tok/s | decode %lld tokens, %.1f tok/s | "
           "ttft %.3f s | finish %s%s | mem %.1f MiB",
           j->id, (long long)p.prompt_tokens, (long long)p.cached_tokens,
           p.prefill_s > 0 ? (double)(p.prompt_tokens - p.cached_tokens) / p.prefill_s : 0.0,
           (long long)p.completion_tokens,
           decode_s > 0 && p.completion_tokens > j->n ? (double)(p.completion_tokens - j->n) / decode_s : 0.0,
           p.ttft_s, p.finish == SP_FINISH_CANCELLED ? "cancelled" : finish_reason(&p, false), n,
           (double)sp_mem_used_total() / 1048576.0);
}

static void cancel_all(struct job *j) {
    for (int i = 0; i < j->n; i++)
        if (j->ch[i].req) sp_req_cancel(j->ch[i].req);
}

/* A client that hung up before its response was complete: the generation is
 * cancelled, and that is logged once, whichever path noticed it first (the
 * poll of the socket, or the connection ending under a stream). */
static void client_went_away(struct job *j) {
    cancel_all(j);
    if (j->gone_logged) return;
    j->gone_logged = true;
    sp_log(SP_LOG_INFO, "srv  %s | client went away after %lld tokens; generation cancelled", j->id,
           (long long)usage_of(j).completion_tokens);
}

/* Takes what every choice still generating has produced: waits up to
 * wait_ms on the first of them (the choices decode in the same steps, so
 * their tokens come together), then takes the others' without waiting.
 * Streamed, the new text goes out as chunks and a choice that finished gets
 * its last chunk; collected, it is appended to the choice's text. Returns
 * the choice that failed, or -1. */
static int poll_choices(struct job *j, int wait_ms) {
    int failed = -1;
    bool waited = false;
    for (int i = 0; i < j->n; i++) {
        struct choice *c = &j->ch[i];
        if (c->prog.finished) continue;
        struct sp_buf text = SP_BUF_INIT;
        int64_t tok_from = c->toks.n;
        sp_req_poll(c->req, waited ? 0 : wait_ms, j->stream ? &text : &c->text, j->want_logprobs ? &c->toks : NULL,
                    &c->prog);
        waited = true;
        if (j->stream) sse_text(j, i, text.data ? text.data : "", text.len, tok_from);
        sp_buf_free(&text);
        if (c->prog.finished && c->prog.finish == SP_FINISH_ERROR && failed < 0) failed = i;
        else if (c->prog.finished && j->stream) sse_choice_end(j, i);
    }
    return failed;
}

static bool all_finished(const struct job *j) {
    for (int i = 0; i < j->n; i++)
        if (!j->ch[i].prog.finished) return false;
    return true;
}

/* MHD pulls the SSE stream through here; waits for the next tokens. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    struct job *j = cls;
    while (j->out_pos == j->out.len) {
        sp_buf_clear(&j->out);
        j->out_pos = 0;
        if (j->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (client_gone(j->fd)) {
            client_went_away(j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        /* stopping: take what is already generated, then end the stream */
        bool stopping = atomic_load(&j->srv->stopping);
        int failed = poll_choices(j, stopping ? 0 : POLL_MS);
        if (failed >= 0) {
            cancel_all(j);
            const struct sp_req_progress *p = &j->ch[failed].prog;
            char msg[320];
            snprintf(msg, sizeof msg, "generation failed: %s", p->error[0] ? p->error : "internal error");
            sse_error(j, "server_error", gen_fail_code(j->srv), msg);
            sse_usage_and_done(j);
            j->done = true;
            log_done(j);
        } else if (!all_finished(j) && stopping) {
            cancel_all(j);
            char msg[160];
            long long done = (long long)usage_of(j).completion_tokens;
            snprintf(msg, sizeof msg, "the server is shutting down: the generation was stopped after %lld tokens", done);
            sse_error(j, "server_error", "server_shutdown", msg);
            sse_usage_and_done(j);
            j->done = true;
            sp_log(SP_LOG_INFO, "srv  %s | stopped by the shutdown after %lld tokens", j->id, done);
        } else if (all_finished(j)) {
            sse_usage_and_done(j);
            j->done = true;
            log_done(j);
        }
    }
    size_t n = j->out.len - j->out_pos < max ? j->out.len - j->out_pos : max;
    memcpy(buf, j->out.data + j->out_pos, n);
    j->out_pos += n;
    return (ssize_t)n;
}

/* The whole body of a Responses or Anthropic request. */
static enum MHD_Result send_api_body(struct MHD_Connection *c, struct job *j) {
    struct choice *ch = &j->ch[0];  // these APIs ask for one choice
    if (j->forced_end && ch->prog.finish == SP_FINISH_STOP) sp_buf_puts(&ch->text, j->forced_end);
    if (sp_api_out_parse(j->ao, &j->popts, ch->text.data ? ch->text.data : "", ch->text.len) != SP_OK)
        return send_error(c, j->srv, 500, "server_error", NULL, NULL, "out of memory");
    struct sp_buf b = SP_BUF_INIT;
    sp_api_out_body(j->ao, &ch->prog, &b);
    enum MHD_Result r = send_json(c, j->srv, 200, &b);
    sp_buf_free(&b);
    return r;
}

/* One choice of a non-streamed response, into the open choices array. */
static void write_choice(struct job *j, int ci, struct sp_jw *w) {
    struct sp_server *s = j->srv;
    struct choice *c = &j->ch[ci];
    if (j->forced_end && c->prog.finish == SP_FINISH_STOP) sp_buf_puts(&c->text, j->forced_end);
    sp_jw_obj(w);
    sp_jw_key(w, "index");
    sp_jw_int(w, ci);
    bool calls = false;
    if (j->chat) {
        struct sp_chat_result pr;
        memset(&pr, 0, sizeof pr);
        struct sp_chat_parse_opts po = j->popts;
        po.id_seed ^= (uint64_t)ci * 0x9e3779b97f4a7c15ull;  // tool call ids differ between choices
        sp_chat_parse(&po, c->text.data ? c->text.data : "", c->text.len, &pr);
        calls = pr.n_tool_calls > 0;
        sp_jw_key(w, "message");
        sp_jw_obj(w);
        sp_jw_key(w, "role");
        sp_jw_str(w, "assistant");
        sp_jw_key(w, "content");
        if (pr.content.data || !calls)
            sp_jw_strn(w, pr.content.data ? pr.content.data : "", pr.content.len);
        else
            sp_jw_null(w);
        if (pr.reasoning.data) {
            sp_jw_key(w, "reasoning_content");
            sp_jw_strn(w, pr.reasoning.data, pr.reasoning.len);
        }
        if (calls) {
            sp_jw_key(w, "tool_calls");
            sp_jw_arr(w);
            for (size_t i = 0; i < pr.n_tool_calls; i++) {
                sp_jw_obj(w);
                sp_jw_key(w, "id");
                sp_jw_str(w, pr.tool_calls[i].id);
                sp_jw_key(w, "type");
                sp_jw_str(w, "function");
                sp_jw_key(w, "function");
                sp_jw_obj(w);
                sp_jw_key(w, "name");
                sp_jw_str(w, pr.tool_calls[i].name ? pr.tool_calls[i].name : "");
                sp_jw_key(w, "arguments");
                sp_jw_strn(w, pr.tool_calls[i].arguments.data ? pr.tool_calls[i].arguments.data : "{}",
                           pr.tool_calls[i].arguments.data ? pr.tool_calls[i].arguments.len : 2);
                sp_jw_end(w);
                sp_jw_end(w);
            }
            sp_jw_end(w);
        }
        sp_jw_end(w);
        sp_chat_result_free(&pr);
        if (j->want_logprobs) write_chat_logprobs(w, s->tok, &c->toks, 0);
        else {
            sp_jw_key(w, "logprobs");
            sp_jw_null(w);
        }
    } else {
        sp_jw_key(w, "text");
        sp_jw_strn(w, c->text.data ? c->text.data : "", c->text.len);
        if (j->want_logprobs) {
            write_text_logprobs(w, s->tok, &c->toks, 0, 0);
        } else {
            sp_jw_key(w, "logprobs");
            sp_jw_null(w);
        }
    }
    sp_jw_key(w, "finish_reason");
    sp_jw_str(w, finish_reason(&c->prog, calls));
    sp_jw_end(w);
}

/* The whole response of a non-streaming request. */
static enum MHD_Result finish_blocking(struct MHD_Connection *c, struct job *j) {
    struct sp_server *s = j->srv;
    int failed = -1;
    for (;;) {
        bool stopping = atomic_load(&s->stopping);
        failed = poll_choices(j, stopping ? 0 : POLL_MS);
        if (failed >= 0 || all_finished(j)) break;
        if (stopping) {
            cancel_all(j);
            long long done = (long long)usage_of(j).completion_tokens;
            sp_log(SP_LOG_INFO, "srv  %s | stopped by the shutdown after %lld tokens", j->id, done);
            return send_unavailable(c, s, "server_error", "server_shutdown", NULL,
                                    "the server is shutting down: the generation was stopped after %lld tokens", done);
        }
        if (client_gone(j->fd)) {
            client_went_away(j);
            return MHD_NO;
        }
    }
    if (failed >= 0) cancel_all(j);
    log_done(j);
    if (failed >= 0)
        return send_error(c, s, 500, "server_error", NULL, gen_fail_code(s), "generation failed: %s",
                          j->ch[failed].prog.error);
    if (j->ao) return send_api_body(c, j);
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &b, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "id");
    sp_jw_str(&w, j->id);
    sp_jw_key(&w, "object");
    sp_jw_str(&w, j->chat ? "chat.completion" : "text_completion");
    sp_jw_key(&w, "created");
    sp_jw_int(&w, j->created);
    sp_jw_key(&w, "model");
    sp_jw_str(&w, s->o.model_id);
    sp_jw_key(&w, "system_fingerprint");
    sp_jw_str(&w, "sparrow");
    sp_jw_key(&w, "choices");
    sp_jw_arr(&w);
    for (int i = 0; i < j->n; i++) write_choice(j, i, &w);
    sp_jw_end(&w);
    struct sp_req_progress u = usage_of(j);
    write_usage(&w, &u);
    sp_jw_end(&w);
    enum MHD_Result r = send_json(c, s, 200, &b);
    sp_buf_free(&b);
    return r;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The seed of choice i: the request's own for the first (n = 1 and the
 * first of n give the same text), one derived from it for the others, so
 * that a seeded request is reproducible and its choices differ. */
static uint64_t choice_seed(uint64_t seed, int i) {
    if (i == 0) return seed;
    uint64_t x = seed ^ ((uint64_t)i << 32);
    return sp_splitmix64(&x);
}

/* Submits the job's choices (a group sharing the prompt's prefill) and
 * answers: SSE stream or one JSON body. */
static enum MHD_Result run_job(struct MHD_Connection *c, struct conn *cn, struct job *j) {
    struct sp_server *s = j->srv;
    struct sp_gen_params *gps = sp_malloc((size_t)j->n * sizeof *gps, SP_MEM_SERVER);
    struct sp_req **reqs = sp_calloc((size_t)j->n, sizeof *reqs, SP_MEM_SERVER);
    enum sp_status st = gps && reqs ? SP_OK : sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int i = 0; st == SP_OK && i < j->n; i++) {
        gps[i] = j->gp;
        gps[i].sampling.seed = choice_seed(j->gp.sampling.seed, i);
        if (i) sp_grammar_ref(gps[i].grammar);  // a reference a choice
    }
    if (st == SP_OK) {
        st = sp_engine_submit_group(s->engine, j->prompt.v, j->prompt.n, gps, j->n, reqs);
        j->gp.grammar = NULL;  // the engine took it, whatever the status
    }
    for (int i = 0; st == SP_OK && i < j->n; i++) j->ch[i].req = reqs[i];
    sp_free(gps);
    sp_free(reqs);
    if (st == SP_ERR_LIMIT)
        return send_unavailable(c, s, "server_error", "server_busy", RETRY_BUSY_S, "%s", sp_error_msg());
    if (st == SP_ERR_STATE) return send_unavailable(c, s, "server_error", "model_files_changed", NULL, "%s", sp_error_msg());
    if (st == SP_ERR_NOMEM) return send_error(c, s, 500, "server_error", NULL, "out_of_memory", "%s", sp_error_msg());
    if (st != SP_OK)
        return BAD_REQUEST(c, s, j->chat ? "messages" : "prompt", j->prompt.n > prompt_room(s) ? ERR_CONTEXT : ERR_INVALID_VALUE,
                           "%s", sp_error_msg());
    cn->counted = true;
    atomic_fetch_add(&s->in_flight, 1);
    j->fd = conn_fd(c);
    j->created = (int64_t)time(NULL);
    if (!j->stream) return finish_blocking(c, j);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j, NULL);
    if (!r) return MHD_NO;
    add_common_headers(s, r, "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    cn->job = j;  // freed when the connection completes
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count_status(s, 200);
    return ret;
}

static struct job *job_new(struct sp_server *s, bool chat, int key) {
    struct job *j = sp_calloc(1, sizeof *j, SP_MEM_SERVER);
    if (!j) return NULL;
    j->srv = s;
    j->chat = chat;
    j->key = key;
    j->fd = -1;
    gen_id(s, chat ? "chatcmpl-" : "cmpl-", j->id, sizeof j->id);
    return j;
}

/* A Responses or Anthropic request translated into a chat body: the API
 * that answers, its own body (what the answer echoes), and whether only
 * the prompt's tokens are counted (count_tokens). */
struct api_req {
    enum sp_api api;
    const cJSON *body;
    bool count_only;
};

/* The output writer of an API request, and the events that open its
 * stream; false when out of memory. */
static bool api_start(struct job *j, const struct api_req *api) {
    struct sp_api_out_info oi = {.api = api->api, .request = api->body, .id = j->id, .model = j->srv->o.model_id,
                                 .created = (int64_t)time(NULL), .prompt_tokens = j->prompt.n, .tok = j->srv->tok};
    if (sp_api_out_new(&oi, &j->ao) != SP_OK) return false;
    if (j->stream) sp_api_out_begin(j->ao, &j->out);
    return !j->out.failed;
}

/* Chat completions; api: a Responses or Anthropic request translated into
 * a chat body (NULL for /v1/chat/completions). */
static enum MHD_Result handle_chat(struct MHD_Connection *c, struct conn *cn, const cJSON *body,
                                   const struct api_req *api) {
    struct sp_server *s = cn->srv;
    struct perr e = {{0}, NULL, NULL};
    struct job *j = job_new(s, true, cn->key);
    if (!j) return MHD_NO;
    if (api) gen_id(s, sp_api_id_prefix(api->api), j->id, sizeof j->id);
    cJSON *msgs = NULL, *kwargs = NULL;
    char *prompt = NULL;
    enum MHD_Result ret;
    if (!parse_common(body, j, &e) || !get_bool(body, "logprobs", &j->want_logprobs, &e)) goto bad;
    int64_t tl = 0;
    if (!get_integer(body, "top_logprobs", 0, SP_MAX_TOP_LOGPROBS, &tl, &e)) goto bad;
    if (j->want_logprobs) j->gp.top_logprobs = (int)tl;
    j->top_logprobs = (int)tl;
    if (!normalise_messages(field(body, "messages"), &msgs, &e)) goto bad;
    const cJSON *tools = field(body, "tools");
    if (tools && !cJSON_IsArray(tools)) {
        fail_code(&e, "tools", ERR_INVALID_TYPE, "'tools' must be an array");
        goto bad;
    }
    const cJSON *tc = field(body, "tool_choice");
    bool force_call = false;
    const char *force_name = NULL;
    if (tc) {
        const cJSON *fn = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "function") : NULL;
        const cJSON *nm = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
        bool ok = (cJSON_IsString(tc) && (!strcmp(tc->valuestring, "auto") || !strcmp(tc->valuestring, "none") ||
                                          !strcmp(tc->valuestring, "required"))) ||
                  (cJSON_IsObject(tc) && cJSON_IsString(nm) && *nm->valuestring);
        if (!ok) {
            fail_param(&e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            goto bad;
        }
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) tools = NULL;
        force_call = cJSON_IsObject(tc) || !strcmp(tc->valuestring, "required");
        if (nm) force_name = nm->valuestring;
        if (force_call && !tools) {
            fail_param(&e, "tool_choice", "'tool_choice' asks for a tool call but the request has no 'tools'");
            goto bad;
        }
        /* "required" with a single tool can only call that one: naming it
         * constrains its arguments to JSON as well */
        if (force_call && !force_name && cJSON_GetArraySize(tools) == 1) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(tools->child, "function");
            const cJSON *n = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
            if (cJSON_IsString(n) && *n->valuestring) force_name = n->valuestring;
        }
        bool known = !force_name;
        for (const cJSON *t = tools ? tools->child : NULL; t && !known; t = t->next) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *n = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
            known = cJSON_IsString(n) && !strcmp(n->valuestring, force_name);
        }
        if (!known) {
            fail_param(&e, "tool_choice", "'tool_choice' names the function \"%s\", which is not in 'tools'", force_name);
            goto bad;
        }
    }
    const cJSON *rf = field(body, "response_format");
    char why[320];
    if (rf && !sp_response_format_grammar(rf, &j->gp.grammar, why, sizeof why)) {
        fail_param(&e, "response_format", "%s", why);
        goto bad;
    }
    const cJSON *ck = field(body, "chat_template_kwargs");
    if (ck && !cJSON_IsObject(ck)) {
        fail_code(&e, "chat_template_kwargs", ERR_INVALID_TYPE, "'chat_template_kwargs' must be an object");
        goto bad;
    }
    kwargs = ck ? cJSON_Duplicate(ck, true) : cJSON_CreateObject();
    const cJSON *effort = field(body, "reasoning_effort");
    if (effort) {
        if (!cJSON_IsString(effort)) {
            fail_code(&e, "reasoning_effort", ERR_INVALID_TYPE, "'reasoning_effort' must be a string");
            goto bad;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(kwargs, "reasoning_effort");
        cJSON_AddStringToObject(kwargs, "reasoning_effort", effort->valuestring);
    }
    if (!s->ct) {
        ret = BAD_REQUEST(c, s, "messages", ERR_UNSUPPORTED, "this model has no chat template; use /v1/completions");
        goto out;
    }
    struct sp_chat_request creq = {.messages = msgs, .tools = tools, .add_generation_prompt = true, .kwargs = kwargs,
                                   .parse_tool_arguments = true, .null_content_as_empty = true,
                                   .flatten_content_parts = true};
    size_t plen;
    tok_enter(s);
    bool rendered = sp_chat_render(s->ct, &creq, &prompt, &plen) == SP_OK;
    if (!rendered) fail_param(&e, "messages", "chat template: %s", sp_error_msg());
    bool encoded = rendered && encode_prompt(s, prompt, plen, SP_TOK_PARSE_SPECIAL, &j->prompt, "messages", &e);
    tok_leave(s);
    if (!encoded) goto bad;
    /* How to split the output: the template says which format the model writes. */
    j->popts.format = sp_chat_format_detect(s->ct->source, s->info.architecture);
    j->popts.in_reasoning = sp_chat_prompt_in_reasoning(j->popts.format, prompt, plen);
    j->popts.id_seed = j->gp.sampling.seed ^ atomic_fetch_add(&s->id_counter, 1);
    if (tools) j->popts.tools = j->tools = cJSON_Duplicate(tools, true);
    /* harmony's channels and DeepSeek's tool-call markers are special tokens:
     * keep them in the text for the parser (it never passes them on) */
    if (j->popts.format == SP_CHAT_FORMAT_HARMONY || j->popts.format == SP_CHAT_FORMAT_DEEPSEEK_V3) j->gp.detok_flags = 0;
    if (force_call) {
        /* tool_choice required / named: the reply starts as the model's own
         * format starts a call; the model then writes a declared function's
         * name (unless named) and arguments held to its schema, and the
         * format's closing text ends the call */
        struct sp_buf pre = SP_BUF_INIT;
        if (j->popts.in_reasoning) sp_buf_puts(&pre, "</think>\n\n");
        switch (j->popts.format) {
        case SP_CHAT_FORMAT_HERMES:
            if (force_name)
                sp_buf_printf(&pre, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", force_name);
            else
                sp_buf_puts(&pre, "<tool_call>\n{\"name\": \"");
            j->forced_end = "}\n</tool_call>";
            break;
        case SP_CHAT_FORMAT_QWEN3_CODER:
            if (force_name)
                sp_buf_printf(&pre, "<tool_call>\n<function=%s>\n", force_name);
            else
                sp_buf_puts(&pre, "<tool_call>\n<function=");
            j->forced_end = "</function>\n</tool_call>";
            break;
        case SP_CHAT_FORMAT_HARMONY:
            if (force_name)
                sp_buf_printf(&pre, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", force_name);
            else
                sp_buf_puts(&pre, "<|channel|>commentary to=functions.");
            j->forced_end = "<|call|>";
            break;
        default:
            sp_buf_free(&pre);
            ret = BAD_REQUEST(c, s, "tool_choice", ERR_UNSUPPORTED, "this model's chat format (%s) has no way to force a tool call",
                              sp_chat_format_name(j->popts.format));
            goto out;
        }
        sp_grammar_free(j->gp.grammar);  // the call's form replaces any response_format
        j->gp.grammar = NULL;
        if (!sp_tool_call_grammar(j->popts.format, tools, force_name, &j->gp.grammar, why, sizeof why)) {
            sp_buf_free(&pre);
            ret = BAD_REQUEST(c, s, "tools", "%s", why);
            goto out;
        }
        if (pre.failed || sp_tokenizer_encode(s->tok, pre.data, pre.len, SP_TOK_PARSE_SPECIAL, &j->prompt) != SP_OK) {
            sp_buf_free(&pre);
            ret = send_error(c, s, 500, "server_error", NULL, "internal_error", "could not encode the forced tool call");
            goto out;
        }
        j->forced = sp_buf_take(&pre);
    }
    if (api && api->count_only) {
        struct sp_buf b = SP_BUF_INIT;
        sp_api_anthropic_count(&b, j->prompt.n);
        ret = send_json(c, s, 200, &b);
        sp_buf_free(&b);
        goto out;
    }
    for (int i = 0; j->stream && i < j->n; i++) {
        struct sp_chat_parse_opts po = j->popts;
        po.id_seed ^= (uint64_t)i * 0x9e3779b97f4a7c15ull;  // tool call ids differ between choices
        if (sp_chat_parser_new(&po, &j->ch[i].parser) != SP_OK) {
            ret = send_error(c, s, 500, "server_error", NULL, "out_of_memory", "out of memory");
            goto out;
        }
    }
    if (api && !api_start(j, api)) {
        ret = send_error(c, s, 500, "server_error", NULL, "out_of_memory", "out of memory");
        goto out;
    }
    /* the forced start is part of each choice's reply the parser reads */
    for (int i = 0; j->forced && i < j->n; i++) {
        if (j->stream)
            sse_text(j, i, j->forced, strlen(j->forced), 0);  // its deltas (a call's name) go out first
        else
            sp_buf_puts(&j->ch[i].text, j->forced);
    }
    cJSON_Delete(msgs);
    cJSON_Delete(kwargs);
    sp_free(prompt);
    ret = run_job(c, cn, j);
    if (cn->job != j) job_free(j);
    return ret;
bad:
    ret = BAD_REQUEST(c, s, api ? sp_api_param(api->api, e.param) : e.param, e.code, "%s", e.msg);
out:
    cJSON_Delete(msgs);
    cJSON_Delete(kwargs);
    sp_free(prompt);
    job_free(j);
    return ret;
}

/* POST /v1/responses, /v1/messages and /v1/messages/count_tokens: the
 * request as a chat body, answered by the chat path in the API's shape. */
static enum MHD_Result handle_api(struct MHD_Connection *c, struct conn *cn, const cJSON *body, const char *url) {
    struct sp_server *s = cn->srv;
    struct api_req a = {.api = !strcmp(url, "/v1/responses") ? SP_API_RESPONSES : SP_API_ANTHROPIC, .body = body,
                        .count_only = !strcmp(url, "/v1/messages/count_tokens")};
    const char *tsrc = s->ct ? s->ct->source : NULL;
    struct sp_api_err e;
    cJSON *chat;
    bool ok = a.api == SP_API_RESPONSES ? sp_api_responses_to_chat(body, tsrc, &chat, &e)
                                        : sp_api_anthropic_to_chat(body, tsrc, a.count_only, &chat, &e);
    if (!ok) return BAD_REQUEST(c, s, e.param[0] ? e.param : NULL, "%s", e.msg);
    enum MHD_Result r = handle_chat(c, cn, chat, &a);
    cJSON_Delete(chat);
    return r;
}

static enum MHD_Result handle_completion(struct MHD_Connection *c, struct conn *cn, const cJSON *body) {
    struct sp_server *s = cn->srv;
    struct perr e = {{0}, NULL, NULL};
    struct job *j = job_new(s, false, cn->key);
    if (!j) return MHD_NO;
    enum MHD_Result ret;
    if (!parse_common(body, j, &e)) goto bad;
    int64_t lp = -1;
    if (!get_integer(body, "logprobs", 0, SP_MAX_TOP_LOGPROBS, &lp, &e)) goto bad;
    if (lp >= 0) {
        j->want_logprobs = true;
        j->gp.top_logprobs = (int)lp;
    }
    const cJSON *p = field(body, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
        if (!s->tok) {
            fail_code(&e, "prompt", ERR_UNSUPPORTED, "this model has no tokenizer: give the prompt as token ids");
            goto bad;
        }
        tok_enter(s);
        bool encoded = encode_prompt(s, p->valuestring, strlen(p->valuestring), SP_TOK_PARSE_SPECIAL | SP_TOK_ADD_SPECIAL,
                                     &j->prompt, "prompt", &e);
        tok_leave(s);
        if (!encoded) goto bad;
    } else if (cJSON_IsArray(p)) {
        for (const cJSON *x = p->child; x; x = x->next) {
            int64_t v;
            if (!sp_json_is_int(x, &v) || v < 0 || v > INT32_MAX) {
                fail_code(&e, "prompt", sp_json_is_int(x, &v) ? ERR_INVALID_VALUE : ERR_INVALID_TYPE,
                          "'prompt' must be a string or an array of token ids");
                goto bad;
            }
            if (j->prompt.n == prompt_room(s)) {
                fail_code(&e, "prompt", ERR_CONTEXT, "the prompt has more than %lld tokens; the context holds %lld",
                          (long long)prompt_room(s), (long long)prompt_room(s) + 1);
                goto bad;
            }
            sp_ids_push(&j->prompt, (int32_t)v);
        }
    } else {
        fail_code(&e, "prompt", p ? ERR_INVALID_TYPE : ERR_MISSING, "'prompt' must be a string or an array of token ids");
        goto bad;
    }
    ret = run_job(c, cn, j);
    if (cn->job != j) job_free(j);
    return ret;
bad:
    ret = BAD_REQUEST(c, s, e.param, e.code, "%s", e.msg);
    job_free(j);
    return ret;
}

static enum MHD_Result handle_models(struct MHD_Connection *c, struct sp_server *s) {
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &b, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "object");
    sp_jw_str(&w, "list");
    sp_jw_key(&w, "data");
    sp_jw_arr(&w);
    sp_jw_obj(&w);
    sp_jw_key(&w, "id");
    sp_jw_str(&w, s->o.model_id);
    sp_jw_key(&w, "object");
    sp_jw_str(&w, "model");
    sp_jw_key(&w, "created");
    sp_jw_int(&w, s->started);
    sp_jw_key(&w, "owned_by");
    sp_jw_str(&w, "sparrow");
    sp_jw_key(&w, "context_length");
    sp_jw_int(&w, sp_engine_params(s->engine)->n_ctx);
    sp_jw_key(&w, "architecture");
    sp_jw_str(&w, s->info.architecture);
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_jw_end(&w);
    enum MHD_Result r = send_json(c, s, 200, &b);
    sp_buf_free(&b);
    return r;
}

/* The built-in chat page. It asks for nothing but this server: the policy
 * keeps its requests here and refuses frames and form posts elsewhere
 * (its script and style are inline: one file, no build step). */
static enum MHD_Result handle_page(struct MHD_Connection *c, struct sp_server *s, const char *method) {
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return send_error(c, s, 405, "invalid_request_error", NULL, NULL, "use GET /");
    size_t len;
    const char *html = sp_webui_page(&len);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)html, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    add_common_headers(s, r, "text/html; charset=utf-8");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                            "frame-ancestors 'none'");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count_status(s, 200);
    return ret;
}

static enum MHD_Result handle_info(struct MHD_Connection *c, struct sp_server *s) {
    struct sp_info_src src = {.model_id = s->o.model_id, .engine = s->engine, .info = &s->info,
                              .plan = s->has_plan ? &s->plan : NULL, .device = s->device, .kernels = s->kernels};
    struct sp_buf b = SP_BUF_INIT;
    sp_info_json(&src, &b);
    enum MHD_Result r = send_json(c, s, 200, &b);
    sp_buf_free(&b);
    return r;
}

/* Resident memory of the process from /proc/self/status, in bytes. */
static void proc_memory(size_t *rss, size_t *anon, size_t *file) {
    *rss = *anon = *file = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) *rss = (size_t)kb * 1024;
        if (sscanf(line, "RssAnon: %llu kB", &kb) == 1) *anon = (size_t)kb * 1024;
        if (sscanf(line, "RssFile: %llu kB", &kb) == 1) *file = (size_t)kb * 1024;
    }
    fclose(f);
}

/* The lines of a Prometheus histogram: cumulative buckets (n counts, the
 * last one +Inf; the n - 1 finite bounds are in units of 1/per_second
 * seconds), sum and count. */
static void histogram(struct sp_buf *b, const char *name, const double *bounds, double per_second, const uint64_t *counts,
                      int n, double sum) {
    uint64_t cum = 0;
    for (int i = 0; i < n; i++) {
        cum += counts[i];
        if (i < n - 1)
            sp_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i] / per_second, (unsigned long long)cum);
        else
            sp_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    sp_buf_printf(b, "%s_sum %.6f\n%s_count %llu\n", name, sum, name, (unsigned long long)cum);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *c, struct sp_server *s) {
    struct sp_buf b = SP_BUF_INIT;
    struct sp_engine_stats st;
    memset(&st, 0, sizeof st);
    if (atomic_load(&s->ready)) sp_engine_stats(s->engine, &st);
#define METRIC(name, type, help) sp_buf_printf(&b, "# HELP sparrow_" name " " help "\n# TYPE sparrow_" name " " type "\n")
#define METRIC_VALUE(name, type, help, fmt, v) \
    (METRIC(name, type, help), sp_buf_printf(&b, "sparrow_" name " " fmt "\n", v))
    METRIC("requests_total", "counter", "HTTP responses by status code");
    for (size_t i = 0; i < N_STATUS; i++)
        sp_buf_printf(&b, "sparrow_requests_total{status=\"%d\"} %llu\n", status_codes[i],
                      (unsigned long long)atomic_load(&s->status_count[i]));
    METRIC_VALUE("generation_requests_total", "counter", "requests given to the scheduler", "%llu", (unsigned long long)st.requests);
    METRIC_VALUE("prompt_tokens_total", "counter", "prompt tokens of all requests", "%llu", (unsigned long long)st.prompt_tokens);
    METRIC_VALUE("prompt_tokens_cached_total", "counter", "prompt tokens reused from the prompt cache", "%llu", (unsigned long long)st.cached_tokens);
    METRIC_VALUE("prefill_tokens_total", "counter", "prompt tokens computed by forward passes (not reused)", "%llu", (unsigned long long)st.prefill_tokens);
    METRIC_VALUE("generated_tokens_total", "counter", "tokens generated", "%llu", (unsigned long long)st.generated_tokens);
    METRIC_VALUE("prefill_tokens_per_second", "gauge", "prompt tokens computed per second of prefill (since start)", "%.3f", st.prefill_s > 0 ? (double)st.prefill_tokens / st.prefill_s : 0.0);
    METRIC_VALUE("decode_tokens_per_second", "gauge", "tokens decoded per second of decode steps (since start)", "%.3f", st.decode_s > 0 ? (double)st.decode_tokens / st.decode_s : 0.0);
    METRIC("time_to_first_token_seconds", "histogram", "from request to first generated token");
    histogram(&b, "sparrow_time_to_first_token_seconds", sp_ttft_bounds, 1.0, st.ttft_bucket, 12, st.ttft_sum);
    METRIC_VALUE("queue_depth", "gauge", "requests waiting for a slot", "%d", st.queue_depth);
    pthread_mutex_lock(&s->tok_mu);
    int tok_active = s->tok_active, tok_waiting = s->tok_waiting;
    pthread_mutex_unlock(&s->tok_mu);
    METRIC_VALUE("tokenizing", "gauge", "prompts being rendered and tokenized", "%d", tok_active);
    METRIC_VALUE("tokenizing_waiting", "gauge", "prompts waiting for their turn to be tokenized", "%d", tok_waiting);
    METRIC_VALUE("slots_active", "gauge", "slots generating", "%d", st.active_slots);
    METRIC_VALUE("slots", "gauge", "slots (parallel sequences)", "%d", st.n_slots);
    METRIC_VALUE("kv_cache_tokens", "gauge", "positions held in the KV cache, prompt cache included", "%lld", (long long)st.kv_tokens_used);
    METRIC_VALUE("kv_cache_capacity_tokens", "gauge", "positions the KV cache can hold", "%lld", (long long)st.n_ctx * st.n_slots);
    METRIC_VALUE("kv_cache_bytes", "gauge", "bytes reserved for the KV cache (the prompt cache lives in it)", "%zu", st.kv_bytes);
    METRIC("memory_allocated_bytes", "gauge", "heap bytes sparrow allocated, by class");
    for (int i = 0; i < SP_MEM_CLASS_COUNT; i++)
        sp_buf_printf(&b, "sparrow_memory_allocated_bytes{class=\"%s\"} %zu\n", sp_mem_class_name((enum sp_mem_class)i),
                      sp_mem_used((enum sp_mem_class)i));
    size_t rss, anon, file;
    proc_memory(&rss, &anon, &file);
    METRIC("resident_bytes", "gauge", "resident memory of the process (kind: total, anonymous, file-backed)");
    sp_buf_printf(&b, "sparrow_resident_bytes{kind=\"total\"} %zu\nsparrow_resident_bytes{kind=\"anon\"} %zu\n"
                      "sparrow_resident_bytes{kind=\"file\"} %zu\n", rss, anon, file);
    if (st.has_experts) {
        const struct sp_expert_store_stats *x = &st.experts;
        METRIC_VALUE("expert_cache_budget_bytes", "gauge", "bytes of the routed-expert cache", "%zu", x->budget);
        METRIC_VALUE("expert_cache_bytes", "gauge", "bytes of experts held in the cache", "%zu", x->cached_bytes);
        METRIC_VALUE("expert_cache_hits_total", "counter", "expert lookups served from the cache", "%llu", (unsigned long long)x->hits);
        METRIC_VALUE("expert_cache_misses_total", "counter", "expert lookups read from the model files", "%llu", (unsigned long long)x->misses);
        METRIC_VALUE("expert_cache_evictions_total", "counter", "experts dropped to make room", "%llu", (unsigned long long)x->evictions);
        METRIC_VALUE("expert_prefetch_total", "counter", "experts read ahead for the next layer", "%llu", (unsigned long long)x->prefetch_issued);
        METRIC_VALUE("expert_prefetch_hits_total", "counter", "experts read ahead and then used", "%llu", (unsigned long long)x->prefetch_hits);
        METRIC_VALUE("expert_prefetch_wasted_total", "counter", "experts read ahead and evicted unused", "%llu", (unsigned long long)x->prefetch_waste);
        METRIC_VALUE("expert_reads_total", "counter", "read requests to the model files", "%llu", (unsigned long long)x->reads);
        METRIC_VALUE("expert_read_bytes_total", "counter", "bytes read from the model files", "%llu", (unsigned long long)x->bytes_read);
        METRIC_VALUE("expert_read_bytes_per_second", "gauge", "disk read throughput while reading experts", "%.0f", x->read_s > 0 ? (double)x->bytes_read / x->read_s : 0.0);
        METRIC("expert_read_seconds", "histogram", "time to read one expert");
        histogram(&b, "sparrow_expert_read_seconds", sp_expert_lat_bounds_ms, 1000.0, x->lat_bucket, SP_EXPERT_LAT_BUCKETS,
                  x->read_s);
        uint64_t *lh = sp_malloc((size_t)st.n_layers * 2 * sizeof *lh, SP_MEM_SERVER);
        if (lh) {
            sp_engine_expert_layers(s->engine, lh, lh + st.n_layers);
            METRIC("expert_cache_layer_hits_total", "counter", "expert cache hits by layer");
            for (int64_t L = 0; L < st.n_layers; L++)
                if (s->info.layer_moe[L]) sp_buf_printf(&b, "sparrow_expert_cache_layer_hits_total{layer=\"%lld\"} %llu\n", (long long)L, (unsigned long long)lh[L]);
            METRIC("expert_cache_layer_misses_total", "counter", "expert cache misses by layer");
            for (int64_t L = 0; L < st.n_layers; L++)
                if (s->info.layer_moe[L]) sp_buf_printf(&b, "sparrow_expert_cache_layer_misses_total{layer=\"%lld\"} %llu\n", (long long)L, (unsigned long long)lh[st.n_layers + L]);
            sp_free(lh);
        }
    }
    if (st.has_device_experts) {
        const struct sp_expert_tier_stats *x = &st.device_experts;
        METRIC_VALUE("gpu_expert_cache_budget_bytes", "gauge", "bytes of device memory for routed experts", "%zu", x->budget);
        METRIC_VALUE("gpu_expert_cache_bytes", "gauge", "bytes of experts held in device memory", "%zu",
                     (size_t)x->cached * x->slot_bytes);
        METRIC_VALUE("gpu_expert_hits_total", "counter", "expert lookups served from device memory", "%llu", (unsigned long long)x->hits);
        METRIC_VALUE("gpu_expert_misses_total", "counter", "expert lookups that copied the expert into device memory", "%llu", (unsigned long long)x->misses);
        METRIC_VALUE("gpu_expert_evictions_total", "counter", "experts dropped from device memory to make room", "%llu",
                     (unsigned long long)x->evictions);
        METRIC_VALUE("gpu_expert_prefetched_total", "counter", "experts copied into device memory ahead, as predicted",
                     "%llu", (unsigned long long)x->prefetched);
        METRIC_VALUE("gpu_expert_prefetch_used_total", "counter", "experts copied ahead that were then used", "%llu",
                     (unsigned long long)x->prefetch_used);
        METRIC_VALUE("host_to_device_bytes_total", "counter", "expert bytes copied from host memory to the device", "%llu",
                     (unsigned long long)x->bytes_in);
        METRIC_VALUE("cpu_computed_experts_total", "counter", "experts the CPU computed instead of a copy to the device (--cpu-experts)",
                     "%llu", (unsigned long long)x->cpu_experts);
    }
    if (atomic_load(&s->ready)) {
        METRIC("model_bytes", "gauge", "model tensor bytes by role class and where they are read from");
        for (int k = 0; k < s->info.n_classes; k++)
            sp_buf_printf(&b, "sparrow_model_bytes{class=\"%s\",placement=\"%s\"} %zu\n", s->info.classes[k].name,
                          s->info.classes[k].placement, s->info.classes[k].bytes);
        METRIC_VALUE("model_file_bytes", "gauge", "bytes of the model's safetensors files (mapped)", "%zu",
                     s->info.file_bytes);
    }
#undef METRIC
#undef METRIC_VALUE
    enum MHD_Result r = send_body(c, s, 200, "text/plain; version=0.0.4", b.data ? b.data : "", b.len);
    sp_buf_free(&b);
    return r;
}

#define KEY_NONE (-1)     // no keys are in use
#define KEY_REFUSED (-2)  // keys are in use and the request has none of them

/* The index of the API key k, or KEY_REFUSED. Every key is compared in
 * full, so the time taken says nothing of how close a guess came. */
static int key_lookup(struct sp_server *s, const char *k) {
    size_t kl = strlen(k);
    int found = KEY_REFUSED;
    for (int n = 0; n < s->o.n_api_keys; n++) {
        const char *want = s->o.api_keys[n];
        size_t wl = strlen(want);
        unsigned diff = kl != wl;
        for (size_t i = 0; i < wl; i++)
            diff |= (unsigned)(unsigned char)want[i] ^ (unsigned)(i < kl ? (unsigned char)k[i] : 0);
        if (diff == 0) found = n;
    }
    return found;
}

/* Which API key the request carries: its index, KEY_NONE or KEY_REFUSED.
 * OpenAI clients send "Authorization: Bearer KEY", Anthropic's "x-api-key:
 * KEY"; either is accepted. */
static int api_key_index(struct MHD_Connection *c, struct sp_server *s) {
    if (s->o.n_api_keys <= 0) return KEY_NONE;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    int found = h && strncmp(h, "Bearer ", 7) == 0 ? key_lookup(s, h + 7) : KEY_REFUSED;
    if (found == KEY_REFUSED && x) found = key_lookup(s, x);
    return found;
}

static enum MHD_Result route(struct MHD_Connection *c, struct conn *cn, const char *url, const char *method) {
    struct sp_server *s = cn->srv;
    if (!strcmp(method, "OPTIONS")) return send_body(c, s, 200, "text/plain", "", 0);
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (atomic_load(&s->draining) && strcmp(url, "/metrics") != 0)
        return send_unavailable(c, s, "server_error", "server_shutting_down", NULL, "the server is shutting down");
    if (!strcmp(url, "/health")) {
        if (!atomic_load(&s->ready))
            return send_unavailable(c, s, "server_error", "model_loading", RETRY_LOADING_S, "the model is loading");
        char why[512];
        if (sp_engine_failed(s->engine, why, sizeof why))
            return send_unavailable(c, s, "server_error", "model_files_changed", NULL, "%s", why);
        return send_body(c, s, 200, "application/json", "{\"status\":\"ok\"}", 15);
    }
    if (!strcmp(url, "/metrics")) return handle_metrics(c, s);
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) return handle_page(c, s, method);
    bool info = !strcmp(url, "/v1/sparrow/info");
    bool known = info || !strcmp(url, "/v1/models") || !strcmp(url, "/v1/chat/completions") ||
                 !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/responses") || !strcmp(url, "/v1/messages") ||
                 !strcmp(url, "/v1/messages/count_tokens");
    if (!known) return send_error(c, s, 404, "invalid_request_error", NULL, "not_found", "no route %s %s", method, url);
    cn->key = api_key_index(c, s);
    if (cn->key == KEY_REFUSED)
        return send_error(c, s, 401, "invalid_request_error", NULL, "invalid_api_key", "missing or incorrect API key");
    if (!atomic_load(&s->ready))
        return send_unavailable(c, s, "server_error", "model_loading", RETRY_LOADING_S, "the model is loading");
    if (!strcmp(url, "/v1/models")) {
        if (!get) return send_error(c, s, 405, "invalid_request_error", NULL, "method_not_allowed", "use GET %s", url);
        return handle_models(c, s);
    }
    if (info) {
        if (!get) return send_error(c, s, 405, "invalid_request_error", NULL, "method_not_allowed", "use GET %s", url);
        return handle_info(c, s);
    }
    if (!post) return send_error(c, s, 405, "invalid_request_error", NULL, "method_not_allowed", "use POST %s", url);
    if (cn->too_big)
        return send_error(c, s, 413, "invalid_request_error", NULL, "request_too_large",
                          "the request body exceeds %zu bytes", s->o.max_body);
    cJSON *body;
    if (sp_json_parse(cn->body.data ? cn->body.data : "", cn->body.len, "request body", &body) != SP_OK)
        return BAD_REQUEST(c, s, NULL, "invalid_json", "%s", sp_error_msg());
    enum MHD_Result r;
    if (!cJSON_IsObject(body))
        r = BAD_REQUEST(c, s, NULL, ERR_INVALID_TYPE, "the request body must be a JSON object");
    else if (!strcmp(url, "/v1/chat/completions"))
        r = handle_chat(c, cn, body, NULL);
    else if (!strcmp(url, "/v1/completions"))
        r = handle_completion(c, cn, body);
    else
        r = handle_api(c, cn, body, url);
    cJSON_Delete(body);
    return r;
}

/* The body-framing headers of a request, counted. */
struct framing {
    int n_length, n_encoding;
    const char *length, *encoding;
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    struct framing *f = cls;
    if (!strcasecmp(key, "Content-Length")) {
        if (f->n_length++ == 0) f->length = value;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        if (f->n_encoding++ == 0) f->encoding = value;
    }
    return MHD_YES;
}

/* Whether the request says in exactly one way where its body ends. Two
 * Content-Lengths, or a Content-Length beside a Transfer-Encoding, let a
 * proxy in front and this server disagree about where the next request
 * starts (request smuggling); libmicrohttpd would read the first or prefer
 * the encoding, so they are refused before any body is read. An encoding
 * other than plain chunked has no length at all. */
static bool framing_ok(struct MHD_Connection *c, char *why, size_t cap) {
    struct framing f = {0, 0, NULL, NULL};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (f.n_length > 1)
        snprintf(why, cap, "the request has %d Content-Length headers; send exactly one", f.n_length);
    else if (f.n_encoding > 1)
        snprintf(why, cap, "the request has %d Transfer-Encoding headers; send at most one", f.n_encoding);
    else if (f.n_encoding && f.n_length)
        snprintf(why, cap, "the request has both Content-Length and Transfer-Encoding; send one of them");
    else if (f.n_encoding && strcasecmp(f.encoding, "chunked") != 0)
        snprintf(why, cap, "Transfer-Encoding '%.64s' is not supported; send Content-Length or 'chunked'", f.encoding);
    else
        return true;
    return false;
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                      const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    struct sp_server *s = cls;
    struct conn *cn = *con_cls;
    if (!cn) {
        cn = sp_calloc(1, sizeof *cn, SP_MEM_SERVER);
        if (!cn) return MHD_NO;
        cn->srv = s;
        *con_cls = cn;
        struct sock *k = conn_sock(c);
        if (k) k->anthropic = !strcmp(url, "/v1/messages") || !strcmp(url, "/v1/messages/count_tokens");
        char why[160];
        if (!framing_ok(c, why, sizeof why))
            return send_error(c, s, 400, "invalid_request_error", NULL, "bad_framing", "%s", why);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cn->too_big && cn->body.len + *upload_size > s->o.max_body) {
            cn->too_big = true;
            sp_buf_free(&cn->body);
        }
        if (!cn->too_big) sp_buf_append(&cn->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    sock_reading(c, false);
    return route(c, cn, url, method);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    sock_reading(c, true);
    struct conn *cn = *con_cls;
    if (!cn) return;
    if (cn->counted) atomic_fetch_sub(&cn->srv->in_flight, 1);
    if (cn->job && !cn->job->done) client_went_away(cn->job);  // a stream cut short by the client
    job_free(cn->job);
    sp_buf_free(&cn->body);
    sp_free(cn);
    *con_cls = NULL;
}

static void server_free(struct sp_server *s) {
    pthread_cond_destroy(&s->tok_cv);
    pthread_mutex_destroy(&s->tok_mu);
    pthread_cond_destroy(&s->socks_cv);
    pthread_mutex_destroy(&s->socks_mu);
    sp_free(s);
}

enum sp_status sp_server_start(const struct sp_server_opts *o, struct sp_server **out) {
    *out = NULL;
    struct sp_server *s = sp_calloc(1, sizeof *s, SP_MEM_SERVER);
    if (!s) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    s->o = *o;
    s->quiesced_fd = -1;
    if (!s->o.max_body) s->o.max_body = (size_t)8 << 20;
    if (!(s->o.request_timeout > 0)) s->o.request_timeout = 10;
    s->max_conns = o->max_connections > 0 ? o->max_connections : 1024;
    /* a connection is a descriptor: past the open-file limit accept() fails
     * and libmicrohttpd stops accepting, which is the hang to avoid */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) {
        long room = (long)nofile.rlim_cur - FD_RESERVE - MHD_LIMIT_MARGIN;
        if (room < s->max_conns) {
            long want = s->max_conns;
            s->max_conns = room > 16 ? (int)room : 16;
            sp_log(SP_LOG_WARN, "at most %d connections: the open-file limit is %llu (%ld asked; raise it with ulimit -n)",
                   s->max_conns, (unsigned long long)nofile.rlim_cur, want);
        }
    }
    if (s->o.max_tokenizing <= 0) s->o.max_tokenizing = 4;
    pthread_mutex_init(&s->socks_mu, NULL);
    pthread_cond_init(&s->socks_cv, NULL);
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_cond_init(&s->tok_cv, NULL);
    if (!s->o.model_id) s->o.model_id = "sparrow";
    s->started = (int64_t)time(NULL);
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    /* ITC: MHD_quiesce_daemon needs it to stop accepting while connections go on */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    const char *host = o->host ? o->host : "127.0.0.1";
    if (strchr(host, ':')) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&addr;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)o->port);
        if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1) {
            server_free(s);
            return sp_errorf(SP_ERR_ARG, "--host %s is not an IPv6 address", host);
        }
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&addr;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)o->port);
        if (inet_pton(AF_INET, host, &a4->sin_addr) != 1) {
            server_free(s);
            return sp_errorf(SP_ERR_ARG, "--host %s is not an IPv4 address", host);
        }
    }
    /* The daemon's timeout counts from the last byte moved: it ends
     * responses a client stopped reading. Requests are bounded by the
     * watchdog's request_timeout instead. */
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, accept_policy, s, access_handler, s, MHD_OPTION_SOCK_ADDR, &addr,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_NOTIFY_CONNECTION, notify_connection, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->max_conns + MHD_LIMIT_MARGIN),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(o->max_connections_per_ip > 0 ? o->max_connections_per_ip : 0),
                            MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
    if (!s->d) {
        server_free(s);
        return sp_errorf(SP_ERR_IO, "cannot listen on %s:%d (in use, or not allowed)", host, o->port);
    }
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
        MHD_stop_daemon(s->d);
        server_free(s);
        return sp_errorf(SP_ERR_NOMEM, "cannot start the connection watchdog thread");
    }
    s->watchdog_started = true;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return SP_OK;
}

void sp_server_attach(struct sp_server *s, struct sp_engine *e, const struct sp_tokenizer *tok,
                      const struct sp_chat_template *ct) {
    s->engine = e;
    s->tok = tok;
    s->ct = ct;
    sp_engine_info(e, &s->info);
    atomic_store(&s->ready, true);
}

void sp_server_set_plan(struct sp_server *s, const struct sp_plan *plan, const char *device, const char *kernels) {
    if (plan) s->plan = *plan;
    s->has_plan = plan != NULL;
    s->device = device;
    s->kernels = kernels;
}

int sp_server_port(const struct sp_server *s) { return s->port; }

void sp_server_drain(struct sp_server *s) {
    if (!s || atomic_exchange(&s->draining, true)) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd == MHD_INVALID_SOCKET) return;
    s->quiesced_fd = fd;
    /* clients waiting in the backlog, and those that come now, are refused
     * at once rather than left waiting for an accept that never comes */
    shutdown(fd, SHUT_RDWR);
}

int sp_server_in_flight(const struct sp_server *s) { return s ? atomic_load(&s->in_flight) : 0; }

void sp_server_stop(struct sp_server *s) {
    if (!s) return;
    sp_server_drain(s);
    atomic_store(&s->stopping, true);
    /* each connection writes its ending (an error event and [DONE], or an
     * error body) within a poll interval; a client that does not read it is
     * cut when the daemon stops */
    double until = sp_now_s() + STOP_FLUSH_S;
    while (atomic_load(&s->in_flight) > 0 && sp_now_s() < until) usleep(10000);
    if (s->watchdog_started) {
        pthread_mutex_lock(&s->socks_mu);
        s->watchdog_stop = true;
        pthread_cond_signal(&s->socks_cv);
        pthread_mutex_unlock(&s->socks_mu);
        pthread_join(s->watchdog, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    if (s->quiesced_fd >= 0) close(s->quiesced_fd);
    server_free(s);
}
