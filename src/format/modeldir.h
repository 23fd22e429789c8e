/*
 * modeldir.h - a model as users have it on disk: a folder with config.json
 * and safetensors (one file, or shards named by model.safetensors.index.json),
 * or a Hugging Face id "org/name" resolved in the Hugging Face cache the way
 * `hf download` lays it out.
 *
 *     struct sp_model_files *mf;
 *     if (sp_model_files_open("Qwen/Qwen3-30B-A3B", &mf) != SP_OK) puts(sp_error_msg());
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
    char *dir;  // the resolved folder; owned
    cJSON *config;  // config.json; owned
    struct sp_st_file **shards;  // (n_shards); owned
    int n_shards;
    int64_t n_tensors;  // over all shards
    struct sp_strmap by_name;  // tensor name -> shard << 32 | index in shard
    size_t total_bytes;  // sum of the shard file sizes
};

/* Turns a folder path or "org/name[@revision]" into a folder (owned). The
 * error for a missing model says every place that was looked at. */
enum sp_status sp_model_resolve(const char *spec, char **dir);
/* The Hugging Face hub cache folder: $HF_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (owned). */
char *sp_hf_hub_cache(void);

enum sp_status sp_model_files_open(const char *spec, struct sp_model_files **out);
void sp_model_files_close(struct sp_model_files *mf);
const struct sp_st_tensor *sp_model_files_find(const struct sp_model_files *mf, const char *name);

#endif
