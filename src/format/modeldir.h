/*
 * modeldir.h - a model as users have it on disk: a folder with config.json
 * and safetensors (one file, or shards named by model.safetensors.index.json),
 * or a Hugging Face id "org/name" resolved to such a folder in the Hugging
 * Face cache the way `hf download` lays it out; or a GGUF file, opened as
 * such a folder would be (gguf_model.h).
 *
 *     char *dir;
 *     if (sp_model_resolve("Qwen/Qwen3-30B-A3B", settings.hf_hub_cache, &dir) != SP_OK) ...
 *     struct sp_model_files *mf;
 *     if (sp_model_files_open(dir, &mf) != SP_OK) puts(sp_error_msg());
 *     const struct sp_st_tensor *t = sp_model_files_find(mf, "lm_head.weight");
 *     sp_model_files_close(mf);
 *
 * Opening parses every shard header (strictly; see safetensors.h) and maps
 * the files, but reads no tensor data. Tensor pointers are borrowed from mf.
 */
#ifndef SP_FORMAT_MODELDIR_H
#define SP_FORMAT_MODELDIR_H

#include <cjson/cJSON.h>

#include "core/status.h"
#include "core/strmap.h"
#include "format/safetensors.h"

struct sp_model_files {
    char *dir;  // the resolved folder (or GGUF file); owned
    cJSON *config;  // config.json (a GGUF's metadata as one); owned
    struct sp_st_file **shards;  // (n_shards); owned
    int n_shards;
    int64_t n_tensors;  // over all shards
    struct sp_strmap by_name;  // tensor name -> shard << 32 | index in shard
    size_t total_bytes;  // sum of the shard file sizes
};

/* Whether a shard's file changed since it was mapped (sp_map_changed):
 * why gets "<path>: <reason>" for the first that did. */
bool sp_model_files_changed(const struct sp_model_files *mf, char *why, size_t cap);

/* Turns a folder path, or "org/name[@revision]" looked up in the Hugging
 * Face hub cache folder `hub` (sp_settings.hf_hub_cache; NULL: folders
 * only), into a folder (owned). The error for a missing model says every
 * place that was looked at. */
enum sp_status sp_model_resolve(const char *spec, const char *hub, char **dir);

/* Opens the model folder dir (a Hugging Face id is resolved first: sp_model_resolve). */
enum sp_status sp_model_files_open(const char *dir, struct sp_model_files **out);
/* Adds an open shard to mf (taking it: closed on failure); its tensor
 * names must be new to mf. */
enum sp_status sp_model_files_add(struct sp_model_files *mf, struct sp_st_file *f);
void sp_model_files_close(struct sp_model_files *mf);
const struct sp_st_tensor *sp_model_files_find(const struct sp_model_files *mf, const char *name);

#endif
