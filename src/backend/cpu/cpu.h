/*
 * cpu.h - the CPU backend (backend.h): the ops over a pool of threads,
 * products from the kernel set of kernels.h, attention as an online
 * softmax over a KV cache laid out for it, and batches of gated MLPs split
 * in pieces that threads take as they come free.
 *
 *     struct sp_backend *be;
 *     sp_backend_create(SP_DEVICE_CPU, &params, &be);   // backend.h
 *
 * The kernel set is the process's (sp_kernels()); the same weights give a
 * token the same bits in any batch, chunk or thread count.
 */
#ifndef SP_BACKEND_CPU_CPU_H
#define SP_BACKEND_CPU_CPU_H

#include "backend/backend.h"

extern const struct sp_backend_ops sp_cpu_backend_ops;

enum sp_status sp_cpu_backend_create(const struct sp_backend_params *p, struct sp_backend **out);
/* Bytes of the KV cache for p (keys and values of every layer, sequence
 * and KV head, positions rounded up to whole blocks). */
size_t sp_cpu_kv_bytes(const struct sp_backend_params *p);
/* Bytes the backend reserves besides the KV cache and the tensors asked
 * of it: MLP and attention buffers, per-thread scratch for products of
 * weights up to `widest`, tables. */
size_t sp_cpu_work_bytes(const struct sp_backend_params *p, const struct sp_qmat *widest);

#endif
