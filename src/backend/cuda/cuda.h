/*
 * cuda.h - the CUDA backend (backend.h): every op on one NVIDIA GPU, with
 * the batch tensors, the KV cache and device copies of the weights in its
 * memory. Built with `make CUDA=1`; plain C, no CUDA header.
 *
 *     struct sp_backend *be;
 *     if (sp_backend_create(SP_DEVICE_CUDA, &params, &be) != SP_OK) puts(sp_error_msg());  // "no CUDA device ..."
 *     be->ops->prepare(be, &linear);   // its codes, scales and biases copied to the GPU once
 *     ...
 *     if (be->ops->error(be) != SP_OK) ...  // a launch or copy that failed in an op
 *
 * Work is queued on one stream in call order; host, logits and sync wait
 * for it. Weights in the CPU's interleaved layout (sp_qmat.interleaved) are
 * refused: load them in row order (--row-order, which --device cuda
 * implies). Index arrays an op takes (tokens, positions, rows) are copied
 * up by the op from pageable memory, so the caller may reuse them as soon
 * as it returns. With p.graphs, a step of up to 64 tokens is recorded from
 * ops->embed to its first wait and replayed as a CUDA graph. Unless
 * p.no_overlap, kernels are launched to start while the one before them
 * ends (programmatic dependent launch, compute capability 9.0 on); the
 * setting is the process's, the last backend created sets it.
 */
#ifndef SP_BACKEND_CUDA_CUDA_H
#define SP_BACKEND_CUDA_CUDA_H

#include "backend/backend.h"

extern const struct sp_backend_ops sp_cuda_backend_ops;

/* A backend on the process's current CUDA device (device 0 unless the
 * process chose another); no device, or one that cannot be used, is an
 * error that says why. */
enum sp_status sp_cuda_backend_create(const struct sp_backend_params *p, struct sp_backend **out);
/* Bytes of the device KV cache for p. */
size_t sp_cuda_kv_bytes(const struct sp_backend_params *p);
/* Device bytes reserved besides the KV cache, the tensors asked of it and
 * the weights: MLP, logits and index buffers, RoPE tables. */
size_t sp_cuda_work_bytes(const struct sp_backend_params *p);
/* sp_backend_mem_info for the CUDA device. */
enum sp_status sp_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* sp_backend_copy_gbs for the CUDA device. */
enum sp_status sp_cuda_copy_gbs(size_t bytes, double *gbs);

#endif
