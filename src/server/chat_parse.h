/*
 * chat_parse.h - turns the text a model generates into the parts of an
 * OpenAI chat message: content, reasoning_content and tool calls, either
 * incrementally as the text streams in (for SSE deltas) or all at once.
 *
 * The text arrives in arbitrary pieces (already detokenized, valid UTF-8); a
 * tag may be split across pieces. The parser holds back only what could
 * still be the start of a tag (newlines that may belong to the next tag
 * included) or a tool call that is not recognised yet, and emits
 * everything else at once. Formats:
 *
 *   SP_CHAT_FORMAT_PLAIN        everything is content.
 *   SP_CHAT_FORMAT_HERMES       Qwen3, Ling 2.0, DeepSeek-style <think>:
 *                                 <think>\nREASONING\n</think>\n\nCONTENT
 *                                 <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *   SP_CHAT_FORMAT_QWEN3_CODER  Qwen3-Coder, Qwen3.5: <think> as above and
 *                                 <tool_call>\n<function=f>\n<parameter=p>\nVALUE\n</parameter>\n
 *                                 </function>\n</tool_call>
 *   SP_CHAT_FORMAT_DEEPSEEK_V3  DeepSeek V3.1: <think> as above (the template opens it) and,
 *                               with the special tokens in the text,
 *                                 <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{ARGS}
 *                                 <｜tool▁call▁end｜>...<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
 *   SP_CHAT_FORMAT_HARMONY      gpt-oss; the text includes the special tokens:
 *                                 <|channel|>analysis<|message|>REASONING<|end|>
 *                                 <|start|>assistant<|channel|>final<|message|>CONTENT<|return|>
 *                                 <|start|>assistant<|channel|>commentary to=functions.f
 *                                 <|constrain|>json<|message|>{ARGS}<|call|>
 *                               (the recipient may also precede <|channel|>).
 *
 * Behaviour, per format:
 *
 *  - Think formats. <think> opens reasoning only at the very start of the
 *    output (opts.in_reasoning says the prompt already opened it, as Qwen3.5's
 *    and DeepSeek's templates do; a <think> the model repeats there is
 *    dropped). Newlines are part of the tags around them, as the templates
 *    write them: newlines right after <think>, </think> and </tool_call>,
 *    and right before </think> and <tool_call> (DeepSeek: the calls' opening
 *    token), are dropped, and so are newlines at the start of the output.
 *    Other newlines are kept.
 *  - Hermes tool calls: when the body starts {"name": "...", "arguments": {
 *    (whitespace allowed), the name is emitted at once and the arguments
 *    object streams as the model writes it, with insignificant whitespace
 *    removed (the compact form; numbers and escapes are kept as written);
 *    what follows the arguments object inside the body is ignored.
 *    Any other body (other key order, extra keys, "parameters" instead of
 *    "arguments") is held until </tool_call> and parsed: an object with a
 *    string "name" becomes a call whose arguments are re-serialised compactly
 *    ({} when absent); anything else - invalid JSON included - is emitted as
 *    content, tags and all, so no text is lost.
 *  - Qwen3-Coder tool calls: the name is emitted at <function=NAME>; each
 *    parameter when its </parameter> arrives; arguments are the compact
 *    object {"p":VALUE,...}. One newline after <parameter=p> and one before
 *    </parameter> are removed. VALUE follows the reference parser where the
 *    request's tool schema (opts.tools) declares the parameter's type:
 *    null for the text "null" in any case; a JSON string for the string
 *    types ("string", "str", "text", "varchar", "char", "enum"); true for
 *    "true" or "1" (any case) and false otherwise for "boolean"; for other
 *    types the value itself when it is valid JSON, else a JSON string of
 *    the text. Undeclared parameters (or no schema) are treated like the
 *    other types, JSON when valid, where the reference makes them strings:
 *    that keeps numbers and objects usable when no schema is given (as
 *    issue #5 asks). A value also ends at <parameter=,
 *    </function> or </tool_call> when the model leaves out </parameter>.
 *    Text between parameters is not part of the call and is ignored; a
 *    second <function= before </tool_call> starts another call.
 *  - DeepSeek V3.1 tool calls: the name is emitted at <｜tool▁sep｜>, the
 *    arguments stream as written up to <｜tool▁call▁end｜>; text between
 *    calls is ignored; a call cut before <｜tool▁sep｜> is dropped;
 *    <｜end▁of▁sentence｜> never reaches content or reasoning.
 *  - Harmony: analysis is reasoning; final and commentary without a
 *    recipient are content; a message with a recipient ("to=functions.f" or
 *    any other "to=X") is a tool call named f (X) whose arguments are the
 *    message text as written. The tokens <|start|> <|end|> <|message|>
 *    <|channel|> <|constrain|> <|call|> <|return|> <|startoftext|>
 *    <|endoftext|> never reach content. Text after an end token and before
 *    the next header is content.
 *  - Malformed output at finish: a partial tag is emitted as text; an
 *    unclosed <tool_call> whose body never became a call is emitted as
 *    content (with the tag); a call whose arguments were streaming is closed
 *    as it stands (a Qwen3-Coder parameter without </parameter> takes the
 *    rest of the text); an unterminated harmony header is dropped when it
 *    names a channel and is otherwise content (tokens removed). Arguments
 *    that are not valid JSON are passed on, not repaired.
 *
 * Streaming:
 *     enum sp_chat_format f = sp_chat_format_detect(tmpl, "qwen3_moe");
 *     struct sp_chat_parse_opts o = {.format = f, .id_seed = random64,
 *                                    .in_reasoning = sp_chat_prompt_in_reasoning(f, prompt, n)};
 *     struct sp_chat_parser *p;
 *     sp_chat_parser_new(&o, &p);
 *     for each detokenized piece:
 *         sp_chat_parser_push(p, piece, len);
 *         size_t n; const struct sp_chat_event *ev = sp_chat_parser_events(p, &n);
 *         for (i < n) send a delta: ev[i].kind says content / reasoning_content /
 *             a new tool call (index, id, function.name) / function.arguments text
 *     sp_chat_parser_finish(p);          // then read the last events the same way
 *     finish_reason = sp_chat_parser_tool_calls(p) ? "tool_calls" : "stop";
 *     sp_chat_parser_free(p);
 *
 * All at once:
 *     struct sp_chat_result r;
 *     sp_chat_parse(&o, text, len, &r);  // r.content.data, r.tool_calls[i].name, ...
 *     sp_chat_result_free(&r);
 *
 * Event texts and ids are borrowed from the parser and stay valid until the
 * next push, finish or free. Consecutive pieces of the same kind in one call
 * are merged; no event has empty text. Pushing all text at once and pushing
 * it in any pieces give the same concatenated content, reasoning, and tool
 * call names and arguments.
 */
#ifndef SP_SERVER_CHAT_PARSE_H
#define SP_SERVER_CHAT_PARSE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"

enum sp_chat_format {
    SP_CHAT_FORMAT_PLAIN,
    SP_CHAT_FORMAT_HERMES,
    SP_CHAT_FORMAT_QWEN3_CODER,
    SP_CHAT_FORMAT_DEEPSEEK_V3,
    SP_CHAT_FORMAT_HARMONY,
    SP_CHAT_FORMAT_COUNT
};

/* "plain", "hermes", "qwen3_coder", "deepseek_v3", "harmony". */
const char *sp_chat_format_name(enum sp_chat_format f);
/* Whether a Qwen3-Coder parameter of this schema is written as raw text:
 * its type is one of the reference parser's string family ("string",
 * "str", "text", "varchar", "char", "enum", any case). The parser and the
 * forced-call grammar (server/constrain.h) both go by it. */
bool sp_chat_param_is_text(const cJSON *prop);

/* The format a model emits, from its chat template source (decisive when
 * given and non-empty) or else from config.json's model_type. Either may be
 * NULL. Templates that teach <|channel|> are harmony, <function=...> XML
 * calls Qwen3-Coder, <｜tool▁calls▁begin｜> DeepSeek V3.1, <tool_call> or
 * <think> hermes; model types gpt_oss, qwen3*, bailing*, deepseek* map the
 * same way; everything else is plain. */
enum sp_chat_format sp_chat_format_detect(const char *template_source, const char *model_type);

/* Whether a rendered prompt ends inside an open <think> block (its last
 * <think> comes after its last </think>), for opts.in_reasoning. Always
 * false for formats without <think>. */
bool sp_chat_prompt_in_reasoning(enum sp_chat_format f, const char *prompt, size_t len);

struct sp_chat_parse_opts {
    enum sp_chat_format format;
    bool in_reasoning;  // the output starts inside reasoning: the prompt opened <think>
                        // (harmony: the prompt opened an analysis message)
    uint64_t id_seed;   // tool call ids are "call_" + 24 characters drawn from this and the index
    const cJSON *tools; // optional, borrowed: the request's "tools" array (Qwen3-Coder value types)
};

enum sp_chat_event_kind {
    SP_CHAT_EV_CONTENT,    // text: a piece of content
    SP_CHAT_EV_REASONING,  // text: a piece of reasoning_content
    SP_CHAT_EV_TOOL_BEGIN, // a new tool call: text is the function name, id its id
    SP_CHAT_EV_TOOL_ARGS,  // text: a piece of the arguments JSON of call tool_index
    SP_CHAT_EV_COUNT
};

struct sp_chat_event {
    enum sp_chat_event_kind kind;
    int tool_index;   // TOOL_*: 0, 1, ... in the order the calls began
    const char *text; // borrowed, not NUL-terminated
    size_t len;
    const char *id; // TOOL_BEGIN: "call_...", NUL-terminated; else NULL
};

struct sp_chat_parser;

/* A parser for one generated message; owned by the caller. opts->tools, if
 * set, must outlive it. */
enum sp_status sp_chat_parser_new(const struct sp_chat_parse_opts *opts, struct sp_chat_parser **out);
void sp_chat_parser_free(struct sp_chat_parser *p);

/* Adds generated text; the events it completes replace the previous ones.
 * SP_ERR_STATE after finish, SP_ERR_NOMEM when out of memory. */
enum sp_status sp_chat_parser_push(struct sp_chat_parser *p, const char *text, size_t len);

/* The end of the text: emits everything still held back (see the header
 * comment for malformed output). Its events replace the previous ones. */
enum sp_status sp_chat_parser_finish(struct sp_chat_parser *p);

/* The events of the last push or finish, in order; borrowed until the next
 * push, finish or free. */
const struct sp_chat_event *sp_chat_parser_events(const struct sp_chat_parser *p, size_t *n);

/* Tool calls begun so far: non-zero means finish_reason "tool_calls". */
int sp_chat_parser_tool_calls(const struct sp_chat_parser *p);

struct sp_chat_tool_call {
    char id[32];
    char *name;              // owned
    struct sp_buf arguments; // JSON text (owned)
};

/* A whole message. A buffer whose data is NULL had no such part. */
struct sp_chat_result {
    struct sp_buf content;
    struct sp_buf reasoning;
    struct sp_chat_tool_call *tool_calls; // owned array
    size_t n_tool_calls;
};

/* Parses a complete text: push, finish, and the events gathered into *out
 * (the caller frees it with sp_chat_result_free, even after an error). */
enum sp_status sp_chat_parse(const struct sp_chat_parse_opts *opts, const char *text, size_t len,
                             struct sp_chat_result *out);

/* Adds events to a result (zero-initialize it first): what sp_chat_parse
 * does, usable on streamed events too. */
enum sp_status sp_chat_result_add(struct sp_chat_result *r, const struct sp_chat_event *ev, size_t n);
void sp_chat_result_free(struct sp_chat_result *r);

#endif
