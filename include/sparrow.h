/*
 * sparrow.h - the public C API of sparrow: open a model, make a context,
 * turn text into token ids and back, and generate text from a prompt, from
 * token ids, or from chat messages rendered through the model's template,
 * with a callback that sees the text as it is produced.
 *
 *     static bool print(const char *text, size_t len, const int32_t *ids, int64_t n, void *user) {
 *         fwrite(text, 1, len, stdout);
 *         return true;                                // false stops the generation
 *     }
 *
 *     struct sparrow_model *model;
 *     if (sparrow_model_open("Qwen/Qwen3-30B-A3B", NULL, &model) != SPARROW_OK) {
 *         fprintf(stderr, "error: %s\n", sparrow_last_error());
 *         return 1;
 *     }
 *     struct sparrow_context *ctx;
 *     struct sparrow_context_params cp = {.n_ctx = 4096};   // zero fields: defaults
 *     if (sparrow_context_create(model, &cp, &ctx) != SPARROW_OK) ...
 *     struct sparrow_gen_params gp = sparrow_gen_defaults();
 *     gp.max_tokens = 256;
 *     struct sparrow_message msgs[] = {{"user", "Why is the sky blue?"}};
 *     struct sparrow_result res;
 *     if (sparrow_chat(ctx, msgs, 1, &gp, print, NULL, &res) == SPARROW_OK)
 *         printf("\n%lld tokens, %s\n", (long long)res.n_tokens, sparrow_finish_str(res.finish));
 *     sparrow_result_clear(&res);
 *     sparrow_context_free(ctx);
 *     sparrow_model_close(model);
 *
 * Names. Everything here is sparrow_ / SPARROW_, not the sp_ of the
 * library's own modules: sp_model, sp_engine, sp_tokenizer, ... already
 * name internal types, and a program linking libsparrow.a sees both, so the
 * public names must neither collide with them nor be mistaken for them.
 *
 * Errors. Every fallible function returns enum sparrow_status. The sentence
 * that explains the last failure on the calling thread ("token 300 is
 * outside the vocabulary of 256") is sparrow_last_error(). Bad input gives
 * an error, never a crash; NULL where an object is required is
 * SPARROW_ERR_ARG.
 *
 * Ownership. Objects are opaque and owned by the caller from their _open /
 * _create until their _close / _free; a context borrows its model, so free
 * every context of a model before closing it. Text and id arrays a
 * function hands back are the caller's, freed with sparrow_free (or
 * sparrow_result_clear for a result). Strings given to a function are
 * borrowed for the call. Pointers in sparrow_model_info borrow from the
 * model until sparrow_model_close.
 *
 * Threads. A model and its contexts may be used from several threads at
 * once. Generation calls on one context run together, up to n_seq of them
 * (continuous batching: one forward pass per step for all); further calls
 * wait in a queue, and SPARROW_ERR_LIMIT answers a call when the queue is
 * full. A callback runs on the thread that called the generation function.
 */
#ifndef SPARROW_H
#define SPARROW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raised when a declaration here changes incompatibly. */
#define SPARROW_API_VERSION 1

enum sparrow_status {
    SPARROW_OK = 0,
    SPARROW_ERR_IO,          // a file could not be read
    SPARROW_ERR_NOMEM,       // out of memory
    SPARROW_ERR_NOT_FOUND,   // no such model, file, tokenizer or chat template
    SPARROW_ERR_FORMAT,      // malformed model files, config or template
    SPARROW_ERR_UNSUPPORTED, // an architecture, format or feature sparrow does not have
    SPARROW_ERR_ARG,         // invalid argument
    SPARROW_ERR_LIMIT,       // a limit exceeded: context, queue, stop strings
    SPARROW_ERR_STATE,       // the call cannot be made now (e.g. text functions without a tokenizer)
    SPARROW_STATUS_COUNT
};

/* A short constant description of a status ("invalid argument"). */
const char *sparrow_status_str(enum sparrow_status st);

/* The detail of the last failing call on this thread. Never NULL; valid
 * until the next failing call on this thread. Calls that succeed leave it
 * as it was, so read it only after a status other than SPARROW_OK. */
const char *sparrow_last_error(void);

enum sparrow_log_level { SPARROW_LOG_ERROR, SPARROW_LOG_WARN, SPARROW_LOG_INFO, SPARROW_LOG_DEBUG };

/* What sparrow writes to stderr (default: SPARROW_LOG_INFO); process-wide. */
void sparrow_set_log_level(enum sparrow_log_level level);

/* Frees text or ids handed back by sparrow_tokenize, sparrow_detokenize and
 * sparrow_chat_render. NULL is a no-op. */
void sparrow_free(void *p);

/* ---- models ---- */

struct sparrow_model;

struct sparrow_model_params {
    const char *chat_template; // name of a template when the model has several (NULL: "default")
    const char *hf_hub_cache;  // the Hugging Face hub cache for ids (NULL: as huggingface_hub finds it, from
                               // HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME or HOME)
};

/* Opens a model: a folder of safetensors files with config.json, or a
 * Hugging Face id ("org/name[@revision]") found in the local HF cache.
 * Reads tensor headers only; weights are brought in by the first context.
 * Its tokenizer.json and chat template are loaded when the folder has them
 * (without a tokenizer, only the token-id functions work). A chat template
 * that cannot be loaded (absent, malformed, no template of the name asked
 * for) leaves the model without one, and sparrow_chat says why. p may be
 * NULL. *out is owned by the caller (sparrow_model_close). */
enum sparrow_status sparrow_model_open(const char *path_or_id, const struct sparrow_model_params *p,
                                       struct sparrow_model **out);

/* Closes a model whose contexts are all freed; closing one under a live
 * context is a broken contract and aborts, as a double free would. NULL is
 * a no-op. */
void sparrow_model_close(struct sparrow_model *m);

struct sparrow_model_info {
    const char *architecture; // config.json's model_type ("qwen3_moe", ...)
    const char *path;         // the folder the model was read from
    int64_t vocab_size;       // token ids are below it
    int64_t n_ctx_train;      // positions the model was made for
    int64_t n_layers;
    bool has_tokenizer;     // tokenizer.json was found: the text functions work
    bool has_chat_template; // a chat template was found: sparrow_chat works
};

/* Fills *out; its strings borrow from the model. */
void sparrow_model_info(const struct sparrow_model *m, struct sparrow_model_info *out);

/* ---- text and token ids ---- */

enum sparrow_tokenize_flags {
    SPARROW_TOKENIZE_ADD_SPECIAL = 1u << 0,   // add the tokens the tokenizer puts around a text (BOS, ...)
    SPARROW_TOKENIZE_PARSE_SPECIAL = 1u << 1, // special-token text ("<|im_start|>") becomes its id, not plain text
};

/* The ids of text[0..len). *ids (n_ids of them; NULL when none) is owned
 * by the caller (sparrow_free). SPARROW_ERR_STATE without a tokenizer. */
enum sparrow_status sparrow_tokenize(const struct sparrow_model *m, const char *text, size_t len, unsigned flags,
                                     int32_t **ids, int64_t *n_ids);

enum sparrow_detokenize_flags {
    SPARROW_DETOKENIZE_SKIP_SPECIAL = 1u << 0, // leave special tokens out of the text
};

/* The text of ids, valid UTF-8 and NUL-terminated, *len bytes. *text is
 * owned by the caller (sparrow_free). An id outside the vocabulary is
 * SPARROW_ERR_ARG. */
enum sparrow_status sparrow_detokenize(const struct sparrow_model *m, const int32_t *ids, int64_t n_ids, unsigned flags,
                                       char **text, size_t *len);

/* One chat message: role "system", "user", "assistant", ... and its text
 * (NULL: empty). */
struct sparrow_message {
    const char *role;
    const char *content;
};

/* The prompt text the model's chat template makes of messages, ending with
 * the opening of the assistant's turn when add_generation_prompt. *prompt
 * (NUL-terminated, *len bytes) is owned by the caller (sparrow_free).
 * SPARROW_ERR_STATE without a chat template. */
enum sparrow_status sparrow_chat_render(const struct sparrow_model *m, const struct sparrow_message *msgs,
                                        int64_t n_msgs, bool add_generation_prompt, char **prompt, size_t *len);

/* ---- contexts and generation ---- */

struct sparrow_context;

/* Zero fields take the defaults; a NULL pointer is all defaults. */
struct sparrow_context_params {
    int64_t n_ctx;         // positions per sequence, prompt and generation (0: the model's, at most 4096)
    int n_seq;             // sequences generated together (0: 1)
    int64_t n_batch;       // tokens per forward step, prompt chunks included (0: sparrow's default)
    int n_threads;         // 0: the machine's physical cores
    const char *kv_type;   // KV cache storage: "f16" (NULL), "bf16" or "f32"
    uint64_t mem_limit;    // bytes to plan for (0: the cgroup limit or MemAvailable)
    uint64_t expert_cache; // bytes for routed experts read from disk (0: as the memory planner decides)
    const char *device;    // where the forward pass runs: "cpu" (NULL) or "cuda" (a build with make CUDA=1)
    uint64_t gpu_mem_limit;  // "cuda": device memory to plan for (0: what is free on it); routed experts that
                             // do not fit go into a GPU expert cache over host memory
};

/* Plans memory for the model (what stays resident, an expert cache when
 * the routed experts do not fit), brings in the weights the first time a
 * context of the model is made, and starts the context's scheduler thread.
 * *out is owned by the caller (sparrow_context_free). */
enum sparrow_status sparrow_context_create(struct sparrow_model *m, const struct sparrow_context_params *p,
                                           struct sparrow_context **out);

/* Stops the scheduler (generations still running end as cancelled) and
 * frees the context. NULL is a no-op. */
void sparrow_context_free(struct sparrow_context *c);

#define SPARROW_MAX_STOP 8

/* A zeroed struct is greedy decoding with nothing else on, until the
 * context is full; sparrow_gen_defaults() gives sparrow's sampling. */
struct sparrow_gen_params {
    int64_t max_tokens;      // tokens to generate (0: until the context is full)
    float temperature;       // 0: greedy (the most likely token)
    int32_t top_k;           // 0: off
    float top_p;             // 0 or >= 1: off
    float min_p;             // 0: off
    float repeat_penalty;    // 0 or 1: off
    float presence_penalty;  // 0: off
    float frequency_penalty; // 0: off
    uint64_t seed;           // the same seed and inputs give the same tokens
    const char *const *stop; // n_stop strings that end the generation; left out of the text
    int n_stop;              // at most SPARROW_MAX_STOP
    bool ignore_eos;         // keep going past the model's end-of-sequence tokens
};

/* Temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, 256 tokens. */
struct sparrow_gen_params sparrow_gen_defaults(void);

/* Called as tokens are sampled, with the text released since the last call
 * (not NUL-terminated; possibly empty while an incomplete UTF-8 character
 * or the start of a stop string is held back) and the ids sampled since
 * then. Both are borrowed for the call. Returning false stops the
 * generation: it finishes as SPARROW_FINISH_CANCELLED. */
typedef bool (*sparrow_stream_fn)(const char *text, size_t len, const int32_t *ids, int64_t n_ids, void *user);

enum sparrow_finish {
    SPARROW_FINISH_NONE,
    SPARROW_FINISH_STOP,      // an end-of-sequence token or a stop string
    SPARROW_FINISH_LENGTH,    // max_tokens, or the context is full
    SPARROW_FINISH_CANCELLED, // the callback returned false
};

/* "stop", "length", "cancelled" ("none" for SPARROW_FINISH_NONE). */
const char *sparrow_finish_str(enum sparrow_finish f);

struct sparrow_result {
    char *text; // the whole generated text, NUL-terminated, special tokens left out; owned
    size_t text_len;
    int32_t *ids; // (n_tokens) every sampled id, an end-of-sequence one included; owned
    int64_t n_tokens;
    enum sparrow_finish finish;
    int64_t prompt_tokens; // the prompt's length in tokens
    int64_t cached_tokens; // of them, reused from an earlier generation on the same context
    double prefill_s;      // from the start of the prompt's computation to the first token
    double decode_s;       // from the first token to the last
};

/* Frees what a result owns and zeroes it. */
void sparrow_result_clear(struct sparrow_result *r);

/* Generates after token ids. gp NULL: sparrow_gen_defaults(). cb and res
 * may be NULL; on success *res holds the outcome (the caller's:
 * sparrow_result_clear), on failure it is zeroed. Ids outside the
 * vocabulary, an empty prompt or one that fills the context are
 * SPARROW_ERR_ARG. */
enum sparrow_status sparrow_generate_tokens(struct sparrow_context *c, const int32_t *ids, int64_t n_ids,
                                            const struct sparrow_gen_params *gp, sparrow_stream_fn cb, void *user,
                                            struct sparrow_result *res);

/* Generates after prompt text, encoded with SPARROW_TOKENIZE_ADD_SPECIAL
 * (as `sparrow run --prompt` does). gp NULL: sparrow_gen_defaults(). */
enum sparrow_status sparrow_generate(struct sparrow_context *c, const char *prompt, const struct sparrow_gen_params *gp,
                                     sparrow_stream_fn cb, void *user, struct sparrow_result *res);

/* Generates the assistant's reply to messages: rendered through the chat
 * template with the generation prompt, encoded with special tokens parsed
 * (as the server does). gp NULL: sparrow_gen_defaults(). */
enum sparrow_status sparrow_chat(struct sparrow_context *c, const struct sparrow_message *msgs, int64_t n_msgs,
                                 const struct sparrow_gen_params *gp, sparrow_stream_fn cb, void *user,
                                 struct sparrow_result *res);

#ifdef __cplusplus
}
#endif

#endif
