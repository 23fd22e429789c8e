/*
 * chat.h - a model's chat template: finding it in a model folder, and
 * rendering an OpenAI-style conversation into the prompt text the model
 * was trained on.
 *
 *     struct sp_chat_template *ct;
 *     if (sp_chat_template_load("/models/Qwen3-0.6B", NULL, &ct) != SP_OK) ...
 *     struct sp_chat_request req = {
 *         .messages = messages_json,          // cJSON array of {role, content, ...}
 *         .tools = tools_json,                // cJSON array, or NULL
 *         .add_generation_prompt = true,
 *         .kwargs = kwargs_json,              // cJSON object (enable_thinking, ...) or NULL
 *     };
 *     char *prompt;
 *     size_t len;
 *     if (sp_chat_render(ct, &req, &prompt, &len) != SP_OK)
 *         fprintf(stderr, "error: %s\n", sp_error_msg());
 *     sp_free(prompt);
 *     sp_chat_template_free(ct);
 *
 * The template comes from chat_template.jinja when the folder has one, else
 * from tokenizer_config.json's "chat_template": a string, or a list of
 * {name, template} where "default" is used unless another name is asked for.
 * bos_token and eos_token (strings or {"content": ...} objects) are read from
 * tokenizer_config.json. The variables a template sees are the ones
 * transformers' apply_chat_template passes: messages, tools (none when
 * absent), add_generation_prompt, bos_token / eos_token when known, and every
 * member of kwargs.
 *
 * Strings in struct sp_chat_template are owned by it. The cJSON trees of a
 * request are borrowed for the call.
 *
 * This module lives with the Jinja engine, not with the tokenizer: it needs
 * the special tokens only as text, which it reads from tokenizer_config.json
 * itself, so it depends on template/jinja.h and core/ alone (DESIGN.md §2:
 * tokenizer, template -> core). Turning the rendered text into ids is the
 * caller's next step (sp_tokenizer_encode with SP_TOK_PARSE_SPECIAL).
 */
#ifndef SP_TEMPLATE_CHAT_H
#define SP_TEMPLATE_CHAT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "template/jinja.h"

struct sp_chat_template {
    struct sp_jinja *tmpl;
    char *source;              // the template text
    char *name;                // which named template was chosen ("default" when unnamed)
    char *bos_token;           // NULL when the tokenizer has none
    char *eos_token;           // NULL when the tokenizer has none
    struct sp_jinja_opts opts; // limits and clock used by sp_chat_render
    bool content_parts;        // the template iterates message content itself (takes a list of parts)
};

struct sp_chat_request {
    const cJSON *messages; // array
    const cJSON *tools;    // array, or NULL
    bool add_generation_prompt;
    const cJSON *kwargs; // object of extra template variables, or NULL
    // OpenAI clients send tool-call arguments as JSON text, while templates
    // such as Qwen3-Coder's iterate them as a mapping (`arguments|items`).
    // When set, arguments that are text holding a JSON object are given to
    // the template as that object.
    bool parse_tool_arguments;
    // A null content (OpenAI clients send it beside tool calls) becomes ""
    // rather than None, which most templates cannot concatenate.
    bool null_content_as_empty;
    // For a template that expects content as a string (content_parts false),
    // content given as a list of text parts becomes the texts joined by "\n".
    bool flatten_content_parts;
};

/* Loads the chat template of a model folder. name selects one of several
 * named templates (NULL: "default"); asking for a name the folder does not
 * have is SP_ERR_NOT_FOUND. *out is owned by the caller. */
enum sp_status sp_chat_template_load(const char *model_dir, const char *name, struct sp_chat_template **out);

/* A template from text, with optional bos/eos tokens (copied). */
enum sp_status sp_chat_template_from_string(const char *src, size_t len, const char *bos_token, const char *eos_token,
                                            struct sp_chat_template **out);

/* Sets (*ct)->name to a copy of name; where that fails, frees *ct and sets it NULL. */
enum sp_status sp_chat_template_name(struct sp_chat_template **ct, const char *name);

void sp_chat_template_free(struct sp_chat_template *ct);

/* Renders a conversation. *out is owned by the caller (sp_free). Errors are
 * those of sp_jinja_render, plus SP_ERR_ARG for a request whose messages
 * are not an array or whose kwargs are not an object. */
enum sp_status sp_chat_render(const struct sp_chat_template *ct, const struct sp_chat_request *req, char **out,
                              size_t *out_len);

#endif
