/* routing.h - the routing counts file: how many tokens each routed expert of
 * each MoE layer took in a run (--record-routing), read back to place the
 * experts over ranks by that load (--expert-load).
 *
 * The file is JSON:
 *   {"model_type": "bailing_moe", "layers": 32, "experts": 256,
 *    "experts_per_token": 8, "tokens": 4096,
 *    "counts": [null, [12, 0, 31, ...], ...]}
 * counts holds a row a layer: null for a layer without routed experts, else
 * one whole number an expert (the tokens routed to it). tokens is the
 * tokens of the first MoE layer's row (its sum over experts_per_token). */
#ifndef SP_RUNTIME_ROUTING_H
#define SP_RUNTIME_ROUTING_H

#include <stdint.h>

#include "core/status.h"

struct sp_model;

/* Writes counts (n_layers x n_experts, layer-major, sp_ctx_route_counts)
 * of model m to path (through a temporary file and a rename). */
enum sp_status sp_routing_write(const char *path, const struct sp_model *m, const uint64_t *counts);

/* Reads path's counts for model m as an expert load for
 * sp_ctx_params.expert_load (n_layers x n_experts doubles, freed with
 * sp_free). A file of another shape (layers, experts, a MoE layer's row
 * missing), or one that is not such a file, is an error naming the file
 * and what was wrong. */
enum sp_status sp_routing_read(const char *path, const struct sp_model *m, double **load);

#endif
