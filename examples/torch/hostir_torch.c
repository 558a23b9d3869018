/* hostir driven from PyTorch: a small shared library that
   examples/torch/torch_dlpack.py loads with ctypes. Tensors cross as DLPack
   (torch.utils.dlpack), views both ways, no copies: torch's tensors go in
   through hir_tensor_from_dlpack, and the output comes back either written
   into a torch tensor or as hostir's own buffer through hir_tensor_to_dlpack.
   The program is the AG+GEMM of examples/main.c; one process per GPU, so the
   Python script runs under torchrun, and PyTorch's process group hands
   hostir NCCL's id. Built by the script (it needs dlpack.h,
   which PyTorch ships):
       cc -shared -fPIC -DHOSTIR_CUDA -include <torch>/include/ATen/dlpack.h ... */
#if !defined(DLPACK_VERSION) && !defined(DLPACK_MAJOR_VERSION)
#include <dlpack/dlpack.h> /* where it is installed on its own */
#endif
#define HOSTIR_IMPLEMENTATION
#define HOSTIR_NCCL_IMPLEMENTATION
#include "../../hostir_nccl.h"
#include <stdlib.h>
#include <string.h>

typedef struct hx {
  hir_comm *comm;
  hir_backend *be;
  hir_fusion *f;
  hir_program *p;
  hir_evaluator *ev;
  hir_tensor out; /* the last run's output when hostir owns it */
  int device;
  char error[600];
} hx;

static int hx_fail(hx *h, const char *what, const char *why) {
  snprintf(h->error, sizeof h->error, "%s: %s", what, why);
  return 0;
}

/* NCCL's id for a new world, made on one rank (`out`: 128 bytes); the
   caller hands it to every rank (torch.distributed.broadcast_object_list),
   so hostir needs no port of its own. 0 on success. */
int hx_unique_id(unsigned char *out) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  memcpy(out, &id, sizeof id);
  return 0;
}

/* Joins the world from that id (once per process: one communicator serves
   every program), with hostir's work on `cuda_stream` (torch's current
   stream), so it is ordered with the caller's torch work. Returns NULL only
   when out of memory; else check hx_error. */
hx *hx_create(int rank, int size, int local_rank, const unsigned char *id_bytes, void *cuda_stream) {
  hx *h = (hx *)calloc(1, sizeof *h);
  ncclUniqueId id;
  if (!h) return NULL;
  if (size > 64) return hx_fail(h, "hx_create", "more than 64 ranks"), h;
  memcpy(&id, id_bytes, sizeof id);
  if (hir_nccl_comm_create_from_id(rank, size, local_rank, &id, 60000, &h->comm) != HIR_OK)
    return hx_fail(h, "hir_nccl_comm_create_from_id", h->comm ? h->comm->error : "out of memory"), h;
  cudaGetDevice(&h->device);
  if (!(h->be = hir_backend_cuda_create(h->device))) return hx_fail(h, "hir_backend_cuda_create", "no GPU"), h;
  hir_backend_cuda_set_stream(h->be, cuda_stream);
  return h;
}

/* The program C = allgather(A) x B in f32 (bf16 = 0) or bf16, replacing the
   last one. 0 on success. */
int hx_program(hx *h, int bf16) {
  hir_lower_desc ld;
  hir_eval_desc ed;
  hir_tv *ta, *tb, *tc;
  hir_dtype dt = bf16 ? HIR_BF16 : HIR_F32;
  int mesh[64], i;
  if (!h->comm || !h->be) return 1; /* hx_create said why */
  hir_evaluator_free(h->ev);
  hir_program_free(h->p);
  hir_fusion_free(h->f);
  h->ev = NULL, h->p = NULL;
  memset(&ld, 0, sizeof ld);
  memset(&ed, 0, sizeof ed);
  h->f = hir_fusion_create();
  ta = hir_input(h->f, dt, 3), tb = hir_input(h->f, dt, 2), tc = hir_matmul(h->f, ta, tb);
  for (i = 0; i < h->comm->size; i++) mesh[i] = i;
  hir_output(h->f, tc); /* A [DIDx, M/D, K] x B [K, N] -> C [Stream, M/D, N] */
  hir_set_mesh(ta, h->comm->size, mesh);
  hir_set_mesh(tb, h->comm->size, mesh);
  hir_set_mesh(tc, h->comm->size, mesh);
  hir_parallelize(ta, 0, HIR_DIDX);
  hir_parallelize(tc, 0, HIR_STREAM);
  if (hir_fusion_status(h->f) != HIR_OK) return !hx_fail(h, "the fusion", hir_fusion_error(h->f));
  ld.my_device = h->comm->rank;
  if (hir_lower(h->f, &ld, &h->p) != HIR_OK) return !hx_fail(h, "hir_lower", h->p ? hir_program_error(h->p) : "out of memory");
  ed.backend = h->be;
  ed.comm = h->comm;
  if (hir_evaluator_create(h->p, &ed, &h->ev) != HIR_OK)
    return !hx_fail(h, "hir_evaluator_create", h->ev ? hir_evaluator_error(h->ev) : "out of memory");
  return 0;
}

const char *hx_error(const hx *h) { return h ? h->error : "out of memory"; }

/* a: this rank's rows [1, M/D, K]; b: [K, N]; c: [D, M/D, N], or NULL for
   hostir's own buffer (then take it with hx_output). 0 on success. */
int hx_run(hx *h, const DLManagedTensor *a, const DLManagedTensor *b, const DLManagedTensor *c) {
  hir_tensor in[2];
  char err[512];
  if (!h->ev) return h->error[0] ? 1 : (hx_fail(h, "hx_run", "no program: call hx_program first"), 1);
  h->error[0] = 0;
  if (hir_tensor_from_dlpack(&a->dl_tensor, &in[0], err, sizeof err) != HIR_OK) return hx_fail(h, "A", err), 1;
  if (hir_tensor_from_dlpack(&b->dl_tensor, &in[1], err, sizeof err) != HIR_OK) return hx_fail(h, "B", err), 1;
  memset(&h->out, 0, sizeof h->out);
  if (c && hir_tensor_from_dlpack(&c->dl_tensor, &h->out, err, sizeof err) != HIR_OK) return hx_fail(h, "C", err), 1;
  if (hir_run(h->ev, in, 2, &h->out, 1) != HIR_OK) return hx_fail(h, "hx_run", hir_evaluator_error(h->ev)), 1;
  return 0;
}

/* The last run's output as a DLManagedTensor borrowing hostir's buffer
   (valid until the next hx_run or hx_free); NULL on failure. */
DLManagedTensor *hx_output(hx *h) {
  DLManagedTensor *m = NULL;
  if (!h->out.data || hir_tensor_to_dlpack(&h->out, kDLCUDA, h->device, &m) != HIR_OK) return NULL;
  return m;
}

/* Waits for the run under the evaluator's deadline; 0 on success. */
int hx_sync(hx *h) { return h->ev && hir_evaluator_sync(h->ev) == HIR_OK ? 0 : (hx_fail(h, "hir_evaluator_sync", h->ev ? hir_evaluator_error(h->ev) : "no evaluator"), 1); }

void hx_free(hx *h) {
  if (!h) return;
  hir_evaluator_free(h->ev);
  hir_program_free(h->p);
  hir_fusion_free(h->f);
  hir_backend_free(h->be);
  hir_nccl_comm_free(h->comm);
  free(h);
}
