/*
 * gguf_vocab.h - a GGUF model's tokenizer as text: its metadata's vocabulary
 * as the tokenizer.json and tokenizer_config.json Hugging Face's converter
 * makes of it (for sp_tokenizer_load_mem), and its chat template.
 *
 *     char *json, *config;
 *     size_t jl, cl;
 *     if (sp_gguf_tokenizer_json(f, &json, &jl, &config, &cl) == SP_OK)
 *         sp_tokenizer_load_mem(json, jl, config, cl, &tok);
 *
 * tokenizer.ggml.model "llama" (SentencePiece BPE with byte fallback, as
 * Llama 1/2, Mistral v1 and TinyLlama ship it): every split of a normal
 * piece into two normal pieces is a merge ranked by the merged piece's
 * score; unknown and control pieces are special added tokens, user-defined
 * ones plain added tokens; normalizer Prepend("▁") + Replace(" " -> "▁"),
 * decoder Replace / ByteFallback / Fuse / Strip. add_bos_token and
 * add_eos_token from tokenizer.ggml.add_bos_token / add_eos_token
 * (default: bos yes, eos no, as llama.cpp has it for this model); the
 * config also holds tokenizer.chat_template where there is one.
 *
 * tokenizer.ggml.model "gpt2" (byte-level BPE, as Qwen2/2.5/3 and Llama 3
 * GGUFs hold it): the pieces and tokenizer.ggml.merges as the model, the
 * pre-tokenizer that tokenizer.ggml.pre names ("qwen2": Qwen's Split regex
 * and an NFC normalizer; "llama-bpe": Llama 3's regex and ignore_merges;
 * "gpt-4o": gpt-oss's o200k regex and ignore_merges)
 * followed by ByteLevel, a ByteLevel decoder; control pieces special added
 * tokens, user-defined ones plain added tokens, unused ones ("[PAD<id>]")
 * left out. bos / eos / add_bos_token as the keys say (default: none, as
 * llama.cpp has it for these). Other models and pre-tokenizers are
 * refused, naming the key and value.
 */
#ifndef SP_FORMAT_GGUF_VOCAB_H
#define SP_FORMAT_GGUF_VOCAB_H

#include <stddef.h>

#include "core/status.h"

struct sp_gguf_file;

/* *json and *config are owned by the caller (sp_free). */
enum sp_status sp_gguf_tokenizer_json(const struct sp_gguf_file *f, char **json, size_t *json_len, char **config,
                                      size_t *config_len);

/* The chat template called name (NULL or "default": tokenizer.chat_template,
 * else tokenizer.chat_template.NAME; SP_ERR_NOT_FOUND naming the key where
 * f has none) and the texts of its bos and eos tokens (NULL where f names
 * none), each NUL-terminated and owned (sp_free). */
enum sp_status sp_gguf_chat_template(const struct sp_gguf_file *f, const char *name, char **src, char **bos,
                                     char **eos);

#endif
