/* hostir's implementation inside the Python package: the library itself,
   built from the repository's headers (not a copy), plus the few entry
   points whose C signatures take structs; hostir/__init__.py calls the rest
   of the C API directly through ctypes. Built by setup.py as the extension
   module hostir._native (with CUDA and NCCL where they are found), or by
   `make test` as a plain shared library (HOSTIR_PY_PLAIN). */
#ifndef HOSTIR_PY_PLAIN
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python asks */
#endif
#ifdef HOSTIR_PY_NCCL
#define HOSTIR_CUDA
#define HOSTIR_IMPLEMENTATION
#define HOSTIR_NCCL_IMPLEMENTATION
#include "hostir_nccl.h"
#else
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define HOSTIR_IMPLEMENTATION
#include "hostir.h"
#endif
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define HX_EXPORT __attribute__((visibility("default")))
#else
#define HX_EXPORT
#endif

/* What ctypes checks before trusting its mirror of hir_tensor. */
HX_EXPORT int hx_tensor_bytes(void) { return (int)sizeof(hir_tensor); }
HX_EXPORT int hx_has_cuda(void) {
#ifdef HOSTIR_PY_NCCL
  return 1;
#else
  return 0;
#endif
}

/* hir_lower with the stream options a Python caller sets (schedule 0
   linear, 1 ring, 2 collective: `parts` parts as collectives (0: 2), 3
   gather: the P2P allgathers first, a ring, and their readers whole, 4
   split: a ring whose gathered GEMMs compute half their columns in it and
   the other half after it);
   automatic = 1 lets the cost model choose for these input shapes on `comm`. */
HX_EXPORT hir_status hx_lower(const hir_fusion *f, int my_device, int schedule, int parts, int bounded_buffers,
                              int serial, int automatic, const hir_comm *comm, const hir_tensor *shapes, int nshapes,
                              hir_program **out) {
  hir_lower_desc d;
  memset(&d, 0, sizeof d);
  d.my_device = my_device;
  d.comm = comm;
  d.stream.schedule = serial ? HIR_SCHEDULE_SERIAL
                    : schedule == 2 ? HIR_SCHEDULE_COLLECTIVE
                    : schedule == 1 || schedule >= 3 ? HIR_SCHEDULE_RING : HIR_SCHEDULE_LINEAR;
  d.stream.parts = serial ? 0 : parts;
  d.stream.gather_first = schedule == 3;
  d.stream.experimental.column_parts = schedule == 4 ? 2 : 0;
  d.stream.bounded_buffers = bounded_buffers;
  d.stream.automatic = automatic;
  d.stream.input_shapes = shapes;
  d.stream.ninput_shapes = nshapes;
  return hir_lower(f, &d, out);
}

/* hir_evaluator_create; backend NULL: the CPU backend (the evaluator's own). */
HX_EXPORT hir_status hx_evaluator_create(const hir_program *p, hir_backend *backend, hir_comm *comm, int number_of_streams,
                                         int timeout_ms, int graph, hir_evaluator **out) {
  hir_eval_desc d;
  memset(&d, 0, sizeof d);
  d.backend = backend;
  d.comm = comm;
  d.number_of_streams = number_of_streams;
  d.timeout_ms = timeout_ms;
  d.graph = graph;
  return hir_evaluator_create(p, &d, out);
}

/* hir_tuner_create: the candidates measured on these ranks; iters 0: each
   fills about 10 ms, else warmup 2 and `iters` timed runs. */
HX_EXPORT hir_status hx_tuner_create(const hir_fusion *f, int my_device, hir_backend *backend, hir_comm *comm, int timeout_ms,
                                     int iters, int graph, hir_tuner **out) {
  hir_tune_desc d;
  memset(&d, 0, sizeof d);
  d.lower.my_device = my_device;
  d.lower.comm = comm;
  d.eval.backend = backend;
  d.eval.comm = comm;
  d.eval.timeout_ms = timeout_ms;
  d.eval.graph = graph;
  d.warmup = iters ? 2 : 0;
  d.iters = iters;
  return hir_tuner_create(f, &d, out);
}

HX_EXPORT const char *hx_comm_error(const hir_comm *c) { return c ? c->error : "out of memory"; }
HX_EXPORT const char *hx_version(void) { return HOSTIR_VERSION; }
/* A rank that failed outside hostir (a Python exception) tells the others at once, as a failing C rank does. */
HX_EXPORT void hx_comm_abort(hir_comm *c, const char *why) {
  if (!c || !c->abort) return;
  snprintf(c->error, sizeof c->error, "%s", why);
  c->abort(c);
}
HX_EXPORT int hx_comm_copy_engine(const hir_comm *c) { return c && c->p2p_copy_engine; }

#ifdef HOSTIR_PY_NCCL
/* NCCL's id for a new world, made on one rank (128 bytes into `out`); the
   caller hands it to the others over its own process group. 0 on success. */
HX_EXPORT int hx_nccl_unique_id(unsigned char *out) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  memcpy(out, &id, sizeof id);
  return 0;
}
HX_EXPORT int hx_nccl_id_bytes(void) { return (int)sizeof(ncclUniqueId); }
/* 1 if a CUDA stream is capturing a graph, or its state cannot be read:
   hostir.torch's C++ path leaves such a call to the Python path. */
HX_EXPORT int hx_stream_capturing(void *stream) {
  enum cudaStreamCaptureStatus status;
  return cudaStreamIsCapturing((cudaStream_t)stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}
HX_EXPORT hir_status hx_nccl_comm_from_id(int rank, int size, int gpu, const unsigned char *id_bytes, int timeout_ms,
                                          hir_comm **out) {
  ncclUniqueId id;
  memcpy(&id, id_bytes, sizeof id);
  return hir_nccl_comm_create_from_id(rank, size, gpu, &id, timeout_ms, out);
}
#endif

#ifndef HOSTIR_PY_PLAIN
static struct PyModuleDef hx_module = {PyModuleDef_HEAD_INIT, "_native", "hostir's C library (called through ctypes)", -1,
                                       NULL, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&hx_module); }
#endif
