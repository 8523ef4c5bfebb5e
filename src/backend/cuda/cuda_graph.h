/* Decode steps recorded as CUDA graphs (backend.h's graph_replay /
 * graph_record_begin / graph_record_end, backend_cuda.c; docs/gpu-notes.md
 * "Decode steps on the device"). The launches are captured from the
 * calling thread's default stream, so the kernels must be built with
 * `nvcc --default-stream per-thread`: capture does not accept the legacy
 * default stream, and without the flag cuda_graph_begin fails (the steps
 * then run eagerly). */
#ifndef DI_BACKEND_CUDA_GRAPH_H
#define DI_BACKEND_CUDA_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"

/* Starts capturing this thread's default stream (relaxed mode). */
di_status cuda_graph_begin(di_err *err);
/* Ends the capture and instantiates it into *exec (a cudaGraphExec_t). */
di_status cuda_graph_end(void **exec, di_err *err);
di_status cuda_graph_launch(void *exec, di_err *err);
void cuda_graph_free(void *exec);

/* Counts of the CUDA backend (backend_cuda.c, DI_CUDA_GRAPH=1): decode
 * steps recorded, replayed, and keys given up on (a recording failed). */
typedef struct di_backend di_backend;
void di_backend_cuda_graph_stats(const di_backend *be, long *recorded, long *replayed,
                                 long *failed);

#ifdef __cplusplus
}
#endif

#endif
