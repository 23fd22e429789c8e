/*
 * model_text.h - a model's tokenizer and chat template wherever the model
 * keeps them: a folder's tokenizer.json, tokenizer_config.json and
 * chat_template.jinja (tokenizer.h, chat.h), or a GGUF file's metadata
 * (format/gguf_vocab.h).
 *
 *     if (sp_model_has_tokenizer(m->files->dir)) sp_model_tokenizer_load(m->files->dir, &tok);
 *     sp_model_chat_template_load(m->files->dir, NULL, &ct);
 */
#ifndef SP_RUNTIME_MODEL_TEXT_H
#define SP_RUNTIME_MODEL_TEXT_H

#include <stdbool.h>

#include "core/status.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

/* Whether model (a folder, a tokenizer.json, or a GGUF file) has a
 * tokenizer to load: a folder's tokenizer.json, or a GGUF's vocabulary. */
bool sp_model_has_tokenizer(const char *model);
/* sp_tokenizer_load, or a GGUF's vocabulary. */
enum sp_status sp_model_tokenizer_load(const char *model, struct sp_tokenizer **out);
/* sp_chat_template_load, or a GGUF's tokenizer.chat_template (a name's
 * tokenizer.chat_template.NAME) with its bos and eos tokens' texts. */
enum sp_status sp_model_chat_template_load(const char *model, const char *name, struct sp_chat_template **out);

#endif
