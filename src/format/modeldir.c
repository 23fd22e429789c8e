/* modeldir.c - model folders, the Hugging Face cache, sharded safetensors. */
#include "format/modeldir.h"

#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/file.h"
#include "core/json.h"
#include "format/gguf_model.h"

#define MAX_CONFIG_BYTES ((size_t)16 << 20)
#define MAX_INDEX_BYTES ((size_t)256 << 20)

/* "org/name" with exactly one slash and no path tricks. */
static bool looks_like_hf_id(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/')) return false;
    if (s[0] == '.' || slash[1] == '.') return false;
    return true;
}

/* Reads refs/<ref> (a commit hash) of a cached repo; NULL if absent. */
static char *read_ref(const char *repo_dir, const char *ref) {
    struct sp_buf p = SP_BUF_INIT;
    sp_buf_printf(&p, "%s/refs/%s", repo_dir, ref);
    char *text = NULL;
    size_t len = 0;
    if (p.data && sp_read_file(p.data, 4096, &text, &len) != SP_OK) text = NULL;
    sp_buf_free(&p);
    sp_error_clear();
    if (!text) return NULL;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) text[--len] = 0;
    if (!len || strchr(text, '/')) {
        sp_free(text);
        return NULL;
    }
    return text;
}

enum sp_status sp_model_resolve(const char *spec, const char *hub, char **dir) {
    *dir = NULL;
    if (sp_path_is_dir(spec) || sp_gguf_model_file(spec)) {
        *dir = sp_strdup(spec, SP_MEM_MISC);
        return *dir ? SP_OK : sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    if (sp_gguf_model_path(spec)) {
        const char *what = sp_path_not_file(spec);
        return sp_errorf(SP_ERR_NOT_FOUND, "model file %s: %s", spec, what ? what : "not a regular file");
    }
    char *id = sp_strdup(spec, SP_MEM_MISC);
    if (!id) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    const char *revision = "main";
    char *at = strchr(id, '@');
    if (at) {
        *at = 0;
        revision = at + 1;
    }
    if (!looks_like_hf_id(id) || !*revision || strchr(revision, '/') || !hub) {
        enum sp_status st = sp_errorf(SP_ERR_NOT_FOUND, "model \"%s\" not found: no such folder%s", spec,
                                      hub ? ", and it is not a Hugging Face id of the form org/name" : "");
        sp_free(id);
        return st;
    }
    struct sp_buf repo = SP_BUF_INIT, snap = SP_BUF_INIT;
    sp_buf_printf(&repo, "%s/models--", hub);
    for (const char *c = id; *c; c++) {
        if (*c == '/')
            sp_buf_puts(&repo, "--");
        else
            sp_buf_putc(&repo, *c);
    }
    enum sp_status st = SP_OK;
    char *rev = read_ref(repo.data, revision);
    if (rev) {
        sp_buf_printf(&snap, "%s/snapshots/%s", repo.data, rev);
    } else {
        /* A revision may name a commit directly. */
        sp_buf_printf(&snap, "%s/snapshots/%s", repo.data, revision);
    }
    if (!snap.failed && sp_path_is_dir(snap.data)) {
        *dir = sp_buf_take(&snap);
        if (!*dir) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    } else {
        st = sp_errorf(SP_ERR_NOT_FOUND,
                       "model \"%s\" not found: no folder \"%s\"; in the Hugging Face cache %s: %s. "
                       "Download it with `hf download %s`, or pass a folder",
                       spec, spec, hub,
                       !sp_path_is_dir(repo.data) ? "no folder for this repository"
                       : rev                      ? "the snapshot that refs points to is missing"
                                                  : "no refs/ entry or snapshot for this revision",
                       id);
    }
    sp_free(rev);
    sp_buf_free(&repo);
    sp_buf_free(&snap);
    sp_free(id);
    return st;
}

void sp_model_files_close(struct sp_model_files *mf) {
    if (!mf) return;
    for (int i = 0; i < mf->n_shards; i++) sp_st_close(mf->shards[i]);
    sp_free(mf->shards);
    sp_strmap_free(&mf->by_name);
    cJSON_Delete(mf->config);
    sp_free(mf->dir);
    sp_free(mf);
}

/* A shard file name from the index: a plain file name inside the folder. */
static bool safe_shard_name(const char *s) {
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static enum sp_status add_shard(struct sp_model_files *mf, const char *name) {
    char *path = sp_path_join(mf->dir, name);
    if (!path) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    struct sp_st_file *f;
    enum sp_status st = sp_st_open(path, &f);
    sp_free(path);
    if (st != SP_OK) return st;
    return sp_model_files_add(mf, f);
}

enum sp_status sp_model_files_add(struct sp_model_files *mf, struct sp_st_file *f) {
    enum sp_status st;
    struct sp_st_file **v = mf->shards ? sp_realloc(mf->shards, (size_t)(mf->n_shards + 1) * sizeof *v)
                                       : sp_malloc(sizeof *v, SP_MEM_MODEL);
    if (!v) {
        sp_st_close(f);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    mf->shards = v;
    int si = mf->n_shards++;
    mf->shards[si] = f;
    mf->total_bytes += f->map.size;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const char *tn = f->tensors[i].name;
        int64_t prev;
        if (sp_strmap_get(&mf->by_name, tn, strlen(tn), &prev))
            return sp_errorf(SP_ERR_FORMAT, "tensor %s is in both %s and %s", tn, mf->shards[prev >> 32]->path, f->path);
        st = sp_strmap_put(&mf->by_name, tn, strlen(tn), ((int64_t)si << 32) | i);
        if (st != SP_OK) return st;
        mf->n_tensors++;
    }
    return SP_OK;
}

/* Opens the shards named by model.safetensors.index.json and checks that
 * every tensor of its weight_map is in the shard it names. */
static enum sp_status open_indexed(struct sp_model_files *mf, const char *index_path) {
    cJSON *idx = NULL;
    enum sp_status st = sp_json_parse_file(index_path, MAX_INDEX_BYTES, &idx);
    if (st != SP_OK) return st;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    if (!cJSON_IsObject(wm)) {
        st = sp_errorf(SP_ERR_FORMAT, "%s: \"weight_map\" missing or not an object", index_path);
        goto done;
    }
    struct sp_strmap seen;
    sp_strmap_init(&seen, SP_MEM_MODEL);
    for (const cJSON *e = wm->child; e && st == SP_OK; e = e->next) {
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name in the model folder", index_path,
                           e->string);
            break;
        }
        const char *shard = e->valuestring;
        if (sp_strmap_has(&seen, shard, strlen(shard))) continue;
        char *path = sp_path_join(mf->dir, shard);
        bool exists = path && sp_path_is_file(path);
        sp_free(path);
        if (!exists) {
            st = sp_errorf(SP_ERR_NOT_FOUND, "%s: shard %s (holding tensor %s) is missing from %s", index_path, shard,
                           e->string, mf->dir);
            break;
        }
        st = sp_strmap_put(&seen, shard, strlen(shard), mf->n_shards);
        if (st == SP_OK) st = add_shard(mf, shard);
    }
    for (const cJSON *e = wm->child; e && st == SP_OK; e = e->next) {
        int64_t where, si;
        sp_strmap_get(&seen, e->valuestring, strlen(e->valuestring), &si);
        if (!sp_strmap_get(&mf->by_name, e->string, strlen(e->string), &where) || (where >> 32) != si)
            st = sp_errorf(SP_ERR_FORMAT, "%s: tensor %s should be in %s but is not", index_path, e->string,
                           e->valuestring);
    }
    sp_strmap_free(&seen);
done:
    cJSON_Delete(idx);
    return st;
}

enum sp_status sp_model_files_open(const char *dir, struct sp_model_files **out) {
    *out = NULL;
    struct sp_model_files *mf = sp_calloc(1, sizeof *mf, SP_MEM_MODEL);
    if (!mf) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    sp_strmap_init(&mf->by_name, SP_MEM_MODEL);
    char **names = NULL;
    size_t n_names = 0;
    char *path = NULL;
    enum sp_status st = sp_model_resolve(dir, NULL, &mf->dir);
    if (st != SP_OK) goto fail;
    if (sp_gguf_model_file(mf->dir)) {
        if ((st = sp_gguf_model_open(mf->dir, mf)) != SP_OK) goto fail;
        *out = mf;
        return SP_OK;
    }

    path = sp_path_join(mf->dir, "config.json");
    if (!path) goto nomem;
    const char *what = sp_path_not_file(path);
    if (what && !strcmp(what, "missing")) {
        st = sp_errorf(SP_ERR_NOT_FOUND, "%s: no config.json in the model folder", mf->dir);
        goto fail;
    }
    /* opening a FIFO would block for ever; a loop or a directory is not "no file" */
    if (what) {
        st = sp_errorf(SP_ERR_FORMAT, "%s: config.json is %s, not a file", mf->dir, what);
        goto fail;
    }
    st = sp_json_parse_file(path, MAX_CONFIG_BYTES, &mf->config);
    if (st != SP_OK) goto fail;
    if (!cJSON_IsObject(mf->config)) {
        st = sp_errorf(SP_ERR_FORMAT, "%s: expected a JSON object", path);
        goto fail;
    }
    sp_free(path);

    path = sp_path_join(mf->dir, "model.safetensors.index.json");
    if (!path) goto nomem;
    if (sp_path_is_file(path)) {
        st = open_indexed(mf, path);
    } else {
        st = sp_dir_list(mf->dir, ".safetensors", &names, &n_names);
        if (st == SP_OK && n_names == 0)
            st = sp_errorf(SP_ERR_NOT_FOUND, "%s: no .safetensors files in the model folder", mf->dir);
        for (size_t i = 0; i < n_names && st == SP_OK; i++) st = add_shard(mf, names[i]);
    }
    if (st != SP_OK) goto fail;
    sp_strv_free(names, n_names);
    sp_free(path);
    *out = mf;
    return SP_OK;
nomem:
    st = sp_errorf(SP_ERR_NOMEM, "out of memory");
fail:
    sp_strv_free(names, n_names);
    sp_free(path);
    sp_model_files_close(mf);
    return st;
}

bool sp_model_files_changed(const struct sp_model_files *mf, char *why, size_t cap) {
    char reason[160];
    for (int i = 0; i < mf->n_shards; i++)
        if (sp_map_changed(&mf->shards[i]->map, reason, sizeof reason)) {
            snprintf(why, cap, "%s: %s", mf->shards[i]->path, reason);
            return true;
        }
    return false;
}

const struct sp_st_tensor *sp_model_files_find(const struct sp_model_files *mf, const char *name) {
    int64_t v;
    if (!sp_strmap_get(&mf->by_name, name, strlen(name), &v)) return NULL;
    return &mf->shards[v >> 32]->tensors[v & 0xffffffff];
}
