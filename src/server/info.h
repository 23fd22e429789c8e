/*
 * info.h - the body of GET /v1/sparrow/info: what the server knows about
 * the model it serves and how it holds it, as one JSON object (for the
 * built-in web page and for scripts; /v1/models stays as OpenAI clients
 * expect it). It carries the model id and architecture, the device and
 * kernel set, the context and slots, the memory plan the model was loaded
 * with (sp_plan_write_json: strategy, resident weight bytes, expert cache
 * budget, ...), and live memory figures: resident set, KV cache, heap, and
 * the expert cache's fill and hit counters when one is in use (null without
 * one, and until the first forward step reports them, as in /metrics).
 *
 *     struct sp_info_src src = {.model_id = "qwen3", .engine = e, .info = &info,
 *                               .plan = &plan, .device = "cpu", .kernels = "avx2"};
 *     sp_info_json(&src, &buf);
 */
#ifndef SP_SERVER_INFO_H
#define SP_SERVER_INFO_H

#include "core/buf.h"
#include "runtime/engine.h"
#include "runtime/plan.h"

/* Everything borrowed for the call. */
struct sp_info_src {
    const char *model_id;
    struct sp_engine *engine;           // for its parameters and live counters
    const struct sp_engine_info *info;  // the model's facts (sp_engine_info)
    const struct sp_plan *plan;         // NULL: reported as null
    const char *device, *kernels;       // NULL: reported as null
};

/* Appends the JSON object to out. */
void sp_info_json(const struct sp_info_src *src, struct sp_buf *out);

#endif
