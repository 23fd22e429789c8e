/*
 * server.h - the OpenAI-compatible HTTP server (libmicrohttpd, a thread per
 * connection): /v1/chat/completions, /v1/completions (both with SSE
 * streaming), /v1/models, /v1/sparrow/info (the model and its memory plan,
 * server/info.h), /health, /metrics, a chat page at / (server/webui.h; it
 * needs no key, the API calls it makes do), and over the chat path the
 * OpenAI Responses API (/v1/responses) and the Anthropic Messages API
 * (/v1/messages, /v1/messages/count_tokens; server/api.h). It listens
 * before the model is loaded (/health answers 503 until sp_server_attach),
 * so load progress can be watched.
 *
 *     struct sp_server *srv;
 *     struct sp_server_opts o = {.host = "127.0.0.1", .port = 5413, .model_id = "tiny"};
 *     sp_server_start(&o, &srv);
 *     ... plan, load ...
 *     sp_server_set_plan(srv, &plan, "cpu", "avx2");   // optional
 *     sp_server_attach(srv, engine, tokenizer, chat_template);
 *     ... until a signal ...
 *     sp_server_drain(srv);                     // no new work
 *     while (sp_server_in_flight(srv) && !timed_out) wait;
 *     sp_server_stop(srv);                      // end the rest, close
 *
 * Errors are answered in OpenAI's shape {"error": {message, type, param,
 * code}} (on the Anthropic routes in Anthropic's, {"type": "error",
 * "error": {type, message}}) with 400 for bad requests, 401 for a missing
 * or wrong key, 404, 405, 413 for a body over max_body, 503 while loading
 * or when the queue is full (with Retry-After), or once the model's files
 * changed under the engine (sp_engine_failed); bad input never yields 500.
 * type is "invalid_request_error" for 4xx and "server_error" for 5xx; code
 * is a string naming the error ("invalid_value", "invalid_type",
 * "missing_required_parameter", "context_length_exceeded",
 * "invalid_api_key", "server_busy", ...) and param the offending request
 * field, or null. A request that
 * frames its body ambiguously (two Content-Lengths, Content-Length with
 * Transfer-Encoding, an encoding other than chunked) is answered 400
 * before its body is read.
 */
#ifndef SP_SERVER_SERVER_H
#define SP_SERVER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/engine.h"
#include "runtime/plan.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

struct sp_server_opts {
    const char *host;      // "127.0.0.1"; "0.0.0.0" or "::" to listen everywhere
    int port;
    const char *const *api_keys;  // accepted keys, sent as "Authorization: Bearer KEY" or "x-api-key: KEY"
                                  // (borrowed; none: no key required); each key is a
    int n_api_keys;               // prompt-cache scope of its own, so clients of one key never reuse,
                                  // nor learn of, another key's cached prompts
    const char *cors;      // Access-Control-Allow-Origin value, or NULL
    const char *model_id;  // reported by /v1/models and in responses
    size_t max_body;       // bytes (0: 8 MiB)
    int max_connections;   // open connections; more are closed at once (0: 1024; at most what the open-file limit allows)
    int max_connections_per_ip;  // open connections from one address; more are closed at once (0: no limit)
    int max_tokenizing;          // prompts rendered and tokenized at once; more wait (0: 4)
    double request_timeout;      // seconds a connection has to send a whole request, from its opening or
                                 // its previous response's end; then it is closed (0: 10)
    int64_t default_max_tokens;  // when a request gives none (0: until the context is full)
    struct sp_sampler_params defaults;  // temperature, top_p, ... when a request gives none
};

struct sp_server;

enum sp_status sp_server_start(const struct sp_server_opts *o, struct sp_server **out);
/* Makes the model available; the objects must outlive the server. What
 * the server reports about the model (architecture, bytes by role class,
 * which layers have experts) it asks the engine for (sp_engine_info). */
void sp_server_attach(struct sp_server *s, struct sp_engine *e, const struct sp_tokenizer *tok,
                      const struct sp_chat_template *ct);
/* What /v1/sparrow/info reports about how the model is held: the memory
 * plan it was loaded with (copied; its strings must outlive the server),
 * the device the forward pass runs on and the kernel set (borrowed for the
 * server's life; NULL: reported as null). Call before sp_server_attach. */
void sp_server_set_plan(struct sp_server *s, const struct sp_plan *plan, const char *device, const char *kernels);
/* Graceful shutdown, first step: stops accepting connections (new ones are
 * refused), and answers requests that still arrive on open connections 503
 * server_shutting_down; generations in flight go on. */
void sp_server_drain(struct sp_server *s);
/* Generations whose response is not complete yet. Any thread. */
int sp_server_in_flight(const struct sp_server *s);
/* Ends what still runs (a stream gets an error event server_shutdown and
 * [DONE], a non-streaming request a 503 server_shutdown body), waits a
 * moment for those endings to be written, closes every connection and
 * frees the server. Drains first if sp_server_drain was not called. */
void sp_server_stop(struct sp_server *s);
/* The port actually bound (useful with port 0). */
int sp_server_port(const struct sp_server *s);

#endif
