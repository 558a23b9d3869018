#include "test.h"

/* DLPack interop: DLTensors in (explicit row-major strides as PyTorch
   gives them, a byte offset, bf16 codes), a matmul run on them without
   copies, its output out as a DLManagedTensor read through its own strides;
   a transposed view, computed through its strides; the refusals. */
TEST(test_dlpack_roundtrip, "dlpack/roundtrip", TEST_CPU) {
  enum { M = 3, K = 4, N = 2 };
  float a[M * K], b[K * N + 1], want[M * N];
  int64_t a_shape[2] = {M, K}, a_strides[2] = {K, 1}, t_strides[2] = {1, M}, b_shape[2] = {K, N};
  DLTensor da, db, bad;
  DLManagedTensor *dc = NULL;
  hir_tensor in[2], out;
  hir_fusion *f = hir_fusion_create();
  hir_program *p = NULL;
  hir_evaluator *ev = NULL;
  char err[256];
  int i, k, r;
  hir_tv *ta = hir_input(f, HIR_F32, 2), *tb = hir_input(f, HIR_F32, 2);
  hir_output(f, hir_matmul(f, ta, tb));
  for (i = 0; i < M * K; i++) a[i] = (float)(i * 37 % 11) - 5.0f;
  for (i = 0; i < K * N + 1; i++) b[i] = (float)(i * 13 % 7) - 3.0f;
  for (i = 0; i < M; i++)
    for (k = 0; k < N; k++) {
      double s = 0;
      for (r = 0; r < K; r++) s += (double)a[i * K + r] * b[1 + r * N + k]; /* B starts one float in */
      want[i * N + k] = (float)s;
    }
  memset(&da, 0, sizeof da);
  da.data = a;
  da.device.device_type = kDLCPU;
  da.ndim = 2;
  da.dtype.code = kDLFloat, da.dtype.bits = 32, da.dtype.lanes = 1;
  da.shape = a_shape;
  da.strides = a_strides;
  db = da;
  db.data = b;
  db.shape = b_shape;
  db.strides = NULL;
  db.byte_offset = sizeof(float);
  CHECK(hir_tensor_from_dlpack(&da, &in[0], err, sizeof err) == HIR_OK && in[0].data == (void *)a &&
        in[0].strides[0] == K && in[0].strides[1] == 1);
  CHECK(hir_tensor_from_dlpack(&db, &in[1], err, sizeof err) == HIR_OK && in[1].data == (void *)(b + 1));
  memset(&out, 0, sizeof out);
  CHECK(hir_lower(f, NULL, &p) == HIR_OK && hir_evaluator_create(p, NULL, &ev) == HIR_OK);
  CHECK(hir_run(ev, in, 2, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK);
  CHECK(hir_tensor_to_dlpack(&out, kDLCPU, 0, &dc) == HIR_OK);
  if (dc) {
    const DLTensor *t = &dc->dl_tensor;
    CHECK(t->ndim == 2 && t->shape[0] == M && t->shape[1] == N && t->dtype.code == kDLFloat && t->dtype.bits == 32 &&
          t->data == out.data && t->device.device_type == kDLCPU && t->strides[0] == N && t->strides[1] == 1);
    for (i = 0; i < M; i++)
      for (k = 0; k < N; k++) CHECK(((const float *)t->data)[i * t->strides[0] + k * t->strides[1]] == want[i * N + k]);
    dc->deleter(dc);
  }
  bad = da; /* a transposed view of a's memory (element [i, r] at a[i + r * M]): taken with its strides */
  bad.shape = a_shape;
  bad.strides = t_strides;
  CHECK(hir_tensor_from_dlpack(&bad, &in[0], err, sizeof err) == HIR_OK && in[0].strides[0] == 1);
  memset(&out, 0, sizeof out);
  CHECK(hir_run(ev, in, 2, &out, 1) == HIR_OK && hir_evaluator_sync(ev) == HIR_OK && out.ndims == 2);
  for (i = 0; out.data && i < M; i++)
    for (k = 0; k < N; k++) {
      double s = 0;
      for (r = 0; r < K; r++) s += (double)a[i + r * M] * b[1 + r * N + k];
      CHECK(fabs(((const float *)out.data)[i * N + k] - s) <= 1e-4 * (1 + fabs(s)));
    }
  bad = da; /* what hostir cannot take, each named */
  bad.dtype.code = kDLInt;
  CHECK(hir_tensor_from_dlpack(&bad, &in[0], err, sizeof err) == HIR_ERR_UNSUPPORTED && strstr(err, "dtype code 0, 32 bits"));
  bad.dtype.bits = 64; /* int64 is taken (torch.int64), both ways */
  CHECK(hir_tensor_from_dlpack(&bad, &in[0], err, sizeof err) == HIR_OK && in[0].dtype == HIR_I64);
  CHECK(hir_tensor_to_dlpack(&in[0], kDLCPU, 0, &dc) == HIR_OK && dc->dl_tensor.dtype.code == kDLInt && dc->dl_tensor.dtype.bits == 64);
  if (dc) dc->deleter(dc);
  bad = da;
  bad.dtype.code = kDLBfloat, bad.dtype.bits = 16;
  CHECK(hir_tensor_from_dlpack(&bad, &in[0], err, sizeof err) == HIR_OK && in[0].dtype == HIR_BF16);
  bad.dtype.lanes = 2;
  CHECK(hir_tensor_from_dlpack(&bad, &in[0], err, sizeof err) == HIR_ERR_UNSUPPORTED && strstr(err, "2 lanes"));
  for (k = 0; k < 2; k++) { /* fp8 by DLPack 1.1's codes, as PyTorch gives them (e4m3fn 10, e5m2 12), both ways */
    hir_tensor h = in[0];
    bad = da;
    bad.dtype.code = (uint8_t)(k ? 12 : 10), bad.dtype.bits = 8;
    CHECK(hir_tensor_from_dlpack(&bad, &in[0], err, sizeof err) == HIR_OK && in[0].dtype == (k ? HIR_F8E5M2 : HIR_F8E4M3));
    h.dtype = k ? HIR_F8E5M2 : HIR_F8E4M3;
    CHECK(hir_tensor_to_dlpack(&h, kDLCPU, 0, &dc) == HIR_OK && dc->dl_tensor.dtype.code == (k ? 12 : 10) &&
          dc->dl_tensor.dtype.bits == 8);
    if (dc) dc->deleter(dc);
  }
  bad = da;
  a_strides[0] = a_strides[1] = 0;
  CHECK(hir_tensor_from_dlpack(&bad, &in[0], err, sizeof err) == HIR_ERR_UNSUPPORTED && strstr(err, "expanded"));
  CHECK(hir_tensor_from_dlpack(NULL, &in[0], err, sizeof err) == HIR_ERR_INVALID && strstr(err, "DLTensor is NULL"));
  CHECK(hir_tensor_to_dlpack(NULL, kDLCPU, 0, &dc) == HIR_ERR_INVALID && dc == NULL);
  hir_evaluator_free(ev);
  hir_program_free(p);
  hir_fusion_free(f);
}
