/* hostir.h - sharded tensor programs lowered to host programs, run on many GPUs.
   No warranty implied; MIT license at the end of this file.

   hostir turns a *fusion* (tensors laid out over a mesh of devices, some axes
   split across devices (DIDx), some split across CUDA streams (Stream)) into a
   *host program*: allocations, loops over chunks, stream switches and syncs,
   collectives and send/recv, matmuls. It reimplements the ideas of nvFuser's
   Host IR in plain C; its printer reproduces nvFuser's `host_ir` dumps.

   Do this:
       #define HOSTIR_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the
   implementation. Every other file includes it without the define.

       #include ...
       #define HOSTIR_IMPLEMENTATION
       #include "hostir.h"

   Compile as C11 or C++11 and link -lm -lpthread. The two commonest link errors:
       undefined reference to `hir_...'    no file defined HOSTIR_IMPLEMENTATION before
                                           including hostir.h (exactly one file must)
       undefined reference to `cudaMalloc', `cublasCreate_v2', `cublasLtCreate', `dlopen'
                                           the implementation has HOSTIR_CUDA: link
                                           -lcublasLt -lcublas -lcudart -ldl (and -lnccl for
                                           hostir_nccl.h), from CUDA's lib64

   A fusion, built and printed:

       hir_fusion *f = hir_fusion_create();
       hir_tv *a = hir_input(f, HIR_F32, 2);          // [M, K]
       hir_tv *b = hir_input(f, HIR_F32, 2);          // [K, N]
       hir_tv *c = hir_matmul(f, a, b);               // [M, N, rK]
       hir_output(f, c);
       if (hir_fusion_error(f)[0]) fprintf(stderr, "%s\n", hir_fusion_error(f));
       hir_fusion_print(f, stderr);
       hir_fusion_free(f);

   Table of contents (grep the markers); a section calls only the ones above it:
       // >>api           public declarations
       // >>base          includes, allocator macros, names, the arena, growable arrays, clocks
       // >>files         SHA-256, HOSTIR_* switches, files from outside (private directories, whole reads, renames), the kernel cache
       // >>ir            scalars and their evaluation, IterDomains, TensorViews, exprs; the op table
       // >>build         the fusion builder (hir_input, hir_set, hir_matmul, ...)
       // >>host          building host programs by hand (hir_host_*)
       // >>print         the printer (nvFuser's dump format) and the DOT export
       // >>analysis      axis maps, sharding queries, resharding detection
       // >>segment       copy, positional matmuls, sharding propagation, decomposition, segmenter
       // >>lower         building the program, resharding ops to communications
       // >>pass_dealloc  Deallocate after last uses
       // >>pass_stream   stream lowering: loops over chunks, P2P schedules; gathered GEMMs cut by columns
       // >>verify        the program verifier run between passes
       // >>verify_ranks  the cross-rank schedule verifier (hir_verify_schedule)
       // >>cost_model    the automatic choice: pipeline or serial, by a cost model
       // >>pipeline      hir_lower: the passes in order, HOSTIR_DUMP
       // >>numbers       f16, bf16 and fp8 conversions, element loads and stores, tensor layouts
       // >>dlpack        DLTensor views in and out (when dlpack.h came first)
       // >>backend_cpu   the CPU backend: host memory, in-order streams
       // >>backend_cuda  the CUDA backend (HOSTIR_CUDA): cudart, cuBLAS, cuBLASLt
       // >>comm_local    the local world: N ranks as threads, hir_spmd
       // >>eval_plan     the evaluator's state; shapes, checks, the plan per input shapes, buffers and bindings
       // >>eval_exec     executing host IR nodes on the backend and the communicator; fused runs; scopes
       // >>eval_create   hir_evaluator_create and _free: streams, events, epilogues, where tensors may lie
       // >>eval_meet     waiting on streams under deadlines; the ranks' meetings; comparing shapes across ranks
       // >>eval_eager    hir_run's arguments checked and laid out; the plan reported; an eager run
       // >>eval_graph    CUDA graphs: capture, replay by addresses, staged arguments
       // >>eval_run      hir_run: the meeting, then an eager, captured or staged run
       // >>tune          the automatic choice by measurement: candidates timed on the ranks, agreed, cached, saved
       // >>timeline      recording host and GPU spans, Chrome-trace output
   The communicator on NCCL (the copy engines, the kernel collectives, the
   bootstrap) is the companion header hostir_nccl.h, with a table of its own.

   Compile-time options (define before the implementation include):
       HOSTIR_STATIC                  every function static (private copy per file)
       HOSTIR_CUDA                    the CUDA backend (cudart, cuBLAS, cuBLASLt)
       HOSTIR_NO_NVTX                 with HOSTIR_CUDA: no NVTX ranges around host IR nodes
       HIR_MALLOC(sz) / HIR_REALLOC(p, sz) / HIR_FREE(p)
                                      all three or none; default: the C library
       HIR_ASSERT(x)                  internal invariants only; default assert()
       HIR_THREAD_CREATE(t, fn, arg)  the threads hostir starts (hir_spmd's ranks, NVRTC's
                                      compiles): pthread_create's result; default pthread_create

   Errors are values: every fallible call returns a status or NULL and records
   a message that names the culprit and how to fix it. Builders are sticky: the
   first error is kept in the fusion (hir_fusion_error), later calls return NULL
   and accept NULL arguments, so a chain of calls is checked once. The library
   never aborts, never exits and never prints to stdout.
*/
#ifndef HOSTIR_H
#define HOSTIR_H
/* The implementation opens files with POSIX 2008's openat and O_NOFOLLOW:
   a strict ISO C build (-std=c11) gets them asked for here, before any
   system header (as hostir_nccl.h does). */
#if defined(HOSTIR_IMPLEMENTATION) && defined(__STRICT_ANSI__) && !defined(_POSIX_C_SOURCE) && !defined(_XOPEN_SOURCE) && \
    !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE) && !defined(__cplusplus)
#define _POSIX_C_SOURCE 200809L
#endif

// >>api
#define HOSTIR_VERSION "0.23"  /* the header, the Python package and pkg-config's files say the same */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef HIRDEF
#ifdef HOSTIR_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define HIRDEF static __attribute__((unused))
#else
#define HIRDEF static
#endif
#else
#define HIRDEF extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define HIR_MAX_DIMS 8

/* X-macros: one list makes both an enum and its strings. */
#define HIR_STATUS_LIST(X)                                                   \
  X(HIR_OK, "ok")                                                            \
  X(HIR_ERR_INVALID, "invalid argument")                                     \
  X(HIR_ERR_UNSUPPORTED, "unsupported")                                      \
  X(HIR_ERR_SHAPE, "shape mismatch")                                         \
  X(HIR_ERR_NOMEM, "out of memory")                                          \
  X(HIR_ERR_BACKEND, "backend failure")                                      \
  X(HIR_ERR_COMM, "communication failure")                                   \
  X(HIR_ERR_TIMEOUT, "timeout")                                              \
  X(HIR_ERR_INTERNAL, "internal error")

#define HIR__ENUM_NAME(e, s) e,
typedef enum hir_status { HIR_STATUS_LIST(HIR__ENUM_NAME) HIR_STATUS_COUNT } hir_status;

/* HIR_F8E4M3 (e4m3fn: no infinities, largest 448) and HIR_F8E5M2 (largest
   57344) are storage dtypes: moved, cast, and multiplied by hir_scaled_linear;
   other ops refuse them (cast to compute). HIR_I64 (torch.int64: token ids,
   positions, counts) is moved, cast, and computed exactly in 64-bit
   integers by add, sub, mul (wrapping), neg, abs, relu, the comparisons,
   their scalar forms (integer scalars), hir_sum, hir_max and hir_iota, and
   summed across devices; other ops refuse it. A cast to int64 rounds
   toward zero, NaN and what lies out of range saturating as CUDA's does
   (NaN to the most negative). */
typedef enum hir_dtype { HIR_F32, HIR_F64, HIR_F16, HIR_BF16, HIR_F8E4M3, HIR_F8E5M2, HIR_I64, HIR_DTYPE_COUNT } hir_dtype;
/* HIR_DIDX and HIR_DIDY split an axis across the devices of one mesh axis:
   DIDx along a row of a 2-D mesh (hir_set_mesh_2d; a 1-D mesh is one row),
   DIDy down a column. */
typedef enum hir_ptype { HIR_SERIAL, HIR_DIDX, HIR_STREAM, HIR_DIDY, HIR_PTYPE_COUNT } hir_ptype;
typedef enum hir_iter_type { HIR_ITERATION, HIR_REDUCTION, HIR_BROADCAST } hir_iter_type;
typedef enum hir_memory { HIR_MEM_GLOBAL, HIR_MEM_LOCAL } hir_memory;

/* Every expr kind, described once: its enum, its name (hir_expr_kind_name,
   messages, the timeline), its tensor operands (inputs, outputs; -1: any
   number; the verifier checks them) and what it is (HIR__OP_* flags, defined
   and read by the implementation's passes). To add an op:
     1. a row here, with the HIR__OP_ flags that say what it is (a new flag where
        the passes need to know a new thing: test flags, not kinds);
     2. its builder: hir_<op> in >>build (a fusion op) or hir_host_<op> in >>host;
     3. its printed form: a case of hir__print_expr (>>print);
     4. a fusion op: where its inputs' axes land, hir__axis_map (>>analysis); how
        a split passes it where it has an axis or sizes of its own, hir__split_blocked
        and hir__split_one (>>analysis); fp8 and int64 operands: HIR__OP_STORE, or a
        rule of its own in hir__takes_dtype (>>build);
     5. its operands' rules in the verifier, hir__verify_operands (>>verify); a
        host op: where it may stand, hir__verify_scope (>>verify), and whether it writes
        its inputs, hir__writes_inputs (>>analysis); a communication: HIR__OP_COMM and
        HIR__OP_TEAM, its matching across ranks in hir__sched_walk (>>verify_ranks)
        and its setup in hir__setup_expr (>>eval_create);
     6. its shape check (hir__check_expr) and its run (hir__exec, or hir__exec_compute
        with a hir_backend function in every backend) in >>eval_exec; stream
        lowering runs it chunk by chunk unless it is HIR__OP_WHOLE, and where it
        has fields tied to its axes (a broadcast's flags, a matmul's roles) its
        copy on chunk views is hir__clone_onto's (>>pass_stream);
     7. tests: its printed form, its numbers against a reference on random data on
        the local world, and on the CUDA backend in the GPU suite. */
#define HIR_EXPR_KIND_LIST(X)                                                                                                                      \
  X(HIR_EXPR_ALLOCATE, "Allocate", 1, 0, HIR__OP_HOST | HIR__OP_BUFFER)                                                                            \
  X(HIR_EXPR_DEALLOCATE, "Deallocate", 1, 0, HIR__OP_HOST | HIR__OP_BUFFER)                                                                        \
  X(HIR_EXPR_GET_CURRENT_STREAM, "GetCurrentStream", 0, 0, HIR__OP_HOST)                                                                           \
  X(HIR_EXPR_SET_CURRENT_STREAM, "SetCurrentStream", 0, 0, HIR__OP_HOST)                                                                           \
  X(HIR_EXPR_SYNCHRONIZE, "Synchronize", 0, 0, HIR__OP_HOST | HIR__OP_ON_STREAM)                                                                   \
  X(HIR_EXPR_FOR_LOOP, "ForLoop", 0, 0, HIR__OP_HOST | HIR__OP_SCOPED)                                                                             \
  X(HIR_EXPR_IF_THEN_ELSE, "IfThenElse", 0, 0, HIR__OP_HOST | HIR__OP_SCOPED)                                                                      \
  X(HIR_EXPR_POST_ON_STREAM, "PostOnStream", -1, -1, HIR__OP_HOST | HIR__OP_ON_STREAM)                                                             \
  X(HIR_EXPR_COMMUNICATION, "Communication", 1, 1, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_TEAM | HIR__OP_WAITABLE | HIR__OP_ON_STREAM)              \
  X(HIR_EXPR_P2P_COMMUNICATION, "P2PCommunication", 1, 0, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_WAITABLE | HIR__OP_ON_STREAM)                      \
  X(HIR_EXPR_WAIT, "Wait", 0, 0, HIR__OP_HOST | HIR__OP_ON_STREAM)                                                                                 \
  X(HIR_EXPR_START_COALESCING, "StartCoalescing", 0, 0, HIR__OP_HOST | HIR__OP_COMM)                                                               \
  X(HIR_EXPR_END_COALESCING, "EndCoalescing", 0, 0, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_WAITABLE | HIR__OP_ON_STREAM)                            \
  X(HIR_EXPR_ALIAS_SELECT, "HirAliasSelect", 1, 1, HIR__OP_HOST | HIR__OP_VIEW)                                                                    \
  X(HIR_EXPR_ALIAS_SLICE, "HirAliasSlice", 1, 1, HIR__OP_HOST | HIR__OP_VIEW)                                                                      \
  X(HIR_EXPR_LOAD_STORE, "LoadStoreOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM | HIR__OP_MOVES | HIR__OP_STORE)            \
  X(HIR_EXPR_BINARY, "BinaryOp", 2, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM | HIR__OP_ANY_STRIDES)                             \
  X(HIR_EXPR_UNARY, "UnaryOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM | HIR__OP_ANY_STRIDES)                               \
  X(HIR_EXPR_REDUCTION, "ReductionOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM | HIR__OP_MOVES)                             \
  X(HIR_EXPR_MAX, "MaxOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM)                                                       \
  X(HIR_EXPR_BROADCAST, "BroadcastOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_ON_STREAM | HIR__OP_STORE)                                                  \
  X(HIR_EXPR_MATMUL, "MatmulOp", -1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM)                                                  \
  X(HIR_EXPR_SELECT, "SelectOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM | HIR__OP_CUTS_AXIS | HIR__OP_WHOLE | HIR__OP_STORE)\
  X(HIR_EXPR_SLICE, "SliceOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM | HIR__OP_CUTS_AXIS | HIR__OP_WHOLE | HIR__OP_STORE) \
  X(HIR_EXPR_RESHAPE, "ViewOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM | HIR__OP_WHOLE | HIR__OP_STORE)                    \
  X(HIR_EXPR_COLLECTIVE_PERMUTE, "CollectivePermute", 1, 1, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_TEAM | HIR__OP_WAITABLE | HIR__OP_ON_STREAM) \
  X(HIR_EXPR_MOE_DISPATCH, "MoeDispatch", 3, 6, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_TEAM | HIR__OP_ON_STREAM | HIR__OP_ROUTES) \
  X(HIR_EXPR_MOE_COMBINE, "MoeCombine", 4, 1, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_TEAM | HIR__OP_ON_STREAM | HIR__OP_ROUTES)   \
  X(HIR_EXPR_RNG, "RNGOp", 1, 1, HIR__OP_COMPUTE | HIR__OP_STANDALONE | HIR__OP_ON_STREAM | HIR__OP_WHOLE | HIR__OP_ANY_STRIDES)
#define HIR__EXPR_ENUM(e, name, nin, nout, flags) e,
typedef enum hir_expr_kind { HIR_EXPR_KIND_LIST(HIR__EXPR_ENUM) HIR_EXPR_KIND_COUNT } hir_expr_kind;

/* Elementwise ops, each described once: its enum, its printed form, and what
   it computes on an element x (and y, or the scalar s; a comparison gives 1
   where it holds, else 0), written once for every backend: the CPU backend
   compiles it as C on doubles, the CUDA backend as CUDA C (NVRTC) on float, or
   on double where an operand is f64. HIR_C(v) is the constant v in the type
   computed in. */
#define HIR_BINARY_OP_LIST(X)                                                \
  X(HIR_BINARY_ADD, "+", "hir_add", x + y)                                   \
  X(HIR_BINARY_SUB, "-", "hir_sub", x - y)                                   \
  X(HIR_BINARY_MUL, "*", "hir_mul", x * y)                                   \
  X(HIR_BINARY_DIV, "/", "hir_div", x / y)                                   \
  X(HIR_BINARY_LT, "<", "hir_lt", (x < y ? HIR_C(1) : HIR_C(0)))
#define HIR__BINARY_ENUM(e, symbol, builder, expr) e,
typedef enum hir_binary_op { HIR_BINARY_OP_LIST(HIR__BINARY_ENUM) HIR_BINARY_COUNT } hir_binary_op;

/* Unary ops print as nvFuser's UnaryOp ("relu(T0)"; where the middle column
   is 1, with an f in float: "sinf(T0)");
   cast converts to the output's dtype (every op may: the value is computed,
   then stored in the output's dtype); the scalar forms print as nvFuser's
   BinaryOp with a scalar operand ("T0 + 2.5"). */
#define HIR_UNARY_OP_LIST(X)                                                                         \
  X(HIR_UNARY_NEG, "-", 0, -x)                                                                       \
  X(HIR_UNARY_ABS, "abs", 0, fabs(x))                                                                \
  X(HIR_UNARY_RELU, "relu", 0, (x < HIR_C(0) ? HIR_C(0) : x))                                        \
  X(HIR_UNARY_SIN, "sin", 1, sin(x))                                                                 \
  X(HIR_UNARY_COS, "cos", 1, cos(x))                                                                 \
  X(HIR_UNARY_EXP, "exp", 1, exp(x))                                                                 \
  X(HIR_UNARY_LOG, "log", 1, log(x))                                                                 \
  X(HIR_UNARY_TANH, "tanh", 1, tanh(x))                                                              \
  X(HIR_UNARY_SQRT, "sqrt", 1, sqrt(x))                                                              \
  X(HIR_UNARY_RSQRT, "rsqrt", 1, HIR_C(1) / sqrt(x))                                                 \
  X(HIR_UNARY_RECIPROCAL, "reciprocal", 0, HIR_C(1) / x)                                             \
  X(HIR_UNARY_SIGMOID, "sigmoid", 0, HIR_C(1) / (HIR_C(1) + exp(-x)))                                \
  X(HIR_UNARY_SILU, "silu", 0, x / (HIR_C(1) + exp(-x)))                                             \
  X(HIR_UNARY_GELU, "gelu", 0, HIR_C(0.5) * x * (HIR_C(1) + erf(x * HIR_C(0.70710678118654752440)))) \
  X(HIR_UNARY_GELU_TANH, "gelu_tanh", 0,                                                             \
    HIR_C(0.5) * x * (HIR_C(1) + tanh(HIR_C(0.79788456080286535588) * (x + HIR_C(0.044715) * x * x * x))))  \
  X(HIR_UNARY_CAST, "cast", 0, x)                                                                    \
  X(HIR_UNARY_ADD_SCALAR, "+", 0, x + s)                                                             \
  X(HIR_UNARY_SUB_SCALAR, "-", 0, x - s)                                                             \
  X(HIR_UNARY_MUL_SCALAR, "*", 0, x * s)                                                             \
  X(HIR_UNARY_DIV_SCALAR, "/", 0, x / s)                                                             \
  X(HIR_UNARY_SCALAR_SUB, "-", 0, s - x)                                                             \
  X(HIR_UNARY_SCALAR_DIV, "/", 0, s / x)                                                             \
  X(HIR_UNARY_LT_SCALAR, "<", 0, (x < s ? HIR_C(1) : HIR_C(0)))                                      \
  X(HIR_UNARY_SCALAR_LT, "<", 0, (s < x ? HIR_C(1) : HIR_C(0)))
#define HIR__UNARY_ENUM(e, name, f, expr) e,
typedef enum hir_unary_op { HIR_UNARY_OP_LIST(HIR__UNARY_ENUM) HIR_UNARY_COUNT } hir_unary_op;

/* Scalar expressions (extents, loop indices, predicates); printed "( a op b )". */
#define HIR_SCALAR_OP_LIST(X)                                                \
  X(HIR_SCALAR_ADD, "+") X(HIR_SCALAR_SUB, "-") X(HIR_SCALAR_MUL, "*")       \
  X(HIR_SCALAR_DIV, "/") X(HIR_SCALAR_MOD, "%") X(HIR_SCALAR_EQ, "==")       \
  X(HIR_SCALAR_NE, "!=") X(HIR_SCALAR_LT, "<") X(HIR_SCALAR_LE, "<=")        \
  X(HIR_SCALAR_GT, ">") X(HIR_SCALAR_GE, ">=") X(HIR_SCALAR_AND, "&&")       \
  X(HIR_SCALAR_OR, "||")
typedef enum hir_scalar_op { HIR_SCALAR_OP_LIST(HIR__ENUM_NAME) HIR_SCALAR_OP_COUNT } hir_scalar_op;

/* Scalars bound by the evaluator: the loop index, this rank's device id, and
   the number of streams of the pool. */
typedef enum hir_named_scalar { HIR_NAMED_STREAM_IDX, HIR_NAMED_RANK, HIR_NAMED_NUM_STREAMS, HIR_NAMED_COUNT } hir_named_scalar;

/* Collectives; the string is the printed type. */
#define HIR_COLLECTIVE_LIST(X)                                               \
  X(HIR_COLL_GATHER, "Gather") X(HIR_COLL_ALLGATHER, "Allgather")            \
  X(HIR_COLL_SCATTER, "Scatter") X(HIR_COLL_REDUCE, "Reduce")                \
  X(HIR_COLL_ALLREDUCE, "Allreduce") X(HIR_COLL_REDUCESCATTER, "ReduceScatter") \
  X(HIR_COLL_BROADCAST, "Broadcast") X(HIR_COLL_SENDRECV, "SendRecv")     \
  X(HIR_COLL_ALLTOALL, "AllToAll")
typedef enum hir_collective { HIR_COLLECTIVE_LIST(HIR__ENUM_NAME) HIR_COLLECTIVE_COUNT } hir_collective;
typedef enum hir_p2p_type { HIR_P2P_SEND, HIR_P2P_RECV } hir_p2p_type;
/* The steps of hir_backend.moe_index. */
typedef enum hir_moe_step { HIR_MOE_ROUTE, HIR_MOE_COMPACT, HIR_MOE_EXPAND, HIR_MOE_COMBINE } hir_moe_step;

typedef struct hir_fusion hir_fusion;       typedef struct hir_tv hir_tv;
typedef struct hir_expr hir_expr;           typedef struct hir_group hir_group;
typedef struct hir_program hir_program;     typedef struct hir_evaluator hir_evaluator;
typedef struct hir_backend hir_backend;     typedef struct hir_comm hir_comm;
typedef struct hir_local_world hir_local_world;
typedef struct hir_val hir_val;             /* a scalar expression */
typedef struct hir_id hir_id;               /* an IterDomain: one axis of a tensor */
typedef struct hir_scope hir_scope;         /* an ordered list of exprs: a body */
typedef struct hir_stream hir_stream;       /* "Stream 0" or "Stream ( index )" */

HIRDEF const char *hir_status_str(hir_status s);
HIRDEF const char *hir_dtype_name(hir_dtype d);      /* "float", "double", "__half", "__bfloat" */
HIRDEF size_t      hir_dtype_size(hir_dtype d);

/* ---- fusion definition ---- */
HIRDEF hir_fusion *hir_fusion_create(void);           /* NULL when out of memory */
HIRDEF void        hir_fusion_free(hir_fusion *f);    /* a program's own fusion is freed with it */
HIRDEF const char *hir_fusion_error(const hir_fusion *f);          /* "" if none */
HIRDEF hir_status  hir_fusion_status(const hir_fusion *f);
HIRDEF hir_tv     *hir_input(hir_fusion *f, hir_dtype dtype, int ndims);
HIRDEF hir_status  hir_output(hir_fusion *f, hir_tv *tv);
/* An input of fixed sizes (nvFuser's makeConcreteTensor): its extents are
   constants, known when lowering; hir_run checks the tensors given. */
HIRDEF hir_tv     *hir_input_sized(hir_fusion *f, hir_dtype dtype, int ndims, const int64_t *sizes);
/* A scalar input (an integer, or a Bool as 0/1; nvFuser's scalar inputs),
   for a loop's stop, a predicate, hir_binary_val's scalar. It takes its
   place among the inputs: hir_run gets it by value, as a hir_tensor of
   ndims 0 and data NULL holding the value in sizes[0] (no memory to read,
   whatever the backend). A new value replans, as new shapes do. */
HIRDEF hir_val    *hir_input_scalar(hir_fusion *f);
HIRDEF hir_tv     *hir_set(hir_fusion *f, hir_tv *in);
HIRDEF hir_tv     *hir_add(hir_fusion *f, hir_tv *a, hir_tv *b);
HIRDEF hir_tv     *hir_sub(hir_fusion *f, hir_tv *a, hir_tv *b);
HIRDEF hir_tv     *hir_mul(hir_fusion *f, hir_tv *a, hir_tv *b);
HIRDEF hir_tv     *hir_div(hir_fusion *f, hir_tv *a, hir_tv *b);
HIRDEF hir_tv     *hir_lt(hir_fusion *f, hir_tv *a, hir_tv *b); /* 1 where a < b, else 0 (a dropout's mask) */
HIRDEF hir_tv     *hir_binary(hir_fusion *f, hir_binary_op op, hir_tv *a, hir_tv *b);
/* Elementwise ops of one tensor (HIR_UNARY_OP_LIST), the output of in's
   shape and dtype. hir_unary takes the ops without a scalar, cast excluded. */
HIRDEF hir_tv     *hir_unary(hir_fusion *f, hir_unary_op op, hir_tv *in);
HIRDEF hir_tv     *hir_neg(hir_fusion *f, hir_tv *in);
HIRDEF hir_tv     *hir_abs(hir_fusion *f, hir_tv *in);
HIRDEF hir_tv     *hir_relu(hir_fusion *f, hir_tv *in);
HIRDEF hir_tv     *hir_sin(hir_fusion *f, hir_tv *in);
HIRDEF hir_tv     *hir_cast(hir_fusion *f, hir_tv *in, hir_dtype dtype);
/* A tensor and a scalar: a op s, s op b, the scalar taken in the type the
   backend computes in (double on the CPU, float or double on CUDA).
   hir_binary_val's scalar is an integer expression known at run time, such
   as an extent (a mean divides by one). */
HIRDEF hir_tv     *hir_binary_scalar(hir_fusion *f, hir_binary_op op, hir_tv *a, double s);
HIRDEF hir_tv     *hir_scalar_binary(hir_fusion *f, hir_binary_op op, double s, hir_tv *b);
HIRDEF hir_tv     *hir_binary_val(hir_fusion *f, hir_binary_op op, hir_tv *a, hir_val *s);
/* Composites, built from the ops above as nvFuser's are (printed as those
   ops): the mean over axes (data axes, as hir_sum's); layer_norm over the
   last `naxes` axes, computed in float for f16/bf16 inputs and cast back,
   scaled by weight and shifted by bias where given (NULL: none; shaped like
   the normalized axes); rms_norm the same without the mean taken out and
   without a bias: x / sqrt(mean(x^2) + eps) * weight (LLaMA's RMSNorm,
   torch.nn.functional.rms_norm). */
HIRDEF hir_tv     *hir_mean(hir_fusion *f, hir_tv *in, int naxes, const int *axes);
HIRDEF hir_tv     *hir_layer_norm(hir_fusion *f, hir_tv *x, int naxes, hir_tv *weight, hir_tv *bias, double eps);
HIRDEF hir_tv     *hir_rms_norm(hir_fusion *f, hir_tv *x, int naxes, hir_tv *weight, double eps);
HIRDEF hir_tv     *hir_sum(hir_fusion *f, hir_tv *in, int naxes, const int *axes);
/* Scaled dot-product attention (torch's scaled_dot_product_attention, and
   nvFuser's sdpfa_fwd and sdpfa_bwd), built of the ops here: q [..., L, E],
   k [..., S, E], v [..., S, Ev] (one dtype, as many axes; the leading ones
   batch and heads, any of them sharded or split as the ops take them),
   out = dropout(softmax(scale q k^T + mask)) v [..., L, Ev]; the softmax and
   its gradient in f32 (f64 for f64), the products in the operands' dtype.
   logsumexp (NULL: not made): [..., L] in f32 (f64), the softmax's rows'
   log of the sum of exp, which the backward reads. hir_sdpa_backward takes
   the forward's operands, out and logsumexp, and the same desc (the same
   seed draws the same dropout), and gives the gradients of q, k and v. */
typedef struct hir_sdpa_desc {
  double scale;   /* 0: 1/sqrt(E) (E a fixed size: hir_input_sized) */
  int causal;     /* 1: row i attends to columns j <= i (torch's is_causal, the top left aligned) */
  double dropout; /* the probability of dropping a weight, in [0, 1); 0: none */
  hir_val *seed;  /* the dropout's seed (as hir_rand's) */
} hir_sdpa_desc;
HIRDEF hir_tv     *hir_sdpa(hir_fusion *f, hir_tv *q, hir_tv *k, hir_tv *v, const hir_sdpa_desc *d, hir_tv **logsumexp);
HIRDEF hir_status  hir_sdpa_backward(hir_fusion *f, hir_tv *grad_out, hir_tv *q, hir_tv *k, hir_tv *v, hir_tv *out,
                                     hir_tv *logsumexp, const hir_sdpa_desc *d, hir_tv **grad_q, hir_tv **grad_k,
                                     hir_tv **grad_v);
/* The largest element over axes (data axes, as hir_sum's); -inf over an
   empty axis; NaN where an element is NaN. A max across devices is not a
   collective: an axis split across devices is gathered first. */
HIRDEF hir_tv     *hir_max(hir_fusion *f, hir_tv *in, int naxes, const int *axes);
/* Random numbers, uniform in [0, 1) (hir_rand) or in [low, high)
   (hir_uniform: low + (high - low) u, computed in the dtype), shaped like
   `like` and sharded as it is (its values are never read), in dtype
   (HIR_F32, HIR_F64, HIR_F16 or HIR_BF16). Element i of the whole logical
   tensor (its row-major index, whatever the sharding, the streams or the
   backend) is hir_rand_value(seed, i, b): the first word r of
   Philox-4x32-10 with counter i and key seed, as (r >> (32 - b)) / 2^b, b
   the dtype's significand bits (24 for f32 and f64, 11 for f16, 8 for
   bf16), so u is exact in the dtype and below 1. seed: an integer scalar
   (hir_val_const; hir_input_scalar for a new draw each run). A dropout keeps
   x where hir_binary_scalar(f, HIR_BINARY_LT, hir_rand(..), 1 - p) is 1. */
HIRDEF hir_tv     *hir_rand(hir_fusion *f, hir_tv *like, hir_dtype dtype, hir_val *seed);
HIRDEF hir_tv     *hir_uniform(hir_fusion *f, hir_tv *like, hir_dtype dtype, double low, double high, hir_val *seed);
HIRDEF double      hir_rand_value(uint64_t seed, uint64_t index, int bits);
/* Each element's index along logical axis `axis` of `like` (torch.arange
   broadcast to like's shape), shaped and sharded as like, in dtype (int64,
   or exact up to 2^24 in f32, 2^53 in f64, 2048 in f16, 256 in bf16). A causal mask
   keeps column j of row i where hir_lt(f, hir_iota(.., -1 ..), row + 1)
   is 1, row = hir_iota(.., -2 ..). */
HIRDEF hir_tv     *hir_iota(hir_fusion *f, hir_tv *like, int axis, hir_dtype dtype);
HIRDEF hir_tv     *hir_broadcast(hir_fusion *f, hir_tv *in, int ndims_out, const int *is_broadcast);
/* torch.permute: output axis i is data axis perm[i] of in (a copy in the new
   order); hir_transpose swaps two axes. */
HIRDEF hir_tv     *hir_permute(hir_fusion *f, hir_tv *in, const int *perm);
HIRDEF hir_tv     *hir_transpose(hir_fusion *f, hir_tv *in, int axis0, int axis1);
/* torch.select: in without `axis`, at `index`; torch's slice with step 1:
   [start, stop) of `axis` (stop -1: to the end); hir_slice_step is
   Python's in[start:stop:step] (start, stop < 0 count from the end, stop
   HIR_END is the end, step >= 1; the range must lie in the axis: it is
   checked, not clamped, at run time); torch.reshape: `ndims`
   sizes, each a size, 0 for "in's axis at this position, kept" (ONNX's
   convention) or -1 for the one inferred. A kept DIDx axis stays split
   where the reshape keeps it as an axis: every axis before it kept too,
   or, with as many axes on both sides, every axis after it; kept between
   changed axes ([2, D, 3] to [3, 0, 2]) it only keeps its size, since
   row-major order mixes its rows, and it is gathered first. So is any
   other split axis that is selected, sliced or reshaped. */
HIRDEF hir_tv     *hir_select(hir_fusion *f, hir_tv *in, int axis, int64_t index);
HIRDEF hir_tv     *hir_slice(hir_fusion *f, hir_tv *in, int axis, int64_t start, int64_t stop);
#define HIR_END INT64_MAX
HIRDEF hir_tv     *hir_slice_step(hir_fusion *f, hir_tv *in, int axis, int64_t start, int64_t stop, int64_t step);
HIRDEF hir_tv     *hir_reshape(hir_fusion *f, hir_tv *in, int ndims, const int64_t *sizes);
HIRDEF hir_tv     *hir_matmul(hir_fusion *f, hir_tv *a, hir_tv *b);
/* torch.nn.functional.linear: a [..., K] times weight [..., N, K] transposed,
   plus bias [..., N] (weight's shape without K; NULL: none); weight's
   leading axes are batch axes, as matmul's (a column-parallel weight split
   on its first axis). Printed as nvFuser's LinearOp; on CUDA the bias is
   cuBLASLt's epilogue where the weight is 2-D. */
HIRDEF hir_tv     *hir_linear(hir_fusion *f, hir_tv *a, hir_tv *weight, hir_tv *bias);
/* The fp8 linear of torch._scaled_mm and Transformer Engine: (a * a_scale)
   times (weight * w_scale) transposed, in `out` (HIR_F32, HIR_F16 or
   HIR_BF16), accumulated in f32. a [..., M, K] and weight [..., N, K] (its
   leading axes batch axes, as linear's) are HIR_F8E4M3 or HIR_F8E5M2 (not
   both e5m2: GPUs have no such GEMM); the scales are f32, one value (an
   axis of fixed size 1: hir_input_sized) or one per row: a_scale a's shape
   without K, w_scale the weight's without K. On CUDA: cuBLASLt's fp8 GEMM
   where it takes the shape (K and N multiples of 16, compute capability
   8.9 or later), else the same values widened to bf16 (exactly) for
   cuBLAS, slower. */
HIRDEF hir_tv     *hir_scaled_linear(hir_fusion *f, hir_tv *a, hir_tv *weight, hir_tv *a_scale, hir_tv *w_scale, hir_dtype out);
HIRDEF hir_status  hir_set_mesh(hir_tv *tv, int ndevices, const int *devices);
/* A 2-D mesh (nvFuser's DeviceMesh of shape [rows, cols]): devices[r * cols
   + c] is at row r, column c. A DIDx axis is split across a row's devices
   (cols shards), a DIDy axis down a column's (rows shards): tensor x data
   parallel. Collectives and P2P pipelines run per row (DIDx) or per column
   (DIDy); a resharding over both mesh axes becomes one collective for each;
   both tensors of a resharding live on the same mesh. */
HIRDEF hir_status  hir_set_mesh_2d(hir_tv *tv, int rows, int cols, const int *devices);
HIRDEF hir_status  hir_parallelize(hir_tv *tv, int axis, hir_ptype ptype);
/* nvFuser's split: axis becomes two, the outer of extent `factor` (outer =
   1) or the inner (outer = 0), the other extent / factor (a size it must
   divide when run); parallelize either with DIDx or Stream. The split goes
   to every tensor whose axis maps onto this one through the ops (as
   nvFuser's transform propagation), so they stay one computation; the
   user's tensors keep their logical axes (a DIDx-split axis holds this
   device's part, as nvFuser's sharded inputs do). Through a permute, the
   split reaches the output axis that reads the split one; through a
   reshape, the same axis on the other side where the reshape keeps it,
   or, for an outer split, where it is the reshape's first changed axis
   ([M, H * E] split by D on axis 1 viewed as [M, H, E] splits H: each
   device its H / D heads, nothing moved). Through a matmul or linear,
   to the same axis of the other operand and the output: M, N, batch axes,
   and K onto the output's reduction axis (nvFuser's tensor parallelism on
   logical shapes: the weight's N split, DIDx on its outer part, is a
   column-parallel linear; K split so is a row-parallel one, its output
   summed over the devices, an Allreduce, or a ReduceScatter where the
   output is split on M; a bias is added after the sum). Refused, with the
   op named, where an op cannot take it: K or N of an fp8 linear or of a
   matmul with a 1-D operand, a select or slice of that axis, a reshape
   elsewhere. */
HIRDEF hir_status  hir_split(hir_tv *tv, int axis, int64_t factor, int outer);
/* nvFuser's reorder of tv's loop domain: the axis at loop position from[k]
   moves to to[k] (negative from the end), the others keep their order in
   the places left. Later schedule calls (hir_parallelize, hir_split,
   hir_tv_ptype, ...) count axes in this order, and the printer shows it,
   as nvFuser's tv->axis(i) and dumps do; a DIDx axis is reordered to the
   front this way (nvFuser's reorderDIDToFront). What a tensor holds and
   the layout of the user's tensors (strides given at run time) do not
   change. */
HIRDEF hir_status  hir_reorder(hir_tv *tv, int n, const int *from, const int *to);
/* nvFuser's tv->setAllocationDomain(tv->getLoopDomain(), true): the user's
   tensors of tv laid out in its loop order (a DIDx or DIDy part, one element
   a device, takes no place). The program holds such an input or output in
   this layout: an input passed so is read in place, an output the evaluator
   hands back (data NULL) comes in it, and a set or unary op between an input
   and an output of one layout runs in it (an all-gather whose layouts put the
   gathered axis outermost is the collective alone). Inputs and preallocated
   outputs in other strides are copied in or out. Refused where
   the loop order puts another axis between the parts of a split axis, or
   its inner part first: no strides give that layout. */
HIRDEF hir_status  hir_set_allocation_loop(hir_tv *tv);
/* nvFuser's swizzle1d: a loop axis that the stream lowering walks (HIR_STREAM,
   now or later) visits its chunks starting from this device's place on the
   mesh's row (by: HIR_DIDX): iteration i takes chunk (i + place) % extent.
   A P2P allgather into such an axis becomes a ring in that order (step i
   receives chunk place + i from its owner and sends the own chunk to place
   - i), whatever the schedule asked; a loop that moves nothing just starts
   at the own chunk. A reduce-scatter's Stream axis refuses it (its ring is
   HIR_SCHEDULE_RING's). */
HIRDEF hir_status  hir_swizzle1d(hir_tv *tv, int axis, hir_ptype by);
/* nvFuser's merge of loop axes: axis and axis + 1 become one loop axis (of
   their extents' product; the later axes number one less). It changes no
   layout. A merged axis is not parallelized (a Stream or DIDx on it is
   refused, as nvFuser's stream lowering refuses the Stream: split one of the
   axes and parallelize its part) unless one of the two has the fixed size 1
   or is a broadcast: then the parallel type goes to the other (nvFuser's
   merge of a squeezed axis). A merged axis is not split, and a tensor with
   one is not reordered. */
HIRDEF hir_status  hir_merge(hir_tv *tv, int axis);
HIRDEF hir_status  hir_fusion_print(const hir_fusion *f, FILE *out);
HIRDEF size_t      hir_fusion_snprint(const hir_fusion *f, char *buf, size_t cap);   /* like snprintf */
/* Axis arguments count every axis of the tensor, reduction axes included
   (hir_tv_ndims); op arguments (hir_sum's axes, hir_broadcast's flags) count
   the axes that hold data, i.e. without reduction axes. Negative axes count
   from the end. */

/* ---- inspecting tensors and exprs ---- */
HIRDEF int            hir_tv_ndims(const hir_tv *tv);               /* reduction axes included */
HIRDEF int            hir_tv_name(const hir_tv *tv);                /* the n of "Tn" */
HIRDEF hir_dtype      hir_tv_dtype(const hir_tv *tv);
HIRDEF hir_iter_type  hir_tv_iter_type(const hir_tv *tv, int axis);
HIRDEF hir_ptype      hir_tv_ptype(const hir_tv *tv, int axis);
HIRDEF hir_val       *hir_tv_extent(const hir_tv *tv, int axis);
HIRDEF const int     *hir_tv_mesh(const hir_tv *tv, int *ndevices); /* NULL, 0 if none */
HIRDEF int            hir_tv_mesh_cols(const hir_tv *tv);    /* a 2-D mesh's devices per row; 0: a 1-D mesh, or none */
HIRDEF hir_expr      *hir_tv_definition(const hir_tv *tv);          /* the fusion expr producing it */
/* After hir_split: how many axes the user's tensors of tv hold (0: no axis
   split, hir_tv_ndims's data axes), and which of them axis `axis` is part of. */
HIRDEF int            hir_tv_logical_ndims(const hir_tv *tv);
HIRDEF int            hir_tv_logical_axis(const hir_tv *tv, int axis);
HIRDEF size_t         hir_tv_snprint(const hir_tv *tv, char *buf, size_t cap);   /* like snprintf */
HIRDEF size_t         hir_val_snprint(const hir_val *v, char *buf, size_t cap);
HIRDEF hir_expr_kind  hir_expr_kind_of(const hir_expr *e);
HIRDEF const char    *hir_expr_kind_name(const hir_expr *e);
HIRDEF int            hir_expr_name(const hir_expr *e);             /* the n of "Communication n" */
HIRDEF int            hir_expr_ninputs(const hir_expr *e);
HIRDEF hir_tv        *hir_expr_input(const hir_expr *e, int i);
HIRDEF int            hir_expr_noutputs(const hir_expr *e);
HIRDEF hir_tv        *hir_expr_output(const hir_expr *e, int i);
HIRDEF hir_scope     *hir_expr_body(const hir_expr *e);   /* ForLoop body, IfThenElse then-branch */
HIRDEF hir_scope     *hir_expr_else(const hir_expr *e);   /* IfThenElse else-branch */
HIRDEF int            hir_scope_size(const hir_scope *s);
HIRDEF hir_expr      *hir_scope_at(const hir_scope *s, int i);

/* ---- host programs ---- */
HIRDEF hir_program    *hir_program_create(void);          /* an empty program to build by hand */
HIRDEF void            hir_program_free(hir_program *p);
HIRDEF const char     *hir_program_error(const hir_program *p);   /* "" if none */
HIRDEF hir_status      hir_program_print(const hir_program *p, FILE *out);
HIRDEF size_t          hir_program_snprint(const hir_program *p, char *buf, size_t cap);
HIRDEF int             hir_program_ntop(const hir_program *p);
HIRDEF int             hir_program_ninputs(const hir_program *p);
HIRDEF hir_tv         *hir_program_input(const hir_program *p, int i);
HIRDEF int             hir_program_noutputs(const hir_program *p);
HIRDEF hir_tv         *hir_program_output(const hir_program *p, int i);
HIRDEF const hir_expr *hir_program_top(const hir_program *p, int i);
/* The IR the program's tensors live in: hir_input and hir_output declare the
   program's inputs and outputs, hir_set/hir_matmul/... make compute exprs
   (take them with hir_tv_definition and append them to a scope). Owned by
   the program. Every tensor comes from an input or an op: a buffer that only
   a communication writes (nvFuser's tests build one with no producer) is
   made by the op whose shape it has, left unplaced (b = hir_set(f, a) for
   an all-gather of a, with b's own mesh and axes), and Allocate makes it. */
HIRDEF hir_fusion     *hir_program_fusion(hir_program *p);
HIRDEF hir_scope      *hir_program_body(hir_program *p);
HIRDEF hir_status      hir_scope_append(hir_scope *s, hir_expr *e);

/* Scalars of a fusion or program. */
HIRDEF hir_val *hir_val_const(hir_fusion *f, int64_t value);
HIRDEF hir_val *hir_val_named(hir_fusion *f, hir_named_scalar which);
HIRDEF hir_val *hir_val_binary(hir_fusion *f, hir_scalar_op op, hir_val *a, hir_val *b);

/* Host IR nodes, built by hand. Each returns the new expr (append it to a
   scope) or NULL with the error recorded in the program. */
HIRDEF hir_stream *hir_stream_new(hir_program *p);                   /* a stream variable: "Stream n" */
HIRDEF hir_stream *hir_stream_indexed(hir_program *p, hir_val *index); /* pool stream: "Stream ( index )" */
HIRDEF hir_expr *hir_host_allocate(hir_program *p, hir_tv *tv);
HIRDEF hir_expr *hir_host_deallocate(hir_program *p, hir_tv *tv);
HIRDEF hir_expr *hir_host_get_current_stream(hir_program *p, hir_stream *into);
HIRDEF hir_expr *hir_host_set_current_stream(hir_program *p, hir_stream *to);
HIRDEF hir_expr *hir_host_synchronize(hir_program *p, hir_stream *s);
HIRDEF hir_expr *hir_host_for_loop(hir_program *p, hir_tv *tv, int axis);   /* FOR StreamIdx in tv's axis */
/* FOR i in [0, stop): a loop of its own index (hir_host_loop_index; a new
   scalar), so loops nest (nvFuser's host ForLoop over any range). */
HIRDEF hir_expr *hir_host_for_range(hir_program *p, hir_val *stop);
HIRDEF hir_val  *hir_host_loop_index(const hir_expr *loop);
HIRDEF hir_expr *hir_host_if(hir_program *p, hir_val *predicate);
HIRDEF hir_expr *hir_host_alias_select(hir_program *p, hir_tv *in, int axis, hir_val *index); /* output 0: the view */
/* A view of part `index` of `in` cut into `parts` equal parts along `axis`
   (kept, size/parts long); hir_run says so if the size does not divide. */
HIRDEF hir_expr *hir_host_alias_slice(hir_program *p, hir_tv *in, int axis, hir_val *index, int parts);
HIRDEF hir_expr *hir_host_set(hir_program *p, hir_tv *out, hir_tv *in);
HIRDEF hir_expr *hir_host_binary(hir_program *p, hir_binary_op op, hir_tv *out, hir_tv *a, hir_tv *b);
HIRDEF hir_expr *hir_host_matmul(hir_program *p, hir_tv *out, hir_tv *a, hir_tv *b);
HIRDEF hir_expr *hir_host_communication(hir_program *p, hir_collective type, int nteam, const int *team,
                                        int root, hir_tv *in, hir_tv *out);   /* root ignored unless the type has one */
HIRDEF hir_expr *hir_host_p2p(hir_program *p, hir_p2p_type type, hir_tv *buffer, hir_val *peer);
/* nvFuser's CollectivePermute: every device of the team sends `in` to
   device send_peer and receives `out` from device recv_peer, in one group
   (a step of a ring: send_peer = (rank + j) % n, recv_peer = (rank - j + n)
   % n, of the loop index j and HIR_NAMED_RANK). in and out have one shape;
   a device outside the team skips it; send_peer = recv_peer = rank copies. */
HIRDEF hir_expr *hir_host_collective_permute(hir_program *p, int nteam, const int *team, hir_val *send_peer,
                                             hir_val *recv_peer, hir_tv *in, hir_tv *out);
/* Mixture-of-experts routing (nvFuser's MoeDispatch and MoeCombine), top-1,
   over a team (its devices in rank order; expert k lives on team member
   k / (num_experts / team size)). Operands may lead with device axes
   (DIDx/DIDy, one element a device); after them: x [T, H] (f32, f64, f16,
   bf16), topk_idx [T, 1] (int64: each token's expert), topk_weights [T, 1].
   Dispatch sends each token's row, expert, weight and index t to its
   expert's device; outputs 0-5 (made by the op) are recv_x [C, H],
   recv_topk_idx [C, 1], recv_topk_weights [C, 1], recv_src_idx [C] (int64),
   n_tokens_to_rank [R], n_tokens_from_rank [R] (int64), C = T * R rows
   (sizes known before the run, so the op captures into CUDA graphs): rows
   [0, V), V the tokens received, in the order of the sending member, then
   of expert, then of t; rows [V, C) zero. A token whose expert
   lies outside [0, num_experts) is sent nowhere (its combined row is zero).
   Combine sends each row of x [C, H] (dispatch's row order) back where
   src_idx's row came from, by the counts dispatch gave, into combined_x
   [num_tokens, H] (output 0) at row src_idx (nvFuser's takes the weights
   too and leaves them unread). */
HIRDEF hir_expr *hir_host_moe_dispatch(hir_program *p, int nteam, const int *team, hir_tv *x, hir_tv *topk_idx,
                                       hir_tv *topk_weights, int64_t num_experts);
HIRDEF hir_expr *hir_host_moe_combine(hir_program *p, int nteam, const int *team, hir_tv *x, hir_tv *src_idx,
                                      hir_tv *n_tokens_to_rank, hir_tv *n_tokens_from_rank, hir_val *num_tokens);
HIRDEF hir_expr *hir_host_start_coalescing(hir_program *p);
HIRDEF hir_expr *hir_host_end_coalescing(hir_program *p);
HIRDEF hir_expr *hir_host_wait(hir_program *p, hir_expr *communication);
/* A HostUnit computing outs from ins with the program fusion's exprs between
   them, and the PostOnStream that runs it. */
HIRDEF hir_expr *hir_host_post_on_stream(hir_program *p, int nin, hir_tv *const *ins, int nout, hir_tv *const *outs);


/* ---- lowering: fusion in, the host program of one device out ---- */
typedef int (*hir_merge_fn)(const hir_group *a, const hir_group *b, void *user);
HIRDEF int             hir_group_nexprs(const hir_group *g);
HIRDEF const hir_expr *hir_group_expr(const hir_group *g, int i);
HIRDEF int             hir_group_is_standalone(const hir_group *g);  /* one standalone host op */
HIRDEF int             hir_expr_is_resharding(const hir_expr *e);
HIRDEF int             hir_merge_default(const hir_group *a, const hir_group *b, void *user);
/* How stream lowering pipelines a fusion's Stream axes (hir_stream_desc.schedule). */
typedef enum hir_schedule {
  HIR_SCHEDULE_LINEAR,     /* P2P exchanges, step i with mesh[i] (nvFuser's programs) */
  HIR_SCHEDULE_RING,       /* P2P exchanges around a ring: step i receives from position pos-i and sends to
                              pos+i, so every rank is busy every step and none hears from all at once */
  HIR_SCHEDULE_COLLECTIVE, /* each P2P pipeline as a collective pipeline: the loop runs over `parts` parts of
                              every peer's chunk, each iteration one collective over the team (an allgather or a
                              reduce-scatter of that part of every chunk, staged through a contiguous buffer
                              where the part is strided) and the computation on it; for links whose send/recv
                              do not overlap the GEMMs (NCCL between hosts) */
  HIR_SCHEDULE_SERIAL,     /* no Stream axes: the serial program */
  HIR_SCHEDULE_COUNT
} hir_schedule;
/* Knobs for studying hostir itself rather than for running a program
   (hir_stream_desc.experimental); the defaults (zeros) are what measured best. */
typedef struct hir_stream_experimental {
  /* the cost model's rates: zeros take H200's, 750e12 flop/s in f16/bf16,
     50e12 in f32/f64, 300e9 B/s, 20 us a chunk, 40 us a part */
  double gemm_flops_per_s, link_bytes_per_s, chunk_overhead_s, part_overhead_s;
  /* S >= 2: a GEMM on a P2P allgather's chunks computes, in the loop, only
     the first N/S columns (its weight's first N/S columns, the exchange
     behind the local rows' part); the other parts run after the loop, one
     GEMM each of every row. The weight is read 1 + (D - 1)/S times instead
     of D; measured slower than the best pipeline on every decode shape
     (bench/NOTES.md section 42). N must divide by S at run time. 0 or 1: off. */
  int column_parts;
  /* 1: a ring allgather copies the own chunk into the gathered tensor, and
     its readers read it there (nvFuser's programs). 0: where that tensor is
     an intermediate read chunk by chunk, the readers take the own chunk
     straight from the allgather's input and the own step copies nothing -
     unless hir_lower_desc.comm runs send/recv as NCCL kernels
     (p2p_copy_engine 0), which then wait for the SMs of the own step's
     GEMM, and the copy that delays it pays (bench/NOTES.md section 49). */
  int copy_own_chunk;
} hir_stream_experimental;
typedef struct hir_stream_desc {  /* zero-initialized = defaults */
  hir_schedule schedule;
  /* LINEAR, RING: each peer's chunk cut into this many parts along its first
     axis after the Stream axis, one part an iteration (part-major: the first
     parts of all peers, then the second ...), so the GEMM left exposed at the
     end is that much shorter; that axis's local size must divide. Measured
     to pay only where communication is the longer side, and with
     number_of_streams >= the mesh size (bench/NOTES.md, section 14). 0 = 1,
     or with `automatic` the model's choice. COLLECTIVE: the parts of the
     collective pipeline, 2 to 1024 (0: 2). */
  int parts;
  /* 1: a P2P allgather is a loop of its own (nvFuser's AllgatherP2p: the
     exchange alone on the Stream axis), and the ops that read the gathered
     tensor run once, whole, after it, instead of a chunk as each arrives.
     Where M is small (decode) a GEMM cut by rows reads its whole weight once
     a chunk, and the exchange is short: bench/NOTES.md section 41. */
  int gather_first;
  int bounded_buffers;  /* an intermediate only its loop uses keeps numberOfStreams slices, reused round-robin */
  /* automatic = 1: keep the fusion's Stream axes only where a cost model says
     the pipeline beats the serial program by 3% for these local input shapes
     (as hir_run will get them; data ignored); else lower it serial. The
     model: GEMM time = flops / a GEMM rate, communication = bytes moved / a
     link rate, a cost per chunk, and the pipeline hides all but one chunk of
     the shorter of the two - only where it is a P2P pipeline whose send/recv
     run on copy engines (the communicator in hir_lower_desc.comm says so:
     p2p_copy_engine). Otherwise the communication runs as NCCL kernels that
     wait for the SMs a GEMM holds (bench/NOTES.md, sections 0-1), and the
     model, expecting no overlap, lowers serial. With overlap it also picks
     the parts (unless given): each part beyond one a peer costs more
     (smaller GEMMs, one more wait). The rates are the ones measured on H200
     with copy-engine P2P (bench/RESULTS.md; experimental below sets others).
     hir_program_plan says what was chosen and why. hir_tuner measures
     instead of modelling. */
  int automatic;
  const struct hir_tensor *input_shapes;
  int ninput_shapes;
  hir_stream_experimental experimental; /* knobs for studying hostir itself (above) */
} hir_stream_desc;
typedef struct hir_lower_desc {     /* zero-initialized = defaults */
  int my_device;                    /* this rank's device id */
  hir_merge_fn should_merge;        /* NULL: hir_merge_default */
  void *merge_user;
  int skip_stream_lowering, skip_deallocations;
  hir_stream_desc stream;        /* options of the stream-lowering pass */
  const hir_comm *comm;             /* the communicator the program will run on (or NULL): what it can do
                                       guides stream.automatic and stream.experimental.copy_own_chunk; nothing else of
                                       it is read */
} hir_lower_desc;
/* On failure *out still receives a program holding only the error (read it
   with hir_program_error, free it), or NULL when even that allocation failed.
   Safe to call from several threads on one fusion: the fusion is only read.
   HOSTIR_DUMP=host_ir prints the program after lowering, HOSTIR_DUMP=passes
   after every pass (comma-separated; HOSTIR_DUMP_FILE=path appends there
   instead of stderr). */
HIRDEF hir_status      hir_lower(const hir_fusion *f, const hir_lower_desc *d, hir_program **out);
HIRDEF int             hir_program_device(const hir_program *p);
HIRDEF const char     *hir_program_plan(const hir_program *p);  /* the automatic choice or a tuner's report, "" if neither */

/* Segmentation alone: sharding propagation and resharding decomposition on a
   copy of the fusion, then the merge-predicate segmenter; inspect the groups. */
typedef struct hir_segmentation hir_segmentation;
HIRDEF hir_status       hir_segment(const hir_fusion *f, const hir_lower_desc *d, hir_segmentation **out);
HIRDEF int              hir_segmentation_ngroups(const hir_segmentation *s);
HIRDEF const hir_group *hir_segmentation_group(const hir_segmentation *s, int i);
HIRDEF const char      *hir_segmentation_error(const hir_segmentation *s);
HIRDEF void             hir_segmentation_free(hir_segmentation *s);
/* Graphviz DOT: a cluster per group (grey: a resharding group, lowered to
   communications), exprs as boxes, tensors as ellipses (inputs and outputs
   doubled), edges along the data. `dot -Tsvg` draws it. */
HIRDEF hir_status       hir_segmentation_print_dot(const hir_segmentation *s, FILE *out);
HIRDEF size_t           hir_segmentation_snprint_dot(const hir_segmentation *s, char *buf, size_t cap);

/* Passes: plain functions on a program, in the order hir_lower runs them.
   Each records its error in the program and returns the status. */
HIRDEF hir_status hir_pass_stream_lowering(hir_program *p, const hir_stream_desc *options);
HIRDEF hir_status hir_pass_convert_communications(hir_program *p);
HIRDEF hir_status hir_pass_insert_deallocations(hir_program *p);
/* The schedule verifier: the programs of all ranks (programs[r] runs on
   device r), their collectives matched per team and their send/recv matched
   per coalescing group, as the communicators would; HIR_ERR_COMM with the
   mismatch or the deadlock in msg. Loops are unrolled: a DIDx extent is the
   mesh size, any other extent taken as 3. */
HIRDEF hir_status hir_verify_schedule(hir_program *const *programs, int nranks, int number_of_streams, char *msg, size_t cap);
/* Checks the program's structure: operands defined before use, waits after
   what they wait on, coalescing pairs, no use after Deallocate, no StreamIdx
   loop inside another. */
HIRDEF hir_status hir_program_verify(hir_program *p);   /* records the reason in the program */

/* ---- evaluation ---- */
typedef struct hir_tensor {
  void *data; hir_dtype dtype; int ndims;
  int64_t sizes[HIR_MAX_DIMS];
  int64_t strides[HIR_MAX_DIMS];    /* elements; all zero = contiguous */
} hir_tensor;

/* A backend: memory, streams, events and the compute ops, as function
   pointers over a context (implement one to run hostir elsewhere). Tensors
   given to the ops carry explicit strides; a stride of 0 repeats an element
   (broadcasting); dst never overlaps a source (but binary's dst may be a). Streams and events are opaque
   handles; NULL is the caller's stream. A failing op writes `error`. */
struct hir_backend {
  void *ctx;
  const char *name;
  const char *device;               /* which device ("NVIDIA H200"), for tuning plans; NULL: `name` says enough */
  int host_memory;                  /* 1: buffers are host-accessible */
  char error[256];
  void (*destroy)(hir_backend *self);
  hir_status (*alloc)(hir_backend *self, size_t bytes, void **ptr);
  void (*release)(hir_backend *self, void *ptr);
  void *(*current_stream)(hir_backend *self);           /* what GetCurrentStream captures */
  hir_status (*stream_create)(hir_backend *self, void **stream);
  void (*stream_destroy)(hir_backend *self, void *stream);
  hir_status (*event_create)(hir_backend *self, void **event);
  void (*event_destroy)(hir_backend *self, void *event);
  hir_status (*event_record)(hir_backend *self, void *event, void *stream);
  hir_status (*stream_wait_event)(hir_backend *self, void *stream, void *event);  /* no host block */
  hir_status (*stream_synchronize)(hir_backend *self, void *stream);               /* host blocks */
  hir_status (*stream_query)(hir_backend *self, void *stream);   /* HIR_OK: done; HIR_ERR_TIMEOUT: still busy */
  hir_status (*copy)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *src);
  hir_status (*binary)(hir_backend *self, void *stream, hir_binary_op op, const hir_tensor *dst,
                       const hir_tensor *a, const hir_tensor *b);       /* a, b shaped like dst; dst may be a */
  /* dst = op(src) elementwise (HIR_UNARY_OP_LIST; s: the scalar of its scalar
     forms), src shaped like dst, dst's dtype maybe another (computed, then
     stored in dst's). NULL: the backend refuses UnaryOps. */
  hir_status (*unary)(hir_backend *self, void *stream, hir_unary_op op, const hir_tensor *dst, const hir_tensor *src,
                      double s);
  hir_status (*sum)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *src);
                                    /* dst: src's shape with size 1 on the reduced axes */
  /* Optional: dst = the max of src over the axes where dst has size 1 (as
     sum; -inf over none, NaN where one is NaN). NULL: MaxOps are refused. */
  hir_status (*max)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *src);
  hir_status (*matmul)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *a,
                       const hir_tensor *b);  /* [..., M, N] = [..., M, K] x [..., K, N], one ndims */
  /* Optional: dst = op(a x b + bias) in one call (a GEMM epilogue), bias
     shaped like dst with stride 0 on all axes but the last (one value per
     column), op HIR_UNARY_COUNT (none), relu or gelu_tanh. NULL, or
     HIR_ERR_UNSUPPORTED for what it does not take: matmul, binary, unary. */
  hir_status (*matmul_bias)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *a, const hir_tensor *b,
                            const hir_tensor *bias, hir_unary_op op);
  hir_status (*upload)(hir_backend *self, void *dst, const void *src, size_t bytes);    /* host -> backend */
  hir_status (*download)(hir_backend *self, void *dst, const void *src, size_t bytes);  /* backend -> host */
  /* Optional; NULL where work runs when it is issued (the CPU). Events that
     keep time, and the milliseconds from one to another once both have
     passed (HIR_ERR_TIMEOUT while one has not): the timeline's GPU spans. */
  hir_status (*timer_create)(hir_backend *self, void **event);
  hir_status (*timer_elapsed)(hir_backend *self, void *from, void *to, double *ms);
  /* Optional; NULL where there is nothing to capture (the CPU). Between
     graph_begin and graph_end the work issued on current_stream (which may
     change to a capturing stream of the backend's own) and on the streams
     that wait on it is recorded, not run; graph_end returns it ready to
     launch, as often as needed, on the caller's stream. */
  hir_status (*graph_begin)(hir_backend *self);
  hir_status (*graph_end)(hir_backend *self, void **graph);
  hir_status (*graph_launch)(hir_backend *self, void *graph);
  void (*graph_destroy)(hir_backend *self, void *graph);
  /* Optional: the largest |a - b| and the largest |b| over two dense tensors
     of one shape and dtype (NaN counts as infinite), known when it returns
     (the host waits for the stream): how a tuner compares outputs where they
     live. NULL: they are downloaded and compared on the host. */
  hir_status (*max_abs)(hir_backend *self, void *stream, const hir_tensor *a, const hir_tensor *b, double *diff, double *b_max);
  /* Optional: the backend's index-th shared stream, made on first use and
     counted (stream_destroy gives one count back; the last destroys it).
     Evaluators take their streams here, so that the evaluators of one
     backend share them - their runs are ordered by the caller anyway - and
     a backend serving many programs (one per shape) holds as many streams
     as the widest needs, not their sum. NULL: stream_create. */
  hir_status (*stream_shared)(hir_backend *self, int index, void **stream);
  /* Optional: hir_scaled_linear's product: dst = (a * a_scale) x (b * b_scale), a and b fp8 ([..., M, K] and
     [..., K, N], as matmul), the scales f32 shaped like dst with stride 0 where they do not vary (a_scale
     along N, b_scale along M, both everywhere for one value), accumulated in f32. NULL: such programs are
     refused when they run. */
  hir_status (*matmul_scaled)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *a,
                              const hir_tensor *b, const hir_tensor *a_scale, const hir_tensor *b_scale);
  /* Optional: hir_layer_norm in one call: dst = (x - mean) / sqrt(var + eps) * weight + bias over x's last
     `naxes` axes (x and dst dense, one shape; weight and bias dense with their numel, or NULL), computed in
     f32 or wider (f64 for f64 x). NULL, or HIR_ERR_UNSUPPORTED for what it does not take: its primitives run. */
  hir_status (*layer_norm)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *x,
                           const hir_tensor *weight, const hir_tensor *bias, int naxes, double eps);
  /* Optional: hir_rms_norm in one call: dst = x / sqrt(mean(x^2) + eps) * weight, as layer_norm takes them. */
  hir_status (*rms_norm)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *x,
                         const hir_tensor *weight, int naxes, double eps);
  /* Optional: numbered elements into dst: the element at dst's coordinates c
     is numbered n = sum over axes i of (base[i] + c[i]) * stride[i], and is
     hir_rand_value(seed, n, bits) (hir_rand; bits the significand of dst's
     dtype: 24 for f32 and f64, 11 for f16, 8 for bf16), or n itself where
     bits is 0 (hir_iota). NULL: the backend refuses RNGOps. */
  hir_status (*rand)(hir_backend *self, void *stream, const hir_tensor *dst, uint64_t seed, const int64_t *base,
                     const int64_t *stride, int bits);
  /* Optional (MoE, hir_host_moe_*): dst = zeros, then row i of src into row
     where[i] of dst where that lies in dst (rows: the first axis; dst and src
     dense, one dtype; where int64, one per row of src). NULL: MoE ops are
     refused. */
  hir_status (*scatter_rows)(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *src,
                             const hir_tensor *where);
  /* Optional (MoE): int64 row numbers into out (dense), T tokens, R =
     counts' length, C = T * R, by step:
     HIR_MOE_ROUTE: in [T] the tokens' experts (E experts): out [T] = r * T +
       k, r = expert / (E / R), k the token's place among those to r by
       expert then token (-1 for an expert outside [0, E)); out2 [C]: t at
       row out[t], -1 elsewhere; counts [R] written (the tokens to each r);
     HIR_MOE_COMPACT: counts read: out [C] = row s * T + j's place in the
       rows kept, counts[0] + .. + counts[s - 1] + j, for j < counts[s]; else -1;
     HIR_MOE_EXPAND: counts read: out [C] = s * T + j for row
       counts[0] + .. + counts[s - 1] + j, j < counts[s]; rows after: -1;
     HIR_MOE_COMBINE: in [C], counts read: out [C] = in[s * T + j] for
       j < counts[s] where that lies in [0, T); else -1. */
  hir_status (*moe_index)(hir_backend *self, void *stream, int step, const hir_tensor *out, const hir_tensor *out2,
                          const hir_tensor *in, const hir_tensor *counts, int64_t tokens, int64_t experts);
  /* Optional: whether the backend's ops can reach the memory at ptr (1), or
     (0) why not in `why`, with what to do. hir_run asks it of each caller's
     tensor at an address not seen there before. NULL: not asked. */
  int (*reachable)(hir_backend *self, const void *ptr, char *why, size_t cap);
  /* Optional: pinned host memory, and bytes copied between it and the
     backend's memory in `stream`'s order, done once stream_query says the
     stream is idle: the host never waits in them. The ranks' meetings go
     through them, so that every wait for a peer is one under a deadline (a
     synchronous copy behind a dead peer's collective never returns).
     NULL: upload and download, which wait on the host. */
  hir_status (*host_alloc)(hir_backend *self, size_t bytes, void **ptr);
  void (*host_release)(hir_backend *self, void *ptr);
  hir_status (*copy_async)(hir_backend *self, void *stream, void *dst, const void *src, size_t bytes);
  const char *notes;                /* what it could not do as configured, and why (the CUDA backend's kernel cache); NULL or "": nothing */
};

/* What a communication moves, in the program's terms: the evaluator fills it
   before each call (copies, no formatting); a communicator prints it only
   for its messages, "T3 [1, 2, 4] float" (hir_comm_what_snprint). */
typedef struct hir_comm_what {
  int tensor;                   /* the n of "Tn"; -1: not said ("a buffer") */
  hir_dtype dtype;
  int ndims;
  int64_t sizes[HIR_MAX_DIMS];
} hir_comm_what;
HIRDEF size_t hir_comm_what_snprint(const hir_comm_what *what, char *buf, size_t cap);   /* like snprintf */

/* A communicator: this rank's device id in a world of `size` ranks, teams of
   device ids, the collectives over a team, send/recv to a device, coalescing
   groups. `root` and `peer` are device ids; a team handle is created once per
   team, by its members only. Reductions sum. In gather and reduce the root
   may pass send = NULL when it holds no data: gather then receives the other
   members' chunks in team order. A failing call writes `error`. */
struct hir_comm {
  void *ctx;
  int rank, size;
  int p2p_copy_engine;      /* send/recv run on copy engines, not SMs: a pipeline overlaps them with GEMMs */
  int needs_device_memory;  /* buffers must be the GPU's (NCCL): a host-memory backend is refused */
  int capturable;           /* its calls may be captured into a CUDA graph and replayed (hostir_nccl's: NCCL and copy engines) */
  char error[512];
  hir_comm_what what;       /* what the next call moves, set by the evaluator: for messages when ranks disagree */
  hir_status (*team)(hir_comm *self, const int *devices, int n, void **team);
  hir_status (*allgather)(hir_comm *self, void *team, const void *send, void *recv, size_t bytes, void *stream);
  hir_status (*allreduce)(hir_comm *self, void *team, const void *send, void *recv, size_t count, hir_dtype dtype,
                          void *stream);
  hir_status (*reduce_scatter)(hir_comm *self, void *team, const void *send, void *recv, size_t count,
                               hir_dtype dtype, void *stream);   /* count: elements each member receives */
  hir_status (*reduce)(hir_comm *self, void *team, const void *send, void *recv, size_t count, hir_dtype dtype,
                       int root, void *stream);
  hir_status (*broadcast)(hir_comm *self, void *team, const void *send, void *recv, size_t bytes, int root,
                          void *stream);
  hir_status (*gather)(hir_comm *self, void *team, const void *send, void *recv, size_t bytes, int root,
                       void *stream);    /* bytes: each sender's chunk */
  hir_status (*scatter)(hir_comm *self, void *team, const void *send, void *recv, size_t bytes, int root,
                        void *stream);   /* bytes: each member's chunk */
  hir_status (*send)(hir_comm *self, const void *buf, size_t bytes, int peer, void *stream);
  hir_status (*recv)(hir_comm *self, void *buf, size_t bytes, int peer, void *stream);
  hir_status (*group_start)(hir_comm *self);
  hir_status (*group_end)(hir_comm *self);
  void (*abort)(hir_comm *self);  /* ends the world's communication; what `error` holds then, the others are told */
  hir_status (*poll)(hir_comm *self);  /* optional: an error raised by work in flight (a dead peer) */
  /* optional: the evaluator's buffers live until freed; a communicator may
     register them (NCCL user-buffer registration) to skip internal copies */
  void (*register_buffer)(hir_comm *self, void *ptr, size_t bytes);
  void (*deregister_buffer)(hir_comm *self, void *ptr);
  /* optional: send/recv on the copy engines (1) or on the collectives' path
     (0: NCCL's kernels, which a CUDA graph can capture), from the next call
     on; sets p2p_copy_engine and capturable to match. NULL: fixed. */
  hir_status (*set_copy_engine)(hir_comm *self, int enable);
  /* optional: which allocation holds ptr (0: none known). Where captured
     send/recv write through mappings of the peers' allocations (copy
     engines between processes), a graph replays only on the outputs'
     allocations it was captured with: the same address in a new allocation
     is a move. */
  unsigned long long (*allocation_of)(hir_comm *self, const void *ptr);
  /* optional: receives a CUDA graph posts at its replay's start. The
     evaluator sets recv_at_start for a captured recv whose buffer nothing
     before it in the run touched (by address); the communicator may then
     leave that receive's "buffer free" signal out of the graph, so that
     the sender's copy need not wait for the receiving stream to reach it,
     and keep it for start_signals_take, which hands over those kept since
     its last call (NULL: none). The evaluator raises them on the launch
     stream before every launch of the graph just captured
     (start_signals_raise), and frees them with it (start_signals_release). */
  int recv_at_start;
  void *(*start_signals_take)(hir_comm *self);
  hir_status (*start_signals_raise)(hir_comm *self, void *signals, void *stream);
  void (*start_signals_release)(hir_comm *self, void *signals);
  /* optional: which path a collective of `type` moving `bytes` (an
     all-reduce's buffer, a reduce-scatter's input, an all-gather's output)
     takes, for the plan ("NCCL", "hostir's two-shot kernel (128 CTAs, the
     input read in place)"); NULL: not said. */
  const char *(*collective_path)(hir_comm *self, void *team, hir_collective type, size_t bytes, hir_dtype dtype);
  /* optional: the communicator's choice of path by collective and size (as
     measured at its creation) as one line of printable text, words one
     space apart, written into buf (NUL-terminated where cap allows); what
     it needs, 0 where there is no choice to save. hir_tuner_save keeps it
     with the plans. */
  size_t (*collective_choice)(hir_comm *self, char *buf, size_t cap);
  /* optional: that choice taken again, for the calls after this one. The
     tuner calls it on every rank at one point of the program, and only
     where every rank loaded the same text; HIR_ERR_INVALID, `error` saying
     why, for a text this communicator cannot take (malformed, another world
     size, kernels it does not have). */
  hir_status (*set_collective_choice)(hir_comm *self, const char *text);
  /* optional: an all-reduce (sum) of send's rows x cols elements, then, row
     by row, h = that sum + residual and out = h / sqrt(mean(h^2) + eps) *
     weight (weight: cols elements, or NULL), with h and out written and the
     sum itself never: an Allreduce followed by a residual add and an
     RMSNorm (hir_rms_norm) in one call, as inference engines fuse them.
     Every buffer dense and of `dtype`; the sum rounded to it before the add,
     h rounded before the norm. The evaluator calls it in place of such a
     run of a program (the plan says so); HIR_ERR_UNSUPPORTED, decided alike
     on every rank from the sizes and the dtype alone: the three run apart. */
  hir_status (*allreduce_rms_norm)(hir_comm *self, void *team, const void *send, const void *residual, const void *weight,
                                   void *h, void *out, size_t rows, size_t cols, hir_dtype dtype, double eps, void *stream);
};

/* The position of `device` in a team (or mesh) of n device ids, -1 if it is
   not there: what a communicator needs to map a team's devices to its ranks. */
HIRDEF int              hir_team_index(const int *team, int n, int device);

HIRDEF hir_backend     *hir_backend_cpu_create(void);
/* CUDA (compile the implementation with HOSTIR_CUDA; link cudart, cublas,
   cublasLt and dl). NULL if the device cannot be used. Ops run on the caller's
   stream set here (default: the legacy default stream); TF32 is off unless
   enabled. The calling thread's current device becomes `device`. The
   elementwise kernels are compiled by NVRTC (libnvrtc.so, found through the
   loader's paths or CUDA_HOME) when first needed, about 20 ms once per
   backend; without NVRTC, unary ops fail with a message saying so. */
#if defined(HOSTIR_CUDA) || !defined(HOSTIR_STATIC)
HIRDEF hir_backend     *hir_backend_cuda_create(int device);
/* The same, saying why not: HIR_ERR_BACKEND (no such device, a driver
   failure) or HIR_ERR_NOMEM, with a message in error. Where the kernel
   cache was not used, or an entry of it was refused, the backend's `notes`
   say why. */
HIRDEF hir_status       hir_backend_cuda_open(int device, hir_backend **out, char *error, size_t cap);
HIRDEF void             hir_backend_cuda_set_stream(hir_backend *b, void *cuda_stream);
HIRDEF void             hir_backend_cuda_set_tf32(hir_backend *b, int enable);
/* CUDA C++ `source` compiled by NVRTC for `device`'s architecture (sm_90a
   on a 9.0 GPU: wgmma and setmaxnreg may be used; through the kernel cache,
   as the backend's own kernels) and loaded: *library is a cudaLibrary_t,
   for code that launches kernels of its own (hostir_nccl.h's collectives).
   `name` names it in messages. */
HIRDEF hir_status       hir_cuda_library_load(int device, const char *source, const char *name, void **library, char *error,
                                              size_t cap);
#endif
HIRDEF void             hir_backend_free(hir_backend *b);
/* N ranks as N threads of one process: collectives through shared memory. */
HIRDEF hir_local_world *hir_local_world_create(int nranks);
HIRDEF void             hir_local_world_set_timeout(hir_local_world *w, int milliseconds); /* default 60000 */
HIRDEF hir_comm        *hir_local_comm(hir_local_world *w, int rank);   /* owned by the world */
HIRDEF void             hir_local_world_free(hir_local_world *w);
/* Runs fn(rank, user) on nranks threads; returns the first failure, or the
   cause where one rank's failure made the others' communication fail;
   HIR_ERR_BACKEND at once, no rank run, where a rank's thread could not be
   started (the process is out of threads). */
HIRDEF hir_status       hir_spmd(int nranks, hir_status (*fn)(int rank, void *user), void *user);

/* Runs as CUDA graphs (hir_eval_desc.graph). */
typedef enum hir_graph_mode {
  HIR_GRAPH_OFF,        /* eager runs: the host program walked every run */
  HIR_GRAPH_BY_ADDRESS, /* a graph per shape and argument addresses, captured at the first run there, then replayed */
  HIR_GRAPH_STAGED      /* as BY_ADDRESS, on copies of the arguments the evaluator keeps: any addresses replay */
} hir_graph_mode;
typedef struct hir_eval_desc {
  hir_backend *backend; hir_comm *comm; int number_of_streams;
  int timeout_ms;   /* hir_evaluator_sync gives up (and aborts the communicator) after this; 0: 600000 */
  /* HIR_GRAPH_BY_ADDRESS: after one eager run of a shape (its buffers made), a run with
     inputs and outputs at addresses not seen yet is captured into a CUDA
     graph, then launched; a run at seen addresses only launches its graph
     (the host program is not walked again). Up to 8 graphs per shape; a new
     shape drops them (one evaluator per shape, or hir_tuner, keeps several).
     A program that communicates is captured once per shape, on every rank
     at the same run (NCCL's rule: a captured collective is launched by all
     its ranks alike), and then runs only at those addresses: a run at others
     is refused (on every rank, through the world's abort).
     Where nothing can be captured (the CPU backend, a communicator that
     says capturable = 0, a timeline being recorded, a failed capture) runs
     stay eager and hir_program_plan says why.
     HIR_GRAPH_STAGED: as BY_ADDRESS, but the graph runs on copies of the
     arguments the evaluator keeps; each run copies the caller's inputs in
     and outputs out around the launch, on the caller's stream. A program
     that communicates then replays at any addresses (a decode loop's new
     outputs each step), an output passed or left to the evaluator as each
     run likes, for the copies' time and memory. */
  hir_graph_mode graph;
  /* check_shapes = 1: the ranks compare their shapes on every run, not only
     when they change (hir_run), so that a rank that alone changes its shapes
     is refused on every rank with one message too; one small allgather a
     run, as a debugging aid (TORCH_DISTRIBUTED_DEBUG's kind). */
  int check_shapes;
} hir_eval_desc;
/* One evaluator per rank per program; the program must outlive it. A NULL
   backend means a CPU backend owned by the evaluator; comm may be NULL for a
   program without communications, where no rank of the fusion's meshes has
   one (else every rank needs it: hir_run compares shapes across them). On
   failure *out holds only the error. */
HIRDEF hir_status  hir_evaluator_create(const hir_program *p, const hir_eval_desc *d, hir_evaluator **out);
/* Inputs by position. An input whose mesh does not hold this rank is passed
   empty (data NULL, ndims 0), or shape-only (data NULL, sizes set) when this
   rank needs its sizes (say, to receive a tensor shaped like it). Outputs
   with data set are written in place; else they receive the evaluator's
   buffers, valid until the next hir_run or hir_evaluator_free (passing those
   back, as when the same array is reused, asks for them again). Any layout
   (strides >= 0: a transpose, an expanded input axis; an output's elements
   each in a place of their own): a tensor that is not dense row-major is
   copied into a buffer of the evaluator's as the run starts (an input) or
   out of one as it ends (an output), on the caller's stream. Every device
   of the fusion's meshes runs it, with the same shapes (its own shard where
   an axis is split): the first run, and each run whose shapes or scalars
   differ from the last, compares them across those ranks (one small
   allgather) and refuses a difference on every rank with one message,
   naming the input and which devices passed what. The ranks change shapes
   at the same run: one that alone passes new shapes fails with the others
   in their next communication, or at the timeout (unless check_shapes). */
HIRDEF hir_status  hir_run(hir_evaluator *ev, const hir_tensor *in, int nin, hir_tensor *out, int nout);
HIRDEF hir_status  hir_evaluator_sync(hir_evaluator *ev);
HIRDEF const char *hir_evaluator_error(const hir_evaluator *ev);
HIRDEF void        hir_evaluator_free(hir_evaluator *ev);
HIRDEF hir_backend *hir_evaluator_backend(const hir_evaluator *ev);
HIRDEF size_t      hir_evaluator_memory(const hir_evaluator *ev);  /* bytes of buffers it holds now */

/* Tuning: the automatic choice by measurement. A tuner owns one fusion's
   programs on this rank (the fusion must outlive it). Its first run with
   new input shapes lowers the candidates - serial; P2P ring and linear with
   1, 2 and 4 parts a peer; 2 and 4 streams; bounded buffers as well when
   memory_limit is set; the P2P pipelines as collective pipelines of 2 and
   4 parts - checks each on these shapes, and times the ones
   every rank accepts (warmup + iters runs, the ranks meeting before each
   timed one). A candidate whose outputs differ from serial's beyond the
   dtype's tolerance (relative to serial's largest value: f64 1e-9, f32
   1e-4, f16 1e-2, bf16 3e-2), or whose buffers besides the outputs exceed
   memory_limit, is dropped and named. A candidate's time is its slowest rank's median; the
   ranks agree through the communicator, so every rank runs the same
   schedule. Later runs with those shapes run the choice at no extra cost.
   Collective: every device of the fusion's meshes makes its tuner and runs
   the same shapes in the same order. A failure or a timeout on one rank is
   an error on every rank. hir_program_plan(hir_tuner_program(t)) says what
   was measured, chosen and dropped. */
typedef struct hir_tuner hir_tuner;
typedef struct hir_tune_desc {
  hir_lower_desc lower;   /* as for hir_lower (my_device, comm, ...); the candidates set its stream options */
  hir_eval_desc eval;     /* as for hir_evaluator_create; the candidates set number_of_streams */
  size_t memory_limit;    /* bytes a candidate's evaluator may hold besides the outputs; 0: no limit */
  int warmup, iters;      /* runs per candidate (warmup counts the first run, >= 2); 0: each fills about 10 ms,
                             iters at least 3. With eval.graph on a communicator whose send/recv run on copy
                             engines and can switch to NCCL's (set_copy_engine), the candidates are timed both ways;
                             with eval.graph on a backend that captures, the 3 fastest again without a graph */
  const char *machine;    /* names the machine in saved plans; NULL: the backend's device, the ranks, the copy engines */
} hir_tune_desc;
HIRDEF hir_status         hir_tuner_create(const hir_fusion *f, const hir_tune_desc *d, hir_tuner **out);
HIRDEF hir_status         hir_tuner_run(hir_tuner *t, const hir_tensor *in, int nin, hir_tensor *out, int nout); /* as hir_run */
HIRDEF hir_status         hir_tuner_sync(hir_tuner *t);
HIRDEF hir_status         hir_tuner_tune(hir_tuner *t, const hir_tensor *in, int nin);  /* tune now, before serving */
HIRDEF const hir_program *hir_tuner_program(const hir_tuner *t);     /* the last choice's; NULL before one */
HIRDEF hir_evaluator     *hir_tuner_evaluator(const hir_tuner *t);
HIRDEF const char        *hir_tuner_error(const hir_tuner *t);
/* Saved plans, a text file (format at hir_tuner_save): load them before the
   first run and a serving process does not tune at start. A file from
   another hostir version, machine or fusion is refused by name; ranks that
   load different choices are refused on their first run. */
HIRDEF hir_status         hir_tuner_save(const hir_tuner *t, FILE *f);
HIRDEF hir_status         hir_tuner_load(hir_tuner *t, FILE *f);
/* Every option with its default written out: a copy of *d (NULL: all zeros)
   in which each field whose zero stands for a value holds that value:
   lower.should_merge hir_merge_default; lower.stream.parts 1, 2 for
   HIR_SCHEDULE_COLLECTIVE (left 0 where stream.automatic picks the parts of
   a P2P pipeline); eval.number_of_streams 4; eval.timeout_ms 600000. A zero
   that is a choice rather than a value stays: warmup and iters (sized to
   the work), memory_limit (none), machine, backend and comm. hir_lower and
   hir_segment (.lower), hir_pass_stream_lowering (.lower.stream),
   hir_evaluator_create (.eval) and hir_tuner_create fill their descs
   through it, so a desc and its filled copy behave alike. */
HIRDEF hir_tune_desc      hir_desc_defaults(const hir_tune_desc *d);
/* The same by path, for files from outside: loaded only as a regular file
   of this user of at most 64 MiB, no link followed at its name; saved
   through a temporary file in its directory (mode 0600), renamed over it,
   so that a reader never sees half a file. Either way a refused file
   changes nothing in the tuner, and the error says why. */
HIRDEF hir_status         hir_tuner_save_file(hir_tuner *t, const char *path);
HIRDEF hir_status         hir_tuner_load_file(hir_tuner *t, const char *path);
HIRDEF void               hir_tuner_free(hir_tuner *t);
/* A timeline: with record = 1 the evaluator notes, for every host IR node it
   executes (loops and branches by their bodies), when the host ran it and
   on which stream (on the CPU backend that is when the work ran; on a GPU,
   when it was issued). Where the backend keeps time (CUDA), it also notes
   when the stream ran each node's work: timing events around it, on the
   host's clock from an event passed when recording starts (which drains
   the caller's stream once; call it on the thread that runs the evaluator). Records add up over runs until cleared
   (record = 0); buffers for 65536 nodes and 8192 GPU spans are made here,
   so runs never allocate, and later nodes go unrecorded. hir_timeline_write
   writes the evaluators' records - one per rank - as a Chrome trace /
   Perfetto JSON file: a process per rank, a track per stream, host and GPU.
   Call it after hir_evaluator_sync: while a GPU span has not passed it
   returns HIR_ERR_TIMEOUT and writes nothing. */
HIRDEF hir_status  hir_evaluator_record_timeline(hir_evaluator *ev, int record);
HIRDEF int         hir_evaluator_timeline_size(const hir_evaluator *ev);
HIRDEF hir_status  hir_timeline_write(hir_evaluator *const *evs, int n, FILE *out);

/* DLPack (include dlpack.h before hostir.h, in the implementation file too):
   tensors of PyTorch, JAX or CuPy in and out without copies. from: a view of
   t (its byte_offset applied; strides kept). to: a DLManagedTensor that
   borrows t's data (keep the data alive while it is used; its deleter frees
   only what this call allocated); device_type and device_id say where the
   data lives (kDLCPU, 0 for the CPU backend; kDLCUDA, device for CUDA). */
#if defined(DLPACK_VERSION) || defined(DLPACK_MAJOR_VERSION)
HIRDEF hir_status hir_tensor_from_dlpack(const DLTensor *t, hir_tensor *out, char *error, size_t cap);
HIRDEF hir_status hir_tensor_to_dlpack(const hir_tensor *t, int device_type, int device_id, DLManagedTensor **out);
#define HOSTIR_DLPACK
#endif

/* Half precision and fp8, round to nearest even; fp8 saturates to its
   largest finite value (infinities too, as the GPUs' satfinite conversions),
   NaN stays NaN. */
HIRDEF uint16_t hir_float_to_half(float f);
HIRDEF float    hir_half_to_float(uint16_t h);
HIRDEF uint16_t hir_float_to_bf16(float f);
HIRDEF float    hir_bf16_to_float(uint16_t b);
HIRDEF uint8_t  hir_float_to_e4m3(float f);
HIRDEF float    hir_e4m3_to_float(uint8_t b);
HIRDEF uint8_t  hir_float_to_e5m2(float f);
HIRDEF float    hir_e5m2_to_float(uint8_t b);

/* SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104): the kernel cache's
   checks, hostir_nccl's bootstrap handshake. */
typedef struct hir_sha256 {
  uint32_t h[8];
  uint64_t bytes;
  unsigned char block[64];
} hir_sha256;
HIRDEF void hir_sha256_init(hir_sha256 *s);
HIRDEF void hir_sha256_update(hir_sha256 *s, const void *data, size_t n);
HIRDEF void hir_sha256_final(hir_sha256 *s, unsigned char out[32]);
HIRDEF void hir_hmac_sha256(const void *key, size_t key_bytes, const void *data, size_t n, unsigned char out[32]);
/* A HOSTIR_* switch from the environment: 0/off/false or 1/on/true in any
   case; unset: fallback. Anything else is HIR_ERR_INVALID, with a message
   naming the variable and the words it takes. */
HIRDEF hir_status hir_env_switch(const char *name, int fallback, int *on, char *error, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* HOSTIR_H */

/* ======================================================================== */
#ifdef HOSTIR_IMPLEMENTATION
#ifndef HOSTIR_IMPLEMENTATION_DONE
#define HOSTIR_IMPLEMENTATION_DONE
// >>base

#ifdef HOSTIR_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h> /* NVRTC, loaded when the elementwise kernels are first needed */
#ifndef HOSTIR_NO_NVTX /* NVTX ranges around host IR nodes: Nsight Systems shows the host program */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic" /* nvtx3 casts dlsym's result to a function pointer */
#endif
#include <nvtx3/nvToolsExt.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#define HIR__RANGE_PUSH(name) nvtxRangePushA(name)
#define HIR__RANGE_POP() nvtxRangePop()
#endif
#endif
#ifndef HIR__RANGE_PUSH
#define HIR__RANGE_PUSH(name) ((void)0)
#define HIR__RANGE_POP() ((void)0)
#endif
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>    /* openat, O_NOFOLLOW: files from outside */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h> /* getenv */
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(HIR_MALLOC) && defined(HIR_FREE) && defined(HIR_REALLOC)
/* all three given */
#elif !defined(HIR_MALLOC) && !defined(HIR_FREE) && !defined(HIR_REALLOC)
#include <stdlib.h>
#define HIR_MALLOC(sz) malloc(sz)
#define HIR_REALLOC(p, sz) realloc(p, sz)
#define HIR_FREE(p) free(p)
#else
#error "hostir.h: define all of HIR_MALLOC, HIR_REALLOC and HIR_FREE, or none of them"
#endif

#ifndef HIR_THREAD_CREATE /* pthread_create's result */
#define HIR_THREAD_CREATE(thread, fn, arg) pthread_create(thread, NULL, fn, arg)
#endif

#ifndef HIR_ASSERT
#include <assert.h>
#define HIR_ASSERT(x) assert(x)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define HIR__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define HIR__PRINTF(a, b)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define HIR__UNUSED __attribute__((unused)) /* used where HOSTIR_CUDA is (and by the tests) */
#else
#define HIR__UNUSED
#endif

#define HIR__STATIC_ASSERT(name, cond) typedef char hir__static_assert_##name[(cond) ? 1 : -1]

#define HIR__ENUM_STRING(e, s) s,
static const char *const hir__status_names[] = {HIR_STATUS_LIST(HIR__ENUM_STRING)};
HIR__STATIC_ASSERT(status_names, sizeof(hir__status_names) / sizeof(hir__status_names[0]) == HIR_STATUS_COUNT);

HIRDEF const char *hir_status_str(hir_status s) {
  return ((unsigned)s < HIR_STATUS_COUNT) ? hir__status_names[s] : "unknown status";
}

static const char *const hir__dtype_names[] = {"float", "double", "__half", "__bfloat", "__e4m3", "__e5m2", "int64_t"};
static const size_t hir__dtype_sizes[] = {4, 8, 2, 2, 1, 1, 8};
HIR__STATIC_ASSERT(dtype_names, sizeof(hir__dtype_names) / sizeof(hir__dtype_names[0]) == HIR_DTYPE_COUNT);

HIRDEF const char *hir_dtype_name(hir_dtype d) { return ((unsigned)d < HIR_DTYPE_COUNT) ? hir__dtype_names[d] : "?"; }
HIRDEF size_t hir_dtype_size(hir_dtype d) { return ((unsigned)d < HIR_DTYPE_COUNT) ? hir__dtype_sizes[d] : 0; }
static int hir__is_fp8(hir_dtype d) { return d == HIR_F8E4M3 || d == HIR_F8E5M2; }
static int hir__is_did(hir_ptype p) { return p == HIR_DIDX || p == HIR_DIDY; }

HIRDEF int hir_team_index(const int *team, int n, int device) {
  int i;
  for (i = 0; team && i < n; i++)
    if (team[i] == device) return i;
  return -1;
}

/* Chunked arena: node pointers stay valid (chunks never move), no per-node
   malloc, one free releases everything. Allocations are zeroed. */
typedef struct hir__chunk {
  struct hir__chunk *next;
  size_t used, cap;
} hir__chunk;
typedef struct hir__arena {
  hir__chunk *head;
  size_t next_cap;
} hir__arena;

#define HIR__ALIGN 16
#define HIR__CHUNK_HEADER ((sizeof(hir__chunk) + HIR__ALIGN - 1) & ~(size_t)(HIR__ALIGN - 1))

static void *hir__arena_alloc(hir__arena *a, size_t n) {
  hir__chunk *c = a->head;
  void *p;
  n = (n + HIR__ALIGN - 1) & ~(size_t)(HIR__ALIGN - 1);
  if (n == 0) n = HIR__ALIGN;
  if (!c || c->cap - c->used < n) {
    size_t cap = a->next_cap ? a->next_cap : 16384;
    if (cap < n) cap = n;
    c = (hir__chunk *)HIR_MALLOC(HIR__CHUNK_HEADER + cap);
    if (!c) return NULL;
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
    a->next_cap = cap < ((size_t)1 << 20) ? cap * 2 : cap;
  }
  p = (unsigned char *)c + HIR__CHUNK_HEADER + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

static void hir__arena_free(hir__arena *a) {
  hir__chunk *c = a->head;
  while (c) {
    hir__chunk *next = c->next;
    HIR_FREE(c);
    c = next;
  }
  a->head = NULL;
  a->next_cap = 0;
}

/* A growable array of pointers living in an arena (old storage is left to the arena). */
typedef struct hir__vec {
  void **items;
  int n, cap;
} hir__vec;

static int hir__vec_reserve(hir__arena *a, hir__vec *v, int n) {
  void **items;
  int cap;
  if (n <= v->cap) return 1;
  cap = v->cap ? v->cap * 2 : 8;
  while (cap < n) cap *= 2;
  items = (void **)hir__arena_alloc(a, (size_t)cap * sizeof(void *));
  if (!items) return 0;
  if (v->n) memcpy(items, v->items, (size_t)v->n * sizeof(void *));
  v->items = items;
  v->cap = cap;
  return 1;
}

static int hir__vec_push(hir__arena *a, hir__vec *v, void *item) {
  if (!hir__vec_reserve(a, v, v->n + 1)) return 0;
  v->items[v->n++] = item;
  return 1;
}

/* Room for `need` elements in a heap array that doubles (outside arenas). */
static int hir__grow_heap(void **items, int *cap, int need, size_t elem) {
  void *p;
  int n = *cap ? *cap : 8;
  if (need <= *cap) return 1;
  while (n < need) n *= 2;
  if (!(p = HIR_REALLOC(*items, (size_t)n * elem))) return 0;
  *items = p;
  *cap = n;
  return 1;
}

/* Clocks, both on TIME_UTC (C11's): now in milliseconds, and the absolute
   time `ms` from now, as pthread_cond_timedwait takes it. */
static double hir__now_ms(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* FNV-1a of n bytes, continuing from h (1469598103934665603 to start). */
static uint64_t hir__fnv(const void *data, size_t n, uint64_t h) {
  const unsigned char *p = (const unsigned char *)data;
  size_t i;
  for (i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static struct timespec hir__deadline(double ms) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  ts.tv_sec += (time_t)(ms / 1e3);
  ts.tv_nsec += (long)((int64_t)(ms * 1e6) % 1000000000);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

// >>files
/* SHA-256 (FIPS 180-4), one block at a time. */
static uint32_t hir__ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void hir__sha256_block(hir_sha256 *s, const unsigned char *b) {
  static const uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01,
      0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc,
      0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
      0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08,
      0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
      0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  uint32_t w[64], t1, t2, a = s->h[0], bb = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
  int i;
  for (i = 0; i < 16; i++)
    w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 | (uint32_t)b[4 * i + 2] << 8 | (uint32_t)b[4 * i + 3];
  for (i = 16; i < 64; i++)
    w[i] = w[i - 16] + (hir__ror(w[i - 15], 7) ^ hir__ror(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7] +
           (hir__ror(w[i - 2], 17) ^ hir__ror(w[i - 2], 19) ^ (w[i - 2] >> 10));
  for (i = 0; i < 64; i++) {
    t1 = h + (hir__ror(e, 6) ^ hir__ror(e, 11) ^ hir__ror(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
    t2 = (hir__ror(a, 2) ^ hir__ror(a, 13) ^ hir__ror(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
    h = g, g = f, f = e, e = d + t1, d = c, c = bb, bb = a, a = t1 + t2;
  }
  s->h[0] += a, s->h[1] += bb, s->h[2] += c, s->h[3] += d, s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

HIRDEF void hir_sha256_init(hir_sha256 *s) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->bytes = 0;
}

HIRDEF void hir_sha256_update(hir_sha256 *s, const void *data, size_t n) {
  const unsigned char *p = (const unsigned char *)data;
  while (n) {
    size_t at = (size_t)(s->bytes % 64), take = 64 - at < n ? 64 - at : n;
    if (at == 0 && n >= 64) { /* a whole block, read where it lies */
      hir__sha256_block(s, p);
      s->bytes += 64, p += 64, n -= 64;
      continue;
    }
    memcpy(s->block + at, p, take);
    s->bytes += take, p += take, n -= take;
    if (at + take == 64) hir__sha256_block(s, s->block);
  }
}

HIRDEF void hir_sha256_final(hir_sha256 *s, unsigned char out[32]) {
  uint64_t bits = s->bytes * 8;
  unsigned char pad = 0x80, len[8];
  int i;
  hir_sha256_update(s, &pad, 1);
  pad = 0;
  while (s->bytes % 64 != 56) hir_sha256_update(s, &pad, 1);
  for (i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
  hir_sha256_update(s, len, 8);
  for (i = 0; i < 32; i++) out[i] = (unsigned char)(s->h[i / 4] >> (24 - 8 * (i % 4)));
}

HIRDEF void hir_hmac_sha256(const void *key, size_t key_bytes, const void *data, size_t n, unsigned char out[32]) {
  unsigned char k[64], pad[64], inner[32];
  hir_sha256 s;
  int i;
  memset(k, 0, sizeof k);
  if (key_bytes > 64) {
    hir_sha256_init(&s);
    hir_sha256_update(&s, key, key_bytes);
    hir_sha256_final(&s, k);
  } else if (key_bytes) {
    memcpy(k, key, key_bytes);
  }
  for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x36);
  hir_sha256_init(&s);
  hir_sha256_update(&s, pad, 64);
  hir_sha256_update(&s, data, n);
  hir_sha256_final(&s, inner);
  for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x5c);
  hir_sha256_init(&s);
  hir_sha256_update(&s, pad, 64);
  hir_sha256_update(&s, inner, 32);
  hir_sha256_final(&s, out);
}

HIRDEF hir_status hir_env_switch(const char *name, int fallback, int *on, char *error, size_t cap) {
  static const char *const words[6] = {"0", "off", "false", "1", "on", "true"};
  const char *v = name ? getenv(name) : NULL;
  size_t i, k;
  *on = fallback;
  if (!v) return HIR_OK;
  for (k = 0; k < 6; k++) {
    for (i = 0; v[i] && words[k][i] && tolower((unsigned char)v[i]) == words[k][i]; i++) {}
    if (!v[i] && !words[k][i]) {
      *on = k >= 3;
      return HIR_OK;
    }
  }
  if (error && cap) snprintf(error, cap, "%s is '%.40s'; give 0, 1, on, off, true or false (any case), or unset it", name, v);
  return HIR_ERR_INVALID;
}

/* Files from outside (the kernel cache, tuning plans) are hostile: opened
   without following a link, taken only as regular files of this user no
   larger than the caller's bound, read by length, and written through a
   temporary file of mode 0600 in the same directory, renamed over the
   old one, so that no reader sees half a file and no planted link or
   name is written through. A directory is trusted when this user owns it
   and nobody else may write it (as ssh's StrictModes asks of ~/.ssh). Not
   covered: the directories above it (a link there is followed; another
   user who can replace one of them can replace what lies below), and a
   process of this same user. Where the headers lack POSIX 2008's openat
   (a strict ISO C build that included a system header before hostir.h),
   every such call refuses, saying so. */
#if defined(O_NOFOLLOW) && defined(O_DIRECTORY) && defined(O_CLOEXEC) && defined(AT_FDCWD)
#define HIR__SAFE_FILES 1
#else
#define HIR__SAFE_FILES 0
#endif

#if HIR__SAFE_FILES
/* A directory this user alone may write, opened (*fd) for the *at calls;
   made 0700 (its parent too, where make_parent) where missing. */
static int hir__private_dir(const char *path, int make_parent, int *fd, char *why, size_t cap) {
  struct stat st;
  int made = 0;
  *fd = -1;
  if (strlen(path) >= 4096) {
    snprintf(why, cap, "the directory's name is %zu characters, longer than a path can be (4095)", strlen(path));
    return 0;
  }
  if (make_parent) {
    char parent[4096];
    char *slash;
    memcpy(parent, path, strlen(path) + 1); /* shorter than 4096: checked above */
    if ((slash = strrchr(parent, '/')) && slash != parent) *slash = 0, mkdir(parent, 0700);
  }
  if (mkdir(path, 0700) == 0) made = 1;
  if ((*fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
    int e = errno;
    snprintf(why, cap, "%.150s cannot be opened as a directory (%s)", path,
             lstat(path, &st) == 0 && S_ISLNK(st.st_mode) ? "it is a symbolic link, not followed: name the directory itself" : strerror(e));
    return 0;
  }
  if (made) fchmod(*fd, 0700); /* whatever the umask */
  if (fstat(*fd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
    snprintf(why, cap, "%.150s is %s; it must be this user's and writable by nobody else (chmod 700 it, or name another)",
             path, st.st_uid != geteuid() ? "owned by another user" : "writable by group or others");
    close(*fd);
    *fd = -1;
    return 0;
  }
  return 1;
}

/* The whole of `name` under dirfd (AT_FDCWD: a path), at most `max` bytes,
   NUL-terminated: *data is HIR_MALLOC'd. 0 with why. */
static int hir__read_file_at(int dirfd, const char *name, size_t max, char **data, size_t *size, char *why, size_t cap) {
  struct stat st;
  char *buf = NULL, extra;
  size_t have = 0;
  int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  *data = NULL;
  if (fd < 0) {
    snprintf(why, cap, "%s%s", strerror(errno), errno == ELOOP ? " (a symbolic link, not followed)" : "");
    return 0;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) snprintf(why, cap, "not a regular file");
  else if (st.st_uid != geteuid()) snprintf(why, cap, "owned by another user");
  else if ((uint64_t)st.st_size > (uint64_t)max) snprintf(why, cap, "%lld bytes, more than %zu", (long long)st.st_size, max);
  else if (!(buf = (char *)HIR_MALLOC((size_t)st.st_size + 1))) snprintf(why, cap, "out of memory");
  while (buf && have < (size_t)st.st_size) {
    ssize_t k = read(fd, buf + have, (size_t)st.st_size - have);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    have += (size_t)k;
  }
  if (buf && (have != (size_t)st.st_size || read(fd, &extra, 1) != 0)) {
    snprintf(why, cap, "it changed while read");
    HIR_FREE(buf);
    buf = NULL;
  }
  close(fd);
  if (!buf) return 0;
  buf[have] = 0;
  *data = buf;
  *size = have;
  return 1;
}

/* `name` under dirfd replaced by the bytes given, through a new temporary
   file there (O_EXCL, mode 0600) renamed over it. 0 with why. */
static int hir__write_file_at(int dirfd, const char *name, const void *data, size_t size, char *why, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  char tmp[300];
  const char *p = (const char *)data;
  int fd = -1, i, k;
  uint64_t r = hir__fnv(&p, sizeof p, hir__fnv(&size, sizeof size, (uint64_t)getpid() * 0x9e3779b97f4a7c15ull));
  if (strlen(name) > 200) {
    snprintf(why, cap, "the name is too long");
    return 0;
  }
  for (k = 0; k < 16 && fd < 0; k++) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    r = hir__fnv(&ts, sizeof ts, r + (uint64_t)k);
    i = snprintf(tmp, sizeof tmp, ".%s.", name);
    for (; i < (int)strlen(name) + 14; i++) tmp[i] = hex[(r >> (4 * (i % 16))) & 15];
    tmp[i] = 0;
    fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    snprintf(why, cap, "cannot create a temporary file beside it: %s", strerror(errno));
    return 0;
  }
  fchmod(fd, 0600); /* whatever the umask */
  while (size) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n, size -= (size_t)n;
  }
  if (size || close(fd) != 0) {
    snprintf(why, cap, "cannot write it: %s", size ? strerror(errno) : "close failed");
    if (size) close(fd);
    unlinkat(dirfd, tmp, 0);
    return 0;
  }
  if (renameat(dirfd, tmp, dirfd, name) != 0) {
    snprintf(why, cap, "cannot rename the temporary file over it: %s", strerror(errno));
    unlinkat(dirfd, tmp, 0);
    return 0;
  }
  return 1;
}
#else
static int hir__private_dir(const char *path, int make_parent, int *fd, char *why, size_t cap) {
  (void)path, (void)make_parent;
  *fd = -1;
  snprintf(why, cap, "%s", "hostir's implementation was compiled without POSIX 2008's openat; define _POSIX_C_SOURCE 200809L "
           "before the first include in its file");
  return 0;
}
static int hir__read_file_at(int dirfd, const char *name, size_t max, char **data, size_t *size, char *why, size_t cap) {
  (void)dirfd, (void)name, (void)max, (void)size;
  *data = NULL;
  return hir__private_dir("", 0, &dirfd, why, cap);
}
static int hir__write_file_at(int dirfd, const char *name, const void *data, size_t size, char *why, size_t cap) {
  (void)name, (void)data, (void)size;
  return hir__private_dir("", 0, &dirfd, why, cap);
}
#endif

/* A path split into its directory (opened, as given: links followed) and
   its last name, for the *at calls on a file the caller names. */
static int hir__open_parent(const char *path, int *dirfd, const char **name, char *why, size_t cap) {
  const char *slash = strrchr(path, '/');
  *dirfd = -1;
  *name = slash ? slash + 1 : path;
  if (!**name || strlen(path) >= 4096) {
    snprintf(why, cap, "%s", **name ? "the path is longer than a path can be (4095)" : "the path names a directory, not a file");
    return 0;
  }
#if HIR__SAFE_FILES
  {
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    if ((*dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
      snprintf(why, cap, "its directory cannot be opened (%s)", strerror(errno));
      return 0;
    }
    return 1;
  }
#else
  return hir__private_dir("", 0, dirfd, why, cap);
#endif
}

static void hir__close_dir(int dirfd) {
#if HIR__SAFE_FILES
  if (dirfd >= 0) close(dirfd);
#else
  (void)dirfd;
#endif
}

/* The compiled kernels' cache: $HOSTIR_CACHE_DIR, else $XDG_CACHE_HOME/hostir,
   else ~/.cache/hostir (HOSTIR_CACHE_DIR=off, any case: none), a private
   directory (above). An entry is a header written by hostir, then the
   cubin:
       magic "HIRKC01\n", hostir's version (16 bytes), NVRTC's version
       (4 bytes, major * 1000 + minor), the GPU architecture (16 bytes),
       the SHA-256 of the kernel's source, options and architecture (32),
       the cubin's size (8) and its SHA-256 (32), zeros to 128 bytes.
   An entry that is not ours in every field, a link, a FIFO, another user's
   file or one over 16 MiB is compiled again and replaced. */
enum { HIR__KCACHE_HEADER = 128, HIR__KCACHE_MAX = 16 << 20 };
static const char hir__kcache_magic[8] = {'H', 'I', 'R', 'K', 'C', '0', '1', '\n'};

typedef struct hir__kcache {
  int dirfd;                    /* -1: no cache */
  char why[400];                /* why not, or why an entry was refused; "" if nothing to say */
} hir__kcache;

HIR__UNUSED static void hir__kcache_open(hir__kcache *kc) {
  const char *dir = getenv("HOSTIR_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char path[4200], why[300];
  int is_default = !dir;
  kc->dirfd = -1;
  kc->why[0] = 0;
  if (dir && (!dir[0] || ((dir[0] | 32) == 'o' && (dir[1] | 32) == 'f' && (dir[2] | 32) == 'f' && !dir[3]))) return;
  if (dir && strlen(dir) >= 4000) {
    snprintf(kc->why, sizeof kc->why, "HOSTIR_CACHE_DIR is %zu characters, longer than a path can be: the kernels were "
             "compiled without the cache", strlen(dir));
    return;
  }
  if (dir) snprintf(path, sizeof path, "%s", dir);
  else if (xdg && xdg[0] == '/' && strlen(xdg) < 4000) snprintf(path, sizeof path, "%s/hostir", xdg);
  else if (home && home[0] == '/' && strlen(home) < 4000) snprintf(path, sizeof path, "%s/.cache/hostir", home);
  else return;
  if (!hir__private_dir(path, is_default, &kc->dirfd, why, sizeof why))
    snprintf(kc->why, sizeof kc->why, "the kernel cache was not used: %s", why);
}

HIR__UNUSED static void hir__kcache_close(hir__kcache *kc) {
  hir__close_dir(kc->dirfd);
  kc->dirfd = -1;
}

/* What names a kernel: its source, NVRTC's options and the architecture. */
HIR__UNUSED static void hir__kcache_key(const char *src, const char *options, const char *arch, unsigned char key[32]) {
  hir_sha256 s;
  hir_sha256_init(&s);
  hir_sha256_update(&s, src, strlen(src) + 1);
  hir_sha256_update(&s, options, strlen(options) + 1);
  hir_sha256_update(&s, arch, strlen(arch) + 1);
  hir_sha256_final(&s, key);
}

static void hir__kcache_header(unsigned char *h, const unsigned char key[32], const char *arch, int nvrtc, const void *bin,
                               size_t size) {
  hir_sha256 s;
  int i;
  memset(h, 0, HIR__KCACHE_HEADER);
  memcpy(h, hir__kcache_magic, 8);
  snprintf((char *)h + 8, 16, "%s", HOSTIR_VERSION);
  for (i = 0; i < 4; i++) h[24 + i] = (unsigned char)((unsigned)nvrtc >> (8 * i));
  snprintf((char *)h + 28, 16, "%s", arch);
  memcpy(h + 44, key, 32);
  for (i = 0; i < 8; i++) h[76 + i] = (unsigned char)((uint64_t)size >> (8 * i));
  hir_sha256_init(&s);
  hir_sha256_update(&s, bin, size);
  hir_sha256_final(&s, h + 84);
}

static void hir__kcache_name(const unsigned char key[32], const char *arch, char *name, size_t cap) {
  char tag[17];
  int i, n = snprintf(name, cap, "kernel-");
  for (i = 0; i < 8 && n + 2 < (int)cap; i++) n += snprintf(name + n, cap - (size_t)n, "%02x", key[i]);
  snprintf(tag, sizeof tag, "%s", arch); /* a copy: -Wrestrict cannot tell them apart */
  snprintf(name + n, cap - (size_t)n, "-%s.cubin", tag);
}

/* The cubin kept for key (HIR_MALLOC'd, *size), or NULL: none, or one
   refused (kc->why says which and why). nvrtc 0: NVRTC's version unknown
   (not installed), any taken. */
HIR__UNUSED static char *hir__kcache_get(hir__kcache *kc, const unsigned char key[32], const char *arch, int nvrtc, size_t *size) {
  unsigned char want[HIR__KCACHE_HEADER];
  char name[80], why[200], *data, *bin;
  size_t n;
  int at = 24;
  if (kc->dirfd < 0) return NULL;
  hir__kcache_name(key, arch, name, sizeof name);
  if (!hir__read_file_at(kc->dirfd, name, HIR__KCACHE_HEADER + HIR__KCACHE_MAX, &data, &n, why, sizeof why)) {
    if (strcmp(why, strerror(ENOENT))) snprintf(kc->why, sizeof kc->why, "kernel cache entry %s refused (%.150s); compiled again", name, why);
    return NULL;
  }
  if (n > HIR__KCACHE_HEADER) {
    hir__kcache_header(want, key, arch, nvrtc, data + HIR__KCACHE_HEADER, n - HIR__KCACHE_HEADER);
    if (!nvrtc) at = 28; /* its NVRTC version unchecked */
  }
  if (n <= HIR__KCACHE_HEADER || memcmp(data, want, 24) || memcmp(data + at, want + at, HIR__KCACHE_HEADER - (size_t)at)) {
    snprintf(kc->why, sizeof kc->why, "kernel cache entry %s refused (%s); compiled again", name,
             n <= HIR__KCACHE_HEADER ? "shorter than its header" : memcmp(data, want, 8) ? "not a hostir cache entry"
             : memcmp(data, want, 24) || memcmp(data + 24, want + 24, 4) ? "made by another hostir or NVRTC"
             : "its header or contents do not match");
    HIR_FREE(data);
    return NULL;
  }
  *size = n - HIR__KCACHE_HEADER;
  if ((bin = (char *)HIR_MALLOC(*size))) memcpy(bin, data + HIR__KCACHE_HEADER, *size);
  HIR_FREE(data);
  return bin;
}

/* Keeps a compiled kernel; a failure is said in kc->why (the kernel runs all the same). */
HIR__UNUSED static void hir__kcache_put(hir__kcache *kc, const unsigned char key[32], const char *arch, int nvrtc, const char *bin, size_t size) {
  char name[80], why[200], *data;
  if (kc->dirfd < 0 || size > HIR__KCACHE_MAX) return;
  if (!(data = (char *)HIR_MALLOC(HIR__KCACHE_HEADER + size))) return;
  hir__kcache_header((unsigned char *)data, key, arch, nvrtc, bin, size);
  memcpy(data + HIR__KCACHE_HEADER, bin, size);
  hir__kcache_name(key, arch, name, sizeof name);
  if (!hir__write_file_at(kc->dirfd, name, data, HIR__KCACHE_HEADER + size, why, sizeof why))
    snprintf(kc->why, sizeof kc->why, "kernel cache entry %s not written: %.150s", name, why);
  HIR_FREE(data);
}

// >>ir
typedef enum hir__val_kind { HIR__VAL_CONST, HIR__VAL_SYMBOL, HIR__VAL_NAMED, HIR__VAL_BINARY, HIR__VAL_MESH_AT } hir__val_kind;

struct hir_val {
  hir_fusion *ir;
  hir__val_kind kind;
  int name;               /* symbols print as "i<name>"; constants take a name too */
  int64_t value;          /* constants */
  int which;              /* named scalars: hir_named_scalar */
  int op;                 /* binary: hir_scalar_op */
  hir_val *lhs, *rhs;     /* binary operands; MESH_AT: lhs is the index */
  const int *mesh;        /* MESH_AT: the device at position lhs of this mesh */
  int mesh_size;
};

struct hir_id {
  int name;
  hir_val *extent;
  hir_iter_type iter;
  hir_ptype ptype;
  int loop_pos; /* 1 + its place in the tensor's loop order after hir_reorder; 0: the order of ids */
  hir_ptype swizzle; /* hir_swizzle1d: the mesh axis (DIDx) whose place starts its chunks; HIR_SERIAL: none */
  hir_val *merged;   /* hir_merge: this axis and the next in the loop order are one loop axis of this extent */
};

struct hir_tv {
  hir_fusion *ir;
  int name;
  hir_dtype dtype;
  hir_memory mem;
  int ndims;
  hir_id *ids[HIR_MAX_DIMS];
  int mesh_size;          /* 0: no mesh */
  const int *mesh;
  int mesh_cols;          /* a 2-D mesh's devices per row (hir_set_mesh_2d); 0: a 1-D mesh */
  hir_expr *definition;   /* the fusion expr producing it, NULL for inputs and host-made views */
  unsigned char is_input, is_output;
  /* Split axes (hir_split): axis i is part of logical axis logical_of[i];
     the user's tensors hold the nlogical logical axes (0: no split, the
     axes are the logical ones), logical_extent[l] the whole extent of l. */
  int nlogical;
  unsigned char logical_of[HIR_MAX_DIMS];
  hir_val *logical_extent[HIR_MAX_DIMS];
  hir_val *scalar;        /* a scalar input (hir_input_scalar): the value hir_run binds to this symbol */
  /* hir_set_allocation_loop: the user's tensors hold logical axis
     alloc_order[0] outermost, alloc_order[nalloc - 1] innermost (0: row-major). */
  int nalloc;
  unsigned char alloc_order[HIR_MAX_DIMS];
  int made_from;          /* a view or copy in another layout of a tensor (which messages name): its name + 1; 0: none */
};

struct hir_scope {
  hir_fusion *ir;
  hir__vec exprs;
};

struct hir_stream {
  int name;               /* a stream variable, when index is NULL */
  hir_val *index;         /* a pool stream chosen by an index expression */
};

typedef struct hir__host_unit {
  int name;
  hir__vec ins, outs, exprs;   /* program tensors and the fusion exprs that compute outs */
} hir__host_unit;

struct hir_expr {
  hir_fusion *ir;
  hir_expr_kind kind;
  int name;
  int sub;                /* hir_binary_op, hir_unary_op, hir_collective, hir_p2p_type; RNGOp: HIR__RNG_* */
  int nin, nout;
  hir_tv **in, **out;
  hir_val *val;           /* ForLoop index, IfThenElse predicate, P2P peer, AliasSelect/Slice index,
                             UnaryOp's scalar when it is an integer known at run time, CollectivePermute's send peer */
  hir_val *recv_peer;     /* CollectivePermute */
  double scalar;          /* UnaryOp's scalar (when val is NULL) */
  hir_id *id;             /* ForLoop and AliasSelect/Slice axis */
  int axis;               /* AliasSelect/Slice axis; RNGOp's iota: the logical axis numbered */
  int parts;              /* AliasSlice: into how many equal parts the axis is cut */
  uint32_t flags;         /* BroadcastOp: bit i set = output axis i is new; MatmulOp, LoadStoreOp: HIR__MATMUL_*, HIR__SET_* */
  unsigned char perm[HIR_MAX_DIMS]; /* LoadStoreOp with HIR__SET_PERMUTE: output axis i is input data axis perm[i] */
  int64_t params[HIR_MAX_DIMS];     /* SelectOp: index; SliceOp: start, stop, step (hir_slice_step's); ViewOp: the sizes asked */
  int root, team_size;
  const int *team;
  hir_stream *stream;
  hir_expr *target;       /* Wait */
  hir__host_unit *unit;   /* PostOnStream */
  hir_scope *scope;       /* the scope holding this expr, if any */
  hir_scope body, orelse;
  /* A composite op's primitives (hir_layer_norm's) share `composite`, the
     composite's number in its fusion (0: none); a backend with the
     composite's kernel runs them as one where they stay together
     (hir__find_fused). composite_role: HIR__ROLE_*. */
  int composite;
  unsigned char composite_role;
};
enum { HIR__ROLE_NONE, HIR__ROLE_X, HIR__ROLE_WEIGHT, HIR__ROLE_BIAS, HIR__ROLE_EPS, HIR__ROLE_OUT, HIR__ROLE_CENTER };

/* The op table, from HIR_EXPR_KIND_LIST: what every pass knows about an expr kind. */
enum {
  HIR__OP_COMPUTE = 1,     /* a tensor op of the fusion language */
  HIR__OP_HOST = 2,        /* a host IR node */
  HIR__OP_COMM = 4,        /* talks to other ranks */
  HIR__OP_SCOPED = 8,      /* has a body */
  HIR__OP_WAITABLE = 16,   /* a Wait may name it */
  HIR__OP_STANDALONE = 32, /* a host op of its own: never merged into a HostUnit by default */
  HIR__OP_ON_STREAM = 64,  /* puts work (or a wait) on the current stream: the GPU timeline times it */
  HIR__OP_VIEW = 128,      /* its output is a view of its input: no buffer, no copy */
  HIR__OP_MOVES = 256,     /* set and sum: as a resharding expr, it lowers to communications */
  HIR__OP_BUFFER = 512,    /* makes or releases its operand's buffer: reads no values */
  HIR__OP_TEAM = 1024,     /* talks to a team of devices (team, team_size) */
  HIR__OP_CUTS_AXIS = 2048,/* keeps part of its input's axis e->axis (select, slice) */
  HIR__OP_WHOLE = 4096,    /* reads its input whole (select, slice, reshape): never computed chunk by chunk */
  HIR__OP_STORE = 8192,    /* moves values as they are, so takes the storage dtypes, fp8 and int64 (a set, a broadcast, a view) */
  HIR__OP_ANY_STRIDES = 16384, /* writes its output at any strides (elementwise ops, random numbers) */
  HIR__OP_ROUTES = 32768   /* moves rows where a routing sends them (MoE): operands of several dtypes */
};
typedef struct hir__op_info {
  const char *name;
  int nin, nout;           /* tensor operands; -1: any number */
  unsigned flags;
} hir__op_info;

#define HIR__OP_INFO(e, name, nin, nout, flags) {name, nin, nout, flags},
static const hir__op_info hir__ops[] = {HIR_EXPR_KIND_LIST(HIR__OP_INFO)};
HIR__STATIC_ASSERT(op_table, sizeof(hir__ops) / sizeof(hir__ops[0]) == HIR_EXPR_KIND_COUNT);

static const char *const hir__scalar_op_names[] = {HIR_SCALAR_OP_LIST(HIR__ENUM_STRING)};
static const char *const hir__collective_names[] = {HIR_COLLECTIVE_LIST(HIR__ENUM_STRING)};
static const char *const hir__named_names[] = {"StreamIdx", "rank", "numberOfStreams"};
#define HIR__BINARY_SYMBOL(e, symbol, builder, expr) symbol,
#define HIR__BINARY_BUILDER(e, symbol, builder, expr) builder,
#define HIR__UNARY_NAME(e, name, f, expr) name,
#define HIR__UNARY_SUFFIX(e, name, f, expr) f,
static const char *const hir__binary_symbols[] = {HIR_BINARY_OP_LIST(HIR__BINARY_SYMBOL)};
static const char *const hir__binary_builders[] = {HIR_BINARY_OP_LIST(HIR__BINARY_BUILDER)};
static const char *const hir__unary_names[] = {HIR_UNARY_OP_LIST(HIR__UNARY_NAME)};
static const unsigned char hir__unary_float_suffix[] = {HIR_UNARY_OP_LIST(HIR__UNARY_SUFFIX)};
static const char *const hir__ptype_names[] = {"S", "deviceIdx.x", "StreamIdx", "deviceIdx.y"};
static const char *const hir__ptype_labels[] = {"serial", "DIDx", "Stream", "DIDy"}; /* in messages */
static const char hir__iter_chars[] = {'i', 'r', 'b'};
HIR__STATIC_ASSERT(scalar_ops, sizeof(hir__scalar_op_names) / sizeof(hir__scalar_op_names[0]) == HIR_SCALAR_OP_COUNT);
HIR__STATIC_ASSERT(collectives, sizeof(hir__collective_names) / sizeof(hir__collective_names[0]) == HIR_COLLECTIVE_COUNT);
HIR__STATIC_ASSERT(named, sizeof(hir__named_names) / sizeof(hir__named_names[0]) == HIR_NAMED_COUNT);
HIR__STATIC_ASSERT(binary, sizeof(hir__binary_symbols) / sizeof(hir__binary_symbols[0]) == HIR_BINARY_COUNT);
HIR__STATIC_ASSERT(ptypes, sizeof(hir__ptype_names) / sizeof(hir__ptype_names[0]) == HIR_PTYPE_COUNT);

/* The unary ops that read a scalar s: the tensor-scalar forms of the binary ops. */
static int hir__unary_has_scalar(int op) { return op >= HIR_UNARY_ADD_SCALAR; }

static int hir__collective_has_root(int c) {
  return c == HIR_COLL_GATHER || c == HIR_COLL_SCATTER || c == HIR_COLL_REDUCE || c == HIR_COLL_BROADCAST ||
         c == HIR_COLL_SENDRECV;
}

/* The IR container of a fusion, and of a program (which embeds one). */
struct hir_fusion {
  hir__arena arena;
  hir_program *program;   /* set when this is a program's IR */
  int next_tv, next_id, next_val, next_expr;
  int callers_tvs;        /* a lowered program's IR: tensors named below this are the fusion's, the rest the lowering's */
  hir__vec tvs, exprs, inputs, outputs;
  hir_val *zero, *one, *named[HIR_NAMED_COUNT];
  hir_status status;
  char error[512];
};

/* A tensor axis read chunk by chunk by a loop over another axis: hir_run
   checks that the two have one size (else a loop would read part of it, or
   past it). */
typedef struct hir__same_extent {
  const hir_val *loop;    /* the extent of the loop's axis */
  const hir_tv *tv;
  int axis;
} hir__same_extent;

struct hir_program {
  hir_fusion ir;
  hir_scope top;
  hir__vec units;
  int next_stream;
  int my_device;          /* the device the program was lowered for; -1 if built by hand */
  char plan[4096];        /* the automatic choice of hir_stream_desc, or a tuner's report */
  hir__vec same_extents;  /* hir__same_extent: sizes that only a run knows and that must agree */
  hir__vec skipped;       /* pairs (top-level expr or NULL, op or NULL): after that expr (NULL: before the first) other ranks run an op this one
                             skips (NULL: in a HostUnit); a Stream chain continues across it only where theirs does */
};

static void hir__vfail(hir_fusion *f, hir_status s, const char *fmt, va_list ap) {
  if (!f || f->status != HIR_OK) return;
  f->status = s;
  vsnprintf(f->error, sizeof f->error, fmt, ap);
}

static void hir__fail(hir_fusion *f, hir_status s, const char *fmt, ...) HIR__PRINTF(3, 4);
static void hir__fail(hir_fusion *f, hir_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  hir__vfail(f, s, fmt, ap);
  va_end(ap);
}

static void *hir__alloc(hir_fusion *f, size_t n) {
  void *p = hir__arena_alloc(&f->arena, n);
  if (!p) hir__fail(f, HIR_ERR_NOMEM, "out of memory allocating %zu bytes of IR", n);
  return p;
}

static int hir__push(hir_fusion *f, hir__vec *v, void *item) {
  if (hir__vec_push(&f->arena, v, item)) return 1;
  hir__fail(f, HIR_ERR_NOMEM, "out of memory growing an IR list");
  return 0;
}

static hir_val *hir__new_val(hir_fusion *f, hir__val_kind kind) {
  hir_val *v = (hir_val *)hir__alloc(f, sizeof(hir_val));
  if (!v) return NULL;
  v->ir = f;
  v->kind = kind;
  v->name = kind == HIR__VAL_NAMED ? -1 : f->next_val++;
  return v;
}

static hir_val *hir__const(hir_fusion *f, int64_t value) {
  hir_val *v;
  if (value == 0 && f->zero) return f->zero;
  if (value == 1 && f->one) return f->one;
  v = hir__new_val(f, HIR__VAL_CONST);
  if (!v) return NULL;
  v->value = value;
  if (value == 0) f->zero = v;
  if (value == 1) f->one = v;
  return v;
}

static hir_val *hir__named(hir_fusion *f, hir_named_scalar which) {
  if (!f->named[which]) {
    hir_val *v = hir__new_val(f, HIR__VAL_NAMED);
    if (!v) return NULL;
    v->which = (int)which;
    f->named[which] = v;
  }
  return f->named[which];
}

static hir_val *hir__binary_val(hir_fusion *f, hir_scalar_op op, hir_val *a, hir_val *b) {
  hir_val *v = hir__new_val(f, HIR__VAL_BINARY);
  if (!v) return NULL;
  v->op = (int)op;
  v->lhs = a;
  v->rhs = b;
  return v;
}

static hir_id *hir__new_id(hir_fusion *f, hir_val *extent, hir_iter_type iter, hir_ptype ptype) {
  hir_id *id = (hir_id *)hir__alloc(f, sizeof(hir_id));
  if (!id) return NULL;
  /* Every axis starts at the container's zero, made with the first axis: the
     numbering of scalars then follows nvFuser's dumps (i0, i2, i3, ...). */
  if (!f->zero && !hir__const(f, 0)) return NULL;
  id->name = f->next_id++;
  id->extent = extent;
  id->iter = iter;
  id->ptype = ptype;
  return id;
}

/* A fresh axis like `src`: same extent and iter type; ptype kept if asked. */
static hir_id *hir__clone_id(hir_fusion *f, const hir_id *src, int keep_ptype) {
  return hir__new_id(f, src->extent, src->iter, keep_ptype ? src->ptype : HIR_SERIAL);
}

static hir_tv *hir__new_tv(hir_fusion *f, hir_dtype dtype, hir_memory mem, int ndims) {
  hir_tv *tv = (hir_tv *)hir__alloc(f, sizeof(hir_tv));
  if (!tv) return NULL;
  tv->ir = f;
  tv->name = f->next_tv++;
  tv->dtype = dtype;
  tv->mem = mem;
  tv->ndims = ndims;
  if (!hir__push(f, &f->tvs, tv)) return NULL;
  return tv;
}

/* dst lives where src does: the same mesh, of the same shape. */
static void hir__share_mesh(hir_tv *dst, const hir_tv *src) {
  dst->mesh = src->mesh;
  dst->mesh_size = src->mesh_size;
  dst->mesh_cols = src->mesh_cols;
}

static hir_expr *hir__new_expr(hir_fusion *f, hir_expr_kind kind, int nin, int nout) {
  hir_expr *e = (hir_expr *)hir__alloc(f, sizeof(hir_expr));
  if (!e) return NULL;
  e->ir = f;
  e->kind = kind;
  e->name = f->next_expr++;
  e->nin = nin;
  e->nout = nout;
  if (nin > 0 && !(e->in = (hir_tv **)hir__alloc(f, (size_t)nin * sizeof(hir_tv *)))) return NULL;
  if (nout > 0 && !(e->out = (hir_tv **)hir__alloc(f, (size_t)nout * sizeof(hir_tv *)))) return NULL;
  e->body.ir = f;
  e->orelse.ir = f;
  return e;
}

/* The position of `axis` among tv's axes that hold data. */
static int hir__data_index(const hir_tv *tv, int axis) {
  int i, k = 0;
  for (i = 0; i < axis; i++) k += tv->ids[i]->iter != HIR_REDUCTION;
  return k;
}

/* A matmul's flags: A has no M axis, B no N axis. The chunks of a
   stream-lowered matmul whose Stream axis is M (or N) are views without it,
   and stay matrix products with M (N) of size 1; 1-D operands have neither
   axis, as in torch.matmul. */
/* LINEAR: B is [.., N, K], a 3rd input the bias. SCALED: fp8 A and B (hir_scaled_linear, LINEAR too), the 3rd and
   4th inputs their scales (f32; one value, or one per row of A and per N of B). */
enum { HIR__MATMUL_NO_M = 1, HIR__MATMUL_NO_N = 2, HIR__MATMUL_LINEAR = 4, HIR__MATMUL_SCALED = 8 };
enum { HIR__MAX_OPERANDS = 4 }; /* of a compute op: a scaled linear's */
/* A LoadStoreOp's flag: it permutes the axes (nvFuser's Set.Permute). */
enum { HIR__SET_PERMUTE = 1 };
/* What an RNGOp numbers its elements into: random numbers (hir_rand), or
   their index along one logical axis (hir_iota). */
enum { HIR__RNG_RAND, HIR__RNG_IOTA };

/* The roles of a matmul's data axes, given na and nb of its operands: A is
   [batch..., M?, K], B [batch..., K, N?], the output [batch..., M?, N?]. */
static void hir__matmul_roles(const hir_expr *e, int na, int nb, int *has_m, int *has_n) {
  *has_m = na >= 2 && !(e->flags & HIR__MATMUL_NO_M);
  *has_n = nb >= 2 && !(e->flags & HIR__MATMUL_NO_N);
}

/* The axes that hold data: all but reduction axes. */
static int hir__data_axes(const hir_tv *tv, hir_id **ids) {
  int i, n = 0;
  for (i = 0; i < tv->ndims; i++)
    if (tv->ids[i]->iter != HIR_REDUCTION) ids[n++] = tv->ids[i];
  return n;
}

/* tv's data axes in groups, one per logical axis: the parts hir_split made
   of one axis are one group where `logical` (a fusion's matmul reads its
   operands' logical axes), each axis its own group where not (a program's
   matmuls are positional: hir__positional_matmuls made them so). Group g is
   data axes first[g] to first[g + 1] - 1; returns the number of groups. */
static int hir__axis_groups(const hir_tv *tv, int logical, int *first) {
  int i, n = 0, d = 0, last = -1;
  for (i = 0; i < tv->ndims; i++) {
    if (tv->ids[i]->iter == HIR_REDUCTION) continue;
    if (!logical || !tv->nlogical || tv->logical_of[i] != last) first[n++] = d;
    last = tv->logical_of[i];
    d++;
  }
  first[n] = d;
  return n;
}

/* Values of the symbols and named scalars: what scalar expressions read. */
typedef struct hir__env {
  int64_t *sym;                 /* by val name */
  unsigned char *sym_bound;
  int64_t named[HIR_NAMED_COUNT];
} hir__env;

static int64_t hir__eval_val(const hir__env *env, const hir_val *v) {
  int64_t a, b;
  switch (v->kind) {
  case HIR__VAL_CONST: return v->value;
  case HIR__VAL_SYMBOL: return env->sym[v->name];
  case HIR__VAL_NAMED: return env->named[v->which];
  case HIR__VAL_MESH_AT:
    a = hir__eval_val(env, v->lhs);
    return (a >= 0 && a < v->mesh_size) ? v->mesh[a] : -1;
  default: break;
  }
  a = hir__eval_val(env, v->lhs);
  b = hir__eval_val(env, v->rhs);
  switch (v->op) { /* defined for every input: + - * wrap around, / and % by 0 give 0, by -1 cannot trap */
  case HIR_SCALAR_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
  case HIR_SCALAR_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
  case HIR_SCALAR_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
  case HIR_SCALAR_DIV: return b == 0 ? 0 : b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b;
  case HIR_SCALAR_MOD: return b == 0 || b == -1 ? 0 : a % b;
  case HIR_SCALAR_EQ: return a == b;
  case HIR_SCALAR_NE: return a != b;
  case HIR_SCALAR_LT: return a < b;
  case HIR_SCALAR_LE: return a <= b;
  case HIR_SCALAR_GT: return a > b;
  case HIR_SCALAR_GE: return a >= b;
  case HIR_SCALAR_AND: return a && b;
  default: return a || b;
  }
}

/* The loop's index: StreamIdx, or a scalar of its own (hir_host_for_range). */
static void hir__bind_index(hir__env *env, const hir_val *index, int64_t i) {
  if (index->kind == HIR__VAL_NAMED) {
    env->named[index->which] = i;
  } else {
    env->sym[index->name] = i;
    env->sym_bound[index->name] = 1;
  }
}

/* The first symbol v needs that is not bound, or NULL. */
static const hir_val *hir__unbound(const hir__env *env, const hir_val *v) {
  const hir_val *u;
  if (v->kind == HIR__VAL_SYMBOL) return env->sym_bound[v->name] ? NULL : v;
  if (v->kind == HIR__VAL_MESH_AT) return hir__unbound(env, v->lhs);
  if (v->kind != HIR__VAL_BINARY) return NULL;
  return (u = hir__unbound(env, v->lhs)) ? u : hir__unbound(env, v->rhs);
}

struct hir_group {
  int index;
  hir__vec exprs;
  int standalone;         /* one standalone host op: lowered as a top-level expr */
  int resharding;
};

struct hir_segmentation {
  hir_program *p;
  hir__vec groups;
};

// >>build
/* Argument checks shared by every builder. They record the first error only:
   a NULL tensor after an earlier failure is the expected, silent case. */
static int hir__live(hir_fusion *f) { return f && f->status == HIR_OK; }

static int hir__check_tv(hir_fusion *f, const hir_tv *tv, const char *fn, const char *arg) {
  if (!tv) {
    hir__fail(f, HIR_ERR_INVALID, "%s: argument '%s' is NULL", fn, arg);
    return 0;
  }
  if (tv->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "%s: T%d ('%s') belongs to another fusion or program; build every tensor of an op in one fusion",
              fn, tv->name, arg);
    return 0;
  }
  return 1;
}

static int hir__norm_axis(hir_fusion *f, int axis, int ndims, const char *fn, const hir_tv *tv) {
  int a = axis < 0 ? axis + ndims : axis;
  if (a < 0 || a >= ndims) {
    hir__fail(f, HIR_ERR_INVALID, "%s: axis %d is out of range for T%d, which has %d axes (valid: %d..%d)", fn, axis,
              tv->name, ndims, -ndims, ndims - 1);
    return -1;
  }
  return a;
}

/* The loop order (hir_reorder): order[p] is the index in tv->ids of the
   axis at loop position p. The axes keep their order in ids, which every
   pass reads; only the printer and the schedule calls' axis numbers see
   the loop order. A tensor any of whose axes has no loop place (one the
   lowering made) is in the order of ids. */
static void hir__loop_order(const hir_tv *tv, int *order) {
  int i, j, n = 0;
  for (i = 0; i < tv->ndims; i++) order[i] = i;
  for (i = 0; i < tv->ndims; i++) n += tv->ids[i]->loop_pos > 0;
  if (n < tv->ndims) return;
  for (i = 1; i < tv->ndims; i++) /* by loop place; lowering may have dropped some of the places */
    for (j = i; j > 0 && tv->ids[order[j - 1]]->loop_pos > tv->ids[order[j]]->loop_pos; j--) {
      int t = order[j];
      order[j] = order[j - 1], order[j - 1] = t;
    }
}

/* The loop axes a user numbers (hir_merge makes two one): head[p] is the
   index in tv->ids of loop axis p's first axis; returns how many. */
static int hir__loop_heads(const hir_tv *tv, int *head) {
  int order[HIR_MAX_DIMS], i, n = 0;
  hir__loop_order(tv, order);
  for (i = 0; i < tv->ndims; i++)
    if (!i || !tv->ids[order[i - 1]]->merged) head[n++] = order[i];
  return n;
}

/* A schedule call's axis (a loop position, negative from the end) as an
   index in tv->ids; -1 (error recorded) when out of range. */
static int hir__loop_axis(hir_fusion *f, const hir_tv *tv, int axis, const char *fn) {
  int head[HIR_MAX_DIMS], a = hir__norm_axis(f, axis, hir__loop_heads(tv, head), fn, tv);
  return a < 0 ? -1 : head[a];
}

/* The loop position of tv->ids[i] (of the merged axis it is part of). */
static int hir__loop_place(const hir_tv *tv, int i) {
  int order[HIR_MAX_DIMS], p, place = 0;
  hir__loop_order(tv, order);
  for (p = 0; p < tv->ndims && order[p] != i; p++) place += !tv->ids[order[p]]->merged;
  return place;
}

/* The unary ops exact on int64. */
static int hir__unary_on_i64(int op) {
  switch (op) {
  case HIR_UNARY_NEG: case HIR_UNARY_ABS: case HIR_UNARY_RELU: case HIR_UNARY_CAST: case HIR_UNARY_ADD_SCALAR:
  case HIR_UNARY_SUB_SCALAR: case HIR_UNARY_MUL_SCALAR: case HIR_UNARY_SCALAR_SUB: case HIR_UNARY_LT_SCALAR:
  case HIR_UNARY_SCALAR_LT: return 1;
  default: return 0;
  }
}

/* Whether e may read or write tensors of dtype dt: every op takes the
   floating dtypes; fp8 moves and views, casts, and the scaled matmul; int64
   moves and views, casts, and the ops exact on integers. */
static int hir__takes_dtype(const hir_expr *e, hir_dtype dt) {
  if (!hir__is_fp8(dt) && dt != HIR_I64) return 1;
  if (hir__ops[e->kind].flags & HIR__OP_STORE) return 1;
  switch (e->kind) {
  case HIR_EXPR_UNARY: return e->sub == HIR_UNARY_CAST || (dt == HIR_I64 && hir__unary_on_i64(e->sub));
  case HIR_EXPR_BINARY: return dt == HIR_I64 && e->sub != HIR_BINARY_DIV;
  case HIR_EXPR_REDUCTION:
  case HIR_EXPR_MAX: return dt == HIR_I64;
  case HIR_EXPR_MATMUL: return hir__is_fp8(dt) && (e->flags & HIR__MATMUL_SCALED);
  case HIR_EXPR_RNG: return 1; /* reads its operand's shape only (its own dtype is checked by its builder) */
  default: return 0;
  }
}

static hir_tv *hir__finish_op(hir_fusion *f, hir_expr *e, hir_tv *out) {
  int i;
  for (i = 0; i <= e->nin; i++) {
    const hir_tv *t = i < e->nin ? e->in[i] : out;
    if (hir__takes_dtype(e, t->dtype)) continue;
    if (t->dtype == HIR_I64)
      hir__fail(f, HIR_ERR_UNSUPPORTED, "%s: T%d is int64, which only moves, casts, add, sub, mul, neg, abs, relu, the "
                "comparisons, sums and maxima take; cast it (hir_cast) to compute", hir__ops[e->kind].name, t->name);
    else
      hir__fail(f, HIR_ERR_UNSUPPORTED, "%s: T%d is %s, an fp8 dtype, which only moves, casts and hir_scaled_linear take; cast it "
                "(hir_cast) to compute", hir__ops[e->kind].name, t->name, hir_dtype_name(t->dtype));
    return NULL;
  }
  if (!hir__push(f, &f->exprs, e)) return NULL;
  out->definition = e;
  return out;
}

HIRDEF hir_fusion *hir_fusion_create(void) {
  hir_fusion *f = (hir_fusion *)HIR_MALLOC(sizeof(hir_fusion));
  if (f) memset(f, 0, sizeof *f);
  return f;
}

HIRDEF void hir_fusion_free(hir_fusion *f) {
  if (!f || f->program) return; /* a program's IR goes with hir_program_free */
  hir__arena_free(&f->arena);
  HIR_FREE(f);
}

HIRDEF const char *hir_fusion_error(const hir_fusion *f) { return f ? f->error : "hir_fusion_error: fusion is NULL"; }
HIRDEF hir_status hir_fusion_status(const hir_fusion *f) { return f ? f->status : HIR_ERR_INVALID; }

HIRDEF hir_tv *hir_input(hir_fusion *f, hir_dtype dtype, int ndims) {
  hir_tv *tv;
  int i;
  if (!hir__live(f)) return NULL;
  if ((unsigned)dtype >= HIR_DTYPE_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "hir_input: unknown dtype %d; use HIR_F32, HIR_F64, HIR_F16, HIR_BF16, HIR_F8E4M3 or HIR_F8E5M2",
              (int)dtype);
    return NULL;
  }
  if (ndims < 1 || ndims > HIR_MAX_DIMS) {
    hir__fail(f, HIR_ERR_INVALID, "hir_input: ndims %d is out of range; a tensor has 1 to HIR_MAX_DIMS (%d) axes",
              ndims, HIR_MAX_DIMS);
    return NULL;
  }
  if (!(tv = hir__new_tv(f, dtype, HIR_MEM_GLOBAL, ndims))) return NULL;
  for (i = 0; i < ndims; i++) {
    hir_val *extent = hir__new_val(f, HIR__VAL_SYMBOL);
    if (!extent || !(tv->ids[i] = hir__new_id(f, extent, HIR_ITERATION, HIR_SERIAL))) return NULL;
  }
  tv->is_input = 1;
  if (!hir__push(f, &f->inputs, tv)) return NULL;
  return tv;
}

HIRDEF hir_tv *hir_input_sized(hir_fusion *f, hir_dtype dtype, int ndims, const int64_t *sizes) {
  hir_tv *tv;
  int i;
  if (!hir__live(f)) return NULL;
  if (!sizes) {
    hir__fail(f, HIR_ERR_INVALID, "hir_input_sized: sizes is NULL; give one per axis");
    return NULL;
  }
  for (i = 0; i < ndims && i < HIR_MAX_DIMS; i++)
    if (sizes[i] < 0) {
      hir__fail(f, HIR_ERR_INVALID, "hir_input_sized: sizes[%d] is %lld; a fixed size is 0 or more", i, (long long)sizes[i]);
      return NULL;
    }
  if (!(tv = hir_input(f, dtype, ndims))) return NULL;
  for (i = 0; i < ndims; i++)
    if (!(tv->ids[i]->extent = hir__const(f, sizes[i]))) return NULL;
  return tv;
}

HIRDEF hir_val *hir_input_scalar(hir_fusion *f) {
  hir_tv *tv;
  if (!hir__live(f)) return NULL;
  if (!(tv = hir__new_tv(f, HIR_F64, HIR_MEM_GLOBAL, 0)) || !(tv->scalar = hir__new_val(f, HIR__VAL_SYMBOL))) return NULL;
  tv->is_input = 1;
  return hir__push(f, &f->inputs, tv) ? tv->scalar : NULL;
}

HIRDEF hir_status hir_output(hir_fusion *f, hir_tv *tv) {
  if (!f) return HIR_ERR_INVALID;
  if (f->status != HIR_OK) return f->status;
  if (!hir__check_tv(f, tv, "hir_output", "tv")) return f->status;
  if (tv->is_input) {
    hir__fail(f, HIR_ERR_INVALID, "hir_output: T%d is an input; an input cannot also be an output, output hir_set(f, T%d)",
              tv->name, tv->name);
    return f->status;
  }
  if (tv->is_output) {
    hir__fail(f, HIR_ERR_INVALID, "hir_output: T%d is already an output", tv->name);
    return f->status;
  }
  tv->is_output = 1;
  return hir__push(f, &f->outputs, tv) ? HIR_OK : f->status;
}

/* out = set(in): the expr, not yet placed in the fusion's expr list. */
static hir_expr *hir__set_expr(hir_fusion *f, hir_tv *in) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_tv *out;
  hir_expr *e;
  int i, n = hir__data_axes(in, ids);
  if (!(out = hir__new_tv(f, in->dtype, HIR_MEM_GLOBAL, n))) return NULL;
  for (i = 0; i < n; i++)
    if (!(out->ids[i] = hir__clone_id(f, ids[i], 0))) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_LOAD_STORE, 1, 1))) return NULL;
  e->in[0] = in;
  e->out[0] = out;
  out->definition = e;
  return e;
}

HIRDEF hir_tv *hir_set(hir_fusion *f, hir_tv *in) {
  hir_expr *e;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_set", "in") || !(e = hir__set_expr(f, in))) return NULL;
  return hir__finish_op(f, e, e->out[0]);
}

/* set(in) with its output's axes in the order perm gives; the expr only. */
static hir_expr *hir__permute_expr(hir_fusion *f, hir_tv *in, const int *perm) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_expr *e = hir__set_expr(f, in);
  int i, n = hir__data_axes(in, ids), identity = 1;
  if (!e) return NULL;
  for (i = 0; i < n; i++) {
    if (!(e->out[0]->ids[i] = hir__clone_id(f, ids[perm[i]], 0))) return NULL;
    e->perm[i] = (unsigned char)perm[i];
    identity &= perm[i] == i;
  }
  if (!identity) e->flags |= HIR__SET_PERMUTE;
  return e;
}

HIRDEF hir_tv *hir_permute(hir_fusion *f, hir_tv *in, const int *perm) {
  hir_id *ids[HIR_MAX_DIMS];
  int seen[HIR_MAX_DIMS] = {0}, norm[HIR_MAX_DIMS], i, n;
  hir_expr *e;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_permute", "in")) return NULL;
  n = hir__data_axes(in, ids);
  if (!perm) {
    hir__fail(f, HIR_ERR_INVALID, "hir_permute: perm is NULL; give one axis of T%d per output axis (%d)", in->name, n);
    return NULL;
  }
  for (i = 0; i < n; i++) {
    norm[i] = perm[i] < 0 ? perm[i] + n : perm[i];
    if (norm[i] < 0 || norm[i] >= n || seen[norm[i]]++) {
      hir__fail(f, HIR_ERR_INVALID, "hir_permute: perm[%d] = %d is %s; perm must list each of T%d's %d data axes once", i,
                perm[i], norm[i] < 0 || norm[i] >= n ? "out of range" : "listed twice", in->name, n);
      return NULL;
    }
  }
  if (!(e = hir__permute_expr(f, in, norm))) return NULL;
  return hir__finish_op(f, e, e->out[0]);
}

HIRDEF hir_tv *hir_transpose(hir_fusion *f, hir_tv *in, int axis0, int axis1) {
  hir_id *ids[HIR_MAX_DIMS];
  int perm[HIR_MAX_DIMS], i, n, a, b;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_transpose", "in")) return NULL;
  n = hir__data_axes(in, ids);
  if ((a = hir__norm_axis(f, axis0, n, "hir_transpose", in)) < 0 || (b = hir__norm_axis(f, axis1, n, "hir_transpose", in)) < 0)
    return NULL;
  for (i = 0; i < n; i++) perm[i] = i == a ? b : i == b ? a : i;
  return hir_permute(f, in, perm);
}

/* A SelectOp, SliceOp or ViewOp of in: the expr, its output of `n` axes to fill. */
static hir_expr *hir__view_op(hir_fusion *f, hir_expr_kind kind, hir_tv *in, int n) {
  hir_tv *out;
  hir_expr *e;
  if (!(out = hir__new_tv(f, in->dtype, HIR_MEM_GLOBAL, n)) || !(e = hir__new_expr(f, kind, 1, 1))) return NULL;
  e->in[0] = in;
  e->out[0] = out;
  return e;
}

HIRDEF hir_tv *hir_select(hir_fusion *f, hir_tv *in, int axis, int64_t index) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_expr *e;
  int i, k = 0, n, a;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_select", "in")) return NULL;
  n = hir__data_axes(in, ids);
  if ((a = hir__norm_axis(f, axis, n, "hir_select", in)) < 0) return NULL;
  if (n < 2 || index < 0) {
    hir__fail(f, HIR_ERR_INVALID, "hir_select: %s", n < 2 ? "selecting from a 1-axis tensor leaves no axis; use hir_slice"
                                                          : "the index is negative; give 0 .. size - 1");
    return NULL;
  }
  if (!(e = hir__view_op(f, HIR_EXPR_SELECT, in, n - 1))) return NULL;
  for (i = 0; i < n; i++)
    if (i != a && !(e->out[0]->ids[k++] = hir__clone_id(f, ids[i], 0))) return NULL;
  e->axis = a;
  e->params[0] = index;
  return hir__finish_op(f, e, e->out[0]);
}

/* A slice bound as the axis's position: from the end where negative, the
   extent for HIR_END. */
static hir_val *hir__slice_bound(hir_fusion *f, hir_val *extent, int64_t at) {
  if (at == HIR_END) return extent;
  return at < 0 ? hir__binary_val(f, HIR_SCALAR_ADD, extent, hir__const(f, at)) : hir__const(f, at);
}

HIRDEF hir_tv *hir_slice_step(hir_fusion *f, hir_tv *in, int axis, int64_t start, int64_t stop, int64_t step) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_expr *e;
  hir_val *from, *to, *extent;
  int i, n, a;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_slice_step", "in")) return NULL;
  n = hir__data_axes(in, ids);
  if ((a = hir__norm_axis(f, axis, n, "hir_slice_step", in)) < 0) return NULL;
  if (step < 1 || start == HIR_END || ((start < 0) == (stop < 0 || stop == HIR_END) && stop <= start)) {
    hir__fail(f, HIR_ERR_INVALID, "hir_slice_step: %lld:%lld:%lld is not a range; give start < stop (negative ones count from the "
              "end, HIR_END is the end) and step >= 1", (long long)start, (long long)stop, (long long)step);
    return NULL;
  }
  if (start >= 0 && stop >= 0 && stop != HIR_END) { /* (stop - start + step - 1) / step elements */
    extent = hir__const(f, (stop - start + step - 1) / step);
  } else {
    from = hir__slice_bound(f, ids[a]->extent, start);
    to = hir__slice_bound(f, ids[a]->extent, stop);
    extent = hir__binary_val(f, HIR_SCALAR_SUB, to, from);
    if (step > 1)
      extent = hir__binary_val(f, HIR_SCALAR_DIV, hir__binary_val(f, HIR_SCALAR_ADD, extent, hir__const(f, step - 1)),
                               hir__const(f, step));
  }
  if (!extent || !(e = hir__view_op(f, HIR_EXPR_SLICE, in, n))) return NULL;
  for (i = 0; i < n; i++)
    if (!(e->out[0]->ids[i] = i == a ? hir__new_id(f, extent, HIR_ITERATION, HIR_SERIAL) : hir__clone_id(f, ids[i], 0))) return NULL;
  e->axis = a;
  e->params[0] = start;
  e->params[1] = stop;
  e->params[2] = step;
  return hir__finish_op(f, e, e->out[0]);
}

HIRDEF hir_tv *hir_slice(hir_fusion *f, hir_tv *in, int axis, int64_t start, int64_t stop) {
  if (hir__live(f) && (start < 0 || (stop != -1 && stop <= start))) {
    hir__fail(f, HIR_ERR_INVALID, "hir_slice: [%lld, %lld) is not a range; give 0 <= start < stop, or stop = -1 for the end",
              (long long)start, (long long)stop);
    return NULL;
  }
  return hir_slice_step(f, in, axis, start, stop == -1 ? HIR_END : stop, 1);
}

HIRDEF hir_tv *hir_reshape(hir_fusion *f, hir_tv *in, int ndims, const int64_t *sizes) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_expr *e;
  hir_val *whole = NULL, *known = NULL;
  int i, n, inferred = -1;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_reshape", "in")) return NULL;
  n = hir__data_axes(in, ids);
  if (ndims < 1 || ndims > HIR_MAX_DIMS || !sizes) {
    hir__fail(f, HIR_ERR_INVALID, "hir_reshape: give 1 to HIR_MAX_DIMS (%d) sizes (ndims %d, sizes %s)", HIR_MAX_DIMS, ndims,
              sizes ? "given" : "NULL");
    return NULL;
  }
  for (i = 0; i < ndims; i++) {
    const char *why = sizes[i] < -1 ? "is negative (-1 infers one size)" : sizes[i] == -1 && inferred >= 0 ? "is a second -1"
                      : sizes[i] == 0 && i >= n ? "keeps an axis the input does not have" : NULL;
    if (why) {
      hir__fail(f, HIR_ERR_INVALID, "hir_reshape: sizes[%d] = %lld %s (T%d has %d data axes)", i, (long long)sizes[i], why,
                in->name, n);
      return NULL;
    }
    if (sizes[i] == -1) inferred = i;
  }
  if (!(e = hir__view_op(f, HIR_EXPR_RESHAPE, in, ndims))) return NULL;
  for (i = 0; i < n; i++) whole = whole ? hir__binary_val(f, HIR_SCALAR_MUL, whole, ids[i]->extent) : ids[i]->extent;
  if (!n) whole = hir__const(f, 1); /* a tensor of no data axes (a full sum) holds one element */
  for (i = 0; i < ndims; i++) {
    hir_val *x = sizes[i] == 0 ? ids[i]->extent : sizes[i] > 0 ? hir__const(f, sizes[i]) : NULL;
    if (sizes[i] == -1) continue;
    if (!x || !(e->out[0]->ids[i] = sizes[i] == 0 ? hir__clone_id(f, ids[i], 0) : hir__new_id(f, x, HIR_ITERATION, HIR_SERIAL)))
      return NULL;
    if (!(known = known ? hir__binary_val(f, HIR_SCALAR_MUL, known, x) : x)) return NULL;
    e->params[i] = sizes[i];
  }
  if (inferred >= 0) { /* whole / known, checked to divide when run */
    hir_val *x = known ? hir__binary_val(f, HIR_SCALAR_DIV, whole, known) : whole;
    if (!x || !(e->out[0]->ids[inferred] = hir__new_id(f, x, HIR_ITERATION, HIR_SERIAL))) return NULL;
    e->params[inferred] = -1;
  }
  return hir__finish_op(f, e, e->out[0]);
}

static hir_tv *hir__binary(hir_fusion *f, hir_binary_op op, hir_tv *a, hir_tv *b) {
  const char *fn = hir__binary_builders[op];
  hir_id *ia[HIR_MAX_DIMS], *ib[HIR_MAX_DIMS];
  hir_tv *out;
  hir_expr *e;
  int i, na, nb;
  if (!hir__live(f) || !hir__check_tv(f, a, fn, "a") || !hir__check_tv(f, b, fn, "b")) return NULL;
  if (a->dtype != b->dtype) {
    hir__fail(f, HIR_ERR_INVALID, "%s: mixed dtypes: T%d is %s, T%d is %s; both operands must have one dtype", fn,
              a->name, hir_dtype_name(a->dtype), b->name, hir_dtype_name(b->dtype));
    return NULL;
  }
  na = hir__data_axes(a, ia);
  nb = hir__data_axes(b, ib);
  if (na != nb) {
    hir__fail(f, HIR_ERR_INVALID,
              "%s: T%d has %d axes and T%d has %d; operands need the same number of axes (add size-1 axes with hir_broadcast)",
              fn, a->name, na, b->name, nb);
    return NULL;
  }
  for (i = 0; i < na; i++) { /* fixed sizes that differ: refused here, not at the first run */
    const hir_val *xa = ia[i]->extent, *xb = ib[i]->extent;
    if (ia[i]->iter == HIR_BROADCAST || ib[i]->iter == HIR_BROADCAST || xa->kind != HIR__VAL_CONST || xb->kind != HIR__VAL_CONST ||
        xa->value == xb->value)
      continue;
    hir__fail(f, HIR_ERR_INVALID, "%s: axis %d is %lld long in T%d and %lld in T%d; %s", fn, i, (long long)xa->value, a->name,
              (long long)xb->value, b->name,
              xa->value == 1 || xb->value == 1
                  ? "a size-1 axis of hir_input_sized is an ordinary axis, not a broadcast as nvFuser's makeConcreteTensor "
                    "makes it: give that input one axis fewer and add this one with hir_broadcast"
                  : "operands need equal sizes on every axis");
    return NULL;
  }
  if (!(out = hir__new_tv(f, a->dtype, HIR_MEM_GLOBAL, na))) return NULL;
  for (i = 0; i < na; i++) /* a broadcast axis takes the other operand's extent */
    if (!(out->ids[i] = hir__clone_id(f, ia[i]->iter == HIR_BROADCAST ? ib[i] : ia[i], 0))) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_BINARY, 2, 1))) return NULL;
  e->sub = (int)op;
  e->in[0] = a;
  e->in[1] = b;
  e->out[0] = out;
  return hir__finish_op(f, e, out);
}

HIRDEF hir_tv *hir_add(hir_fusion *f, hir_tv *a, hir_tv *b) { return hir__binary(f, HIR_BINARY_ADD, a, b); }
HIRDEF hir_tv *hir_sub(hir_fusion *f, hir_tv *a, hir_tv *b) { return hir__binary(f, HIR_BINARY_SUB, a, b); }
HIRDEF hir_tv *hir_mul(hir_fusion *f, hir_tv *a, hir_tv *b) { return hir__binary(f, HIR_BINARY_MUL, a, b); }
HIRDEF hir_tv *hir_div(hir_fusion *f, hir_tv *a, hir_tv *b) { return hir__binary(f, HIR_BINARY_DIV, a, b); }
HIRDEF hir_tv *hir_lt(hir_fusion *f, hir_tv *a, hir_tv *b) { return hir__binary(f, HIR_BINARY_LT, a, b); }

static int hir__check_binary_op(hir_fusion *f, hir_binary_op op, const char *fn) {
  if ((unsigned)op < HIR_BINARY_COUNT) return 1;
  hir__fail(f, HIR_ERR_INVALID, "%s: unknown binary op %d; use HIR_BINARY_ADD, _SUB, _MUL, _DIV or _LT", fn, (int)op);
  return 0;
}

HIRDEF hir_tv *hir_binary(hir_fusion *f, hir_binary_op op, hir_tv *a, hir_tv *b) {
  return hir__live(f) && hir__check_binary_op(f, op, "hir_binary") ? hir__binary(f, op, a, b) : NULL;
}

/* An op of one input whose output, in dtype, takes the input's data axes (an
   elementwise op, random numbers); its fields are the caller's to set. */
static hir_expr *hir__like_op(hir_fusion *f, hir_expr_kind kind, hir_tv *in, hir_dtype dtype) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_tv *out;
  hir_expr *e;
  int i, n = hir__data_axes(in, ids);
  if (!(out = hir__new_tv(f, dtype, HIR_MEM_GLOBAL, n))) return NULL;
  for (i = 0; i < n; i++)
    if (!(out->ids[i] = hir__clone_id(f, ids[i], 0))) return NULL;
  if (!(e = hir__new_expr(f, kind, 1, 1))) return NULL;
  e->in[0] = in;
  e->out[0] = out;
  return e;
}

/* out = op(in) (with scalar s, or the run-time integer sv), stored as dtype. */
static hir_tv *hir__unary(hir_fusion *f, hir_unary_op op, hir_tv *in, hir_dtype dtype, double s, hir_val *sv, const char *fn) {
  hir_expr *e;
  if (!hir__live(f) || !hir__check_tv(f, in, fn, "in")) return NULL;
  if (sv && sv->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the scalar belongs to another fusion or program", fn);
    return NULL;
  }
  if (!(e = hir__like_op(f, HIR_EXPR_UNARY, in, dtype))) return NULL;
  e->sub = (int)op;
  e->scalar = s;
  e->val = sv;
  return hir__finish_op(f, e, e->out[0]);
}

HIRDEF hir_tv *hir_unary(hir_fusion *f, hir_unary_op op, hir_tv *in) {
  if (!hir__live(f)) return NULL;
  if ((unsigned)op >= HIR_UNARY_COUNT || op == HIR_UNARY_CAST || hir__unary_has_scalar(op)) {
    hir__fail(f, HIR_ERR_INVALID, "hir_unary: op %d is not a unary op without a scalar; use hir_cast for casts and "
              "hir_binary_scalar for a tensor and a scalar", (int)op);
    return NULL;
  }
  return hir__unary(f, op, in, in ? in->dtype : HIR_F32, 0, NULL, "hir_unary");
}
HIRDEF hir_tv *hir_neg(hir_fusion *f, hir_tv *in) { return hir_unary(f, HIR_UNARY_NEG, in); }
HIRDEF hir_tv *hir_abs(hir_fusion *f, hir_tv *in) { return hir_unary(f, HIR_UNARY_ABS, in); }
HIRDEF hir_tv *hir_relu(hir_fusion *f, hir_tv *in) { return hir_unary(f, HIR_UNARY_RELU, in); }
HIRDEF hir_tv *hir_sin(hir_fusion *f, hir_tv *in) { return hir_unary(f, HIR_UNARY_SIN, in); }

HIRDEF hir_tv *hir_cast(hir_fusion *f, hir_tv *in, hir_dtype dtype) {
  if (!hir__live(f)) return NULL;
  if ((unsigned)dtype >= HIR_DTYPE_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "hir_cast: unknown dtype %d; use HIR_F32, HIR_F64, HIR_F16, HIR_BF16, HIR_F8E4M3 or HIR_F8E5M2",
              (int)dtype);
    return NULL;
  }
  return hir__unary(f, HIR_UNARY_CAST, in, dtype, 0, NULL, "hir_cast");
}

/* A scalar argument of a builder: given, and of this fusion or program. */
static int hir__check_val(hir_fusion *f, const hir_val *v, const char *fn, const char *arg) {
  if (v && v->ir == f) return 1;
  hir__fail(f, HIR_ERR_INVALID, "%s: %s is %s", fn, arg, v ? "from another fusion or program" : "NULL");
  return 0;
}

HIRDEF hir_tv *hir_rand(hir_fusion *f, hir_tv *like, hir_dtype dtype, hir_val *seed) {
  hir_expr *e;
  if (!hir__live(f) || !hir__check_tv(f, like, "hir_rand", "like") || !hir__check_val(f, seed, "hir_rand", "seed")) return NULL;
  if (dtype != HIR_F32 && dtype != HIR_F64 && dtype != HIR_F16 && dtype != HIR_BF16) {
    hir__fail(f, HIR_ERR_INVALID, "hir_rand: dtype %d; random numbers are HIR_F32, HIR_F64, HIR_F16 or HIR_BF16 (cast "
              "them for fp8)", (int)dtype);
    return NULL;
  }
  if (!(e = hir__like_op(f, HIR_EXPR_RNG, like, dtype))) return NULL;
  e->val = seed;
  return hir__finish_op(f, e, e->out[0]);
}

HIRDEF hir_tv *hir_iota(hir_fusion *f, hir_tv *like, int axis, hir_dtype dtype) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_expr *e;
  int n;
  if (!hir__live(f) || !hir__check_tv(f, like, "hir_iota", "like")) return NULL;
  n = like->nlogical ? like->nlogical : hir__data_axes(like, ids);
  if (axis < -n || axis >= n) {
    hir__fail(f, HIR_ERR_INVALID, "hir_iota: axis %d is out of range for T%d, which has %d logical axes", axis, like->name, n);
    return NULL;
  }
  if (dtype != HIR_F32 && dtype != HIR_F64 && dtype != HIR_F16 && dtype != HIR_BF16 && dtype != HIR_I64) {
    hir__fail(f, HIR_ERR_INVALID, "hir_iota: dtype %d; indices are HIR_I64, HIR_F32, HIR_F64, HIR_F16 or HIR_BF16 (exact "
              "up to 2^24 in f32, 2^53 in f64, 2048 in f16 and 256 in bf16)", (int)dtype);
    return NULL;
  }
  if (!(e = hir__like_op(f, HIR_EXPR_RNG, like, dtype))) return NULL;
  e->sub = HIR__RNG_IOTA;
  e->axis = axis < 0 ? axis + n : axis;
  return hir__finish_op(f, e, e->out[0]);
}

HIRDEF hir_tv *hir_uniform(hir_fusion *f, hir_tv *like, hir_dtype dtype, double low, double high, hir_val *seed) {
  hir_tv *u;
  if (!hir__live(f)) return NULL;
  if (!isfinite(low) || !isfinite(high) || !(low < high)) {
    hir__fail(f, HIR_ERR_INVALID, "hir_uniform: [%g, %g) is not a range; give finite low < high", low, high);
    return NULL;
  }
  u = hir_rand(f, like, dtype, seed);
  if (u && high - low != 1) u = hir_binary_scalar(f, HIR_BINARY_MUL, u, high - low);
  if (u && low != 0) u = hir_binary_scalar(f, HIR_BINARY_ADD, u, low);
  return u;
}

/* The unary op computing `a op s` (scalar_first: `s op a`). */
static hir_unary_op hir__scalar_form(hir_binary_op op, int scalar_first) {
  switch (op) {
  case HIR_BINARY_ADD: return HIR_UNARY_ADD_SCALAR;
  case HIR_BINARY_MUL: return HIR_UNARY_MUL_SCALAR;
  case HIR_BINARY_SUB: return scalar_first ? HIR_UNARY_SCALAR_SUB : HIR_UNARY_SUB_SCALAR;
  case HIR_BINARY_LT: return scalar_first ? HIR_UNARY_SCALAR_LT : HIR_UNARY_LT_SCALAR;
  default: return scalar_first ? HIR_UNARY_SCALAR_DIV : HIR_UNARY_DIV_SCALAR;
  }
}

static hir_tv *hir__binary_scalar(hir_fusion *f, hir_binary_op op, hir_tv *a, double s, hir_val *sv, int scalar_first,
                                  const char *fn) {
  if (!hir__live(f) || !hir__check_binary_op(f, op, fn)) return NULL;
  if (!isfinite(s)) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the scalar is %g; give a finite number", fn, s);
    return NULL;
  }
  if (a && a->dtype == HIR_I64 && !sv && (s != floor(s) || fabs(s) >= 9007199254740992.0)) {
    hir__fail(f, HIR_ERR_INVALID, "%s: T%d is int64 and the scalar %g is not an integer of at most 2^53; give one, or an "
              "integer scalar input (hir_binary_val)", fn, a->name, s);
    return NULL;
  }
  return hir__unary(f, hir__scalar_form(op, scalar_first), a, a ? a->dtype : HIR_F32, s, sv, fn);
}

HIRDEF hir_tv *hir_binary_scalar(hir_fusion *f, hir_binary_op op, hir_tv *a, double s) {
  return hir__binary_scalar(f, op, a, s, NULL, 0, "hir_binary_scalar");
}
HIRDEF hir_tv *hir_scalar_binary(hir_fusion *f, hir_binary_op op, double s, hir_tv *b) {
  return hir__binary_scalar(f, op, b, s, NULL, 1, "hir_scalar_binary");
}
HIRDEF hir_tv *hir_binary_val(hir_fusion *f, hir_binary_op op, hir_tv *a, hir_val *s) {
  if (hir__live(f) && !s) {
    hir__fail(f, HIR_ERR_INVALID, "hir_binary_val: the scalar is NULL");
    return NULL;
  }
  return hir__binary_scalar(f, op, a, 0, s, 0, "hir_binary_val");
}

/* A sum (ReductionOp) or a max (MaxOp) over `axes`, the output keeping
   them as reduction axes. */
static hir_tv *hir__reduce(hir_fusion *f, hir_expr_kind kind, hir_tv *in, int naxes, const int *axes, const char *fn) {
  hir_id *ids[HIR_MAX_DIMS];
  int reduced[HIR_MAX_DIMS] = {0};
  hir_tv *out;
  hir_expr *e;
  int i, n;
  if (!hir__live(f) || !hir__check_tv(f, in, fn, "in")) return NULL;
  n = hir__data_axes(in, ids);
  if (naxes < 1 || !axes) {
    hir__fail(f, HIR_ERR_INVALID, "%s: give at least one axis to reduce (naxes = %d, axes %s)", fn, naxes,
              axes ? "given" : "NULL");
    return NULL;
  }
  for (i = 0; i < naxes; i++) {
    int a = axes[i] < 0 ? axes[i] + n : axes[i];
    if (a < 0 || a >= n) {
      hir__fail(f, HIR_ERR_INVALID, "%s: axis %d is out of range for T%d, which has %d data axes", fn, axes[i], in->name, n);
      return NULL;
    }
    if (reduced[a]) {
      hir__fail(f, HIR_ERR_INVALID, "%s: axis %d of T%d is listed twice", fn, a, in->name);
      return NULL;
    }
    if (ids[a]->iter == HIR_BROADCAST) {
      hir__fail(f, HIR_ERR_INVALID, "%s: axis %d of T%d is a broadcast axis; reducing it is a no-op, drop it", fn, a,
                in->name);
      return NULL;
    }
    reduced[a] = 1;
  }
  if (!(out = hir__new_tv(f, in->dtype, HIR_MEM_GLOBAL, n))) return NULL;
  for (i = 0; i < n; i++) {
    if (!(out->ids[i] = hir__clone_id(f, ids[i], 0))) return NULL;
    if (reduced[i]) out->ids[i]->iter = HIR_REDUCTION;
  }
  if (!(e = hir__new_expr(f, kind, 1, 1))) return NULL;
  e->in[0] = in;
  e->out[0] = out;
  return hir__finish_op(f, e, out);
}

HIRDEF hir_tv *hir_sum(hir_fusion *f, hir_tv *in, int naxes, const int *axes) {
  return hir__reduce(f, HIR_EXPR_REDUCTION, in, naxes, axes, "hir_sum");
}
HIRDEF hir_tv *hir_max(hir_fusion *f, hir_tv *in, int naxes, const int *axes) {
  return hir__reduce(f, HIR_EXPR_MAX, in, naxes, axes, "hir_max");
}

HIRDEF hir_tv *hir_broadcast(hir_fusion *f, hir_tv *in, int ndims_out, const int *is_broadcast) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_tv *out;
  hir_expr *e;
  int i, n, kept = 0, next = 0;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_broadcast", "in")) return NULL;
  n = hir__data_axes(in, ids);
  if (!is_broadcast || ndims_out < 1 || ndims_out > HIR_MAX_DIMS) {
    hir__fail(f, HIR_ERR_INVALID, "hir_broadcast: ndims_out %d must be 1..HIR_MAX_DIMS (%d) with a flag per output axis",
              ndims_out, HIR_MAX_DIMS);
    return NULL;
  }
  for (i = 0; i < ndims_out; i++) kept += !is_broadcast[i];
  if (kept != n) {
    hir__fail(f, HIR_ERR_INVALID,
              "hir_broadcast: %d flags are false but T%d has %d data axes; each input axis needs one false flag", kept,
              in->name, n);
    return NULL;
  }
  if (!(out = hir__new_tv(f, in->dtype, HIR_MEM_GLOBAL, ndims_out))) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_BROADCAST, 1, 1))) return NULL;
  for (i = 0; i < ndims_out; i++) {
    if (is_broadcast[i]) {
      hir_val *one = hir__const(f, 1);
      if (!one || !(out->ids[i] = hir__new_id(f, one, HIR_BROADCAST, HIR_SERIAL))) return NULL;
      e->flags |= 1u << i;
    } else if (!(out->ids[i] = hir__clone_id(f, ids[next++], 0))) {
      return NULL;
    }
  }
  e->in[0] = in;
  e->out[0] = out;
  return hir__finish_op(f, e, out);
}

/* torch.matmul: 1-D operands are promoted and their size-1 axis dropped, batch
   axes broadcast right-aligned, the contracted axis kept as a trailing rS.
   linear: b is [.., N, K] (read transposed) and bias, if any, b's shape
   without K. */
/* Whether a scale holds one value: a single axis of fixed size 1. */
static int hir__scale_is_scalar(const hir_tv *scale) {
  hir_id *ids[HIR_MAX_DIMS];
  return hir__data_axes(scale, ids) == 1 && ids[0]->extent->kind == HIR__VAL_CONST && ids[0]->extent->value == 1;
}

/* hir_scaled_linear's operands (the matmul checks the rest). */
static int hir__check_scaled(hir_fusion *f, const hir_tv *a, const hir_tv *w, const hir_tv *sa, const hir_tv *sw, hir_dtype out) {
  const char *fn = "hir_scaled_linear";
  hir_id *ids[HIR_MAX_DIMS];
  int na = hir__data_axes(a, ids), nw = hir__data_axes(w, ids), k;
  const hir_tv *scales[2];
  scales[0] = sa, scales[1] = sw;
  if (!hir__is_fp8(a->dtype) || !hir__is_fp8(w->dtype) || (a->dtype == HIR_F8E5M2 && w->dtype == HIR_F8E5M2)) {
    hir__fail(f, HIR_ERR_INVALID, "%s: a (T%d) is %s and weight (T%d) is %s; both must be fp8 (HIR_F8E4M3 or HIR_F8E5M2), not "
              "both e5m2 (GPUs have no e5m2 x e5m2 GEMM)", fn, a->name, hir_dtype_name(a->dtype), w->name, hir_dtype_name(w->dtype));
    return 0;
  }
  if (out != HIR_F32 && out != HIR_F16 && out != HIR_BF16) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the output dtype %s is not HIR_F32, HIR_F16 or HIR_BF16", fn, hir_dtype_name(out));
    return 0;
  }
  if (na < 2 || nw < 2) {
    hir__fail(f, HIR_ERR_INVALID, "%s: a (T%d) has %d data axes and weight (T%d) %d; they need [..., M, K] and [..., N, K]", fn,
              a->name, na, w->name, nw);
    return 0;
  }
  for (k = 0; k < 2; k++) {
    const hir_tv *sc = scales[k];
    int want = k == 0 ? na - 1 : nw - 1, n = hir__data_axes(sc, ids);
    if (sc->dtype != HIR_F32 || (!hir__scale_is_scalar(sc) && n != want)) {
      hir__fail(f, HIR_ERR_INVALID, "%s: %s (T%d) is %s with %d data axes; it must be f32 with one value (one axis of fixed "
                "size 1) or %d axes (%s)", fn, k ? "w_scale" : "a_scale", sc->name, hir_dtype_name(sc->dtype), n, want,
                k ? "the weight's shape without K" : "a's shape without K");
      return 0;
    }
  }
  return 1;
}

/* scales: hir_scaled_linear's a_scale and w_scale (checked), the output `out_dtype`; else NULL, and a's dtype. */
static hir_tv *hir__matmul(hir_fusion *f, hir_tv *a, hir_tv *b, hir_tv *bias, hir_tv *const *scales, hir_dtype out_dtype, int linear,
                           const char *fn) {
  hir_id *ia[HIR_MAX_DIMS], *ib[HIR_MAX_DIMS], *ic[HIR_MAX_DIMS], *res[HIR_MAX_DIMS + 1];
  hir_tv *out;
  hir_expr *e;
  int i, na, nb, n = 0;
  if (!hir__live(f) || !hir__check_tv(f, a, fn, "a") || !hir__check_tv(f, b, fn, linear ? "weight" : "b") ||
      (bias && !hir__check_tv(f, bias, fn, "bias")) || (scales && (!hir__check_tv(f, scales[0], fn, "a_scale") ||
                                                                    !hir__check_tv(f, scales[1], fn, "w_scale") ||
                                                                    !hir__check_scaled(f, a, b, scales[0], scales[1], out_dtype))))
    return NULL;
  if (!scales && (a->dtype != b->dtype || (bias && bias->dtype != a->dtype))) {
    const hir_tv *other = a->dtype != b->dtype ? b : bias;
    hir__fail(f, HIR_ERR_INVALID, "%s: mixed dtypes: T%d is %s, T%d is %s; every operand must have one dtype", fn,
              a->name, hir_dtype_name(a->dtype), other->name, hir_dtype_name(other->dtype));
    return NULL;
  }
  {
    hir_tv *const operands[3] = {a, b, bias};
    int k, first[HIR_MAX_DIMS + 1];
    for (k = 0; k < 3; k++) /* the output's axes come from the operands' logical ones, which a split made several (a
                               program's matmuls, made by hir__positional_matmuls, are positional) */
      if (operands[k] && !f->program && hir__axis_groups(operands[k], 1, first) != hir__data_axes(operands[k], ia)) {
        hir__fail(f, HIR_ERR_INVALID, "%s: T%d has split axes (hir_split); build the ops first, then split, as nvFuser "
                  "schedules a defined fusion", fn, operands[k]->name);
        return NULL;
      }
  }
  na = hir__data_axes(a, ia);
  nb = hir__data_axes(b, ib);
  if (na < 1 || nb < 1 + linear) {
    hir__fail(f, HIR_ERR_INVALID, "%s: incompatible ranks: T%d has %d data axes, T%d has %d; they need at least 1 and %d", fn,
              a->name, na, b->name, nb, 1 + linear);
    return NULL;
  }
  if (linear) { /* [.., N, K] seen as [.., K, N] */
    hir_id *t = ib[nb - 1];
    ib[nb - 1] = ib[nb - 2], ib[nb - 2] = t;
  }
  if (bias && hir__data_axes(bias, ic) != nb - 1) {
    hir__fail(f, HIR_ERR_INVALID, "%s: bias T%d has %d data axes; it needs %d, the weight's without K", fn, bias->name,
              hir__data_axes(bias, ic), nb - 1);
    return NULL;
  }
  if (na >= 2 && nb >= 2) {
    int nbatch_a = na - 2, nbatch_b = nb - 2, nbatch = nbatch_a > nbatch_b ? nbatch_a : nbatch_b;
    for (i = 0; i < nbatch; i++) { /* right-aligned batch broadcasting */
      int ka = i - (nbatch - nbatch_a), kb = i - (nbatch - nbatch_b);
      hir_id *x = ka >= 0 ? ia[ka] : NULL, *y = kb >= 0 ? ib[kb] : NULL;
      res[n++] = !x ? y : !y ? x : (x->iter == HIR_BROADCAST ? y : x);
    }
    res[n++] = ia[na - 2];
    res[n++] = ib[nb - 1];
  } else if (na >= 2) { /* [.., M, K] x [K] */
    for (i = 0; i < na - 1; i++) res[n++] = ia[i];
  } else if (nb >= 2) { /* [K] x [.., K, N] */
    for (i = 0; i < nb - 2; i++) res[n++] = ib[i];
    res[n++] = ib[nb - 1];
  }
  res[n++] = ia[na - 1]; /* the contracted axis */
  if (n > HIR_MAX_DIMS) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the result of T%d x T%d would have %d axes (with rK), more than HIR_MAX_DIMS (%d)", fn,
              a->name, b->name, n, HIR_MAX_DIMS);
    return NULL;
  }
  if (!(out = hir__new_tv(f, scales ? out_dtype : a->dtype, HIR_MEM_GLOBAL, n))) return NULL;
  for (i = 0; i < n; i++)
    if (!(out->ids[i] = hir__clone_id(f, res[i], 0))) return NULL;
  out->ids[n - 1]->iter = HIR_REDUCTION;
  if (!(e = hir__new_expr(f, HIR_EXPR_MATMUL, scales ? 4 : bias ? 3 : 2, 1))) return NULL;
  e->in[0] = a;
  e->in[1] = b;
  if (bias) e->in[2] = bias;
  if (scales) e->in[2] = scales[0], e->in[3] = scales[1], e->flags |= HIR__MATMUL_SCALED;
  if (linear) e->flags |= HIR__MATMUL_LINEAR;
  e->out[0] = out;
  return hir__finish_op(f, e, out);
}

HIRDEF hir_tv *hir_matmul(hir_fusion *f, hir_tv *a, hir_tv *b) {
  return hir__matmul(f, a, b, NULL, NULL, HIR_F32, 0, "hir_matmul");
}
HIRDEF hir_tv *hir_linear(hir_fusion *f, hir_tv *a, hir_tv *weight, hir_tv *bias) {
  return hir__matmul(f, a, weight, bias, NULL, HIR_F32, 1, "hir_linear");
}
HIRDEF hir_tv *hir_scaled_linear(hir_fusion *f, hir_tv *a, hir_tv *weight, hir_tv *a_scale, hir_tv *w_scale, hir_dtype out) {
  hir_tv *scales[2];
  scales[0] = a_scale, scales[1] = w_scale;
  return hir__matmul(f, a, weight, NULL, scales, out, 1, "hir_scaled_linear");
}

/* sum / (the product of the summed extents): extents of a split axis are
   whole (a DIDx axis counts the mesh), so the mean is over the whole tensor. */
HIRDEF hir_tv *hir_mean(hir_fusion *f, hir_tv *in, int naxes, const int *axes) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_val *count = NULL;
  hir_tv *sum = hir_sum(f, in, naxes, axes);
  int i, n;
  if (!sum) return NULL;
  n = hir__data_axes(in, ids);
  for (i = 0; i < naxes; i++) {
    hir_val *extent = ids[axes[i] < 0 ? axes[i] + n : axes[i]]->extent;
    if (!(count = count ? hir__binary_val(f, HIR_SCALAR_MUL, count, extent) : extent)) return NULL;
  }
  return hir__binary_scalar(f, HIR_BINARY_DIV, sum, 0, count, 0, "hir_mean");
}

/* in seen with the last `nlast` of n axes new (lead = 0) or the first n - nlast (lead = 1). */
static hir_tv *hir__broadcast_to(hir_fusion *f, hir_tv *in, int n, int nlast, int lead) {
  int flags[HIR_MAX_DIMS] = {0}, i;
  for (i = 0; i < n; i++) flags[i] = lead ? i < n - nlast : i >= n - nlast;
  return hir_broadcast(f, in, n, flags);
}

/* The norms, as nvFuser's layer_norm is made: mean, x - mean (layer_norm
   only), the mean square, x times rsqrt(it + eps), then weight and bias. */
/* Marks the expr at `at` of a composite being built (if it was made). */
static void hir__role(hir_fusion *f, int at, int role) {
  if (at >= 0 && at < f->exprs.n) ((hir_expr *)f->exprs.items[at])->composite_role = (unsigned char)role;
}

/* layer_norm (center: the mean taken out, a bias allowed) or rms_norm,
   built of primitives (a mean, a difference, ...), so every pass and every
   sharding takes it; a backend with the norm's kernel runs them as one
   (hir__find_fused). `name`: the caller's, for messages. */
static hir_tv *hir__norm(hir_fusion *f, const char *name, hir_tv *x, int naxes, hir_tv *weight, hir_tv *bias, double eps, int center) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_tv *in, *xc, *var, *y, *p[2];
  int axes[HIR_MAX_DIMS], i, n, half, first, at;
  if (!hir__live(f) || !hir__check_tv(f, x, name, "x")) return NULL;
  n = hir__data_axes(x, ids);
  if (naxes < 1 || naxes > n) {
    hir__fail(f, HIR_ERR_INVALID, "%s: naxes %d is out of range for T%d, which has %d data axes (valid: 1..%d)", name, naxes,
              x->name, n, n);
    return NULL;
  }
  p[0] = weight, p[1] = bias;
  for (i = 0; i < 2; i++)
    if (p[i] && (!hir__check_tv(f, p[i], name, i ? "bias" : "weight") || hir__data_axes(p[i], ids) != naxes)) {
      if (hir__live(f))
        hir__fail(f, HIR_ERR_INVALID, "%s: %s T%d has %d data axes; it needs the %d normalized axes", name, i ? "bias" : "weight",
                  p[i]->name, hir__data_axes(p[i], ids), naxes);
      return NULL;
    }
  if (!(eps >= 0) || !isfinite(eps)) {
    hir__fail(f, HIR_ERR_INVALID, "%s: eps is %g; give a finite number >= 0 (1e-5 is usual)", name, eps);
    return NULL;
  }
  half = x->dtype == HIR_F16 || x->dtype == HIR_BF16;
  first = f->exprs.n;
  in = half ? hir_cast(f, x, HIR_F32) : x;
  for (i = 0; i < naxes; i++) axes[i] = n - naxes + i;
  xc = in;
  if (center) {
    xc = hir_sub(f, in, hir__broadcast_to(f, hir_mean(f, in, naxes, axes), n, naxes, 0));
    hir__role(f, f->exprs.n - 1, HIR__ROLE_CENTER);
  }
  var = hir_mean(f, hir_mul(f, xc, xc), naxes, axes);
  hir__role(f, first, HIR__ROLE_X); /* the first made reads x: the cast, else the mean's sum (rms: the square) */
  at = f->exprs.n;
  var = hir_binary_scalar(f, HIR_BINARY_ADD, var, eps);
  hir__role(f, at, HIR__ROLE_EPS);
  y = hir_mul(f, xc, hir__broadcast_to(f, hir_unary(f, HIR_UNARY_RSQRT, var), n, naxes, 0));
  for (i = 0; i < 2; i++) {
    hir_tv *q;
    at = f->exprs.n;
    q = p[i] && half && p[i]->dtype != HIR_F32 ? hir_cast(f, p[i], HIR_F32) : p[i];
    if (q) y = hir__binary(f, i ? HIR_BINARY_ADD : HIR_BINARY_MUL, y, hir__broadcast_to(f, q, n, naxes, 1));
    if (q) hir__role(f, at, i ? HIR__ROLE_BIAS : HIR__ROLE_WEIGHT);
  }
  y = half ? hir_cast(f, y, x->dtype) : y;
  hir__role(f, f->exprs.n - 1, HIR__ROLE_OUT);
  for (i = first; y && i < f->exprs.n; i++) ((hir_expr *)f->exprs.items[i])->composite = first + 1;
  return y;
}

HIRDEF hir_tv *hir_layer_norm(hir_fusion *f, hir_tv *x, int naxes, hir_tv *weight, hir_tv *bias, double eps) {
  return hir__norm(f, "hir_layer_norm", x, naxes, weight, bias, eps, 1);
}

HIRDEF hir_tv *hir_rms_norm(hir_fusion *f, hir_tv *x, int naxes, hir_tv *weight, double eps) {
  return hir__norm(f, "hir_rms_norm", x, naxes, weight, NULL, eps, 0);
}

/* Attention's scores, as the forward and the backward both make them:
   scale * q k^T in f32 (f64 for f64 operands), the causal mask's dropped
   places pushed to -1e30 (so exp gives 0 and no 0 * inf appears). */
static hir_tv *hir__sdpa_scores(hir_fusion *f, hir_tv *q, hir_tv *k, int n, double scale, int causal) {
  hir_dtype acc = q->dtype == HIR_F64 ? HIR_F64 : HIR_F32;
  hir_tv *s = hir_matmul(f, q, hir_transpose(f, k, n - 2, n - 1));
  if (s && s->dtype != acc) s = hir_cast(f, s, acc);
  s = hir_binary_scalar(f, HIR_BINARY_MUL, s, scale);
  if (causal && s) { /* keep column j of row i where j < i + 1 */
    hir_tv *row = hir_iota(f, s, n - 2, acc), *col = hir_iota(f, s, n - 1, acc);
    hir_tv *keep = hir_lt(f, col, hir_binary_scalar(f, HIR_BINARY_ADD, row, 1));
    s = hir_sub(f, s, hir_binary_scalar(f, HIR_BINARY_MUL, hir_scalar_binary(f, HIR_BINARY_SUB, 1, keep), 1e30));
  }
  return s;
}

/* The dropout's scaled mask over p's places (hir_rand of the seed: the
   backward draws the same numbers), or NULL without dropout. */
static hir_tv *hir__sdpa_dropout(hir_fusion *f, hir_tv *p, const hir_sdpa_desc *d) {
  if (!(d->dropout > 0) || !p) return NULL; /* no p: the fusion holds the error */
  return hir_binary_scalar(f, HIR_BINARY_MUL, hir_binary_scalar(f, HIR_BINARY_LT, hir_rand(f, p, p->dtype, d->seed), 1 - d->dropout),
                           1 / (1 - d->dropout));
}

/* The operands' checks and the scale, shared by the forward and the backward. */
static int hir__sdpa_args(hir_fusion *f, hir_tv *q, hir_tv *k, hir_tv *v, const hir_sdpa_desc *d, const char *fn, int *n,
                          double *scale) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_tv *ops[3];
  int i;
  ops[0] = q, ops[1] = k, ops[2] = v;
  if (!hir__live(f)) return 0;
  for (i = 0; i < 3; i++)
    if (!hir__check_tv(f, ops[i], fn, i == 0 ? "q" : i == 1 ? "k" : "v")) return 0;
  *n = hir__data_axes(q, ids);
  if (*n < 2 || hir__data_axes(k, ids) != *n || hir__data_axes(v, ids) != *n || k->dtype != q->dtype || v->dtype != q->dtype) {
    hir__fail(f, HIR_ERR_INVALID, "%s: q T%d, k T%d and v T%d need one dtype and as many data axes, 2 or more ([..., L, E], "
              "[..., S, E], [..., S, Ev])", fn, q->name, k->name, v->name);
    return 0;
  }
  if (!d || !(d->dropout >= 0 && d->dropout < 1) || !isfinite(d->scale) || (d->dropout > 0 && !d->seed)) {
    hir__fail(f, HIR_ERR_INVALID, "%s: %s", fn, !d ? "the desc is NULL" : !(d->dropout >= 0 && d->dropout < 1) ? "dropout must be in "
              "[0, 1)" : !isfinite(d->scale) ? "the scale is not finite" : "a dropout needs its seed (hir_val_const, or "
              "hir_input_scalar for a new draw each run)");
    return 0;
  }
  if (d->dropout > 0 && !hir__check_val(f, d->seed, fn, "seed")) return 0;
  *scale = d->scale;
  hir__data_axes(q, ids);
  if (*scale == 0 && ids[*n - 1]->extent->kind != HIR__VAL_CONST) {
    hir__fail(f, HIR_ERR_INVALID, "%s: q T%d's last axis has no fixed size, so 1/sqrt(E) is not known when built; give the "
              "desc's scale, or the size (hir_input_sized)", fn, q->name);
    return 0;
  }
  if (*scale == 0) *scale = 1 / sqrt((double)ids[*n - 1]->extent->value);
  return 1;
}

HIRDEF hir_tv *hir_sdpa(hir_fusion *f, hir_tv *q, hir_tv *k, hir_tv *v, const hir_sdpa_desc *d, hir_tv **logsumexp) {
  hir_tv *s, *m, *e, *l, *p, *drop, *out;
  double scale;
  int n, last;
  if (logsumexp) *logsumexp = NULL;
  if (!hir__sdpa_args(f, q, k, v, d, "hir_sdpa", &n, &scale)) return NULL;
  last = n - 1;
  s = hir__sdpa_scores(f, q, k, n, scale, d->causal);
  m = hir_max(f, s, 1, &last);
  e = hir_unary(f, HIR_UNARY_EXP, hir_sub(f, s, hir__broadcast_to(f, m, n, 1, 0)));
  l = hir_sum(f, e, 1, &last);
  p = hir_div(f, e, hir__broadcast_to(f, l, n, 1, 0));
  if ((drop = hir__sdpa_dropout(f, p, d))) p = hir_mul(f, p, drop);
  if (p && p->dtype != q->dtype) p = hir_cast(f, p, q->dtype);
  out = hir_matmul(f, p, v);
  if (out && logsumexp) *logsumexp = hir_add(f, m, hir_unary(f, HIR_UNARY_LOG, l));
  return out && (!logsumexp || *logsumexp) ? out : NULL;
}

HIRDEF hir_status hir_sdpa_backward(hir_fusion *f, hir_tv *grad_out, hir_tv *q, hir_tv *k, hir_tv *v, hir_tv *out,
                                    hir_tv *logsumexp, const hir_sdpa_desc *d, hir_tv **grad_q, hir_tv **grad_k,
                                    hir_tv **grad_v) {
  hir_tv *s, *p, *pd, *drop, *dp, *delta, *ds, *go, *o;
  hir_dtype acc;
  double scale;
  int n, last;
  if (!grad_q || !grad_k || !grad_v) {
    if (hir__live(f)) hir__fail(f, HIR_ERR_INVALID, "hir_sdpa_backward: give grad_q, grad_k and grad_v to receive the gradients");
    return hir_fusion_status(f);
  }
  *grad_q = *grad_k = *grad_v = NULL;
  if (!hir__sdpa_args(f, q, k, v, d, "hir_sdpa_backward", &n, &scale) ||
      !hir__check_tv(f, grad_out, "hir_sdpa_backward", "grad_out") || !hir__check_tv(f, out, "hir_sdpa_backward", "out") ||
      !hir__check_tv(f, logsumexp, "hir_sdpa_backward", "logsumexp"))
    return hir_fusion_status(f);
  last = n - 1;
  acc = q->dtype == HIR_F64 ? HIR_F64 : HIR_F32;
  s = hir__sdpa_scores(f, q, k, n, scale, d->causal);
  p = hir_unary(f, HIR_UNARY_EXP, hir_sub(f, s, hir__broadcast_to(f, logsumexp, n, 1, 0))); /* the forward's weights */
  pd = (drop = hir__sdpa_dropout(f, p, d)) ? hir_mul(f, p, drop) : p;
  if (pd && pd->dtype != q->dtype) pd = hir_cast(f, pd, q->dtype);
  *grad_v = hir_matmul(f, hir_transpose(f, pd, n - 2, n - 1), grad_out);
  dp = hir_matmul(f, grad_out, hir_transpose(f, v, n - 2, n - 1));
  if (dp && dp->dtype != acc) dp = hir_cast(f, dp, acc);
  if (drop) dp = hir_mul(f, dp, drop);
  go = grad_out && grad_out->dtype != acc ? hir_cast(f, grad_out, acc) : grad_out;
  o = out && out->dtype != acc ? hir_cast(f, out, acc) : out;
  delta = hir_sum(f, hir_mul(f, go, o), 1, &last); /* the rows of p * dp, summed: those of grad_out * out */
  ds = hir_binary_scalar(f, HIR_BINARY_MUL, hir_mul(f, p, hir_sub(f, dp, hir__broadcast_to(f, delta, n, 1, 0))), scale);
  if (ds && ds->dtype != q->dtype) ds = hir_cast(f, ds, q->dtype);
  *grad_q = hir_matmul(f, ds, k);
  *grad_k = hir_matmul(f, hir_transpose(f, ds, n - 2, n - 1), q);
  if (!*grad_q || !*grad_k || !*grad_v) *grad_q = *grad_k = *grad_v = NULL;
  return hir_fusion_status(f);
}

static hir_status hir__set_mesh(hir_tv *tv, int ndevices, int cols, const int *devices, const char *fn) {
  hir_fusion *f;
  int *mesh, i, j;
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  if (ndevices < 1 || !devices) {
    hir__fail(f, HIR_ERR_INVALID, "%s: T%d: empty mesh; give at least one device id", fn, tv->name);
    return f->status;
  }
  for (i = 0; i < ndevices; i++) {
    if (devices[i] < 0) {
      hir__fail(f, HIR_ERR_INVALID, "%s: T%d: device id %d at position %d is negative", fn, tv->name, devices[i], i);
      return f->status;
    }
    if ((j = hir_team_index(devices, i, devices[i])) >= 0) {
      hir__fail(f, HIR_ERR_INVALID, "%s: T%d: device %d appears twice in the mesh (positions %d and %d)", fn, tv->name,
                devices[i], j, i);
      return f->status;
    }
  }
  if (!(mesh = (int *)hir__alloc(f, (size_t)ndevices * sizeof(int)))) return f->status;
  memcpy(mesh, devices, (size_t)ndevices * sizeof(int));
  tv->mesh = mesh;
  tv->mesh_size = ndevices;
  tv->mesh_cols = cols;
  return HIR_OK;
}

HIRDEF hir_status hir_set_mesh(hir_tv *tv, int ndevices, const int *devices) {
  return hir__set_mesh(tv, ndevices, 0, devices, "hir_set_mesh");
}

HIRDEF hir_status hir_set_mesh_2d(hir_tv *tv, int rows, int cols, const int *devices) {
  if (tv && tv->ir->status == HIR_OK && (rows < 1 || cols < 1 || rows > INT32_MAX / cols)) {
    hir__fail(tv->ir, HIR_ERR_INVALID, "hir_set_mesh_2d: T%d: a %d x %d mesh; give at least one row and one column", tv->name,
              rows, cols);
    return tv->ir->status;
  }
  return hir__set_mesh(tv, tv ? rows * cols : 0, cols, devices, "hir_set_mesh_2d");
}

HIRDEF hir_status hir_parallelize(hir_tv *tv, int axis, hir_ptype ptype) {
  hir_fusion *f;
  int a, i;
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  if ((a = hir__loop_axis(f, tv, axis, "hir_parallelize")) < 0) return f->status;
  if (tv->ids[a]->merged && ptype != HIR_SERIAL) { /* a merge with an axis of one element: the other takes it */
    const hir_id *x = tv->ids[a], *y = a + 1 < tv->ndims ? tv->ids[a + 1] : NULL;
    int one_x = x->iter == HIR_BROADCAST || (x->extent->kind == HIR__VAL_CONST && x->extent->value == 1);
    int one_y = y && (y->iter == HIR_BROADCAST || (y->extent->kind == HIR__VAL_CONST && y->extent->value == 1));
    if (!y || y->merged || one_x == one_y) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_parallelize: T%d axis %d is a merge of axes (hir_merge), which no parallel type "
                "takes (nvFuser's stream lowering refuses a Stream there too); split one of the axes (hir_split) and "
                "parallelize its part", tv->name, axis < 0 ? axis + hir_tv_ndims(tv) : axis);
      return f->status;
    }
    a = one_x ? a + 1 : a;
  }
  if ((unsigned)ptype >= HIR_PTYPE_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "hir_parallelize: unknown parallel type %d; use HIR_SERIAL, HIR_DIDX, HIR_DIDY or HIR_STREAM",
              (int)ptype);
    return f->status;
  }
  if (ptype != HIR_SERIAL) {
    for (i = 0; i < tv->ndims; i++)
      if (i != a && tv->ids[i]->ptype == ptype) {
        hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_parallelize: T%d already has a %s axis (axis %d); one %s axis per tensor",
                  tv->name, hir__ptype_labels[ptype], hir__loop_place(tv, i), hir__ptype_labels[ptype]);
        return f->status;
      }
  }
  tv->ids[a]->ptype = ptype;
  return HIR_OK;
}

HIRDEF int hir_tv_ndims(const hir_tv *tv) {
  int head[HIR_MAX_DIMS];
  return tv ? hir__loop_heads(tv, head) : 0;
}
HIRDEF int hir_tv_name(const hir_tv *tv) { return tv ? tv->name : -1; }
HIRDEF hir_dtype hir_tv_dtype(const hir_tv *tv) { return tv ? tv->dtype : HIR_F32; }
/* The axis at loop position `axis` (hir_reorder), or NULL. */
static const hir_id *hir__tv_axis(const hir_tv *tv, int axis) {
  int head[HIR_MAX_DIMS];
  if (!tv || axis < 0 || axis >= hir__loop_heads(tv, head)) return NULL;
  return tv->ids[head[axis]];
}
HIRDEF hir_iter_type hir_tv_iter_type(const hir_tv *tv, int axis) {
  const hir_id *id = hir__tv_axis(tv, axis);
  return id ? id->iter : HIR_ITERATION;
}
HIRDEF hir_ptype hir_tv_ptype(const hir_tv *tv, int axis) {
  const hir_id *id = hir__tv_axis(tv, axis);
  return id ? id->ptype : HIR_SERIAL;
}
HIRDEF hir_val *hir_tv_extent(const hir_tv *tv, int axis) {
  const hir_id *id = hir__tv_axis(tv, axis);
  return id ? (id->merged ? id->merged : id->extent) : NULL;
}
HIRDEF int hir_tv_mesh_cols(const hir_tv *tv) { return tv ? tv->mesh_cols : 0; }
HIRDEF const int *hir_tv_mesh(const hir_tv *tv, int *ndevices) {
  if (ndevices) *ndevices = tv ? tv->mesh_size : 0;
  return tv ? tv->mesh : NULL;
}
HIRDEF hir_expr *hir_tv_definition(const hir_tv *tv) { return tv ? tv->definition : NULL; }
HIRDEF int hir_tv_logical_ndims(const hir_tv *tv) { return tv ? tv->nlogical : 0; }
HIRDEF int hir_tv_logical_axis(const hir_tv *tv, int axis) {
  int head[HIR_MAX_DIMS];
  if (!tv || axis < 0 || axis >= hir__loop_heads(tv, head)) return -1;
  axis = head[axis];
  return tv->nlogical ? tv->logical_of[axis] : hir__data_index(tv, axis);
}

HIRDEF hir_expr_kind hir_expr_kind_of(const hir_expr *e) { return e ? e->kind : HIR_EXPR_KIND_COUNT; }
HIRDEF const char *hir_expr_kind_name(const hir_expr *e) { return e ? hir__ops[e->kind].name : "(null)"; }
HIRDEF int hir_expr_name(const hir_expr *e) { return e ? e->name : -1; }
HIRDEF int hir_expr_ninputs(const hir_expr *e) { return e ? e->nin : 0; }
HIRDEF hir_tv *hir_expr_input(const hir_expr *e, int i) { return (e && i >= 0 && i < e->nin) ? e->in[i] : NULL; }
HIRDEF int hir_expr_noutputs(const hir_expr *e) { return e ? e->nout : 0; }
HIRDEF hir_tv *hir_expr_output(const hir_expr *e, int i) { return (e && i >= 0 && i < e->nout) ? e->out[i] : NULL; }
HIRDEF hir_scope *hir_expr_body(const hir_expr *e) {
  return (e && (hir__ops[e->kind].flags & HIR__OP_SCOPED)) ? (hir_scope *)&e->body : NULL;
}
HIRDEF hir_scope *hir_expr_else(const hir_expr *e) {
  return (e && e->kind == HIR_EXPR_IF_THEN_ELSE) ? (hir_scope *)&e->orelse : NULL;
}
HIRDEF int hir_scope_size(const hir_scope *s) { return s ? s->exprs.n : 0; }
HIRDEF hir_expr *hir_scope_at(const hir_scope *s, int i) {
  return (s && i >= 0 && i < s->exprs.n) ? (hir_expr *)s->exprs.items[i] : NULL;
}

HIRDEF hir_val *hir_val_const(hir_fusion *f, int64_t value) { return hir__live(f) ? hir__const(f, value) : NULL; }

HIRDEF hir_val *hir_val_named(hir_fusion *f, hir_named_scalar which) {
  if (!hir__live(f)) return NULL;
  if ((unsigned)which >= HIR_NAMED_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "hir_val_named: unknown named scalar %d", (int)which);
    return NULL;
  }
  return hir__named(f, which);
}

HIRDEF hir_val *hir_val_binary(hir_fusion *f, hir_scalar_op op, hir_val *a, hir_val *b) {
  if (!hir__live(f)) return NULL;
  if ((unsigned)op >= HIR_SCALAR_OP_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "hir_val_binary: unknown scalar op %d", (int)op);
    return NULL;
  }
  if (!a || !b || a->ir != f || b->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "hir_val_binary: operand %s is %s", !a || a->ir != f ? "a" : "b",
              (!a || !b) ? "NULL" : "from another fusion or program");
    return NULL;
  }
  return hir__binary_val(f, op, a, b);
}

// >>host
HIRDEF hir_program *hir_program_create(void) {
  hir_program *p = (hir_program *)HIR_MALLOC(sizeof(hir_program));
  if (!p) return NULL;
  memset(p, 0, sizeof *p);
  p->ir.program = p;
  p->top.ir = &p->ir;
  p->my_device = -1; /* built by hand: runs on any rank */
  return p;
}

HIRDEF void hir_program_free(hir_program *p) {
  if (!p) return;
  hir__arena_free(&p->ir.arena);
  HIR_FREE(p);
}

HIRDEF const char *hir_program_error(const hir_program *p) { return p ? p->ir.error : "hir_program_error: program is NULL"; }
HIRDEF const char *hir_program_plan(const hir_program *p) { return p ? p->plan : ""; }
HIRDEF hir_fusion *hir_program_fusion(hir_program *p) { return p ? &p->ir : NULL; }
HIRDEF hir_scope *hir_program_body(hir_program *p) { return p ? &p->top : NULL; }
HIRDEF int hir_program_ntop(const hir_program *p) { return p ? p->top.exprs.n : 0; }
HIRDEF int hir_program_ninputs(const hir_program *p) { return p ? p->ir.inputs.n : 0; }
HIRDEF hir_tv *hir_program_input(const hir_program *p, int i) {
  return (p && i >= 0 && i < p->ir.inputs.n) ? (hir_tv *)p->ir.inputs.items[i] : NULL;
}
HIRDEF int hir_program_noutputs(const hir_program *p) { return p ? p->ir.outputs.n : 0; }
HIRDEF hir_tv *hir_program_output(const hir_program *p, int i) {
  return (p && i >= 0 && i < p->ir.outputs.n) ? (hir_tv *)p->ir.outputs.items[i] : NULL;
}
HIRDEF const hir_expr *hir_program_top(const hir_program *p, int i) { return p ? hir_scope_at(&p->top, i) : NULL; }

HIRDEF hir_status hir_scope_append(hir_scope *s, hir_expr *e) {
  hir_fusion *f;
  if (!s) return HIR_ERR_INVALID;
  f = s->ir;
  if (f->status != HIR_OK) return f->status;
  if (!e || e->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "hir_scope_append: the expr is %s", e ? "from another program" : "NULL");
    return f->status;
  }
  if (e->scope) {
    hir__fail(f, HIR_ERR_INVALID, "hir_scope_append: %s %d is already in a scope; an expr is placed once (to run it "
              "twice, as nvFuser's programs push a Communication or Wait twice, make a second one: the same hir_host_* "
              "call again, or a loop around one)", hir__ops[e->kind].name, e->name);
    return f->status;
  }
  if (!hir__push(f, &s->exprs, e)) return f->status;
  e->scope = s;
  return HIR_OK;
}

/* The program of a host builder, checked: live, and really a program. */
static hir_fusion *hir__host(hir_program *p) { return (p && p->ir.status == HIR_OK) ? &p->ir : NULL; }

static hir_expr *hir__host_tv_op(hir_program *p, hir_expr_kind kind, hir_tv *tv, const char *fn) {
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  if (!f || !hir__check_tv(f, tv, fn, "tv") || !(e = hir__new_expr(f, kind, 1, 0))) return NULL;
  e->in[0] = tv;
  return e;
}

HIRDEF hir_expr *hir_host_allocate(hir_program *p, hir_tv *tv) {
  return hir__host_tv_op(p, HIR_EXPR_ALLOCATE, tv, "hir_host_allocate");
}
HIRDEF hir_expr *hir_host_deallocate(hir_program *p, hir_tv *tv) {
  return hir__host_tv_op(p, HIR_EXPR_DEALLOCATE, tv, "hir_host_deallocate");
}

HIRDEF hir_stream *hir_stream_new(hir_program *p) {
  hir_fusion *f = hir__host(p);
  hir_stream *s;
  if (!f || !(s = (hir_stream *)hir__alloc(f, sizeof(hir_stream)))) return NULL;
  s->name = p->next_stream++;
  return s;
}

HIRDEF hir_stream *hir_stream_indexed(hir_program *p, hir_val *index) {
  hir_fusion *f = hir__host(p);
  hir_stream *s;
  if (!f || !hir__check_val(f, index, "hir_stream_indexed", "index")) return NULL;
  if (!(s = (hir_stream *)hir__alloc(f, sizeof(hir_stream)))) return NULL;
  s->name = -1;
  s->index = index;
  return s;
}

static hir_expr *hir__host_stream_op(hir_program *p, hir_expr_kind kind, hir_stream *s, const char *fn) {
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  if (!f) return NULL;
  if (!s) {
    hir__fail(f, HIR_ERR_INVALID, "%s: stream is NULL", fn);
    return NULL;
  }
  if (kind == HIR_EXPR_GET_CURRENT_STREAM && s->index) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the stream is a pool stream; get the current stream into a hir_stream_new variable", fn);
    return NULL;
  }
  if (!(e = hir__new_expr(f, kind, 0, 0))) return NULL;
  e->stream = s;
  return e;
}

HIRDEF hir_expr *hir_host_get_current_stream(hir_program *p, hir_stream *into) {
  return hir__host_stream_op(p, HIR_EXPR_GET_CURRENT_STREAM, into, "hir_host_get_current_stream");
}
HIRDEF hir_expr *hir_host_set_current_stream(hir_program *p, hir_stream *to) {
  return hir__host_stream_op(p, HIR_EXPR_SET_CURRENT_STREAM, to, "hir_host_set_current_stream");
}
HIRDEF hir_expr *hir_host_synchronize(hir_program *p, hir_stream *s) {
  return hir__host_stream_op(p, HIR_EXPR_SYNCHRONIZE, s, "hir_host_synchronize");
}

HIRDEF hir_expr *hir_host_for_loop(hir_program *p, hir_tv *tv, int axis) {
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  int a;
  if (!f || !hir__check_tv(f, tv, "hir_host_for_loop", "tv")) return NULL;
  if ((a = hir__loop_axis(f, tv, axis, "hir_host_for_loop")) < 0) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_FOR_LOOP, 0, 0))) return NULL;
  e->id = tv->ids[a];
  if (!(e->val = hir__named(f, HIR_NAMED_STREAM_IDX))) return NULL;
  return e;
}

HIRDEF hir_expr *hir_host_for_range(hir_program *p, hir_val *stop) {
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  if (!f || !hir__check_val(f, stop, "hir_host_for_range", "stop")) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_FOR_LOOP, 0, 0)) || !(e->id = hir__new_id(f, stop, HIR_ITERATION, HIR_SERIAL)) ||
      !(e->val = hir__new_val(f, HIR__VAL_SYMBOL)))
    return NULL;
  return e;
}

HIRDEF hir_val *hir_host_loop_index(const hir_expr *loop) {
  return loop && loop->kind == HIR_EXPR_FOR_LOOP ? loop->val : NULL;
}

HIRDEF hir_expr *hir_host_if(hir_program *p, hir_val *predicate) {
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  if (!f || !hir__check_val(f, predicate, "hir_host_if", "predicate")) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_IF_THEN_ELSE, 0, 0))) return NULL;
  e->val = predicate;
  return e;
}

/* A view of `in` at `index` along `axis`: parts 0, that axis selected away
   (HirAliasSelect); else part `index` of `parts` equal parts, the axis kept
   (HirAliasSlice). */
static hir_expr *hir__alias_view(hir_fusion *f, hir_tv *in, int axis, hir_val *index, int parts) {
  const hir_id *cut = in->ids[axis];
  hir_tv *out;
  hir_expr *e;
  int i, n = 0;
  if (!(out = hir__new_tv(f, in->dtype, HIR_MEM_LOCAL, parts ? in->ndims : in->ndims - 1))) return NULL;
  for (i = 0; i < in->ndims; i++)
    if ((i != axis || parts) &&
        !(out->ids[n++] = i != axis ? hir__clone_id(f, in->ids[i], 1)
                                    : hir__new_id(f, hir__binary_val(f, HIR_SCALAR_DIV, cut->extent, hir__const(f, parts)),
                                                  cut->iter, cut->ptype)))
      return NULL;
  hir__share_mesh(out, in);
  out->made_from = in->name + 1;
  if (!(e = hir__new_expr(f, parts ? HIR_EXPR_ALIAS_SLICE : HIR_EXPR_ALIAS_SELECT, 1, 1))) return NULL;
  e->in[0] = in;
  e->out[0] = out;
  e->axis = axis;
  e->id = in->ids[axis];
  e->val = index;
  e->parts = parts;
  return e;
}

/* The arguments of hir_host_alias_select/slice; the axis, or -1. */
static int hir__view_args(hir_fusion *f, hir_tv *in, int axis, hir_val *index, const char *fn) {
  int a;
  if (!f || !hir__check_tv(f, in, fn, "in")) return -1;
  if ((a = hir__norm_axis(f, axis, in->ndims, fn, in)) < 0) return -1;
  if (!index || index->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "%s: index is %s", fn, index ? "from another program" : "NULL");
    return -1;
  }
  return a;
}

HIRDEF hir_expr *hir_host_alias_select(hir_program *p, hir_tv *in, int axis, hir_val *index) {
  hir_fusion *f = hir__host(p);
  int a = hir__view_args(f, in, axis, index, "hir_host_alias_select");
  if (a < 0) return NULL;
  if (in->ndims < 2) {
    hir__fail(f, HIR_ERR_INVALID, "hir_host_alias_select: T%d has one axis; selecting it would leave no axes", in->name);
    return NULL;
  }
  return hir__alias_view(f, in, a, index, 0);
}

HIRDEF hir_expr *hir_host_alias_slice(hir_program *p, hir_tv *in, int axis, hir_val *index, int parts) {
  hir_fusion *f = hir__host(p);
  int a = hir__view_args(f, in, axis, index, "hir_host_alias_slice");
  if (a < 0) return NULL;
  if (parts < 1) {
    hir__fail(f, HIR_ERR_INVALID, "hir_host_alias_slice: parts is %d; cut into 1 or more parts", parts);
    return NULL;
  }
  if (in->ids[a]->iter != HIR_ITERATION) {
    hir__fail(f, HIR_ERR_INVALID, "hir_host_alias_slice: T%d axis %d is a %s axis; slice an iteration axis", in->name, a,
              in->ids[a]->iter == HIR_REDUCTION ? "reduction" : "broadcast");
    return NULL;
  }
  return hir__alias_view(f, in, a, index, parts);
}

static hir_expr *hir__host_compute(hir_program *p, hir_expr_kind kind, int sub, hir_tv *out, hir_tv *a, hir_tv *b,
                                   const char *fn) {
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  int nin = b || kind != HIR_EXPR_LOAD_STORE ? 2 : 1;
  if (!f || !hir__check_tv(f, out, fn, "out") || !hir__check_tv(f, a, fn, nin == 1 ? "in" : "a")) return NULL;
  if (nin == 2 && !hir__check_tv(f, b, fn, "b")) return NULL;
  if (a->dtype != out->dtype || (b && b->dtype != out->dtype)) {
    hir__fail(f, HIR_ERR_INVALID, "%s: mixed dtypes: T%d is %s but its operands are %s%s%s", fn, out->name,
              hir_dtype_name(out->dtype), hir_dtype_name(a->dtype), b ? " and " : "", b ? hir_dtype_name(b->dtype) : "");
    return NULL;
  }
  if (!(e = hir__new_expr(f, kind, nin, 1))) return NULL;
  e->sub = sub;
  e->in[0] = a;
  if (nin == 2) e->in[1] = b;
  e->out[0] = out;
  return e;
}

HIRDEF hir_expr *hir_host_set(hir_program *p, hir_tv *out, hir_tv *in) {
  return hir__host_compute(p, HIR_EXPR_LOAD_STORE, 0, out, in, NULL, "hir_host_set");
}
HIRDEF hir_expr *hir_host_binary(hir_program *p, hir_binary_op op, hir_tv *out, hir_tv *a, hir_tv *b) {
  if ((unsigned)op >= HIR_BINARY_COUNT) {
    if (hir__host(p)) hir__fail(&p->ir, HIR_ERR_INVALID, "hir_host_binary: unknown binary op %d", (int)op);
    return NULL;
  }
  return hir__host_compute(p, HIR_EXPR_BINARY, (int)op, out, a, b, "hir_host_binary");
}
HIRDEF hir_expr *hir_host_matmul(hir_program *p, hir_tv *out, hir_tv *a, hir_tv *b) {
  return hir__host_compute(p, HIR_EXPR_MATMUL, 0, out, a, b, "hir_host_matmul");
}

static int hir__check_team(hir_fusion *f, int n, const int *team, const char *fn) {
  int i;
  if (n < 1 || !team) {
    hir__fail(f, HIR_ERR_INVALID, "%s: empty team; give the device ids taking part", fn);
    return 0;
  }
  for (i = 0; i < n; i++) {
    if (team[i] < 0) {
      hir__fail(f, HIR_ERR_INVALID, "%s: device id %d in the team is negative", fn, team[i]);
      return 0;
    }
    if (hir_team_index(team, i, team[i]) >= 0) {
      hir__fail(f, HIR_ERR_INVALID, "%s: device %d appears twice in the team", fn, team[i]);
      return 0;
    }
  }
  return 1;
}

/* A Communication, arguments trusted. A collective's buffers are
   device-global memory (nvFuser marks them so). */
static hir_expr *hir__comm_expr(hir_fusion *f, hir_collective type, int nteam, const int *team, int root, hir_tv *in,
                                hir_tv *out) {
  hir_expr *e;
  int *copy;
  if (!(e = hir__new_expr(f, HIR_EXPR_COMMUNICATION, 1, 1))) return NULL;
  if (!(copy = (int *)hir__alloc(f, (size_t)nteam * sizeof(int)))) return NULL;
  memcpy(copy, team, (size_t)nteam * sizeof(int));
  (e->in[0] = in)->mem = HIR_MEM_GLOBAL;
  (e->out[0] = out)->mem = HIR_MEM_GLOBAL;
  e->sub = (int)type;
  e->team = copy;
  e->team_size = nteam;
  e->root = hir__collective_has_root(type) ? root : -1;
  return e;
}

HIRDEF hir_expr *hir_host_communication(hir_program *p, hir_collective type, int nteam, const int *team, int root,
                                        hir_tv *in, hir_tv *out) {
  const char *fn = "hir_host_communication";
  hir_fusion *f = hir__host(p);
  if (!f) return NULL;
  if ((unsigned)type >= HIR_COLLECTIVE_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "%s: unknown collective type %d", fn, (int)type);
    return NULL;
  }
  if (!hir__check_team(f, nteam, team, fn)) return NULL;
  if (hir__collective_has_root(type) && hir_team_index(team, nteam, root) < 0) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the root %d of the %s is not in its team", fn, root, hir__collective_names[type]);
    return NULL;
  }
  if (!in || !out) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the %s needs an input and an output tensor (%s is NULL); a rank outside a "
              "tensor's mesh skips it", fn, hir__collective_names[type], in ? "out" : "in");
    return NULL;
  }
  if (!hir__check_tv(f, in, fn, "in") || !hir__check_tv(f, out, fn, "out")) return NULL;
  if (in->dtype != out->dtype) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the %s moves T%d (%s) into T%d (%s); a collective keeps the dtype", fn,
              hir__collective_names[type], in->name, hir_dtype_name(in->dtype), out->name, hir_dtype_name(out->dtype));
    return NULL;
  }
  return hir__comm_expr(f, type, nteam, team, root, in, out);
}

HIRDEF hir_expr *hir_host_p2p(hir_program *p, hir_p2p_type type, hir_tv *buffer, hir_val *peer) {
  const char *fn = "hir_host_p2p";
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  if (!f || !hir__check_tv(f, buffer, fn, "buffer")) return NULL;
  if (type != HIR_P2P_SEND && type != HIR_P2P_RECV) {
    hir__fail(f, HIR_ERR_INVALID, "%s: unknown type %d; use HIR_P2P_SEND or HIR_P2P_RECV", fn, (int)type);
    return NULL;
  }
  if (!hir__check_val(f, peer, fn, "peer")) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_P2P_COMMUNICATION, 1, 0))) return NULL;
  e->sub = (int)type;
  e->in[0] = buffer;
  e->val = peer;
  return e;
}

HIRDEF hir_expr *hir_host_collective_permute(hir_program *p, int nteam, const int *team, hir_val *send_peer,
                                             hir_val *recv_peer, hir_tv *in, hir_tv *out) {
  const char *fn = "hir_host_collective_permute";
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  int *copy;
  if (!f || !hir__check_team(f, nteam, team, fn)) return NULL;
  if (!hir__check_tv(f, in, fn, "in") || !hir__check_tv(f, out, fn, "out") || !hir__check_val(f, send_peer, fn, "send_peer") ||
      !hir__check_val(f, recv_peer, fn, "recv_peer"))
    return NULL;
  if (in->dtype != out->dtype) {
    hir__fail(f, HIR_ERR_INVALID, "%s: it moves T%d (%s) into T%d (%s); a permute keeps the dtype", fn, in->name,
              hir_dtype_name(in->dtype), out->name, hir_dtype_name(out->dtype));
    return NULL;
  }
  if (!(e = hir__new_expr(f, HIR_EXPR_COLLECTIVE_PERMUTE, 1, 1)) || !(copy = (int *)hir__alloc(f, (size_t)nteam * sizeof(int))))
    return NULL;
  memcpy(copy, team, (size_t)nteam * sizeof(int));
  (e->in[0] = in)->mem = HIR_MEM_GLOBAL;
  (e->out[0] = out)->mem = HIR_MEM_GLOBAL;
  e->team = copy;
  e->team_size = nteam;
  e->root = -1;
  e->val = send_peer;
  e->recv_peer = recv_peer;
  return e;
}

/* An MoE op's output: `like`'s leading axes (device axes, one element a
   device) and mesh, then rows [rows] or [rows, cols] (cols NULL: none). */
static hir_tv *hir__moe_tensor(hir_fusion *f, const hir_tv *like, int lead, hir_dtype dtype, hir_val *rows, hir_val *cols) {
  hir_tv *t = hir__new_tv(f, dtype, HIR_MEM_GLOBAL, lead + 1 + (cols != NULL));
  int i;
  if (!t) return NULL;
  for (i = 0; i < lead; i++)
    if (!(t->ids[i] = hir__clone_id(f, like->ids[i], 1))) return NULL;
  if (!(t->ids[lead] = hir__new_id(f, rows, HIR_ITERATION, HIR_SERIAL)) || (cols && !(t->ids[lead + 1] = hir__new_id(f, cols, HIR_ITERATION, HIR_SERIAL))))
    return NULL;
  hir__share_mesh(t, like);
  return t;
}

/* An MoE operand: `rank` data axes after its device axes (leading DIDx or
   DIDy axes, one element a device), of int64 where `i64`, floating where
   not; returns how many leading axes, or -1 (error recorded). */
static int hir__moe_operand(hir_fusion *f, const hir_tv *t, int rank, int i64, const char *fn, const char *arg) {
  int lead = 0, i;
  if (!hir__check_tv(f, t, fn, arg)) return -1;
  while (lead < t->ndims && hir__is_did(t->ids[lead]->ptype)) lead++;
  for (i = lead; i < t->ndims && (t->ids[i]->iter == HIR_ITERATION && t->ids[i]->ptype == HIR_SERIAL); i++) continue;
  if (t->ndims - lead != rank || i < t->ndims || (i64 ? t->dtype != HIR_I64 : (hir__is_fp8(t->dtype) || t->dtype == HIR_I64))) {
    hir__fail(f, HIR_ERR_INVALID, "%s: %s T%d must be %d plain axes of %s after its device axes (DIDx or DIDy, leading); it "
              "is %d axes of %s", fn, arg, t->name, rank, i64 ? "int64" : "f32, f64, f16 or bf16", t->ndims - lead,
              hir_dtype_name(t->dtype));
    return -1;
  }
  return lead;
}

HIRDEF hir_expr *hir_host_moe_dispatch(hir_program *p, int nteam, const int *team, hir_tv *x, hir_tv *topk_idx,
                                       hir_tv *topk_weights, int64_t num_experts) {
  const char *fn = "hir_host_moe_dispatch";
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  hir_val *tokens, *cap, *hidden, *one, *ranks;
  int lead, *copy;
  if (!f || !hir__check_team(f, nteam, team, fn) || (lead = hir__moe_operand(f, x, 2, 0, fn, "x")) < 0 ||
      hir__moe_operand(f, topk_idx, 2, 1, fn, "topk_idx") != lead || hir__moe_operand(f, topk_weights, 2, 0, fn, "topk_weights") != lead) {
    if (f && f->status == HIR_OK)
      hir__fail(f, HIR_ERR_INVALID, "%s: x, topk_idx and topk_weights need the same leading device axes", fn);
    return NULL;
  }
  if (num_experts < 1 || num_experts % nteam) {
    hir__fail(f, HIR_ERR_INVALID, "%s: %lld experts over a team of %d; give a positive multiple of the team's size (each "
              "device holds num_experts / team size of them)", fn, (long long)num_experts, nteam);
    return NULL;
  }
  tokens = x->ids[lead]->extent, hidden = x->ids[lead + 1]->extent, one = hir__const(f, 1), ranks = hir__const(f, nteam);
  cap = hir__binary_val(f, HIR_SCALAR_MUL, tokens, ranks);
  if (!(e = hir__new_expr(f, HIR_EXPR_MOE_DISPATCH, 3, 6)) || !(copy = (int *)hir__alloc(f, (size_t)nteam * sizeof(int))) ||
      !(e->out[0] = hir__moe_tensor(f, x, lead, x->dtype, cap, hidden)) ||
      !(e->out[1] = hir__moe_tensor(f, x, lead, HIR_I64, cap, one)) ||
      !(e->out[2] = hir__moe_tensor(f, x, lead, topk_weights->dtype, cap, one)) ||
      !(e->out[3] = hir__moe_tensor(f, x, lead, HIR_I64, cap, NULL)) || !(e->out[4] = hir__moe_tensor(f, x, lead, HIR_I64, ranks, NULL)) ||
      !(e->out[5] = hir__moe_tensor(f, x, lead, HIR_I64, ranks, NULL)))
    return NULL;
  memcpy(copy, team, (size_t)nteam * sizeof(int));
  e->in[0] = x, e->in[1] = topk_idx, e->in[2] = topk_weights;
  e->team = copy, e->team_size = nteam, e->root = -1;
  e->params[0] = num_experts;
  return e;
}

HIRDEF hir_expr *hir_host_moe_combine(hir_program *p, int nteam, const int *team, hir_tv *x, hir_tv *src_idx,
                                      hir_tv *n_tokens_to_rank, hir_tv *n_tokens_from_rank, hir_val *num_tokens) {
  const char *fn = "hir_host_moe_combine";
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  int lead, *copy;
  if (!f || !hir__check_team(f, nteam, team, fn) || (lead = hir__moe_operand(f, x, 2, 0, fn, "x")) < 0 ||
      hir__moe_operand(f, src_idx, 1, 1, fn, "src_idx") != lead || hir__moe_operand(f, n_tokens_to_rank, 1, 1, fn, "n_tokens_to_rank") != lead ||
      hir__moe_operand(f, n_tokens_from_rank, 1, 1, fn, "n_tokens_from_rank") != lead || !hir__check_val(f, num_tokens, fn, "num_tokens")) {
    if (f && f->status == HIR_OK)
      hir__fail(f, HIR_ERR_INVALID, "%s: x, src_idx and the counts need the same leading device axes", fn);
    return NULL;
  }
  if (!(e = hir__new_expr(f, HIR_EXPR_MOE_COMBINE, 4, 1)) || !(copy = (int *)hir__alloc(f, (size_t)nteam * sizeof(int))) ||
      !(e->out[0] = hir__moe_tensor(f, x, lead, x->dtype, num_tokens, x->ids[lead + 1]->extent)))
    return NULL;
  memcpy(copy, team, (size_t)nteam * sizeof(int));
  e->in[0] = x, e->in[1] = src_idx, e->in[2] = n_tokens_to_rank, e->in[3] = n_tokens_from_rank;
  e->team = copy, e->team_size = nteam, e->root = -1;
  e->val = num_tokens;
  return e;
}

HIRDEF hir_expr *hir_host_start_coalescing(hir_program *p) {
  hir_fusion *f = hir__host(p);
  return f ? hir__new_expr(f, HIR_EXPR_START_COALESCING, 0, 0) : NULL;
}
HIRDEF hir_expr *hir_host_end_coalescing(hir_program *p) {
  hir_fusion *f = hir__host(p);
  return f ? hir__new_expr(f, HIR_EXPR_END_COALESCING, 0, 0) : NULL;
}

HIRDEF hir_expr *hir_host_wait(hir_program *p, hir_expr *communication) {
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  if (!f) return NULL;
  if (!communication || communication->ir != f || !(hir__ops[communication->kind].flags & HIR__OP_WAITABLE)) {
    hir__fail(f, HIR_ERR_INVALID, "hir_host_wait: %s; wait on a Communication, P2PCommunication, CollectivePermute or "
              "EndCoalescing",
              !communication ? "the expr is NULL" : communication->ir != f ? "the expr is from another program"
                                                                           : "that expr cannot be waited on");
    return NULL;
  }
  if (!(e = hir__new_expr(f, HIR_EXPR_WAIT, 0, 0))) return NULL;
  e->target = communication;
  return e;
}

static int hir__vec_has(const hir__vec *v, const void *item) {
  int i;
  for (i = 0; i < v->n; i++)
    if (v->items[i] == item) return 1;
  return 0;
}

/* Collects, in creation order, the exprs computing `tv` from the unit's inputs. */
static int hir__unit_collect(hir_fusion *f, hir__host_unit *u, hir_tv *tv) {
  hir_expr *d;
  int i, pos;
  if (hir__vec_has(&u->ins, tv)) return 1;
  if (!(d = tv->definition)) {
    hir__fail(f, HIR_ERR_INVALID, "hir_host_post_on_stream: T%d is needed but is neither an input of the unit nor computed from them",
              tv->name);
    return 0;
  }
  if (hir__vec_has(&u->exprs, d)) return 1;
  for (i = 0; i < d->nin; i++)
    if (!hir__unit_collect(f, u, d->in[i])) return 0;
  if (!hir__push(f, &u->exprs, d)) return 0;
  for (pos = u->exprs.n - 1; pos > 0 && ((hir_expr *)u->exprs.items[pos - 1])->name > d->name; pos--)
    u->exprs.items[pos] = u->exprs.items[pos - 1];
  u->exprs.items[pos] = d;
  return 1;
}

/* The PostOnStream running a unit (its ins, outs and exprs already filled). */
static hir_expr *hir__post_unit(hir_program *p, hir__host_unit *u) {
  hir_fusion *f = &p->ir;
  hir_expr *e;
  int i;
  u->name = p->units.n;
  if (!hir__push(f, &p->units, u) || !(e = hir__new_expr(f, HIR_EXPR_POST_ON_STREAM, u->ins.n, u->outs.n))) return NULL;
  for (i = 0; i < u->ins.n; i++) e->in[i] = (hir_tv *)u->ins.items[i];
  for (i = 0; i < u->outs.n; i++) e->out[i] = (hir_tv *)u->outs.items[i];
  e->unit = u;
  return e;
}

HIRDEF hir_expr *hir_host_post_on_stream(hir_program *p, int nin, hir_tv *const *ins, int nout, hir_tv *const *outs) {
  const char *fn = "hir_host_post_on_stream";
  hir_fusion *f = hir__host(p);
  hir__host_unit *u;
  int i;
  if (!f) return NULL;
  if (nin < 0 || nout < 1 || (nin > 0 && !ins) || !outs) {
    hir__fail(f, HIR_ERR_INVALID, "%s: a unit needs arrays of its inputs (%d) and at least one output (%d)", fn, nin, nout);
    return NULL;
  }
  if (!(u = (hir__host_unit *)hir__alloc(f, sizeof(hir__host_unit)))) return NULL;
  for (i = 0; i < nin; i++)
    if (!hir__check_tv(f, ins[i], fn, "ins[i]") || !hir__push(f, &u->ins, ins[i])) return NULL;
  for (i = 0; i < nout; i++) {
    if (!hir__check_tv(f, outs[i], fn, "outs[i]") || !hir__push(f, &u->outs, outs[i])) return NULL;
    if (!hir__unit_collect(f, u, outs[i])) return NULL;
  }
  if (!u->exprs.n) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the unit computes nothing: its outputs are its inputs", fn);
    return NULL;
  }
  return hir__post_unit(p, u);
}

// >>print
/* Output to a FILE or to a buffer with snprintf's contract (len counts all). */
typedef struct hir__writer {
  FILE *fp;
  char *buf;
  size_t cap, len;
} hir__writer;

static void hir__emit(hir__writer *w, const char *fmt, ...) HIR__PRINTF(2, 3);
static void hir__emit(hir__writer *w, const char *fmt, ...) {
  va_list ap;
  int n;
  va_start(ap, fmt);
  if (w->fp) {
    n = vfprintf(w->fp, fmt, ap);
  } else {
    size_t room = w->len < w->cap ? w->cap - w->len : 0;
    n = vsnprintf(room ? w->buf + w->len : NULL, room, fmt, ap);
  }
  va_end(ap);
  if (n > 0) w->len += (size_t)n;
}

static hir__writer hir__buffer_writer(char *buf, size_t cap) {
  hir__writer w = {NULL, NULL, 0, 0};
  w.buf = buf;
  w.cap = buf ? cap : 0;
  if (w.cap) buf[0] = '\0';
  return w;
}

static void hir__indent(hir__writer *w, int n) {
  for (; n > 0; n--) hir__emit(w, "  ");
}

/* "[2, 3]": sizes as the messages write them. */
static void hir__emit_sizes(hir__writer *w, int nd, const int64_t *sizes) {
  int i;
  hir__emit(w, "[");
  for (i = 0; i < nd; i++) hir__emit(w, i ? ", %lld" : "%lld", (long long)sizes[i]);
  hir__emit(w, "]");
}

HIRDEF size_t hir_comm_what_snprint(const hir_comm_what *what, char *buf, size_t cap) {
  hir__writer w = hir__buffer_writer(buf, cap);
  if (!what || what->tensor < 0 || what->ndims < 0 || what->ndims > HIR_MAX_DIMS) {
    hir__emit(&w, "a buffer");
    return w.len;
  }
  hir__emit(&w, "T%d ", what->tensor);
  hir__emit_sizes(&w, what->ndims, what->sizes);
  hir__emit(&w, " %s", hir_dtype_name(what->dtype));
  return w.len;
}

static void hir__print_val(hir__writer *w, const hir_val *v) {
  switch (v->kind) {
  case HIR__VAL_CONST: hir__emit(w, "%lld", (long long)v->value); break;
  case HIR__VAL_SYMBOL: hir__emit(w, "i%d", v->name); break;
  case HIR__VAL_NAMED: hir__emit(w, "%s", hir__named_names[v->which]); break;
  case HIR__VAL_BINARY:
    hir__emit(w, "( ");
    hir__print_val(w, v->lhs);
    hir__emit(w, " %s ", hir__scalar_op_names[v->op]);
    hir__print_val(w, v->rhs);
    hir__emit(w, " )");
    break;
  case HIR__VAL_MESH_AT: {
    int i;
    hir__emit(w, "DeviceMesh{");
    for (i = 0; i < v->mesh_size; i++) hir__emit(w, i ? " %d" : "%d", v->mesh[i]);
    hir__emit(w, "}[");
    hir__print_val(w, v->lhs);
    hir__emit(w, "]");
    break;
  }
  }
}

static void hir__print_id(hir__writer *w, const hir_id *id) {
  hir__emit(w, "%c%s%d{", hir__iter_chars[id->iter], hir__ptype_names[id->ptype], id->name);
  hir__print_val(w, id->extent);
  hir__emit(w, "}");
}

static void hir__print_tv(hir__writer *w, const hir_tv *tv) {
  int i, order[HIR_MAX_DIMS];
  hir__emit(w, "T%d_%c_%s[", tv->name, tv->mem == HIR_MEM_GLOBAL ? 'g' : 'l', hir__dtype_names[tv->dtype]);
  hir__loop_order(tv, order); /* nvFuser prints the loop domain */
  for (i = 0; i < tv->ndims; i++) {
    if (i) hir__emit(w, ", ");
    hir__print_id(w, tv->ids[order[i]]);
  }
  hir__emit(w, "]");
  if (tv->mesh_size) { /* a 2-D mesh row by row, as nvFuser: DeviceMesh{{0 1}{2 3}} */
    int cols = tv->mesh_cols ? tv->mesh_cols : tv->mesh_size;
    hir__emit(w, " (DeviceMesh{");
    for (i = 0; i < tv->mesh_size; i++)
      hir__emit(w, "%s%d%s", tv->mesh_cols && i % cols == 0 ? "{" : i % cols ? " " : "", tv->mesh[i],
                tv->mesh_cols && i % cols == cols - 1 ? "}" : "");
    hir__emit(w, "})");
  }
}

static void hir__print_stream(hir__writer *w, const hir_stream *s) {
  hir__emit(w, "Stream ");
  if (s->index)
    hir__print_val(w, s->index);
  else
    hir__emit(w, "%d", s->name);
}

/* size=: the product of the extents holding data, left-nested; 1s dropped. */
static void hir__print_alloc_size(hir__writer *w, const hir_tv *tv) {
  const hir_val *ext[HIR_MAX_DIMS];
  int i, n = 0;
  for (i = 0; i < tv->ndims; i++) {
    const hir_val *x = tv->ids[i]->extent;
    if (tv->ids[i]->iter == HIR_REDUCTION || (x->kind == HIR__VAL_CONST && x->value == 1)) continue;
    ext[n++] = x;
  }
  if (!n) {
    hir__emit(w, "1");
    return;
  }
  for (i = 1; i < n; i++) hir__emit(w, "( ");
  hir__print_val(w, ext[0]);
  for (i = 1; i < n; i++) {
    hir__emit(w, " * ");
    hir__print_val(w, ext[i]);
    hir__emit(w, " )");
  }
}

static void hir__print_scope(hir__writer *w, const hir_scope *s, int ind);

/* A tensor op: "<out>" then, one level deeper, " = ...". */
static void hir__print_assign(hir__writer *w, const hir_tv *out, int ind) {
  hir__indent(w, ind);
  hir__print_tv(w, out);
  hir__emit(w, "\n");
  hir__indent(w, ind + 1);
}

static void hir__print_allocate(hir__writer *w, const hir_expr *e, int ind) {
  hir__indent(w, ind);
  hir__print_tv(w, e->in[0]);
  hir__emit(w, " = ALLOCATE(buffer=");
  hir__print_tv(w, e->in[0]);
  hir__emit(w, ", mem_type=%s, size=", e->in[0]->mem == HIR_MEM_GLOBAL ? "global" : "local");
  hir__print_alloc_size(w, e->in[0]);
  hir__emit(w, ", zero_init=false, resets_to_zero=false)\n");
}

static void hir__print_deallocate(hir__writer *w, const hir_expr *e, int ind) {
  hir__indent(w, ind);
  hir__emit(w, "Deallocate {\n");
  hir__indent(w, ind + 1);
  hir__print_tv(w, e->in[0]);
  hir__emit(w, "\n");
  hir__indent(w, ind);
  hir__emit(w, "}\n");
}

/* GetCurrentStream, SetCurrentStream, Synchronize. */
static void hir__print_stream_op(hir__writer *w, const hir_expr *e, int ind) {
  hir__indent(w, ind);
  hir__emit(w, "%s", e->kind == HIR_EXPR_GET_CURRENT_STREAM   ? "GetCurrentStream into "
                  : e->kind == HIR_EXPR_SET_CURRENT_STREAM ? "SetCurrentStream to "
                                                           : "Synchronize ");
  hir__print_stream(w, e->stream);
  hir__emit(w, "\n");
}

static void hir__print_for(hir__writer *w, const hir_expr *e, int ind) {
  hir__indent(w, ind);
  hir__emit(w, "FOR ");
  hir__print_val(w, e->val);
  hir__emit(w, " in ");
  hir__print_id(w, e->id);
  hir__emit(w, ":\n");
  hir__print_scope(w, &e->body, ind + 1);
}

static void hir__print_if(hir__writer *w, const hir_expr *e, int ind) {
  hir__indent(w, ind);
  hir__emit(w, "IF Manual ");
  hir__print_val(w, e->val);
  hir__emit(w, ":\n");
  hir__print_scope(w, &e->body, ind + 1);
  if (e->orelse.exprs.n) {
    hir__indent(w, ind);
    hir__emit(w, "ELSE:\n");
    hir__print_scope(w, &e->orelse, ind + 1);
  }
}

static void hir__print_post(hir__writer *w, const hir_expr *e, int ind) {
  int i;
  hir__indent(w, ind);
  hir__emit(w, "PostOnStream (HostUnit%d, Inputs:{", e->unit->name);
  for (i = 0; i < e->nin; i++) {
    hir__print_tv(w, e->in[i]);
    hir__emit(w, ", ");
  }
  hir__emit(w, "}, Outputs:{");
  for (i = 0; i < e->nout; i++) {
    hir__print_tv(w, e->out[i]);
    hir__emit(w, ", ");
  }
  hir__emit(w, "})\n");
}

static void hir__print_communication(hir__writer *w, const hir_expr *e, int ind) {
  int i;
  hir__indent(w, ind);
  hir__emit(w, "Communication %d (type=%s, team=(", e->name, hir__collective_names[e->sub]);
  for (i = 0; i < e->team_size; i++) hir__emit(w, i ? " %d" : "%d", e->team[i]);
  hir__emit(w, ")");
  if (hir__collective_has_root(e->sub)) hir__emit(w, ", root=%d", e->root);
  if (e->nin) {
    hir__emit(w, ", input=");
    hir__print_tv(w, e->in[0]);
  }
  if (e->nout) {
    hir__emit(w, ", output=");
    hir__print_tv(w, e->out[0]);
  }
  hir__emit(w, ", backend=NCCL)\n");
}

/* nvFuser's form: CollectivePermute 3 (team=(0 1), send_peer=..., recv_peer=..., input=..., output=..., backend=NCCL) */
static void hir__print_permute(hir__writer *w, const hir_expr *e, int ind) {
  int i;
  hir__indent(w, ind);
  hir__emit(w, "CollectivePermute %d (team=(", e->name);
  for (i = 0; i < e->team_size; i++) hir__emit(w, i ? " %d" : "%d", e->team[i]);
  hir__emit(w, "), send_peer=");
  hir__print_val(w, e->val);
  hir__emit(w, ", recv_peer=");
  hir__print_val(w, e->recv_peer);
  hir__emit(w, ", input=");
  hir__print_tv(w, e->in[0]);
  hir__emit(w, ", output=");
  hir__print_tv(w, e->out[0]);
  hir__emit(w, ", backend=NCCL)\n");
}

static void hir__print_moe(hir__writer *w, const hir_expr *e, int ind) {
  static const char *const ins[2][4] = {{"x", "topk_idx", "topk_weights", ""}, {"x", "src_idx", "n_tokens_to_rank", "n_tokens_from_rank"}};
  static const char *const outs[6] = {"recv_x", "recv_topk_idx", "recv_topk_weights", "recv_src_idx", "n_tokens_to_rank",
                                      "n_tokens_from_rank"};
  int i, combine = e->kind == HIR_EXPR_MOE_COMBINE;
  hir__indent(w, ind);
  hir__emit(w, "%s %d (team=(", hir__ops[e->kind].name, e->name);
  for (i = 0; i < e->team_size; i++) hir__emit(w, i ? " %d" : "%d", e->team[i]);
  if (combine) hir__emit(w, "), num_tokens="), hir__print_val(w, e->val);
  else hir__emit(w, "), num_experts=%lld", (long long)e->params[0]);
  for (i = 0; i < e->nin; i++) hir__emit(w, ", %s=", ins[combine][i]), hir__print_tv(w, e->in[i]);
  for (i = 0; i < e->nout; i++) hir__emit(w, ", %s=", combine ? "combined_x" : outs[i]), hir__print_tv(w, e->out[i]);
  hir__emit(w, ")\n");
}

static void hir__print_p2p(hir__writer *w, const hir_expr *e, int ind) {
  hir__indent(w, ind);
  hir__emit(w, "P2PCommunication %d (type=%s, buffer=", e->name, e->sub == HIR_P2P_SEND ? "send" : "recv");
  hir__print_tv(w, e->in[0]);
  hir__emit(w, ", peer=");
  hir__print_val(w, e->val);
  hir__emit(w, ", backend=NCCL)\n");
}

/* HirAliasSelect, HirAliasSlice. */
static void hir__print_view(hir__writer *w, const hir_expr *e, int ind) {
  hir__print_assign(w, e->out[0], ind);
  hir__emit(w, " = %s( ", hir__ops[e->kind].name);
  hir__print_tv(w, e->in[0]);
  hir__emit(w, ", axis = ");
  hir__print_id(w, e->id);
  hir__emit(w, ", index = ");
  hir__print_val(w, e->val);
  if (e->kind == HIR_EXPR_ALIAS_SLICE) hir__emit(w, ", parts = %d", e->parts);
  hir__emit(w, " )\n");
}

static void hir__print_binary(hir__writer *w, const hir_expr *e, int ind) {
  hir__print_assign(w, e->out[0], ind);
  hir__emit(w, " = ");
  hir__print_tv(w, e->in[0]);
  hir__emit(w, "\n");
  hir__indent(w, ind + 1);
  hir__emit(w, " %s ", hir__binary_symbols[e->sub]);
  hir__print_tv(w, e->in[1]);
  hir__emit(w, ";\n");
}

/* nvFuser's spelling of a cast: __half2float, __float2bfloat, (double) ... */
static const char *const hir__cast_names[] = {"float", "double", "half", "bfloat", "e4m3", "e5m2", "int64_t"};
HIR__STATIC_ASSERT(cast_names, sizeof hir__cast_names / sizeof hir__cast_names[0] == HIR_DTYPE_COUNT);
static void hir__print_cast(hir__writer *w, hir_dtype from, hir_dtype to) {
  if ((from == HIR_F32 || from == HIR_F64 || from == HIR_I64) && (to == HIR_F32 || to == HIR_F64 || to == HIR_I64))
    hir__emit(w, "(%s)", hir__cast_names[to]);
  else
    hir__emit(w, "__%s2%s", hir__cast_names[from], hir__cast_names[to]);
}

static void hir__print_scalar(hir__writer *w, const hir_expr *e) {
  char num[40];
  if (e->val) {
    hir__print_val(w, e->val);
    return;
  }
  snprintf(num, sizeof num, "%.15g", e->scalar);
  if (strtod(num, NULL) != e->scalar) snprintf(num, sizeof num, "%.17g", e->scalar);
  hir__emit(w, "%s%s", num, strpbrk(num, ".e") ? "" : ".0");
}

/* nvFuser's UnaryOp ("relu(T0)", "sinf(T0)" where the output is float,
   "-T0", "__half2float(T0)"), or its BinaryOp with a scalar ("T0 + 2.5"). */
static void hir__print_unary_op(hir__writer *w, const hir_expr *e, int ind) {
  int op = e->sub;
  hir__print_assign(w, e->out[0], ind);
  hir__emit(w, " = ");
  if (hir__unary_has_scalar(op)) {
    int scalar_first = op == HIR_UNARY_SCALAR_SUB || op == HIR_UNARY_SCALAR_DIV || op == HIR_UNARY_SCALAR_LT;
    if (scalar_first) hir__print_scalar(w, e);
    else hir__print_tv(w, e->in[0]);
    hir__emit(w, "\n");
    hir__indent(w, ind + 1);
    hir__emit(w, " %s ", hir__unary_names[op]);
    if (scalar_first) hir__print_tv(w, e->in[0]);
    else hir__print_scalar(w, e);
    hir__emit(w, ";\n");
    return;
  }
  if (op == HIR_UNARY_NEG) { /* an inline op: "-T0" */
    hir__emit(w, "-");
    hir__print_tv(w, e->in[0]);
    hir__emit(w, ";\n");
    return;
  }
  if (op == HIR_UNARY_CAST) {
    hir__print_cast(w, e->in[0]->dtype, e->out[0]->dtype);
  } else {
    hir__emit(w, "%s%s", hir__unary_names[op], hir__unary_float_suffix[op] && e->out[0]->dtype == HIR_F32 ? "f" : "");
  }
  hir__emit(w, "(");
  hir__print_tv(w, e->in[0]);
  hir__emit(w, ");\n");
}

/* nvFuser's SelectOp, SliceOp (a range per axis) and ViewOp. */
static void hir__print_view_op(hir__writer *w, const hir_expr *e, int ind) {
  hir_id *ids[HIR_MAX_DIMS];
  int i;
  hir__print_assign(w, e->out[0], ind);
  if (e->kind == HIR_EXPR_RESHAPE) {
    hir__emit(w, " = view( ");
    hir__print_tv(w, e->in[0]);
    hir__emit(w, " )\n");
    return;
  }
  hir__emit(w, " = %s( ", e->kind == HIR_EXPR_SELECT ? "select" : "slice");
  hir__print_tv(w, e->in[0]);
  if (e->kind == HIR_EXPR_SELECT) {
    hir__data_axes(e->in[0], ids);
    hir__emit(w, ", axis = ");
    hir__print_id(w, ids[e->axis]);
    hir__emit(w, ", index = %lld )\n", (long long)e->params[0]);
    return;
  }
  hir__emit(w, ", {");
  for (i = 0; i < hir__data_axes(e->in[0], ids); i++) {
    hir__emit(w, " {%lld, ", i == e->axis ? (long long)e->params[0] : 0LL);
    if (i == e->axis && e->params[1] != HIR_END) hir__emit(w, "%lld", (long long)e->params[1]);
    else hir__print_val(w, ids[i]->extent);
    hir__emit(w, ", %lld}", i == e->axis ? (long long)e->params[2] : 1LL);
  }
  hir__emit(w, " } )\n");
}

static void hir__print_broadcast(hir__writer *w, const hir_expr *e, int ind) {
  int i;
  hir__print_assign(w, e->out[0], ind);
  hir__emit(w, " = broadcast( ");
  hir__print_tv(w, e->in[0]);
  hir__emit(w, ", flags = {");
  for (i = 0; i < e->out[0]->ndims; i++) hir__emit(w, "%s%s", i ? ", " : "", (e->flags >> i) & 1u ? "true" : "false");
  hir__emit(w, "} )\n");
}

static void hir__print_matmul(hir__writer *w, const hir_expr *e, int ind) {
  int k;
  hir__print_assign(w, e->out[0], ind);
  hir__emit(w, e->flags & HIR__MATMUL_SCALED ? " = scaled_linear(" : e->flags & HIR__MATMUL_LINEAR ? " = linear(" : " = matmul(");
  hir__print_tv(w, e->in[0]);
  for (k = 1; k < e->nin; k++) {
    hir__emit(w, ",\n");
    hir__indent(w, ind + 1);
    hir__emit(w, "          ");
    hir__print_tv(w, e->in[k]);
  }
  if (e->flags & (HIR__MATMUL_NO_M | HIR__MATMUL_NO_N)) /* a chunk along M or N */
    hir__emit(w, ", without = %s%s", e->flags & HIR__MATMUL_NO_M ? "M" : "", e->flags & HIR__MATMUL_NO_N ? "N" : "");
  hir__emit(w, ")\n");
}

/* "<out>" newline " = <op>( <in>, <what> )": Set, reduction. */
static void hir__print_unary(hir__writer *w, const hir_expr *e, int ind, const char *op, const char *what) {
  hir__print_assign(w, e->out[0], ind);
  hir__emit(w, " = %s( ", op);
  hir__print_tv(w, e->in[0]);
  hir__emit(w, ", %s )\n", what);
}

static void hir__print_expr(hir__writer *w, const hir_expr *e, int ind) {
  switch (e->kind) {
  case HIR_EXPR_ALLOCATE: hir__print_allocate(w, e, ind); break;
  case HIR_EXPR_DEALLOCATE: hir__print_deallocate(w, e, ind); break;
  case HIR_EXPR_GET_CURRENT_STREAM:
  case HIR_EXPR_SET_CURRENT_STREAM:
  case HIR_EXPR_SYNCHRONIZE: hir__print_stream_op(w, e, ind); break;
  case HIR_EXPR_FOR_LOOP: hir__print_for(w, e, ind); break;
  case HIR_EXPR_IF_THEN_ELSE: hir__print_if(w, e, ind); break;
  case HIR_EXPR_POST_ON_STREAM: hir__print_post(w, e, ind); break;
  case HIR_EXPR_COMMUNICATION: hir__print_communication(w, e, ind); break;
  case HIR_EXPR_P2P_COMMUNICATION: hir__print_p2p(w, e, ind); break;
  case HIR_EXPR_COLLECTIVE_PERMUTE: hir__print_permute(w, e, ind); break;
  case HIR_EXPR_MOE_DISPATCH:
  case HIR_EXPR_MOE_COMBINE: hir__print_moe(w, e, ind); break;
  case HIR_EXPR_WAIT: hir__indent(w, ind), hir__emit(w, "Wait Communication %d\n", e->target->name); break;
  case HIR_EXPR_START_COALESCING: hir__indent(w, ind), hir__emit(w, "StartCoalescing\n"); break;
  case HIR_EXPR_END_COALESCING: hir__indent(w, ind), hir__emit(w, "EndCoalescing %d\n", e->name); break;
  case HIR_EXPR_ALIAS_SELECT:
  case HIR_EXPR_ALIAS_SLICE: hir__print_view(w, e, ind); break;
  case HIR_EXPR_LOAD_STORE:
    hir__print_unary(w, e, ind, e->flags & HIR__SET_PERMUTE ? "Set.Permute" : "Set", "cache_op=Streaming");
    break;
  case HIR_EXPR_BINARY: hir__print_binary(w, e, ind); break;
  case HIR_EXPR_UNARY: hir__print_unary_op(w, e, ind); break;
  case HIR_EXPR_RNG:
    hir__print_assign(w, e->out[0], ind);
    hir__emit(w, e->sub == HIR__RNG_IOTA ? " = iota_like( " : " = rand_like( ");
    hir__print_tv(w, e->in[0]);
    if (e->sub == HIR__RNG_IOTA) hir__emit(w, ", axis = %d );\n", e->axis);
    else hir__emit(w, ", seed = "), hir__print_val(w, e->val), hir__emit(w, " );\n");
    break;
  case HIR_EXPR_REDUCTION: hir__print_unary(w, e, ind, "reduction", "op = add, initial value = 0, allreduce = false"); break;
  case HIR_EXPR_MAX: hir__print_unary(w, e, ind, "reduction", "op = max, initial value = -inf, allreduce = false"); break;
  case HIR_EXPR_BROADCAST: hir__print_broadcast(w, e, ind); break;
  case HIR_EXPR_MATMUL: hir__print_matmul(w, e, ind); break;
  case HIR_EXPR_SELECT:
  case HIR_EXPR_SLICE:
  case HIR_EXPR_RESHAPE: hir__print_view_op(w, e, ind); break;
  case HIR_EXPR_KIND_COUNT: break;
  }
}

static void hir__print_scope(hir__writer *w, const hir_scope *s, int ind) {
  int i;
  for (i = 0; i < s->exprs.n; i++) hir__print_expr(w, (const hir_expr *)s->exprs.items[i], ind);
}

/* nvFuser's Fusion::print: inputs, outputs, then the exprs in a %kernel. */
static void hir__print_kernel(hir__writer *w, const hir__vec *ins, const hir__vec *outs, const hir__vec *exprs) {
  int i;
  hir__emit(w, "Inputs:\n");
  for (i = 0; i < ins->n; i++) {
    hir__emit(w, "  ");
    hir__print_tv(w, (const hir_tv *)ins->items[i]);
    hir__emit(w, "\n");
  }
  hir__emit(w, "Outputs:\n");
  for (i = 0; i < outs->n; i++) {
    hir__emit(w, "  ");
    hir__print_tv(w, (const hir_tv *)outs->items[i]);
    hir__emit(w, "\n");
  }
  hir__emit(w, "\n%%kernel {\n");
  for (i = 0; i < exprs->n; i++) hir__print_expr(w, (const hir_expr *)exprs->items[i], 0);
  hir__emit(w, "} // %%kernel\n");
}

static void hir__print_tv_list(hir__writer *w, const hir__vec *v, const char *sep, const char *last) {
  int i;
  for (i = 0; i < v->n; i++) {
    hir__print_tv(w, (const hir_tv *)v->items[i]);
    hir__emit(w, "%s", i + 1 < v->n ? sep : last);
  }
}

static void hir__print_program(hir__writer *w, const hir_program *p) {
  int i;
  hir__emit(w, "\n%%HostIrContainer { (");
  hir__print_tv_list(w, &p->ir.inputs, ", ", "");
  hir__emit(w, ") -> (");
  hir__print_tv_list(w, &p->ir.outputs, ", ", "");
  hir__emit(w, ") :\n");
  hir__print_scope(w, &p->top, 1);
  for (i = 0; i < p->units.n; i++) {
    const hir__host_unit *u = (const hir__host_unit *)p->units.items[i];
    hir__emit(w, "\nHostUnit%d: Inputs={", u->name);
    hir__print_tv_list(w, &u->ins, ", ", ", ");
    hir__emit(w, "} -> Outputs={");
    hir__print_tv_list(w, &u->outs, ", ", ", ");
    hir__emit(w, "}"); /* nvFuser starts the unit's fusion on this line */
    hir__print_kernel(w, &u->ins, &u->outs, &u->exprs);
  }
  hir__emit(w, "} // %%HostIrContainer\n\n");
}

HIRDEF hir_status hir_program_print(const hir_program *p, FILE *out) {
  hir__writer w = {NULL, NULL, 0, 0};
  if (!p || !out) return HIR_ERR_INVALID;
  w.fp = out;
  hir__print_program(&w, p);
  return ferror(out) ? HIR_ERR_INVALID : HIR_OK;
}

HIRDEF size_t hir_program_snprint(const hir_program *p, char *buf, size_t cap) {
  hir__writer w = hir__buffer_writer(buf, cap);
  if (p) hir__print_program(&w, p);
  return w.len;
}

HIRDEF hir_status hir_fusion_print(const hir_fusion *f, FILE *out) {
  hir__writer w = {NULL, NULL, 0, 0};
  if (!f || !out) return HIR_ERR_INVALID;
  w.fp = out;
  hir__print_kernel(&w, &f->inputs, &f->outputs, &f->exprs);
  return ferror(out) ? HIR_ERR_INVALID : HIR_OK;
}

HIRDEF size_t hir_fusion_snprint(const hir_fusion *f, char *buf, size_t cap) {
  hir__writer w = hir__buffer_writer(buf, cap);
  if (f) hir__print_kernel(&w, &f->inputs, &f->outputs, &f->exprs);
  return w.len;
}

HIRDEF size_t hir_tv_snprint(const hir_tv *tv, char *buf, size_t cap) {
  hir__writer w = hir__buffer_writer(buf, cap);
  if (tv) hir__print_tv(&w, tv);
  return w.len;
}

HIRDEF size_t hir_val_snprint(const hir_val *v, char *buf, size_t cap) {
  hir__writer w = hir__buffer_writer(buf, cap);
  if (v) hir__print_val(&w, v);
  return w.len;
}

static void hir__dot_tv(hir__writer *w, const hir_tv *tv, unsigned char *seen) {
  if (seen[tv->name]) return;
  seen[tv->name] = 1;
  hir__emit(w, "  t%d [shape=ellipse%s, label=\"", tv->name, tv->is_input || tv->is_output ? ", peripheries=2" : "");
  hir__print_tv(w, tv);
  hir__emit(w, "\"];\n");
}

static void hir__print_segmentation_dot(hir__writer *w, const hir_segmentation *s) {
  const hir_fusion *f = &s->p->ir;
  unsigned char *seen = (unsigned char *)HIR_MALLOC((size_t)f->next_tv + 1);
  int g, i, k;
  if (!seen) return;
  memset(seen, 0, (size_t)f->next_tv + 1);
  hir__emit(w, "digraph segmentation {\n  node [fontname=\"monospace\", fontsize=10];\n");
  for (g = 0; g < s->groups.n; g++) {
    const hir_group *grp = (const hir_group *)s->groups.items[g];
    hir__emit(w, "  subgraph cluster_%d {\n    label=\"group %d%s\";%s\n", g, g,
           grp->resharding ? " (resharding)" : grp->standalone ? " (host op)" : "",
           grp->resharding ? " style=filled; color=lightgrey;" : "");
    for (i = 0; i < grp->exprs.n; i++) {
      const hir_expr *e = (const hir_expr *)grp->exprs.items[i];
      hir__emit(w, "    e%d [shape=box, label=\"%s %d\"];\n", e->name, hir__ops[e->kind].name, e->name);
    }
    hir__emit(w, "  }\n");
  }
  for (g = 0; g < s->groups.n; g++) {
    const hir_group *grp = (const hir_group *)s->groups.items[g];
    for (i = 0; i < grp->exprs.n; i++) {
      const hir_expr *e = (const hir_expr *)grp->exprs.items[i];
      for (k = 0; k < e->nin; k++) {
        hir__dot_tv(w, e->in[k], seen);
        hir__emit(w, "  t%d -> e%d;\n", e->in[k]->name, e->name);
      }
      for (k = 0; k < e->nout; k++) {
        hir__dot_tv(w, e->out[k], seen);
        hir__emit(w, "  e%d -> t%d;\n", e->name, e->out[k]->name);
      }
    }
  }
  hir__emit(w, "}\n");
  HIR_FREE(seen);
}

HIRDEF hir_status hir_segmentation_print_dot(const hir_segmentation *s, FILE *out) {
  hir__writer w = {NULL, NULL, 0, 0};
  if (!s || !out || s->p->ir.status != HIR_OK) return HIR_ERR_INVALID;
  w.fp = out;
  hir__print_segmentation_dot(&w, s);
  return ferror(out) ? HIR_ERR_INVALID : HIR_OK;
}

HIRDEF size_t hir_segmentation_snprint_dot(const hir_segmentation *s, char *buf, size_t cap) {
  hir__writer w = hir__buffer_writer(buf, cap);
  if (s && s->p->ir.status == HIR_OK) hir__print_segmentation_dot(&w, s);
  return w.len;
}

// >>analysis
/* How a message names a tensor: "T3"; one the lowering made is named with
   the fusion tensor it was made from, the one the caller knows:
   "T10 [the lowering's, from T3]". */
typedef struct hir__tv_label {
  char text[64];
} hir__tv_label;

static hir__tv_label hir__label(const hir_tv *tv) {
  hir__tv_label l;
  const hir_fusion *f = tv->ir;
  const hir_tv *from = tv;
  int hops = 0;
  while (f->callers_tvs && from->name >= f->callers_tvs && hops++ < 64)
    if (from->made_from && from->made_from <= f->tvs.n) from = (const hir_tv *)f->tvs.items[from->made_from - 1];
    else if (from->definition && from->definition->nin && from->definition->in[0]) from = from->definition->in[0];
    else break;
  if (from == tv || from->name >= f->callers_tvs) snprintf(l.text, sizeof l.text, "T%d", tv->name);
  else snprintf(l.text, sizeof l.text, "T%d [the lowering's, from T%d]", tv->name, from->name);
  return l;
}

/* A matmul's axes as its operands' axis groups make them: na, nb, whether
   A has M and B has N, and the number of batch axes of the output. */
typedef struct hir__matmul_shape {
  int na, nb, has_m, has_n, nbatch;
} hir__matmul_shape;

static hir__matmul_shape hir__matmul_shape_of(const hir_expr *e) {
  hir__matmul_shape m;
  int first[HIR_MAX_DIMS + 1];
  m.na = hir__axis_groups(e->in[0], !e->ir->program, first);
  m.nb = hir__axis_groups(e->in[1], !e->ir->program, first);
  hir__matmul_roles(e, m.na, m.nb, &m.has_m, &m.has_n);
  m.nbatch = m.na - 1 - m.has_m > m.nb - 1 - m.has_n ? m.na - 1 - m.has_m : m.nb - 1 - m.has_n;
  return m;
}

/* The output axes of a matmul's M and N (their first parts), -1 where it has none. */
static void hir__matmul_out_axes(const hir_expr *e, int *m_axis, int *n_axis) {
  hir__matmul_shape m = hir__matmul_shape_of(e);
  int first[HIR_MAX_DIMS + 1];
  hir__axis_groups(e->out[0], !e->ir->program, first); /* a matmul's output: its data axes first */
  *m_axis = m.has_m ? first[m.nbatch] : -1;
  *n_axis = m.has_n ? first[m.nbatch + m.has_m] : -1;
}

/* hir__axis_map of a matmul, group by group: batch groups right-aligned, M
   and N kept, K onto the rK; a group's part j onto the output group's part
   j (a group split otherwise, a broadcast one, maps nowhere). */
static void hir__matmul_axis_map(const hir_expr *e, int k, int *map) {
  hir__matmul_shape m = hir__matmul_shape_of(e);
  const hir_tv *in = e->in[k], *out = e->out[0];
  int logical = !e->ir->program, gi[HIR_MAX_DIMS + 1], go[HIR_MAX_DIMS + 1], gmap[HIR_MAX_DIMS], d[HIR_MAX_DIMS];
  int od[HIR_MAX_DIMS], red[HIR_MAX_DIMS], n = 0, no = 0, nred = 0, i, j, g;
  int nbatch_k = k == 0 ? m.na - 1 - m.has_m : m.nb - 1 - m.has_n, rk = m.nbatch + m.has_m + m.has_n; /* k = 2: the bias */
  for (i = 0; i < in->ndims; i++)
    if (in->ids[i]->iter != HIR_REDUCTION) d[n++] = i;
  for (i = 0; i < out->ndims; i++) {
    if (out->ids[i]->iter != HIR_REDUCTION) od[no++] = i;
    else red[nred++] = i;
  }
  n = hir__axis_groups(in, logical, gi);
  hir__axis_groups(out, logical, go);
  for (g = 0; g < n; g++) gmap[g] = -1;
  if (k >= 2 && (e->flags & HIR__MATMUL_SCALED) && hir__scale_is_scalar(in)) return; /* one value: no axis of the output */
  if (k == 2 && (e->flags & HIR__MATMUL_SCALED)) { /* a's scale: a's axes but K */
    for (g = 0; g < n; g++) gmap[g] = g + m.nbatch - (m.na - 1 - m.has_m);
  } else {
    if (k == 3) k = 2; /* the weight's scale: as a bias, the weight's axes but K */
    for (g = 0; g < nbatch_k; g++) gmap[g] = g + m.nbatch - nbatch_k;
    if (k == 0) {
      if (m.has_m) gmap[m.na - 2] = m.nbatch;
      gmap[m.na - 1] = rk;
    } else if (k == 2) { /* the bias: B's batch axes (above), then N */
      if (m.has_n) gmap[n - 1] = m.nbatch + m.has_m;
    } else if ((e->flags & HIR__MATMUL_LINEAR) && m.has_n) { /* [.., N, K] */
      gmap[m.nb - 1] = rk;
      gmap[m.nb - 2] = m.nbatch + m.has_m;
    } else {
      gmap[nbatch_k] = rk;
      if (m.has_n) gmap[m.nb - 1] = m.nbatch + m.has_m;
    }
  }
  for (g = 0; g < n; g++) {
    int t = gmap[g], parts = gi[g + 1] - gi[g];
    if (t < 0) continue;
    if (t == rk) { /* K: its parts onto the output's reduction axes, in order */
      for (j = 0; j < parts && j < nred && (parts == nred || parts == 1); j++) map[d[gi[g] + j]] = red[j];
    } else if (parts == go[t + 1] - go[t]) {
      for (j = 0; j < parts; j++) map[d[gi[g] + j]] = od[go[t] + j];
    }
  }
}

/* Whether reshape e's output axis d has its input's data axis d's size:
   asked to be kept (0), or asked as the fixed size that axis has. */
static int hir__reshape_same_size(const hir_expr *e, int d) {
  hir_id *ids[HIR_MAX_DIMS];
  int n = hir__data_axes(e->in[0], ids);
  if (d >= n || d >= e->out[0]->ndims) return 0;
  return e->params[d] == 0 ||
         (e->params[d] > 0 && ids[d]->extent->kind == HIR__VAL_CONST && ids[d]->extent->value == e->params[d]);
}

/* Whether reshape e's output axis d is its input's data axis d: of its
   size, with every axis before it so too, or, where both have as many
   axes, every axis after it. A reshape reads in row-major order, so an
   axis kept among changed ones on both sides keeps only its size: [2, D,
   3] -> [3, D, 2] mixes the D rows. */
static int hir__reshape_keeps(const hir_expr *e, int d) {
  hir_id *ids[HIR_MAX_DIMS];
  int n = hir__data_axes(e->in[0], ids), nout = e->out[0]->ndims, i, before = 1, after = n == nout;
  if (!hir__reshape_same_size(e, d)) return 0;
  for (i = 0; i < d; i++) before &= hir__reshape_same_size(e, i);
  for (i = d + 1; i < nout; i++) after &= hir__reshape_same_size(e, i);
  return before || after;
}

/* Where a split of data axis d of reshape e's input or output goes on the
   other side: axis d where the reshape keeps it (any split), or where every
   axis before it keeps its size and d is reshaped, for an outer split (its
   parts are then whole blocks of the axis on both sides, in one row-major
   order; the factor must divide d's size on both, checked where fixed,
   else when run); -1 (*why said) elsewhere. */
static int hir__reshape_split_to(const hir_expr *e, int d, int outer, const char **why) {
  int i, before = 1;
  if (hir__reshape_keeps(e, d)) return d;
  for (i = 0; i < d; i++) before &= hir__reshape_same_size(e, i);
  if (!before)
    *why = "a reshape that changes an axis before it (a split passes a reshape's first changed axis, or an axis it keeps)";
  else if (d >= e->out[0]->ndims || d >= hir__data_index(e->in[0], e->in[0]->ndims))
    *why = "a reshape with fewer axes than that";
  else if (!outer)
    *why = "a reshape of that axis, which only an outer split (outer = 1) passes";
  else
    return d;
  return -1;
}

/* Where each axis of input k of an op lands in its output: map[i] is the
   output axis of input axis i, -1 when none (reduction axes, a selected axis).
   The one description of every op's axis mapping, read by propagation,
   resharding detection, decomposition and the communication planner. */
static void hir__axis_map(const hir_expr *e, int k, int *map) {
  const hir_tv *in = e->in[k];
  int i, d = 0, o = 0;
  for (i = 0; i < HIR_MAX_DIMS; i++) map[i] = -1;
  switch (e->kind) {
  case HIR_EXPR_LOAD_STORE:
    for (i = 0; i < in->ndims; i++)
      if (in->ids[i]->iter != HIR_REDUCTION) {
        if (!(e->flags & HIR__SET_PERMUTE)) map[i] = d;
        else
          for (o = 0; o < e->out[0]->ndims; o++)
            if (e->perm[o] == d) map[i] = o;
        d++;
      }
    break;
  case HIR_EXPR_BINARY:
  case HIR_EXPR_UNARY:
  case HIR_EXPR_RNG:
  case HIR_EXPR_REDUCTION:
  case HIR_EXPR_MAX:
    for (i = 0; i < in->ndims; i++)
      if (in->ids[i]->iter != HIR_REDUCTION) map[i] = d++;
    break;
  case HIR_EXPR_BROADCAST:
    for (i = 0; i < in->ndims; i++) {
      if (in->ids[i]->iter == HIR_REDUCTION) continue;
      while ((e->flags >> o) & 1u) o++;
      map[i] = o++;
    }
    break;
  case HIR_EXPR_MATMUL: hir__matmul_axis_map(e, k, map); break;
  case HIR_EXPR_SELECT: /* the selected axis goes; a sliced one is another axis; a reshape keeps the axes asked to */
  case HIR_EXPR_SLICE:
  case HIR_EXPR_RESHAPE:
    for (i = 0; i < in->ndims; i++) {
      if (in->ids[i]->iter == HIR_REDUCTION) continue;
      if (e->kind == HIR_EXPR_SELECT) map[i] = d == e->axis ? -1 : d - (d > e->axis);
      else if (e->kind == HIR_EXPR_SLICE) map[i] = d == e->axis ? -1 : d;
      else map[i] = hir__reshape_keeps(e, d) ? d : -1;
      d++;
    }
    break;
  case HIR_EXPR_ALIAS_SELECT:
    for (i = 0; i < in->ndims; i++) map[i] = i < e->axis ? i : i > e->axis ? i - 1 : -1;
    break;
  case HIR_EXPR_ALIAS_SLICE:
    for (i = 0; i < in->ndims; i++) map[i] = i;
    break;
  default: break;
  }
}


/* How many devices an axis of parallel type p is split across: a DIDx axis
   spans a row of the mesh (a 1-D mesh is one row), a DIDy axis a column; 0
   for a type that is no mesh axis. */
static int hir__shards(const hir_tv *tv, hir_ptype p) {
  if (p == HIR_DIDX) return tv->mesh_cols ? tv->mesh_cols : tv->mesh_size;
  if (p == HIR_DIDY) return tv->mesh_cols ? tv->mesh_size / tv->mesh_cols : 1;
  return 0;
}

/* The axis of parallel type p (DIDx, DIDy) among the axes holding data, or
   -1. A broadcast axis may be DIDx (as nvFuser allows): every device holds
   its one element, so the tensor is whole on each, not split. */
static int hir__did_axis(const hir_tv *tv, hir_ptype p) {
  int i;
  for (i = 0; i < tv->ndims; i++)
    if (tv->ids[i]->ptype == p && tv->ids[i]->iter == HIR_ITERATION) return i;
  return -1;
}

/* Axis id of tv is split across devices here: each holds one slice of it. */
static int hir__split_id(const hir_tv *tv, const hir_id *id) {
  return id->iter == HIR_ITERATION && hir__shards(tv, id->ptype) > 1;
}

static int hir__split_axis(const hir_tv *tv, int a) { return hir__split_id(tv, tv->ids[a]); }

/* The p axis where it splits tv across more than one device, else -1. */
static int hir__shard_axis(const hir_tv *tv, hir_ptype p) {
  int d = hir__did_axis(tv, p);
  return d >= 0 && hir__shards(tv, p) > 1 ? d : -1;
}

/* A tensor without a mesh lives wherever it is used. */
static int hir__same_mesh(const hir_tv *a, const hir_tv *b) {
  if (!a->mesh_size || !b->mesh_size) return 1;
  return a->mesh_size == b->mesh_size && a->mesh_cols == b->mesh_cols &&
         memcmp(a->mesh, b->mesh, (size_t)a->mesh_size * sizeof(int)) == 0;
}

/* The devices of tv's mesh that share `device`'s position on the other mesh
   axis than p's (its row for DIDx, its column for DIDy), in mesh order: the
   team of a collective along p. A 1-D mesh is one team, whoever asks. */
static int hir__mesh_team(const hir_tv *tv, hir_ptype p, int device, int *team) {
  int at = hir_team_index(tv->mesh, tv->mesh_size, device), cols = tv->mesh_cols, n = 0, i;
  if (!cols) {
    memcpy(team, tv->mesh, (size_t)tv->mesh_size * sizeof(int));
    return tv->mesh_size;
  }
  if (at < 0) return 0;
  if (p == HIR_DIDY)
    for (i = at % cols; i < tv->mesh_size; i += cols) team[n++] = tv->mesh[i];
  else
    for (i = at - at % cols; i < at - at % cols + cols; i++) team[n++] = tv->mesh[i];
  return n;
}

static int hir__in_mesh(const hir_tv *tv, int device) {
  return !tv->mesh_size || hir_team_index(tv->mesh, tv->mesh_size, device) >= 0;
}

/* Two meshes of the same devices, in any order. */
static int hir__same_devices(const hir_tv *a, const hir_tv *b) {
  int i;
  if (a->mesh_size != b->mesh_size) return 0;
  for (i = 0; i < a->mesh_size; i++)
    if (!hir__in_mesh(b, a->mesh[i])) return 0;
  return 1;
}

/* Does moving input k of e into e's output change how mesh axis p splits it? */
static int hir__input_reshards_on(const hir_expr *e, int k, hir_ptype p) {
  const hir_tv *in = e->in[k], *out = e->out[0];
  int map[HIR_MAX_DIMS], din = hir__shard_axis(in, p), dout = hir__shard_axis(out, p), i;
  hir__axis_map(e, k, map);
  if (din >= 0) return map[din] < 0 || map[din] != dout; /* < 0: an op that consumes the split axis (select, reshape) */
  if (dout >= 0) /* the output is split along an axis the input holds whole */
    for (i = 0; i < in->ndims; i++)
      if (map[i] == dout && in->ids[i]->iter == HIR_ITERATION) return 1;
  return 0;
}

/* Does moving input k of e into e's output change where its data lives? */
static int hir__input_reshards(const hir_expr *e, int k) {
  return !hir__same_mesh(e->in[k], e->out[0]) || hir__input_reshards_on(e, k, HIR_DIDX) || hir__input_reshards_on(e, k, HIR_DIDY);
}

/* Layout rule of the communication table: the moved axis must be outermost
   among the axes of local size > 1 (local size 1: DIDx, broadcast, extent 1). */
static int hir__outermost(const hir_tv *tv, int axis) {
  int i;
  for (i = 0; i < axis; i++) {
    const hir_id *id = tv->ids[i];
    if (id->iter == HIR_REDUCTION || id->iter == HIR_BROADCAST || hir__is_did(id->ptype)) continue;
    if (id->extent->kind == HIR__VAL_CONST && id->extent->value == 1) continue;
    return 0;
  }
  return 1;
}

/* The Stream axis of a tensor among its data axes, or -1. */
static int hir__stream_axis(const hir_tv *tv) {
  int i;
  for (i = 0; i < tv->ndims; i++)
    if (tv->ids[i]->ptype == HIR_STREAM) return tv->ids[i]->iter == HIR_REDUCTION ? -2 : i;
  return -1;
}

/* The output is split by mesh axis p along an axis no input maps onto (a
   reshape's new axis, a slice's): computed whole, then scattered. */
static int hir__output_reshards_on(const hir_expr *e, hir_ptype p) {
  int map[HIR_MAX_DIMS], dout = hir__shard_axis(e->out[0], p), k, i;
  if (dout < 0) return 0;
  for (k = 0; k < e->nin; k++) {
    hir__axis_map(e, k, map);
    for (i = 0; i < e->in[k]->ndims; i++)
      if (map[i] == dout) return 0;
  }
  return 1;
}

static int hir__output_reshards(const hir_expr *e) {
  return hir__output_reshards_on(e, HIR_DIDX) || hir__output_reshards_on(e, HIR_DIDY);
}

/* The mesh axis a resharding move moves data along: DIDy when only its DIDy
   axes change, else DIDx (a 1-D mesh's). *both: its DIDx and DIDy axes both
   change, which no one collective does. */
static hir_ptype hir__moving_ptype(const hir_expr *e, int *both) {
  int on[2] = {0, 0}, q, k;
  for (q = 0; q < 2; q++) {
    hir_ptype p = q ? HIR_DIDY : HIR_DIDX;
    on[q] = hir__output_reshards_on(e, p);
    for (k = 0; k < e->nin && !on[q]; k++) on[q] = hir__input_reshards_on(e, k, p);
  }
  if (both) *both = on[0] && on[1];
  return on[1] && !on[0] ? HIR_DIDY : HIR_DIDX;
}

HIRDEF int hir_expr_is_resharding(const hir_expr *e) {
  int k;
  if (!e || !(hir__ops[e->kind].flags & HIR__OP_COMPUTE) || e->nout != 1) return 0;
  for (k = 0; k < e->nin; k++)
    if (hir__input_reshards(e, k)) return 1;
  return hir__output_reshards(e);
}

/* The resharding patterns stream lowering makes point-to-point (>>pass_stream). */
enum { HIR__P2P_NONE, HIR__P2P_ALLGATHER, HIR__P2P_REDUCE_SCATTER };

/* Which P2P pattern e is, if any; *in_axis: the input axis that streams.
   On a 2-D mesh, along one mesh axis (the other's split unchanged): the
   exchanges run within each row (DIDx) or column (DIDy). */
static int hir__p2p_kind(const hir_expr *e, int *in_axis) {
  int map[HIR_MAX_DIMS], s, d, i, both;
  hir_ptype along;
  if (!(hir__ops[e->kind].flags & HIR__OP_MOVES)) return HIR__P2P_NONE;
  along = hir__moving_ptype(e, &both);
  if (both || (d = hir__shard_axis(e->in[0], along)) < 0 || !hir__same_devices(e->in[0], e->out[0])) return HIR__P2P_NONE;
  if ((e->in[0]->mesh_cols || e->out[0]->mesh_cols) && !hir__same_mesh(e->in[0], e->out[0])) return HIR__P2P_NONE;
  hir__axis_map(e, 0, map);
  /* an allgather leaves the output whole on every device: its mesh's order does not matter */
  if (e->kind == HIR_EXPR_LOAD_STORE && hir__shard_axis(e->out[0], along) < 0 && (s = hir__stream_axis(e->out[0])) >= 0 &&
      map[d] == s) {
    *in_axis = d;
    return HIR__P2P_ALLGATHER;
  }
  if (e->kind == HIR_EXPR_REDUCTION && hir__same_mesh(e->in[0], e->out[0]) && (s = hir__stream_axis(e->in[0])) >= 0 &&
      map[s] >= 0 && map[s] == hir__shard_axis(e->out[0], along) && e->out[0]->ids[map[d]]->iter == HIR_REDUCTION) {
    for (i = 0; i < e->in[0]->ndims; i++) /* only the split axis may be reduced */
      if (i != d && map[i] >= 0 && e->out[0]->ids[map[i]]->iter == HIR_REDUCTION && e->in[0]->ids[i]->iter != HIR_REDUCTION)
        return HIR__P2P_NONE;
    *in_axis = s;
    return HIR__P2P_REDUCE_SCATTER;
  }
  return HIR__P2P_NONE;
}

static int hir__expr_is_standalone(const hir_expr *e) {
  return (hir__ops[e->kind].flags & HIR__OP_STANDALONE) || hir_expr_is_resharding(e);
}

/* ---- hir_split: an axis made two, on every tensor it maps onto ---- */
typedef struct hir__split_site {
  hir_tv *tv;
  int axis; /* in tv->ids */
} hir__split_site;

/* Why e cannot carry a split of tv's axis (tv an operand of e), or NULL. A
   matmul's K or N passes (hir__positional_matmuls lowers it) where both
   operands have M and N; an fp8 one's only on batch axes and M. */
static const char *hir__split_blocked(const hir_expr *e, const hir_tv *tv, int axis) {
  int d = hir__data_index(tv, axis), k;
  if ((hir__ops[e->kind].flags & HIR__OP_CUTS_AXIS) && tv == e->in[0] && d == e->axis)
    return "the select or slice of that axis";
  if (e->kind == HIR_EXPR_MATMUL) {
    hir__matmul_shape m = hir__matmul_shape_of(e);
    int map[HIR_MAX_DIMS], m_axis, n_axis, kn;
    hir__matmul_out_axes(e, &m_axis, &n_axis);
    for (k = 0; k < e->nin && tv != e->in[k]; k++) {}
    if (k < e->nin) hir__axis_map(e, k, map);
    axis = k < e->nin ? map[axis] : axis; /* where it lands in the output: K's parts on its reduction axes */
    kn = axis >= 0 && (e->out[0]->ids[axis]->iter == HIR_REDUCTION || (n_axis >= 0 && axis >= n_axis));
    if (kn && (e->flags & HIR__MATMUL_SCALED)) return "an fp8 matmul's K or N axis";
    if (kn && (!m.has_m || !m.has_n)) return "the K or N axis of a matmul with a 1-D operand";
  }
  return NULL;
}

/* The sites a split of (tv, axis) reaches: every (tensor, axis) that maps
   onto it through an op, either way; 0 (error recorded) where one cannot. */
static int hir__split_sites(hir_fusion *f, hir_tv *tv, int axis, int outer, hir__split_site *sites, int *n, int cap) {
  int head = 0, i, k, j, map[HIR_MAX_DIMS];
  sites[0].tv = tv, sites[0].axis = axis, *n = 1;
  while (head < *n) {
    hir__split_site at = sites[head++];
    for (i = 0; i < f->exprs.n; i++) {
      const hir_expr *e = (const hir_expr *)f->exprs.items[i];
      for (k = 0; k < e->nin; k++) {
        hir__split_site next[HIR_MAX_DIMS];
        int nn = 0, s;
        const char *why = NULL;
        if (e->in[k] != at.tv && e->out[0] != at.tv) continue;
        if (e->kind == HIR_EXPR_RESHAPE && at.tv->ids[at.axis]->iter == HIR_REDUCTION) continue; /* not read */
        if (e->kind == HIR_EXPR_RESHAPE) { /* data axis d to the other side's d, or nowhere */
          hir_tv *other = e->in[0] == at.tv ? e->out[0] : e->in[0];
          int d = hir__reshape_split_to(e, hir__data_index(at.tv, at.axis), outer, &why);
          for (j = 0; d >= 0 && j < other->ndims; j++)
            if (other->ids[j]->iter != HIR_REDUCTION && hir__data_index(other, j) == d) next[nn].tv = other, next[nn++].axis = j;
        } else if (!(why = hir__split_blocked(e, at.tv, at.axis))) {
          hir__axis_map(e, k, map);
          if (e->in[k] == at.tv && map[at.axis] >= 0) next[nn].tv = e->out[0], next[nn++].axis = map[at.axis];
          if (e->out[0] == at.tv)
            for (j = 0; j < e->in[k]->ndims; j++)
              if (map[j] == at.axis) next[nn].tv = e->in[k], next[nn++].axis = j;
        }
        if (why) {
          hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_split: T%d axis %d maps onto %s (%s %d), which a split axis cannot pass; "
                    "split another axis, or keep this one whole", tv->name, hir__loop_place(tv, axis), why,
                    hir__ops[e->kind].name, e->name);
          return 0;
        }
        for (s = 0; s < nn; s++) { /* each site is checked against its own ops when its turn comes */
          int seen = 0, q;
          for (q = 0; q < *n; q++) seen |= sites[q].tv == next[s].tv && sites[q].axis == next[s].axis;
          if (seen) continue;
          if (*n == cap) {
            hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_split: T%d axis %d reaches more than %d tensors", tv->name,
                      hir__loop_place(tv, axis), cap);
            return 0;
          }
          sites[(*n)++] = next[s];
        }
      }
    }
  }
  return 1;
}

/* The ids one hir_split replaced (x became outer and inner), and the
   permutes it reaches, each output axis with the input axis it reads. */
typedef struct hir__split_log {
  hir_id *x[64], *outer[64], *inner[64];
  int n;
  struct {
    hir_expr *e;
    int n; /* its output's axes before the split */
    hir_id *out_id[HIR_MAX_DIMS], *in_id[HIR_MAX_DIMS];
  } permutes[64];
  int npermutes;
} hir__split_log;

/* Before the split: the permutes naming a site's tensor, and what each of
   their output axes reads. */
static int hir__log_permutes(hir_fusion *f, const hir__split_site *sites, int n, hir__split_log *log) {
  int i, k, o;
  for (i = 0; i < f->exprs.n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i];
    hir_id *data[HIR_MAX_DIMS];
    int reached = 0;
    if (e->kind != HIR_EXPR_LOAD_STORE || !(e->flags & HIR__SET_PERMUTE)) continue;
    for (k = 0; k < n; k++) reached |= sites[k].tv == e->in[0] || sites[k].tv == e->out[0];
    if (!reached) continue;
    if (log->npermutes == 64) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_split: the split reaches more than 64 permutes");
      return 0;
    }
    hir__data_axes(e->in[0], data);
    log->permutes[log->npermutes].e = e;
    log->permutes[log->npermutes].n = e->out[0]->ndims;
    for (o = 0; o < e->out[0]->ndims; o++) {
      log->permutes[log->npermutes].out_id[o] = e->out[0]->ids[o];
      log->permutes[log->npermutes].in_id[o] = data[e->perm[o]];
    }
    log->npermutes++;
  }
  return 1;
}

/* After the split: each permute's output axes read the input axes they
   read before, a split part the same part of its split input axis. */
static int hir__relink_permutes(hir_fusion *f, const hir__split_log *log) {
  int r, o, k, s, t, j;
  for (r = 0; r < log->npermutes; r++) {
    hir_expr *e = log->permutes[r].e;
    hir_id *data[HIR_MAX_DIMS];
    int nd = hir__data_axes(e->in[0], data), n = log->permutes[r].n;
    for (o = 0; o < e->out[0]->ndims; o++) {
      const hir_id *id = e->out[0]->ids[o], *src = NULL;
      for (k = 0; k < n && !src; k++)
        if (log->permutes[r].out_id[k] == id) src = log->permutes[r].in_id[k];
      for (s = 0; s < log->n && !src; s++) /* a part of a split output axis: that part of the input axis it read */
        for (k = 0; (log->outer[s] == id || log->inner[s] == id) && k < n; k++)
          for (t = 0; log->permutes[r].out_id[k] == log->x[s] && t < log->n; t++)
            if (log->x[t] == log->permutes[r].in_id[k]) src = log->outer[s] == id ? log->outer[t] : log->inner[t];
      for (j = 0; j < nd && data[j] != src; j++) {}
      if (j == nd) {
        hir__fail(f, HIR_ERR_INTERNAL, "hir_split: Set.Permute %d lost which input axis its output axis %d reads (a hostir "
                  "bug; please report it)", e->name, o);
        return 0;
      }
      e->perm[o] = (unsigned char)j;
    }
  }
  return 1;
}

/* Splits one site: its id becomes two (extents fv, the factor, and
   extent / factor, the one `rest` of the split's sites with that extent);
   the ops naming the tensor keep their meaning (a broadcast's flags, a
   select's axis). The sites of one split share these values: stream
   lowering chains the ops whose Stream axes share their extent's value,
   which tells mapped axes from others of the same size. */
static int hir__split_one(hir_fusion *f, hir_tv *tv, int axis, hir_val *fv, int outer, hir_val **rest_of, hir_val **rests,
                          int *nrests, hir__split_log *log) {
  hir_id *x = tv->ids[axis], *o, *in, *loop[HIR_MAX_DIMS];
  hir_val *rest = NULL;
  int i, d = hir__data_index(tv, axis), order[HIR_MAX_DIMS], place = 1;
  for (i = 0; i < *nrests && !rest; i++)
    if (rest_of[i] == x->extent) rest = rests[i];
  if (!rest) {
    rest = x->extent->kind == HIR__VAL_CONST ? hir__const(f, x->extent->value / fv->value)
                                             : hir__binary_val(f, HIR_SCALAR_DIV, x->extent, fv);
    rest_of[*nrests] = x->extent, rests[(*nrests)++] = rest;
  }
  if (!rest || !(o = hir__new_id(f, outer ? fv : rest, x->iter, HIR_SERIAL)) ||
      !(in = hir__new_id(f, outer ? rest : fv, x->iter, HIR_SERIAL)))
    return 0;
  if (!tv->nlogical) { /* the logical axes, kept for the user's tensors */
    for (i = 0; i < tv->ndims; i++) {
      tv->logical_of[i] = (unsigned char)hir__data_index(tv, i);
      if (tv->ids[i]->iter != HIR_REDUCTION) tv->logical_extent[tv->logical_of[i]] = tv->ids[i]->extent;
    }
    tv->nlogical = hir__data_index(tv, tv->ndims);
  }
  log->x[log->n] = x, log->outer[log->n] = o, log->inner[log->n++] = in;
  hir__loop_order(tv, order); /* before the ids move: a reordered tensor's two parts take x's loop place */
  for (i = 0; i < tv->ndims; i++) loop[i] = tv->ids[order[i]];
  for (i = tv->ndims; i > axis + 1; i--) tv->ids[i] = tv->ids[i - 1], tv->logical_of[i] = tv->logical_of[i - 1];
  tv->ids[axis] = o;
  tv->ids[axis + 1] = in;
  tv->logical_of[axis + 1] = tv->logical_of[axis];
  tv->ndims++;
  for (i = 0; x->loop_pos && i < tv->ndims - 1; i++) {
    if (loop[i] != x) loop[i]->loop_pos = place++;
    else o->loop_pos = place++, in->loop_pos = place++;
  }
  for (i = 0; i < f->exprs.n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i];
    if (e->kind == HIR_EXPR_BROADCAST && e->out[0] == tv) /* a 0 flag for the new axis */
      e->flags = (e->flags & ((1u << (axis + 1)) - 1u)) | ((e->flags >> (axis + 1)) << (axis + 2));
    if ((hir__ops[e->kind].flags & HIR__OP_CUTS_AXIS) && e->in[0] == tv && d < e->axis && x->iter != HIR_REDUCTION)
      e->axis++; /* its axis counts data axes: a reduction axis split adds none */
    if (e->kind == HIR_EXPR_RESHAPE && e->out[0] == tv) { /* the sizes asked: the two parts' (0 and -1 kept as such) */
      int64_t was = e->params[d], part = was > 0 ? was / fv->value : was;
      int j;
      for (j = tv->ndims - 1; j > d + 1; j--) e->params[j] = e->params[j - 1];
      e->params[d] = was == 0 ? 0 : outer ? fv->value : part;
      e->params[d + 1] = was == 0 ? 0 : outer ? part : fv->value;
    }
  }
  return 1;
}

HIRDEF hir_status hir_merge(hir_tv *tv, int axis) {
  hir_fusion *f;
  int a, b, head[HIR_MAX_DIMS], n, i;
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  n = hir__loop_heads(tv, head);
  if ((a = hir__loop_axis(f, tv, axis, "hir_merge")) < 0) return f->status;
  for (i = 0; i < n && head[i] != a; i++) {}
  if (i + 1 >= n || f->program) {
    hir__fail(f, HIR_ERR_INVALID, "hir_merge: T%d axis %d: %s", tv->name, i, f->program ? "merge a fusion's tensors, not a "
              "program's" : "the last loop axis has no next one to merge with");
    return f->status;
  }
  b = head[i + 1];
  for (i = 0; i < tv->ndims; i++)
    if (tv->ids[i]->loop_pos) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_merge: T%d is reordered (hir_reorder); merge before reordering", tv->name);
      return f->status;
    }
  for (i = a; ; i++) { /* the axes of both loop axes: iterations, not parallelized */
    const hir_id *id = tv->ids[i];
    if (id->iter == HIR_REDUCTION || id->ptype != HIR_SERIAL) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_merge: T%d axis %d: %s; merge plain axes, then parallelize (a DIDx or Stream on "
                "a merge is refused: split instead)", tv->name, hir__loop_place(tv, a), id->iter == HIR_REDUCTION ?
                "a reduction axis takes no merge" : "an axis already parallelized takes no merge");
      return f->status;
    }
    if (i >= b && !id->merged) break;
  }
  tv->ids[b - 1]->merged = hir__binary_val(f, HIR_SCALAR_MUL, hir_tv_extent(tv, hir__loop_place(tv, a)), hir_tv_extent(tv, hir__loop_place(tv, b)));
  if (a != b - 1) tv->ids[a]->merged = tv->ids[b - 1]->merged; /* the head's extent: the whole product */
  return tv->ids[b - 1]->merged ? HIR_OK : f->status;
}

HIRDEF hir_status hir_swizzle1d(hir_tv *tv, int axis, hir_ptype by) {
  hir_fusion *f;
  int a;
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  if ((a = hir__loop_axis(f, tv, axis, "hir_swizzle1d")) < 0) return f->status;
  if (by != HIR_DIDX || tv->mesh_cols || f->program || tv->ids[a]->merged ||
      (tv->ids[a]->ptype != HIR_SERIAL && tv->ids[a]->ptype != HIR_STREAM) || tv->ids[a]->iter != HIR_ITERATION) {
    hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_swizzle1d: T%d axis %d: %s", tv->name, hir__loop_place(tv, a),
              by != HIR_DIDX ? "swizzle by HIR_DIDX, the place along the mesh" : tv->ids[a]->merged ? "a merged axis takes no "
              "swizzle" : tv->mesh_cols ? "a 2-D mesh's place is not "
              "offered; swizzle on a 1-D mesh" : f->program ? "a program's "
              "tensors are laid out by hand (hir_host_alias_select with a swizzled index)" : "swizzle a plain axis, to be a Stream one");
    return f->status;
  }
  tv->ids[a]->swizzle = by;
  return HIR_OK;
}

HIRDEF hir_status hir_split(hir_tv *tv, int axis, int64_t factor, int outer) {
  hir__split_site sites[64];
  hir__split_log *log;
  hir_val *fv, *rest_of[64], *rests[64];
  hir_fusion *f;
  int a, n, i, j, nrests = 0;
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  if ((a = hir__loop_axis(f, tv, axis, "hir_split")) < 0) return f->status;
  if (tv->ids[a]->merged) {
    hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_split: T%d axis %d is a merge of axes (hir_merge); split one of them before merging",
              tv->name, hir__loop_place(tv, a));
    return f->status;
  }
  if (factor < 1 || tv->ids[a]->iter == HIR_BROADCAST || tv->ids[a]->ptype != HIR_SERIAL || f->program) {
    hir__fail(f, HIR_ERR_INVALID, "hir_split: T%d axis %d: %s", tv->name, hir__loop_place(tv, a),
              factor < 1 ? "the factor must be 1 or more" : tv->ids[a]->iter == HIR_BROADCAST ? "a broadcast axis has nothing to split"
              : f->program ? "split a fusion's tensors, not a program's" : "split first, then parallelize the parts");
    return f->status;
  }
  if (!hir__split_sites(f, tv, a, outer, sites, &n, (int)(sizeof sites / sizeof sites[0]))) return f->status;
  for (i = 0; i < n; i++) /* per tensor, its higher axes first: indices stay right */
    for (j = i + 1; j < n; j++)
      if (sites[j].tv == sites[i].tv && sites[j].axis > sites[i].axis) {
        hir__split_site t = sites[i];
        sites[i] = sites[j], sites[j] = t;
      }
  for (i = 0; i < n; i++) { /* every site checked before any is split: a refused split changes nothing */
    const hir_tv *t = sites[i].tv;
    int more = 0;
    for (j = 0; j < n; j++) more += sites[j].tv == t;
    const hir_val *x = t->ids[sites[i].axis]->extent;
    if (t->ndims + more > HIR_MAX_DIMS || t->ids[sites[i].axis]->ptype != HIR_SERIAL ||
        (x->kind == HIR__VAL_CONST && x->value % factor)) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_split: T%d axis %d reaches T%d axis %d, which %s", tv->name, hir__loop_place(tv, a),
                t->name, hir__loop_place(t, sites[i].axis),
                t->ids[sites[i].axis]->ptype != HIR_SERIAL ? "is parallelized; split first, then parallelize the parts"
                : t->ndims + more > HIR_MAX_DIMS ? "would have more than HIR_MAX_DIMS axes" : "has a fixed extent the factor does not divide");
      return f->status;
    }
  }
  if (!(log = (hir__split_log *)HIR_MALLOC(sizeof *log))) {
    hir__fail(f, HIR_ERR_NOMEM, "hir_split: out of memory");
    return f->status;
  }
  memset(log, 0, sizeof *log);
  if ((fv = hir__const(f, factor)) && hir__log_permutes(f, sites, n, log)) {
    for (i = 0; i < n && hir__split_one(f, sites[i].tv, sites[i].axis, fv, outer, rest_of, rests, &nrests, log); i++) {}
    if (i == n) hir__relink_permutes(f, log);
  }
  HIR_FREE(log);
  return f->status;
}

HIRDEF hir_status hir_reorder(hir_tv *tv, int n, const int *from, const int *to) {
  hir_fusion *f;
  int order[HIR_MAX_DIMS], placed[HIR_MAX_DIMS], taken[HIR_MAX_DIMS], k, p, a, next = 0;
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  for (k = 0; k < tv->ndims; k++)
    if (tv->ids[k]->merged) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_reorder: T%d has a merged axis (hir_merge); reorder before merging", tv->name);
      return f->status;
    }
  if (f->program || n < 1 || n > tv->ndims || !from || !to) {
    hir__fail(f, HIR_ERR_INVALID, "hir_reorder: T%d: %s", tv->name, f->program ? "reorder a fusion's tensors, not a program's"
              : !from || !to ? "from and to are NULL" : "give 1 to hir_tv_ndims(tv) pairs of positions");
    return f->status;
  }
  hir__loop_order(tv, order);
  for (p = 0; p < tv->ndims; p++) placed[p] = -1, taken[p] = 0;
  for (k = 0; k < n; k++) {
    int src = hir__norm_axis(f, from[k], tv->ndims, "hir_reorder", tv), dst;
    if (src < 0 || (dst = hir__norm_axis(f, to[k], tv->ndims, "hir_reorder", tv)) < 0) return f->status;
    if (taken[src] || placed[dst] >= 0) {
      hir__fail(f, HIR_ERR_INVALID, "hir_reorder: T%d: %s %d is named twice; each axis moves once, to a place of its own",
                tv->name, taken[src] ? "axis" : "place", taken[src] ? from[k] : to[k]);
      return f->status;
    }
    taken[src] = 1;
    placed[dst] = order[src];
  }
  for (a = 0; a < tv->ndims; a++) { /* the others, in their order, into the places left */
    if (taken[a]) continue;
    while (placed[next] >= 0) next++;
    placed[next] = order[a];
  }
  for (p = 0; p < tv->ndims; p++) tv->ids[placed[p]]->loop_pos = p + 1;
  return HIR_OK;
}

HIRDEF hir_status hir_set_allocation_loop(hir_tv *tv) {
  hir_fusion *f;
  int order[HIR_MAX_DIMS], seen[HIR_MAX_DIMS], p, l, n = 0, last = -1, last_id = -1, nlogical, moved = 0;
  unsigned char layout[HIR_MAX_DIMS];
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  if (f->program) {
    hir__fail(f, HIR_ERR_INVALID, "hir_set_allocation_loop: T%d: lay out a fusion's tensors, not a program's", tv->name);
    return f->status;
  }
  nlogical = tv->nlogical ? tv->nlogical : hir__data_index(tv, tv->ndims);
  memset(seen, 0, sizeof seen);
  hir__loop_order(tv, order);
  for (p = 0; p < tv->ndims; p++) {
    const hir_id *id = tv->ids[order[p]];
    if (id->iter == HIR_REDUCTION || hir__is_did(id->ptype)) continue; /* no data here; one element a device */
    l = tv->nlogical ? tv->logical_of[order[p]] : hir__data_index(tv, order[p]);
    if (l == last && order[p] > last_id) { /* the next part of the axis just placed */
      last_id = order[p];
      continue;
    }
    if (seen[l]) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_set_allocation_loop: T%d's loop order puts %s logical axis %d's parts; no "
                "strides give that layout: keep the parts of a split axis together, outer first (hir_reorder)", tv->name,
                l == last ? "the inner part first among" : "another axis between", l);
      return f->status;
    }
    seen[l] = 1;
    moved |= l != n;
    layout[n++] = (unsigned char)l;
    last = l, last_id = order[p];
  }
  for (l = 0; l < nlogical; l++) /* axes wholly sharded: one element here, anywhere */
    if (!seen[l]) moved |= l != n, layout[n++] = (unsigned char)l;
  memcpy(tv->alloc_order, layout, (size_t)n);
  tv->nalloc = moved ? n : 0;
  return HIR_OK;
}

/* Whether e writes the tensors it takes as inputs: an Allocate makes their
   buffers, a receive fills them. */
static int hir__writes_inputs(const hir_expr *e) {
  return e->kind == HIR_EXPR_ALLOCATE || (e->kind == HIR_EXPR_P2P_COMMUNICATION && e->sub == HIR_P2P_RECV);
}

/* Calls fn on every tensor an expr names (nested scopes not included). */
static void hir__expr_tvs(const hir_expr *e, void (*fn)(hir_tv *tv, int writes, void *ctx), void *ctx) {
  int i;
  for (i = 0; i < e->nin; i++)
    if (e->in[i]) fn(e->in[i], hir__writes_inputs(e), ctx);
  for (i = 0; i < e->nout; i++)
    if (e->out[i]) fn(e->out[i], 1, ctx);
}

// >>segment
/* Copies a fusion into a program's IR, names kept: the lowering works on the
   copy, so the fusion is only read (several threads may lower it at once). */
typedef struct hir__cloner {
  hir_fusion *dst;
  hir_val **vals;
  hir_id **ids;
  hir_tv **tvs;
} hir__cloner;

static hir_val *hir__clone_val(hir__cloner *c, const hir_val *v) {
  hir_val *n;
  if (!v) return NULL;
  if (v->kind == HIR__VAL_NAMED) return hir__named(c->dst, (hir_named_scalar)v->which);
  if (c->vals[v->name]) return c->vals[v->name];
  if (!(n = (hir_val *)hir__alloc(c->dst, sizeof(hir_val)))) return NULL;
  *n = *v;
  n->ir = c->dst;
  if (v->kind == HIR__VAL_BINARY && (!(n->lhs = hir__clone_val(c, v->lhs)) || !(n->rhs = hir__clone_val(c, v->rhs))))
    return NULL;
  if (v->kind == HIR__VAL_MESH_AT) {
    int *mesh = (int *)hir__alloc(c->dst, (size_t)v->mesh_size * sizeof(int));
    if (!mesh || !(n->lhs = hir__clone_val(c, v->lhs))) return NULL;
    memcpy(mesh, v->mesh, (size_t)v->mesh_size * sizeof(int));
    n->mesh = mesh;
  }
  return c->vals[v->name] = n;
}

static hir_tv *hir__clone_tv(hir__cloner *c, const hir_tv *tv) {
  hir_fusion *f = c->dst;
  hir_tv *n;
  int i;
  if (c->tvs[tv->name]) return c->tvs[tv->name];
  if (!(n = (hir_tv *)hir__alloc(f, sizeof(hir_tv)))) return NULL;
  *n = *tv;
  n->ir = f;
  n->definition = NULL;
  for (i = 0; i < tv->ndims; i++) {
    const hir_id *id = tv->ids[i];
    if (!(n->ids[i] = (hir_id *)hir__alloc(f, sizeof(hir_id)))) return NULL;
    *n->ids[i] = *id;
    if (!(n->ids[i]->extent = hir__clone_val(c, id->extent))) return NULL;
    if (id->merged && !(n->ids[i]->merged = hir__clone_val(c, id->merged))) return NULL;
  }
  for (i = 0; i < tv->nlogical; i++)
    if (!(n->logical_extent[i] = hir__clone_val(c, tv->logical_extent[i]))) return NULL;
  if (tv->scalar && !(n->scalar = hir__clone_val(c, tv->scalar))) return NULL;
  if (tv->mesh_size) {
    int *mesh = (int *)hir__alloc(f, (size_t)tv->mesh_size * sizeof(int));
    if (!mesh) return NULL;
    memcpy(mesh, tv->mesh, (size_t)tv->mesh_size * sizeof(int));
    n->mesh = mesh;
  }
  if (!hir__push(f, &f->tvs, n)) return NULL;
  return c->tvs[tv->name] = n;
}

static int hir__clone_fusion(hir_program *p, const hir_fusion *src) {
  hir_fusion *f = &p->ir;
  hir__cloner c;
  int i, k, ok = 0;
  c.dst = f;
  c.vals = (hir_val **)HIR_MALLOC(((size_t)src->next_val + 1) * sizeof(hir_val *));
  c.ids = NULL;
  c.tvs = (hir_tv **)HIR_MALLOC(((size_t)src->next_tv + 1) * sizeof(hir_tv *));
  if (!c.vals || !c.tvs) {
    hir__fail(f, HIR_ERR_NOMEM, "hir_lower: out of memory copying the fusion");
    goto done;
  }
  memset(c.vals, 0, ((size_t)src->next_val + 1) * sizeof(hir_val *));
  memset(c.tvs, 0, ((size_t)src->next_tv + 1) * sizeof(hir_tv *));
  f->next_tv = f->callers_tvs = src->next_tv;
  f->next_id = src->next_id;
  f->next_val = src->next_val;
  f->next_expr = src->next_expr;
  if ((src->zero && !(f->zero = hir__clone_val(&c, src->zero))) || (src->one && !(f->one = hir__clone_val(&c, src->one))))
    goto done;
  for (i = 0; i < src->tvs.n; i++)
    if (!hir__clone_tv(&c, (const hir_tv *)src->tvs.items[i])) goto done;
  for (i = 0; i < src->inputs.n; i++)
    if (!hir__push(f, &f->inputs, c.tvs[((const hir_tv *)src->inputs.items[i])->name])) goto done;
  for (i = 0; i < src->outputs.n; i++)
    if (!hir__push(f, &f->outputs, c.tvs[((const hir_tv *)src->outputs.items[i])->name])) goto done;
  for (i = 0; i < src->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)src->exprs.items[i];
    hir_expr *n = (hir_expr *)hir__alloc(f, sizeof(hir_expr));
    if (!n) goto done;
    *n = *e;
    n->ir = f;
    n->body.ir = n->orelse.ir = f;
    if (!(n->in = (hir_tv **)hir__alloc(f, (size_t)e->nin * sizeof(hir_tv *))) ||
        !(n->out = (hir_tv **)hir__alloc(f, (size_t)e->nout * sizeof(hir_tv *))))
      goto done;
    for (k = 0; k < e->nin; k++) n->in[k] = c.tvs[e->in[k]->name];
    for (k = 0; k < e->nout; k++) (n->out[k] = c.tvs[e->out[k]->name])->definition = n;
    if (!hir__push(f, &f->exprs, n)) goto done;
  }
  ok = 1;
done:
  HIR_FREE(c.vals);
  HIR_FREE(c.tvs);
  return ok;
}

/* 1. A tensor with no mesh inherits its producers' mesh, and their DIDx and
   DIDy axes mapped through the op. Stream axes are never propagated. */
static void hir__propagate_shardings(hir_program *p) {
  hir_fusion *f = &p->ir;
  int i, k, q;
  for (i = 0; i < f->exprs.n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i];
    hir_tv *out = e->out[0];
    if (out->mesh_size) continue;
    for (k = 0; k < e->nin && !out->mesh_size; k++)
      if (e->in[k]->mesh_size) hir__share_mesh(out, e->in[k]);
    for (q = 0; q < 2; q++) {
      hir_ptype pt = q ? HIR_DIDY : HIR_DIDX;
      if (hir__did_axis(out, pt) >= 0) continue;
      for (k = 0; k < e->nin; k++) {
        int map[HIR_MAX_DIMS], d = hir__did_axis(e->in[k], pt);
        if (d < 0) continue;
        hir__axis_map(e, k, map);
        if (map[d] >= 0 && out->ids[map[d]]->iter == HIR_ITERATION && out->ids[map[d]]->ptype == HIR_SERIAL) {
          out->ids[map[d]]->ptype = pt;
          break;
        }
      }
    }
  }
}

/* 1b. A program input's Stream axis: inputs arrive whole, so it passes to
   the axis it maps onto in each consumer that has no Stream axis (nvFuser's
   stream-parallel inputs), whose loop then reads the input chunk by chunk. */
static void hir__streams_from_inputs(hir_program *p) {
  hir_fusion *f = &p->ir;
  int i, j, k, map[HIR_MAX_DIMS];
  for (i = 0; i < f->inputs.n; i++) {
    hir_tv *tv = (hir_tv *)f->inputs.items[i];
    int s = hir__stream_axis(tv);
    if (s < 0) continue;
    for (j = 0; j < f->exprs.n; j++) {
      hir_expr *e = (hir_expr *)f->exprs.items[j];
      for (k = 0; k < e->nin; k++) {
        hir_id *o;
        if (e->in[k] != tv || hir__stream_axis(e->out[0]) != -1) continue;
        hir__axis_map(e, k, map);
        if (map[s] < 0) continue;
        o = e->out[0]->ids[map[s]];
        if (o->iter == HIR_ITERATION && o->ptype == HIR_SERIAL) o->ptype = HIR_STREAM, o->swizzle = tv->ids[s]->swizzle;
      }
    }
    tv->ids[s]->ptype = HIR_SERIAL;
  }
}

/* 1c. A Stream axis on a sum's reduced axis (nvFuser's RSMatmul): the sum's
   input is computed chunk by chunk along that axis, in the loop, and summed
   after it; the Stream axis moves to the input's axis. */
static void hir__streams_from_sums(hir_program *p) {
  hir_fusion *f = &p->ir;
  int i, j, map[HIR_MAX_DIMS];
  for (i = 0; i < f->exprs.n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i];
    hir_tv *in = e->in[0], *out = e->out[0];
    if (e->kind != HIR_EXPR_REDUCTION || hir__stream_axis(out) != -2 || in->is_input || hir__stream_axis(in) != -1) continue;
    hir__axis_map(e, 0, map);
    for (j = 0; j < in->ndims; j++)
      if (map[j] >= 0 && out->ids[map[j]]->ptype == HIR_STREAM && in->ids[j]->ptype == HIR_SERIAL) {
        in->ids[j]->ptype = HIR_STREAM, in->ids[j]->swizzle = out->ids[map[j]]->swizzle;
        out->ids[map[j]]->ptype = HIR_SERIAL;
      }
  }
}

/* Checks what the lowering needs of a fusion. */
static int hir__validate_fusion(hir_program *p) {
  hir_fusion *f = &p->ir;
  int i;
  if (!f->outputs.n) {
    hir__fail(f, HIR_ERR_INVALID, "hir_lower: the fusion has no outputs; mark them with hir_output");
    return 0;
  }
  for (i = 0; i < f->tvs.n; i++) {
    const hir_tv *tv = (const hir_tv *)f->tvs.items[i];
    int y = hir__did_axis(tv, HIR_DIDY);
    if ((hir__did_axis(tv, HIR_DIDX) >= 0 || y >= 0) && !tv->mesh_size) {
      hir__fail(f, HIR_ERR_INVALID, "hir_lower: T%d has a %s axis but no device mesh, and none to inherit; give it one with "
                "hir_set_mesh%s", tv->name, y >= 0 ? "DIDy" : "DIDx", y >= 0 ? "_2d" : "");
      return 0;
    }
    if (y >= 0 && !tv->mesh_cols) {
      hir__fail(f, HIR_ERR_INVALID, "hir_lower: T%d axis %d is DIDy, but T%d's mesh has one axis; DIDy splits down the "
                "columns of a 2-D mesh: give T%d one with hir_set_mesh_2d", tv->name, y, tv->name, tv->name);
      return 0;
    }
  }
  return 1;
}

/* A resharding sum that reduces more than the input's split axes (DIDx,
   DIDy): the other axes are summed first, locally, into a new tensor; e then
   sums the split axis alone (a collective), or, where it is not reduced,
   becomes a set that moves the local sums. Its output keeps the axes still
   reduced. NULL when e is not one. */
static hir_expr *hir__local_part_of_sum(hir_fusion *f, hir_expr *e) {
  hir_tv *in = e->in[0], *out = e->out[0], *part;
  hir_expr *local;
  hir_id *ids[HIR_MAX_DIMS];
  int map[HIR_MAX_DIMS], d, i, n, kept = 0, others = 0, split_reduced;
  if (e->kind != HIR_EXPR_REDUCTION || !hir_expr_is_resharding(e)) return NULL;
  d = hir__shard_axis(in, hir__moving_ptype(e, NULL));
  hir__axis_map(e, 0, map);
  split_reduced = d >= 0 && map[d] >= 0 && out->ids[map[d]]->iter == HIR_REDUCTION;
  for (i = 0; i < in->ndims; i++) others += !hir__split_axis(in, i) && map[i] >= 0 && out->ids[map[i]]->iter == HIR_REDUCTION;
  if (!others) return NULL;
  n = hir__data_axes(in, ids);
  if (!(part = hir__new_tv(f, in->dtype, HIR_MEM_GLOBAL, n)) || !(local = hir__new_expr(f, HIR_EXPR_REDUCTION, 1, 1)))
    return NULL;
  for (i = 0; i < n; i++) {
    int reduced = out->ids[i]->iter == HIR_REDUCTION && !hir__split_id(in, ids[i]);
    if (!(part->ids[i] = hir__clone_id(f, ids[i], hir__is_did(ids[i]->ptype)))) return NULL; /* local size 1 either way */
    if (reduced) part->ids[i]->iter = HIR_REDUCTION;
    else out->logical_of[kept] = out->logical_of[i], out->ids[kept++] = out->ids[i]; /* e's output loses the axes summed already */
  }
  out->ndims = kept;
  hir__share_mesh(part, in);
  local->in[0] = in;
  local->out[0] = part;
  part->definition = local;
  e->in[0] = part;
  if (!split_reduced) e->kind = HIR_EXPR_LOAD_STORE;
  return local;
}

/* A permute of `in` on its own mesh, its DIDx and DIDy axes carried along: no communication. */
static hir_expr *hir__local_permute(hir_fusion *f, hir_tv *in, const int *perm) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_expr *e = hir__permute_expr(f, in, perm);
  int i, n = hir__data_axes(in, ids);
  if (!e) return NULL;
  hir__share_mesh(e->out[0], in);
  for (i = 0; i < n; i++)
    if (hir__is_did(ids[perm[i]]->ptype)) e->out[0]->ids[i]->ptype = ids[perm[i]]->ptype;
  return e;
}

/* Whether the collective of resharding move e finds its chunks contiguous:
   the axis that gathers, scatters or exchanges is outermost among the axes
   holding data, on either side (docs/DESIGN.md section 3, the communications table). */
static int hir__chunks_contiguous(const hir_expr *e) {
  const hir_tv *in = e->in[0], *out = e->out[0];
  hir_ptype p = hir__moving_ptype(e, NULL);
  int map[HIR_MAX_DIMS], din = hir__shard_axis(in, p), dout = hir__shard_axis(out, p), i;
  int src = -1; /* the input axis that becomes the output's split axis */
  hir__axis_map(e, 0, map);
  for (i = 0; i < in->ndims; i++)
    if (dout >= 0 && map[i] == dout) src = i;
  if (e->kind == HIR_EXPR_REDUCTION) return dout < 0 || (src >= 0 && hir__outermost(in, src));
  if (din >= 0 && dout >= 0 && hir__same_mesh(in, out)) /* an all-to-all, or nothing to order */
    return map[din] == dout || (src >= 0 && hir__outermost(in, src) && map[din] >= 0 && hir__outermost(out, map[din]));
  if (din >= 0 && dout < 0) return hir__outermost(in, din);
  if (din < 0 && dout >= 0) return hir__outermost(out, dout);
  return 1;
}

/* A resharding move whose collective needs another order of axes than its
   tensors have (resharding on an inner axis, an all-to-all): the input is
   permuted first (*before), so that the axis becoming the DIDx axis, then
   the DIDx axis, lead; e moves that; the result is permuted back into e's
   output (*after), as nvFuser's ReorderShardedAxisPass does. A permuting
   set that reshards first permutes locally, then moves, under a Stream axis
   too (a chunk's collective cannot permute); the order for the collective
   is then left to the stream lowering. */
static int hir__order_for_collective(hir_fusion *f, hir_expr *e, hir_expr **before, hir_expr **after) {
  hir_tv *in = e->in[0], *out = e->out[0], *orig = in, *moved;
  hir_id *ids[HIR_MAX_DIMS];
  hir_expr *back;
  int map[HIR_MAX_DIMS], perm[HIR_MAX_DIMS], first[HIR_MAX_DIMS], inv[HIR_MAX_DIMS], tdata[HIR_MAX_DIMS];
  int din, dout, lead[2], nlead = 0, i, j, n, k = 0, kept = 0;
  if (e->kind == HIR_EXPR_LOAD_STORE && (e->flags & HIR__SET_PERMUTE)) {
    for (i = 0; i < HIR_MAX_DIMS; i++) first[i] = e->perm[i];
    if (!(*before = hir__local_permute(f, in, first))) return 0;
    e->in[0] = in = (*before)->out[0];
    e->flags &= ~(uint32_t)HIR__SET_PERMUTE;
  }
  if (hir__stream_axis(in) >= 0 || hir__stream_axis(out) >= 0 || hir__chunks_contiguous(e)) return 1;
  din = hir__shard_axis(in, hir__moving_ptype(e, NULL));
  dout = hir__shard_axis(out, hir__moving_ptype(e, NULL));
  n = hir__data_axes(in, ids);
  hir__axis_map(e, 0, map);
  for (i = 0; i < in->ndims; i++) { /* lead: the axis becoming the output's DIDx, then the input's DIDx (data numbering) */
    if (in->ids[i]->iter == HIR_REDUCTION) continue;
    if (dout >= 0 && map[i] == dout) lead[nlead++] = k;
    k++;
  }
  if (din >= 0) lead[nlead++] = hir__data_index(in, din);
  for (i = 0, k = 0; i < nlead; i++)
    if (!i || lead[i] != lead[0]) perm[k++] = lead[i];
  for (i = 0; i < n; i++) {
    for (j = 0; j < k && perm[j] != i; j++) {}
    if (j == k && k < n) perm[k++] = i;
  }
  if (*before) { /* one local permute: the set's own, then this order */
    int composed[HIR_MAX_DIMS];
    for (i = 0; i < n; i++) composed[i] = first[perm[i]];
    if (!(*before = hir__local_permute(f, orig, composed))) return 0;
  } else if (!(*before = hir__local_permute(f, in, perm))) {
    return 0;
  }
  /* e's output in the permuted order (its axes follow the input's data axes one to one) */
  if (!(moved = hir__new_tv(f, out->dtype, HIR_MEM_GLOBAL, n))) return 0;
  for (i = 0; i < n; i++) {
    if (!(moved->ids[i] = hir__clone_id(f, out->ids[perm[i]], 1))) return 0;
    moved->ids[i]->iter = out->ids[perm[i]]->iter;
    inv[perm[i]] = i;
  }
  for (i = 0, k = 0; i < n; i++) tdata[i] = moved->ids[i]->iter == HIR_REDUCTION ? -1 : k++;
  hir__share_mesh(moved, out);
  if (!(back = hir__new_expr(f, HIR_EXPR_LOAD_STORE, 1, 1))) return 0;
  for (i = 0; i < n; i++) /* out keeps its data axes (a set's output holds no reduction axes) */
    if (out->ids[i]->iter != HIR_REDUCTION) {
      back->perm[kept] = (unsigned char)tdata[inv[i]];
      if (back->perm[kept] != kept) back->flags |= HIR__SET_PERMUTE;
      out->logical_of[kept] = out->logical_of[i];
      out->ids[kept++] = out->ids[i];
    }
  out->ndims = kept;
  e->in[0] = (*before)->out[0];
  e->out[0] = moved;
  moved->definition = e;
  back->in[0] = moved;
  back->out[0] = out;
  out->definition = back;
  *after = back;
  return 1;
}

/* 2. A resharding expr other than set and sum: each offending input first
   moves with a resharding set into the consumer's sharding (DIDx and Stream
   axes taken from the consumer), then the op runs locally. A resharding sum
   over more than its DIDx axis sums the others locally first. */
static int hir__decompose_reshardings(hir_program *p) {
  hir_fusion *f = &p->ir;
  hir__vec exprs = {NULL, 0, 0};
  int i, k, j, at;
  for (i = 0; i < f->exprs.n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i], *local = hir__local_part_of_sum(f, e);
    if (f->status != HIR_OK || (local && !hir__push(f, &exprs, local))) return 0;
    if (!(hir__ops[e->kind].flags & HIR__OP_MOVES) && hir_expr_is_resharding(e)) {
      hir_tv *orig[HIR__MAX_OPERANDS] = {NULL, NULL, NULL, NULL};
      for (k = 0; k < e->nin; k++) {
        int map[HIR_MAX_DIMS], first[HIR_MAX_DIMS];
        hir_tv *in = orig[k] = e->in[k], *out = e->out[0], *moved;
        hir_expr *set;
        if (!hir__input_reshards(e, k)) continue;
        hir__axis_map(e, k, map);
        if (k == 1 && orig[0] == in && (hir__axis_map(e, 0, first), !memcmp(first, map, sizeof map))) {
          e->in[1] = e->in[0]; /* x op x: x moves once */
          continue;
        }
        if (!(set = hir__set_expr(f, in))) return 0;
        moved = set->out[0];
        hir__share_mesh(moved, out);
        for (j = 0, at = 0; j < in->ndims; j++) { /* `at`: j's position among the data axes */
          if (in->ids[j]->iter == HIR_REDUCTION) continue;
          if (map[j] >= 0 && out->ids[map[j]]->iter != HIR_REDUCTION &&
              !(moved->ids[at]->iter == HIR_BROADCAST && hir__is_did(out->ids[map[j]]->ptype))) /* no DIDx on a broadcast axis */
            moved->ids[at]->ptype = out->ids[map[j]]->ptype;
          if (moved->ids[at]->ptype == HIR_STREAM && moved->ids[at]->iter != HIR_BROADCAST) /* one loop with e (runs check */
            moved->ids[at]->extent = out->ids[map[j]]->extent;                              /* that in's size agrees) */
          at++;
        }
        e->in[k] = moved;
        if (!hir__push(f, &exprs, set)) return 0;
      }
      if (hir__output_reshards(e)) { /* computed whole into a new tensor, then moved by a set */
        hir_tv *out = e->out[0], *whole = hir__new_tv(f, out->dtype, HIR_MEM_GLOBAL, out->ndims);
        hir_expr *set = whole ? hir__new_expr(f, HIR_EXPR_LOAD_STORE, 1, 1) : NULL;
        if (!set) return 0;
        for (j = 0; j < out->ndims; j++)
          if (!(whole->ids[j] = hir__clone_id(f, out->ids[j], 0))) return 0;
        hir__share_mesh(whole, out);
        e->out[0] = whole;
        whole->definition = e;
        set->in[0] = whole;
        set->out[0] = out;
        out->definition = set;
        if (!hir__push(f, &exprs, e) || !hir__push(f, &exprs, set)) return 0;
        continue;
      }
    }
    if (!hir__push(f, &exprs, e)) return 0;
  }
  f->exprs = exprs;
  return 1;
}

/* 2a. A set that changes both its DIDx and its DIDy axes becomes two or
   three, one collective each: through a tensor split as `in` on one mesh
   axis and as `out` on the other (DIDy kept, DIDx taken, or the other way
   round); where both put two types on one axis, first through `in` without
   its DIDy axis (gathered down the columns). A sum over both its DIDx and
   its DIDy axes sums along the rows first, then down the columns; a sum
   over one whose output is split anew on the other sums first (its input's
   splits kept), then moves the sums. */
/* mid (a set of e's input) split as e's input on mesh axis `kept` and as
   e's output on `taken` (HIR_SERIAL: on none); 0 where both land on one axis. */
static int hir__mid_ptypes(const hir_expr *e, hir_tv *mid, hir_ptype kept, hir_ptype taken) {
  const hir_tv *in = e->in[0], *out = e->out[0];
  int map[HIR_MAX_DIMS], j, at;
  hir__axis_map(e, 0, map);
  for (j = 0, at = 0; j < in->ndims; j++) { /* `at`: j's position among the data axes */
    hir_ptype want = in->ids[j]->ptype == kept ? kept : HIR_SERIAL;
    if (in->ids[j]->iter == HIR_REDUCTION) continue;
    if (taken != HIR_SERIAL && map[j] >= 0 && out->ids[map[j]]->ptype == taken) {
      if (want != HIR_SERIAL) return 0;
      want = taken;
    }
    if (mid->ids[at]->iter == HIR_ITERATION) mid->ids[at]->ptype = want;
    at++;
  }
  return 1;
}

/* The first sum of a sum e that reshards on both mesh axes, into a new
   tensor split as e's input: of its DIDx axis where e sums both split axes
   (e then sums down the columns), else of every axis e sums (e then moves
   the sums: a set). e's output loses the axes summed first. */
static hir_expr *hir__sum_first(hir_fusion *f, hir_expr *e) {
  hir_tv *in = e->in[0], *out = e->out[0], *mid;
  hir_expr *first;
  hir_id *ids[HIR_MAX_DIMS];
  int map[HIR_MAX_DIMS], x = hir__shard_axis(in, HIR_DIDX), y = hir__shard_axis(in, HIR_DIDY), n, i, kept = 0, rows_first;
  hir__axis_map(e, 0, map);
  rows_first = x >= 0 && y >= 0 && map[x] >= 0 && map[y] >= 0 && out->ids[map[x]]->iter == HIR_REDUCTION &&
               out->ids[map[y]]->iter == HIR_REDUCTION;
  n = hir__data_axes(in, ids);
  if (!(mid = hir__new_tv(f, in->dtype, HIR_MEM_GLOBAL, n)) || !(first = hir__new_expr(f, HIR_EXPR_REDUCTION, 1, 1))) return NULL;
  for (i = 0; i < n; i++) {
    if (!(mid->ids[i] = hir__clone_id(f, ids[i], 1))) return NULL;
    if (rows_first ? ids[i] == in->ids[x] : out->ids[i]->iter == HIR_REDUCTION) mid->ids[i]->iter = HIR_REDUCTION;
    else out->logical_of[kept] = out->logical_of[i], out->ids[kept++] = out->ids[i];
  }
  if (!rows_first) e->kind = HIR_EXPR_LOAD_STORE;
  out->ndims = kept;
  hir__share_mesh(mid, in);
  first->in[0] = in;
  first->out[0] = mid;
  mid->definition = first;
  e->in[0] = mid;
  return first;
}

static int hir__one_mesh_axis_per_move(hir_program *p) {
  hir_fusion *f = &p->ir;
  hir__vec exprs = {NULL, 0, 0};
  int i, both, steps;
  for (i = 0; i < f->exprs.n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i], *first;
    if (e->kind == HIR_EXPR_REDUCTION && hir_expr_is_resharding(e) && (hir__moving_ptype(e, &both), both) &&
        !((first = hir__sum_first(f, e)) && hir__push(f, &exprs, first)))
      return 0;
    for (steps = 0; steps < 3 && e->kind == HIR_EXPR_LOAD_STORE && hir_expr_is_resharding(e) &&
                    hir__same_mesh(e->in[0], e->out[0]) && (hir__moving_ptype(e, &both), both) &&
                    hir__stream_axis(e->in[0]) == -1 && hir__stream_axis(e->out[0]) == -1;
         steps++) {
      hir_tv *mid;
      if (!(first = hir__set_expr(f, e->in[0]))) return 0;
      mid = first->out[0];
      hir__share_mesh(mid, e->out[0]);
      if (!hir__mid_ptypes(e, mid, HIR_DIDY, HIR_DIDX) && !hir__mid_ptypes(e, mid, HIR_DIDX, HIR_DIDY))
        hir__mid_ptypes(e, mid, HIR_DIDX, HIR_SERIAL);
      e->in[0] = mid;
      if (!hir__push(f, &exprs, first)) return 0;
    }
    if (!hir__push(f, &exprs, e)) return 0;
  }
  f->exprs = exprs;
  return 1;
}

/* 2b. Every resharding move, its axes ordered as its collective needs
   (hir__order_for_collective); run again once Stream axes are stripped. */
static int hir__order_moves(hir_program *p) {
  hir_fusion *f = &p->ir;
  hir__vec exprs = f->exprs;
  int i;
  memset(&f->exprs, 0, sizeof f->exprs);
  for (i = 0; i < exprs.n; i++) {
    hir_expr *e = (hir_expr *)exprs.items[i], *before = NULL, *after = NULL;
    if ((hir__ops[e->kind].flags & HIR__OP_MOVES) && hir_expr_is_resharding(e) && !hir__order_for_collective(f, e, &before, &after))
      return 0;
    if ((before && !hir__push(f, &f->exprs, before)) || !hir__push(f, &f->exprs, e) || (after && !hir__push(f, &f->exprs, after)))
      return 0;
  }
  return 1;
}

HIRDEF int hir_group_nexprs(const hir_group *g) { return g ? g->exprs.n : 0; }
HIRDEF const hir_expr *hir_group_expr(const hir_group *g, int i) {
  return (g && i >= 0 && i < g->exprs.n) ? (const hir_expr *)g->exprs.items[i] : NULL;
}
HIRDEF int hir_group_is_standalone(const hir_group *g) { return g ? g->standalone : 0; }

static int hir__group_has_standalone(const hir_group *g) {
  int i;
  for (i = 0; i < g->exprs.n; i++)
    if (hir__expr_is_standalone((const hir_expr *)g->exprs.items[i])) return 1;
  return 0;
}

HIRDEF int hir_merge_default(const hir_group *a, const hir_group *b, void *user) {
  (void)user;
  return a && b && !hir__group_has_standalone(a) && !hir__group_has_standalone(b);
}

/* Marks, by tensor name, what the outputs need; dead exprs are not lowered. */
static unsigned char *hir__needed_exprs(hir_program *p) {
  hir_fusion *f = &p->ir;
  unsigned char *tv_needed = (unsigned char *)HIR_MALLOC((size_t)f->next_tv + 1);
  unsigned char *needed = (unsigned char *)HIR_MALLOC((size_t)f->exprs.n + 1);
  int i, k;
  if (!tv_needed || !needed) {
    HIR_FREE(tv_needed);
    HIR_FREE(needed);
    hir__fail(f, HIR_ERR_NOMEM, "hir_lower: out of memory");
    return NULL;
  }
  memset(tv_needed, 0, (size_t)f->next_tv + 1);
  for (i = 0; i < f->outputs.n; i++) tv_needed[((hir_tv *)f->outputs.items[i])->name] = 1;
  for (i = f->exprs.n - 1; i >= 0; i--) {
    const hir_expr *e = (const hir_expr *)f->exprs.items[i];
    needed[i] = tv_needed[e->out[0]->name];
    if (needed[i])
      for (k = 0; k < e->nin; k++) tv_needed[e->in[k]->name] = 1;
  }
  HIR_FREE(tv_needed);
  return needed;
}

/* 3. Segmentation, after ggml_backend_sched: walk the exprs in topological
   order and cut once wherever the predicate refuses to merge a group with its
   neighbour. Groups are runs of one topological order, which keeps the group
   graph acyclic. Resharding exprs stand alone whatever the predicate. */
static int hir__segment(hir_program *p, hir_merge_fn should_merge, void *user, hir__vec *groups) {
  hir_fusion *f = &p->ir;
  unsigned char *needed = hir__needed_exprs(p);
  hir_group *last = NULL;
  int i, ok = 0;
  if (!needed) return 0;
  if (!should_merge) should_merge = hir_merge_default;
  for (i = 0; i < f->exprs.n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i];
    hir_group *g;
    if (!needed[i]) continue;
    if (!(g = (hir_group *)hir__alloc(f, sizeof(hir_group))) || !hir__push(f, &g->exprs, e)) goto done;
    g->resharding = hir_expr_is_resharding(e);
    g->standalone = hir__expr_is_standalone(e);
    if (last && !last->resharding && !g->resharding && should_merge(last, g, user)) {
      if (!hir__push(f, &last->exprs, e)) goto done;
      last->standalone = 0;
      continue;
    }
    g->index = groups->n;
    if (!hir__push(f, groups, g)) goto done;
    last = g;
  }
  ok = 1;
done:
  HIR_FREE(needed);
  return ok;
}

/* The serial form of a fusion: its Stream axes made serial. */
static void hir__strip_streams(hir_fusion *ir) {
  int i, a;
  for (i = 0; i < ir->tvs.n; i++) {
    hir_tv *tv = (hir_tv *)ir->tvs.items[i];
    for (a = 0; a < tv->ndims; a++)
      if (tv->ids[a]->ptype == HIR_STREAM) tv->ids[a]->ptype = HIR_SERIAL;
  }
}

/* 2c. stream.gather_first: the ops that read a P2P allgather's output lose
   their Stream axes (they run whole, after the gather's loop); the set
   keeps its own. */
static void hir__gather_first(hir_program *p) {
  hir_fusion *f = &p->ir;
  int i, j, k, a, axis;
  for (i = 0; i < f->exprs.n; i++) {
    const hir_expr *set = (const hir_expr *)f->exprs.items[i];
    if (hir__p2p_kind(set, &axis) != HIR__P2P_ALLGATHER) continue;
    for (j = 0; j < f->exprs.n; j++) {
      hir_expr *e = (hir_expr *)f->exprs.items[j];
      int reads = 0;
      for (k = 0; k < e->nin; k++) reads |= e->in[k] == set->out[0];
      if (!reads || (hir__ops[e->kind].flags & HIR__OP_MOVES)) continue;
      for (k = 0; k < e->nout; k++)
        for (a = 0; e->out[k] && a < e->out[k]->ndims; a++)
          if (e->out[k]->ids[a]->ptype == HIR_STREAM) e->out[k]->ids[a]->ptype = HIR_SERIAL;
    }
  }
}

/* 0. A fusion's matmul reads its operands' logical axes (hir__axis_groups),
   which hir_split may have made several; the evaluator's are positional
   ([batch..., M, K] x [batch..., K, N]). A matmul whose split parts the
   positions would misread becomes positional ops, in place:
     A' = A permuted, [K parts but the last, 1 for N's, batch parts, M parts, K]
     B' = B permuted, [K parts but the last, N parts but the last, batch, 1 for M's, K, N]
     P  = A' x B' (a linear's bias, without K split, goes in with B's layout)
     out = P summed over K's outer parts, permuted to out's order, plus the bias
   (1: an axis broadcast in). So a K split with DIDx on its outer part is a
   sum over the devices (an Allreduce, or a ReduceScatter where out is split
   on another axis) of local products, and an N split local products that
   land in place: the forms nvFuser's sharding propagation makes. */
typedef struct hir__slot {
  int role; /* 0: K, 1: N, 2: batch, 3: M */
  int group, part;
} hir__slot;

/* x's data axis for slot s (its groups gx, nbatch_x batch groups, the
   output's nbatch), or -1: an axis to broadcast in. */
static int hir__slot_axis(const hir__slot *s, const int *gx, int nx, int nbatch_x, int nbatch, int has_k, int m_group, int n_group,
                          const int *out_parts) {
  int g, parts;
  if (s->role == 2) {
    g = s->group - (nbatch - nbatch_x);
    if (g < 0) return -1;
    parts = gx[g + 1] - gx[g];
    if (parts == out_parts[s->group]) return gx[g] + s->part;
    return parts == 1 && s->part == out_parts[s->group] - 1 ? gx[g] : -1; /* a broadcast axis, at the last part */
  }
  g = s->role == 0 ? (has_k ? nx - 1 : -1) : s->role == 3 ? m_group : n_group;
  return g < 0 ? -1 : gx[g] + s->part;
}

/* x permuted and broadcast so that its data axes are take[]'s (-1: a
   broadcast axis), then tail[]'s. */
static hir_tv *hir__to_slots(hir_fusion *f, hir_tv *x, int nslots, const int *take, const int *tail, int ntail) {
  int perm[HIR_MAX_DIMS], flags[HIR_MAX_DIMS], n = 0, i, identity = 1;
  for (i = 0; i < nslots; i++) {
    flags[i] = take[i] < 0;
    if (take[i] >= 0) perm[n++] = take[i];
  }
  for (i = 0; i < ntail; i++) flags[nslots + i] = 0, perm[n++] = tail[i];
  for (i = 0; i < n; i++) identity &= perm[i] == i;
  if (!identity && !(x = hir_permute(f, x, perm))) return NULL;
  if (n == nslots + ntail) return x;
  return hir_broadcast(f, x, nslots + ntail, flags);
}

/* The parallel types of P (its data axes [K's outer parts, the slots...,
   M's last, N's last]; A's and B's axes take_a[] and take_b[], out's data
   axis i P's perm[i] + kp - 1): where K is whole, out's (P then split as
   out is; the lowering moves the operands to it, an Allgather or its
   pipeline on a Stream axis), else B's (a weight stays where it is and A
   moves to it: tensor parallelism's choice); and a Stream axis of A, B or
   out, or of out's K parts (a sum over chunks), wherever P's axis is
   serial. Where K is split its DIDx part comes by propagation. */
static void hir__positional_ptypes(const hir_expr *e, hir_tv *p, const hir_tv *a, const hir_tv *b, const int *take_a,
                                   const int *take_b, const int *perm, int kp) {
  hir_id *pd[HIR_MAX_DIMS], *ad[HIR_MAX_DIMS], *bd[HIR_MAX_DIMS], *od[HIR_MAX_DIMS], *from[HIR_MAX_DIMS] = {NULL};
  const hir_tv *out = e->out[0];
  int np = hir__data_axes(p, pd), no = hir__data_axes(out, od), i, j, q, r = 0;
  hir__data_axes(a, ad);
  hir__data_axes(b, bd);
  for (i = 0; i < no; i++) from[perm[i] + kp - 1] = od[i];
  for (i = 0; i < out->ndims && r < kp - 1; i++) /* out's K parts, but the last */
    if (out->ids[i]->iter == HIR_REDUCTION) from[r++] = out->ids[i];
  for (i = 0; i < np; i++) {
    const hir_id *src[3];
    src[0] = from[i], src[1] = take_a[i] >= 0 ? ad[take_a[i]] : NULL;
    src[2] = take_b[i] >= 0 ? bd[take_b[i]] : NULL;
    if (pd[i]->iter != HIR_ITERATION) continue;
    if (kp == 1 && from[i] && from[i]->ptype != HIR_SERIAL && from[i]->iter == HIR_ITERATION) {
      pd[i]->ptype = from[i]->ptype;
      continue;
    }
    for (j = 0; j < 3 && pd[i]->ptype == HIR_SERIAL; j++)
      if (src[j] && src[j]->ptype == HIR_STREAM) pd[i]->ptype = HIR_STREAM;
  }
  for (q = 0; q < 2 && kp == 1; q++) { /* where out says nothing: B's split (the weight stays; A moves to it) */
    hir_ptype pt = q ? HIR_DIDY : HIR_DIDX;
    for (i = 0; i < np && pd[i]->ptype != pt; i++) {}
    for (j = 0; j < np && i == np; j++)
      if (take_b[j] >= 0 && bd[take_b[j]]->ptype == pt && bd[take_b[j]]->iter == HIR_ITERATION && pd[j]->ptype == HIR_SERIAL &&
          pd[j]->iter == HIR_ITERATION)
        pd[j]->ptype = pt, i = j;
  }
}

static int hir__positional_matmul(hir_fusion *f, hir_expr *e) {
  hir_tv *a = e->in[0], *b = e->in[1], *bias = e->nin == 3 ? e->in[2] : NULL, *out = e->out[0], *cur, *bias_in = NULL;
  hir_id *ids[HIR_MAX_DIMS], *data[HIR_MAX_DIMS];
  hir__slot slots[HIR_MAX_DIMS];
  int ga[HIR_MAX_DIMS + 1], gb[HIR_MAX_DIMS + 1], gc[HIR_MAX_DIMS + 1], go[HIR_MAX_DIMS + 1], out_parts[HIR_MAX_DIMS];
  int take[HIR_MAX_DIMS], take_a[HIR_MAX_DIMS + 2], take_b[HIR_MAX_DIMS + 2], tail[2], perm[HIR_MAX_DIMS], logical_of[HIR_MAX_DIMS];
  hir_tv *a_in = a, *b_in = b;
  int na, nb, nc = 0, no, has_m, has_n, nbatch_a, nbatch_b, nbatch, kp, np, mp, extra_a = 0, extra_b = 0, ns = 0, i, j, g, d, k;
  int linear = (e->flags & HIR__MATMUL_LINEAR) != 0, kb, nbg;
  if (e->flags & (HIR__MATMUL_SCALED | HIR__MATMUL_NO_M | HIR__MATMUL_NO_N)) return 1;
  na = hir__axis_groups(a, 1, ga);
  nb = hir__axis_groups(b, 1, gb);
  no = hir__axis_groups(out, 1, go);
  if (bias) nc = hir__axis_groups(bias, 1, gc);
  hir__matmul_roles(e, na, nb, &has_m, &has_n);
  if (!has_m || !has_n) return 1;
  nbatch_a = na - 2, nbatch_b = nb - 2, nbatch = no - 2;
  kb = linear ? nb - 1 : nb - 2, nbg = linear ? nb - 2 : nb - 1; /* B's K and N groups */
  kp = ga[na] - ga[na - 1], np = gb[nbg + 1] - gb[nbg], mp = ga[na - 1] - ga[na - 2];
  for (g = 0; g < na - 1; g++) extra_a += ga[g + 1] - ga[g] - 1; /* batch and M parts past one a group */
  for (g = 0; g < nbatch_b; g++) extra_b += gb[g + 1] - gb[g] - 1;
  if (kp == 1 && np == 1 && !(extra_a && nbatch_b) && !(extra_b && (nbatch_a || mp > 1))) return 1; /* positions read right */
  for (g = 0; g < no; g++) out_parts[g] = go[g + 1] - go[g];
  /* the slots and the two last parts fit HIR_MAX_DIMS: out holds every part of batch, M, N and K (hir_split keeps it so) */
  for (j = 0; j < kp - 1; j++) slots[ns].role = 0, slots[ns].group = 0, slots[ns++].part = j;
  for (j = 0; j < np - 1; j++) slots[ns].role = 1, slots[ns].group = 0, slots[ns++].part = j;
  for (g = 0; g < nbatch; g++)
    for (j = 0; j < out_parts[g]; j++) slots[ns].role = 2, slots[ns].group = g, slots[ns++].part = j;
  for (j = 0; j < mp - 1; j++) slots[ns].role = 3, slots[ns].group = 0, slots[ns++].part = j;
  /* A' = [slots..., M's last part, K's last part] */
  for (i = 0; i < ns; i++)
    take_a[i] = slots[i].role == 1 ? -1 : hir__slot_axis(&slots[i], ga, na, nbatch_a, nbatch, 1, na - 2, -1, out_parts);
  tail[0] = take_a[ns] = ga[na - 1] - 1, tail[1] = ga[na] - 1, take_a[ns + 1] = -1;
  if (!(a = hir__to_slots(f, a, ns, take_a, tail, 2))) return 0;
  /* B' = [slots..., K's last part, N's last part] (a linear's: N, then K) */
  for (i = 0; i < ns; i++)
    take_b[i] = slots[i].role == 3 ? -1 : slots[i].role == 0 ? gb[kb] + slots[i].part
                : hir__slot_axis(&slots[i], gb, nb, nbatch_b, nbatch, 0, -1, nbg, out_parts);
  tail[linear] = gb[kb + 1] - 1, tail[!linear] = take_b[ns + 1] = gb[nbg + 1] - 1, take_b[ns] = -1;
  if (!(b = hir__to_slots(f, b, ns, take_b, tail, 2))) return 0;
  if (bias && kp == 1) { /* B's layout without K: [slots..., N's last part] */
    for (i = 0; i < ns; i++)
      take[i] = slots[i].role == 3 ? -1 : hir__slot_axis(&slots[i], gc, nc, nc - 1, nbatch, 0, -1, nc - 1, out_parts);
    tail[0] = gc[nc] - 1;
    if (!(bias_in = hir__to_slots(f, bias, ns, take, tail, 1))) return 0;
  }
  if (!(cur = linear ? hir_linear(f, a, b, bias_in) : hir_matmul(f, a, b))) return 0;
  { /* perm[i]: the axis of cur's [N's outer parts, batch, M, N's last] that is out's [batch, M, N] axis i */
    int rest = ns - (kp - 1) - (np - 1) + 1, n = 0; /* batch and M parts */
    for (j = 0; j < rest; j++) perm[n++] = np - 1 + j;
    for (j = 0; j < np; j++) perm[n++] = j < np - 1 ? j : np - 1 + rest;
  }
  hir__positional_ptypes(e, cur, a_in, b_in, take_a, take_b, perm, kp);
  for (k = 0; k < 2; k++) { /* an input read by this matmul alone: its Stream axis is P's now, and its permute a view */
    hir_tv *x = k ? b_in : a_in;
    int readers = 0;
    for (i = 0; i < f->exprs.n; i++)
      for (j = 0; j < ((hir_expr *)f->exprs.items[i])->nin; j++) readers += ((hir_expr *)f->exprs.items[i])->in[j] == x;
    for (i = 0; x->is_input && readers == 2 && x != (k ? b : a) && i < x->ndims; i++) /* e, and the permute or broadcast */
      if (x->ids[i]->ptype == HIR_STREAM) x->ids[i]->ptype = HIR_SERIAL;
  }
  if (kp > 1) { /* the sum over K's outer parts */
    int axes[HIR_MAX_DIMS];
    for (j = 0; j < kp - 1; j++) axes[j] = j;
    if (!(cur = hir_sum(f, cur, kp - 1, axes))) return 0;
  }
  if (np > 1 && !(cur = hir_permute(f, cur, perm))) return 0; /* to out's order */
  if (bias && kp > 1) { /* the bias after the sum, as nvFuser's DecomposeRowParallelLinearWithBias: out's layout */
    hir__slot oslots[HIR_MAX_DIMS];
    int nos = 0;
    for (g = 0; g < nbatch; g++)
      for (j = 0; j < out_parts[g]; j++) oslots[nos].role = 2, oslots[nos].group = g, oslots[nos++].part = j;
    for (j = 0; j < mp; j++) oslots[nos].role = 3, oslots[nos].group = 0, oslots[nos++].part = j;
    for (j = 0; j < np - 1; j++) oslots[nos].role = 1, oslots[nos].group = 0, oslots[nos++].part = j;
    for (i = 0; i < nos; i++)
      take[i] = oslots[i].role == 3 ? -1 : hir__slot_axis(&oslots[i], gc, nc, nc - 1, nbatch, 0, -1, nc - 1, out_parts);
    tail[0] = gc[nc] - 1;
    hir__data_axes(out, data);
    for (i = 0, j = hir__data_axes(cur, ids); i < j; i++) /* the sum split as out is (a ReduceScatter, the bias added to the parts) */
      if (hir__is_did(data[i]->ptype) && ids[i]->iter == HIR_ITERATION) ids[i]->ptype = data[i]->ptype;
    if (!(bias_in = hir__to_slots(f, bias, nos, take, tail, 1)) || !(cur = hir_add(f, cur, bias_in))) return 0;
  }
  /* out takes cur's place: its own data axes (the user's parallel types), cur's reduction axes */
  if (hir__data_axes(cur, ids) != (d = hir__data_axes(out, data))) {
    hir__fail(f, HIR_ERR_INTERNAL, "hir_lower: MatmulOp %d made positional has %d axes, T%d %d (a hostir bug; please report it)",
              e->name, hir__data_axes(cur, ids), out->name, d);
    return 0;
  }
  for (i = 0, j = 0; i < out->ndims; i++)
    if (out->ids[i]->iter != HIR_REDUCTION) logical_of[j] = out->nlogical ? out->logical_of[i] : j, j++;
  for (i = 0, j = 0; i < cur->ndims; i++) {
    int data_here = cur->ids[i]->iter != HIR_REDUCTION;
    out->logical_of[i] = (unsigned char)(data_here ? logical_of[j] : j);
    out->ids[i] = data_here ? data[j++] : cur->ids[i];
  }
  out->ndims = cur->ndims;
  for (i = 0, j = 0; i < out->ndims; i++) j = out->ids[i]->loop_pos > j ? out->ids[i]->loop_pos : j;
  for (i = 0; i < out->ndims; i++) /* a reordered out keeps its loop order, the new reduction axes last */
    if (out->ids[i]->iter == HIR_REDUCTION && j) out->ids[i]->loop_pos = ++j;
  cur->definition->out[0] = out;
  out->definition = cur->definition;
  for (i = 0; i < cur->ndims; i++) cur->ids[i]->ptype = HIR_SERIAL; /* replaced, read by none: no sharding to check */
  cur->definition = NULL;
  return 1;
}

/* hir__positional_matmul for every matmul, its ops in its place. */
static int hir__positional_matmuls(hir_program *p) {
  hir_fusion *f = &p->ir;
  hir__vec exprs = {NULL, 0, 0};
  int n = f->exprs.n, i, j;
  for (i = 0; i < n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i];
    int from = f->exprs.n;
    if (e->kind == HIR_EXPR_MATMUL && !hir__positional_matmul(f, e)) return 0;
    if (f->exprs.n == from && !hir__push(f, &exprs, e)) return 0;
    for (j = from; j < f->exprs.n; j++)
      if (!hir__push(f, &exprs, f->exprs.items[j])) return 0;
  }
  f->exprs = exprs;
  return 1;
}

/* Tensors laid out by hir_set_allocation_loop: a fusion input or output
   with an allocation order becomes a program tensor with its axes in that
   order (the caller's memory seen as it is laid out), read or written
   through a permute into the fusion's order. A set or unary op between
   such a permute pair of inverse orders then runs in the allocation order
   itself and both permutes go: an all-gather whose layouts put the gathered
   axis outermost moves its bytes once (the collective), as nvFuser's
   Allgather_CompliantAllocation does. */
/* tv's data axes in allocation order (order[k]: data axis of place k);
   logical[k]: the logical axis the caller's tensor holds it in. 0 where
   the axes holding data (not a DIDx or DIDy part, one element a device)
   keep their order: the layout is the data axes' own. */
static int hir__allocation_perm(const hir_tv *tv, int *order, unsigned char *logical) {
  hir_id *ids[HIR_MAX_DIMS];
  int d, k = 0, n = hir__data_axes(tv, ids), last = -1, moved = 0, l, a;
  unsigned char of[HIR_MAX_DIMS];
  for (a = 0, d = 0; a < tv->ndims; a++)
    if (tv->ids[a]->iter != HIR_REDUCTION) of[d] = (unsigned char)(tv->nlogical ? tv->logical_of[a] : d), d++;
  for (l = 0; l < tv->nalloc; l++)
    for (d = 0; d < n; d++) {
      if (of[d] != tv->alloc_order[l]) continue;
      logical[k] = of[d], order[k++] = d;
      if (!hir__is_did(ids[d]->ptype)) moved |= d < last, last = d;
    }
  return moved && k == n;
}

/* A new tensor of tv's data axes in `order`, its caller-facing logical
   axes tv's; it takes tv's name (the one the caller knows), tv a new one. */
static hir_tv *hir__laid_out_twin(hir_fusion *f, hir_tv *tv, const int *order, const unsigned char *logical) {
  hir_id *ids[HIR_MAX_DIMS];
  int n = hir__data_axes(tv, ids), k, name;
  hir_tv *twin = hir__new_tv(f, tv->dtype, tv->mem, n);
  if (!twin) return NULL;
  for (k = 0; k < n; k++) {
    if (!(twin->ids[k] = hir__clone_id(f, ids[order[k]], 1))) return NULL;
    twin->logical_of[k] = logical[k];
  }
  twin->nlogical = tv->nlogical ? tv->nlogical : n;
  for (k = 0; k < twin->nlogical; k++) twin->logical_extent[k] = tv->nlogical ? tv->logical_extent[k] : ids[k]->extent;
  hir__share_mesh(twin, tv);
  twin->is_input = tv->is_input, twin->is_output = tv->is_output, tv->is_input = tv->is_output = 0;
  name = twin->name, twin->name = tv->name, tv->name = name; /* f->tvs is by name */
  tv->made_from = twin->name + 1;
  f->tvs.items[twin->name] = twin, f->tvs.items[tv->name] = tv;
  return twin;
}

/* The permute expr src -> dst, dst's axis i reading src's data axis perm[i]. */
static hir_expr *hir__permute_into(hir_fusion *f, hir_tv *src, hir_tv *dst, const int *perm) {
  hir_expr *e = hir__new_expr(f, HIR_EXPR_LOAD_STORE, 1, 1);
  int i;
  if (!e) return NULL;
  e->in[0] = src, e->out[0] = dst, dst->definition = e;
  for (i = 0; i < dst->ndims; i++) e->perm[i] = (unsigned char)perm[i];
  e->flags |= HIR__SET_PERMUTE;
  return e;
}

static int hir__allocation_layouts(hir_program *p) {
  hir_fusion *f = &p->ir;
  hir__vec exprs = {NULL, 0, 0}, tail = {NULL, 0, 0};
  int *readers, i, k, order[HIR_MAX_DIMS], inv[HIR_MAX_DIMS];
  unsigned char logical[HIR_MAX_DIMS];
  for (i = 0; i < f->inputs.n; i++) { /* x = permute(x laid out) */
    hir_tv *x = (hir_tv *)f->inputs.items[i], *laid;
    hir_expr *e;
    if (x->scalar || !x->nalloc || !hir__allocation_perm(x, order, logical)) continue;
    for (k = 0; k < x->ndims; k++) inv[order[k]] = k;
    if (!(laid = hir__laid_out_twin(f, x, order, logical)) || !(e = hir__permute_into(f, laid, x, inv)) ||
        !hir__push(f, &exprs, e))
      return 0;
    f->inputs.items[i] = laid;
  }
  for (i = 0; i < f->exprs.n; i++)
    if (!hir__push(f, &exprs, f->exprs.items[i])) return 0;
  for (i = 0; i < f->outputs.n; i++) { /* y laid out = permute(y) */
    hir_tv *y = (hir_tv *)f->outputs.items[i], *laid;
    hir_expr *e;
    if (!y->nalloc || !hir__allocation_perm(y, order, logical)) continue;
    if (!(laid = hir__laid_out_twin(f, y, order, logical)) || !(e = hir__permute_into(f, y, laid, order)) ||
        !hir__push(f, &exprs, e))
      return 0;
    f->outputs.items[i] = laid;
  }
  f->exprs = exprs;
  /* a set or unary op between a permute in and the inverse permute out runs laid out */
  if (!(readers = (int *)HIR_MALLOC(((size_t)f->next_tv + 1) * sizeof(int)))) {
    hir__fail(f, HIR_ERR_NOMEM, "hir_lower: out of memory");
    return 0;
  }
  memset(readers, 0, ((size_t)f->next_tv + 1) * sizeof(int));
  for (i = 0; i < f->exprs.n; i++)
    for (k = 0; k < ((hir_expr *)f->exprs.items[i])->nin; k++) readers[((hir_expr *)f->exprs.items[i])->in[k]->name]++;
  for (i = 0; i < f->outputs.n; i++) readers[((hir_tv *)f->outputs.items[i])->name]++;
  for (i = 0; i < f->exprs.n; i++) {
    hir_expr *e = (hir_expr *)f->exprs.items[i], *in = NULL, *out = NULL;
    hir_tv *x = e->nin == 1 ? e->in[0] : NULL, *y = e->out[0];
    int j, inverse = 1;
    if (!x || !(e->kind == HIR_EXPR_UNARY || (e->kind == HIR_EXPR_LOAD_STORE && !(e->flags & HIR__SET_PERMUTE))) ||
        (in = x->definition) == NULL || !(in->flags & HIR__SET_PERMUTE) || readers[x->name] != 1 || readers[y->name] != 1)
      continue;
    for (j = i + 1; j < f->exprs.n && !out; j++)
      if (((hir_expr *)f->exprs.items[j])->in[0] == y) out = (hir_expr *)f->exprs.items[j];
    if (!out || out->kind != HIR_EXPR_LOAD_STORE || !(out->flags & HIR__SET_PERMUTE) || in->in[0]->ndims != out->out[0]->ndims ||
        y->ndims != x->ndims)
      continue;
    for (k = 0; k < out->out[0]->ndims; k++) inverse &= in->perm[out->perm[k]] == k;
    if (!inverse) continue;
    for (k = 0; k < x->ndims; k++) x->ids[k]->ptype = y->ids[k]->ptype = HIR_SERIAL; /* read by none now */
    e->in[0] = in->in[0], e->out[0] = out->out[0], out->out[0]->definition = e;
    x->definition = y->definition = NULL;
    in->kind = out->kind = HIR_EXPR_KIND_COUNT; /* dropped below */
  }
  HIR_FREE(readers);
  for (i = 0; i < f->exprs.n; i++)
    if (((hir_expr *)f->exprs.items[i])->kind != HIR_EXPR_KIND_COUNT && !hir__push(f, &tail, f->exprs.items[i])) return 0;
  f->exprs = tail;
  return 1;
}

/* Steps 0-2 into p, a fresh program: a copy of the fusion (its serial form
   if asked), its matmuls positional, shardings propagated, reshardings
   decomposed. */
static int hir__front_end(hir_program *p, const hir_fusion *f, int serial, int gather_first) {
  if (!hir__clone_fusion(p, f)) return 0;
  if (serial) hir__strip_streams(&p->ir);
  if (!hir__positional_matmuls(p)) return 0;
  hir__propagate_shardings(p);
  hir__streams_from_inputs(p);
  hir__streams_from_sums(p);
  if (!hir__allocation_layouts(p) || !hir__validate_fusion(p) || !hir__decompose_reshardings(p)) return 0;
  if (gather_first) hir__gather_first(p);
  return hir__one_mesh_axis_per_move(p) && hir__order_moves(p);
}

/* The descs' defaults (hir_desc_defaults): where a zero stands for a value,
   the value, so that the passes and the evaluator read each field as set. */
static hir_stream_desc hir__stream_desc_filled(const hir_stream_desc *d) {
  hir_stream_desc out;
  if (d) out = *d;
  else memset(&out, 0, sizeof out);
  if (!out.parts && (out.schedule == HIR_SCHEDULE_COLLECTIVE || !out.automatic))
    out.parts = out.schedule == HIR_SCHEDULE_COLLECTIVE ? 2 : 1;
  return out;
}
static hir_lower_desc hir__lower_desc_filled(const hir_lower_desc *d) {
  hir_lower_desc out;
  if (d) out = *d;
  else memset(&out, 0, sizeof out);
  if (!out.should_merge) out.should_merge = hir_merge_default;
  out.stream = hir__stream_desc_filled(&out.stream);
  return out;
}
static hir_eval_desc hir__eval_desc_filled(const hir_eval_desc *d) {
  hir_eval_desc out;
  if (d) out = *d;
  else memset(&out, 0, sizeof out);
  if (!out.number_of_streams) out.number_of_streams = 4;
  if (out.timeout_ms <= 0) out.timeout_ms = 600000;
  return out;
}
HIRDEF hir_tune_desc hir_desc_defaults(const hir_tune_desc *d) {
  hir_tune_desc out;
  if (d) out = *d;
  else memset(&out, 0, sizeof out);
  out.lower = hir__lower_desc_filled(&out.lower);
  out.eval = hir__eval_desc_filled(&out.eval);
  return out;
}

/* The arguments of hir_lower and hir_segment; a failure is recorded in p. */
static int hir__check_lower_args(hir_program *p, const hir_fusion *f, const hir_lower_desc *d, const char *fn) {
  if (!f) {
    hir__fail(&p->ir, HIR_ERR_INVALID, "%s: the fusion is NULL", fn);
    return 0;
  }
  if (f->status != HIR_OK) {
    hir__fail(&p->ir, HIR_ERR_INVALID, "%s: the fusion has an error: %s", fn, f->error);
    return 0;
  }
  if (d->my_device < 0) {
    hir__fail(&p->ir, HIR_ERR_INVALID, "%s: my_device %d is negative; give this rank's device id", fn, d->my_device);
    return 0;
  }
  if (d->stream.automatic && !d->stream.input_shapes) {
    hir__fail(&p->ir, HIR_ERR_INVALID, "%s: stream.automatic needs stream.input_shapes (the local shapes of the "
              "inputs, as hir_run will get them)", fn);
    return 0;
  }
  return 1;
}

HIRDEF hir_status hir_segment(const hir_fusion *f, const hir_lower_desc *given, hir_segmentation **out) {
  hir_lower_desc filled = hir__lower_desc_filled(given), *d = &filled;
  hir_segmentation *s;
  if (!out) return HIR_ERR_INVALID;
  if (!(s = *out = (hir_segmentation *)HIR_MALLOC(sizeof(hir_segmentation)))) return HIR_ERR_NOMEM;
  memset(s, 0, sizeof *s);
  if (!(s->p = hir_program_create())) {
    HIR_FREE(s);
    *out = NULL;
    return HIR_ERR_NOMEM;
  }
  s->p->my_device = d->my_device;
  if (hir__check_lower_args(s->p, f, d, "hir_segment") && hir__front_end(s->p, f, 0, d->stream.gather_first))
    hir__segment(s->p, d->should_merge, d->merge_user, &s->groups);
  return s->p->ir.status;
}

HIRDEF int hir_segmentation_ngroups(const hir_segmentation *s) { return s ? s->groups.n : 0; }
HIRDEF const hir_group *hir_segmentation_group(const hir_segmentation *s, int i) {
  return (s && i >= 0 && i < s->groups.n) ? (const hir_group *)s->groups.items[i] : NULL;
}
HIRDEF const char *hir_segmentation_error(const hir_segmentation *s) { return s ? s->p->ir.error : "segmentation is NULL"; }
HIRDEF void hir_segmentation_free(hir_segmentation *s) {
  if (!s) return;
  hir_program_free(s->p);
  HIR_FREE(s);
}


// >>lower
/* A device runs a group where an output lives, and a resharding one where
   an input lives too (it sends). A tensor without a mesh lives anywhere. */
static int hir__group_involves(const hir_group *g, int device) {
  int i, k;
  for (i = 0; i < g->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)g->exprs.items[i];
    for (k = 0; g->resharding && k < e->nin; k++)
      if (hir__in_mesh(e->in[k], device)) return 1;
    if (hir__in_mesh(e->out[0], device)) return 1;
  }
  return 0;
}

/* 4. Groups in order: standalone ones become top-level exprs, the others
   PostOnStream of a HostUnit; groups not involving this device are skipped. */
static int hir__build_program(hir_program *p, const hir__vec *groups) {
  hir_fusion *f = &p->ir;
  int *group_of = (int *)HIR_MALLOC(((size_t)f->next_tv + 1) * sizeof(int));
  unsigned char *escapes = (unsigned char *)HIR_MALLOC((size_t)f->next_tv + 1);
  int i, j, k, ok = 0;
  if (!group_of || !escapes) {
    hir__fail(f, HIR_ERR_NOMEM, "hir_lower: out of memory");
    goto done;
  }
  for (i = 0; i <= f->next_tv; i++) group_of[i] = -1;
  memset(escapes, 0, (size_t)f->next_tv + 1);
  for (i = 0; i < groups->n; i++) {
    const hir_group *g = (const hir_group *)groups->items[i];
    for (j = 0; j < g->exprs.n; j++) group_of[((const hir_expr *)g->exprs.items[j])->out[0]->name] = i;
  }
  for (i = 0; i < groups->n; i++) {
    const hir_group *g = (const hir_group *)groups->items[i];
    for (j = 0; j < g->exprs.n; j++) {
      const hir_expr *e = (const hir_expr *)g->exprs.items[j];
      for (k = 0; k < e->nin; k++)
        if (group_of[e->in[k]->name] != i) escapes[e->in[k]->name] = 1;
    }
  }
  for (i = 0; i < f->outputs.n; i++) escapes[((hir_tv *)f->outputs.items[i])->name] = 1;
  for (i = 0; i < groups->n; i++) {
    const hir_group *g = (const hir_group *)groups->items[i];
    hir__host_unit *u;
    hir_expr *post;
    if (!hir__group_involves(g, p->my_device)) {
      /* Others run it here, in a Stream chain of its extent or in none (as
         stream lowering decides there); this rank's chains must break
         where theirs do, so every rank's loops (and their collectives)
         come in one order. */
      if (!hir__push(f, &p->skipped, p->top.exprs.n ? p->top.exprs.items[p->top.exprs.n - 1] : NULL) || /* NULL: before all */
          !hir__push(f, &p->skipped, g->standalone ? g->exprs.items[0] : NULL))
        goto done;
      continue;
    }
    if (g->standalone) {
      if (hir_scope_append(&p->top, (hir_expr *)g->exprs.items[0]) != HIR_OK) goto done;
      continue;
    }
    if (!(u = (hir__host_unit *)hir__alloc(f, sizeof(hir__host_unit)))) goto done;
    for (j = 0; j < g->exprs.n; j++) {
      hir_expr *e = (hir_expr *)g->exprs.items[j];
      if (!hir__push(f, &u->exprs, e)) goto done;
      for (k = 0; k < e->nin; k++)
        if (group_of[e->in[k]->name] != i && !hir__vec_has(&u->ins, e->in[k]) && !hir__push(f, &u->ins, e->in[k])) goto done;
      if (escapes[e->out[0]->name] && !hir__push(f, &u->outs, e->out[0])) goto done;
    }
    if (!(post = hir__post_unit(p, u)) || hir_scope_append(&p->top, post) != HIR_OK) goto done;
  }
  ok = 1;
done:
  HIR_FREE(group_of);
  HIR_FREE(escapes);
  return ok;
}


static int hir__inner_axis(hir_program *p, const hir_expr *e, const hir_tv *tv, int axis) {
  hir__fail(&p->ir, HIR_ERR_UNSUPPORTED,
            "Resharding on an inner axis is not lowerable: %s %d moves axis %d of its %s %s, but axes before it hold "
            "data; make that axis outermost, or stream-parallelize the axes before it",
            hir__ops[e->kind].name, e->name, axis, tv == e->out[0] ? "output" : "input", hir__label(tv).text);
  return 0;
}

typedef struct hir__comm_plan {
  hir_program *p;
  hir__vec *out;          /* the exprs replacing the resharding one */
  hir__vec waits;
  hir_tv *in, *dst;
} hir__comm_plan;

/* Emits a Communication if this device is in its team, and its Wait later. */
static int hir__plan_comm(hir__comm_plan *c, hir_collective type, int n, const int *team, int root) {
  hir_fusion *f = &c->p->ir;
  hir_expr *comm, *wait;
  if (c->p->my_device >= 0 && hir_team_index(team, n, c->p->my_device) < 0) return 1; /* a program for any rank keeps them all */
  if (!(comm = hir__comm_expr(f, type, n, team, root, c->in, c->dst)) || !hir__push(f, c->out, comm)) return 0;
  if (!(wait = hir__new_expr(f, HIR_EXPR_WAIT, 0, 0))) return 0;
  wait->target = comm;
  return hir__push(f, &c->waits, wait);
}

/* Emits the collective of each team along mesh axis p of tv's mesh (one
   team on a 1-D mesh; a row or a column of a 2-D one), rooted at the team's
   first device where it has a root. */
static int hir__plan_per_team(hir__comm_plan *c, hir_collective type, const hir_tv *tv, hir_ptype p, int rooted, int *team) {
  int t, n, nteams = tv->mesh_size / hir__shards(tv, p);
  for (t = 0; t < nteams; t++) {
    n = hir__mesh_team(tv, p, tv->mesh[p == HIR_DIDY ? t : t * hir__shards(tv, HIR_DIDX)], team); /* column t, or row t */
    if (!hir__plan_comm(c, type, n, team, rooted ? team[0] : -1)) return 0;
  }
  return 1;
}

/* team = mesh, plus `extra` at the end unless already there. */
static int hir__team_plus(const hir_tv *tv, int extra, int *team) {
  int n = tv->mesh_size;
  memcpy(team, tv->mesh, (size_t)n * sizeof(int));
  if (hir_team_index(team, n, extra) < 0) team[n++] = extra;
  return n;
}

static int hir__unlowerable(hir_program *p, const hir_expr *e, const char *why) {
  hir__fail(&p->ir, HIR_ERR_UNSUPPORTED, "%s = %s(%s) (%s %d) is not lowerable to communications: %s", hir__label(e->out[0]).text,
            e->kind == HIR_EXPR_LOAD_STORE ? "set" : e->kind == HIR_EXPR_REDUCTION ? "sum" : hir__ops[e->kind].name,
            hir__label(e->in[0]).text, hir__ops[e->kind].name, e->name, why);
  return 0;
}

/* 6. One resharding set or sum: the communications table of docs/DESIGN.md section 3. */
static int hir__lower_resharding(hir_program *p, hir_expr *e, hir__vec *out) {
  hir_fusion *f = &p->ir;
  hir__comm_plan c;
  hir_tv *in, *dst;
  hir_ptype along;
  int in_sh, out_sh, same, din, dout, map[HIR_MAX_DIMS], i, n, *team, both;
  if (!(hir__ops[e->kind].flags & HIR__OP_MOVES))
    return hir__unlowerable(p, e, "only set and sum move data; decompose the op into a resharding set and a local op "
                                  "(hir_lower does)");
  in = e->in[0];
  dst = e->out[0];
  along = hir__moving_ptype(e, &both);
  same = hir__same_mesh(in, dst);
  if (both)
    return hir__unlowerable(p, e, "it changes both its DIDx and its DIDy axes, and a collective moves along one mesh axis; "
                                  "move along one, then the other (a hir_set, or a hir_sum, for each)");
  if (!same && (in->mesh_cols || dst->mesh_cols))
    return hir__unlowerable(p, e, "a 2-D mesh reshards within itself (collectives along its rows or columns); give both "
                                  "tensors the same mesh");
  din = hir__shard_axis(in, along);
  dout = hir__shard_axis(dst, along);
  in_sh = din >= 0;
  out_sh = dout >= 0;
  hir__axis_map(e, 0, map);
  memset(&c, 0, sizeof c);
  c.p = p;
  c.out = out;
  c.in = in;
  c.dst = dst;
  n = (in->mesh_size > dst->mesh_size ? in->mesh_size : dst->mesh_size) + 2;
  if (!(team = (int *)hir__alloc(f, (size_t)n * sizeof(int)))) return 0;
  if (p->my_device < 0 || hir__in_mesh(dst, p->my_device)) {
    hir_expr *alloc = hir__new_expr(f, HIR_EXPR_ALLOCATE, 1, 0);
    if (!alloc || !hir__push(f, out, alloc)) return 0;
    alloc->in[0] = dst;
  }
  if (e->kind == HIR_EXPR_LOAD_STORE) {
    if (!in_sh && out_sh && same) { /* Scatter from each team's first device */
      if (!hir__outermost(dst, dout)) return hir__inner_axis(p, e, dst, dout);
      if (!hir__plan_per_team(&c, HIR_COLL_SCATTER, dst, along, 1, team)) return 0;
    } else if (!in_sh && out_sh) { /* Scatter */
      const int *from = in->mesh_size ? in->mesh : dst->mesh;
      int nfrom = in->mesh_size ? in->mesh_size : dst->mesh_size, root = -1;
      for (i = 0; i < nfrom && root < 0; i++)
        if (hir__in_mesh(dst, from[i])) root = from[i];
      if (root < 0) return hir__unlowerable(p, e, "a Scatter needs a sender inside the receivers' mesh");
      if (!hir__outermost(dst, dout)) return hir__inner_axis(p, e, dst, dout);
      if (!hir__plan_comm(&c, HIR_COLL_SCATTER, dst->mesh_size, dst->mesh, root)) return 0;
    } else if (in_sh && !out_sh && same) {
      if (!hir__outermost(in, din)) return hir__inner_axis(p, e, in, din);
      if (!hir__plan_per_team(&c, HIR_COLL_ALLGATHER, in, along, 0, team)) return 0;
    } else if (in_sh && !out_sh) { /* one Gather per receiver */
      if (!hir__outermost(in, din)) return hir__inner_axis(p, e, in, din);
      for (i = 0; i < dst->mesh_size; i++) {
        int nteam = hir__team_plus(in, dst->mesh[i], team);
        if (!hir__plan_comm(&c, HIR_COLL_GATHER, nteam, team, dst->mesh[i])) return 0;
      }
    } else if (in_sh && out_sh && !same && in->mesh_size == dst->mesh_size && map[din] == dout) {
      for (i = 0; i < in->mesh_size; i++) { /* one SendRecv per index */
        int pair[2], npair = 1;
        pair[0] = in->mesh[i];
        if (dst->mesh[i] != in->mesh[i]) pair[npair++] = dst->mesh[i];
        if (!hir__plan_comm(&c, HIR_COLL_SENDRECV, npair, pair, in->mesh[i])) return 0;
      }
    } else if (!in_sh && !out_sh && !same && in->mesh_size) {
      int root = in->mesh[0], nteam = hir__team_plus(dst, root, team);
      if (!hir__plan_comm(&c, HIR_COLL_BROADCAST, nteam, team, root)) return 0;
    } else if (in_sh && out_sh && same && map[din] >= 0) { /* the split axis moves to another axis: AllToAll */
      int src = -1;
      for (i = 0; i < in->ndims; i++)
        if (map[i] == dout) src = i;
      if (src < 0 || !hir__outermost(in, src)) return hir__inner_axis(p, e, in, src < 0 ? din : src);
      if (!hir__outermost(dst, map[din])) return hir__inner_axis(p, e, dst, map[din]);
      if (!hir__plan_per_team(&c, HIR_COLL_ALLTOALL, in, along, 0, team)) return 0;
    } else {
      return hir__unlowerable(p, e, "the two meshes or split axes do not match a collective");
    }
  } else { /* a sum */
    for (i = 0; i < in->ndims; i++)
      if (map[i] >= 0 && dst->ids[map[i]]->iter == HIR_REDUCTION && i != din)
        return hir__unlowerable(p, e, "a resharding sum reduces only the split (DIDx or DIDy) axis; sum the other axes with a "
                                      "separate hir_sum");
    if (din < 0 || map[din] < 0 || dst->ids[map[din]]->iter != HIR_REDUCTION)
      return hir__unlowerable(p, e, "a resharding sum must reduce the input's split (DIDx or DIDy) axis");
    if (out_sh && same) {
      int src_axis = -1;
      for (i = 0; i < in->ndims; i++)
        if (map[i] == dout) src_axis = i;
      if (src_axis < 0 || !hir__outermost(in, src_axis)) return hir__inner_axis(p, e, in, src_axis < 0 ? dout : src_axis);
      if (!hir__plan_per_team(&c, HIR_COLL_REDUCESCATTER, in, along, 0, team)) return 0;
    } else if (!out_sh && same) {
      if (!hir__plan_per_team(&c, HIR_COLL_ALLREDUCE, in, along, 0, team)) return 0;
    } else if (!out_sh) {
      for (i = 0; i < dst->mesh_size; i++) {
        int nteam = hir__team_plus(in, dst->mesh[i], team);
        if (!hir__plan_comm(&c, HIR_COLL_REDUCE, nteam, team, dst->mesh[i])) return 0;
      }
    } else {
      return hir__unlowerable(p, e, "reduce-scattering onto another mesh is not supported");
    }
  }
  for (i = 0; i < c.waits.n; i++)
    if (!hir__push(f, out, c.waits.items[i])) return 0;
  return 1;
}

/* Replaces a scope's contents, keeping each expr's scope pointer right. */
static void hir__scope_reset(hir_scope *s, hir__vec *exprs) {
  int i;
  for (i = 0; i < s->exprs.n; i++) ((hir_expr *)s->exprs.items[i])->scope = NULL;
  s->exprs = *exprs;
  for (i = 0; i < s->exprs.n; i++) ((hir_expr *)s->exprs.items[i])->scope = s;
}

static int hir__convert_scope(hir_program *p, hir_scope *s) {
  hir__vec out = {NULL, 0, 0};
  int i;
  for (i = 0; i < s->exprs.n; i++) {
    hir_expr *e = (hir_expr *)s->exprs.items[i];
    if (hir_expr_is_resharding(e)) {
      if (!hir__lower_resharding(p, e, &out)) return 0;
    } else if (!hir__push(&p->ir, &out, e)) {
      return 0;
    }
  }
  hir__scope_reset(s, &out);
  return 1;
}

HIRDEF hir_status hir_pass_convert_communications(hir_program *p) {
  int i;
  if (!p) return HIR_ERR_INVALID;
  if (p->ir.status != HIR_OK) return p->ir.status;
  if (!hir__convert_scope(p, &p->top)) return p->ir.status;
  for (i = 0; i < p->top.exprs.n; i++) { /* and one loop deep */
    hir_expr *e = (hir_expr *)p->top.exprs.items[i];
    if (e->kind == HIR_EXPR_FOR_LOOP && !hir__convert_scope(p, &e->body)) return p->ir.status;
  }
  return HIR_OK;
}

HIRDEF int hir_program_device(const hir_program *p) { return p ? p->my_device : -1; }   /* -1: built by hand */

// >>pass_dealloc
enum { HIR__TV_NONE, HIR__TV_BUFFER, HIR__TV_VIEW, HIR__TV_KEEP };

typedef struct hir__uses {
  int *last;              /* by tensor name: the position of its last use */
  int pos;
} hir__uses;

static void hir__note_use(hir_tv *tv, int writes, void *ctx) {
  hir__uses *u = (hir__uses *)ctx;
  (void)writes;
  u->last[tv->name] = u->pos;
}

static void hir__note_uses_deep(const hir_expr *e, hir__uses *u) {
  int i;
  hir__expr_tvs(e, hir__note_use, u);
  if (e->kind == HIR_EXPR_WAIT) hir__expr_tvs(e->target, hir__note_use, u); /* in flight until then */
  for (i = 0; i < e->body.exprs.n; i++) hir__note_uses_deep((const hir_expr *)e->body.exprs.items[i], u);
  for (i = 0; i < e->orelse.exprs.n; i++) hir__note_uses_deep((const hir_expr *)e->orelse.exprs.items[i], u);
}

/* What a tensor is to the program: a buffer to release, a view of one, or
   something kept (inputs, outputs, tensors already released). */
static void hir__classify(const hir_expr *e, unsigned char *kind) {
  int i;
  if (hir__ops[e->kind].flags & HIR__OP_VIEW) kind[e->out[0]->name] = HIR__TV_VIEW;
  if (e->kind == HIR_EXPR_DEALLOCATE) kind[e->in[0]->name] = HIR__TV_KEEP;
  for (i = 0; i < e->nin; i++)
    if (e->in[i] && hir__writes_inputs(e) && !kind[e->in[i]->name]) kind[e->in[i]->name] = HIR__TV_BUFFER;
  for (i = 0; i < e->nout; i++)
    if (e->out[i] && !kind[e->out[i]->name]) kind[e->out[i]->name] = HIR__TV_BUFFER;
  for (i = 0; i < e->body.exprs.n; i++) hir__classify((const hir_expr *)e->body.exprs.items[i], kind);
  for (i = 0; i < e->orelse.exprs.n; i++) hir__classify((const hir_expr *)e->orelse.exprs.items[i], kind);
}

/* First and last position in s where each tensor is used (nested scopes count
   as their parent's position). */
static void hir__use_span(const hir_scope *s, int *first, int *last, int nt) {
  hir__uses u;
  int i;
  for (i = 0; i < nt; i++) last[i] = -1;
  u.last = last;
  for (i = s->exprs.n - 1; i >= 0; i--) { /* backwards: `last` ends up holding first uses */
    u.pos = i;
    hir__note_uses_deep((const hir_expr *)s->exprs.items[i], &u);
  }
  memcpy(first, last, (size_t)nt * sizeof(int));
  for (i = 0; i < nt; i++) last[i] = -1;
  for (i = 0; i < s->exprs.n; i++) {
    u.pos = i;
    hir__note_uses_deep((const hir_expr *)s->exprs.items[i], &u);
  }
}

typedef struct hir__release {
  int pos, tv;
} hir__release;

static int hir__cmp_release(const void *a, const void *b) {
  const hir__release *x = (const hir__release *)a, *y = (const hir__release *)b;
  return x->pos != y->pos ? (x->pos > y->pos) - (x->pos < y->pos) : (x->tv > y->tv) - (x->tv < y->tv);
}

/* Inserts a Deallocate of each rel[i].tv right after the expr at rel[i].pos. */
static int hir__release_in(hir_program *p, hir_scope *s, hir__release *rel, int n) {
  hir_fusion *f = &p->ir;
  hir__vec out = {NULL, 0, 0};
  int i, r = 0;
  qsort(rel, (size_t)n, sizeof *rel, hir__cmp_release);
  if (!hir__vec_reserve(&f->arena, &out, s->exprs.n + n)) {
    hir__fail(f, HIR_ERR_NOMEM, "hir_pass_insert_deallocations: out of memory");
    return 0;
  }
  for (i = 0; i < s->exprs.n; i++) {
    out.items[out.n++] = s->exprs.items[i];
    for (; r < n && rel[r].pos == i; r++) {
      hir_expr *d = hir__new_expr(f, HIR_EXPR_DEALLOCATE, 1, 0);
      if (!d) return 0;
      d->in[0] = (hir_tv *)f->tvs.items[rel[r].tv];
      out.items[out.n++] = d;
    }
  }
  hir__scope_reset(s, &out);
  return 1;
}

/* 7. Every buffer that is neither a program input nor output is released
   after its last use: inside a loop body when only that body uses it (a
   per-iteration buffer), else at top level. */
HIRDEF hir_status hir_pass_insert_deallocations(hir_program *p) {
  hir_fusion *f;
  unsigned char *kind;
  int *first, *last, *body_last, nt, i, t, n, ok = 0;
  hir__release *rel;
  if (!p) return HIR_ERR_INVALID;
  f = &p->ir;
  if (f->status != HIR_OK) return f->status;
  nt = f->next_tv;
  HIR_ASSERT(nt == f->tvs.n); /* tensors are listed in name order */
  kind = (unsigned char *)HIR_MALLOC((size_t)nt + 1);
  first = (int *)HIR_MALLOC(((size_t)nt + 1) * sizeof(int));
  last = (int *)HIR_MALLOC(((size_t)nt + 1) * sizeof(int));
  body_last = (int *)HIR_MALLOC(((size_t)nt + 1) * sizeof(int));
  rel = (hir__release *)HIR_MALLOC(((size_t)nt + 1) * sizeof(hir__release));
  if (!kind || !first || !last || !body_last || !rel) {
    hir__fail(f, HIR_ERR_NOMEM, "hir_pass_insert_deallocations: out of memory");
    goto done;
  }
  memset(kind, 0, (size_t)nt + 1);
  for (i = 0; i < f->inputs.n; i++) kind[((hir_tv *)f->inputs.items[i])->name] = HIR__TV_KEEP;
  for (i = 0; i < f->outputs.n; i++) kind[((hir_tv *)f->outputs.items[i])->name] = HIR__TV_KEEP;
  for (i = 0; i < p->top.exprs.n; i++) hir__classify((const hir_expr *)p->top.exprs.items[i], kind);
  hir__use_span(&p->top, first, last, nt);
  for (t = 0; t < nt; t++) body_last[t] = -1;
  for (i = 0; i < p->top.exprs.n; i++) {
    hir_expr *loop = (hir_expr *)p->top.exprs.items[i];
    hir__uses u;
    int j, k;
    if (loop->kind != HIR_EXPR_FOR_LOOP) continue;
    u.last = body_last;
    for (j = 0; j < loop->body.exprs.n; j++) {
      u.pos = j;
      hir__note_uses_deep((const hir_expr *)loop->body.exprs.items[j], &u);
    }
    n = 0; /* buffers only this loop uses are per-iteration: released in its body */
    for (j = 0; j < loop->body.exprs.n; j++) {
      const hir_expr *b = (const hir_expr *)loop->body.exprs.items[j];
      for (k = 0; k < b->nout + b->nin; k++) {
        hir_tv *tv = k < b->nout ? b->out[k] : b->in[k - b->nout];
        if (!tv || kind[tv->name] != HIR__TV_BUFFER || first[tv->name] != i || last[tv->name] != i) continue;
        kind[tv->name] = HIR__TV_KEEP;
        rel[n].pos = body_last[tv->name];
        rel[n++].tv = tv->name;
      }
    }
    if (!hir__release_in(p, &loop->body, rel, n)) goto done;
  }
  for (t = 0, n = 0; t < nt; t++)
    if (kind[t] == HIR__TV_BUFFER && last[t] >= 0) {
      rel[n].pos = last[t];
      rel[n++].tv = t;
    }
  if (!hir__release_in(p, &p->top, rel, n)) goto done;
  ok = 1;
done:
  HIR_FREE(kind);
  HIR_FREE(first);
  HIR_FREE(last);
  HIR_FREE(body_last);
  HIR_FREE(rel);
  return ok ? HIR_OK : f->status;
}

// >>pass_stream
/* The pass's own reading of hir_stream_desc (hir__stream_plan_of): a named
   schedule and a part count, as the P2P order, parts a peer, the collective
   pipeline's parts and the serial form. */
typedef struct hir__stream_plan {
  int ring;               /* P2P steps around a ring, else linear */
  int chunks_per_peer;    /* P2P: parts a peer (0: 1, or the cost model's choice) */
  int collective_chunks;  /* > 1: P2P pipelines as collective pipelines of this many parts */
  int serial, gather_first, bounded_buffers, automatic;
  const hir_tensor *input_shapes;
  int ninput_shapes;
  hir_stream_experimental experimental;
} hir__stream_plan;

static int hir__stream_plan_of(hir_fusion *f, const hir_stream_desc *d, hir__stream_plan *o) {
  int collective = d->schedule == HIR_SCHEDULE_COLLECTIVE;
  memset(o, 0, sizeof *o);
  if ((unsigned)d->schedule >= (unsigned)HIR_SCHEDULE_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "stream lowering: schedule is %d; give HIR_SCHEDULE_LINEAR, HIR_SCHEDULE_RING, "
              "HIR_SCHEDULE_COLLECTIVE or HIR_SCHEDULE_SERIAL", (int)d->schedule);
    return 0;
  }
  if (d->parts < 0 || d->parts > 1024 || (collective && d->parts == 1) || (d->schedule == HIR_SCHEDULE_SERIAL && d->parts > 1)) {
    hir__fail(f, HIR_ERR_INVALID, "stream lowering: parts is %d; give %s", d->parts,
              collective ? "2 to 1024 for a collective pipeline (0: 2)"
              : d->schedule == HIR_SCHEDULE_SERIAL ? "0 or 1: the serial program has no parts" : "1 to 1024 (0: one part a peer)");
    return 0;
  }
  o->ring = d->schedule == HIR_SCHEDULE_RING;
  o->chunks_per_peer = collective ? 1 : d->parts;
  o->collective_chunks = collective ? d->parts : 0; /* filled: 2 for 0 (hir__stream_desc_filled) */
  o->serial = d->schedule == HIR_SCHEDULE_SERIAL;
  o->gather_first = d->gather_first;
  o->bounded_buffers = d->bounded_buffers;
  o->automatic = d->automatic;
  o->input_shapes = d->input_shapes;
  o->ninput_shapes = d->ninput_shapes;
  o->experimental = d->experimental;
  return 1;
}

/* Stream lowering (docs/DESIGN.md section 3, step 4). Top-level exprs whose outputs have a Stream
   axis form chains (neighbours whose Stream axes have one extent); each chain
   becomes one loop over chunks, every tensor seen through HirAliasSelect
   views along the axis mapped to the Stream axis. Two resharding patterns
   become point-to-point schedules in the loop: the P2P allgather (a set whose
   DIDx axis becomes the Stream axis) and its mirror, the P2P reduce-scatter
   (a sum over DIDx whose input's Stream axis becomes the output's DIDx axis). */

/* The devices a P2P exchange e runs among, in ring order, on this device:
   the mesh (1-D), or this device's row or column of a 2-D mesh. */
static const int *hir__p2p_team(hir_program *p, const hir_expr *e, int *n) {
  const hir_tv *in = e->in[0];
  int *team;
  *n = in->mesh_size;
  if (!in->mesh_cols) return in->mesh;
  if (!(team = (int *)hir__alloc(&p->ir, (size_t)in->mesh_size * sizeof(int)))) return NULL;
  *n = hir__mesh_team(in, hir__moving_ptype(e, NULL), p->my_device, team);
  return team;
}

/* The ID a chain loops over for expr e (its Stream axis), or NULL. */
static hir_id *hir__stream_id(const hir_expr *e) {
  int a, s;
  if (e->kind == HIR_EXPR_POST_ON_STREAM || !(hir__ops[e->kind].flags & HIR__OP_COMPUTE)) return NULL;
  if (hir__p2p_kind(e, &a) == HIR__P2P_REDUCE_SCATTER) return e->in[0]->ids[a];
  s = hir__stream_axis(e->out[0]);
  return s >= 0 ? e->out[0]->ids[s] : NULL;
}

/* Whether the ops other ranks run after `prev` (ops this rank skips) stay in
   their Stream chain over id's extent, as stream lowering decides there. */
static int hir__skipped_in_chain(const hir_program *p, const void *prev, const hir_id *id) {
  int i;
  for (i = 0; i + 1 < p->skipped.n; i += 2)
    if (p->skipped.items[i] == prev) {
      const hir_expr *x = (const hir_expr *)p->skipped.items[i + 1];
      const hir_id *xid = x ? hir__stream_id(x) : NULL;
      if (!xid || xid->extent != id->extent) return 0;
    }
  return 1;
}

/* The P2P exchanges that other ranks run in a chain over id's extent, right
   after `prev` (NULL: before this rank's first op), where this rank skips
   them: their kinds, and the team of the first (*team, *n; kept if set). */
static int hir__skipped_p2p(hir_program *p, const void *prev, const hir_id *id, const int **team, int *n) {
  int i, kinds = 0, a;
  for (i = 0; i + 1 < p->skipped.n; i += 2) {
    const hir_expr *x = (const hir_expr *)p->skipped.items[i + 1];
    const hir_id *xid = x ? hir__stream_id(x) : NULL;
    int kind = x ? hir__p2p_kind(x, &a) : HIR__P2P_NONE;
    if (p->skipped.items[i] != prev || !xid || xid->extent != id->extent || kind == HIR__P2P_NONE) continue;
    kinds |= kind;
    if (!*team && !(*team = hir__p2p_team(p, x, n))) return -1;
  }
  return kinds;
}

typedef struct hir__slice {
  const hir_tv *tv;
  int axis, parts;              /* parts 0: HirAliasSelect, else HirAliasSlice */
  const hir_val *index;
  hir_tv *view;
} hir__slice;

typedef struct hir__chain {
  hir_program *p;
  const hir__stream_plan *opt;
  hir_expr **exprs;
  int n, p2p, ring;
  int swizzle;                  /* a Stream axis of its ops is swizzled (hir_swizzle1d): chunks from the own place on */
  hir_id *id;                   /* the loop's axis */
  const int *mesh;              /* the P2P mesh and my position in it */
  int mesh_size, pos;
  hir_val *i, *chunk, *slot, *pos_val;
  int parts_per_peer;           /* P2P chains: each peer's chunk cut into this many parts, one an iteration */
  int collective;               /* a P2P chain lowered as collectives (HIR_SCHEDULE_COLLECTIVE): views keep the Stream axis */
  const char *cut_option;       /* the option that cuts parts, for messages */
  hir_val *step, *part_index;   /* the iteration's peer step (i % D) and part (i / D) */
  unsigned char *cut_axis_of;   /* by tensor name: 0 unseen, else 2 + the axis a loop write cuts (1: none) */
  hir_tv *rs_slots;             /* the reduce-scatter's partials of the own chunk, a slot per mesh position */
  int rs_slot_axis, rs_cut_axis; /* its slot axis; its axis cut into parts (-1: none) */
  hir_val *own_step;            /* whether this step's chunk is the device's own */
  const hir_tv *rs_input_in_slots; /* the reduce-scatter's input whose own chunk is computed straight into its slot */
  const hir_tv *ag_read_in_place; /* an allgather's output whose readers take the own chunk from its input, uncopied */
  hir_tv *ag_input;             /* that allgather's input, the axis it gathers and the one cut into parts (-1: none) */
  int ag_in_axis, ag_in_cut;
  hir_val *ag_mine;             /* whether this step's chunk is the device's own */
  hir_scope *body;
  hir__vec allocs, after, slices;
  unsigned char *bounded;       /* by tensor name */
} hir__chain;

static hir_val *hir__scalar(hir__chain *c, hir_scalar_op op, hir_val *a, hir_val *b) {
  return hir__binary_val(&c->p->ir, op, a, b);
}

/* The device at chunk position `index` of the loop's mesh. */
static hir_val *hir__mesh_at(hir__chain *c, hir_val *index) {
  hir_val *v;
  int i, iota = 1;
  for (i = 0; i < c->mesh_size; i++) iota &= c->mesh[i] == i;
  if (iota) return index;
  if (!(v = hir__new_val(&c->p->ir, HIR__VAL_MESH_AT))) return NULL;
  v->lhs = index;
  v->mesh = c->mesh;
  v->mesh_size = c->mesh_size;
  return v;
}

static int hir__append(hir_scope *s, hir_expr *e) { return e && hir_scope_append(s, e) == HIR_OK; }

/* A view of tv at `index` along `axis` (of `parts` equal parts of it; 0:
   that axis selected away), made once per (tv, axis, index, parts) and
   placed in the loop body. */
static hir_tv *hir__slice_of(hir__chain *c, hir_tv *tv, int axis, hir_val *index, int parts) {
  hir_fusion *f = &c->p->ir;
  hir__slice *s;
  hir_expr *sel;
  int i;
  for (i = 0; i < c->slices.n; i++) {
    s = (hir__slice *)c->slices.items[i];
    if (s->tv == tv && s->axis == axis && s->index == index && s->parts == parts) return s->view;
  }
  sel = hir__alias_view(f, tv, axis, index, parts);
  if (!sel || !hir__append(c->body, sel)) return NULL;
  if (!(s = (hir__slice *)hir__alloc(f, sizeof(hir__slice)))) return NULL;
  s->tv = tv;
  s->axis = axis;
  s->parts = parts;
  s->index = index;
  s->view = sel->out[0];
  return hir__push(f, &c->slices, s) ? s->view : NULL;
}

/* tv seen at this iteration along `axis`: a broadcast axis at 0, a bounded
   buffer at its slot, anything else at the chunk. */
static hir_tv *hir__chunk_view(hir__chain *c, hir_tv *tv, int axis) {
  hir_fusion *f = &c->p->ir;
  const hir_id *id;
  hir_val *index;
  if (c->collective) return tv; /* every peer's chunk at once (a reduce-scatter's output: no Stream axis); parts only */
  id = tv->ids[axis];
  index = id->iter == HIR_BROADCAST ? hir__const(f, 0) : c->bounded[tv->name] ? c->slot : c->chunk;
  if (id->iter != HIR_BROADCAST && !c->bounded[tv->name] && id->extent != c->id->extent) { /* runs must check the sizes */
    hir__same_extent *x = (hir__same_extent *)hir__alloc(f, sizeof *x);
    if (!x) return NULL;
    x->loop = c->id->extent;
    x->tv = tv;
    x->axis = axis;
    if (!hir__push(f, &c->p->same_extents, x)) return NULL;
  }
  return index ? hir__slice_of(c, tv, axis, index, 0) : NULL;
}

/* The axis a P2P chain cuts into parts: tv's first axis holding data after
   its Stream-mapped axis s, so that a part of a row-major chunk is one
   contiguous block; -1 if there is none. */
static int hir__cut_axis(const hir_tv *tv, int s) {
  int i;
  for (i = s + 1; i < tv->ndims; i++)
    if (tv->ids[i]->iter == HIR_ITERATION && !hir__split_axis(tv, i)) return i;
  return -1;
}

static int hir__stream_fail(hir_program *p, const hir_expr *e, const char *why) {
  hir__fail(&p->ir, HIR_ERR_UNSUPPORTED, "stream lowering: %s %d (%s): %s", hir__ops[e->kind].name, e->name,
            e->nout ? hir__label(e->out[0]).text : "no output", why);
  return 0;
}

/* Ops of a cut loop must all cut a tensor the loop writes along one axis,
   or one would read parts not written yet. `writes`: e writes tv. */
static int hir__same_cut(hir__chain *c, const hir_expr *e, const hir_tv *tv, int axis, int writes) {
  unsigned char *seen = &c->cut_axis_of[tv->name];
  char why[320];
  if (c->parts_per_peer < 2) return 1;
  if (writes && axis < 0) {
    snprintf(why, sizeof why, "%s = %d cuts the first axis after the Stream axis, and %s has none; use %s",
             c->cut_option, c->parts_per_peer, hir__label(tv).text, c->collective ? "a P2P schedule (LINEAR or RING)" : "parts = 1");
    return hir__stream_fail(c->p, e, why);
  }
  if (writes && !*seen) *seen = (unsigned char)(axis + 2);
  if (!*seen || *seen == axis + 2) return 1;
  snprintf(why, sizeof why, "with %s = %d, %s would be cut along axis %d here and axis %d where it is "
           "written, so this op would read parts not written yet; use %s", c->cut_option,
           c->parts_per_peer, hir__label(tv).text, axis, *seen - 2, c->collective ? "a P2P schedule (LINEAR or RING)" : "parts = 1");
  return hir__stream_fail(c->p, e, why);
}

/* view cut to this iteration's part along `axis` (not cut: -1), placed in
   the loop body; in `scope` instead when given. */
static hir_tv *hir__part_of(hir__chain *c, hir_scope *scope, hir_tv *view, int axis) {
  hir_expr *e;
  hir_tv *part;
  int i;
  if (!view || c->parts_per_peer < 2 || axis < 0) return view;
  if (!scope) part = hir__slice_of(c, view, axis, c->part_index, c->parts_per_peer);
  else part = (e = hir__alias_view(&c->p->ir, view, axis, c->part_index, c->parts_per_peer)) && hir__append(scope, e) ? e->out[0] : NULL;
  for (i = 0; part && c->collective && i < part->ndims; i++) /* the loop is over parts: the view's chunks are all there */
    if (part->ids[i]->ptype == HIR_STREAM) part->ids[i]->ptype = HIR_SERIAL;
  return part;
}

/* tv's chunk view along `axis`, cut along `cut` (tv's numbering). */
static hir_tv *hir__chunk_part(hir__chain *c, hir_tv *tv, int axis, int cut) {
  return hir__part_of(c, NULL, hir__chunk_view(c, tv, axis), cut < 0 || c->collective ? cut : cut - (cut > axis));
}

/* e applied to other tensors (views). */
static hir_expr *hir__clone_onto(hir_fusion *f, const hir_expr *e, hir_tv **ins, hir_tv *out, int dropped_out_axis) {
  hir_expr *n = hir__new_expr(f, e->kind, e->nin, 1);
  int k;
  if (!n) return NULL;
  n->sub = e->sub;
  n->flags = e->flags;
  n->scalar = e->scalar;
  n->val = e->val;
  n->composite = e->composite;
  n->composite_role = e->composite_role;
  memcpy(n->perm, e->perm, sizeof n->perm);
  if ((e->flags & HIR__SET_PERMUTE) && dropped_out_axis >= 0) { /* the views lack an axis: renumber the rest */
    int i, k = 0, gone = e->perm[dropped_out_axis];
    for (i = 0; i < e->out[0]->ndims; i++)
      if (i != dropped_out_axis) n->perm[k++] = (unsigned char)(e->perm[i] - (e->perm[i] > gone));
  }
  if (e->kind == HIR_EXPR_BROADCAST && dropped_out_axis >= 0) { /* the flags of the remaining axes */
    uint32_t low = e->flags & ((1u << dropped_out_axis) - 1u);
    n->flags = low | ((e->flags >> (dropped_out_axis + 1)) << dropped_out_axis);
  }
  if (e->kind == HIR_EXPR_MATMUL && dropped_out_axis >= 0) { /* a chunk along M or N: the views lack that axis */
    int m_axis, n_axis;
    hir__matmul_out_axes(e, &m_axis, &n_axis);
    if (dropped_out_axis == m_axis) n->flags |= HIR__MATMUL_NO_M;
    if (dropped_out_axis == n_axis) n->flags |= HIR__MATMUL_NO_N;
  }
  for (k = 0; k < e->nin; k++) n->in[k] = ins[k];
  n->out[0] = out;
  return n;
}

/* Slot `index` of the reduce-scatter's partials, cut to this iteration's
   part, placed in `scope`. */
static hir_tv *hir__rs_slot(hir__chain *c, hir_scope *scope, hir_val *index) {
  hir_expr *sel = index ? hir__alias_view(&c->p->ir, c->rs_slots, c->rs_slot_axis, index, 0) : NULL;
  if (!sel || !hir__append(scope, sel)) return NULL;
  return hir__part_of(c, scope, sel->out[0], c->rs_cut_axis < 0 ? -1 : c->rs_cut_axis - (c->rs_cut_axis > c->rs_slot_axis));
}

/* An ordinary op of the chain, rewritten onto this iteration's views. The
   producer of the reduce-scatter's partials writes the own chunk straight
   into its slot of the partials (no copy before the sum). */
/* A communication moves whole buffers: the chunks of a tensor that one moves
   must be contiguous, so their axis must be outermost among those holding
   data (a view along an inner axis is strided). Known when lowering, so
   every rank refuses alike. */
static int hir__contiguous_chunks(hir__chain *c, const hir_expr *e, const hir_tv *tv, int axis) {
  char why[320];
  if (axis < 0 || hir__outermost(tv, axis)) return 1;
  snprintf(why, sizeof why, "its communication would move chunks of %s along axis %d, which axes before it split "
           "into strided pieces; stream-parallelize the outermost axis that holds data", hir__label(tv).text, axis);
  return hir__stream_fail(c->p, e, why);
}

static int hir__stream_op(hir__chain *c, const hir_expr *e) {
  hir_fusion *f = &c->p->ir;
  hir_tv *ins[HIR__MAX_OPERANDS], *out, *slot;
  hir_expr *ite;
  int s = hir__stream_axis(e->out[0]), cut = s < -1 ? -1 : hir__cut_axis(e->out[0], s), k, j, moves = hir_expr_is_resharding(e);
  if (hir__ops[e->kind].flags & HIR__OP_WHOLE)
    return hir__stream_fail(c->p, e, "it runs whole (a select, slice, reshape or random numbers), not chunk by chunk; give its "
                            "output no Stream axis (a Stream axis of what reads it is taken)");
  for (k = 0; c->collective && s < 0 && k < e->nin; k++) { /* a reduce-scatter's output has no Stream axis: cut where its input is */
    int map[HIR_MAX_DIMS], in_s = hir__stream_axis(e->in[k]), in_cut = in_s >= 0 ? hir__cut_axis(e->in[k], in_s) : -1;
    if (in_s < 0) continue;
    hir__axis_map(e, k, map);
    cut = in_cut >= 0 ? map[in_cut] : -1;
    break;
  }
  moves = moves && !c->collective; /* collective mode: the evaluator stages strided parts */
  if (!hir__same_cut(c, e, e->out[0], cut, 1) || (moves && !hir__contiguous_chunks(c, e, e->out[0], s))) return 0;
  for (k = 0; k < e->nin; k++) {
    int map[HIR_MAX_DIMS], axis = -1, in_cut = -1;
    hir__axis_map(e, k, map);
    for (j = 0; j < e->in[k]->ndims; j++) {
      if (map[j] == s) axis = j;
      if (cut >= 0 && map[j] == cut) in_cut = j;
    }
    if (!hir__same_cut(c, e, e->in[k], in_cut, 0) || (moves && !hir__contiguous_chunks(c, e, e->in[k], axis))) return 0;
    if (axis >= 0 && hir__split_axis(e->in[k], axis) && !c->collective) {
      char why[400];
      snprintf(why, sizeof why, "it reads %s chunk by chunk along its %s axis, of which each device holds one slice; "
               "only a set onto the same devices (a P2P allgather) or a sum over that axis (a P2P reduce-scatter), "
               "along one mesh axis, streams over a split axis", hir__label(e->in[k]).text, hir__ptype_labels[e->in[k]->ids[axis]->ptype]);
      return hir__stream_fail(c->p, e, why);
    }
    ins[k] = axis >= 0 ? hir__chunk_part(c, e->in[k], axis, in_cut) : hir__part_of(c, NULL, e->in[k], in_cut);
    if (!ins[k]) return 0;
  }
  if (!(out = hir__chunk_part(c, e->out[0], s, cut))) return 0;
  for (k = 0; k < e->nin && e->in[k] != c->ag_read_in_place; k++) {}
  if (k < e->nin) { /* the own step reads the allgather's input where the gathered chunk would be */
    hir_tv *own_ins[HIR__MAX_OPERANDS], *own;
    hir_expr *sel;
    if (!(ite = hir__new_expr(f, HIR_EXPR_IF_THEN_ELSE, 0, 0)) ||
        !(sel = hir__alias_view(f, c->ag_input, c->ag_in_axis, hir__const(f, 0), 0)) || !hir__append(&ite->body, sel) ||
        !(own = hir__part_of(c, &ite->body, sel->out[0], c->ag_in_cut - (c->ag_in_cut > c->ag_in_axis))))
      return 0;
    for (j = 0; j < e->nin; j++) own_ins[j] = e->in[j] == c->ag_read_in_place ? own : ins[j];
    ite->val = c->ag_mine;
    return hir__append(&ite->body, hir__clone_onto(f, e, own_ins, out, s)) &&
           hir__append(&ite->orelse, hir__clone_onto(f, e, ins, out, s)) && hir__append(c->body, ite);
  }
  if (e->out[0] != c->rs_input_in_slots) return hir__append(c->body, hir__clone_onto(f, e, ins, out, c->collective ? -1 : s));
  if (!(ite = hir__new_expr(f, HIR_EXPR_IF_THEN_ELSE, 0, 0)) || !(slot = hir__rs_slot(c, &ite->body, c->pos_val))) return 0;
  ite->val = c->own_step;
  return hir__append(&ite->body, hir__clone_onto(f, e, ins, slot, s)) &&
         hir__append(&ite->orelse, hir__clone_onto(f, e, ins, out, s)) && hir__append(c->body, ite);
}

/* The P2P allgather: the chunk of peer mesh[c] lands in out's slice c. */
static int hir__stream_allgather(hir__chain *c, const hir_expr *e, int in_axis) {
  hir_program *p = c->p;
  hir_fusion *f = &p->ir;
  hir_tv *in = e->in[0], *dst, *own, *send;
  int map[HIR_MAX_DIMS], s = hir__stream_axis(e->out[0]), cut = hir__cut_axis(e->out[0], s), in_cut = -1, j;
  int in_place = e->out[0] == c->ag_read_in_place;
  hir_val *chunk_owner = c->ring ? c->step : hir__mesh_at(c, c->chunk);
  hir_val *me = c->ring ? hir__const(f, 0) : hir__named(f, HIR_NAMED_RANK);
  hir_val *mine = hir__scalar(c, HIR_SCALAR_EQ, chunk_owner, me);
  hir_val *ahead = c->swizzle ? hir__scalar(c, HIR_SCALAR_SUB, hir__scalar(c, HIR_SCALAR_ADD, c->pos_val, hir__const(f, c->mesh_size)),
                                                c->step) /* a swizzled ring sends the own chunk to place - i */
                                  : hir__scalar(c, HIR_SCALAR_ADD, c->pos_val, c->step);
  hir_val *to = c->ring ? hir__mesh_at(c, hir__scalar(c, HIR_SCALAR_MOD, ahead, hir__const(f, c->mesh_size)))
                        : hir__mesh_at(c, c->chunk);
  /* my shard's view first, as nvFuser numbers them */
  hir_expr *ite, *end, *sel = in_place ? NULL : hir__alias_view(f, in, in_axis, hir__const(f, 0), 0);
  hir_scope *exchange;
  hir__axis_map(e, 0, map);
  for (j = 0; j < in->ndims; j++)
    if (cut >= 0 && map[j] == cut) in_cut = j;
  if (!hir__same_cut(c, e, e->out[0], cut, 1) || !hir__contiguous_chunks(c, e, e->out[0], s)) return 0;
  if ((!sel && !in_place) || !(dst = hir__chunk_part(c, e->out[0], s, cut)) || !(send = hir__part_of(c, NULL, in, in_cut)) ||
      !mine || !to || !(ite = hir__new_expr(f, HIR_EXPR_IF_THEN_ELSE, 0, 0)))
    return 0;
  if (in_place) { /* its readers take the own chunk from `in` (hir__stream_op): only the others' steps exchange */
    c->ag_input = in, c->ag_in_axis = in_axis, c->ag_in_cut = in_cut, c->ag_mine = mine;
    exchange = &ite->body;
    if (!(ite->val = hir__scalar(c, HIR_SCALAR_NE, chunk_owner, me))) return 0;
  } else {
    exchange = &ite->orelse;
    ite->val = mine;
    if (!hir__append(&ite->body, sel) || !(own = hir__part_of(c, &ite->body, sel->out[0], in_cut - (in_cut > in_axis))) ||
        !hir__append(&ite->body, hir__host_compute(p, HIR_EXPR_LOAD_STORE, 0, dst, own, NULL, "stream lowering")))
      return 0;
  }
  if (!hir__append(exchange, hir_host_start_coalescing(p)) ||
      !hir__append(exchange, hir_host_p2p(p, HIR_P2P_RECV, dst, hir__mesh_at(c, c->chunk))) ||
      !hir__append(exchange, hir_host_p2p(p, HIR_P2P_SEND, send, to)) ||
      !hir__append(exchange, end = hir_host_end_coalescing(p)) || !hir__append(exchange, hir_host_wait(p, end)))
    return 0;
  return hir__append(c->body, ite);
}

/* Whether the readers of a P2P allgather's output can take the own chunk
   from the allgather's input instead of from a copy of it in the output:
   the output is an intermediate only this chain uses, and every reader
   reads it chunk by chunk along the loop's axis. Then the own step copies
   nothing, which otherwise delays that step's GEMM and takes memory
   bandwidth from the exchange beside it (stream.experimental.copy_own_chunk). The ring
   only: the linear schedule copies, as nvFuser's programs do (and
   column_parts, which cuts the matmuls of the loop's body, finds them
   there). */
static int hir__ag_in_place(const hir__chain *c, const hir_expr *ag, const int *first, const int *last, int at) {
  const hir_tv *g = ag->out[0];
  int k, q, j, s = hir__stream_axis(g);
  if (!c->ring || c->opt->experimental.copy_own_chunk || c->opt->experimental.column_parts > 1 || c->p2p != HIR__P2P_ALLGATHER || g->is_output ||
      first[g->name] < at || last[g->name] >= at + c->n)
    return 0;
  for (k = 0; k < c->n; k++) {
    const hir_expr *e = c->exprs[k];
    int map[HIR_MAX_DIMS], out_s = hir__stream_axis(e->out[0]);
    for (q = 0; q < e->nin; q++) {
      if (e->in[q] != g) continue;
      if (out_s < 0 || hir_expr_is_resharding(e)) return 0;
      hir__axis_map(e, q, map);
      for (j = 0; j < g->ndims && map[j] != out_s; j++) {}
      if (j != s) return 0;
    }
  }
  return 1;
}

/* The P2P reduce-scatter's buffer: shaped like the output with the reduced
   axis kept, a slot per mesh position, for the partials of the own chunk.
   The ring makes it before the chain's ops: when only the reduce-scatter
   reads its input (not a program output, not used outside the chain), the
   input's producer writes the own chunk straight into the own slot
   (hir__stream_op). The linear schedule makes it at the reduce-scatter and
   copies the own chunk there, as nvFuser's programs do. */
static int hir__stream_rs_slots(hir__chain *c, const hir_expr *e, const int *first, const int *last, int at) {
  hir_fusion *f = &c->p->ir;
  const hir_tv *in = e->in[0], *out = e->out[0];
  int map[HIR_MAX_DIMS], q, k, readers = 0, cut = hir__cut_axis(in, hir__stream_axis(in));
  if (c->rs_slots) return 1;
  if (!(c->rs_slots = hir__new_tv(f, out->dtype, HIR_MEM_GLOBAL, out->ndims))) return 0;
  hir__axis_map(e, 0, map);
  c->rs_slot_axis = map[hir__shard_axis(in, hir__moving_ptype(e, NULL))];
  c->rs_cut_axis = cut >= 0 ? map[cut] : -1;
  for (q = 0; q < out->ndims; q++)
    if (!(c->rs_slots->ids[q] = hir__clone_id(f, out->ids[q], 1))) return 0;
  c->rs_slots->ids[c->rs_slot_axis]->iter = HIR_ITERATION;
  hir__share_mesh(c->rs_slots, out);
  c->own_step = c->ring ? hir__scalar(c, HIR_SCALAR_EQ, c->step, hir__const(f, c->mesh_size - 1)) /* the ring's own chunk is last */
                        : hir__scalar(c, HIR_SCALAR_EQ, hir__mesh_at(c, c->chunk), hir__named(f, HIR_NAMED_RANK));
  for (k = 0; k < c->n; k++)
    for (q = 0; q < c->exprs[k]->nin; q++) readers += c->exprs[k]->in[q] == in;
  c->rs_input_in_slots =
      c->ring && !in->is_output && readers == 1 && first && first[in->name] >= at && last[in->name] < at + c->n ? in : NULL;
  return c->own_step && hir__push(f, &c->allocs, c->rs_slots);
}

/* The P2P reduce-scatter: each step sends this device's partial of chunk c
   to its owner mesh[c] and receives a partial of its own chunk into its
   slot of the partials; after the loop one local sum over the slots. */
static int hir__stream_reduce_scatter(hir__chain *c, const hir_expr *e, int in_axis) {
  hir_program *p = c->p;
  hir_fusion *f = &p->ir;
  int cut = hir__cut_axis(e->in[0], in_axis), q;
  hir_tv *out = e->out[0], *slot, *part;
  hir_expr *ite, *sum, *end;
  hir_scope *others;            /* the steps of the peers' chunks */
  if (!hir__same_cut(c, e, e->in[0], cut, 0) || !hir__contiguous_chunks(c, e, e->in[0], in_axis) ||
      !(part = hir__chunk_part(c, e->in[0], in_axis, cut)) ||
      !hir__stream_rs_slots(c, e, NULL, NULL, 0) || !(ite = hir__new_expr(f, HIR_EXPR_IF_THEN_ELSE, 0, 0)))
    return 0;
  if (c->rs_input_in_slots) { /* nothing to do at the own step: IF not mine */
    ite->val = hir__scalar(c, HIR_SCALAR_NE, c->step, hir__const(f, c->mesh_size - 1));
    others = &ite->body;
  } else {
    ite->val = c->own_step;
    others = &ite->orelse;
  }
  if (!ite->val) return 0;
  if (!c->rs_input_in_slots && /* my own partial goes into my slot */
      (!(slot = hir__rs_slot(c, &ite->body, c->pos_val)) ||
       !hir__append(&ite->body, hir__host_compute(p, HIR_EXPR_LOAD_STORE, 0, slot, part, NULL, "stream lowering"))))
    return 0;
  if (c->ring) { /* step i: send chunk pos+i+1, receive from pos-i-1 */
    hir_val *back = hir__scalar(c, HIR_SCALAR_ADD, c->pos_val, hir__const(f, c->mesh_size - 1));
    hir_val *from = hir__scalar(c, HIR_SCALAR_MOD, hir__scalar(c, HIR_SCALAR_SUB, back, c->step), hir__const(f, c->mesh_size));
    if (!(slot = hir__rs_slot(c, others, from)) || !hir__append(others, hir_host_start_coalescing(p)) ||
        !hir__append(others, hir_host_p2p(p, HIR_P2P_RECV, slot, hir__mesh_at(c, from))) ||
        !hir__append(others, hir_host_p2p(p, HIR_P2P_SEND, part, hir__mesh_at(c, c->chunk))))
      return 0;
  } else { /* step i: everybody sends chunk i to its owner, who receives from all */
    hir_scope *then = &ite->body;
    int view = then->exprs.n, per_slot;
    if (c->pos >= c->mesh_size) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "stream lowering: the linear P2P reduce-scatter needs the program's device; lower "
                "with hir_lower, or use the ring schedule");
      return 0;
    }
    for (q = 0; q < c->mesh_size; q++) /* the owner receives every other position's partial */
      if (q != c->pos && !hir__rs_slot(c, then, hir__const(f, q))) return 0;
    per_slot = c->mesh_size > 1 ? (then->exprs.n - view) / (c->mesh_size - 1) : 1; /* a slot's views: select, maybe cut */
    if (!hir__append(then, hir_host_start_coalescing(p))) return 0;
    for (q = 0; q < c->mesh_size; q++) {
      if (q == c->pos) continue;
      view += per_slot;
      slot = ((hir_expr *)then->exprs.items[view - 1])->out[0];
      if (!hir__append(then, hir_host_p2p(p, HIR_P2P_RECV, slot, hir__const(f, c->mesh[q])))) return 0;
    }
    if (!hir__append(then, end = hir_host_end_coalescing(p)) || !hir__append(then, hir_host_wait(p, end)) ||
        !hir__append(others, hir_host_start_coalescing(p)) ||
        !hir__append(others, hir_host_p2p(p, HIR_P2P_SEND, part, hir__mesh_at(c, c->chunk))))
      return 0;
  }
  if (!hir__append(others, end = hir_host_end_coalescing(p)) || !hir__append(others, hir_host_wait(p, end)) ||
      !hir__append(c->body, ite))
    return 0;
  if (!(sum = hir__new_expr(f, HIR_EXPR_REDUCTION, 1, 1))) return 0; /* out = sum over the slots, after the loop */
  sum->in[0] = c->rs_slots;
  sum->out[0] = out;
  return hir__push(f, &c->after, sum);
}

/* Lowers one chain into [Allocates, GetCurrentStream, sync loop, main loop,
   what follows the loop] appended to `out`. `uses_first/last` give each
   tensor's top-level use span; the chain occupies [at, at + n). */
static int hir__lower_chain(hir__chain *c, hir__vec *out, const int *first, const int *last, int at) {
  hir_program *p = c->p;
  hir_fusion *f = &p->ir;
  hir_stream *caller, *pool;
  hir_expr *sync, *loop;
  int k, t, a;
  hir_id *id = c->id;
  c->collective = c->p2p && c->opt->collective_chunks > 1; /* its exchanges become collectives: no P2P schedule */
  if (c->collective) c->p2p = HIR__P2P_NONE;
  for (k = 0; c->p2p && k < c->n; k++) { /* what one loop cannot order alike on every rank */
    const hir_expr *x = c->exprs[k];
    int kind = hir__p2p_kind(x, &a);
    if (kind == HIR__P2P_NONE && hir_expr_is_resharding(x)) {
      char why[400];
      snprintf(why, sizeof why, "chunks of %s would move by a collective in a loop whose P2P exchanges meet each peer at "
               "another step, so ranks would reach the collective out of step (a deadlock, or chunks paired wrong); "
               "place it where its consumer is, or drop the Stream axis", hir__label(x->in[0]).text);
      return hir__stream_fail(p, x, why);
    }
    if (kind != HIR__P2P_NONE) {
      int n;
      const int *team = hir__p2p_team(p, x, &n);
      if (!team) return 0;
      if (n != c->mesh_size || memcmp(team, c->mesh, (size_t)n * sizeof(int)) != 0)
        return hir__stream_fail(p, x, "its P2P exchange orders the devices unlike another exchange of the same loop (another "
                                "mesh order, or another axis of a 2-D mesh); give both one mesh");
    }
  }
  c->i = c->step = hir__named(f, HIR_NAMED_STREAM_IDX);
  c->slot = hir__scalar(c, HIR_SCALAR_MOD, c->i, hir__named(f, HIR_NAMED_NUM_STREAMS));
  c->cut_option = "parts";
  c->parts_per_peer = c->collective ? c->opt->collective_chunks : c->p2p && c->opt->chunks_per_peer > 1 ? c->opt->chunks_per_peer : 1;
  if (c->collective) { /* iteration i: part i of every peer's chunk, moved by one collective */
    c->part_index = c->i;
    if (!(id = hir__new_id(f, hir__const(f, c->parts_per_peer), HIR_ITERATION, HIR_STREAM))) return 0;
  } else if (c->parts_per_peer > 1) { /* iteration i: step i % D, part i / D: every round of steps moves the first parts of all chunks */
    hir_val *steps = hir__const(f, c->mesh_size), *n = hir__scalar(c, HIR_SCALAR_MUL, c->id->extent, hir__const(f, c->parts_per_peer));
    c->step = hir__scalar(c, HIR_SCALAR_MOD, c->i, steps);
    c->part_index = hir__scalar(c, HIR_SCALAR_DIV, c->i, steps);
    if (!c->step || !c->part_index || !n || !(id = hir__new_id(f, n, HIR_ITERATION, HIR_STREAM))) return 0;
  }
  c->chunk = c->step;
  c->pos_val = hir__named(f, HIR_NAMED_RANK);
  c->ring = 0;
  for (k = 0, c->swizzle = 0; k < c->n; k++) {
    const hir_expr *x = c->exprs[k];
    for (t = 0; t < x->nin + x->nout; t++) {
      const hir_tv *tv = t < x->nin ? x->in[t] : x->out[t - x->nin];
      int sa = hir__stream_axis(tv);
      c->swizzle |= sa >= 0 && tv->ids[sa]->swizzle != HIR_SERIAL;
    }
  }
  if (c->p2p) {
    int iota = 1;
    for (k = 0; k < c->mesh_size; k++) iota &= c->mesh[k] == k;
    if ((c->pos = hir_team_index(c->mesh, c->mesh_size, p->my_device)) < 0) c->pos = c->mesh_size; /* a program for any rank */
    if (!iota) c->pos_val = hir__const(f, c->pos); /* this device's position in the mesh */
    c->ring = c->opt->ring || c->swizzle;
    if (c->swizzle && c->p2p != HIR__P2P_ALLGATHER)
      return hir__stream_fail(p, c->exprs[0], "its Stream axis is swizzled (hir_swizzle1d), which only a P2P allgather's "
                              "or a loop that moves nothing takes; drop the swizzle and ask for HIR_SCHEDULE_RING");
    if (c->swizzle) /* receive chunk pos + i from its owner */
      c->chunk = hir__scalar(c, HIR_SCALAR_MOD, hir__scalar(c, HIR_SCALAR_ADD, c->pos_val, c->step), hir__const(f, c->mesh_size));
    else if (c->ring && c->p2p == HIR__P2P_ALLGATHER) /* receive from pos - i */
      c->chunk = hir__scalar(c, HIR_SCALAR_MOD,
                             hir__scalar(c, HIR_SCALAR_SUB, hir__scalar(c, HIR_SCALAR_ADD, c->pos_val, hir__const(f, c->mesh_size)), c->step),
                             hir__const(f, c->mesh_size));
    else if (c->ring) /* compute and send chunk pos + i + 1: the own chunk last, so no transfer is left at the end */
      c->chunk = hir__scalar(c, HIR_SCALAR_MOD,
                             hir__scalar(c, HIR_SCALAR_ADD,
                                         iota ? hir__scalar(c, HIR_SCALAR_ADD, c->pos_val, hir__const(f, 1)) : hir__const(f, c->pos + 1),
                                         c->step),
                             hir__const(f, c->mesh_size));
  }
  if (c->swizzle && !c->p2p) { /* moves nothing: iteration i takes chunk (i + place) % extent */
    const hir_tv *tv = c->exprs[0]->out[0];
    int place = hir_team_index(tv->mesh, tv->mesh_size, p->my_device);
    if (!tv->mesh_size || tv->mesh_cols)
      return hir__stream_fail(p, c->exprs[0], "its Stream axis is swizzled (hir_swizzle1d) by the place on a mesh, and its "
                              "tensor has no 1-D mesh; give it one (hir_set_mesh)");
    c->chunk = hir__scalar(c, HIR_SCALAR_MOD, hir__scalar(c, HIR_SCALAR_ADD, c->step, hir__const(f, place > 0 ? place : 0)),
                           c->id->extent);
  }
  if (!c->slot || !c->chunk || !c->pos_val) return 0;
  for (k = 0; k < c->n; k++) { /* the full buffers the loop writes into, allocated before it */
    const hir_expr *e = c->exprs[k];
    int s = hir__stream_axis(e->out[0]);
    if (s < 0 && !c->collective) continue; /* collectives: a reduce-scatter's output is written part by part too */
    if (c->opt->bounded_buffers && !c->collective && !e->out[0]->is_output && first[e->out[0]->name] >= at &&
        last[e->out[0]->name] < at + c->n) {
      /* only this loop uses it: numberOfStreams slices, slot k used on stream k only, so reuse is in order */
      const hir_id *id = e->out[0]->ids[s];
      hir_val *ns = hir__named(f, HIR_NAMED_NUM_STREAMS);
      if (!ns || !(e->out[0]->ids[s] = hir__new_id(f, ns, id->iter, id->ptype))) return 0;
      c->bounded[e->out[0]->name] = 1;
    }
    if (!hir__push(f, &c->allocs, e->out[0])) return 0;
  }
  if (!(loop = hir__new_expr(f, HIR_EXPR_FOR_LOOP, 0, 0)) || !(sync = hir__new_expr(f, HIR_EXPR_FOR_LOOP, 0, 0))) return 0;
  loop->id = sync->id = id;
  loop->val = sync->val = c->i;
  c->body = &loop->body;
  if (!(caller = hir_stream_new(p)) || !(pool = hir_stream_indexed(p, c->slot))) return 0;
  if (!hir__append(c->body, hir_host_set_current_stream(p, pool))) return 0;
  c->rs_slots = NULL;
  c->rs_input_in_slots = NULL;
  c->ag_read_in_place = NULL;
  for (k = 0; k < c->n && !c->ag_read_in_place; k++)
    if (hir__p2p_kind(c->exprs[k], &a) == HIR__P2P_ALLGATHER && hir__ag_in_place(c, c->exprs[k], first, last, at))
      c->ag_read_in_place = c->exprs[k]->out[0];
  for (k = 0; k < c->n; k++)
    if (c->ring && hir__p2p_kind(c->exprs[k], &a) == HIR__P2P_REDUCE_SCATTER && !hir__stream_rs_slots(c, c->exprs[k], first, last, at))
      return 0;
  for (k = 0; k < c->n; k++) {
    const hir_expr *e = c->exprs[k];
    int kind = c->collective ? HIR__P2P_NONE : hir__p2p_kind(e, &a), ok;
    ok = kind == HIR__P2P_ALLGATHER ? hir__stream_allgather(c, e, a)
         : kind == HIR__P2P_REDUCE_SCATTER ? hir__stream_reduce_scatter(c, e, a)
                                           : hir__stream_op(c, e);
    if (!ok) return 0;
  }
  if (!hir__append(c->body, hir_host_set_current_stream(p, caller)) || !hir__append(c->body, hir_host_synchronize(p, pool)))
    return 0;
  for (t = 0; t < c->allocs.n; t++) {
    hir_expr *alloc = hir__new_expr(f, HIR_EXPR_ALLOCATE, 1, 0);
    if (!alloc || !hir__push(f, out, alloc)) return 0;
    alloc->in[0] = (hir_tv *)c->allocs.items[t];
  }
  { /* every pool stream first waits for the caller's stream */
    hir_expr *get = hir_host_get_current_stream(p, caller);
    if (!get || !hir__push(f, out, get)) return 0;
    if (!hir__append(&sync->body, hir_host_set_current_stream(p, pool)) || !hir__append(&sync->body, hir_host_synchronize(p, caller)))
      return 0;
  }
  if (!hir__push(f, out, sync) || !hir__push(f, out, loop)) return 0;
  for (t = 0; t < c->after.n; t++)
    if (!hir__push(f, out, c->after.items[t])) return 0;
  return 1;
}

/* An allgather and a reduce-scatter never share a P2P loop: in the linear
   schedule a pair of ranks meets for the allgather at two different steps
   (each at the other's) but for the reduce-scatter at one, so their
   messages would cross, paired wrong where their sizes agree. */
static int hir__p2p_mixed(int kinds) { return (kinds & HIR__P2P_ALLGATHER) && (kinds & HIR__P2P_REDUCE_SCATTER); }

/* Whether x cannot read, chunk by chunk in the loop of chain[0..n), what
   the chain writes: a P2P reduce-scatter's sum (it runs after the loop), or
   a tensor x reads along another axis than the one the loop writes it by
   (a permuted operand: chunk i of x needs every chunk of it). Such an x
   starts a chain of its own, after the whole tensor is there. */
static int hir__reads_after_loop(const hir_expr *x, hir_expr *const *chain, int n) {
  int k, q, a, j, map[HIR_MAX_DIMS], out_axis = x->nout ? hir__stream_axis(x->out[0]) : -1;
  for (k = 0; k < n; k++)
    for (q = 0; q < x->nin; q++) {
      if (x->in[q] != chain[k]->out[0]) continue;
      if (hir__p2p_kind(chain[k], &a) == HIR__P2P_REDUCE_SCATTER) return 1;
      if (out_axis < 0 || hir__p2p_kind(x, &a) != HIR__P2P_NONE) continue; /* the P2P ops cut their own operands */
      hir__axis_map(x, q, map);
      for (j = 0; j < x->in[q]->ndims && map[j] != out_axis; j++) {}
      if (j != hir__stream_axis(x->in[q])) return 1;
    }
  return 0;
}

static hir_status hir__stream_lowering(hir_program *p, const hir__stream_plan *opt);
HIRDEF hir_status hir_pass_stream_lowering(hir_program *p, const hir_stream_desc *desc) {
  hir_stream_desc filled = hir__stream_desc_filled(desc);
  hir__stream_plan plan;
  if (!p) return HIR_ERR_INVALID;
  if (p->ir.status != HIR_OK) return p->ir.status;
  if (!hir__stream_plan_of(&p->ir, &filled, &plan)) return p->ir.status;
  return hir__stream_lowering(p, &plan);
}

static hir_status hir__stream_lowering(hir_program *p, const hir__stream_plan *opt) {
  hir_fusion *f = &p->ir;
  hir__vec out = {NULL, 0, 0};
  hir__chain c;
  int *first = NULL, *last = NULL, i, j, k, ok = 0, nt, seen;
  for (i = 0; i < f->inputs.n; i++) {
    const hir_tv *tv = (const hir_tv *)f->inputs.items[i];
    if (hir__stream_axis(tv) != -1) {
      hir__fail(f, HIR_ERR_UNSUPPORTED, "stream lowering: T%d is a program input with a Stream axis; inputs arrive whole, so "
                "stream-parallelize a tensor computed from it instead", tv->name);
      return f->status;
    }
  }
  nt = f->next_tv;
  memset(&c, 0, sizeof c);
  first = (int *)HIR_MALLOC(((size_t)nt + 1) * sizeof(int));
  last = (int *)HIR_MALLOC(((size_t)nt + 1) * sizeof(int));
  c.bounded = (unsigned char *)HIR_MALLOC((size_t)nt + 1);
  c.cut_axis_of = (unsigned char *)HIR_MALLOC((size_t)nt + 1);
  c.exprs = (hir_expr **)HIR_MALLOC(((size_t)p->top.exprs.n + 1) * sizeof(hir_expr *));
  if (!first || !last || !c.bounded || !c.cut_axis_of || !c.exprs) {
    hir__fail(f, HIR_ERR_NOMEM, "stream lowering: out of memory");
    goto done;
  }
  memset(c.bounded, 0, (size_t)nt + 1);
  memset(c.cut_axis_of, 0, (size_t)nt + 1);
  hir__use_span(&p->top, first, last, nt);
  for (i = 0; i < p->top.exprs.n; i = j) {
    hir_expr *e = (hir_expr *)p->top.exprs.items[i];
    hir_id *id = hir__stream_id(e);
    int a;
    for (k = 0; k < e->nout; k++)
      if (e->out[k] && hir__stream_axis(e->out[k]) == -2) {
        hir__stream_fail(p, e, "the Stream axis is a reduction axis; stream-parallelize an iteration axis");
        goto done;
      }
    if (e->kind == HIR_EXPR_POST_ON_STREAM)
      for (k = 0; k < e->nout; k++)
        if (hir__stream_axis(e->out[k]) >= 0) {
          hir__stream_fail(p, e, "a PostOnStream (HostUnit) cannot be stream-lowered; make the op standalone or drop the Stream axis");
          goto done;
        }
    j = i + 1;
    if (!id) { /* not streamed: stays at top level and ends a chain */
      if (!hir__push(f, &out, e)) goto done;
      continue;
    }
    memset(&c.allocs, 0, sizeof c.allocs);
    memset(&c.after, 0, sizeof c.after);
    memset(&c.slices, 0, sizeof c.slices);
    c.p = p;
    c.opt = opt;
    c.id = id;
    c.n = 0;
    c.p2p = HIR__P2P_NONE;
    c.mesh = NULL;
    c.mesh_size = 0;
    for (j = i, seen = 0; j < p->top.exprs.n; j++) { /* the chain: neighbours streaming over one extent */
      hir_expr *x = (hir_expr *)p->top.exprs.items[j];
      hir_id *xid = hir__stream_id(x);
      const int *team = NULL;
      int kind, skipped = 0, nteam = 0;
      if (!xid || xid->extent != id->extent || (j > i && !hir__skipped_in_chain(p, p->top.exprs.items[j - 1], id)) ||
          hir__reads_after_loop(x, c.exprs, c.n))
        break;
      if (j > i && (skipped = hir__skipped_p2p(p, p->top.exprs.items[j - 1], id, &team, &nteam)) < 0) goto done;
      kind = hir__p2p_kind(x, &a);
      if (hir__p2p_mixed(seen | skipped | kind)) break;
      seen |= skipped | kind;
      c.exprs[c.n++] = x;
      if (kind != HIR__P2P_NONE) {
        c.p2p |= kind;
        if (!(c.mesh = hir__p2p_team(p, x, &c.mesh_size))) goto done;
      }
    }
    for (k = 0; k < c.n && !hir_expr_is_resharding(c.exprs[k]); k++) {}
    if (k < c.n) { /* this rank moves data in the loop: it takes the shape the others' P2P exchanges give it */
      int m, kinds;
      for (m = -1; m < c.n; m++) {
        if ((kinds = hir__skipped_p2p(p, m < 0 ? (i ? p->top.exprs.items[i - 1] : NULL) : c.exprs[m], id, &c.mesh, &c.mesh_size)) < 0)
          goto done;
        if (!hir__p2p_mixed(c.p2p | kinds)) c.p2p |= kinds; /* one the others' chain breaks before is not theirs */
      }
    }
    if (!hir__lower_chain(&c, &out, first, last, i)) goto done;
  }
  hir__scope_reset(&p->top, &out);
  ok = 1;
done:
  HIR_FREE(first);
  HIR_FREE(last);
  HIR_FREE(c.bounded);
  HIR_FREE(c.cut_axis_of);
  HIR_FREE(c.exprs);
  if (!ok && f->status == HIR_OK) hir__fail(f, HIR_ERR_NOMEM, "stream lowering: out of memory");
  return f->status;
}

/* stream.experimental.column_parts = S: in a StreamIdx loop, a matmul X x W whose X is
   a chunk of a P2P allgather's gathered tensor G (a receive writes it in
   the loop) computes only the first N/S columns of its output chunk, with
   the first N/S columns of W; after the loop one GEMM a part computes the
   other columns of every row, X whole. At decode-size M a GEMM reads its
   whole weight whatever its rows, so the exchange hides behind the local
   rows' GEMM of one part of the weight, and the weight is read 1 + 1/S
   times on 2 ranks instead of once a chunk (bench/NOTES.md section 42).
   Views only (HirAliasSlice of W and of the output along N): the GEMMs
   take the strided columns through their leading dimension. */
static hir_expr *hir__defined_in(const hir_scope *body, const hir_tv *tv, hir_expr_kind kind) {
  int i;
  for (i = 0; i < body->exprs.n; i++) {
    hir_expr *x = (hir_expr *)body->exprs.items[i];
    if (x->kind == kind && x->nout && x->out[0] == tv) return x;
  }
  return NULL;
}

static int hir__received_in(const hir_scope *s, const hir_tv *tv) {
  int i;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *x = (const hir_expr *)s->exprs.items[i];
    if ((x->kind == HIR_EXPR_P2P_COMMUNICATION && x->sub == HIR_P2P_RECV && x->in[0] == tv) || hir__received_in(&x->body, tv) ||
        hir__received_in(&x->orelse, tv))
      return 1;
  }
  return 0;
}

/* Whether e, in `loop`'s body, is a matmul column_parts cuts: X x W with
   X a chunk of the gathered tensor that a receive of the loop writes, W
   made outside the loop, [K, N] with N whole on this device (not sharded),
   and the output a chunk at X's index (bounded buffers index the gathered
   tensor by slot: not whole after the loop, left alone). Its output's N
   axis, or -1; *of_g, *of_out: the chunks' views. */
static int hir__column_matmul(const hir_expr *loop, const hir_expr *e, hir_expr **of_g, hir_expr **of_out) {
  int j, m_axis, n_axis;
  if (e->kind != HIR_EXPR_MATMUL || e->nin != 2 || e->flags || e->in[1]->ndims != 2 || e->in[1]->ids[1]->ptype != HIR_SERIAL)
    return -1;
  *of_g = hir__defined_in(&loop->body, e->in[0], HIR_EXPR_ALIAS_SELECT);
  *of_out = hir__defined_in(&loop->body, e->out[0], HIR_EXPR_ALIAS_SELECT);
  hir__matmul_out_axes(e, &m_axis, &n_axis);
  if (n_axis < 0 || e->out[0]->ids[n_axis]->ptype != HIR_SERIAL) return -1;
  for (j = 0; j < loop->body.exprs.n; j++) {
    const hir_expr *x = (const hir_expr *)loop->body.exprs.items[j];
    if (x->nout && x->out[0] == e->in[1]) return -1;
  }
  return *of_g && *of_out && (*of_g)->val == (*of_out)->val && hir__received_in(&loop->body, e->in[0]) ? n_axis : -1;
}

/* `loop` into out, each matmul it cuts computing part 0 of the columns,
   the weight's part 0 made before the loop, the other parts after it. */
static int hir__cut_columns(hir_program *p, int parts, hir__vec *out, hir_expr *loop) {
  hir_fusion *f = &p->ir;
  hir__vec body = {NULL, 0, 0}, tail = {NULL, 0, 0};
  int i, k, n_axis;
  for (i = 0; i < loop->body.exprs.n; i++) {
    hir_expr *e = (hir_expr *)loop->body.exprs.items[i], *of_g, *of_out, *w0, *o0;
    if ((n_axis = hir__column_matmul(loop, e, &of_g, &of_out)) >= 0) { /* W [K, N]: its axis 1 cut */
      hir_tv *w = e->in[1];
      if (!(w0 = hir__alias_view(f, w, 1, hir__const(f, 0), parts)) || !hir__push(f, out, w0) ||
          !(o0 = hir__alias_view(f, e->out[0], n_axis, hir__const(f, 0), parts)) || !hir__push(f, &body, o0))
        return 0;
      e->in[1] = w0->out[0];
      e->out[0] = o0->out[0];
      for (k = 1; k < parts; k++) { /* after the loop: part k of the columns, every row */
        hir_tv *whole = of_out->in[0];
        hir_expr *wk = hir__alias_view(f, w, 1, hir__const(f, k), parts), *ok, *mm;
        if (!wk || !(ok = hir__alias_view(f, whole, n_axis + (of_out->axis <= n_axis), hir__const(f, k), parts)) ||
            !(mm = hir__new_expr(f, HIR_EXPR_MATMUL, 2, 1)))
          return 0;
        mm->in[0] = of_g->in[0];
        mm->in[1] = wk->out[0];
        mm->out[0] = ok->out[0];
        if (!hir__push(f, &tail, wk) || !hir__push(f, &tail, ok) || !hir__push(f, &tail, mm)) return 0;
      }
    }
    if (!hir__push(f, &body, e)) return 0;
  }
  hir__scope_reset(&loop->body, &body);
  if (!hir__push(f, out, loop)) return 0;
  for (i = 0; i < tail.n; i++)
    if (!hir__push(f, out, tail.items[i])) return 0;
  return 1;
}

static hir_status hir__column_parts(hir_program *p, int parts) {
  hir_fusion *f = &p->ir;
  hir__vec out = {NULL, 0, 0};
  int i;
  if (f->status != HIR_OK) return f->status;
  if (parts < 0 || parts > 1024) {
    hir__fail(f, HIR_ERR_INVALID, "stream lowering: experimental.column_parts is %d; give 2 to 1024 (0 or 1: off)", parts);
    return f->status;
  }
  for (i = 0; i < p->top.exprs.n; i++) {
    hir_expr *x = (hir_expr *)p->top.exprs.items[i];
    if (!(x->kind == HIR_EXPR_FOR_LOOP ? hir__cut_columns(p, parts, &out, x) : hir__push(f, &out, x))) {
      if (f->status == HIR_OK) hir__fail(f, HIR_ERR_NOMEM, "stream lowering: out of memory");
      return f->status;
    }
  }
  hir__scope_reset(&p->top, &out);
  return HIR_OK;
}

// >>verify
typedef struct hir__verifier {
  const hir_program *p;
  unsigned char *state;   /* by tensor name: 0 undefined, 1 defined, 2 released */
  unsigned char *written; /* by tensor name: an op other than Allocate writes it */
  unsigned char *seen;    /* by expr name */
  char *msg;
  size_t cap;
} hir__verifier;

static int hir__verify_fail(hir__verifier *v, const char *fmt, ...) HIR__PRINTF(2, 3);
static int hir__verify_fail(hir__verifier *v, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->msg, v->cap, fmt, ap);
  va_end(ap);
  return 0;
}

static int hir__verify_read(hir__verifier *v, const hir_expr *e, const hir_tv *tv) {
  if (v->state[tv->name] == 1) return 1;
  if (!v->state[tv->name] && v->p->my_device >= 0 && !hir__in_mesh(tv, v->p->my_device) &&
      (hir_expr_is_resharding(e) || (hir__ops[e->kind].flags & HIR__OP_VIEW) || e->kind == HIR_EXPR_POST_ON_STREAM))
    return 1; /* it lives on other devices: the communication this expr becomes (or reads) brings it, or (a unit of
                 exprs on several meshes) the exprs that read it run where it lives */
  return hir__verify_fail(v, "%s %d reads T%d %s", hir__ops[e->kind].name, e->name, tv->name,
                    v->state[tv->name] ? "after its Deallocate" : "before anything defines or allocates it");
}

static int hir__verify_write(hir__verifier *v, const hir_expr *e, const hir_tv *tv) {
  if (v->state[tv->name] == 2)
    return hir__verify_fail(v, "%s %d writes T%d after its Deallocate", hir__ops[e->kind].name, e->name, tv->name);
  v->state[tv->name] = 1;
  v->written[tv->name] |= e->kind != HIR_EXPR_ALLOCATE;
  return 1;
}

/* What an op's operands must agree on beyond their number: one dtype across a
   compute op or a collective, a matmul's output axes, a binary op's ranks. */
static int hir__verify_operands(hir__verifier *v, const hir_expr *e) {
  const char *kind = hir__ops[e->kind].name;
  int k;
  if (e->kind == HIR_EXPR_UNARY && ((unsigned)e->sub >= HIR_UNARY_COUNT))
    return hir__verify_fail(v, "UnaryOp %d has unknown op %d", e->name, e->sub);
  if (e->kind == HIR_EXPR_MATMUL &&
      e->nin != ((e->flags & HIR__MATMUL_SCALED) ? 4 : 2 + (e->nin == 3 && (e->flags & HIR__MATMUL_LINEAR))))
    return hir__verify_fail(v, "MatmulOp %d has %d inputs; a matmul has 2, a linear 2 or 3 (with its bias), a scaled linear 4",
                            e->name, e->nin);
  if (((hir__ops[e->kind].flags & HIR__OP_TEAM) && !(hir__ops[e->kind].flags & HIR__OP_ROUTES)) ||
      ((hir__ops[e->kind].flags & HIR__OP_COMPUTE) && e->kind != HIR_EXPR_UNARY && e->kind != HIR_EXPR_RNG &&
       !(e->kind == HIR_EXPR_MATMUL && (e->flags & HIR__MATMUL_SCALED))))
    for (k = 0; k < e->nin; k++)
      if (e->in[k]->dtype != e->out[0]->dtype)
        return hir__verify_fail(v, "%s %d reads T%d (%s) into T%d (%s); its operands must share one dtype", kind, e->name,
                                e->in[k]->name, hir_dtype_name(e->in[k]->dtype), e->out[0]->name,
                                hir_dtype_name(e->out[0]->dtype));
  if (e->kind == HIR_EXPR_MATMUL || e->kind == HIR_EXPR_BINARY) {
    hir_id *ids[HIR_MAX_DIMS];
    int na = hir__data_axes(e->in[0], ids), nb = hir__data_axes(e->in[1], ids), no = hir__data_axes(e->out[0], ids);
    if (e->kind == HIR_EXPR_BINARY && (na != no || nb != no))
      return hir__verify_fail(v, "BinaryOp %d: T%d, T%d and T%d have %d, %d and %d axes; they need one number", e->name,
                              e->in[0]->name, e->in[1]->name, e->out[0]->name, na, nb, no);
    if (e->kind == HIR_EXPR_MATMUL) {
      hir__matmul_shape m = hir__matmul_shape_of(e);
      if (na < 1 || nb < 1 || no != m.nbatch + m.has_m + m.has_n)
        return hir__verify_fail(v, "MatmulOp %d: T%d x T%d (%d and %d axes) makes %d axes, but T%d has %d", e->name,
                                e->in[0]->name, e->in[1]->name, na, nb, m.nbatch + m.has_m + m.has_n, e->out[0]->name, no);
    }
  }
  return 1;
}

static int hir__verify_scope(hir__verifier *v, const hir_scope *s, int in_loop) {
  const hir_fusion *f = &v->p->ir;
  int i, k, coalescing = 0;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    const hir__op_info *op = &hir__ops[e->kind];
    const char *kind = op->name;
    if (e->ir != f) return hir__verify_fail(v, "%s %d belongs to another program", kind, e->name);
    if (v->seen[e->name] || e->scope != s) return hir__verify_fail(v, "%s %d is placed twice", kind, e->name);
    v->seen[e->name] = 1;
    if ((op->nin >= 0 && e->nin != op->nin) || (op->nout >= 0 && e->nout != op->nout))
      return hir__verify_fail(v, "%s %d has %d inputs and %d outputs; a %s has %d and %d", kind, e->name, e->nin, e->nout,
                              kind, op->nin, op->nout);
    for (k = 0; k < e->nin + e->nout; k++) {
      const hir_tv *tv = k < e->nin ? e->in[k] : e->out[k - e->nin];
      if (!tv) return hir__verify_fail(v, "%s %d lacks its %s %d", kind, e->name, k < e->nin ? "input" : "output",
                                       k < e->nin ? k : k - e->nin);
      if (tv->ir != f) return hir__verify_fail(v, "%s %d names a tensor of another program", kind, e->name);
    }
    if (!hir__verify_operands(v, e)) return 0;
    if (coalescing && (!(hir__ops[e->kind].flags & HIR__OP_COMM) || e->kind == HIR_EXPR_START_COALESCING ||
                       (hir__ops[e->kind].flags & HIR__OP_ROUTES)))
      return hir__verify_fail(v, "%s %d stands between StartCoalescing and EndCoalescing; only communications may (an MoE op "
                              "is groups and kernels of its own)", kind, e->name);
    switch (e->kind) {
    case HIR_EXPR_DEALLOCATE:
      if (e->in[0]->is_input || e->in[0]->is_output)
        return hir__verify_fail(v, "Deallocate %d releases T%d, a program %s", e->name, e->in[0]->name,
                          e->in[0]->is_input ? "input" : "output");
      if (!hir__verify_read(v, e, e->in[0])) return 0;
      v->state[e->in[0]->name] = 2;
      break;
    case HIR_EXPR_FOR_LOOP: { /* in_loop: inside a StreamIdx loop; loops of their own index nest freely */
      int stream_idx = e->val->kind == HIR__VAL_NAMED;
      if (in_loop && stream_idx)
        return hir__verify_fail(v, "ForLoop %d over StreamIdx is nested in another; one StreamIdx is bound at a time "
                                "(nest loops of their own index: hir_host_for_range)", e->name);
      if (!hir__verify_scope(v, &e->body, in_loop || stream_idx)) return 0;
      break;
    }
    case HIR_EXPR_IF_THEN_ELSE:
      if (!hir__verify_scope(v, &e->body, in_loop) || !hir__verify_scope(v, &e->orelse, in_loop)) return 0;
      break;
    case HIR_EXPR_WAIT:
      if (!v->seen[e->target->name])
        return hir__verify_fail(v, "Wait %d waits on %s %d, which does not come before it: a Wait follows its communication in "
                                "one pass of the program (a loop's Wait cannot take the previous iteration's communication: "
                                "place the Wait after it in the same iteration, on a stream of its own so the next iteration "
                                "runs beside it)", e->name, hir__ops[e->target->kind].name, e->target->name);
      break;
    case HIR_EXPR_START_COALESCING:
      coalescing = 1;
      break;
    case HIR_EXPR_END_COALESCING:
      if (!coalescing) return hir__verify_fail(v, "EndCoalescing %d has no StartCoalescing before it", e->name);
      coalescing = 0;
      break;
    case HIR_EXPR_COMMUNICATION: /* its input may live on another device */
      if (!hir__verify_write(v, e, e->out[0])) return 0;
      break;
    default: /* compute ops, views, PostOnStream, send/recv, Allocate: read ins (or write them), write outs */
      for (k = 0; k < e->nin; k++)
        if (!(hir__writes_inputs(e) ? hir__verify_write(v, e, e->in[k]) : hir__verify_read(v, e, e->in[k]))) return 0;
      for (k = 0; k < e->nout; k++)
        if (!hir__verify_write(v, e, e->out[k])) return 0;
      if (hir__ops[e->kind].flags & HIR__OP_VIEW) v->written[e->in[0]->name] = 1; /* written through the view, maybe */
      break;
    }
  }
  if (coalescing) return hir__verify_fail(v, "StartCoalescing without EndCoalescing in the same scope");
  return 1;
}

/* 1 if p is well formed; else 0 with the reason in msg. */
static int hir__verify(const hir_program *p, char *msg, size_t cap) {
  const hir_fusion *f = &p->ir;
  hir__verifier v;
  int i, ok;
  v.p = p;
  v.msg = msg;
  v.cap = cap;
  v.state = (unsigned char *)HIR_MALLOC((size_t)f->next_tv + 1);
  v.written = (unsigned char *)HIR_MALLOC((size_t)f->next_tv + 1);
  v.seen = (unsigned char *)HIR_MALLOC((size_t)f->next_expr + 1);
  if (!v.state || !v.written || !v.seen) {
    HIR_FREE(v.state);
    HIR_FREE(v.written);
    HIR_FREE(v.seen);
    return hir__verify_fail(&v, "out of memory verifying the program");
  }
  memset(v.state, 0, (size_t)f->next_tv + 1);
  memset(v.written, 0, (size_t)f->next_tv + 1);
  memset(v.seen, 0, (size_t)f->next_expr + 1);
  for (i = 0; i < f->inputs.n; i++) v.state[((const hir_tv *)f->inputs.items[i])->name] = v.written[((const hir_tv *)f->inputs.items[i])->name] = 1;
  ok = hir__verify_scope(&v, &p->top, 0);
  for (i = 0; ok && p->my_device < 0 && i < f->outputs.n; i++) { /* built by hand: an output only allocated would come back unwritten */
    const hir_tv *out = (const hir_tv *)f->outputs.items[i];
    if (!v.written[out->name])
      ok = hir__verify_fail(&v, "T%d, program output %d, is never written: no op placed in the program writes it (append "
                            "hir_tv_definition(T%d), or a hir_host_* op that writes it, to a scope)", out->name, i, out->name);
  }
  HIR_FREE(v.state);
  HIR_FREE(v.written);
  HIR_FREE(v.seen);
  return ok;
}

HIRDEF hir_status hir_program_verify(hir_program *p) {
  char msg[sizeof p->ir.error];
  if (!p) return HIR_ERR_INVALID;
  if (p->ir.status != HIR_OK) return p->ir.status;
  if (hir__verify(p, msg, sizeof msg)) return HIR_OK;
  hir__fail(&p->ir, HIR_ERR_INVALID, "hir_program_verify: %s", msg);
  return p->ir.status;
}

// >>verify_ranks
/* The schedule verifier: every rank's program run symbolically (loops
   unrolled, predicates evaluated with that rank), its collectives and
   coalesced send/recv groups matched across ranks the way the communicators
   would, before anything runs. */
typedef struct hir__sched_op {
  int is_send, peer, matched;
} hir__sched_op;

typedef struct hir__sched_ev {
  int is_group;                 /* a coalesced group of send/recv, else a collective */
  int expr, type, root, team_size, first_op, nops, matched;
  const int *team;
} hir__sched_ev;

typedef struct hir__sched_rank {
  hir__sched_ev *ev;
  int n, cap, pc;
  hir__sched_op *ops;
  int nops, cap_ops;
  hir__env env;
  int open_group;               /* index of the group being filled, -1 outside StartCoalescing */
} hir__sched_rank;

static int hir__sched_push_ev(hir__sched_rank *r, hir__sched_ev ev) {
  if (!hir__grow_heap((void **)&r->ev, &r->cap, r->n + 1, sizeof ev)) return 0;
  r->ev[r->n++] = ev;
  return 1;
}

static int hir__sched_push_op(hir__sched_rank *r, int is_send, int peer) {
  if (!hir__grow_heap((void **)&r->ops, &r->cap_ops, r->nops + 1, sizeof *r->ops)) return 0;
  r->ops[r->nops].is_send = is_send;
  r->ops[r->nops].peer = peer;
  r->ops[r->nops++].matched = 0;
  return 1;
}

/* Records the communication events of one rank's scope. */
static int hir__sched_walk(hir__sched_rank *r, const hir_scope *s, int me) {
  int i;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    hir__sched_ev ev;
    memset(&ev, 0, sizeof ev);
    ev.expr = e->name;
    switch (e->kind) {
    case HIR_EXPR_FOR_LOOP: {
      int64_t n = hir__eval_val(&r->env, e->id->extent), it;
      for (it = 0; it < n; it++) {
        hir__bind_index(&r->env, e->val, it);
        if (!hir__sched_walk(r, &e->body, me)) return 0;
      }
      break;
    }
    case HIR_EXPR_IF_THEN_ELSE:
      if (!hir__sched_walk(r, hir__eval_val(&r->env, e->val) ? &e->body : &e->orelse, me)) return 0;
      break;
    case HIR_EXPR_COMMUNICATION:
    case HIR_EXPR_MOE_DISPATCH:
    case HIR_EXPR_MOE_COMBINE: /* an MoE op: an AllToAll of its team */
      if (hir_team_index(e->team, e->team_size, me) < 0) break; /* not in its team */
      ev.type = e->kind == HIR_EXPR_COMMUNICATION ? e->sub : HIR_COLL_ALLTOALL;
      ev.root = e->root;
      ev.team = e->team;
      ev.team_size = e->team_size;
      if (!hir__sched_push_ev(r, ev)) return 0;
      break;
    case HIR_EXPR_START_COALESCING:
      ev.is_group = 1;
      ev.first_op = r->nops;
      if (!hir__sched_push_ev(r, ev)) return 0;
      r->open_group = r->n - 1;
      break;
    case HIR_EXPR_END_COALESCING:
      r->open_group = -1;
      break;
    case HIR_EXPR_P2P_COMMUNICATION:
    case HIR_EXPR_COLLECTIVE_PERMUTE: { /* a send and a receive: one group, or two ops of the open one */
      int permute = e->kind == HIR_EXPR_COLLECTIVE_PERMUTE, nops = 1 + permute;
      if (permute && hir_team_index(e->team, e->team_size, me) < 0) break;
      if (r->open_group < 0) { /* alone: a group of its own */
        ev.is_group = 1;
        ev.first_op = r->nops;
        ev.nops = nops;
        if (!hir__sched_push_ev(r, ev)) return 0;
      } else {
        r->ev[r->open_group].nops += nops;
      }
      if (!hir__sched_push_op(r, permute || e->sub == HIR_P2P_SEND, (int)hir__eval_val(&r->env, e->val))) return 0;
      if (permute && !hir__sched_push_op(r, 0, (int)hir__eval_val(&r->env, e->recv_peer))) return 0;
      break;
    }
    default: break;
    }
  }
  return 1;
}

static int hir__same_team(const hir__sched_ev *a, const hir__sched_ev *b) {
  return a->team_size == b->team_size && memcmp(a->team, b->team, (size_t)a->team_size * sizeof(int)) == 0;
}

static void hir__sched_describe(const hir__sched_rank *r, int rank, char *buf, size_t cap) {
  const hir__sched_ev *ev = &r->ev[r->pc];
  size_t n;
  int k;
  if (!ev->is_group) {
    n = (size_t)snprintf(buf, cap, "rank %d at Communication %d (%s, team (", rank, ev->expr, hir__collective_names[ev->type]);
    for (k = 0; k < ev->team_size && n < cap; k++) n += (size_t)snprintf(buf + n, cap - n, k ? " %d" : "%d", ev->team[k]);
    if (n < cap) snprintf(buf + n, cap - n, "))");
    return;
  }
  n = (size_t)snprintf(buf, cap, "rank %d at a send/recv group (", rank);
  for (k = 0; k < ev->nops && n < cap; k++) {
    const hir__sched_op *op = &r->ops[ev->first_op + k];
    n += (size_t)snprintf(buf + n, cap - n, "%s%s %s %d", k ? ", " : "", op->is_send ? "send" : "recv", op->is_send ? "to" : "from",
                          op->peer);
  }
  if (n < cap) snprintf(buf + n, cap - n, ")");
}

HIRDEF hir_status hir_verify_schedule(hir_program *const *programs, int nranks, int number_of_streams, char *msg, size_t cap) {
  hir__sched_rank *r;
  hir_status status = HIR_OK;
  int i, k, q, done, progress;
  char tmp[256];
  if (msg && cap) msg[0] = '\0';
  if (!programs || nranks < 1) return HIR_ERR_INVALID;
  if (!(r = (hir__sched_rank *)HIR_MALLOC((size_t)nranks * sizeof *r))) return HIR_ERR_NOMEM;
  memset(r, 0, (size_t)nranks * sizeof *r);
  for (i = 0; i < nranks && status == HIR_OK; i++) {
    const hir_program *p = programs[i];
    const hir_fusion *f;
    if (!p || p->ir.status != HIR_OK) {
      if (msg) snprintf(msg, cap, "hir_verify_schedule: the program of rank %d is %s", i, p ? "in error" : "NULL");
      status = HIR_ERR_INVALID;
      break;
    }
    f = &p->ir;
    r[i].env.sym = (int64_t *)HIR_MALLOC(((size_t)f->next_val + 1) * sizeof(int64_t));
    r[i].env.sym_bound = (unsigned char *)HIR_MALLOC((size_t)f->next_val + 1);
    if (!r[i].env.sym || !r[i].env.sym_bound) {
      status = HIR_ERR_NOMEM;
      break;
    }
    for (k = 0; k <= f->next_val; k++) r[i].env.sym[k] = 3; /* any extent but a DIDx one: the schedule does not depend on it */
    memset(r[i].env.sym_bound, 1, (size_t)f->next_val + 1);
    for (k = 0; k < f->tvs.n; k++) { /* a DIDx or DIDy axis has its mesh axis's size as extent */
      const hir_tv *tv = (const hir_tv *)f->tvs.items[k];
      int q;
      for (q = 0; q < 2; q++) {
        int d = hir__did_axis(tv, q ? HIR_DIDY : HIR_DIDX);
        if (d >= 0 && tv->mesh_size && tv->ids[d]->extent->kind == HIR__VAL_SYMBOL)
          r[i].env.sym[tv->ids[d]->extent->name] = hir__shards(tv, tv->ids[d]->ptype);
      }
    }
    r[i].env.named[HIR_NAMED_RANK] = i;
    r[i].env.named[HIR_NAMED_NUM_STREAMS] = number_of_streams > 0 ? number_of_streams : 4;
    r[i].open_group = -1;
    if (!hir__sched_walk(&r[i], &p->top, i)) status = HIR_ERR_NOMEM;
  }
  for (progress = 1; status == HIR_OK && progress;) {
    progress = 0;
    for (i = 0; i < nranks && status == HIR_OK; i++) {
      hir__sched_ev *ev;
      if (r[i].pc >= r[i].n) continue;
      ev = &r[i].ev[r[i].pc];
      if (!ev->is_group) { /* a collective: every member must be at it */
        int ready = 1;
        for (k = 0; k < ev->team_size && ready; k++) {
          int m = ev->team[k];
          hir__sched_ev *other;
          if (m < 0 || m >= nranks) {
            if (msg) snprintf(msg, cap, "schedule: Communication %d of rank %d names device %d, outside the %d ranks", ev->expr, i, m, nranks);
            status = HIR_ERR_INVALID;
            break;
          }
          if (r[m].pc >= r[m].n) {
            ready = 0;
            break;
          }
          other = &r[m].ev[r[m].pc];
          if (other->is_group || !hir__same_team(ev, other)) {
            ready = 0;
          } else if (other->type != ev->type || other->root != ev->root) {
            if (msg) snprintf(msg, cap, "schedule mismatch on team of Communication %d: rank %d runs %s (root %d), rank %d runs %s (root %d)",
                              ev->expr, i, hir__collective_names[ev->type], ev->root, m, hir__collective_names[other->type], other->root);
            status = HIR_ERR_COMM;
          }
        }
        if (ready && status == HIR_OK) {
          for (k = 0; k < ev->team_size; k++) r[ev->team[k]].pc++;
          progress = 1;
        }
        continue;
      }
      /* a group: match each op with the opposite op in the peer's current group */
      for (k = 0; k < ev->nops; k++) {
        hir__sched_op *op = &r[i].ops[ev->first_op + k];
        hir__sched_ev *pev;
        int j;
        if (op->matched) continue;
        if (op->peer < 0 || op->peer >= nranks) {
          if (msg) snprintf(msg, cap, "schedule: rank %d %s device %d, outside the %d ranks", i, op->is_send ? "sends to" : "receives from",
                            op->peer, nranks);
          status = HIR_ERR_INVALID;
          break;
        }
        q = op->peer;
        if (r[q].pc >= r[q].n || !(pev = &r[q].ev[r[q].pc])->is_group) continue;
        for (j = 0; j < pev->nops; j++) {
          hir__sched_op *o = &r[q].ops[pev->first_op + j];
          if (!o->matched && o->peer == i && o->is_send != op->is_send) {
            o->matched = op->matched = 1;
            pev->matched++;
            ev->matched++;
            progress = 1;
            break;
          }
        }
      }
      if (ev->matched == ev->nops) {
        r[i].pc++;
        progress = 1;
      }
    }
  }
  for (done = 1, i = 0; i < nranks && status == HIR_OK; i++) done &= r[i].pc >= r[i].n;
  if (status == HIR_OK && !done) {
    size_t n = 0;
    if (msg) n = (size_t)snprintf(msg, cap, "schedule deadlock: no rank can go on:");
    for (i = 0; msg && i < nranks && n < cap; i++)
      if (r[i].pc < r[i].n) {
        hir__sched_describe(&r[i], i, tmp, sizeof tmp);
        n += (size_t)snprintf(msg + n, cap - n, " %s;", tmp);
      }
    status = HIR_ERR_COMM;
  }
  for (i = 0; i < nranks; i++) {
    HIR_FREE(r[i].ev);
    HIR_FREE(r[i].ops);
    HIR_FREE(r[i].env.sym);
    HIR_FREE(r[i].env.sym_bound);
  }
  HIR_FREE(r);
  return status;
}

// >>cost_model
/* The automatic choice between a fusion's pipeline and its serial form, a
   step of hir_lower after the front end: the GEMM flops and resharding
   bytes of the propagated, decomposed fusion counted for the given shapes,
   and the two times predicted. Every rank computes the same numbers from
   the same shapes, so every rank chooses alike. */

/* An extent as the model's shapes make it, or 0 if unknown. */
static int64_t hir__model_extent(const hir__env *env, const hir_val *v) {
  return hir__unbound(env, v) ? 0 : hir__eval_val(env, v);
}

/* The product of tv's extents: of its reduction axes (reduced = 1), or of
   the others as this rank holds them; -1 and a message if one is unknown. */
static int64_t hir__model_numel(hir_program *p, const hir__env *env, const hir_tv *tv, int reduced) {
  int64_t n = 1;
  int a;
  for (a = 0; a < tv->ndims; a++) {
    const hir_id *id = tv->ids[a];
    if ((id->iter == HIR_REDUCTION) != reduced || id->iter == HIR_BROADCAST) continue;
    if (hir__split_axis(tv, a)) continue; /* one shard here */
    if (hir__unbound(env, id->extent)) {
      hir__fail(&p->ir, HIR_ERR_INVALID, "hir_lower (automatic): the size of T%d axis %d does not follow from "
                "input_shapes; give every input's shape", tv->name, a);
      return -1;
    }
    n *= hir__eval_val(env, id->extent);
  }
  return n;
}

/* The sizes of the GEMMs and transfers in p (the front end's output); from
   the user's fusion f the chunk count (the extent of its Stream axes) and
   the largest number of parts that every cut axis of a P2P pipeline divides
   into (*rows: their gcd, 0 when some Stream axis has nothing after it to
   cut). */
static int hir__model(hir_program *p, const hir_fusion *f, const hir__stream_plan *o, double *gemm_s, double *comm_s,
                      int64_t *chunks, int64_t *rows) {
  hir__env env;
  int i, a, k, ok = 1;
  double flops[2] = {0, 0}, bytes = 0; /* GEMM flops in f16/bf16, in f32/f64 */
  memset(&env, 0, sizeof env);
  env.sym = (int64_t *)HIR_MALLOC(((size_t)p->ir.next_val + 1) * sizeof(int64_t));
  env.sym_bound = (unsigned char *)HIR_MALLOC((size_t)p->ir.next_val + 1);
  if (!env.sym || !env.sym_bound) {
    hir__fail(&p->ir, HIR_ERR_NOMEM, "hir_lower (automatic): out of memory");
    ok = 0;
  } else
    memset(env.sym_bound, 0, (size_t)p->ir.next_val + 1);
  if (ok && o->ninput_shapes != p->ir.inputs.n) {
    hir__fail(&p->ir, HIR_ERR_INVALID, "hir_lower (automatic): %d input_shapes given for a fusion of %d inputs",
              o->ninput_shapes, p->ir.inputs.n);
    ok = 0;
  }
  for (i = 0; ok && i < p->ir.inputs.n; i++) { /* bind the extents, as hir_run will */
    const hir_tv *tv = (const hir_tv *)p->ir.inputs.items[i];
    if (tv->nlogical) { /* split axes: the caller's shape is the logical one, a DIDx part's axis this device's part */
      int l;
      if (o->input_shapes[i].ndims != tv->nlogical) {
        hir__fail(&p->ir, HIR_ERR_SHAPE, "hir_lower (automatic): input_shapes[%d] has %d axes; T%d has %d logical axes", i,
                  o->input_shapes[i].ndims, tv->name, tv->nlogical);
        ok = 0;
      }
      for (l = 0; ok && l < tv->nlogical; l++) {
        const hir_val *x = tv->logical_extent[l];
        int64_t whole = o->input_shapes[i].sizes[l];
        for (a = 0; a < tv->ndims; a++)
          if (tv->ids[a]->iter != HIR_REDUCTION && tv->logical_of[a] == l && hir__split_axis(tv, a))
            whole *= hir__shards(tv, tv->ids[a]->ptype);
        if (x->kind == HIR__VAL_SYMBOL && !env.sym_bound[x->name]) env.sym[x->name] = whole, env.sym_bound[x->name] = 1;
      }
      continue;
    }
    for (a = 0, k = 0; ok && a < tv->ndims; a++) {
      const hir_val *x = tv->ids[a]->extent;
      int64_t size;
      if (tv->ids[a]->iter == HIR_REDUCTION) continue;
      if (k >= o->input_shapes[i].ndims) {
        hir__fail(&p->ir, HIR_ERR_SHAPE, "hir_lower (automatic): input_shapes[%d] has %d axes; T%d has more", i,
                  o->input_shapes[i].ndims, tv->name);
        ok = 0;
        break;
      }
      size = o->input_shapes[i].sizes[k++];
      if (hir__split_axis(tv, a)) size = hir__shards(tv, tv->ids[a]->ptype); /* the shard stands for them all */
      if (x->kind == HIR__VAL_SYMBOL && !env.sym_bound[x->name]) env.sym[x->name] = size, env.sym_bound[x->name] = 1;
    }
    if (ok && k != o->input_shapes[i].ndims) {
      hir__fail(&p->ir, HIR_ERR_SHAPE, "hir_lower (automatic): input_shapes[%d] has %d axes; T%d has %d", i,
                o->input_shapes[i].ndims, tv->name, k);
      ok = 0;
    }
  }
  for (i = 0; ok && i < p->ir.exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)p->ir.exprs.items[i];
    if (e->kind == HIR_EXPR_MATMUL) {
      int64_t out = hir__model_numel(p, &env, e->out[0], 0), depth = hir__model_numel(p, &env, e->out[0], 1);
      ok = out >= 0 && depth >= 0;
      flops[hir_dtype_size(e->out[0]->dtype) > 2] += 2.0 * (double)out * (double)depth;
    } else if ((hir__ops[e->kind].flags & HIR__OP_MOVES) && hir_expr_is_resharding(e)) {
      const hir_tv *big = e->kind == HIR_EXPR_LOAD_STORE ? e->out[0] : e->in[0]; /* gathered, or reduced */
      int64_t n = hir__model_numel(p, &env, big, 0);
      const hir_tv *meshed = big->mesh_size > 1 ? big : e->in[0];
      int d = hir__shards(meshed, hir__moving_ptype(e, NULL)); /* the team's size */
      ok = n >= 0;
      if (d > 1) bytes += (double)n * (double)hir_dtype_size(big->dtype) * (d - 1) / d;
    }
  }
  *chunks = 1;
  *rows = -1;
  for (i = 0; ok && i < f->tvs.n; i++) {
    const hir_tv *tv = (const hir_tv *)f->tvs.items[i];
    for (a = 0; a < tv->ndims; a++) {
      int cut = hir__cut_axis(tv, a);
      int64_t n = hir__model_extent(&env, tv->ids[a]->extent), r = cut >= 0 ? hir__model_extent(&env, tv->ids[cut]->extent) : 0;
      if (tv->ids[a]->ptype != HIR_STREAM) continue;
      *chunks = n > *chunks ? n : *chunks;
      if (r <= 0) *rows = 0; /* nothing to cut after this Stream axis */
      else if (*rows < 0) *rows = r;
      else
        while (r > 0 && *rows > 0) { /* gcd; 0 stays */
          int64_t t = *rows % r;
          *rows = r;
          r = t;
        }
    }
  }
  if (*rows < 0) *rows = 0;
  *gemm_s = o->experimental.gemm_flops_per_s > 0 ? (flops[0] + flops[1]) / o->experimental.gemm_flops_per_s : flops[0] / 750e12 + flops[1] / 50e12;
  *comm_s = bytes / (o->experimental.link_bytes_per_s > 0 ? o->experimental.link_bytes_per_s : 300e9);
  HIR_FREE(env.sym);
  HIR_FREE(env.sym_bound);
  return ok;
}

/* The predicted time of the pipeline of `chunks` chunks in `parts` parts
   each: with overlap, all but one part's share of the shorter of GEMM and
   communication hidden. */
static double hir__piped_time(const hir__stream_plan *o, double gemm, double comm, int overlap, int64_t chunks,
                              int64_t parts) {
  double longer = gemm > comm ? gemm : comm, shorter = gemm < comm ? gemm : comm;
  double per_chunk = o->experimental.chunk_overhead_s > 0 ? o->experimental.chunk_overhead_s : 20e-6,
         per_part = o->experimental.part_overhead_s > 0 ? o->experimental.part_overhead_s : 40e-6;
  return (overlap ? longer + shorter / (double)(chunks * parts) : gemm + comm) + (double)chunks * per_chunk +
         (double)(chunks * (parts - 1)) * per_part;
}

/* Chooses, for p after the front end (f: the user's fusion): *serial = 1
   where the serial form is predicted faster (it has *chunks > 1 to lose),
   else the parts a P2P pipeline's peer chunk is cut into, into o (unless
   the caller gave them). The reason goes to p's plan. */
static int hir__choose_pipeline(hir_program *p, const hir_fusion *f, const hir_comm *communicator, hir__stream_plan *o,
                                int64_t *chunks, int *serial) {
  double gemm_s = 0, comm_s = 0, serial_s, piped_s;
  int64_t rows = 0, parts, k;
  int i, a, overlap, p2p = 0, copy_engine = communicator && communicator->p2p_copy_engine;
  char cut[40] = "";
  const char *why, *constants;
  *chunks = 1;
  if (!hir__model(p, f, o, &gemm_s, &comm_s, chunks, &rows)) return 0;
  for (i = 0; i < p->ir.exprs.n; i++) p2p |= hir__p2p_kind((const hir_expr *)p->ir.exprs.items[i], &a) != HIR__P2P_NONE;
  overlap = copy_engine && p2p;
  parts = p2p && o->chunks_per_peer > 1 ? o->chunks_per_peer : 1;
  for (k = 2; overlap && o->chunks_per_peer == 0 && k <= 16; k++) /* the parts the cut axes divide into */
    if (rows % k == 0 && hir__piped_time(o, gemm_s, comm_s, 1, *chunks, k) < hir__piped_time(o, gemm_s, comm_s, 1, *chunks, parts))
      parts = k;
  if (parts > 1) snprintf(cut, sizeof cut, " x %lld parts", (long long)parts);
  why = overlap || *chunks < 2 ? ""
        : !communicator ? "; no overlap assumed: hir_lower_desc.comm is NULL"
        : copy_engine   ? "; no overlap: its communication is collectives, NCCL kernels"
                        : "; no overlap: the communicator's send/recv do not run beside the GEMMs (its p2p_copy_engine is 0)";
  constants = o->experimental.gemm_flops_per_s > 0 && o->experimental.link_bytes_per_s > 0 ? "" : "; times from H200's constants";
  serial_s = hir__piped_time(o, gemm_s, comm_s, 0, 1, 1);
  piped_s = hir__piped_time(o, gemm_s, comm_s, overlap, *chunks, parts);
  *serial = !(*chunks > 1 && piped_s < 0.97 * serial_s);
  if (*serial) {
    snprintf(p->plan, sizeof p->plan, "serial: predicted %.3f ms (pipelined in %lld chunks%s %.3f; GEMM %.3f, communication %.3f%s%s)",
             serial_s * 1e3, (long long)*chunks, cut, piped_s * 1e3, gemm_s * 1e3, comm_s * 1e3, why, constants);
  } else {
    snprintf(p->plan, sizeof p->plan, "pipelined: %lld chunks%s, predicted %.3f ms (serial %.3f; GEMM %.3f, communication %.3f%s)",
             (long long)*chunks, cut, piped_s * 1e3, serial_s * 1e3, gemm_s * 1e3, comm_s * 1e3, constants);
    o->chunks_per_peer = (int)parts;
  }
  return 1;
}

// >>pipeline
enum { HIR__DUMP_HOST_IR = 1, HIR__DUMP_PASSES = 2 };

/* HOSTIR_DUMP=host_ir,passes (or all), comma-separated; an unknown value
   fails hir_lower with the valid ones (as NVFUSER_DUMP does). */
static int hir__dump_flags(hir_program *p, unsigned *flags) {
  static const struct { const char *name; unsigned flags; } values[] = {
      {"host_ir", HIR__DUMP_HOST_IR}, {"passes", HIR__DUMP_PASSES}, {"all", HIR__DUMP_HOST_IR | HIR__DUMP_PASSES}};
  const char *s = getenv("HOSTIR_DUMP");
  *flags = 0;
  while (s && *s) {
    size_t n = strcspn(s, ","), k;
    for (k = 0; k < sizeof values / sizeof values[0] && !(strlen(values[k].name) == n && !strncmp(s, values[k].name, n)); k++) {}
    if (k == sizeof values / sizeof values[0] && n) {
      hir__fail(&p->ir, HIR_ERR_INVALID, "hir_lower: HOSTIR_DUMP has the unknown value '%.*s'; give host_ir, passes "
                "or all, comma-separated (or unset it)", (int)(n < 40 ? n : 40), s);
      return 0;
    }
    if (n) *flags |= values[k].flags;
    s += n + (s[n] == ',');
  }
  return 1;
}

/* One write per program, so the dumps of ranks lowering at once do not
   mix: to stderr, or appended to HOSTIR_DUMP_FILE (created 0600; not
   through a link, and only a regular file of this user). A file that
   cannot be written fails the lowering, naming it. */
static int hir__dump(hir_program *p, const char *what) {
  const char *path = getenv("HOSTIR_DUMP_FILE"), *name;
  size_t n = hir_program_snprint(p, NULL, 0), done = 0;
  char *buf = (char *)HIR_MALLOC(n + 128), why[200] = "";
  int head, dirfd = -1;
  if (!buf) return hir__fail(&p->ir, HIR_ERR_NOMEM, "hir_lower: out of memory for HOSTIR_DUMP"), 0;
  head = snprintf(buf, 128, "=== HOSTIR_DUMP %s (device %d) ===", what, p->my_device);
  hir_program_snprint(p, buf + head, n + 1);
  n += (size_t)head;
  if (!path) {
    fwrite(buf, 1, n, stderr);
  } else if (hir__open_parent(path, &dirfd, &name, why, sizeof why)) {
#if HIR__SAFE_FILES
    struct stat st;
    int fd;
    if ((fd = openat(dirfd, name, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600)) < 0)
      snprintf(why, sizeof why, "%s%s", strerror(errno), errno == ELOOP ? " (a symbolic link, not followed)" : "");
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
      snprintf(why, sizeof why, "not a regular file of this user");
    while (!why[0] && done < n) {
      ssize_t k = write(fd, buf + done, n - done);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) snprintf(why, sizeof why, "%s", k < 0 ? strerror(errno) : "nothing written");
      else done += (size_t)k;
    }
    if (fd >= 0) close(fd);
#endif
  }
  hir__close_dir(dirfd);
  HIR_FREE(buf);
  if (path && (why[0] || done < n))
    return hir__fail(&p->ir, HIR_ERR_INVALID, "hir_lower: HOSTIR_DUMP_FILE '%.200s' cannot be written (%s); name a file this "
                     "user may write, or unset it to dump to stderr", path, why[0] ? why : "not written"), 0;
  return 1;
}

/* After a pass: the verifier (a pass leaving a broken program is our bug),
   then the dump. */
static int hir__pipeline_check(hir_program *p, const char *name, unsigned dump) {
  char msg[sizeof p->ir.error];
  if (p->ir.status != HIR_OK) return 0;
  if (!hir__verify(p, msg, sizeof msg)) {
    hir__fail(&p->ir, HIR_ERR_INTERNAL, "hir_lower: after %s the program is malformed (a hostir bug; please report it): %s",
              name, msg);
    return 0;
  }
  return !(dump & HIR__DUMP_PASSES) || hir__dump(p, name);
}

/* A step that failed without saying why is our bug: never HIR_OK for it. */
static hir_status hir__step_failed(hir_program *p, const char *step) {
  if (p->ir.status == HIR_OK)
    hir__fail(&p->ir, HIR_ERR_INTERNAL, "hir_lower: %s failed without a reason (a hostir bug; please report it)", step);
  return p->ir.status;
}

/* Why hir__lower runs: for the caller; for the automatic choice, to see
   whether the serial form lowers; for the verdict of another device's
   program (hir__common_verdict). Only the caller's dumps and gets a verdict. */
enum { HIR__LOWER_CALLER, HIR__LOWER_SERIAL_FORM, HIR__LOWER_OTHER_DEVICE };

/* The devices of the fusion's meshes, ascending, when some group does not
   involve one of them, or this device is none of them (a device's program
   then lacks exprs another's has, and may refuse what that one accepts, or
   the other way round); else none. */
static int *hir__devices_apart(const hir_program *p, const hir__vec *groups, int *n) {
  const hir_fusion *f = &p->ir;
  int i, k, g, total = 0, apart = 0, *devs;
  *n = 0;
  for (i = 0; i < f->tvs.n; i++) total += ((const hir_tv *)f->tvs.items[i])->mesh_size;
  if (!total || !(devs = (int *)HIR_MALLOC((size_t)total * sizeof(int)))) return NULL;
  for (i = 0; i < f->tvs.n; i++) {
    const hir_tv *tv = (const hir_tv *)f->tvs.items[i];
    for (k = 0; k < tv->mesh_size; k++) {
      int at = *n, dev = tv->mesh[k];
      if (hir_team_index(devs, *n, dev) >= 0) continue;
      while (at > 0 && devs[at - 1] > dev) devs[at] = devs[at - 1], at--;
      devs[at] = dev;
      ++*n;
    }
  }
  apart = hir_team_index(devs, *n, p->my_device) < 0;
  for (g = 0; g < groups->n && !apart; g++)
    for (k = 0; k < *n && !apart; k++) apart = !hir__group_involves((const hir_group *)groups->items[g], devs[k]);
  if (!apart) *n = 0, HIR_FREE(devs), devs = NULL;
  return devs;
}

static hir_status hir__lower(const hir_fusion *f, const hir_lower_desc *d, hir_program **out, int mode);

/* The passes into p (made and checked by hir__lower), the serial form with
   serial = 1. Fills *apart (see hir__devices_apart) for the caller's. */
static hir_status hir__lower_passes(hir_program *p, const hir_fusion *f, const hir_lower_desc *d, int mode, unsigned dump,
                                    int **apart, int *napart) {
  hir__stream_plan stream;
  hir__vec groups = {NULL, 0, 0};
  int serial;
  if (!hir__stream_plan_of(&p->ir, &d->stream, &stream)) return p->ir.status;
  serial = mode == HIR__LOWER_SERIAL_FORM || stream.serial;
  if (d->comm && !d->comm->p2p_copy_engine) stream.experimental.copy_own_chunk = 1;
  /* the pipeline, written out: each pass, then the verifier */
  if (!hir__front_end(p, f, serial, stream.gather_first)) return hir__step_failed(p, "the front end");
  if (stream.automatic && !serial) { /* the pipeline, or the serial form where it is predicted faster and lowers */
    int64_t chunks;
    if (!hir__choose_pipeline(p, f, d->comm, &stream, &chunks, &serial)) return hir__step_failed(p, "the automatic choice");
    if (serial && chunks > 1) { /* some layouts gather an inner axis only chunk by chunk */
      hir_lower_desc plain;
      hir_program *q = NULL;
      memset(&plain, 0, sizeof plain);
      plain.my_device = d->my_device;
      if (hir__lower(f, &plain, &q, HIR__LOWER_SERIAL_FORM) != HIR_OK)
        serial = 0, snprintf(p->plan, sizeof p->plan, "pipelined: %lld chunks, as the serial form does not lower: %.180s",
                             (long long)chunks, q ? hir_program_error(q) : "out of memory");
      hir_program_free(q);
    }
    if (serial && (hir__strip_streams(&p->ir), !hir__order_moves(p))) return hir__step_failed(p, "ordering the moves");
  }
  if (!hir__segment(p, d->should_merge, d->merge_user, &groups)) return hir__step_failed(p, "segmentation");
  if (mode == HIR__LOWER_CALLER) *apart = hir__devices_apart(p, &groups, napart);
  if (!hir__build_program(p, &groups)) return hir__step_failed(p, "building the program");
  if (!hir__pipeline_check(p, "segmentation", dump)) return p->ir.status;
  if (!d->skip_stream_lowering &&
      (hir__stream_lowering(p, &stream), !hir__pipeline_check(p, "stream_lowering", dump)))
    return p->ir.status;
  if (!d->skip_stream_lowering && !serial && stream.experimental.column_parts != 0 && stream.experimental.column_parts != 1 &&
      (hir__column_parts(p, stream.experimental.column_parts), !hir__pipeline_check(p, "column_parts", dump)))
    return p->ir.status;
  if ((hir_pass_convert_communications(p), !hir__pipeline_check(p, "convert_communications", dump))) return p->ir.status;
  if (!d->skip_deallocations &&
      (hir_pass_insert_deallocations(p), !hir__pipeline_check(p, "insert_deallocations", dump)))
    return p->ir.status;
  if ((dump & HIR__DUMP_HOST_IR) && !hir__dump(p, "host_ir")) return p->ir.status;
  return HIR_OK;
}

/* Every rank must accept a fusion or refuse it alike, and devices whose
   programs hold different exprs could judge it differently: each device's
   program is lowered in turn (ascending), and the first refusal, on
   whichever device, is every rank's verdict. *out is this device's. */
static hir_status hir__common_verdict(const hir_fusion *f, const hir_lower_desc *d, hir_program **out, const int *devs, int n) {
  hir_lower_desc other = *d;
  hir_program *q = NULL, *verdict;
  int i;
  for (i = 0; i < n; i++) {
    if (devs[i] == d->my_device) {
      if ((*out)->ir.status != HIR_OK) return (*out)->ir.status; /* this device's refusal comes first */
      continue;
    }
    other.my_device = devs[i];
    if (hir__lower(f, &other, &q, HIR__LOWER_OTHER_DEVICE) != HIR_OK) break;
    hir_program_free(q);
    q = NULL;
  }
  if (i == n) return (*out)->ir.status;
  if (!(verdict = hir_program_create())) return hir_program_free(q), (*out)->ir.status; /* keep this device's own */
  verdict->my_device = d->my_device;
  hir__fail(&verdict->ir, q ? q->ir.status : HIR_ERR_NOMEM, "%s", q ? q->ir.error : "hir_lower: out of memory");
  hir_program_free(q);
  hir_program_free(*out);
  *out = verdict;
  return verdict->ir.status;
}

/* hir_lower's work, for `mode`'s reason. */
static hir_status hir__lower(const hir_fusion *f, const hir_lower_desc *given, hir_program **out, int mode) {
  hir_lower_desc filled = hir__lower_desc_filled(given), *d = &filled;
  hir_program *p;
  unsigned dump = 0;
  int *apart = NULL, napart = 0;
  hir_status s;
  if (!out) return HIR_ERR_INVALID;
  if (!(p = *out = hir_program_create())) return HIR_ERR_NOMEM;
  p->my_device = d->my_device;
  if (!hir__check_lower_args(p, f, d, "hir_lower") || (mode == HIR__LOWER_CALLER && !hir__dump_flags(p, &dump)))
    return p->ir.status;
  s = hir__lower_passes(p, f, d, mode, dump, &apart, &napart);
  if (napart) s = hir__common_verdict(f, d, out, apart, napart);
  HIR_FREE(apart);
  return s;
}

HIRDEF hir_status hir_lower(const hir_fusion *f, const hir_lower_desc *d, hir_program **out) {
  return hir__lower(f, d, out, HIR__LOWER_CALLER);
}

// >>numbers
static uint32_t hir__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float hir__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

HIRDEF uint16_t hir_float_to_bf16(float f) {
  uint32_t u = hir__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

HIRDEF float hir_bf16_to_float(uint16_t b) { return hir__bits_f32((uint32_t)b << 16); }


HIRDEF uint16_t hir_float_to_half(float f) {
  uint32_t u = hir__f32_bits(f), sign = (u >> 16) & 0x8000u, mant;
  int32_t exp;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);        /* NaN */
  if (u >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);       /* rounds to inf */
  exp = (int32_t)(u >> 23) - 127;
  mant = u & 0x7fffffu;
  if (exp < -14) { /* subnormal half (or zero) */
    uint32_t shift, m, rest, half_way;
    if (exp < -25) return (uint16_t)sign;
    m = mant | 0x800000u;
    shift = (uint32_t)(-exp - 14 + 13);
    rest = m & ((1u << shift) - 1u);
    half_way = 1u << (shift - 1);
    m >>= shift;
    if (rest > half_way || (rest == half_way && (m & 1u))) m++;
    return (uint16_t)(sign | m);
  }
  {
    uint32_t h = ((uint32_t)(exp + 15) << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* may carry into the exponent: fine */
    return (uint16_t)(sign | h);
  }
}

HIRDEF float hir_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1fu) return hir__bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) { /* subnormal or zero */
    float v = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24 */
    return sign ? -v : v;
  }
  return hir__bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* fp8 <-> float, written once: compiled here as C, and stringified into the
   CUDA kernels' source (HIR__XSTR), so that the host and the GPUs agree bit
   for bit. Encoding: u a float's bits, eb and mb the exponent and mantissa
   bits (bias 2^(eb-1) - 1), maxc the largest finite code (sign aside);
   round to nearest even, saturating, NaN 0x7f. Decoding: b a finite code. */
#define HIR__STR(...) #__VA_ARGS__
#define HIR__XSTR(...) HIR__STR(__VA_ARGS__)
#define HIR__FP8_ENCODE_BODY                                                                                     \
  unsigned sign = (u >> 24) & 0x80u, m, rest, half;                                                              \
  int bias = (1 << (eb - 1)) - 1, ex, sh;                                                                        \
  u &= 0x7fffffffu;                                                                                              \
  if (u > 0x7f800000u) return (unsigned char)(sign | 0x7fu);                                                     \
  ex = (int)(u >> 23) - 127;                                                                                     \
  if (ex > bias + 1) return (unsigned char)(sign | maxc); /* far beyond (infinities too) */                      \
  if (ex < 1 - bias) { /* a subnormal fp8 (or zero): m * 2^(1 - bias - mb) */                                    \
    if (ex < -bias - mb) return (unsigned char)sign;                                                             \
    m = (u & 0x7fffffu) | 0x800000u;                                                                             \
    sh = 23 + (1 - bias - mb) - ex;                                                                              \
  } else {                                                                                                       \
    m = ((unsigned)(ex + bias) << 23) | (u & 0x7fffffu); /* exponent and mantissa, rounded below */              \
    sh = 23 - mb;                                                                                                \
  }                                                                                                              \
  rest = m & ((1u << sh) - 1u);                                                                                  \
  half = 1u << (sh - 1);                                                                                         \
  m >>= sh;                                                                                                      \
  if (rest > half || (rest == half && (m & 1u))) m++; /* a carry moves into the exponent: fine */                \
  return (unsigned char)(sign | (m > maxc ? maxc : m));
#define HIR__FP8_DECODE_BODY                                                                                     \
  int bias = (1 << (eb - 1)) - 1, ex = (int)((b & 0x7fu) >> mb);                                                 \
  unsigned m = b & ((1u << mb) - 1u);                                                                            \
  float v = ex == 0 ? ldexpf((float)m, 1 - bias - mb) : ldexpf((float)(m | (1u << mb)), ex - bias - mb);         \
  return b & 0x80u ? -v : v;

static unsigned char hir__fp8_from_bits(unsigned u, int eb, int mb, unsigned maxc) { HIR__FP8_ENCODE_BODY }
static float hir__fp8_finite(unsigned b, int eb, int mb) { HIR__FP8_DECODE_BODY }

HIRDEF uint8_t hir_float_to_e4m3(float f) { return hir__fp8_from_bits(hir__f32_bits(f), 4, 3, 0x7eu); }
HIRDEF float hir_e4m3_to_float(uint8_t b) { return (b & 0x7f) == 0x7f ? NAN : hir__fp8_finite(b, 4, 3); }
HIRDEF uint8_t hir_float_to_e5m2(float f) { return hir__fp8_from_bits(hir__f32_bits(f), 5, 2, 0x7bu); }
HIRDEF float hir_e5m2_to_float(uint8_t b) {
  if ((b & 0x7c) == 0x7c) return (b & 3) ? NAN : (b & 0x80) ? -INFINITY : INFINITY;
  return hir__fp8_finite(b, 5, 2);
}

/* A double cast to int64 as CUDA's __double2ll_rz: toward zero, saturating, NaN the most negative. */
static int64_t hir__double_to_i64(double v) {
  if (v != v || v <= -9223372036854775808.0) return INT64_MIN;
  return v >= 9223372036854775808.0 ? INT64_MAX : (int64_t)v;
}

static double hir__load(const void *base, hir_dtype dt, int64_t i) {
  switch (dt) {
  case HIR_F32: return ((const float *)base)[i];
  case HIR_F64: return ((const double *)base)[i];
  case HIR_F16: return hir_half_to_float(((const uint16_t *)base)[i]);
  case HIR_F8E4M3: return hir_e4m3_to_float(((const uint8_t *)base)[i]);
  case HIR_F8E5M2: return hir_e5m2_to_float(((const uint8_t *)base)[i]);
  case HIR_I64: return (double)((const int64_t *)base)[i];
  default: return hir_bf16_to_float(((const uint16_t *)base)[i]);
  }
}

static void hir__store(void *base, hir_dtype dt, int64_t i, double v) {
  switch (dt) {
  case HIR_F32: ((float *)base)[i] = (float)v; break;
  case HIR_F64: ((double *)base)[i] = v; break;
  case HIR_F16: ((uint16_t *)base)[i] = hir_float_to_half((float)v); break;
  case HIR_F8E4M3: ((uint8_t *)base)[i] = hir_float_to_e4m3((float)v); break;
  case HIR_F8E5M2: ((uint8_t *)base)[i] = hir_float_to_e5m2((float)v); break;
  case HIR_I64: ((int64_t *)base)[i] = hir__double_to_i64(v); break;
  default: ((uint16_t *)base)[i] = hir_float_to_bf16((float)v); break;
  }
}

/* Whether nd sizes of es-byte elements are addressable: none negative, and
   their product in bytes fits an int64_t and a size_t. Checked on every
   shape once per plan, so that later products need no checks. */
static int hir__sizes_fit(int nd, const int64_t *sizes, size_t es) {
  uint64_t n = es, limit = (uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? (uint64_t)INT64_MAX : (uint64_t)SIZE_MAX;
  int i, zero = 0;
  for (i = 0; i < nd; i++) {
    if (sizes[i] < 0) return 0;
    zero |= sizes[i] == 0;
  }
  for (i = 0; i < nd && !zero; i++) {
    if ((uint64_t)sizes[i] > limit / n) return 0;
    n *= (uint64_t)sizes[i];
  }
  return 1;
}

static int64_t hir__numel(int nd, const int64_t *sizes) {
  int64_t n = 1;
  int i;
  for (i = 0; i < nd; i++) n *= sizes[i];
  return n;
}

static int hir__is_contiguous(const hir_tensor *t) {
  int64_t expect = 1;
  int i;
  for (i = t->ndims - 1; i >= 0; i--) {
    if (t->sizes[i] != 1 && t->strides[i] != expect) return 0;
    expect *= t->sizes[i];
  }
  return 1;
}

/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
   3"): counter (index, 0), key seed; the first word, its top `bits` bits as a
   fraction. The CUDA backend's kernel computes the same words. */
HIRDEF double hir_rand_value(uint64_t seed, uint64_t index, int bits) {
  uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32), c2 = 0, c3 = 0, k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  int r;
  for (r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  if (bits < 1 || bits > 32) bits = 24;
  return ldexp((double)(c0 >> (32 - bits)), -bits);
}

/* The significand bits hir_rand draws for a dtype. */
static int hir__rand_bits(hir_dtype dt) { return dt == HIR_F16 ? 11 : dt == HIR_BF16 ? 8 : 24; }

static void hir__contiguous_strides(hir_tensor *t) {
  int64_t s = 1;
  int i;
  for (i = t->ndims - 1; i >= 0; i--) {
    t->strides[i] = s;
    s *= t->sizes[i];
  }
}

// >>dlpack
#ifdef HOSTIR_DLPACK
/* Each hir_dtype's DLPack code and bits; fp8 by DLPack 1.1's numbers (kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12, as
   PyTorch exports them), so that an older dlpack.h works too. */
static const struct { int code, bits; } hir__dlpack_types[] = {{kDLFloat, 32}, {kDLFloat, 64}, {kDLFloat, 16}, {kDLBfloat, 16},
                                                              {10, 8}, {12, 8}, {kDLInt, 64}};
HIR__STATIC_ASSERT(dlpack_types, sizeof(hir__dlpack_types) / sizeof(hir__dlpack_types[0]) == HIR_DTYPE_COUNT);

HIRDEF hir_status hir_tensor_from_dlpack(const DLTensor *t, hir_tensor *out, char *error, size_t cap) {
  int i, k, zero = 1;
  int64_t numel = 1;
  if (!t || !out) {
    if (error && cap) snprintf(error, cap, "hir_tensor_from_dlpack: %s is NULL", t ? "out" : "the DLTensor");
    return HIR_ERR_INVALID;
  }
  memset(out, 0, sizeof *out);
  for (k = 0; k < HIR_DTYPE_COUNT && !(hir__dlpack_types[k].code == t->dtype.code && hir__dlpack_types[k].bits == t->dtype.bits); k++) {}
  if (k == HIR_DTYPE_COUNT || t->dtype.lanes != 1) {
    if (error && cap)
      snprintf(error, cap, "hir_tensor_from_dlpack: dtype code %d, %d bits, %d lanes is not one of f32, f64, f16, bf16, "
               "float8_e4m3fn, float8_e5m2", t->dtype.code, t->dtype.bits, t->dtype.lanes);
    return HIR_ERR_UNSUPPORTED;
  }
  if (t->ndim < 0 || t->ndim > HIR_MAX_DIMS) {
    if (error && cap) snprintf(error, cap, "hir_tensor_from_dlpack: %d dimensions; hostir takes 0 to %d", t->ndim, HIR_MAX_DIMS);
    return HIR_ERR_UNSUPPORTED;
  }
  for (i = 0; i < t->ndim; i++) {
    numel *= t->shape[i];
    if (t->strides && t->strides[i]) zero = 0;
  }
  if (t->strides && zero && numel > 1) { /* hostir reads all-zero strides as contiguous */
    if (error && cap) snprintf(error, cap, "hir_tensor_from_dlpack: every stride is 0 (an expanded tensor); pass a contiguous copy");
    return HIR_ERR_UNSUPPORTED;
  }
  out->data = t->data ? (char *)t->data + t->byte_offset : NULL;
  out->dtype = (hir_dtype)k;
  out->ndims = t->ndim;
  for (i = 0; i < t->ndim; i++) {
    out->sizes[i] = t->shape[i];
    out->strides[i] = t->strides ? t->strides[i] : 0;
  }
  return HIR_OK;
}

typedef struct hir__dlpack { /* a DLManagedTensor and the arrays it points at, in one allocation */
  DLManagedTensor m;
  int64_t shape[HIR_MAX_DIMS], strides[HIR_MAX_DIMS];
} hir__dlpack;

static void hir__dlpack_delete(DLManagedTensor *self) { HIR_FREE(self); }

HIRDEF hir_status hir_tensor_to_dlpack(const hir_tensor *t, int device_type, int device_id, DLManagedTensor **out) {
  hir__dlpack *d;
  int i, contiguous = 1;
  if (!out) return HIR_ERR_INVALID;
  *out = NULL;
  if (!t || (unsigned)t->dtype >= HIR_DTYPE_COUNT || t->ndims < 0 || t->ndims > HIR_MAX_DIMS) return HIR_ERR_INVALID;
  if (!(d = (hir__dlpack *)HIR_MALLOC(sizeof *d))) return HIR_ERR_NOMEM;
  memset(d, 0, sizeof *d);
  for (i = 0; i < t->ndims; i++) {
    d->shape[i] = t->sizes[i];
    d->strides[i] = t->strides[i];
    contiguous &= t->strides[i] == 0;
  }
  for (i = t->ndims - 1; contiguous && i >= 0; i--) /* hostir's all-zero strides: row-major, written out */
    d->strides[i] = i == t->ndims - 1 ? 1 : d->strides[i + 1] * t->sizes[i + 1];
  d->m.dl_tensor.data = t->data;
  d->m.dl_tensor.device.device_type = (DLDeviceType)device_type;
  d->m.dl_tensor.device.device_id = device_id;
  d->m.dl_tensor.ndim = t->ndims;
  d->m.dl_tensor.dtype.code = (uint8_t)hir__dlpack_types[t->dtype].code;
  d->m.dl_tensor.dtype.bits = (uint8_t)hir__dlpack_types[t->dtype].bits;
  d->m.dl_tensor.dtype.lanes = 1;
  d->m.dl_tensor.shape = d->shape;
  d->m.dl_tensor.strides = d->strides;
  d->m.dl_tensor.byte_offset = 0;
  d->m.manager_ctx = NULL;
  d->m.deleter = hir__dlpack_delete;
  *out = &d->m;
  return HIR_OK;
}
#endif

// >>backend_cpu
/* Odometer over a shape, carrying the element offsets of up to 3 tensors. */
typedef struct hir__iter {
  int nd, nt;
  int64_t sizes[HIR_MAX_DIMS], idx[HIR_MAX_DIMS], strides[3][HIR_MAX_DIMS], off[3];
} hir__iter;

static void hir__iter_init(hir__iter *it, int nd, const int64_t *sizes, int nt, const hir_tensor *const *ts) {
  int d, k;
  memset(it, 0, sizeof *it);
  it->nd = nd;
  it->nt = nt;
  for (d = 0; d < nd; d++) it->sizes[d] = sizes[d];
  for (k = 0; k < nt; k++)
    for (d = 0; d < nd; d++) it->strides[k][d] = ts[k]->strides[d];
}

/* Advances to the next index of the outer nd-1 axes; 0 when done. */
static int hir__iter_next_outer(hir__iter *it) {
  int d, k;
  for (d = it->nd - 2; d >= 0; d--) {
    if (++it->idx[d] < it->sizes[d]) {
      for (k = 0; k < it->nt; k++) it->off[k] += it->strides[k][d];
      return 1;
    }
    for (k = 0; k < it->nt; k++) it->off[k] -= it->strides[k][d] * (it->sizes[d] - 1);
    it->idx[d] = 0;
  }
  return 0;
}

typedef struct hir__cpu {
  float *row;             /* matmul accumulator row */
  size_t row_cap;
  double *acc;            /* sum accumulators */
  size_t acc_cap;
  int streams;            /* handles are addresses inside this struct */
} hir__cpu;

static int hir__cpu_grow(hir_backend *b, void **buf, size_t *cap, size_t need) {
  void *p;
  if (need <= *cap) return 1;
  if (!(p = HIR_REALLOC(*buf, need))) {
    snprintf(b->error, sizeof b->error, "cpu backend: out of memory growing a %zu-byte scratch buffer", need);
    return 0;
  }
  *buf = p;
  *cap = need;
  return 1;
}

static void hir__cpu_destroy(hir_backend *b) {
  hir__cpu *c = (hir__cpu *)b->ctx;
  HIR_FREE(c->row);
  HIR_FREE(c->acc);
  HIR_FREE(c);
  HIR_FREE(b);
}

static hir_status hir__cpu_alloc(hir_backend *b, size_t bytes, void **ptr) {
  *ptr = HIR_MALLOC(bytes ? bytes : 1);
  if (*ptr) return HIR_OK;
  snprintf(b->error, sizeof b->error, "cpu backend: out of memory allocating %zu bytes", bytes);
  return HIR_ERR_NOMEM;
}
static void hir__cpu_release(hir_backend *b, void *ptr) {
  (void)b;
  HIR_FREE(ptr);
}
/* Streams run in order on the host: every handle is the same no-op. */
static void *hir__cpu_current(hir_backend *b) {
  (void)b;
  return NULL;
}
static hir_status hir__cpu_handle(hir_backend *b, void **h) {
  *h = &((hir__cpu *)b->ctx)->streams;
  return HIR_OK;
}
static void hir__cpu_drop(hir_backend *b, void *h) { (void)b; (void)h; }
static hir_status hir__cpu_pair(hir_backend *b, void *x, void *y) {
  (void)b; (void)x; (void)y;
  return HIR_OK;
}
static hir_status hir__cpu_sync(hir_backend *b, void *s) {
  (void)b; (void)s;
  return HIR_OK;
}

static hir_status hir__cpu_copy(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *src) {
  const hir_tensor *ts[2];
  size_t es = hir_dtype_size(dst->dtype);
  hir__iter it;
  int64_t n, j;
  (void)stream;
  if (dst->dtype != src->dtype) {
    snprintf(b->error, sizeof b->error, "cpu backend: copy from %s to %s; dtypes must match", hir_dtype_name(src->dtype),
             hir_dtype_name(dst->dtype));
    return HIR_ERR_INVALID;
  }
  if (dst->ndims == 0 || hir__numel(dst->ndims, dst->sizes) == 0) {
    if (dst->ndims == 0) memcpy(dst->data, src->data, es);
    return HIR_OK;
  }
  if (hir__is_contiguous(dst) && hir__is_contiguous(src)) {
    memmove(dst->data, src->data, (size_t)hir__numel(dst->ndims, dst->sizes) * es);
    return HIR_OK;
  }
  ts[0] = dst;
  ts[1] = src;
  hir__iter_init(&it, dst->ndims, dst->sizes, 2, ts);
  n = dst->sizes[dst->ndims - 1];
  do {
    char *d = (char *)dst->data + it.off[0] * (int64_t)es;
    const char *s = (const char *)src->data + it.off[1] * (int64_t)es;
    int64_t ds = dst->strides[dst->ndims - 1] * (int64_t)es, ss = src->strides[src->ndims - 1] * (int64_t)es;
    if (ds == (int64_t)es && ss == (int64_t)es)
      memmove(d, s, (size_t)n * es);
    else
      for (j = 0; j < n; j++) memcpy(d + j * ds, s + j * ss, es);
  } while (hir__iter_next_outer(&it));
  return HIR_OK;
}

/* The op tables' expressions, compiled as C on doubles. */
#define HIR_C(v) ((double)(v))
#define HIR__BINARY_CASE(e, symbol, builder, expr) case e: return expr;
#define HIR__UNARY_CASE(e, name, f, expr) case e: return expr;
static double hir__apply_binary(hir_binary_op op, double x, double y) {
  switch (op) { HIR_BINARY_OP_LIST(HIR__BINARY_CASE) default: return 0; }
}
static double hir__apply_unary(hir_unary_op op, double x, double s) {
  (void)s;
  switch (op) { HIR_UNARY_OP_LIST(HIR__UNARY_CASE) default: return 0; }
}
#undef HIR_C

/* The ops exact on int64 (hir__unary_on_i64), wrapping as two's complement. */
static int64_t hir__i64_wrap(uint64_t v) { return v <= (uint64_t)INT64_MAX ? (int64_t)v : -(int64_t)(~v) - 1; }
static int64_t hir__i64_binary(hir_binary_op op, int64_t x, int64_t y) {
  switch (op) {
  case HIR_BINARY_ADD: return hir__i64_wrap((uint64_t)x + (uint64_t)y);
  case HIR_BINARY_SUB: return hir__i64_wrap((uint64_t)x - (uint64_t)y);
  case HIR_BINARY_MUL: return hir__i64_wrap((uint64_t)x * (uint64_t)y);
  default: return x < y;
  }
}
static int64_t hir__i64_unary(hir_unary_op op, int64_t x, int64_t s) {
  switch (op) {
  case HIR_UNARY_NEG: return hir__i64_wrap(0 - (uint64_t)x);
  case HIR_UNARY_ABS: return x < 0 ? hir__i64_wrap(0 - (uint64_t)x) : x;
  case HIR_UNARY_RELU: return x < 0 ? 0 : x;
  case HIR_UNARY_ADD_SCALAR: return hir__i64_binary(HIR_BINARY_ADD, x, s);
  case HIR_UNARY_SUB_SCALAR: return hir__i64_binary(HIR_BINARY_SUB, x, s);
  case HIR_UNARY_MUL_SCALAR: return hir__i64_binary(HIR_BINARY_MUL, x, s);
  case HIR_UNARY_SCALAR_SUB: return hir__i64_binary(HIR_BINARY_SUB, s, x);
  case HIR_UNARY_LT_SCALAR: return x < s;
  case HIR_UNARY_SCALAR_LT: return s < x;
  default: return x; /* cast */
  }
}

static hir_status hir__cpu_unary(hir_backend *b, void *stream, hir_unary_op op, const hir_tensor *dst, const hir_tensor *src,
                                 double s) {
  const hir_tensor *ts[2];
  hir__iter it;
  int nd = dst->ndims, i64 = dst->dtype == HIR_I64 && src->dtype == HIR_I64;
  int64_t n, j;
  (void)b; (void)stream;
  if (nd == 0) {
    if (i64) *(int64_t *)dst->data = hir__i64_unary(op, *(const int64_t *)src->data, (int64_t)s);
    else hir__store(dst->data, dst->dtype, 0, hir__apply_unary(op, hir__load(src->data, src->dtype, 0), s));
    return HIR_OK;
  }
  if (hir__numel(nd, dst->sizes) == 0) return HIR_OK;
  ts[0] = dst;
  ts[1] = src;
  hir__iter_init(&it, nd, dst->sizes, 2, ts);
  n = dst->sizes[nd - 1];
  do {
    int64_t sd = dst->strides[nd - 1], ss = src->strides[nd - 1];
    for (j = 0; i64 && j < n; j++)
      ((int64_t *)dst->data)[it.off[0] + j * sd] = hir__i64_unary(op, ((const int64_t *)src->data)[it.off[1] + j * ss], (int64_t)s);
    for (j = 0; !i64 && j < n; j++)
      hir__store(dst->data, dst->dtype, it.off[0] + j * sd,
                 hir__apply_unary(op, hir__load(src->data, src->dtype, it.off[1] + j * ss), s));
  } while (hir__iter_next_outer(&it));
  return HIR_OK;
}

static hir_status hir__cpu_binary(hir_backend *b, void *stream, hir_binary_op op, const hir_tensor *dst,
                                  const hir_tensor *a, const hir_tensor *x) {
  const hir_tensor *ts[3];
  hir__iter it;
  int nd = dst->ndims;
  int64_t n, j;
  (void)b; (void)stream;
  if (nd == 0 && dst->dtype == HIR_I64) {
    *(int64_t *)dst->data = hir__i64_binary(op, *(const int64_t *)a->data, *(const int64_t *)x->data);
    return HIR_OK;
  }
  if (nd == 0) {
    hir__store(dst->data, dst->dtype, 0, hir__apply_binary(op, hir__load(a->data, a->dtype, 0), hir__load(x->data, x->dtype, 0)));
    return HIR_OK;
  }
  if (hir__numel(nd, dst->sizes) == 0) return HIR_OK;
  ts[0] = dst;
  ts[1] = a;
  ts[2] = x;
  hir__iter_init(&it, nd, dst->sizes, 3, ts);
  n = dst->sizes[nd - 1];
  do {
    int64_t sd = dst->strides[nd - 1], sa = a->strides[nd - 1], sx = x->strides[nd - 1];
    if (dst->dtype == HIR_F32 && sd == 1 && sa == 1 && sx == 1 && op != HIR_BINARY_LT) {
      float *d = (float *)dst->data + it.off[0];
      const float *p = (const float *)a->data + it.off[1], *q = (const float *)x->data + it.off[2];
      if (op == HIR_BINARY_ADD) for (j = 0; j < n; j++) d[j] = p[j] + q[j];
      else if (op == HIR_BINARY_SUB) for (j = 0; j < n; j++) d[j] = p[j] - q[j];
      else if (op == HIR_BINARY_MUL) for (j = 0; j < n; j++) d[j] = p[j] * q[j];
      else for (j = 0; j < n; j++) d[j] = (float)((double)p[j] / q[j]);
    } else if (dst->dtype == HIR_I64) { /* operands of one dtype (the verifier's rule) */
      for (j = 0; j < n; j++)
        ((int64_t *)dst->data)[it.off[0] + j * sd] =
            hir__i64_binary(op, ((const int64_t *)a->data)[it.off[1] + j * sa], ((const int64_t *)x->data)[it.off[2] + j * sx]);
    } else {
      for (j = 0; j < n; j++)
        hir__store(dst->data, dst->dtype, it.off[0] + j * sd,
                   hir__apply_binary(op, hir__load(a->data, a->dtype, it.off[1] + j * sa),
                                     hir__load(x->data, x->dtype, it.off[2] + j * sx)));
    }
  } while (hir__iter_next_outer(&it));
  return HIR_OK;
}

/* Sums in double (int64 exactly), stores once: the reference the other backends are tested against. */
static hir_status hir__cpu_reduce(hir_backend *b, const hir_tensor *dst, const hir_tensor *src, int max) {
  hir__cpu *c = (hir__cpu *)b->ctx;
  hir_tensor acc_view;
  const hir_tensor *ts[2];
  hir__iter it;
  int nd = src->ndims, d, i64 = src->dtype == HIR_I64;
  int64_t nout = hir__numel(nd, dst->sizes), n, j, k, *iacc;
  if (!hir__cpu_grow(b, (void **)&c->acc, &c->acc_cap, (size_t)(nout ? nout : 1) * sizeof(double))) return HIR_ERR_NOMEM;
  iacc = (int64_t *)(void *)c->acc; /* int64 accumulators, exact, in the same bytes */
  for (k = 0; k < nout; k++)
    if (i64) iacc[k] = max ? INT64_MIN : 0;
    else c->acc[k] = max ? -HUGE_VAL : 0;
  if (nd == 0 || hir__numel(nd, src->sizes) == 0) goto store;
  acc_view = *dst; /* accumulators laid out contiguously over dst's shape, 0 stride on reduced axes */
  {
    int64_t s = 1;
    for (d = nd - 1; d >= 0; d--) {
      acc_view.strides[d] = dst->sizes[d] == 1 ? 0 : s;
      s *= dst->sizes[d];
    }
  }
  ts[0] = &acc_view;
  ts[1] = src;
  hir__iter_init(&it, nd, src->sizes, 2, ts);
  n = src->sizes[nd - 1];
  do {
    for (j = 0; i64 && j < n; j++) {
      int64_t *acc = &iacc[it.off[0] + j * acc_view.strides[nd - 1]], x = ((const int64_t *)src->data)[it.off[1] + j * src->strides[nd - 1]];
      *acc = max ? (x > *acc ? x : *acc) : hir__i64_binary(HIR_BINARY_ADD, *acc, x);
    }
    for (j = 0; !i64 && j < n; j++) {
      double *acc = &c->acc[it.off[0] + j * acc_view.strides[nd - 1]], x = hir__load(src->data, src->dtype, it.off[1] + j * src->strides[nd - 1]);
      if (!max) *acc += x;
      else if (x > *acc || x != x) *acc = *acc != *acc ? *acc : x; /* NaN wins */
    }
  } while (hir__iter_next_outer(&it));
store:
  if (nd == 0 && i64) {
    *(int64_t *)dst->data = *(const int64_t *)src->data;
    return HIR_OK;
  }
  if (nd == 0) {
    double x = hir__load(src->data, src->dtype, 0);
    hir__store(dst->data, dst->dtype, 0, max ? x : c->acc[0] + x);
    return HIR_OK;
  }
  { /* write the accumulators through dst's strides */
    int64_t idx[HIR_MAX_DIMS] = {0};
    for (k = 0; k < nout; k++) {
      int64_t off = 0, r = k;
      for (d = nd - 1; d >= 0; d--) {
        idx[d] = r % dst->sizes[d];
        r /= dst->sizes[d];
        off += idx[d] * dst->strides[d];
      }
      if (i64) ((int64_t *)dst->data)[off] = iacc[k];
      else hir__store(dst->data, dst->dtype, off, c->acc[k]);
    }
  }
  return HIR_OK;
}
static hir_status hir__cpu_sum(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *src) {
  (void)stream;
  return hir__cpu_reduce(b, dst, src, 0);
}
static hir_status hir__cpu_max(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *src) {
  (void)stream;
  return hir__cpu_reduce(b, dst, src, 1);
}

/* One GEMM: C[M,N] = A[M,K] B[K,N], strided; row-wise i-k-j with a float (or
   double for f64) accumulator row, the inner loop contiguous when B's and C's
   rows are. Half types accumulate in float, like cuBLAS. */
static void hir__cpu_gemm(hir__cpu *c, hir_dtype dt, int64_t M, int64_t N, int64_t K, const char *A, int64_t ars,
                          int64_t acs, const char *B, int64_t brs, int64_t bcs, char *C, int64_t crs, int64_t ccs) {
  int64_t i, j, k;
  if (dt == HIR_F32 && bcs == 1) {
    const float *a = (const float *)A, *bm = (const float *)B;
    float *row = c->row;
    for (i = 0; i < M; i++) {
      for (j = 0; j < N; j++) row[j] = 0;
      for (k = 0; k < K; k++) {
        float aik = a[i * ars + k * acs];
        const float *brow = bm + k * brs;
        for (j = 0; j < N; j++) row[j] += aik * brow[j];
      }
      for (j = 0; j < N; j++) ((float *)C)[i * crs + j * ccs] = row[j];
    }
    return;
  }
  if (dt == HIR_F64) {
    for (i = 0; i < M; i++)
      for (j = 0; j < N; j++) {
        double s = 0;
        for (k = 0; k < K; k++) s += ((const double *)A)[i * ars + k * acs] * ((const double *)B)[k * brs + j * bcs];
        ((double *)C)[i * crs + j * ccs] = s;
      }
    return;
  }
  {
    float *row = c->row;
    for (i = 0; i < M; i++) {
      for (j = 0; j < N; j++) row[j] = 0;
      for (k = 0; k < K; k++) {
        float aik = (float)hir__load(A, dt, i * ars + k * acs);
        for (j = 0; j < N; j++) row[j] += aik * (float)hir__load(B, dt, k * brs + j * bcs);
      }
      for (j = 0; j < N; j++) hir__store(C, dt, i * crs + j * ccs, row[j]);
    }
  }
}

static hir_status hir__cpu_matmul(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *a,
                                  const hir_tensor *x) {
  hir__cpu *c = (hir__cpu *)b->ctx;
  const hir_tensor *ts[3];
  hir__iter it;
  int nd = dst->ndims, nb = nd - 2;
  int64_t M = dst->sizes[nd - 2], N = dst->sizes[nd - 1], K = a->sizes[nd - 1];
  size_t es = hir_dtype_size(dst->dtype);
  (void)stream;
  if (!hir__cpu_grow(b, (void **)&c->row, &c->row_cap, (size_t)(N ? N : 1) * sizeof(float))) return HIR_ERR_NOMEM;
  if (hir__numel(nd, dst->sizes) == 0) return HIR_OK;
  ts[0] = dst;
  ts[1] = a;
  ts[2] = x;
  /* iterate the batch axes (plus a dummy inner one) */
  {
    int64_t sizes[HIR_MAX_DIMS + 1];
    hir_tensor d1 = *dst, a1 = *a, b1 = *x;
    int k;
    for (k = 0; k < nb; k++) sizes[k] = dst->sizes[k];
    sizes[nb] = 1;
    d1.strides[nb] = a1.strides[nb] = b1.strides[nb] = 0;
    ts[0] = &d1;
    ts[1] = &a1;
    ts[2] = &b1;
    hir__iter_init(&it, nb + 1, sizes, 3, ts);
    do {
      hir__cpu_gemm(c, dst->dtype, M, N, K, (const char *)a->data + it.off[1] * (int64_t)es, a->strides[nd - 2],
                    a->strides[nd - 1], (const char *)x->data + it.off[2] * (int64_t)es, x->strides[nd - 2],
                    x->strides[nd - 1], (char *)dst->data + it.off[0] * (int64_t)es, dst->strides[nd - 2],
                    dst->strides[nd - 1]);
    } while (hir__iter_next_outer(&it));
  }
  return HIR_OK;
}

/* hir_backend.matmul_scaled: element by element, the products summed in double (fp8 products are exact there). */
static hir_status hir__cpu_matmul_scaled(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *a, const hir_tensor *x,
                                         const hir_tensor *sa, const hir_tensor *sb) {
  int nd = dst->ndims, d;
  int64_t idx[HIR_MAX_DIMS], n = hir__numel(nd, dst->sizes), i, k, K = a->sizes[nd - 1];
  (void)b, (void)stream;
  for (i = 0; i < n; i++) {
    int64_t od = 0, oa = 0, ox = 0, osa = 0, osb = 0, r = i;
    double acc = 0;
    for (d = nd - 1; d >= 0; d--) idx[d] = r % dst->sizes[d], r /= dst->sizes[d];
    for (d = 0; d < nd; d++) {
      od += idx[d] * dst->strides[d], osa += idx[d] * sa->strides[d], osb += idx[d] * sb->strides[d];
      if (d < nd - 2) oa += idx[d] * a->strides[d], ox += idx[d] * x->strides[d];
    }
    oa += idx[nd - 2] * a->strides[nd - 2];
    ox += idx[nd - 1] * x->strides[nd - 1];
    for (k = 0; k < K; k++)
      acc += hir__load(a->data, a->dtype, oa + k * a->strides[nd - 1]) * hir__load(x->data, x->dtype, ox + k * x->strides[nd - 2]);
    hir__store(dst->data, dst->dtype, od, acc * ((const float *)sa->data)[osa] * ((const float *)sb->data)[osb]);
  }
  return HIR_OK;
}

static hir_status hir__cpu_memcpy(hir_backend *b, void *dst, const void *src, size_t bytes) {
  (void)b;
  memcpy(dst, src, bytes);
  return HIR_OK;
}

/* The largest |a - b| and |b| of n elements in host memory (NaN: infinite). */
static void hir__host_max_abs(const void *a, const void *b, hir_dtype dt, int64_t n, double *diff, double *b_max) {
  int64_t i;
  *diff = *b_max = 0;
  for (i = 0; i < n; i++) {
    double y = hir__load(b, dt, i), d = hir__load(a, dt, i) - y;
    d = d < 0 ? -d : d;
    y = y < 0 ? -y : y;
    if (!(d <= *diff)) *diff = d == d ? d : HUGE_VAL;
    if (!(y <= *b_max)) *b_max = y == y ? y : HUGE_VAL;
  }
}

static hir_status hir__cpu_max_abs(hir_backend *self, void *stream, const hir_tensor *a, const hir_tensor *b, double *diff,
                                   double *b_max) {
  (void)self, (void)stream;
  hir__host_max_abs(a->data, b->data, b->dtype, hir__numel(b->ndims, b->sizes), diff, b_max);
  return HIR_OK;
}

static hir_status hir__cpu_rand(hir_backend *self, void *stream, const hir_tensor *dst, uint64_t seed, const int64_t *base,
                                const int64_t *stride, int bits) {
  int64_t n = hir__numel(dst->ndims, dst->sizes), i, r, off;
  uint64_t at;
  int d;
  (void)self, (void)stream;
  for (i = 0; i < n; i++) {
    for (d = dst->ndims - 1, r = i, off = 0, at = 0; d >= 0; d--) {
      int64_t k = r % dst->sizes[d];
      r /= dst->sizes[d];
      off += k * dst->strides[d];
      at += (uint64_t)(base[d] + k) * (uint64_t)stride[d];
    }
    if (!bits && dst->dtype == HIR_I64) ((int64_t *)dst->data)[off] = (int64_t)at;
    else hir__store(dst->data, dst->dtype, off, bits ? hir_rand_value(seed, at, bits) : (double)at);
  }
  return HIR_OK;
}

static hir_status hir__cpu_scatter_rows(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *src,
                                        const hir_tensor *where) {
  int64_t rows = dst->ndims ? dst->sizes[0] : 1, n = src->ndims ? src->sizes[0] : 1, i;
  size_t row = rows ? (size_t)(hir__numel(dst->ndims, dst->sizes) / rows) * hir_dtype_size(dst->dtype) : 0;
  (void)self, (void)stream;
  memset(dst->data, 0, (size_t)rows * row);
  for (i = 0; i < n; i++) {
    int64_t to = ((const int64_t *)where->data)[i];
    if (to >= 0 && to < rows) memcpy((char *)dst->data + (size_t)to * row, (const char *)src->data + (size_t)i * row, row);
  }
  return HIR_OK;
}

/* hir_backend.moe_index: the row numbers of MoE's moves (its contract), in loops a GPU thread each mirrors. */
static hir_status hir__cpu_moe_index(hir_backend *self, void *stream, int step, const hir_tensor *out, const hir_tensor *out2,
                                     const hir_tensor *in, const hir_tensor *counts, int64_t tokens, int64_t experts) {
  int64_t R = counts->sizes[0], C = tokens * R, *o = (int64_t *)out->data, *n = (int64_t *)counts->data, i, j, s, at;
  (void)self, (void)stream;
  if (step == HIR_MOE_ROUTE) {
    const int64_t *ex = (const int64_t *)in->data, per = experts / R;
    int64_t st = in->ndims ? in->strides[0] : 1;
    for (s = 0; s < R; s++) n[s] = 0;
    for (i = 0; i < C; i++) ((int64_t *)out2->data)[i] = -1;
    for (i = 0; i < tokens; i++) {
      int64_t e = ex[i * st], k = 0;
      if (e < 0 || e >= experts) {
        o[i] = -1;
        continue;
      }
      for (j = 0; j < tokens; j++) { /* the tokens to the same member before this one: by expert, then token */
        int64_t f = ex[j * st];
        k += f >= 0 && f < experts && f / per == e / per && (f < e || (f == e && j < i));
      }
      o[i] = e / per * tokens + k;
      ((int64_t *)out2->data)[o[i]] = i;
      n[e / per]++;
    }
    return HIR_OK;
  }
  for (i = 0; i < C; i++) o[i] = -1;
  for (s = 0, at = 0; s < R; at += n[s] > 0 ? (n[s] < tokens ? n[s] : tokens) : 0, s++)
    for (j = 0; j < n[s] && j < tokens; j++) {
      if (step == HIR_MOE_COMPACT) o[s * tokens + j] = at + j;
      else if (step == HIR_MOE_EXPAND) o[at + j] = s * tokens + j;
      else {
        int64_t t = ((const int64_t *)in->data)[s * tokens + j];
        o[s * tokens + j] = t >= 0 && t < tokens ? t : -1;
      }
    }
  return HIR_OK;
}

/* hir_backend.layer_norm (center) and rms_norm, in double: the evaluator hands them dense tensors. */
static void hir__cpu_norm(const hir_tensor *dst, const hir_tensor *x, const hir_tensor *weight, const hir_tensor *bias, int naxes,
                          double eps, int center) {
  int64_t cols = 1, rows, r, k;
  int d;
  for (d = x->ndims - naxes; d < x->ndims; d++) cols *= x->sizes[d];
  rows = cols ? hir__numel(x->ndims, x->sizes) / cols : 0;
  for (r = 0; r < rows; r++) {
    double mean = 0, var = 0, rstd;
    for (k = 0; center && k < cols; k++) mean += hir__load(x->data, x->dtype, r * cols + k);
    mean /= (double)cols;
    for (k = 0; k < cols; k++) {
      double v = hir__load(x->data, x->dtype, r * cols + k) - mean;
      var += v * v;
    }
    rstd = 1 / sqrt(var / (double)cols + eps);
    for (k = 0; k < cols; k++) {
      double y = (hir__load(x->data, x->dtype, r * cols + k) - mean) * rstd;
      if (weight) y *= hir__load(weight->data, weight->dtype, k);
      if (bias) y += hir__load(bias->data, bias->dtype, k);
      hir__store(dst->data, dst->dtype, r * cols + k, y);
    }
  }
}
static hir_status hir__cpu_layer_norm(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *x,
                                      const hir_tensor *weight, const hir_tensor *bias, int naxes, double eps) {
  (void)self, (void)stream;
  hir__cpu_norm(dst, x, weight, bias, naxes, eps, 1);
  return HIR_OK;
}
static hir_status hir__cpu_rms_norm(hir_backend *self, void *stream, const hir_tensor *dst, const hir_tensor *x,
                                    const hir_tensor *weight, int naxes, double eps) {
  (void)self, (void)stream;
  hir__cpu_norm(dst, x, weight, NULL, naxes, eps, 0);
  return HIR_OK;
}

HIRDEF hir_backend *hir_backend_cpu_create(void) {
  hir_backend *b = (hir_backend *)HIR_MALLOC(sizeof(hir_backend));
  hir__cpu *c = (hir__cpu *)HIR_MALLOC(sizeof(hir__cpu));
  if (!b || !c) {
    HIR_FREE(b);
    HIR_FREE(c);
    return NULL;
  }
  memset(b, 0, sizeof *b);
  memset(c, 0, sizeof *c);
  b->ctx = c;
  b->name = "cpu";
  b->host_memory = 1;
  b->destroy = hir__cpu_destroy;
  b->alloc = hir__cpu_alloc;
  b->release = hir__cpu_release;
  b->current_stream = hir__cpu_current;
  b->stream_create = hir__cpu_handle;
  b->stream_destroy = hir__cpu_drop;
  b->event_create = hir__cpu_handle;
  b->event_destroy = hir__cpu_drop;
  b->event_record = hir__cpu_pair;
  b->stream_wait_event = hir__cpu_pair;
  b->stream_synchronize = hir__cpu_sync;
  b->stream_query = hir__cpu_sync;
  b->copy = hir__cpu_copy;
  b->binary = hir__cpu_binary;
  b->unary = hir__cpu_unary;
  b->sum = hir__cpu_sum;
  b->max = hir__cpu_max;
  b->matmul = hir__cpu_matmul;
  b->upload = hir__cpu_memcpy;
  b->download = hir__cpu_memcpy;
  b->max_abs = hir__cpu_max_abs;
  b->matmul_scaled = hir__cpu_matmul_scaled;
  b->layer_norm = hir__cpu_layer_norm;
  b->rms_norm = hir__cpu_rms_norm;
  b->rand = hir__cpu_rand;
  b->scatter_rows = hir__cpu_scatter_rows;
  b->moe_index = hir__cpu_moe_index;
  return b;
}

HIRDEF void hir_backend_free(hir_backend *b) {
  if (b && b->destroy) b->destroy(b);
}

// >>backend_cuda
#ifdef HOSTIR_CUDA
/* The CUDA backend: device memory, non-blocking streams, events, and the ops
   through the CUDA runtime, cuBLAS and cuBLASLt, plus one kernel of ours
   written in PTX (the driver compiles it when loaded, so a plain C compiler
   still builds hostir). Each stream gets its own cuBLAS handle and scratch,
   so ops on different streams never share a workspace. */
typedef struct hir__cuda_lane {  /* what one stream needs */
  cudaStream_t stream;
  cublasHandle_t blas;
  void *workspace;                 /* cuBLAS's, ours: it never allocates in a run (or a graph capture) */
  void *scratch[8];                /* 0-2 the ops' own; 3-7 an fp8 GEMM's operands made dense or widened */
  size_t scratch_cap[8];
  void *ones[HIR_DTYPE_COUNT];     /* a vector of ones per dtype, for long sums: filled on this stream */
  size_t ones_len[HIR_DTYPE_COUNT];
} hir__cuda_lane;

/* A run never waits on the host for its GPU: a synchronous copy, free or
   device sync there would wait behind a stream that waits for a peer's
   signal, and in one process the peer's thread can then wait for a lock the
   waiting call holds (a deadlock). Buffers a run outgrows are kept until the
   backend goes (growth doubles, so they add up to less than what is live);
   ones are filled by the driver's memsets, on the stream that reads them. */
enum { HIR__CUDA_RETIRED = 64 };
typedef int (*hir__memset32_fn)(unsigned long long dst, unsigned int value, size_t n, cudaStream_t s);
typedef int (*hir__memset16_fn)(unsigned long long dst, unsigned short value, size_t n, cudaStream_t s);
typedef int (*hir__memset2d32_fn)(unsigned long long dst, size_t pitch, unsigned int value, size_t width, size_t height,
                                  cudaStream_t s);

enum { HIR__CUDA_WORKSPACE = 32 << 20 }; /* cuBLAS's own default on Hopper */

typedef struct hir__lt_plan {  /* see hir__lt_plan_of */
  int64_t key[9];                  /* M, N, K, dtype, B transposed, lda, ldb, ldc, epilogue */
  int made, found;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
} hir__lt_plan;
enum { HIR__LT_PLANS = 32, HIR__LT_PLAIN = -1 /* a plan's key[8]: no epilogue */ };

/* NVRTC's entry points (nvrtc.h's types, declared here so that no NVRTC header is needed). */
typedef struct hir__nvrtc {
  void *lib;
  int (*create)(void **prog, const char *src, const char *name, int nheaders, const char *const *headers,
                const char *const *include_names);
  int (*compile)(void *prog, int noptions, const char *const *options);
  int (*cubin_size)(void *prog, size_t *size);
  int (*cubin)(void *prog, char *cubin);
  int (*log_size)(void *prog, size_t *size);
  int (*log)(void *prog, char *log);
  int (*destroy)(void **prog);
  int (*version)(int *major, int *minor);
} hir__nvrtc;

/* The elementwise kernels, by what they compute: any op in float or in
   double (any strides and dtypes), one dtype's dense tensors 16 bytes a
   thread, the tuner's comparison, the fp8 GEMM's per-row scales, the sums
   of a dense tensor's rows, dense casts, layer_norm, transposing copies,
   numbered elements (random numbers, indices), and maxima over axes. */
enum { HIR__MAP_F32, HIR__MAP_F64, HIR__VEC_F32, HIR__VEC_F64, HIR__VEC_F16, HIR__VEC_BF16, HIR__MAX_ABS, HIR__SCALE_RC,
       HIR__SUM_ROWS, HIR__CAST_VEC, HIR__LAYER_NORM, HIR__TRANSPOSE, HIR__RAND, HIR__REDUCE_AXES, HIR__MAP_I64, HIR__MOE,
       HIR__MAP_KERNELS };
HIR__STATIC_ASSERT(vec_kernels, HIR_F32 == 0 && HIR__VEC_F32 + HIR_BF16 == HIR__VEC_BF16); /* HIR__VEC_F32 + dtype */

#define HIR__CUDA_LANES 64
#define HIR__CUDA_SHARED 32
typedef struct hir__cuda {
  int device, tf32;
  int pageable_access;              /* the GPU reads any host memory (cudaDevAttrPageableMemoryAccess) */
  char device_name[256];            /* hir_backend.device */
  cudaStream_t caller;
  cublasLtHandle_t lt;
  hir__cuda_lane caller_lane;      /* the caller's stream's, whichever it is (hir__cuda_lane_of) */
  cudaStream_t shared[HIR__CUDA_SHARED];  /* stream_shared's, and how many evaluators hold each */
  int shared_refs[HIR__CUDA_SHARED];
  hir__cuda_lane lanes[HIR__CUDA_LANES];
  int nlanes;
  void *retired[HIR__CUDA_RETIRED];  /* outgrown buffers, freed with the backend */
  int nretired;
  hir__memset32_fn memset32;         /* cuMemsetD32Async, cuMemsetD16Async, cuMemsetD2D32Async */
  hir__memset16_fn memset16;
  hir__memset2d32_fn memset2d32;
  int kernels_state;                /* 0: not loaded yet, 1: loaded, -1: failed to load (cuBLAS only) */
  cudaLibrary_t kernels;
  cudaKernel_t sum_kernel[HIR_DTYPE_COUNT]; /* the short-axis sum per dtype, NULL where none */
  /* the elementwise kernels (NVRTC), all loaded by hir_backend_cuda_create: state 1 loaded, -1 failed (map_error) */
  signed char map_state[HIR__MAP_KERNELS];
  cudaLibrary_t map_library[HIR__MAP_KERNELS];
  cudaKernel_t map_kernel[HIR__MAP_KERNELS];
  hir__nvrtc nvrtc;                 /* opened at the first compile, kept for the next */
  unsigned *max_abs_out;            /* hir_max_abs's two results, on the device */
  char map_error[200];
  char notes[400];              /* hir_backend.notes: why the kernel cache was not used, or an entry refused */
  cudaStream_t capture, saved_caller;  /* graph capture: the stream it runs on, and the caller's meanwhile */
  hir__lt_plan lt_plans[HIR__LT_PLANS]; /* cuBLASLt's GEMM setups, by shape, reused round-robin */
  int lt_next;
} hir__cuda;

/* The elementwise kernels (below), used by copies too. */
static hir_status hir__cuda_transpose(hir_backend *b, cudaStream_t s, void *dst, const void *src, size_t es, int nd,
                                      const int64_t *sizes, int64_t (*strides)[HIR_MAX_DIMS]);
static hir_status hir__cuda_map(hir_backend *b, void *stream, int op, const hir_tensor *dst, const hir_tensor *a,
                                const hir_tensor *x, double s);

static void hir__lt_plan_free(hir__lt_plan *q) {
  if (q->lc) cublasLtMatrixLayoutDestroy(q->lc);
  if (q->lb) cublasLtMatrixLayoutDestroy(q->lb);
  if (q->la) cublasLtMatrixLayoutDestroy(q->la);
  if (q->desc) cublasLtMatmulDescDestroy(q->desc);
  memset(q, 0, sizeof *q);
}

static hir_status hir__cuda_fail(hir_backend *b, const char *what, const char *detail, const char *file, int line) {
  snprintf(b->error, sizeof b->error, "%.100s failed: %.80s (%.40s:%d)", what, detail, file, line);
  return HIR_ERR_BACKEND;
}
static hir_status hir__cuda_unsupported(hir_backend *b, const char *what, const char *file, int line) {
  snprintf(b->error, sizeof b->error, "%.120s: not supported by cuBLAS for this dtype (%s:%d)", what, file, line);
  return HIR_ERR_UNSUPPORTED;
}
#define HIR__CU(b, call)                                                                                    \
  do {                                                                                                       \
    cudaError_t e_ = (call);                                                                                 \
    if (e_ != cudaSuccess) return hir__cuda_fail(b, #call, cudaGetErrorString(e_), __FILE__, __LINE__);     \
  } while (0)
#define HIR__BLAS(b, call)                                                                                   \
  do {                                                                                                       \
    cublasStatus_t s_ = (call);                                                                              \
    if (s_ == CUBLAS_STATUS_NOT_SUPPORTED) return hir__cuda_unsupported(b, #call, __FILE__, __LINE__);        \
    if (s_ != CUBLAS_STATUS_SUCCESS) return hir__cuda_fail(b, #call, cublasGetStatusString(s_), __FILE__, __LINE__); \
  } while (0)

static cudaDataType hir__cuda_type(hir_dtype d) {
  switch (d) {
  case HIR_F32: return CUDA_R_32F;
  case HIR_F64: return CUDA_R_64F;
  case HIR_F16: return CUDA_R_16F;
  case HIR_F8E4M3: return CUDA_R_8F_E4M3;
  case HIR_F8E5M2: return CUDA_R_8F_E5M2;
  default: return CUDA_R_16BF;
  }
}

/* A new lane's cuBLAS handle on its stream, with a workspace of our own. */
static hir_status hir__cuda_lane_init(hir_backend *b, hir__cuda_lane *l, cudaStream_t s) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  HIR__BLAS(b, cublasSetStream(l->blas, s));
  HIR__BLAS(b, cublasSetMathMode(l->blas, c->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  HIR__CU(b, cudaMalloc(&l->workspace, HIR__CUDA_WORKSPACE));
  HIR__BLAS(b, cublasSetWorkspace(l->blas, l->workspace, HIR__CUDA_WORKSPACE));
  return HIR_OK;
}

/* The lane of a stream, made on first use. The caller's stream has one
   lane, whichever stream that is: a new caller stream (set_stream; a graph
   capture's, ours or the caller's own, as torch.cuda.graph's) takes the
   lane over - handle, workspace, scratch, ones - and allocates nothing,
   which a stream being captured could not. So runs on different caller
   streams are ordered by the caller, as runs of one evaluator must be. */
static hir_status hir__cuda_lane_of(hir_backend *b, void *stream, hir__cuda_lane **out) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  cudaStream_t s = stream ? (cudaStream_t)stream : c->caller;
  hir__cuda_lane *l;
  int i;
  if (s == c->caller) {
    l = &c->caller_lane;
    if (!l->blas) {
      HIR__BLAS(b, cublasCreate(&l->blas));
      l->stream = s;
      if (hir__cuda_lane_init(b, l, s) != HIR_OK) return HIR_ERR_BACKEND;
    } else if (l->stream != s) {
      HIR__BLAS(b, cublasSetStream(l->blas, s)); /* which drops the workspace: set it again */
      HIR__BLAS(b, cublasSetWorkspace(l->blas, l->workspace, HIR__CUDA_WORKSPACE));
      l->stream = s;
    }
    *out = l;
    return HIR_OK;
  }
  for (i = 0; i < c->nlanes; i++)
    if (c->lanes[i].stream == s) {
      *out = &c->lanes[i];
      return HIR_OK;
    }
  if (c->nlanes == HIR__CUDA_LANES) {
    snprintf(b->error, sizeof b->error, "cuda backend: more than %d streams in use", HIR__CUDA_LANES);
    return HIR_ERR_UNSUPPORTED;
  }
  l = &c->lanes[i];
  memset(l, 0, sizeof *l);
  HIR__BLAS(b, cublasCreate(&l->blas));
  l->stream = s;
  c->nlanes++; /* freed with the backend from here on */
  if (hir__cuda_lane_init(b, l, s) != HIR_OK) return HIR_ERR_BACKEND;
  *out = l;
  return HIR_OK;
}

/* A buffer the backend outgrew (see HIR__CUDA_RETIRED); where too many
   are kept, they go now, after the device is done with them. */
static void hir__cuda_retire(hir__cuda *c, void *p) {
  int i;
  if (!p) return;
  if (c->nretired == HIR__CUDA_RETIRED) {
    cudaDeviceSynchronize();
    for (i = 0; i < c->nretired; i++) cudaFree(c->retired[i]);
    c->nretired = 0;
  }
  c->retired[c->nretired++] = p;
}

/* Scratch k of a lane, at least `bytes` (grows on first runs only). */
static hir_status hir__cuda_scratch(hir_backend *b, hir__cuda_lane *l, int k, size_t bytes, void **out) {
  if (l->scratch_cap[k] < bytes) {
    size_t cap = bytes > 2 * l->scratch_cap[k] ? bytes : 2 * l->scratch_cap[k];
    void *p;
    HIR__CU(b, cudaMalloc(&p, cap));
    hir__cuda_retire((hir__cuda *)b->ctx, l->scratch[k]);
    l->scratch[k] = p;
    l->scratch_cap[k] = cap;
  }
  *out = l->scratch[k];
  return HIR_OK;
}

static void hir__cuda_lane_free(hir__cuda_lane *l) {
  int k;
  if (l->blas) cublasDestroy(l->blas);
  if (l->workspace) cudaFree(l->workspace);
  for (k = 0; k < 8; k++)
    if (l->scratch[k]) cudaFree(l->scratch[k]);
  for (k = 0; k < HIR_DTYPE_COUNT; k++)
    if (l->ones[k]) cudaFree(l->ones[k]);
}

static void hir__cuda_destroy(hir_backend *b) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  int i, k;
  cudaSetDevice(c->device);
  hir__cuda_lane_free(&c->caller_lane);
  for (i = 0; i < c->nlanes; i++) hir__cuda_lane_free(&c->lanes[i]);
  for (k = 0; k < c->nretired; k++) cudaFree(c->retired[k]);
  if (c->kernels_state == 1) cudaLibraryUnload(c->kernels);
  for (k = 0; k < HIR__MAP_KERNELS; k++)
    if (c->map_state[k] == 1) cudaLibraryUnload(c->map_library[k]);
  if (c->nvrtc.lib) dlclose(c->nvrtc.lib);
  for (k = 0; k < HIR__LT_PLANS; k++) hir__lt_plan_free(&c->lt_plans[k]);
  if (c->lt) cublasLtDestroy(c->lt);
  if (c->capture) cudaStreamDestroy(c->capture);
  if (c->max_abs_out) cudaFree(c->max_abs_out);
  HIR_FREE(c);
  HIR_FREE(b);
}

static hir_status hir__cuda_alloc(hir_backend *b, size_t bytes, void **ptr) {
  cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
  if (e == cudaSuccess) return HIR_OK;
  snprintf(b->error, sizeof b->error, "cudaMalloc of %zu bytes failed on device %d: %s", bytes,
           ((hir__cuda *)b->ctx)->device, cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? HIR_ERR_NOMEM : HIR_ERR_BACKEND;
}
static void hir__cuda_release(hir_backend *b, void *ptr) {
  (void)b;
  cudaFree(ptr);
}
static void *hir__cuda_current(hir_backend *b) { return (void *)((hir__cuda *)b->ctx)->caller; }
/* A stream and its lane, made now: a run never waits for cuBLAS's setup. */
static hir_status hir__cuda_stream_create(hir_backend *b, void **s) {
  hir__cuda_lane *l;
  HIR__CU(b, cudaStreamCreateWithFlags((cudaStream_t *)s, cudaStreamNonBlocking));
  return hir__cuda_lane_of(b, *s, &l);
}
static void hir__cuda_stream_destroy(hir_backend *b, void *s) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  int i;
  for (i = 0; i < HIR__CUDA_SHARED; i++)
    if (c->shared[i] && c->shared[i] == (cudaStream_t)s) {
      if (--c->shared_refs[i] > 0) return;
      c->shared[i] = NULL;
      break;
    }
  for (i = 0; i < c->nlanes; i++) /* the stream's lane goes with it */
    if (c->lanes[i].stream == (cudaStream_t)s) {
      hir__cuda_lane_free(&c->lanes[i]);
      c->lanes[i] = c->lanes[--c->nlanes];
      break;
    }
  cudaStreamDestroy((cudaStream_t)s);
}
static hir_status hir__cuda_stream_shared(hir_backend *b, int index, void **s) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  if (index < 0 || index >= HIR__CUDA_SHARED) return hir__cuda_stream_create(b, s);
  if (!c->shared[index] && hir__cuda_stream_create(b, (void **)&c->shared[index]) != HIR_OK) {
    if (c->shared[index]) hir__cuda_stream_destroy(b, c->shared[index]); /* made, its lane not: neither is kept */
    c->shared[index] = NULL;
    return HIR_ERR_BACKEND;
  }
  c->shared_refs[index]++;
  *s = c->shared[index];
  return HIR_OK;
}
static hir_status hir__cuda_event_create(hir_backend *b, void **e) {
  HIR__CU(b, cudaEventCreateWithFlags((cudaEvent_t *)e, cudaEventDisableTiming));
  return HIR_OK;
}
static hir_status hir__cuda_timer_create(hir_backend *b, void **e) {
  HIR__CU(b, cudaEventCreate((cudaEvent_t *)e));
  return HIR_OK;
}
static hir_status hir__cuda_timer_elapsed(hir_backend *b, void *from, void *to, double *ms) {
  float f = 0;
  int was = 0;
  cudaError_t e;
  cudaGetDevice(&was); /* the caller's thread may be on another device */
  cudaSetDevice(((hir__cuda *)b->ctx)->device);
  e = cudaEventElapsedTime(&f, (cudaEvent_t)from, (cudaEvent_t)to);
  cudaSetDevice(was);
  *ms = f;
  if (e == cudaSuccess) return HIR_OK;
  if (e == cudaErrorNotReady) return (void)cudaGetLastError(), HIR_ERR_TIMEOUT;
  return hir__cuda_fail(b, "cudaEventElapsedTime", cudaGetErrorString(e), __FILE__, __LINE__);
}

/* Graph capture runs on a stream of the backend's own (the caller's may be
   the legacy default stream, which cannot capture); the caller's lane moves
   to it with its scratch and ones, so nothing allocates while capturing. The
   graph then launches on the caller's stream. */
static hir_status hir__cuda_graph_begin(hir_backend *b) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  if (!c->capture) HIR__CU(b, cudaStreamCreateWithFlags(&c->capture, cudaStreamNonBlocking));
  HIR__CU(b, cudaStreamBeginCapture(c->capture, cudaStreamCaptureModeThreadLocal));
  c->saved_caller = c->caller;
  c->caller = c->capture;
  return HIR_OK;
}

static hir_status hir__cuda_graph_end(hir_backend *b, void **graph) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  cudaGraph_t g = NULL;
  cudaGraphExec_t x = NULL;
  cudaError_t e = cudaStreamEndCapture(c->capture, &g);
  c->caller = c->saved_caller;
  *graph = NULL;
  if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags(&x, g, 0);
  if (g) cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    cudaGetLastError();
    snprintf(b->error, sizeof b->error, "the capture failed: %s", cudaGetErrorString(e));
    return HIR_ERR_UNSUPPORTED;
  }
  *graph = x;
  return HIR_OK;
}

static hir_status hir__cuda_graph_launch(hir_backend *b, void *graph) {
  HIR__CU(b, cudaGraphLaunch((cudaGraphExec_t)graph, ((hir__cuda *)b->ctx)->caller));
  return HIR_OK;
}

static void hir__cuda_graph_destroy(hir_backend *b, void *graph) {
  (void)b;
  cudaGraphExecDestroy((cudaGraphExec_t)graph);
}
static void hir__cuda_event_destroy(hir_backend *b, void *e) {
  (void)b;
  cudaEventDestroy((cudaEvent_t)e);
}
static hir_status hir__cuda_record(hir_backend *b, void *e, void *s) {
  HIR__CU(b, cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s));
  return HIR_OK;
}
static hir_status hir__cuda_wait(hir_backend *b, void *s, void *e) {
  HIR__CU(b, cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0));
  return HIR_OK;
}
static hir_status hir__cuda_sync(hir_backend *b, void *s) {
  HIR__CU(b, cudaStreamSynchronize((cudaStream_t)s));
  return HIR_OK;
}
static hir_status hir__cuda_query(hir_backend *b, void *s) {
  cudaError_t e = cudaStreamQuery((cudaStream_t)s);
  if (e == cudaSuccess) return HIR_OK;
  if (e == cudaErrorNotReady) return HIR_ERR_TIMEOUT;
  return hir__cuda_fail(b, "cudaStreamQuery", cudaGetErrorString(e), __FILE__, __LINE__);
}

/* Merges neighbouring axes that are contiguous in every tensor given. */
static void hir__collapse(int *nd, int64_t *sizes, int64_t (*strides)[HIR_MAX_DIMS], int nt) {
  int i, k, n = 0;
  int64_t s[HIR_MAX_DIMS], st[3][HIR_MAX_DIMS];
  for (i = 0; i < *nd; i++) {
    if (sizes[i] == 1) continue; /* size-1 axes carry no layout */
    if (n > 0) {
      int merge = 1;
      for (k = 0; k < nt; k++) merge &= st[k][n - 1] == strides[k][i] * sizes[i];
      if (merge) {
        s[n - 1] *= sizes[i];
        for (k = 0; k < nt; k++) st[k][n - 1] = strides[k][i];
        continue;
      }
    }
    s[n] = sizes[i];
    for (k = 0; k < nt; k++) st[k][n] = strides[k][i];
    n++;
  }
  *nd = n;
  for (i = 0; i < n; i++) {
    sizes[i] = s[i];
    for (k = 0; k < nt; k++) strides[k][i] = st[k][i];
  }
}

/* dst <- src for any strides (a stride of 0 in src repeats): the innermost
   axis as runs (filled by doubling when it repeats one element), the next
   axis with them in one 2-D copy where both tensors keep a row pitch, the
   rest as a host loop. */
static hir_status hir__cuda_copy(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *src) {
  cudaStream_t s = (cudaStream_t)stream;
  size_t es = hir_dtype_size(dst->dtype);
  int64_t sizes[HIR_MAX_DIMS], strides[2][HIR_MAX_DIMS], idx[HIR_MAX_DIMS] = {0}, calls = 0, run, rows;
  int nd = dst->ndims, d, inner;
  if (dst->dtype != src->dtype) {
    snprintf(b->error, sizeof b->error, "cuda backend: copy from %s to %s; dtypes must match", hir_dtype_name(src->dtype),
             hir_dtype_name(dst->dtype));
    return HIR_ERR_INVALID;
  }
  for (d = 0; d < nd; d++) {
    sizes[d] = dst->sizes[d];
    strides[0][d] = dst->strides[d];
    strides[1][d] = src->strides[d];
  }
  if (hir__numel(nd, sizes) == 0) return HIR_OK;
  hir__collapse(&nd, sizes, strides, 2);
  if (nd == 0) { /* one element */
    HIR__CU(b, cudaMemcpyAsync(dst->data, src->data, es, cudaMemcpyDeviceToDevice, s));
    return HIR_OK;
  }
  run = (strides[0][nd - 1] == 1 && strides[1][nd - 1] <= 1) ? sizes[nd - 1] : 1;
  if (nd >= 2 && nd <= 3 && strides[0][nd - 1] == 1 && strides[1][nd - 1] > 1 && strides[1][nd - 2] == 1) {
    hir_status st = hir__cuda_transpose(b, s, dst->data, src->data, es, nd, sizes, strides); /* [B,] R, C, tiled */
    if (st != HIR_ERR_UNSUPPORTED) return st;
  }
  if (run == 1) { /* element by element (a transpose): one kernel, where NVRTC gave it */
    hir_status st = hir__cuda_map(b, stream, HIR_UNARY_CAST, dst, src, NULL, 0);
    if (st != HIR_ERR_UNSUPPORTED) return st;
  }
  /* contiguous runs at a fixed pitch in both tensors: one 2-D copy for all of them */
  rows = run > 1 && strides[1][nd - 1] == 1 && nd >= 2 && strides[0][nd - 2] >= run && strides[1][nd - 2] >= run
             ? sizes[nd - 2] : 1;
  inner = nd - (run > 1) - (rows > 1); /* the axes iterated here */
  for (;;) {
    char *dp = (char *)dst->data, *sp = (char *)src->data;
    for (d = 0; d < inner; d++) {
      dp += idx[d] * strides[0][d] * (int64_t)es;
      sp += idx[d] * strides[1][d] * (int64_t)es;
    }
    if (rows > 1) {
      HIR__CU(b, cudaMemcpy2DAsync(dp, (size_t)(strides[0][nd - 2] * (int64_t)es), sp, (size_t)(strides[1][nd - 2] * (int64_t)es),
                                   (size_t)run * es, (size_t)rows, cudaMemcpyDeviceToDevice, s));
    } else if (run > 1 && strides[1][nd - 1] == 0) { /* one element repeated: copy it, then double */
      int64_t have = 1;
      HIR__CU(b, cudaMemcpyAsync(dp, sp, es, cudaMemcpyDeviceToDevice, s));
      while (have < run) {
        int64_t n = have < run - have ? have : run - have;
        HIR__CU(b, cudaMemcpyAsync(dp + have * (int64_t)es, dp, (size_t)n * es, cudaMemcpyDeviceToDevice, s));
        have += n;
        calls++;
      }
    } else if (run > 1) {
      HIR__CU(b, cudaMemcpyAsync(dp, sp, (size_t)run * es, cudaMemcpyDeviceToDevice, s));
    } else {
      HIR__CU(b, cudaMemcpyAsync(dp, sp, es, cudaMemcpyDeviceToDevice, s));
    }
    if (++calls > 65536) {
      snprintf(b->error, sizeof b->error, "cuda backend: a strided copy of %lld elements needs more than 65536 copy calls; "
               "make the tensors contiguous", (long long)hir__numel(dst->ndims, dst->sizes));
      return HIR_ERR_UNSUPPORTED;
    }
    for (d = inner - 1; d >= 0; d--) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
    if (d < 0) break;
  }
  return HIR_OK;
}

/* t contiguous: itself, or a copy into scratch k of the lane. */
static hir_status hir__cuda_dense(hir_backend *b, hir__cuda_lane *l, int k, const hir_tensor *t, const hir_tensor *shape,
                                  hir_tensor *out) {
  hir_status st;
  void *p;
  *out = *t;
  if (hir__is_contiguous(t)) return HIR_OK;
  if ((st = hir__cuda_scratch(b, l, k, (size_t)hir__numel(shape->ndims, shape->sizes) * hir_dtype_size(t->dtype), &p)) != HIR_OK)
    return st;
  out->data = p;
  hir__contiguous_strides(out);
  return hir__cuda_copy(b, l->stream, out, t);
}

/* t <- zeros at its strides, the bytes between its elements left alone (a
   chunk's output, a caller's padding): what an empty sum or contraction
   gives. One memset where it is contiguous, else a copy of one zero (in
   scratch 7) seen at stride 0 everywhere. */
static hir_status hir__cuda_zero(hir_backend *b, hir__cuda_lane *l, const hir_tensor *t) {
  size_t es = hir_dtype_size(t->dtype);
  hir_tensor zero = *t;
  hir_status st;
  int d;
  if (hir__is_contiguous(t)) {
    HIR__CU(b, cudaMemsetAsync(t->data, 0, (size_t)hir__numel(t->ndims, t->sizes) * es, l->stream));
    return HIR_OK;
  }
  if ((st = hir__cuda_scratch(b, l, 7, es, &zero.data)) != HIR_OK) return st;
  HIR__CU(b, cudaMemsetAsync(zero.data, 0, es, l->stream));
  for (d = 0; d < zero.ndims; d++) zero.strides[d] = 0;
  return hir__cuda_copy(b, l->stream, t, &zero);
}

/* ---- elementwise kernels: CUDA C compiled at first use by NVRTC ----
   One kernel computes any op of the tables (HIR_UNARY_OP_LIST,
   HIR_BINARY_OP_LIST: their expressions become its cases) over tensors of
   any strides and dtypes, in float, or in double where one is f64. NVRTC is
   loaded with dlopen, so nothing more is linked; without it the unary ops
   are refused with a message, and binary ops keep cuBLAS. */
static const char hir__cuda_map_head[] =
    "typedef long long i64;\n"
    "typedef unsigned short u16;\n"
    "struct hir_map_args {\n"
    "  void *dst; const void *a, *b; double s;\n"
    "  int op, binary, nd, dt_dst, dt_a, dt_b; i64 n;\n"
    "  i64 sizes[8], sd[8], sa[8], sb[8];\n"
    "};\n"
    "__device__ __forceinline__ float hir_h2f(u16 h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n"
    "__device__ __forceinline__ u16 hir_f2h(float f) { u16 h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    "__device__ __forceinline__ float hir_b2f(u16 h) { return __uint_as_float((unsigned)h << 16); }\n"
    "__device__ __forceinline__ u16 hir_f2b(float f) { u16 h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    /* fp8: the host's conversions, the same text (HIR__FP8_ENCODE_BODY, HIR__FP8_DECODE_BODY) */
    "__device__ unsigned char hir_fp8_from_bits(unsigned u, int eb, int mb, unsigned maxc) {" HIR__XSTR(HIR__FP8_ENCODE_BODY) "}\n"
    "__device__ float hir_fp8_finite(unsigned b, int eb, int mb) {" HIR__XSTR(HIR__FP8_DECODE_BODY) "}\n"
    "__device__ float hir_fp8_to_f(unsigned b, int eb, int mb) {\n"
    "  if (eb == 4 && (b & 0x7f) == 0x7f) return __int_as_float(0x7fc00000);\n"
    "  if (eb == 5 && (b & 0x7c) == 0x7c) return (b & 3) ? __int_as_float(0x7fc00000) : __int_as_float(b & 0x80 ? 0xff800000u : 0x7f800000u);\n"
    "  return hir_fp8_finite(b, eb, mb);\n"
    "}\n"
    "__device__ unsigned char hir_f2fp8(float f, int eb, int mb, unsigned maxc) { return hir_fp8_from_bits(__float_as_uint(f), eb, mb, maxc); }\n"
    "template <typename T> __device__ __forceinline__ T hir_ld(const void *p, int dt, i64 i) {\n"
    "  switch (dt) {\n"
    "  case 0: return (T)((const float *)p)[i];\n"
    "  case 1: return (T)((const double *)p)[i];\n"
    "  case 2: return (T)hir_h2f(((const u16 *)p)[i]);\n"
    "  case 3: return (T)hir_b2f(((const u16 *)p)[i]);\n"
    "  case 6: return (T)((const long long *)p)[i];\n"
    "  default: return (T)hir_fp8_to_f(((const unsigned char *)p)[i], dt == 4 ? 4 : 5, dt == 4 ? 3 : 2);\n"
    "  }\n"
    "}\n"
    /* into int64 as hir__double_to_i64: toward zero, saturating, NaN the most negative */
    "__device__ __forceinline__ long long hir_to_i64(long long v) { return v; }\n"
    "__device__ __forceinline__ long long hir_to_i64(double v) { return __double2ll_rz(v); }\n"
    "__device__ __forceinline__ long long hir_to_i64(float v) { return __double2ll_rz((double)v); }\n"
    "template <typename T> __device__ __forceinline__ void hir_st(void *p, int dt, i64 i, T v) {\n"
    "  switch (dt) {\n"
    "  case 0: ((float *)p)[i] = (float)v; break;\n"
    "  case 1: ((double *)p)[i] = (double)v; break;\n"
    "  case 2: ((u16 *)p)[i] = hir_f2h((float)v); break;\n"
    "  case 3: ((u16 *)p)[i] = hir_f2b((float)v); break;\n"
    "  case 6: ((long long *)p)[i] = hir_to_i64(v); break;\n"
    "  default: ((unsigned char *)p)[i] = dt == 4 ? hir_f2fp8((float)v, 4, 3, 0x7eu) : hir_f2fp8((float)v, 5, 2, 0x7bu); break;\n"
    "  }\n"
    "}\n"
    "#define HIR_C(v) ((T)(v))\n";
static const char *const hir__cuda_map_tail[] = { /* pieces under C's 4095-character limit */
    "__device__ __forceinline__ void hir_offsets(const hir_map_args &a, i64 i, i64 &od, i64 &oa, i64 &ob) {\n"
    "  i64 r = i;\n"
    "  od = oa = ob = 0;\n"
    "  if (a.nd == 1) od = i * a.sd[0], oa = i * a.sa[0], ob = i * a.sb[0];\n"
    "  else for (int d = a.nd - 1; d >= 0; d--) {\n"
    "    i64 k = r % a.sizes[d];\n"
    "    r /= a.sizes[d];\n"
    "    od += k * a.sd[d], oa += k * a.sa[d], ob += k * a.sb[d];\n"
    "  }\n"
    "}\n"
    "template <typename T> __device__ void hir_map(const hir_map_args &a) {\n"
    "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < a.n; i += (i64)gridDim.x * blockDim.x) {\n"
    "    i64 od, oa, ob;\n"
    "    hir_offsets(a, i, od, oa, ob);\n"
    "    T x = hir_ld<T>(a.a, a.dt_a, oa);\n"
    "    hir_st<T>(a.dst, a.dt_dst, od, a.binary ? hir_binary<T>(a.op, x, hir_ld<T>(a.b, a.dt_b, ob)) : hir_unary<T>(a.op, x, (T)a.s));\n"
    "  }\n"
    "}\n"
    "",
    /* value j of a 16-byte vector of dtype DT, in registers: a vector read through a pointer would live in local
       memory (measured: 1.8x the time of an add) */
    "template <int DT> struct hir_lanes;\n"
    "__device__ __forceinline__ unsigned hir_word(const uint4 &v, int w) { return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w; }\n"
    "__device__ __forceinline__ void hir_set_word(uint4 &v, int w, unsigned u) { if (w == 0) v.x = u; else if (w == 1) v.y = u; else if (w == 2) v.z = u; else v.w = u; }\n"
    "__device__ __forceinline__ void hir_set_half(uint4 &v, int j, unsigned h) {\n"
    "  unsigned u = hir_word(v, j / 2);\n"
    "  hir_set_word(v, j / 2, j & 1 ? (u & 0xffffu) | (h << 16) : (u & 0xffff0000u) | h);\n"
    "}\n"
    "template <> struct hir_lanes<0> { enum { E = 4 }; typedef float T;\n"
    "  __device__ static T get(const uint4 &v, int j) { return __uint_as_float(hir_word(v, j)); }\n"
    "  __device__ static void put(uint4 &v, int j, T x) { hir_set_word(v, j, __float_as_uint(x)); } };\n"
    "template <> struct hir_lanes<1> { enum { E = 2 }; typedef double T;\n"
    "  __device__ static T get(const uint4 &v, int j) { return __hiloint2double((int)hir_word(v, 2 * j + 1), (int)hir_word(v, 2 * j)); }\n"
    "  __device__ static void put(uint4 &v, int j, T x) { hir_set_word(v, 2 * j, (unsigned)__double2loint(x)); hir_set_word(v, 2 * j + 1, (unsigned)__double2hiint(x)); } };\n"
    "template <> struct hir_lanes<2> { enum { E = 8 }; typedef float T;\n"
    "  __device__ static T get(const uint4 &v, int j) { unsigned u = hir_word(v, j / 2); return hir_h2f((u16)(j & 1 ? u >> 16 : u)); }\n"
    "  __device__ static void put(uint4 &v, int j, T x) { hir_set_half(v, j, hir_f2h(x)); } };\n"
    "template <> struct hir_lanes<3> { enum { E = 8 }; typedef float T;\n"
    "  __device__ static T get(const uint4 &v, int j) { unsigned u = hir_word(v, j / 2); return __uint_as_float(j & 1 ? u & 0xffff0000u : u << 16); }\n"
    "  __device__ static void put(uint4 &v, int j, T x) { hir_set_half(v, j, hir_f2b(x)); } };\n"
    "",
    /* dense tensors of one dtype DT: 16 bytes a thread, the dtype known when compiled; nd 2: [rows, cols], cols whole
       vectors, each operand dense, a row repeated down the rows (strides 0, 1) or a value a row (stride 0 along it) */
    "template <int DT> __device__ typename hir_lanes<DT>::T hir_vec_operand(const void *p, const i64 *s, i64 v, i64 cols, uint4 &x) {\n"
    "  typedef hir_lanes<DT> L;\n"
    "  if (!cols || (s[0] == cols && s[1] == 1)) x = ((const uint4 *)p)[v];\n"
    "  else if (s[1]) x = ((const uint4 *)p)[(v * L::E) % cols / L::E];\n"
    "  else return hir_ld<typename L::T>(p, DT, (v * L::E) / cols * s[0]);\n" /* its value on this row */
    "  return 0;\n"
    "}\n"
    "template <int DT> __device__ void hir_vec(const hir_map_args &a) {\n"
    "  typedef hir_lanes<DT> L;\n"
    "  typedef typename L::T T;\n"
    "  i64 nv = a.n / L::E, step = (i64)gridDim.x * blockDim.x, i = blockIdx.x * (i64)blockDim.x + threadIdx.x;\n"
    "  i64 cols = a.nd == 2 ? a.sizes[1] : 0;\n"
    "  int a_row = cols && !a.sa[1], b_row = cols && !a.sb[1];\n" /* a value a row */
    "  for (i64 v = i; v < nv; v += step) {\n"
    "    uint4 x = make_uint4(0, 0, 0, 0), y = x, r = x;\n"
    "    T xs = hir_vec_operand<DT>(a.a, a.sa, v, cols, x), ys = a.binary ? hir_vec_operand<DT>(a.b, a.sb, v, cols, y) : (T)0;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < L::E; j++) {\n"
    "      T xv = a_row ? xs : L::get(x, j);\n"
    "      L::put(r, j, a.binary ? hir_binary<T>(a.op, xv, b_row ? ys : L::get(y, j)) : hir_unary<T>(a.op, xv, (T)a.s));\n"
    "    }\n"
    "    ((uint4 *)a.dst)[v] = r;\n"
    "  }\n"
    "  for (i64 k = nv * L::E + i; k < a.n; k += step) {\n"
    "    T xv = hir_ld<T>(a.a, DT, k);\n"
    "    hir_st<T>(a.dst, DT, k, a.binary ? hir_binary<T>(a.op, xv, hir_ld<T>(a.b, DT, k)) : hir_unary<T>(a.op, xv, (T)a.s));\n"
    "  }\n"
    "}\n"
    /* a cast from one dense dtype DA into another DD: 8 values a thread, in registers (an f32 vector holds 4: two
       of them; the 16-bit branch is compiled for f32 too, as f16, never run). Casts only: with every unary op
       unrolled into each of its dtype pairs it took 5.1 s of NVRTC's 8.8 s for all (bench/NOTES.md section 45). */
    "template <int D> __device__ void hir_load8(const void *p, i64 v, float *f) {\n"
    "  if (D == 0) {\n"
    "    uint4 q0 = ((const uint4 *)p)[2 * v], q1 = ((const uint4 *)p)[2 * v + 1];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 4; j++) f[j] = hir_lanes<0>::get(q0, j), f[4 + j] = hir_lanes<0>::get(q1, j);\n"
    "  } else {\n"
    "    uint4 q = ((const uint4 *)p)[v];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 8; j++) f[j] = hir_lanes<D == 0 ? 2 : D>::get(q, j);\n"
    "  }\n"
    "}\n"
    "template <int D> __device__ void hir_store8(void *p, i64 v, const float *f) {\n"
    "  uint4 q0 = make_uint4(0, 0, 0, 0), q1 = q0;\n"
    "  if (D == 0) {\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 4; j++) hir_lanes<0>::put(q0, j, f[j]), hir_lanes<0>::put(q1, j, f[4 + j]);\n"
    "    ((uint4 *)p)[2 * v] = q0, ((uint4 *)p)[2 * v + 1] = q1;\n"
    "  } else {\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 8; j++) hir_lanes<D == 0 ? 2 : D>::put(q0, j, f[j]);\n"
    "    ((uint4 *)p)[v] = q0;\n"
    "  }\n"
    "}\n"
    "template <int DA, int DD> __device__ void hir_cast_run(const hir_map_args &a) {\n"
    "  i64 nv = a.n / 8, step = (i64)gridDim.x * blockDim.x, i = blockIdx.x * (i64)blockDim.x + threadIdx.x;\n"
    "  for (i64 v = i; v < nv; v += step) {\n"
    "    float f[8];\n"
    "    hir_load8<DA>(a.a, v, f);\n"
    "    hir_store8<DD>(a.dst, v, f);\n"
    "  }\n"
    "  for (i64 k = nv * 8 + i; k < a.n; k += step) hir_st<float>(a.dst, DD, k, hir_ld<float>(a.a, DA, k));\n"
    "}\n"
    /* the largest |a - b| and |b| (dense, dtype dt_a) into dst's two words: non-negative floats order as their bits */
    "__device__ void hir_max_abs(const hir_map_args &a) {\n"
    "  float d = 0.f, m = 0.f, inf = __int_as_float(0x7f800000);\n"
    "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < a.n; i += (i64)gridDim.x * blockDim.x) {\n"
    "    double y = hir_ld<double>(a.b, a.dt_a, i), e = hir_ld<double>(a.a, a.dt_a, i) - y;\n"
    "    float fe = (float)(e < 0 ? -e : e), fy = (float)(y < 0 ? -y : y);\n"
    "    d = fe <= d ? d : fe == fe ? fe : inf;\n"
    "    m = fy <= m ? m : fy == fy ? fy : inf;\n"
    "  }\n"
    "  for (int o = 16; o > 0; o /= 2) d = fmaxf(d, __shfl_xor_sync(0xffffffffu, d, o)), m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));\n"
    "  if ((threadIdx.x & 31) == 0) atomicMax((unsigned *)a.dst, __float_as_uint(d)), atomicMax((unsigned *)a.dst + 1, __float_as_uint(m));\n"
    "}\n"};
#define HIR__EXPR_TEXT_BINARY(e, symbol, builder, expr) #expr,
#define HIR__EXPR_TEXT_UNARY(e, name, f, expr) #expr,
static const char *const hir__binary_exprs[] = {HIR_BINARY_OP_LIST(HIR__EXPR_TEXT_BINARY)};
static const char *const hir__unary_exprs[] = {HIR_UNARY_OP_LIST(HIR__EXPR_TEXT_UNARY)};
/* Each kernel its own program: one instantiation compiles in about a tenth of the time of all of them. */
static const char *const hir__map_entries[HIR__MAP_KERNELS] = {
    "extern \"C\" __global__ void hir_map_f32(hir_map_args a) { hir_map<float>(a); }\n",
    "extern \"C\" __global__ void hir_map_f64(hir_map_args a) { hir_map<double>(a); }\n",
    "extern \"C\" __global__ void hir_vec_f32(hir_map_args a) { hir_vec<0>(a); }\n",
    "extern \"C\" __global__ void hir_vec_f64(hir_map_args a) { hir_vec<1>(a); }\n",
    "extern \"C\" __global__ void hir_vec_f16(hir_map_args a) { hir_vec<2>(a); }\n",
    "extern \"C\" __global__ void hir_vec_bf16(hir_map_args a) { hir_vec<3>(a); }\n",
    "extern \"C\" __global__ void hir_max_abs_all(hir_map_args a) { hir_max_abs(a); }\n",
    /* dst [rows, ld] = raw [rows, cols] * sa[row] * sb[col]: per-row scales after an fp8 GEMM */
    "struct hir_scale_args { void *dst; const float *raw, *sa, *sb; i64 rows, cols, ld; int dt, vec; };\n"
    "extern \"C\" __global__ void hir_scale_rc(hir_scale_args a) {\n" /* a block a row; vec: raw's rows and sb 16-byte aligned */
    "  for (i64 r = blockIdx.x; r < a.rows; r += gridDim.x) {\n"
    "    const float *row = a.raw + r * a.cols;\n"
    "    float s = a.sa[r];\n"
    "    i64 c = 0;\n"
    "    if (a.vec)\n"
    "      for (c = 4 * (i64)threadIdx.x; c + 3 < a.cols; c += 4 * (i64)blockDim.x) {\n"
    "        float4 v = *(const float4 *)(row + c), w = *(const float4 *)(a.sb + c);\n"
    "        hir_st<float>(a.dst, a.dt, r * a.ld + c, v.x * s * w.x);\n"
    "        hir_st<float>(a.dst, a.dt, r * a.ld + c + 1, v.y * s * w.y);\n"
    "        hir_st<float>(a.dst, a.dt, r * a.ld + c + 2, v.z * s * w.z);\n"
    "        hir_st<float>(a.dst, a.dt, r * a.ld + c + 3, v.w * s * w.w);\n"
    "      }\n"
    "    for (c = (a.vec ? a.cols - a.cols % 4 : 0) + threadIdx.x; c < a.cols; c += blockDim.x)\n"
    "      hir_st<float>(a.dst, a.dt, r * a.ld + c, row[c] * s * a.sb[c]);\n"
    "  }\n"
    "}\n",
    /* dst[r] = the sum of src's row r [cols], in double, rounded once: a block a row, 16 bytes a thread where rows
       are aligned (vec); blockDim a power of two from 32 */
    "struct hir_rows_args { void *dst; const void *src; i64 rows, cols; int dt, vec; };\n"
    "template <int DT> __device__ double hir_lanes_sum(const uint4 &x) {\n"
    "  double s = 0;\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < hir_lanes<DT>::E; j++) s += hir_lanes<DT>::get(x, j);\n"
    "  return s;\n"
    "}\n"
    "extern \"C\" __global__ void hir_sum_rows(hir_rows_args a) {\n"
    "  __shared__ double warps[32];\n"
    "  const int es = a.dt == 1 ? 8 : a.dt == 0 ? 4 : 2, E = 16 / es;\n"
    "  for (i64 r = blockIdx.x; r < a.rows; r += gridDim.x) {\n"
    "    const char *row = (const char *)a.src + r * a.cols * es;\n"
    "    double acc = 0;\n"
    "    i64 c = 0;\n"
    "    if (a.vec)\n"
    "      for (c = (i64)threadIdx.x * E; c + E <= a.cols; c += (i64)blockDim.x * E) {\n"
    "        uint4 x = *(const uint4 *)(row + c * es);\n"
    "        if (a.dt == 0) acc += hir_lanes_sum<0>(x);\n"
    "        else if (a.dt == 1) acc += hir_lanes_sum<1>(x);\n"
    "        else if (a.dt == 2) acc += hir_lanes_sum<2>(x);\n"
    "        else acc += hir_lanes_sum<3>(x);\n"
    "      }\n"
    "    for (c = (a.vec ? a.cols - a.cols % E : 0) + threadIdx.x; c < a.cols; c += blockDim.x) acc += hir_ld<double>(row, a.dt, c);\n"
    "    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);\n"
    "    if (blockDim.x > 32) {\n"
    "      if ((threadIdx.x & 31) == 0) warps[threadIdx.x / 32] = acc;\n"
    "      __syncthreads();\n"
    "      acc = threadIdx.x < blockDim.x / 32 ? warps[threadIdx.x] : 0;\n"
    "      for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);\n"
    "      __syncthreads();\n"
    "    }\n"
    "    if (threadIdx.x == 0) hir_st<double>(a.dst, a.dt, r, acc);\n"
    "  }\n"
    "}\n",
    "extern \"C\" __global__ void hir_cast_vec(hir_map_args a) {\n" /* f32, f16 and bf16 into one another */
    "  switch (a.dt_a * 4 + a.dt_dst) {\n"
    "  case 2: hir_cast_run<0, 2>(a); break;\n"
    "  case 3: hir_cast_run<0, 3>(a); break;\n"
    "  case 8: hir_cast_run<2, 0>(a); break;\n"
    "  case 11: hir_cast_run<2, 3>(a); break;\n"
    "  case 12: hir_cast_run<3, 0>(a); break;\n"
    "  case 14: hir_cast_run<3, 2>(a); break;\n"
    "  }\n"
    "}\n",
    /* hir_backend.layer_norm: a block a row, three passes over it (the later ones from the cache; vec: the row in
       registers, 16 bytes a load, x, dst, the weight and the bias of one dtype DT, at most 4 vectors a thread) */
    "struct hir_ln_args { void *dst; const void *x, *w, *b; i64 rows, cols; double eps; int dt_dst, dt_x, dt_w, dt_b, vec, rms; };\n"
    "template <typename T> __device__ T hir_block_sum(T v, T *part) {\n" /* every thread gets the block's sum */
    "  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  if (blockDim.x > 32) {\n"
    "    __syncthreads();\n" /* the last call's readers are done with part */
    "    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;\n"
    "    __syncthreads();\n"
    "    v = (threadIdx.x & 31) < blockDim.x / 32 ? part[threadIdx.x & 31] : (T)0;\n"
    "    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  }\n"
    "  return v;\n"
    "}\n"
    "template <typename T> __device__ void hir_ln(const hir_ln_args &a) {\n"
    "  __shared__ T part[32];\n"
    "  for (i64 r = blockIdx.x; r < a.rows; r += gridDim.x) {\n"
    "    i64 base = r * a.cols;\n"
    "    T s = 0, q = 0;\n"
    "    for (i64 c = threadIdx.x; !a.rms && c < a.cols; c += blockDim.x) s += hir_ld<T>(a.x, a.dt_x, base + c);\n"
    "    T mean = a.rms ? (T)0 : hir_block_sum<T>(s, part) / (T)a.cols;\n"
    "    for (i64 c = threadIdx.x; c < a.cols; c += blockDim.x) { T d = hir_ld<T>(a.x, a.dt_x, base + c) - mean; q += d * d; }\n"
    "    T rstd = (T)1 / sqrt(hir_block_sum<T>(q, part) / (T)a.cols + (T)a.eps);\n"
    "    for (i64 c = threadIdx.x; c < a.cols; c += blockDim.x) {\n"
    "      T y = (hir_ld<T>(a.x, a.dt_x, base + c) - mean) * rstd;\n"
    "      if (a.w) y = y * hir_ld<T>(a.w, a.dt_w, c);\n"
    "      if (a.b) y = y + hir_ld<T>(a.b, a.dt_b, c);\n"
    "      hir_st<T>(a.dst, a.dt_dst, base + c, y);\n"
    "    }\n"
    "  }\n"
    "}\n"
    "template <int DT> __device__ void hir_ln_vec(const hir_ln_args &a) {\n"
    "  typedef hir_lanes<DT> L;\n"
    "  __shared__ float part[32];\n"
    "  i64 nvec = a.cols / L::E;\n"
    "  for (i64 r = blockIdx.x; r < a.rows; r += gridDim.x) {\n"
    "    const uint4 *row = (const uint4 *)a.x + r * nvec;\n"
    "    uint4 v[4];\n"
    "    float s = 0, q = 0;\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < 4; k++) {\n"
    "      i64 at = threadIdx.x + (i64)k * blockDim.x;\n"
    "      if (at < nvec) {\n"
    "        v[k] = row[at];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < L::E; j++) s += L::get(v[k], j);\n"
    "      }\n"
    "    }\n"
    "    float mean = a.rms ? 0.f : hir_block_sum<float>(s, part) / (float)a.cols;\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < 4; k++)\n"
    "      if (threadIdx.x + (i64)k * blockDim.x < nvec)\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < L::E; j++) { float d = L::get(v[k], j) - mean; q += d * d; }\n"
    "    float rstd = 1.f / sqrt(hir_block_sum<float>(q, part) / (float)a.cols + (float)a.eps);\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < 4; k++) {\n"
    "      i64 at = threadIdx.x + (i64)k * blockDim.x;\n"
    "      if (at < nvec) {\n"
    "        uint4 o = v[k], wv = a.w ? ((const uint4 *)a.w)[at] : o, bv = a.b ? ((const uint4 *)a.b)[at] : o;\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < L::E; j++) {\n"
    "          float y = (L::get(v[k], j) - mean) * rstd;\n"
    "          if (a.w) y = y * L::get(wv, j);\n"
    "          if (a.b) y = y + L::get(bv, j);\n"
    "          L::put(o, j, y);\n"
    "        }\n"
    "        ((uint4 *)a.dst)[r * nvec + at] = o;\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void hir_layer_norm(hir_ln_args a) {\n"
    "  if (a.vec && a.dt_x == 0) hir_ln_vec<0>(a);\n"
    "  else if (a.vec && a.dt_x == 2) hir_ln_vec<2>(a);\n"
    "  else if (a.vec && a.dt_x == 3) hir_ln_vec<3>(a);\n"
    "  else if (a.dt_x == 1) hir_ln<double>(a);\n"
    "  else hir_ln<float>(a);\n"
    "}\n",
    /* dst[b, r, c] = src[b, r, c] where src's r and dst's c are contiguous (a transposing copy): 32 x 32 tiles through
       shared memory, so both sides move whole rows; elements of es bytes */
    "struct hir_tr_args { void *dst; const void *src; i64 B, R, C, dst_b, dst_r, src_b, src_c; int es; };\n"
    "template <typename E> __device__ void hir_tr(const hir_tr_args &a) {\n"
    "  __shared__ E tile[32][33];\n"
    "  const E *src = (const E *)a.src;\n"
    "  E *dst = (E *)a.dst;\n"
    "  i64 c0 = blockIdx.x * (i64)32;\n"
    "  for (i64 b = blockIdx.z; b < a.B; b += gridDim.z)\n"
    "    for (i64 r0 = blockIdx.y * (i64)32; r0 < a.R; r0 += gridDim.y * (i64)32) {\n"
    "      for (int j = threadIdx.y; j < 32; j += blockDim.y) {\n" /* read along r: src's contiguous axis */
    "        i64 r = r0 + threadIdx.x, c = c0 + j;\n"
    "        if (r < a.R && c < a.C) tile[j][threadIdx.x] = src[b * a.src_b + r + c * a.src_c];\n"
    "      }\n"
    "      __syncthreads();\n"
    "      for (int j = threadIdx.y; j < 32; j += blockDim.y) {\n" /* write along c: dst's */
    "        i64 r = r0 + j, c = c0 + threadIdx.x;\n"
    "        if (r < a.R && c < a.C) dst[b * a.dst_b + r * a.dst_r + c] = tile[threadIdx.x][j];\n"
    "      }\n"
    "      __syncthreads();\n"
    "    }\n"
    "}\n"
    "extern \"C\" __global__ void hir_transpose(hir_tr_args a) {\n"
    "  if (a.es == 1) hir_tr<unsigned char>(a);\n"
    "  else if (a.es == 2) hir_tr<unsigned short>(a);\n"
    "  else if (a.es == 4) hir_tr<unsigned>(a);\n"
    "  else hir_tr<unsigned long long>(a);\n"
    "}\n",
    /* hir_backend.rand: hir_rand_value's Philox-4x32-10, the element at coordinates c numbered sum (base + c) * gs */
    "struct hir_rand_args { void *dst; i64 n; int nd, dt, bits; unsigned key0, key1; i64 sizes[8], sd[8], base[8], gs[8]; };\n"
    "extern \"C\" __global__ void hir_rand(hir_rand_args a) {\n"
    "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < a.n; i += (i64)gridDim.x * blockDim.x) {\n"
    "    i64 r = i, od = 0;\n"
    "    unsigned long long at = 0;\n"
    "    for (int d = a.nd - 1; d >= 0; d--) {\n"
    "      i64 k = r % a.sizes[d];\n"
    "      r /= a.sizes[d];\n"
    "      od += k * a.sd[d], at += (unsigned long long)(a.base[d] + k) * (unsigned long long)a.gs[d];\n"
    "    }\n"
    "    unsigned c0 = (unsigned)at, c1 = (unsigned)(at >> 32), c2 = 0, c3 = 0, k0 = a.key0, k1 = a.key1;\n"
    "    for (int round = 0; round < 10; round++) {\n"
    "      unsigned n0 = __umulhi(0xCD9E8D57u, c2) ^ c1 ^ k0, n2 = __umulhi(0xD2511F53u, c0) ^ c3 ^ k1;\n"
    "      c1 = 0xCD9E8D57u * c2, c3 = 0xD2511F53u * c0, c0 = n0, c2 = n2;\n"
    "      k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;\n"
    "    }\n"
    "    if (!a.bits && a.dt == 6) ((long long *)a.dst)[od] = (long long)at;\n"
    "    else hir_st<double>(a.dst, a.dt, od, a.bits ? (double)(c0 >> (32 - a.bits)) / (double)(1ull << a.bits) : (double)at);\n"
    "  }\n"
    "}\n",
    /* hir_backend.max, and int64's sums: a warp an output element, its lanes over the reduced elements (any
       strides); floats in double, int64 exactly (sums wrapping) */
    "struct hir_reduce_args { void *dst; const void *src; i64 nout, nred; int nd, dt, sum; i64 sizes[8], ss[8], sd[8]; int red[8]; };\n"
    "__device__ double hir_max_nan(double x, double y) { return x != x || y != y ? x + y : x > y ? x : y; }\n"
    "__device__ long long hir_i64_fold(int sum, long long x, long long y) {\n"
    "  return sum ? (long long)((unsigned long long)x + (unsigned long long)y) : x > y ? x : y;\n"
    "}\n"
    "extern \"C\" __global__ void hir_reduce_axes(hir_reduce_args a) {\n"
    "  const int lane = threadIdx.x & 31;\n"
    "  const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;\n"
    "  for (i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < a.nout; w += warps) {\n"
    "    i64 r = w, os = 0, od = 0;\n"
    "    for (int d = a.nd - 1; d >= 0; d--)\n"
    "      if (!a.red[d]) {\n"
    "        i64 k = r % a.sizes[d];\n"
    "        r /= a.sizes[d], os += k * a.ss[d], od += k * a.sd[d];\n"
    "      }\n"
    "    double m = __longlong_as_double(0xfff0000000000000ll);\n"
    "    long long n = a.sum ? 0 : (long long)0x8000000000000000ull;\n"
    "    for (i64 j = lane; j < a.nred; j += 32) {\n"
    "      i64 q = j, o = os;\n"
    "      for (int d = a.nd - 1; d >= 0; d--)\n"
    "        if (a.red[d]) {\n"
    "          i64 k = q % a.sizes[d];\n"
    "          q /= a.sizes[d], o += k * a.ss[d];\n"
    "        }\n"
    "      if (a.dt == 6) n = hir_i64_fold(a.sum, n, ((const long long *)a.src)[o]);\n"
    "      else m = hir_max_nan(m, hir_ld<double>(a.src, a.dt, o));\n"
    "    }\n"
    "    for (int o = 16; o > 0; o /= 2)\n"
    "      if (a.dt == 6) n = hir_i64_fold(a.sum, n, __shfl_xor_sync(0xffffffffu, n, o));\n"
    "      else m = hir_max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));\n"
    "    if (lane == 0 && a.dt == 6) ((long long *)a.dst)[od] = n;\n"
    "    else if (lane == 0) hir_st<double>(a.dst, a.dt, od, m);\n"
    "  }\n"
    "}\n",
    /* int64's elementwise ops (hir__unary_on_i64), exact, by hir__cuda_map_source's hir_i64_unary and hir_i64_binary */
    "extern \"C\" __global__ void hir_map_i64(hir_map_args a) {\n"
    "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < a.n; i += (i64)gridDim.x * blockDim.x) {\n"
    "    i64 od, oa, ob;\n"
    "    hir_offsets(a, i, od, oa, ob);\n"
    "    long long x = ((const long long *)a.a)[oa];\n"
    "    ((long long *)a.dst)[od] = a.binary ? hir_i64_binary(a.op, x, ((const long long *)a.b)[ob]) : hir_i64_unary(a.op, x, (long long)a.s);\n"
    "  }\n"
    "}\n",
    /* MoE (hir__cpu_moe_index and hir__cpu_scatter_rows, a thread an element): steps 0-3 hir_moe_step's (the route's
       first phase, then 6 its second), 5 the row moves, `unit` bytes a thread */
    "struct hir_moe_args { long long *out, *out2; const long long *in, *counts; i64 in_stride, T, R, E; int step;\n"
    "                      char *dst; const char *src; i64 n, rows, row, unit; };\n"
    "__device__ i64 hir_moe_count(const hir_moe_args &a, i64 s) { i64 c = a.counts[s]; return c < 0 ? 0 : c < a.T ? c : a.T; }\n"
    "extern \"C\" __global__ void hir_moe(hir_moe_args a) {\n"
    "  const i64 C = a.T * a.R, per = a.E / a.R;\n"
    "  const i64 n = a.step == 5 ? a.n * (a.row / a.unit) : a.step == 0 ? (C > a.R ? C : a.R) : a.step == 6 ? a.T : C;\n"
    "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n"
    "    if (a.step == 5) {\n"
    "      i64 r = i / (a.row / a.unit), w = i % (a.row / a.unit), to = a.out[r];\n"
    "      if (to < 0 || to >= a.rows) continue;\n"
    "      const char *s = a.src + r * a.row + w * a.unit;\n"
    "      char *d = a.dst + to * a.row + w * a.unit;\n"
    "      if (a.unit == 8) *(unsigned long long *)d = *(const unsigned long long *)s;\n"
    "      else if (a.unit == 4) *(unsigned *)d = *(const unsigned *)s;\n"
    "      else if (a.unit == 2) *(unsigned short *)d = *(const unsigned short *)s;\n"
    "      else *d = *s;\n"
    "    } else if (a.step == 0) { /* route, phase 1: out2 all -1, the counts */\n"
    "      if (i < C) a.out2[i] = -1;\n"
    "      if (i < a.R) {\n"
    "        long long c = 0;\n"
    "        for (i64 t = 0; t < a.T; t++) { long long e = a.in[t * a.in_stride]; c += e >= 0 && e < a.E && e / per == i; }\n"
    "        ((long long *)a.counts)[i] = c;\n"
    "      }\n"
    "    } else if (a.step == 6) { /* route, phase 2: each token's row */\n"
    "      long long e = a.in[i * a.in_stride], k = 0;\n"
    "      if (e < 0 || e >= a.E) { a.out[i] = -1; continue; }\n"
    "      for (i64 j = 0; j < a.T; j++) {\n"
    "        long long f = a.in[j * a.in_stride];\n"
    "        k += f >= 0 && f < a.E && f / per == e / per && (f < e || (f == e && j < i));\n"
    "      }\n"
    "      a.out[i] = e / per * a.T + k;\n"
    "      a.out2[e / per * a.T + k] = i;\n"
    "    } else {\n"
    "      i64 s = i / a.T, j = i % a.T, at = 0;\n"
    "      if (a.step == 2) { /* expand: compacted row i, from the member whose rows hold it */\n"
    "        long long o = -1;\n"
    "        for (i64 q = 0; q < a.R; q++) { i64 c = hir_moe_count(a, q); if (o < 0 && i < at + c) o = q * a.T + (i - at); at += c; }\n"
    "        a.out[i] = o;\n"
    "        continue;\n"
    "      }\n"
    "      for (i64 q = 0; q < s; q++) at += hir_moe_count(a, q);\n"
    "      if (j >= hir_moe_count(a, s)) a.out[i] = -1;\n"
    "      else if (a.step == 1) a.out[i] = at + j;\n"
    "      else a.out[i] = a.in[i] >= 0 && a.in[i] < a.T ? a.in[i] : -1;\n"
    "    }\n"
    "  }\n"
    "}\n"};
typedef struct hir__tr_args { /* hir_tr_args of the kernel source, field for field */
  void *dst;
  const void *src;
  int64_t B, R, C, dst_b, dst_r, src_b, src_c;
  int es;
} hir__tr_args;
typedef struct hir__rand_args { /* hir_rand_args of the kernel source, field for field */
  void *dst;
  int64_t n;
  int nd, dt, bits;
  unsigned key0, key1;
  int64_t sizes[HIR_MAX_DIMS], sd[HIR_MAX_DIMS], base[HIR_MAX_DIMS], gs[HIR_MAX_DIMS];
} hir__rand_args;
typedef struct hir__reduce_args { /* hir_reduce_args of the kernel source, field for field */
  void *dst;
  const void *src;
  int64_t nout, nred;
  int nd, dt, sum;
  int64_t sizes[HIR_MAX_DIMS], ss[HIR_MAX_DIMS], sd[HIR_MAX_DIMS];
  int red[HIR_MAX_DIMS];
} hir__reduce_args;
typedef struct hir__moe_args { /* hir_moe_args of the kernel source, field for field */
  int64_t *out, *out2;
  const int64_t *in, *counts;
  int64_t in_stride, T, R, E;
  int step;
  char *dst;
  const char *src;
  int64_t n, rows, row, unit;
} hir__moe_args;
typedef struct hir__ln_args { /* hir_ln_args of the kernel source, field for field */
  void *dst;
  const void *x, *w, *b;
  int64_t rows, cols;
  double eps;
  int dt_dst, dt_x, dt_w, dt_b, vec, rms;
} hir__ln_args;
typedef struct hir__rows_args { /* hir_rows_args of the kernel source, field for field */
  void *dst;
  const void *src;
  int64_t rows, cols;
  int dt, vec;
} hir__rows_args;
typedef struct hir__scale_args { /* hir_scale_args of the kernel source, field for field */
  void *dst;
  const float *raw, *sa, *sb;
  int64_t rows, cols, ld;
  int dt, vec;
} hir__scale_args;

typedef struct hir__map_args { /* hir_map_args of the kernel source, field for field */
  void *dst;
  const void *a, *b;
  double s;
  int op, binary, nd, dt_dst, dt_a, dt_b;
  int64_t n;
  int64_t sizes[HIR_MAX_DIMS], sd[HIR_MAX_DIMS], sa[HIR_MAX_DIMS], sb[HIR_MAX_DIMS];
} hir__map_args;
HIR__STATIC_ASSERT(map_dims, HIR_MAX_DIMS == 8);

/* One kernel's source: head, the two op switches from the tables, tail, its entry. */
static char *hir__cuda_map_source(int which) {
  size_t cap = sizeof hir__cuda_map_head + strlen(hir__map_entries[which]) + 2048, len = 0, i;
  char *src;
  for (i = 0; i < HIR_UNARY_COUNT; i++) cap += strlen(hir__unary_exprs[i]) + 32;
  for (i = 0; i < HIR_BINARY_COUNT; i++) cap += strlen(hir__binary_exprs[i]) + 32;
  for (i = 0; i < sizeof hir__cuda_map_tail / sizeof hir__cuda_map_tail[0]; i++) cap += strlen(hir__cuda_map_tail[i]);
  if (!(src = (char *)HIR_MALLOC(cap))) return NULL;
  len += (size_t)snprintf(src + len, cap - len, "%s", hir__cuda_map_head);
  len += (size_t)snprintf(src + len, cap - len, "template <typename T> __device__ T hir_unary(int op, T x, T s) {\n  switch (op) {\n");
  for (i = 0; i < HIR_UNARY_COUNT; i++) len += (size_t)snprintf(src + len, cap - len, "  case %d: return %s;\n", (int)i, hir__unary_exprs[i]);
  len += (size_t)snprintf(src + len, cap - len, "  }\n  return x;\n}\ntemplate <typename T> __device__ T hir_binary(int op, T x, T y) {\n  switch (op) {\n");
  for (i = 0; i < HIR_BINARY_COUNT; i++) len += (size_t)snprintf(src + len, cap - len, "  case %d: return %s;\n", (int)i, hir__binary_exprs[i]);
  len += (size_t)snprintf(src + len, cap - len, "  }\n  return x;\n}\n");
  for (i = 0; i < sizeof hir__cuda_map_tail / sizeof hir__cuda_map_tail[0]; i++)
    len += (size_t)snprintf(src + len, cap - len, "%s", hir__cuda_map_tail[i]);
  if (which == HIR__MAP_I64) /* the CPU's hir__i64_binary and hir__i64_unary, wrapping in unsigned arithmetic */
    len += (size_t)snprintf(
        src + len, cap - len,
        "typedef unsigned long long hir_u64;\n"
        "__device__ long long hir_i64_binary(int op, long long x, long long y) {\n"
        "  switch (op) {\n  case %d: return (long long)((hir_u64)x + (hir_u64)y);\n  case %d: return (long long)((hir_u64)x - (hir_u64)y);\n"
        "  case %d: return (long long)((hir_u64)x * (hir_u64)y);\n  default: return x < y;\n  }\n}\n"
        "__device__ long long hir_i64_unary(int op, long long x, long long s) {\n"
        "  switch (op) {\n  case %d: return (long long)(0ull - (hir_u64)x);\n  case %d: return x < 0 ? (long long)(0ull - (hir_u64)x) : x;\n"
        "  case %d: return x < 0 ? 0 : x;\n  case %d: return (long long)((hir_u64)x + (hir_u64)s);\n"
        "  case %d: return (long long)((hir_u64)x - (hir_u64)s);\n  case %d: return (long long)((hir_u64)x * (hir_u64)s);\n"
        "  case %d: return (long long)((hir_u64)s - (hir_u64)x);\n  case %d: return x < s;\n  case %d: return s < x;\n"
        "  default: return x;\n  }\n}\n",
        HIR_BINARY_ADD, HIR_BINARY_SUB, HIR_BINARY_MUL, HIR_UNARY_NEG, HIR_UNARY_ABS, HIR_UNARY_RELU, HIR_UNARY_ADD_SCALAR,
        HIR_UNARY_SUB_SCALAR, HIR_UNARY_MUL_SCALAR, HIR_UNARY_SCALAR_SUB, HIR_UNARY_LT_SCALAR, HIR_UNARY_SCALAR_LT);
  snprintf(src + len, cap - len, "%s", hir__map_entries[which]);
  return src;
}

static int hir__nvrtc_open(hir__nvrtc *n, char *why, size_t cap) {
  static const char *const names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"};
  const char *home = getenv("CUDA_HOME");
  char path[600];
  size_t i;
  void **fns[8];
  static const char *const syms[8] = {"nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
                                      "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcDestroyProgram", "nvrtcVersion"};
  memset(n, 0, sizeof *n);
  for (i = 0; i < 3 && !n->lib; i++) n->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  for (i = 0; i < 3 && !n->lib && home; i++) {
    snprintf(path, sizeof path, "%.500s/lib64/%s", home, names[i]);
    n->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  if (!n->lib) {
    snprintf(why, cap, "NVRTC (libnvrtc.so, part of the CUDA toolkit) was not found; put its directory on "
             "LD_LIBRARY_PATH or set CUDA_HOME");
    return 0;
  }
  fns[0] = (void **)&n->create, fns[1] = (void **)&n->compile, fns[2] = (void **)&n->cubin_size, fns[3] = (void **)&n->cubin;
  fns[4] = (void **)&n->log_size, fns[5] = (void **)&n->log, fns[6] = (void **)&n->destroy, fns[7] = (void **)&n->version;
  for (i = 0; i < 8; i++) {
    void *f = dlsym(n->lib, syms[i]);
    if (!f) {
      snprintf(why, cap, "NVRTC has no %s; use NVRTC 12 or later", syms[i]);
      dlclose(n->lib);
      return 0;
    }
    memcpy(fns[i], &f, sizeof f); /* object to function pointer, as dlsym's users must */
  }
  return 1;
}

/* A kernel on its way in: its source and key in the disk cache (>>files),
   then what NVRTC gave. hir__map_compile makes no CUDA call and touches
   nothing else, so several compile at once on threads of their own. */
typedef struct hir__map_build {
  const hir__nvrtc *nvrtc;
  int which;
  const char *name;                /* for messages: the kernel, or the library */
  char *src, arch[32], option[64];
  unsigned char key[32];
  char *bin;                       /* NVRTC's cubin, or NULL and error */
  size_t size;
  char error[200];
} hir__map_build;

static const char *hir__map_name(int which) {
  static const char *const names[HIR__MAP_KERNELS] = {"hir_map_f32", "hir_map_f64", "hir_vec_f32", "hir_vec_f64",
                                                      "hir_vec_f16", "hir_vec_bf16", "hir_max_abs_all", "hir_scale_rc",
                                                      "hir_sum_rows", "hir_cast_vec", "hir_layer_norm", "hir_transpose",
                                                      "hir_rand", "hir_reduce_axes", "hir_map_i64", "hir_moe"};
  return names[which];
}

static void *hir__map_compile(void *build) {
  hir__map_build *m = (hir__map_build *)build;
  const hir__nvrtc *n = m->nvrtc;
  void *prog = NULL;
  const char *opts[2];
  int rc;
  opts[0] = m->option;
  opts[1] = "--std=c++14";
  if ((rc = n->create(&prog, m->src, "hostir_map.cu", 0, NULL, NULL)) != 0) {
    snprintf(m->error, sizeof m->error, "nvrtcCreateProgram failed (%d)", rc);
  } else if ((rc = n->compile(prog, 2, opts)) != 0) {
    char log[160] = "";
    size_t lsize = 0;
    if (n->log_size(prog, &lsize) == 0 && lsize > 0) {
      char *full = (char *)HIR_MALLOC(lsize);
      if (full && n->log(prog, full) == 0) snprintf(log, sizeof log, "%s", full);
      HIR_FREE(full);
    }
    snprintf(m->error, sizeof m->error, "NVRTC could not compile %s for %s (%d): %.120s", m->name, m->arch, rc, log);
  } else if (n->cubin_size(prog, &m->size) != 0 || !(m->bin = (char *)HIR_MALLOC(m->size)) || n->cubin(prog, m->bin) != 0) {
    HIR_FREE(m->bin);
    m->bin = NULL;
    snprintf(m->error, sizeof m->error, "NVRTC gave no binary of %s for %s", m->name, m->arch);
  }
  if (prog) n->destroy(&prog);
  return NULL;
}

/* Kernel `which` from a cubin; err (if given) says why not. */
static int hir__map_load_bin(hir__cuda *c, int which, const char *bin, char *err, size_t cap) {
  if (cudaLibraryLoadData(&c->map_library[which], bin, NULL, NULL, 0, NULL, NULL, 0) != cudaSuccess) {
    cudaError_t e = cudaGetLastError();
    if (err) snprintf(err, cap, "cudaLibraryLoadData of %s failed: %s", hir__map_name(which), cudaGetErrorString(e));
    return 0;
  }
  if (cudaLibraryGetKernel(&c->map_kernel[which], c->map_library[which], hir__map_name(which)) != cudaSuccess) {
    cudaGetLastError();
    cudaLibraryUnload(c->map_library[which]);
    if (err) snprintf(err, cap, "the compiled library lacks %s", hir__map_name(which));
    return 0;
  }
  c->map_state[which] = 1;
  return 1;
}

/* Its architecture (the device's), NVRTC's options, and its key in the cache. */
static void hir__map_prepare(hir__map_build *m, int device) {
  int major = 0, minor = 0;
  char options[80];
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  /* 9.0's "a" target: the same chip, plus the instructions only it has (wgmma, setmaxnreg) */
  snprintf(m->arch, sizeof m->arch, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
  snprintf(options, sizeof options, "%.16s", m->arch); /* a copy: -Wrestrict cannot tell m's fields apart */
  snprintf(m->option, sizeof m->option, "--gpu-architecture=%.16s", options);
  snprintf(options, sizeof options, "%s --std=c++14", m->option);
  hir__kcache_key(m->src, options, m->arch, m->key);
}

/* Starts kernel `which` (not tried yet): its source, then the disk cache.
   1: loaded from the cache. 0 with m->src: NVRTC must compile it; without:
   it failed, map_error says why. */
static int hir__map_begin(hir__cuda *c, int which, hir__map_build *m, hir__kcache *kc, int nvrtc_version) {
  int ok = 0;
  size_t size = 0;
  char *bin;
  memset(m, 0, sizeof *m);
  m->nvrtc = &c->nvrtc;
  m->which = which;
  m->name = hir__map_name(which);
  c->map_state[which] = -1;
  if (!(m->src = hir__cuda_map_source(which))) {
    snprintf(c->map_error, sizeof c->map_error, "out of host memory");
    return 0;
  }
  hir__map_prepare(m, c->device);
  if ((bin = hir__kcache_get(kc, m->key, m->arch, nvrtc_version, &size))) { /* a cubin that fails to load is compiled again */
    ok = hir__map_load_bin(c, which, bin, NULL, 0);
    HIR_FREE(bin);
  }
  if (ok) {
    HIR_FREE(m->src);
    m->src = NULL;
  }
  return ok;
}

/* Ends it: loads what NVRTC gave and keeps it in the cache, or says why not. */
static int hir__map_end(hir__cuda *c, hir__map_build *m, hir__kcache *kc, int nvrtc_version) {
  int ok = m->bin && hir__map_load_bin(c, m->which, m->bin, c->map_error, sizeof c->map_error);
  if (!m->bin) snprintf(c->map_error, sizeof c->map_error, "%s", m->error);
  if (ok) hir__kcache_put(kc, m->key, m->arch, nvrtc_version, m->bin, m->size);
  HIR_FREE(m->src);
  HIR_FREE(m->bin);
  return ok;
}

/* Every kernel, from the disk cache or compiled by NVRTC, when the backend
   is created, not during a run: with CUDA_MODULE_LOADING=EAGER,
   cudaLibraryLoadData loads into every context of the process and waits
   for their queued work, and a rank thread loading while a peer's graph
   waited for its copies never returned (bench/NOTES.md section 44). Nothing
   compiles while capturing either. Those the cache lacks compile at once, a
   thread each: one after another, the twelve take 3.7 s (section 45). */
static void hir__cuda_load_all(hir__cuda *c) {
  hir__map_build m[HIR__MAP_KERNELS];
  pthread_t thread[HIR__MAP_KERNELS];
  int k, compile[HIR__MAP_KERNELS] = {0}, started[HIR__MAP_KERNELS] = {0}, any = 0, major = 0, minor = 0, version = 0;
  char why[200] = "";
  hir__kcache kc;
  hir__kcache_open(&kc);
  if ((c->nvrtc.lib || hir__nvrtc_open(&c->nvrtc, why, sizeof why)) && c->nvrtc.version(&major, &minor) == 0)
    version = major * 1000 + minor; /* entries of another NVRTC are compiled again; without NVRTC, any is taken */
  for (k = 0; k < HIR__MAP_KERNELS; k++)
    if (!c->map_state[k] && !hir__map_begin(c, k, &m[k], &kc, version) && m[k].src) compile[k] = any = 1;
  for (k = 0; any && !c->nvrtc.lib && k < HIR__MAP_KERNELS; k++)
    if (compile[k]) snprintf(m[k].error, sizeof m[k].error, "%s", why), hir__map_end(c, &m[k], &kc, 0), compile[k] = 0;
  for (k = 0; k < HIR__MAP_KERNELS; k++)
    if (compile[k]) started[k] = HIR_THREAD_CREATE(&thread[k], hir__map_compile, &m[k]) == 0;
  for (k = 0; k < HIR__MAP_KERNELS; k++) {
    if (!compile[k]) continue;
    if (started[k]) pthread_join(thread[k], NULL);
    else hir__map_compile(&m[k]); /* no thread: here */
    hir__map_end(c, &m[k], &kc, version);
  }
  snprintf(c->notes, sizeof c->notes, "%s", kc.why);
  hir__kcache_close(&kc);
}

/* The kernel's arguments for dst = op(a[, x]), and which kernel runs them. */
static int hir__cuda_map_args(int op, const hir_tensor *dst, const hir_tensor *a, const hir_tensor *x, hir__map_args *args) {
  int64_t strides[3][HIR_MAX_DIMS], per;
  int d, row, f64 = dst->dtype == HIR_F64 || dst->dtype == HIR_I64;
  f64 |= a->dtype == HIR_F64 || a->dtype == HIR_I64 || (x && (x->dtype == HIR_F64 || x->dtype == HIR_I64));
  memset(args, 0, sizeof *args);
  args->n = hir__numel(dst->ndims, dst->sizes);
  args->nd = dst->ndims;
  for (d = 0; d < dst->ndims; d++) {
    args->sizes[d] = dst->sizes[d];
    strides[0][d] = dst->strides[d];
    strides[1][d] = a->strides[d];
    strides[2][d] = x ? x->strides[d] : 0;
  }
  hir__collapse(&args->nd, args->sizes, strides, 3);
  if (args->nd == 0) args->nd = 1, args->sizes[0] = 1, strides[0][0] = strides[1][0] = strides[2][0] = 0;
  for (d = 0; d < args->nd; d++) args->sd[d] = strides[0][d], args->sa[d] = strides[1][d], args->sb[d] = strides[2][d];
  args->dst = dst->data, args->a = a->data, args->b = x ? x->data : a->data;
  args->binary = x != NULL;
  args->dt_dst = (int)dst->dtype, args->dt_a = (int)a->dtype, args->dt_b = x ? (int)x->dtype : 0;
  per = 16 / (int64_t)hir_dtype_size(dst->dtype);
  row = args->nd == 2 && x && args->sd[1] == 1 && args->sd[0] == args->sizes[1] && args->sizes[1] % per == 0; /* each operand */
  for (d = 0; d < 2 && row; d++) { /* dense, a row repeated, or a value a row */
    const int64_t *st = d ? args->sb : args->sa;
    row = (st[0] == args->sizes[1] && st[1] == 1) || (st[0] == 0 && st[1] == 1) || st[1] == 0;
  }
  if (((args->nd == 1 && args->sd[0] == 1 && args->sa[0] == 1 && (!x || args->sb[0] == 1)) || row) && a->dtype == dst->dtype &&
      dst->dtype <= HIR_BF16 && (!x || x->dtype == dst->dtype) &&
      ((uintptr_t)args->dst | (uintptr_t)args->a | (uintptr_t)args->b) % 16 == 0)
    return HIR__VEC_F32 + (int)dst->dtype; /* dense, one dtype (b maybe broadcast) */
  if (op == HIR_UNARY_CAST && args->nd == 1 && args->sd[0] == 1 && args->sa[0] == 1 && !x && a->dtype != dst->dtype &&
      a->dtype != HIR_F64 && a->dtype <= HIR_BF16 && dst->dtype != HIR_F64 && dst->dtype <= HIR_BF16 &&
      ((uintptr_t)args->dst | (uintptr_t)args->a) % 16 == 0)
    return HIR__CAST_VEC; /* a cast, dense, f32, f16 and bf16 into one another */
  if (dst->dtype == HIR_I64 && a->dtype == HIR_I64 && (!x || x->dtype == HIR_I64)) return HIR__MAP_I64;
  return f64 ? HIR__MAP_F64 : HIR__MAP_F32; /* a cast to or from int64 in double */
}

static hir_status hir__cuda_map(hir_backend *b, void *stream, int op, const hir_tensor *dst, const hir_tensor *a,
                                const hir_tensor *x, double s) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__map_args args;
  int64_t per;
  void *argv[1];
  int which = hir__cuda_map_args(op, dst, a, x, &args);
  dim3 grid, block;
  cudaError_t e;
  if (args.n == 0) return HIR_OK;
  if (c->map_state[which] != 1) {
    snprintf(b->error, sizeof b->error, "cuda backend: the elementwise kernels are unavailable: %s", c->map_error);
    return HIR_ERR_UNSUPPORTED;
  }
  args.op = op, args.s = s;
  argv[0] = &args;
  per = which == HIR__CAST_VEC ? 8 : which >= HIR__VEC_F32 ? 16 / (int64_t)hir_dtype_size(dst->dtype) : 1; /* a thread's at once */
  grid.x = (unsigned)((args.n / per + 255) / 256 < 65535 ? (args.n / per + 255) / 256 : 65535), grid.y = grid.z = 1;
  if (!grid.x) grid.x = 1;
  block.x = 256, block.y = block.z = 1;
  e = cudaLaunchKernel((const void *)c->map_kernel[which], grid, block, argv, 0, stream ? (cudaStream_t)stream : c->caller);
  if (e != cudaSuccess) return hir__cuda_fail(b, "cudaLaunchKernel (elementwise)", cudaGetErrorString(e), __FILE__, __LINE__);
  return HIR_OK;
}

/* One launch of map kernel `which` (a grid-stride loop over `threads`
   threads, 256 a block) with its one argument struct; `what` names it in
   messages. */
static hir_status hir__cuda_launch(hir_backend *b, void *stream, int which, void *args, int64_t threads, const char *what) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  void *argv[1];
  dim3 grid, block;
  cudaError_t e;
  if (threads <= 0) return HIR_OK;
  if (c->map_state[which] != 1)
    return snprintf(b->error, sizeof b->error, "cuda backend: the %s kernel did not load: %.150s", what, c->map_error),
           HIR_ERR_UNSUPPORTED;
  argv[0] = args;
  block.x = 256, block.y = block.z = 1;
  grid.x = (unsigned)((threads + 255) / 256 < 65536 ? (threads + 255) / 256 : 65536), grid.y = grid.z = 1;
  e = cudaLaunchKernel((const void *)c->map_kernel[which], grid, block, argv, 0, stream ? (cudaStream_t)stream : c->caller);
  return e == cudaSuccess ? HIR_OK : hir__cuda_fail(b, "cudaLaunchKernel", cudaGetErrorString(e), __FILE__, __LINE__);
}

static hir_status hir__cuda_rand(hir_backend *b, void *stream, const hir_tensor *dst, uint64_t seed, const int64_t *base,
                                 const int64_t *stride, int bits) {
  hir__rand_args args;
  int d;
  memset(&args, 0, sizeof args);
  args.n = hir__numel(dst->ndims, dst->sizes);
  args.dst = dst->data, args.nd = dst->ndims, args.dt = (int)dst->dtype, args.bits = bits;
  args.key0 = (unsigned)seed, args.key1 = (unsigned)(seed >> 32);
  for (d = 0; d < dst->ndims; d++)
    args.sizes[d] = dst->sizes[d], args.sd[d] = dst->strides[d], args.base[d] = base[d], args.gs[d] = stride[d];
  return hir__cuda_launch(b, stream, HIR__RAND, &args, args.n, "random-number");
}

/* dst = the max of src over the axes where dst has size 1 (sum: int64's sum). */
static hir_status hir__cuda_reduce_axes(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *src, int sum) {
  hir__reduce_args args;
  int d;
  memset(&args, 0, sizeof args);
  args.nout = hir__numel(dst->ndims, dst->sizes);
  args.dst = dst->data, args.src = src->data, args.nd = src->ndims, args.dt = (int)src->dtype, args.nred = 1, args.sum = sum;
  for (d = 0; d < src->ndims; d++) {
    args.sizes[d] = src->sizes[d], args.ss[d] = src->strides[d], args.sd[d] = dst->strides[d];
    args.red[d] = dst->sizes[d] == 1 && src->sizes[d] != 1;
    if (args.red[d]) args.nred *= src->sizes[d];
  }
  return hir__cuda_launch(b, stream, HIR__REDUCE_AXES, &args, args.nout * 32, "reduction"); /* a warp an output */
}
static hir_status hir__cuda_max(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *src) {
  return hir__cuda_reduce_axes(b, stream, dst, src, 0);
}

static hir_status hir__cuda_scatter_rows(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *src,
                                         const hir_tensor *where) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__moe_args args;
  int64_t rows = dst->ndims ? dst->sizes[0] : 1, bytes = hir__numel(dst->ndims, dst->sizes) * (int64_t)hir_dtype_size(dst->dtype);
  cudaError_t e;
  memset(&args, 0, sizeof args);
  if (bytes && (e = cudaMemsetAsync(dst->data, 0, (size_t)bytes, stream ? (cudaStream_t)stream : c->caller)) != cudaSuccess)
    return hir__cuda_fail(b, "cudaMemsetAsync (MoE rows)", cudaGetErrorString(e), __FILE__, __LINE__);
  args.step = 5, args.out = (int64_t *)where->data, args.dst = (char *)dst->data, args.src = (const char *)src->data;
  args.n = src->ndims ? src->sizes[0] : 1, args.rows = rows, args.row = rows ? bytes / rows : 0;
  for (args.unit = 8; args.unit > 1 && (args.row % args.unit || ((uintptr_t)dst->data | (uintptr_t)src->data) % (uintptr_t)args.unit); args.unit /= 2) {}
  return args.row ? hir__cuda_launch(b, stream, HIR__MOE, &args, args.n * (args.row / args.unit), "MoE") : HIR_OK;
}

static hir_status hir__cuda_moe_index(hir_backend *b, void *stream, int step, const hir_tensor *out, const hir_tensor *out2,
                                      const hir_tensor *in, const hir_tensor *counts, int64_t tokens, int64_t experts) {
  hir__moe_args args;
  hir_status s;
  memset(&args, 0, sizeof args);
  args.out = (int64_t *)out->data, args.out2 = out2 ? (int64_t *)out2->data : NULL, args.in = in ? (const int64_t *)in->data : NULL;
  args.in_stride = in && in->ndims ? in->strides[0] : 1, args.counts = (const int64_t *)counts->data;
  args.T = tokens, args.R = counts->sizes[0], args.E = experts, args.step = step;
  if (step != HIR_MOE_ROUTE) return hir__cuda_launch(b, stream, HIR__MOE, &args, tokens * args.R, "MoE");
  if ((s = hir__cuda_launch(b, stream, HIR__MOE, &args, tokens * args.R > args.R ? tokens * args.R : args.R, "MoE")) != HIR_OK) return s;
  args.step = 6; /* each token's row, after the -1s */
  return hir__cuda_launch(b, stream, HIR__MOE, &args, tokens, "MoE");
}

/* layer_norm (center) or rms_norm: a block a row. */
static hir_status hir__cuda_norm(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *x, const hir_tensor *weight,
                                 const hir_tensor *bias, int naxes, double eps, int center) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__ln_args args;
  void *argv[1];
  dim3 grid, block;
  unsigned threads = 32;
  int64_t cols = 1, per;
  int d;
  cudaError_t e;
  for (d = x->ndims - naxes; d < x->ndims; d++) cols *= x->sizes[d];
  args.rows = cols ? hir__numel(x->ndims, x->sizes) / cols : 0;
  if (args.rows == 0) return HIR_OK;
  if (c->map_state[HIR__LAYER_NORM] != 1) return HIR_ERR_UNSUPPORTED; /* its primitives run */
  args.dst = dst->data, args.x = x->data, args.cols = cols, args.eps = eps;
  args.w = weight ? weight->data : NULL, args.b = bias ? bias->data : NULL;
  args.dt_dst = (int)dst->dtype, args.dt_x = (int)x->dtype;
  args.dt_w = weight ? (int)weight->dtype : 0, args.dt_b = bias ? (int)bias->dtype : 0;
  args.rms = !center;
  per = x->dtype == HIR_F32 ? 4 : 8; /* values in a 16-byte vector */
  args.vec = x->dtype == dst->dtype && x->dtype != HIR_F64 && x->dtype <= HIR_BF16 && cols % per == 0 && cols / per <= 4 * 256 &&
             (!weight || weight->dtype == x->dtype) && (!bias || bias->dtype == x->dtype) &&
             ((uintptr_t)x->data | (uintptr_t)dst->data | (uintptr_t)args.w | (uintptr_t)args.b) % 16 == 0;
  if (args.vec) cols /= per; /* the row in registers: 4 vectors a thread */
  while (threads < 256 && (int64_t)threads * 4 < cols) threads *= 2;
  argv[0] = &args;
  grid.x = (unsigned)(args.rows < (1 << 20) ? args.rows : (1 << 20)), grid.y = grid.z = 1;
  block.x = threads, block.y = block.z = 1;
  e = cudaLaunchKernel((const void *)c->map_kernel[HIR__LAYER_NORM], grid, block, argv, 0, stream ? (cudaStream_t)stream : c->caller);
  if (e != cudaSuccess)
    return hir__cuda_fail(b, center ? "cudaLaunchKernel (layer_norm)" : "cudaLaunchKernel (rms_norm)", cudaGetErrorString(e), __FILE__,
                          __LINE__);
  return HIR_OK;
}
static hir_status hir__cuda_layer_norm(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *x,
                                      const hir_tensor *weight, const hir_tensor *bias, int naxes, double eps) {
  return hir__cuda_norm(b, stream, dst, x, weight, bias, naxes, eps, 1);
}
static hir_status hir__cuda_rms_norm(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *x,
                                    const hir_tensor *weight, int naxes, double eps) {
  return hir__cuda_norm(b, stream, dst, x, weight, NULL, naxes, eps, 0);
}

/* dst <- src of [B,] R, C (collapsed) where src's R and dst's C have unit stride: 32 x 32 tiles by the NVRTC
   kernel. HIR_ERR_UNSUPPORTED where it is not loaded (the element kernel then copies). */
static hir_status hir__cuda_transpose(hir_backend *b, cudaStream_t s, void *dst, const void *src, size_t es, int nd,
                                      const int64_t *sizes, int64_t (*strides)[HIR_MAX_DIMS]) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__tr_args args;
  void *argv[1];
  dim3 grid, block;
  cudaError_t e;
  if (c->map_state[HIR__TRANSPOSE] != 1) return HIR_ERR_UNSUPPORTED;
  args.dst = dst, args.src = src, args.es = (int)es;
  args.B = nd == 3 ? sizes[0] : 1, args.R = sizes[nd - 2], args.C = sizes[nd - 1];
  args.dst_b = nd == 3 ? strides[0][0] : 0, args.dst_r = strides[0][nd - 2];
  args.src_b = nd == 3 ? strides[1][0] : 0, args.src_c = strides[1][nd - 1];
  if ((args.C + 31) / 32 > 0x7fffffff) return HIR_ERR_UNSUPPORTED; /* more tiles across than a grid holds */
  argv[0] = &args;
  grid.x = (unsigned)((args.C + 31) / 32);
  grid.y = (unsigned)((args.R + 31) / 32 < 65535 ? (args.R + 31) / 32 : 65535);
  grid.z = (unsigned)(args.B < 65535 ? args.B : 65535);
  block.x = 32, block.y = 8, block.z = 1;
  e = cudaLaunchKernel((const void *)c->map_kernel[HIR__TRANSPOSE], grid, block, argv, 0, s ? s : c->caller);
  if (e != cudaSuccess) return hir__cuda_fail(b, "cudaLaunchKernel (transpose)", cudaGetErrorString(e), __FILE__, __LINE__);
  return HIR_OK;
}

static hir_status hir__cuda_max_abs(hir_backend *b, void *stream, const hir_tensor *x, const hir_tensor *y, double *diff,
                                    double *y_max) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  cudaStream_t s = stream ? (cudaStream_t)stream : c->caller;
  hir__map_args args;
  unsigned got[2];
  float f[2];
  void *argv[1];
  dim3 grid, block;
  if (c->map_state[HIR__MAX_ABS] != 1) {
    snprintf(b->error, sizeof b->error, "cuda backend: the comparison kernel is unavailable: %s", c->map_error);
    return HIR_ERR_UNSUPPORTED;
  }
  if (!c->max_abs_out) HIR__CU(b, cudaMalloc((void **)&c->max_abs_out, sizeof got));
  memset(&args, 0, sizeof args);
  args.n = hir__numel(y->ndims, y->sizes);
  args.dst = c->max_abs_out, args.a = x->data, args.b = y->data, args.dt_a = (int)y->dtype;
  argv[0] = &args;
  grid.x = (unsigned)((args.n + 255) / 256 < 2048 ? (args.n + 255) / 256 : 2048), grid.y = grid.z = 1;
  if (!grid.x) grid.x = 1;
  block.x = 256, block.y = block.z = 1;
  HIR__CU(b, cudaMemsetAsync(c->max_abs_out, 0, sizeof got, s));
  HIR__CU(b, cudaLaunchKernel((const void *)c->map_kernel[HIR__MAX_ABS], grid, block, argv, 0, s));
  HIR__CU(b, cudaMemcpyAsync(got, c->max_abs_out, sizeof got, cudaMemcpyDeviceToHost, s));
  HIR__CU(b, cudaStreamSynchronize(s));
  memcpy(f, got, sizeof f);
  *diff = f[0], *y_max = f[1];
  return HIR_OK;
}

static hir_status hir__cuda_unary(hir_backend *b, void *stream, hir_unary_op op, const hir_tensor *dst, const hir_tensor *src,
                                  double s) {
  return hir__cuda_map(b, stream, (int)op, dst, src, NULL, s);
}

static hir_status hir__cuda_binary(hir_backend *b, void *stream, hir_binary_op op, const hir_tensor *dst, const hir_tensor *a,
                                   const hir_tensor *x) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__cuda_lane *l;
  hir_tensor da, dx, dd;
  hir_status st;
  int64_t n = hir__numel(dst->ndims, dst->sizes);
  if (n == 0) return HIR_OK;
  if ((st = hir__cuda_map(b, stream, (int)op, dst, a, x, 0)) != HIR_ERR_UNSUPPORTED || op == HIR_BINARY_DIV || op == HIR_BINARY_LT)
    return st; /* else NVRTC gave no kernel: cuBLAS adds, subtracts and multiplies f32/f64 */
  if (op == HIR_BINARY_MUL && (dst->dtype == HIR_F16 || dst->dtype == HIR_BF16)) {
    snprintf(b->error, sizeof b->error, "cuda backend: mul of %s tensors needs the elementwise kernels (cuBLAS's dgmm is "
             "f32/f64 only): %.120s", hir_dtype_name(dst->dtype), c->map_error);
    return HIR_ERR_UNSUPPORTED;
  }
  if ((st = hir__cuda_lane_of(b, stream, &l)) != HIR_OK || (st = hir__cuda_dense(b, l, 0, a, dst, &da)) != HIR_OK ||
      (st = hir__cuda_dense(b, l, 1, x, dst, &dx)) != HIR_OK || (st = hir__cuda_dense(b, l, 2, dst, dst, &dd)) != HIR_OK)
    return st;
  if (op == HIR_BINARY_MUL) { /* [1, n] times diag(x) */
    if (dst->dtype == HIR_F32)
      HIR__BLAS(b, cublasSdgmm(l->blas, CUBLAS_SIDE_RIGHT, 1, (int)n, (const float *)da.data, 1, (const float *)dx.data, 1,
                               (float *)dd.data, 1));
    else
      HIR__BLAS(b, cublasDdgmm(l->blas, CUBLAS_SIDE_RIGHT, 1, (int)n, (const double *)da.data, 1, (const double *)dx.data, 1,
                               (double *)dd.data, 1));
  } else { /* C = A + (+-1) B as a matrix of n elements: n halved to 65536 rows where it can be (one long column is slow) */
    cublasLtMatrixTransformDesc_t desc;
    cublasLtMatrixLayout_t lay;
    int64_t rows = n;
    cudaDataType scale = dst->dtype == HIR_F64 ? CUDA_R_64F : CUDA_R_32F;
    float one_f = 1.0f, sign_f = op == HIR_BINARY_SUB ? -1.0f : 1.0f;
    double one_d = 1.0, sign_d = sign_f;
    const void *alpha = dst->dtype == HIR_F64 ? (const void *)&one_d : (const void *)&one_f;
    const void *beta = dst->dtype == HIR_F64 ? (const void *)&sign_d : (const void *)&sign_f;
    cublasStatus_t s1, s2, s3;
    if (!c->lt) HIR__BLAS(b, cublasLtCreate(&c->lt));
    HIR__BLAS(b, cublasLtMatrixTransformDescCreate(&desc, scale));
    while (rows > 65536 && rows % 2 == 0) rows /= 2;
    s1 = cublasLtMatrixLayoutCreate(&lay, hir__cuda_type(dst->dtype), (uint64_t)rows, (uint64_t)(n / rows), rows);
    s2 = s1 == CUBLAS_STATUS_SUCCESS ? cublasLtMatrixTransform(c->lt, desc, alpha, da.data, lay, beta, dx.data, lay, dd.data, lay,
                                                               l->stream)
                                     : s1;
    if (s1 == CUBLAS_STATUS_SUCCESS) cublasLtMatrixLayoutDestroy(lay);
    s3 = cublasLtMatrixTransformDescDestroy(desc);
    HIR__BLAS(b, s2);
    HIR__BLAS(b, s3);
  }
  return dd.data == dst->data ? HIR_OK : hir__cuda_copy(b, l->stream, dst, &dd);
}

/* A vector of `n` ones of the dtype for lane l, filled on its stream (see
   HIR__CUDA_RETIRED): 1.0 as 32- or 16-bit words, f64's as zeros with the
   high word of each element set. */
static hir_status hir__cuda_ones(hir_backend *b, hir__cuda_lane *l, hir_dtype dt, int64_t n, void **out) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  if ((int64_t)l->ones_len[dt] < n) {
    size_t len = (size_t)n > 2 * l->ones_len[dt] ? (size_t)n : 2 * l->ones_len[dt], es = hir_dtype_size(dt);
    unsigned long long p;
    void *ptr;
    int r;
    if (!c->memset32 || !c->memset16 || !c->memset2d32) {
      snprintf(b->error, sizeof b->error, "cuda backend: a sum over %lld elements needs the driver's cuMemsetD32Async, "
               "cuMemsetD16Async and cuMemsetD2D32Async, which this driver did not give", (long long)n);
      return HIR_ERR_BACKEND;
    }
    HIR__CU(b, cudaMalloc(&ptr, len * es));
    p = (unsigned long long)(uintptr_t)ptr;
    if (dt == HIR_F64) { /* little-endian: the high word second */
      r = cudaMemsetAsync(ptr, 0, len * es, l->stream) != cudaSuccess ? -1 : c->memset2d32(p + 4, 8, 0x3ff00000u, 1, len, l->stream);
    } else {
      r = dt == HIR_F32 ? c->memset32(p, 0x3f800000u, len, l->stream)
                        : c->memset16(p, dt == HIR_F16 ? (unsigned short)0x3c00 : (unsigned short)0x3f80, len, l->stream);
    }
    if (r != 0) {
      cudaFree(ptr);
      cudaGetLastError();
      snprintf(b->error, sizeof b->error, "cuda backend: filling the ones vector of a sum failed (CUresult %d)", r);
      return HIR_ERR_BACKEND;
    }
    hir__cuda_retire(c, l->ones[dt]);
    l->ones[dt] = ptr;
    l->ones_len[dt] = len;
  }
  *out = l->ones[dt];
  return HIR_OK;
}

/* The sum over a short axis, the tail of a reduce-scatter (the partials of
   the peers added up): dst[o, i] = sum over r < R of src[o, r, i], both
   dense, 16 bytes a thread (4 f32 or 8 f16/bf16 values) read once and
   accumulated in f32, rounded once; blockIdx.y is o. PTX 7.0 for sm_80 and
   later: the driver compiles it for the GPU it runs on. */
#define HIR__PTX_SUM_KERNEL(name, ACC, PACK)                                                                   \
  ".visible .entry " name "(.param .u64 p_dst, .param .u64 p_src, .param .u64 p_nvec, .param .u32 p_r,\n"    \
  "    .param .u64 p_rstride, .param .u64 p_osrc, .param .u64 p_odst)\n{\n"                                   \
  "  .reg .pred %p;\n  .reg .b16 %h<2>;\n  .reg .b32 %r, %bx, %bw, %tx, %by, %w<4>, %t<2>;\n"                 \
  "  .reg .f32 %a<8>;\n  .reg .b64 %dst, %src, %nvec, %rs, %os, %od, %i, %o;\n"                               \
  "  ld.param.u64 %dst, [p_dst];\n  ld.param.u64 %src, [p_src];\n  ld.param.u64 %nvec, [p_nvec];\n"          \
  "  ld.param.u32 %r, [p_r];\n  ld.param.u64 %rs, [p_rstride];\n  ld.param.u64 %os, [p_osrc];\n"              \
  "  ld.param.u64 %od, [p_odst];\n"                                                                           \
  "  mov.u32 %bx, %ctaid.x;\n  mov.u32 %bw, %ntid.x;\n  mov.u32 %tx, %tid.x;\n  mov.u32 %by, %ctaid.y;\n"     \
  "  mul.wide.u32 %i, %bx, %bw;\n  cvt.u64.u32 %o, %tx;\n  add.u64 %i, %i, %o;\n"                             \
  "  setp.ge.u64 %p, %i, %nvec;\n  @%p bra DONE;\n"                                                           \
  "  cvt.u64.u32 %o, %by;\n  shl.b64 %i, %i, 4;\n"                                                            \
  "  mad.lo.u64 %src, %o, %os, %src;\n  add.u64 %src, %src, %i;\n"                                            \
  "  mad.lo.u64 %dst, %o, %od, %dst;\n  add.u64 %dst, %dst, %i;\n"                                            \
  "  mov.f32 %a0, 0f00000000;\n  mov.f32 %a1, %a0;\n  mov.f32 %a2, %a0;\n  mov.f32 %a3, %a0;\n"              \
  "  mov.f32 %a4, %a0;\n  mov.f32 %a5, %a0;\n  mov.f32 %a6, %a0;\n  mov.f32 %a7, %a0;\n"                      \
  "LOOP:\n  ld.global.nc.v4.b32 {%w0, %w1, %w2, %w3}, [%src];\n"                                              \
  ACC("0", "0", "1") ACC("1", "2", "3") ACC("2", "4", "5") ACC("3", "6", "7")                                \
  "  add.u64 %src, %src, %rs;\n  sub.u32 %r, %r, 1;\n  setp.ne.u32 %p, %r, 0;\n  @%p bra LOOP;\n"             \
  PACK("0", "0", "1") PACK("1", "2", "3") PACK("2", "4", "5") PACK("3", "6", "7")                            \
  "  st.global.v4.b32 [%dst], {%w0, %w1, %w2, %w3};\nDONE:\n  ret;\n}\n"
/* word w of a vector into accumulators lo and hi (f32: one value, in w's own) */
#define HIR__PTX_ACC_F32(w, lo, hi) "  add.f32 %a" w ", %a" w ", %w" w ";\n"
#define HIR__PTX_PACK_F32(w, lo, hi) "  mov.b32 %w" w ", %a" w ";\n"
#define HIR__PTX_ACC_F16(w, lo, hi)                                                                           \
  "  mov.b32 {%h0, %h1}, %w" w ";\n  cvt.f32.f16 %t0, %h0;\n  cvt.f32.f16 %t1, %h1;\n"                        \
  "  add.f32 %a" lo ", %a" lo ", %t0;\n  add.f32 %a" hi ", %a" hi ", %t1;\n"
#define HIR__PTX_PACK_F16(w, lo, hi) "  cvt.rn.f16x2.f32 %w" w ", %a" hi ", %a" lo ";\n"
#define HIR__PTX_ACC_BF16(w, lo, hi) /* a bf16 is the top half of an f32 */                                  \
  "  shl.b32 %t0, %w" w ", 16;\n  and.b32 %t1, %w" w ", -65536;\n"                                             \
  "  add.f32 %a" lo ", %a" lo ", %t0;\n  add.f32 %a" hi ", %a" hi ", %t1;\n"
#define HIR__PTX_PACK_BF16(w, lo, hi) "  cvt.rn.bf16x2.f32 %w" w ", %a" hi ", %a" lo ";\n"

static const char *const hir__cuda_ptx[] = { /* pieces under C's 4095-character limit, joined when loaded */
    ".version 7.0\n.target sm_80\n.address_size 64\n",
    HIR__PTX_SUM_KERNEL("hir_sum_f32", HIR__PTX_ACC_F32, HIR__PTX_PACK_F32),
    HIR__PTX_SUM_KERNEL("hir_sum_f16", HIR__PTX_ACC_F16, HIR__PTX_PACK_F16),
    HIR__PTX_SUM_KERNEL("hir_sum_bf16", HIR__PTX_ACC_BF16, HIR__PTX_PACK_BF16)};

/* Loads the kernels once; where the driver or GPU cannot take them (older
   than sm_80), sums stay on cuBLAS. */
static void hir__cuda_load_kernels(hir__cuda *c) {
  static const struct { hir_dtype dtype; const char *name; } sums[] = {
      {HIR_F32, "hir_sum_f32"}, {HIR_F16, "hir_sum_f16"}, {HIR_BF16, "hir_sum_bf16"}};
  size_t i, len = 1;
  char *ptx;
  cudaError_t e;
  if (c->kernels_state) return;
  c->kernels_state = -1;
  for (i = 0; i < sizeof hir__cuda_ptx / sizeof hir__cuda_ptx[0]; i++) len += strlen(hir__cuda_ptx[i]);
  if (!(ptx = (char *)HIR_MALLOC(len))) return;
  for (ptx[0] = 0, i = 0; i < sizeof hir__cuda_ptx / sizeof hir__cuda_ptx[0]; i++) strcat(ptx, hir__cuda_ptx[i]);
  e = cudaLibraryLoadData(&c->kernels, ptx, NULL, NULL, 0, NULL, NULL, 0);
  HIR_FREE(ptx);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  c->kernels_state = 1;
  for (i = 0; i < sizeof sums / sizeof sums[0]; i++)
    if (cudaLibraryGetKernel(&c->sum_kernel[sums[i].dtype], c->kernels, sums[i].name) != cudaSuccess) {
      cudaGetLastError();
      c->sum_kernel[sums[i].dtype] = NULL;
    }
}

/* next[O, I] = sum over R of cur[O, R, I] by the kernel, where it applies:
   a loaded kernel for the dtype, an axis of at most 256 (longer ones keep
   the GEMM, whose threads share an axis), rows of whole 16-byte vectors. */
static int hir__cuda_sum_kernel(hir_backend *b, cudaStream_t s, void *next, const void *cur, hir_dtype dt, int64_t O, int64_t R,
                                int64_t I, hir_status *st) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  int64_t es = (int64_t)hir_dtype_size(dt), o;
  uint64_t nvec = (uint64_t)(I * es / 16), rstride = (uint64_t)(I * es), osrc = (uint64_t)(R * I * es), odst = rstride;
  unsigned r = (unsigned)R;
  if (!c->sum_kernel[dt] || R < 1 || R > 256 || (I * es) % 16 || ((uintptr_t)next | (uintptr_t)cur) % 16) return 0;
  for (o = 0; o < O; o += 65535) { /* blockIdx.y is o: at most 65535 a launch */
    void *dp = (char *)next + o * (int64_t)odst;
    const void *sp = (const char *)cur + o * (int64_t)osrc;
    void *args[7];
    dim3 grid, block;
    cudaError_t e;
    args[0] = &dp, args[1] = &sp, args[2] = &nvec, args[3] = &r, args[4] = &rstride, args[5] = &osrc, args[6] = &odst;
    grid.x = (unsigned)((nvec + 255) / 256), grid.y = (unsigned)(O - o < 65535 ? O - o : 65535), grid.z = 1;
    block.x = 256, block.y = 1, block.z = 1;
    if ((e = cudaLaunchKernel((const void *)c->sum_kernel[dt], grid, block, args, 0, s)) != cudaSuccess) {
      *st = hir__cuda_fail(b, "cudaLaunchKernel (sum)", cudaGetErrorString(e), __FILE__, __LINE__);
      return 1;
    }
  }
  *st = HIR_OK;
  return 1;
}

/* next[O] = the sums of cur's O dense rows of R by the NVRTC kernel, where
   it loads: a batch of O GEMMs of one row each would be cuBLAS's slowest
   case (a layer_norm's means). */
static int hir__cuda_sum_rows(hir_backend *b, cudaStream_t s, void *next, const void *cur, hir_dtype dt, int64_t O, int64_t R,
                              hir_status *st) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__rows_args args;
  void *argv[1];
  dim3 grid, block;
  unsigned threads = 32;
  int64_t per = 16 / (int64_t)hir_dtype_size(dt);
  cudaError_t e;
  if (dt > HIR_BF16 || c->map_state[HIR__SUM_ROWS] != 1) return 0;
  args.dst = next, args.src = cur, args.rows = O, args.cols = R, args.dt = (int)dt;
  args.vec = (R * (int64_t)hir_dtype_size(dt)) % 16 == 0 && (uintptr_t)cur % 16 == 0;
  while (threads < 256 && (int64_t)threads * per < R) threads *= 2;
  argv[0] = &args;
  grid.x = (unsigned)(O < (1 << 20) ? O : (1 << 20)), grid.y = grid.z = 1;
  block.x = threads, block.y = block.z = 1;
  *st = (e = cudaLaunchKernel((const void *)c->map_kernel[HIR__SUM_ROWS], grid, block, argv, 0, s)) == cudaSuccess
            ? HIR_OK : hir__cuda_fail(b, "cudaLaunchKernel (sum of rows)", cudaGetErrorString(e), __FILE__, __LINE__);
  return 1;
}

/* dst (src's shape, 1 on reduced axes) = sum of src, one reduced axis at a
   time: short axes by the kernel above, the innermost by the rows kernel,
   the rest as a strided-batched GEMM against ones; all accumulate in f32
   or more (f64). The last axis writes straight
   into dst where dst is dense. */
static hir_status hir__cuda_sum(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *src) {
  hir__cuda_lane *l;
  hir_tensor cur, next;
  hir_status st;
  size_t es = hir_dtype_size(src->dtype);
  int d;
  cudaDataType t = hir__cuda_type(src->dtype);
  cublasComputeType_t ct = src->dtype == HIR_F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  float one_f = 1, zero_f = 0;
  double one_d = 1, zero_d = 0;
  const void *one = src->dtype == HIR_F64 ? (const void *)&one_d : (const void *)&one_f;
  const void *zero = src->dtype == HIR_F64 ? (const void *)&zero_d : (const void *)&zero_f;
  int last = -1;
  if (hir__numel(dst->ndims, dst->sizes) == 0) return HIR_OK;
  if ((st = hir__cuda_lane_of(b, stream, &l)) != HIR_OK) return st;
  if (hir__numel(src->ndims, src->sizes) == 0) return hir__cuda_zero(b, l, dst); /* a sum of nothing */
  if (src->dtype == HIR_I64) return hir__cuda_reduce_axes(b, l->stream, dst, src, 1);
  if ((st = hir__cuda_dense(b, l, 0, src, src, &cur)) != HIR_OK) return st;
  for (d = 0; d < src->ndims; d++)
    if (dst->sizes[d] == 1 && src->sizes[d] != 1) last = d;
  for (d = 0; d <= last; d++) {
    int64_t O = 1, R = cur.sizes[d], I = 1, q;
    void *ones, *p;
    if (dst->sizes[d] != 1 || R == 1) continue;
    for (q = 0; q < d; q++) O *= cur.sizes[q];
    for (q = d + 1; q < cur.ndims; q++) I *= cur.sizes[q];
    next = cur;
    next.sizes[d] = 1;
    hir__contiguous_strides(&next);
    if (d == last && hir__is_contiguous(dst)) {
      p = dst->data;
    } else if ((st = hir__cuda_scratch(b, l, cur.data == l->scratch[1] ? 2 : 1, (size_t)(O * I) * es, &p)) != HIR_OK) {
      return st; /* results alternate between scratch 1 and 2, never the buffer being read */
    }
    next.data = p;
    if (hir__cuda_sum_kernel(b, l->stream, next.data, cur.data, src->dtype, O, R, I, &st) ||
        (I == 1 && hir__cuda_sum_rows(b, l->stream, next.data, cur.data, src->dtype, O, R, &st))) {
      if (st != HIR_OK) return st;
    } else {
      if ((st = hir__cuda_ones(b, l, src->dtype, R, &ones)) != HIR_OK) return st;
      /* column-major: C[I x 1] = A[I x R] (ld I) x ones[R x 1], batched over O */
      HIR__BLAS(b, cublasGemmStridedBatchedEx(l->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)I, 1, (int)R, one, cur.data, t, (int)I,
                                              (long long)(R * I), ones, t, (int)R, 0, zero, next.data, t, (int)I, (long long)I,
                                              (int)O, ct, CUBLAS_GEMM_DEFAULT));
    }
    cur = next;
  }
  return cur.data == dst->data ? HIR_OK : hir__cuda_copy(b, l->stream, dst, &cur);
}

/* One operand of a GEMM in cuBLAS terms: a pointer, whether it is read
   transposed, and its leading dimension. Row-major [R, C] with unit column
   stride is column-major C x R; unit row stride reads it transposed. */
static int hir__gemm_operand(const hir_tensor *t, int nd, int *trans, int64_t *ld) {
  int64_t rs = t->strides[nd - 2], cs = t->strides[nd - 1], R = t->sizes[nd - 2], C = t->sizes[nd - 1];
  if ((rs == 0 && R > 1) || (cs == 0 && C > 1)) return 0; /* a repeated row or column: made dense first */
  if (cs == 1 || C == 1) {
    *trans = 0;
    *ld = (R == 1 || rs < C) ? (C > 1 ? C : 1) : rs;
    return rs >= C || R == 1;
  }
  if (rs == 1 || R == 1) {
    *trans = 1;
    *ld = cs >= R ? cs : R;
    return 1;
  }
  return 0;
}

/* Whether t's batch axes (all but its last two of nd) run on from its
   rows, so that [..., R, C] reads as [(...) R, C] at row stride ld: each
   axis's stride the extent of the axes inside it (size-1 axes aside). */
static int hir__batches_fold(const hir_tensor *t, int nd, int64_t ld) {
  int64_t next = ld * t->sizes[nd - 2];
  int d;
  for (d = nd - 3; d >= 0; d--) {
    if (t->sizes[d] == 1) continue;
    if (t->strides[d] != next) return 0;
    next *= t->sizes[d];
  }
  return 1;
}

static hir_status hir__cuda_matmul_bias(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *a,
                                        const hir_tensor *x, const hir_tensor *bias, hir_unary_op op);

/* dst = a x b: one cuBLASLt GEMM with its setup kept where it takes the
   operands (a launch costs about 1.5 us less host time than
   cublasGemmEx's), else cuBLAS's strided-batched GEMMs (any batches,
   transposed operands, f64, TF32). */
static hir_status hir__cuda_matmul(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *a, const hir_tensor *x) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__cuda_lane *l;
  hir_tensor A = *a, B = *x, C = *dst;
  hir_status st;
  int nd = dst->ndims, nb = nd - 2, ta, tb, tc, d, k;
  int64_t lda, ldb, ldc, M = dst->sizes[nd - 2], N = dst->sizes[nd - 1], K = a->sizes[nd - 1];
  int64_t bsz[HIR_MAX_DIMS], bst[3][HIR_MAX_DIMS], idx[HIR_MAX_DIMS] = {0};
  int nbd = nb;
  cudaDataType t = hir__cuda_type(dst->dtype);
  cublasComputeType_t ct = dst->dtype == HIR_F64 ? CUBLAS_COMPUTE_64F : (dst->dtype == HIR_F32 && c->tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                                          : CUBLAS_COMPUTE_32F;
  float one_f = 1, zero_f = 0;
  double one_d = 1, zero_d = 0;
  const void *one = dst->dtype == HIR_F64 ? (const void *)&one_d : (const void *)&one_f;
  const void *zero = dst->dtype == HIR_F64 ? (const void *)&zero_d : (const void *)&zero_f;
  size_t es = hir_dtype_size(dst->dtype);
  if ((st = hir__cuda_matmul_bias(b, stream, dst, a, x, NULL, HIR_UNARY_COUNT)) != HIR_ERR_UNSUPPORTED) return st;
  if ((st = hir__cuda_lane_of(b, stream, &l)) != HIR_OK) return st;
  if (hir__numel(nd, dst->sizes) == 0) return HIR_OK;
  if (K == 0) return hir__cuda_zero(b, l, dst); /* an empty contraction */
  if (!hir__gemm_operand(&A, nd, &ta, &lda) && (st = hir__cuda_dense(b, l, 0, a, a, &A)) != HIR_OK) return st;
  if (!hir__gemm_operand(&B, nd, &tb, &ldb) && (st = hir__cuda_dense(b, l, 1, x, x, &B)) != HIR_OK) return st;
  hir__gemm_operand(&A, nd, &ta, &lda);
  hir__gemm_operand(&B, nd, &tb, &ldb);
  if (!hir__gemm_operand(&C, nd, &tc, &ldc) || tc) {
    snprintf(b->error, sizeof b->error, "cuda backend: matmul output must have rows of unit stride");
    return HIR_ERR_UNSUPPORTED;
  }
  for (d = 0; d < nb; d++) {
    bsz[d] = dst->sizes[d];
    bst[0][d] = C.strides[d];
    bst[1][d] = A.strides[d];
    bst[2][d] = B.strides[d];
  }
  hir__collapse(&nbd, bsz, bst, 3); /* batch axes that flatten into one stride each */
  for (;;) { /* the innermost batch axis in one strided-batched call, the rest looped */
    const char *pa = (const char *)A.data, *pb = (const char *)B.data;
    char *pc = (char *)C.data;
    int64_t count = nbd ? bsz[nbd - 1] : 1;
    long long sa = nbd ? bst[1][nbd - 1] : 0, sb = nbd ? bst[2][nbd - 1] : 0, sc = nbd ? bst[0][nbd - 1] : 0;
    for (k = 0; k + 1 < nbd; k++) {
      pc += idx[k] * bst[0][k] * (int64_t)es;
      pa += idx[k] * bst[1][k] * (int64_t)es;
      pb += idx[k] * bst[2][k] * (int64_t)es;
    }
    /* row-major C = A B is column-major C^T = B^T A^T */
    HIR__BLAS(b, cublasGemmStridedBatchedEx(l->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M,
                                            (int)K, one, pb, t, (int)ldb, sb, pa, t, (int)lda, sa, zero, pc, t, (int)ldc, sc,
                                            (int)count, ct, CUBLAS_GEMM_DEFAULT));
    for (k = nbd - 2; k >= 0; k--) {
      if (++idx[k] < bsz[k]) break;
      idx[k] = 0;
    }
    if (k < 0) break;
  }
  return HIR_OK;
}

/* The cuBLASLt setups of GEMMs (plain, bias epilogues, fp8), made once per
   shape and kept: a run only points a descriptor at its bias or scales,
   and launches. key's plan if made, else a slot for it (the oldest's,
   round-robin). */
static hir__lt_plan *hir__lt_slot(hir__cuda *c, const int64_t *key) {
  hir__lt_plan *q;
  int i;
  for (i = 0; i < HIR__LT_PLANS; i++)
    if (c->lt_plans[i].made && !memcmp(c->lt_plans[i].key, key, sizeof c->lt_plans[i].key)) return &c->lt_plans[i];
  q = &c->lt_plans[c->lt_next];
  c->lt_next = (c->lt_next + 1) % HIR__LT_PLANS;
  hir__lt_plan_free(q);
  memcpy(q->key, key, sizeof q->key);
  return q;
}

/* The setup of the algorithm for q's descriptor and layouts (q->found: one was). */
static cublasStatus_t hir__lt_find(hir__cuda *c, hir__lt_plan *q) {
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  size_t ws = HIR__CUDA_WORKSPACE;
  cublasStatus_t st;
  if ((st = cublasLtMatmulPreferenceCreate(&pref)) == CUBLAS_STATUS_SUCCESS &&
      (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) ==
          CUBLAS_STATUS_SUCCESS &&
      (st = cublasLtMatmulAlgoGetHeuristic(c->lt, q->desc, q->la, q->lb, q->lc, q->lc, pref, 1, &heur, &q->found)) ==
          CUBLAS_STATUS_SUCCESS &&
      q->found)
    q->algo = heur.algo;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  return st;
}

static hir__lt_plan *hir__lt_plan_of(hir__cuda *c, const int64_t *key, cudaDataType t, int tb, cublasStatus_t *st) {
  hir__lt_plan *q;
  cublasLtEpilogue_t epi = key[8] == HIR__LT_PLAIN          ? CUBLASLT_EPILOGUE_DEFAULT
                           : key[8] == HIR_UNARY_RELU      ? CUBLASLT_EPILOGUE_RELU_BIAS
                           : key[8] == HIR_UNARY_GELU_TANH ? CUBLASLT_EPILOGUE_GELU_BIAS /* tanh's approximation */
                                                           : CUBLASLT_EPILOGUE_BIAS;
  cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
  int64_t M = key[0], N = key[1], K = key[2], lda = key[5], ldb = key[6], ldc = key[7];
  *st = CUBLAS_STATUS_SUCCESS;
  if ((q = hir__lt_slot(c, key))->made) return q;
  /* row-major C = A B is column-major C^T [N, M] = B^T A^T */
  if ((*st = cublasLtMatmulDescCreate(&q->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) == CUBLAS_STATUS_SUCCESS &&
      (*st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) == CUBLAS_STATUS_SUCCESS &&
      (*st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) == CUBLAS_STATUS_SUCCESS &&
      (*st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) == CUBLAS_STATUS_SUCCESS &&
      (*st = cublasLtMatrixLayoutCreate(&q->la, t, (uint64_t)(tb ? K : N), (uint64_t)(tb ? N : K), ldb)) == CUBLAS_STATUS_SUCCESS &&
      (*st = cublasLtMatrixLayoutCreate(&q->lb, t, (uint64_t)K, (uint64_t)M, lda)) == CUBLAS_STATUS_SUCCESS &&
      (*st = cublasLtMatrixLayoutCreate(&q->lc, t, (uint64_t)N, (uint64_t)M, ldc)) == CUBLAS_STATUS_SUCCESS)
    *st = hir__lt_find(c, q);
  if (*st != CUBLAS_STATUS_SUCCESS) {
    hir__lt_plan_free(q);
    return NULL;
  }
  q->made = 1;
  return q;
}

/* dst = op(a x b + bias) through cuBLASLt's BIAS, RELU_BIAS or GELU_BIAS
   epilogue, or (bias NULL) a x b alone, its setup kept: one GEMM (batches
   folded into M where a and dst allow), f32/f16/bf16, bias a dense vector
   of N; anything else is HIR_ERR_UNSUPPORTED (the evaluator then adds the
   bias and applies op itself; a plain GEMM goes to cublasGemmEx). */
static hir_status hir__cuda_matmul_bias(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *a,
                                        const hir_tensor *x, const hir_tensor *bias, hir_unary_op op) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__cuda_lane *l;
  hir__lt_plan *q;
  hir_tensor A = *a, B = *x, C = *dst;
  int nd = dst->ndims, ta, tb, tc, d, ok;
  int64_t lda, ldb, ldc, M = 1, N = dst->sizes[nd - 1], K = a->sizes[nd - 1], key[9];
  float one = 1, zero = 0;
  cublasStatus_t st;
  if (dst->dtype == HIR_F64 || c->tf32 || (bias && bias->strides[nd - 1] != 1) || K == 0 || hir__numel(nd, dst->sizes) == 0 ||
      (op != HIR_UNARY_COUNT && op != HIR_UNARY_RELU && op != HIR_UNARY_GELU_TANH) || (!bias && op != HIR_UNARY_COUNT) ||
      hir__cuda_lane_of(b, stream, &l) != HIR_OK)
    return HIR_ERR_UNSUPPORTED;
  ok = hir__gemm_operand(&A, nd, &ta, &lda) && hir__gemm_operand(&B, nd, &tb, &ldb) && hir__gemm_operand(&C, nd, &tc, &ldc) && !tc && !ta;
  for (d = 0; ok && d < nd - 2; d++) ok = B.strides[d] == 0 || dst->sizes[d] == 1; /* batches fold into M: B and the bias repeat */
  /* folded, rows stay at their strides lda and ldc: stream.experimental.column_parts's GEMMs write columns of a wider output */
  if (!ok || !hir__batches_fold(&A, nd, lda) || !hir__batches_fold(&C, nd, ldc)) return HIR_ERR_UNSUPPORTED;
  for (d = 0; d < nd - 1; d++) M *= dst->sizes[d];
  if (!c->lt && cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) return HIR_ERR_UNSUPPORTED;
  key[0] = M, key[1] = N, key[2] = K, key[3] = dst->dtype, key[4] = tb, key[5] = lda, key[6] = ldb, key[7] = ldc;
  key[8] = bias ? (int64_t)op : (int64_t)HIR__LT_PLAIN;
  if (!(q = hir__lt_plan_of(c, key, hir__cuda_type(dst->dtype), tb, &st)) || !q->found) {
    if (!q && st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
      return hir__cuda_fail(b, "cuBLASLt setup", cublasGetStatusString(st), __FILE__, __LINE__);
    return HIR_ERR_UNSUPPORTED;
  }
  st = bias ? cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias->data, sizeof bias->data)
            : CUBLAS_STATUS_SUCCESS;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmul(c->lt, q->desc, &one, B.data, q->la, A.data, q->lb, &zero, C.data, q->lc, C.data, q->lc, &q->algo,
                        l->workspace, HIR__CUDA_WORKSPACE, l->stream);
  if (st == CUBLAS_STATUS_SUCCESS) return HIR_OK;
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) return HIR_ERR_UNSUPPORTED;
  return hir__cuda_fail(b, "cublasLtMatmul", cublasGetStatusString(st), __FILE__, __LINE__);
}

/* One fp8 GEMM of cuBLASLt: C [M, N] (ldc) = A [M, K] (lda) x the weight
   B, [N, K] row-major (ldb), scaled by pa (per row of A) and pb (per N):
   single values, or vectors (cuBLASLt's outer-vector mode), or NULL (1).
   Its plan is cached by shape, dtypes and mode; *found 0: cuBLASLt has no
   such GEMM here, or the operands break its rules. */
static cublasStatus_t hir__cuda_fp8_gemm(hir__cuda *c, hir__cuda_lane *l, hir_dtype ta, hir_dtype tb, hir_dtype tc, int64_t M, int64_t N,
                                         int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc,
                                         const void *pa, const void *pb, int vectors, int *found) {
  hir__lt_plan *q;
  float one = 1, zero = 0;
  int64_t key[9];
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  *found = 0;
  /* cuBLASLt's fp8 rules, which its heuristic does not always check (it offered an N = 1 GEMM that wrote wrong
     rows): K and N multiples of 16, leading dimensions of 16 bytes, the matrices (and scale vectors) 16-byte aligned */
  if (K % 16 || N % 16 || lda % 16 || ldb % 16 || ldc * (int64_t)hir_dtype_size(tc) % 16 ||
      ((uintptr_t)A | (uintptr_t)B | (uintptr_t)C | (vectors ? (uintptr_t)pa | (uintptr_t)pb : 0)) % 16)
    return CUBLAS_STATUS_SUCCESS;
  if (!c->lt && (st = cublasLtCreate(&c->lt)) != CUBLAS_STATUS_SUCCESS) return st;
  key[0] = M, key[1] = N, key[2] = K, key[3] = 1000 + 100 * tc + 10 * ta + tb, key[4] = 1;
  key[5] = lda, key[6] = ldb, key[7] = ldc, key[8] = 1000 + vectors;
  if (!(q = hir__lt_slot(c, key))->made) { /* row-major C = A B is column-major C^T = B^T A^T: cuBLAS's A is the weight */
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    int32_t mode = vectors ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    if ((st = cublasLtMatmulDescCreate(&q->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode)) == CUBLAS_STATUS_SUCCESS &&
        /* the scales before the heuristic: without them it offers outer-vector GEMMs the run then refuses (Hopper) */
        (st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pb, sizeof pb)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pa, sizeof pa)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatrixLayoutCreate(&q->la, hir__cuda_type(tb), (uint64_t)K, (uint64_t)N, ldb)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatrixLayoutCreate(&q->lb, hir__cuda_type(ta), (uint64_t)K, (uint64_t)M, lda)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatrixLayoutCreate(&q->lc, hir__cuda_type(tc), (uint64_t)N, (uint64_t)M, ldc)) == CUBLAS_STATUS_SUCCESS)
      st = hir__lt_find(c, q);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) {
      hir__lt_plan_free(q);
      return st;
    }
    q->made = 1; /* found or not, kept: the next call knows at once */
  }
  if (!q->found) return CUBLAS_STATUS_SUCCESS;
  if ((st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pb, sizeof pb)) == CUBLAS_STATUS_SUCCESS &&
      (st = cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pa, sizeof pa)) == CUBLAS_STATUS_SUCCESS &&
      (st = cublasLtMatmul(c->lt, q->desc, &one, B, q->la, A, q->lb, &zero, C, q->lc, C, q->lc, &q->algo, l->workspace,
                           HIR__CUDA_WORKSPACE, l->stream)) == CUBLAS_STATUS_SUCCESS)
    *found = 1;
  return st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ? CUBLAS_STATUS_SUCCESS : st;
}

/* Whether cuBLASLt's fp8 GEMM takes these operands as they are: a [..., M,
   K] and C row-major, the weight [N, K] row-major (B [K, N] transposed),
   batches folded into M (the weight repeats, A's and C's rows run on). */
static int hir__fp8_layout(const hir_tensor *A, const hir_tensor *B, const hir_tensor *C, int64_t *lda, int64_t *ldb, int64_t *ldc) {
  int nd = C->ndims, ta, tb, tc, d, ok;
  int64_t N = C->sizes[nd - 1], K = A->sizes[nd - 1];
  ok = hir__gemm_operand(A, nd, &ta, lda) && hir__gemm_operand(B, nd, &tb, ldb) && hir__gemm_operand(C, nd, &tc, ldc) &&
       !ta && !tc;
  if (ok && !tb && N == 1 && B->strides[nd - 2] == 1) tb = 1, *ldb = K; /* one weight row: either layout */
  if (ok && !tb && K == 1 && B->strides[nd - 1] == 1) tb = 1, *ldb = 1;  /* one weight column: either layout */
  for (d = 0; ok && d < nd - 2; d++) ok = C->sizes[d] == 1 || B->strides[d] == 0;
  return ok && tb && hir__batches_fold(A, nd, *lda) && hir__batches_fold(C, nd, *ldc) && (nd <= 2 || (*lda == K && *ldc == N));
}

/* Where cuBLASLt has no fp8 GEMM (K or N not multiples of 16, or a GPU
   before compute capability 8.9): raw [M, N] f32 = A [M, K] (lda) x the
   weight [N, K] (ldb) by cuBLAS in bf16, which holds every e4m3 and e5m2
   value exactly, accumulating in f32 as the fp8 GEMM does. Slower, the
   same numbers. */
static hir_status hir__cuda_fp8_widened(hir_backend *b, hir__cuda_lane *l, hir_dtype ta, hir_dtype tb, int64_t M, int64_t N,
                                        int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb, float *raw) {
  hir_tensor from, to;
  const void *wide[2];
  float one = 1, zero = 0;
  hir_status hs;
  int k;
  for (k = 0; k < 2; k++) {
    int64_t rows = k ? N : M;
    memset(&from, 0, sizeof from);
    from.dtype = k ? tb : ta, from.ndims = 2, from.sizes[0] = rows, from.sizes[1] = K;
    from.strides[0] = k ? ldb : lda, from.strides[1] = 1;
    from.data = (void *)(k ? B : A);
    to = from;
    to.dtype = HIR_BF16, to.strides[0] = K;
    if ((hs = hir__cuda_scratch(b, l, 6 + k, (size_t)(rows * K) * 2, &to.data)) != HIR_OK ||
        (hs = hir__cuda_map(b, l->stream, HIR_UNARY_CAST, &to, &from, NULL, 0)) != HIR_OK)
      return hs;
    wide[k] = to.data;
  }
  HIR__BLAS(b, cublasGemmEx(l->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, wide[1], CUDA_R_16BF, (int)K, wide[0],
                            CUDA_R_16BF, (int)K, &zero, raw, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return HIR_OK;
}

/* The scales of an fp8 GEMM [..., M, N] as dense f32 vectors: a's [M]
   (N dropped), b's [N], single values repeated; *pa, *pb where they are. */
static hir_status hir__cuda_fp8_scales(hir_backend *b, hir__cuda_lane *l, const hir_tensor *sa, const hir_tensor *sb, int64_t N,
                                       const void **pa, const void **pb) {
  hir_tensor va = *sa, vb = *sb, dense;
  hir_status hs;
  va.ndims = sa->ndims - 1;
  vb.ndims = 1, vb.sizes[0] = N, vb.strides[0] = sb->strides[sb->ndims - 1];
  if ((hs = hir__cuda_dense(b, l, 0, &va, &va, &dense)) != HIR_OK) return hs;
  *pa = dense.data;
  if ((hs = hir__cuda_dense(b, l, 2, &vb, &vb, &dense)) != HIR_OK) return hs;
  *pb = dense.data;
  return HIR_OK;
}

/* hir_backend.matmul_scaled through cuBLASLt's fp8 GEMM, which takes one
   layout ("TN"): a row-major and the weight [N, K] row-major (b read as
   [K, N] column-major), dst row-major, batches folded into M; operands in
   other layouts are made dense first (one weight for every batch). One
   value per scale goes to the GEMM itself; per-row scales too in its
   outer-vector mode where the heuristic offers it (Hopper with cuBLAS 13
   does), else the GEMM writes f32 and one kernel (hir_scale_rc) applies
   both scales. Where cuBLASLt has no fp8 GEMM for the shape or the GPU,
   the f32 comes from a bf16 GEMM of the widened values
   (hir__cuda_fp8_widened). */
static hir_status hir__cuda_matmul_scaled(hir_backend *b, void *stream, const hir_tensor *dst, const hir_tensor *a,
                                          const hir_tensor *x, const hir_tensor *sa, const hir_tensor *sb) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  hir__cuda_lane *l;
  hir_tensor A = *a, B = *x, C = *dst;
  int nd = dst->ndims, d, ok, vectors = 0, found = 0, copy_out = 0;
  int64_t lda, ldb, ldc, M = 1, N = dst->sizes[nd - 1], K = a->sizes[nd - 1];
  const void *pa = sa->data, *pb = sb->data;
  cublasStatus_t st;
  hir_status hs;
  hir__scale_args args;
  void *argv[1];
  dim3 grid, block;
  if (hir__numel(nd, dst->sizes) == 0) return HIR_OK;
  if ((hs = hir__cuda_lane_of(b, stream, &l)) != HIR_OK) return hs;
  if (K == 0) return hir__cuda_zero(b, l, dst); /* an empty contraction, scaled */
  ok = hir__fp8_layout(&A, &B, &C, &lda, &ldb, &ldc);
  if (!ok) { /* other layouts: the operands made dense first */
    hir_tensor w = B, wd;
    for (d = 0; d < nd - 2; d++) /* a weight per batch is a batched GEMM, which this is not */
      if (B.strides[d] != 0 && B.sizes[d] > 1) {
        snprintf(b->error, sizeof b->error, "cuda backend: the fp8 GEMM (cuBLASLt) takes one weight for every batch, not "
                 "one per batch; loop over the batches");
        return HIR_ERR_UNSUPPORTED;
      }
    if ((hs = hir__cuda_dense(b, l, 3, a, a, &A)) != HIR_OK) return hs;
    w.ndims = 2, w.sizes[0] = N, w.sizes[1] = K, w.strides[0] = B.strides[nd - 1], w.strides[1] = B.strides[nd - 2];
    if ((hs = hir__cuda_dense(b, l, 4, &w, &w, &wd)) != HIR_OK) return hs;
    B.data = wd.data, B.strides[nd - 2] = 1, B.strides[nd - 1] = K; /* [K, N] seen through the dense [N, K] */
    for (d = 0; d < nd - 2; d++) B.strides[d] = 0;
    if (!hir__is_contiguous(&C)) { /* computed dense, copied out below */
      if ((hs = hir__cuda_scratch(b, l, 5, (size_t)hir__numel(nd, dst->sizes) * hir_dtype_size(dst->dtype), &C.data)) != HIR_OK)
        return hs;
      hir__contiguous_strides(&C);
      copy_out = 1;
    }
    ok = hir__fp8_layout(&A, &B, &C, &lda, &ldb, &ldc);
  }
  if (!ok) {
    snprintf(b->error, sizeof b->error, "cuda backend: the fp8 GEMM's operands, made dense, still fit no layout cuBLASLt takes "
             "(N %lld, K %lld); please report it", (long long)N, (long long)K);
    return HIR_ERR_UNSUPPORTED;
  }
  for (d = 0; d < nd - 1; d++) M *= dst->sizes[d];
  for (d = 0; d < nd; d++) vectors |= sa->strides[d] != 0 || sb->strides[d] != 0;
  if (vectors && (hs = hir__cuda_fp8_scales(b, l, sa, sb, N, &pa, &pb)) != HIR_OK) return hs;
  st = hir__cuda_fp8_gemm(c, l, a->dtype, x->dtype, dst->dtype, M, N, K, A.data, lda, B.data, ldb, C.data, ldc, pa, pb, vectors,
                          &found);
  if (st != CUBLAS_STATUS_SUCCESS) return hir__cuda_fail(b, "cublasLtMatmul (fp8)", cublasGetStatusString(st), __FILE__, __LINE__);
  if (found) return copy_out ? hir__cuda_copy(b, l->stream, dst, &C) : HIR_OK;
  /* none here: unscaled into f32, then the scales by the elementwise kernel */
  if (!vectors && (hs = hir__cuda_fp8_scales(b, l, sa, sb, N, &pa, &pb)) != HIR_OK) return hs;
  { /* raw f32 [M, N] from cuBLASLt's fp8 GEMM without scales, or else from the widened values; then both scales */
    hir_tensor raw = *dst;
    raw.dtype = HIR_F32;
    hir__contiguous_strides(&raw);
    if ((hs = hir__cuda_scratch(b, l, 1, (size_t)M * (size_t)N * sizeof(float), &raw.data)) != HIR_OK) return hs;
    if (c->map_state[HIR__SCALE_RC] != 1) {
      snprintf(b->error, sizeof b->error, "cuda backend: an fp8 GEMM that cuBLASLt does not scale needs the NVRTC kernels: %.160s",
               c->map_error);
      return HIR_ERR_UNSUPPORTED;
    }
    st = hir__cuda_fp8_gemm(c, l, a->dtype, x->dtype, HIR_F32, M, N, K, A.data, lda, B.data, ldb, raw.data, N, NULL, NULL, 0, &found);
    if (st != CUBLAS_STATUS_SUCCESS) return hir__cuda_fail(b, "cublasLtMatmul (fp8)", cublasGetStatusString(st), __FILE__, __LINE__);
    if (!found && (hs = hir__cuda_fp8_widened(b, l, a->dtype, x->dtype, M, N, K, A.data, lda, B.data, ldb, (float *)raw.data)) != HIR_OK)
      return hs;
    args.dst = C.data, args.raw = (const float *)raw.data, args.sa = (const float *)pa, args.sb = (const float *)pb;
    args.rows = M, args.cols = N, args.ld = ldc, args.dt = (int)dst->dtype;
    args.vec = N % 4 == 0 && ((uintptr_t)raw.data | (uintptr_t)pb) % 16 == 0;
    argv[0] = &args;
    grid.x = (unsigned)(M < 65535 ? M : 65535), grid.y = grid.z = 1;
    block.x = 256, block.y = block.z = 1;
    HIR__CU(b, cudaLaunchKernel((const void *)c->map_kernel[HIR__SCALE_RC], grid, block, argv, 0, l->stream));
  }
  return copy_out ? hir__cuda_copy(b, l->stream, dst, &C) : HIR_OK;
}

/* hir_backend.reachable: memory of this GPU, managed memory, host memory
   CUDA knows (cudaMallocHost, cudaHostRegister), and any host memory where
   the GPU reads pageable memory (HMM, ATS). */
static int hir__cuda_reachable(hir_backend *b, const void *ptr, char *why, size_t cap) {
  hir__cuda *c = (hir__cuda *)b->ctx;
  struct cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, ptr) != cudaSuccess) {
    cudaGetLastError(); /* not sticky: clear it */
    snprintf(why, cap, "not memory CUDA knows; pass memory of GPU %d (cudaMalloc)", c->device);
    return 0;
  }
  if (at.type == cudaMemoryTypeUnregistered && !c->pageable_access) {
    snprintf(why, cap, "host memory this GPU cannot read (not from cudaMalloc, cudaMallocHost or cudaHostRegister); copy it "
             "to GPU %d first", c->device);
    return 0;
  }
  if (at.type == cudaMemoryTypeDevice && at.device != c->device) {
    snprintf(why, cap, "memory of GPU %d, and this backend runs on GPU %d; pass this rank's GPU's tensors", at.device, c->device);
    return 0;
  }
  return 1;
}

static hir_status hir__cuda_upload(hir_backend *b, void *dst, const void *src, size_t bytes) {
  HIR__CU(b, cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  HIR__CU(b, cudaStreamSynchronize(0)); /* from pageable memory it returns once staged; the backend's nonblocking streams would not wait */
  return HIR_OK;
}
static hir_status hir__cuda_download(hir_backend *b, void *dst, const void *src, size_t bytes) {
  HIR__CU(b, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return HIR_OK;
}
static hir_status hir__cuda_host_alloc(hir_backend *b, size_t bytes, void **ptr) {
  HIR__CU(b, cudaMallocHost(ptr, bytes));
  return HIR_OK;
}
static void hir__cuda_host_release(hir_backend *b, void *ptr) {
  (void)b;
  cudaFreeHost(ptr);
}
static hir_status hir__cuda_copy_async(hir_backend *b, void *stream, void *dst, const void *src, size_t bytes) {
  HIR__CU(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
  return HIR_OK;
}

HIRDEF hir_backend *hir_backend_cuda_create(int device) {
  hir_backend *b = NULL;
  hir_backend_cuda_open(device, &b, NULL, 0);
  return b;
}

HIRDEF hir_status hir_backend_cuda_open(int device, hir_backend **out, char *error, size_t cap) {
  hir_backend *b = (hir_backend *)HIR_MALLOC(sizeof(hir_backend));
  hir__cuda *c = (hir__cuda *)HIR_MALLOC(sizeof(hir__cuda));
  cudaError_t e = cudaSuccess;
  int count = 0;
  *out = NULL;
  if (!b || !c || (e = cudaSetDevice(device)) != cudaSuccess) {
    if (e != cudaSuccess && cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    cudaGetLastError();
    if (error && cap && (!b || !c)) snprintf(error, cap, "hir_backend_cuda_open: out of host memory");
    else if (error && cap && count <= device)
      snprintf(error, cap, "hir_backend_cuda_open: device %d is not there: %d CUDA devices are visible (%s; CUDA_VISIBLE_DEVICES "
               "and the driver decide which)", device, count, cudaGetErrorString(e));
    else if (error && cap && b && c)
      snprintf(error, cap, "hir_backend_cuda_open: device %d cannot be used: %s", device, cudaGetErrorString(e));
    HIR_FREE(b);
    HIR_FREE(c);
    return !b || !c ? HIR_ERR_NOMEM : HIR_ERR_BACKEND;
  }
  memset(b, 0, sizeof *b);
  memset(c, 0, sizeof *c);
  c->device = device;
  b->ctx = c;
  b->name = "cuda";
  {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) snprintf(c->device_name, sizeof c->device_name, "%s", prop.name);
  }
  b->device = c->device_name[0] ? c->device_name : NULL;
  b->destroy = hir__cuda_destroy;
  b->alloc = hir__cuda_alloc;
  b->release = hir__cuda_release;
  b->current_stream = hir__cuda_current;
  b->stream_create = hir__cuda_stream_create;
  b->stream_destroy = hir__cuda_stream_destroy;
  b->event_create = hir__cuda_event_create;
  b->event_destroy = hir__cuda_event_destroy;
  b->event_record = hir__cuda_record;
  b->stream_wait_event = hir__cuda_wait;
  b->stream_synchronize = hir__cuda_sync;
  b->stream_query = hir__cuda_query;
  b->copy = hir__cuda_copy;
  b->binary = hir__cuda_binary;
  b->unary = hir__cuda_unary;
  b->sum = hir__cuda_sum;
  b->max = hir__cuda_max;
  b->scatter_rows = hir__cuda_scatter_rows;
  b->moe_index = hir__cuda_moe_index;
  b->matmul = hir__cuda_matmul;
  b->matmul_bias = hir__cuda_matmul_bias;
  b->matmul_scaled = hir__cuda_matmul_scaled;
  b->layer_norm = hir__cuda_layer_norm;
  b->rms_norm = hir__cuda_rms_norm;
  b->rand = hir__cuda_rand;
  b->upload = hir__cuda_upload;
  b->download = hir__cuda_download;
  b->host_alloc = hir__cuda_host_alloc;
  b->host_release = hir__cuda_host_release;
  b->copy_async = hir__cuda_copy_async;
  b->timer_create = hir__cuda_timer_create;
  b->timer_elapsed = hir__cuda_timer_elapsed;
  b->graph_begin = hir__cuda_graph_begin;
  b->graph_end = hir__cuda_graph_end;
  b->graph_launch = hir__cuda_graph_launch;
  b->graph_destroy = hir__cuda_graph_destroy;
  b->max_abs = hir__cuda_max_abs;
  b->stream_shared = hir__cuda_stream_shared;
  b->reachable = hir__cuda_reachable;
  if (cudaDeviceGetAttribute(&c->pageable_access, cudaDevAttrPageableMemoryAccess, device) != cudaSuccess)
    c->pageable_access = 0, cudaGetLastError();
  { /* the driver's memsets, for the ones of long sums (hir__cuda_ones says if they are missing) */
    enum cudaDriverEntryPointQueryResult found;
    void *fn[3] = {NULL, NULL, NULL};
    const char *names[3] = {"cuMemsetD32Async", "cuMemsetD16Async", "cuMemsetD2D32Async"};
    int k;
    for (k = 0; k < 3; k++)
      if (cudaGetDriverEntryPointByVersion(names[k], &fn[k], 12000, cudaEnableDefault, &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess)
        fn[k] = NULL, cudaGetLastError();
    memcpy(&c->memset32, &fn[0], sizeof fn[0]); /* ISO C has no cast from void * to a function */
    memcpy(&c->memset16, &fn[1], sizeof fn[1]);
    memcpy(&c->memset2d32, &fn[2], sizeof fn[2]);
  }
  { /* the caller's lane and our kernels now, so that no run stalls on them (a failure shows at the first op that needs them) */
    hir__cuda_lane *l;
    hir__cuda_lane_of(b, NULL, &l);
    hir__cuda_load_kernels(c);
    hir__cuda_load_all(c);
  }
  b->notes = c->notes;
  *out = b;
  return HIR_OK;
}

HIRDEF void hir_backend_cuda_set_stream(hir_backend *b, void *stream) {
  hir__cuda_lane *l;
  if (!b || b->destroy != hir__cuda_destroy) return;
  ((hir__cuda *)b->ctx)->caller = (cudaStream_t)stream;
  hir__cuda_lane_of(b, NULL, &l); /* as at creation */
}

HIRDEF void hir_backend_cuda_set_tf32(hir_backend *b, int enable) {
  hir__cuda *c;
  int i;
  if (!b || b->destroy != hir__cuda_destroy) return;
  c = (hir__cuda *)b->ctx;
  c->tf32 = enable != 0;
  if (c->caller_lane.blas) cublasSetMathMode(c->caller_lane.blas, c->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
  for (i = 0; i < c->nlanes; i++) cublasSetMathMode(c->lanes[i].blas, c->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
}

HIRDEF hir_status hir_cuda_library_load(int device, const char *source, const char *name, void **library, char *error,
                                        size_t cap) {
  hir__nvrtc nvrtc;
  hir__map_build m;
  hir__kcache kc;
  cudaLibrary_t lib = NULL;
  size_t size = 0;
  char *bin;
  int major = 0, minor = 0, version = 0;
  hir_status s = HIR_OK;
  *library = NULL;
  memset(&m, 0, sizeof m);
  memset(&nvrtc, 0, sizeof nvrtc);
  if ((m.src = (char *)HIR_MALLOC(strlen(source) + 1))) memcpy(m.src, source, strlen(source) + 1);
  else {
    snprintf(error, cap, "%s: out of host memory", name);
    return HIR_ERR_NOMEM;
  }
  m.name = name;
  m.nvrtc = &nvrtc;
  hir__map_prepare(&m, device);
  hir__kcache_open(&kc);
  if (hir__nvrtc_open(&nvrtc, m.error, sizeof m.error) && nvrtc.version(&major, &minor) == 0) version = major * 1000 + minor;
  if ((bin = hir__kcache_get(&kc, m.key, m.arch, version, &size)) && cudaLibraryLoadData(&lib, bin, NULL, NULL, 0, NULL, NULL, 0) != cudaSuccess)
    lib = NULL, cudaGetLastError(); /* compiled again */
  HIR_FREE(bin);
  if (!lib && nvrtc.lib) hir__map_compile(&m);
  if (!lib && m.bin && cudaLibraryLoadData(&lib, m.bin, NULL, NULL, 0, NULL, NULL, 0) != cudaSuccess) {
    snprintf(m.error, sizeof m.error, "cudaLibraryLoadData of %s: %s", name, cudaGetErrorString(cudaGetLastError()));
    lib = NULL;
  } else if (lib && m.bin) {
    hir__kcache_put(&kc, m.key, m.arch, version, m.bin, m.size);
  }
  if (!lib) {
    snprintf(error, cap, "%s", m.error);
    s = HIR_ERR_BACKEND;
  }
  *library = lib;
  hir__kcache_close(&kc);
  if (nvrtc.lib) dlclose(nvrtc.lib);
  HIR_FREE(m.src);
  HIR_FREE(m.bin);
  return s;
}
#endif /* HOSTIR_CUDA */

// >>comm_local
/* N ranks as N threads. One mutex guards the world; each team is a reusable
   two-phase rendezvous (publish buffers, move data, all done), P2P goes
   through per-pair mailboxes. Every wait has a deadline: a missing peer
   becomes HIR_ERR_TIMEOUT and aborts the world, so no rank hangs. */
typedef struct hir__lw_member {  /* what a member brings to the team's current collective */
  const void *send;
  void *recv;
  size_t amount;                   /* bytes, or elements of `dtype` for the reductions */
  hir_dtype dtype;
  hir_comm_what what;
} hir__lw_member;

typedef struct hir__lw_team {
  struct hir__lw_team *next;
  int n, *devices;
  int arrived;
  unsigned long gen;
  hir__lw_member *at;              /* by position in the team */
  void *scratch;
  size_t scratch_cap;
} hir__lw_team;

typedef struct hir__lw_post {  /* a send waiting for its recv */
  const void *buf;
  size_t bytes;
  int src, dst, taken;
  hir_comm_what what;
} hir__lw_post;

#define HIR__LW_GROUP_MAX 256
typedef struct hir__lw_op {
  int is_send, peer;
  void *buf;
  size_t bytes;
  hir_comm_what what;
} hir__lw_op;

typedef struct hir__lw_rank {
  hir_local_world *w;
  int grouping, nops;
  hir__lw_op ops[HIR__LW_GROUP_MAX];
  hir__lw_post posts[HIR__LW_GROUP_MAX];
} hir__lw_rank;

struct hir_local_world {
  int n, timeout_ms, aborted;
  char abort_msg[400];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  hir_comm *comms;
  hir__lw_rank *ranks;
  hir__lw_team *teams;
  hir__lw_post ***mail;    /* posted sends, a list per rank pair (src * n + dst) */
  int *nmail, *cap_mail;
};

/* Marks the world dead and wakes every waiter. Called with mu held. */
static void hir__lw_abort_locked(hir_local_world *w, const char *msg) {
  if (!w->aborted) {
    w->aborted = 1;
    snprintf(w->abort_msg, sizeof w->abort_msg, "%.399s", msg);
  }
  pthread_cond_broadcast(&w->cv);
}

/* One wait on the world's condition (mu held): HIR_ERR_COMM once the world
   is aborted, HIR_ERR_TIMEOUT past the deadline. Its callers loop on their
   own condition and return the error only while it is still unmet: an abort
   that comes after a barrier completed or a send was posted undoes nothing. */
static hir_status hir__lw_wait(hir_comm *c, const struct timespec *deadline, const char *what) {
  hir_local_world *w = ((hir__lw_rank *)c->ctx)->w;
  int rc = w->aborted ? 0 : pthread_cond_timedwait(&w->cv, &w->mu, deadline);
  if (w->aborted) {
    snprintf(c->error, sizeof c->error, "local world: rank %d in %s: the world was aborted: %.400s", c->rank, what,
             w->abort_msg);
    return HIR_ERR_COMM;
  }
  if (rc != 0) {
    char msg[256];
    snprintf(msg, sizeof msg, "rank %d waited %d ms in %s for peers that never came", c->rank, w->timeout_ms, what);
    snprintf(c->error, sizeof c->error, "local world: %.180s (raise it with hir_local_world_set_timeout)", msg);
    hir__lw_abort_locked(w, msg);
    return HIR_ERR_TIMEOUT;
  }
  return HIR_OK;
}

/* All members arrive, then all leave (mu held). The last to arrive grows the
   team scratch to `scratch_need`: every member has then finished the
   previous op, so nobody still reads the old one. */
static hir_status hir__lw_barrier(hir_comm *c, hir__lw_team *t, const char *what, size_t scratch_need) {
  hir_local_world *w = ((hir__lw_rank *)c->ctx)->w;
  unsigned long gen = t->gen;
  struct timespec deadline = hir__deadline(w->timeout_ms);
  if (w->aborted) return hir__lw_wait(c, &deadline, what);
  if (++t->arrived == t->n) {
    if (t->scratch_cap < scratch_need) {
      void *p = HIR_REALLOC(t->scratch, scratch_need);
      if (p) {
        t->scratch = p;
        t->scratch_cap = scratch_need;
      }
    }
    t->arrived = 0;
    t->gen++;
    pthread_cond_broadcast(&w->cv);
    return HIR_OK;
  }
  while (t->gen == gen) {
    hir_status s = hir__lw_wait(c, &deadline, what);
    if (s != HIR_OK && t->gen == gen) return s;
  }
  return HIR_OK;
}

static hir_status hir__lw_make_team(hir_comm *c, const int *devices, int n, void **out) {
  hir_local_world *w = ((hir__lw_rank *)c->ctx)->w;
  hir__lw_team *t;
  int i;
  if (n < 1 || !devices) {
    snprintf(c->error, sizeof c->error, "local world: empty team");
    return HIR_ERR_INVALID;
  }
  for (i = 0; i < n; i++)
    if (devices[i] < 0 || devices[i] >= w->n) {
      snprintf(c->error, sizeof c->error, "local world: device %d of a team is outside the world of %d ranks", devices[i], w->n);
      return HIR_ERR_INVALID;
    }
  pthread_mutex_lock(&w->mu);
  for (t = w->teams; t; t = t->next)
    if (t->n == n && memcmp(t->devices, devices, (size_t)n * sizeof(int)) == 0) break;
  if (!t && (t = (hir__lw_team *)HIR_MALLOC(sizeof(hir__lw_team)))) {
    memset(t, 0, sizeof *t);
    t->n = n;
    t->devices = (int *)HIR_MALLOC((size_t)n * sizeof(int));
    t->at = (hir__lw_member *)HIR_MALLOC((size_t)n * sizeof(hir__lw_member));
    if (!t->devices || !t->at) {
      HIR_FREE(t->devices);
      HIR_FREE(t->at);
      HIR_FREE(t);
      t = NULL;
    } else {
      memcpy(t->devices, devices, (size_t)n * sizeof(int));
      t->next = w->teams;
      w->teams = t;
    }
  }
  pthread_mutex_unlock(&w->mu);
  if (!t) {
    snprintf(c->error, sizeof c->error, "local world: out of memory creating a team");
    return HIR_ERR_NOMEM;
  }
  if (hir_team_index(t->devices, t->n, c->rank) < 0) {
    snprintf(c->error, sizeof c->error, "local world: rank %d asked for a team it is not in", c->rank);
    return HIR_ERR_INVALID;
  }
  *out = t;
  return HIR_OK;
}

/* The collectives share one shape: publish, barrier, move data, barrier.
   `scratch_bytes` > 0 makes sure the team scratch holds that much first. */
typedef enum { HIR__LW_ALLGATHER, HIR__LW_ALLREDUCE, HIR__LW_REDUCE_SCATTER, HIR__LW_REDUCE, HIR__LW_BROADCAST,
               HIR__LW_GATHER, HIR__LW_SCATTER } hir__lw_kind;
static const char *const hir__lw_names[] = {"Allgather", "Allreduce", "ReduceScatter", "Reduce", "Broadcast", "Gather", "Scatter"};

/* dst[at] = the sum over the members' sends (those given) of element e: in
   double, stored once, or exactly for int64. */
static void hir__lw_sum(const hir__lw_team *t, hir_dtype dt, size_t e, void *dst, size_t at) {
  int i;
  if (dt == HIR_I64) {
    int64_t acc = 0;
    for (i = 0; i < t->n; i++)
      if (t->at[i].send) acc = hir__i64_binary(HIR_BINARY_ADD, acc, ((const int64_t *)t->at[i].send)[e]);
    ((int64_t *)dst)[at] = acc;
  } else {
    double acc = 0;
    for (i = 0; i < t->n; i++)
      if (t->at[i].send) acc += hir__load(t->at[i].send, dt, (int64_t)e);
    hir__store(dst, dt, (int64_t)at, acc);
  }
}

static hir_status hir__lw_collective(hir_comm *c, void *team, hir__lw_kind kind, const void *send, void *recv,
                                     size_t count, hir_dtype dt, int root, size_t bytes) {
  hir_local_world *w = ((hir__lw_rank *)c->ctx)->w;
  hir__lw_team *t = (hir__lw_team *)team;
  const char *what = hir__lw_names[kind];
  size_t es = hir_dtype_size(dt);
  int me = hir_team_index(t->devices, t->n, c->rank), r = root >= 0 ? hir_team_index(t->devices, t->n, root) : -1, i;
  int elements = kind == HIR__LW_ALLREDUCE || kind == HIR__LW_REDUCE_SCATTER || kind == HIR__LW_REDUCE;
  hir_status s;
  if (me < 0 || (root >= 0 && r < 0)) {
    snprintf(c->error, sizeof c->error, "local world: %s: rank %d or root %d is not in the team", what, c->rank, root);
    return HIR_ERR_INVALID;
  }
  pthread_mutex_lock(&w->mu);
  t->at[me].send = send;
  t->at[me].recv = recv;
  t->at[me].amount = elements ? count : bytes;
  t->at[me].dtype = dt;
  t->at[me].what = c->what;
  s = hir__lw_barrier(c, t, what, kind == HIR__LW_ALLREDUCE ? count * es : 0);
  pthread_mutex_unlock(&w->mu);
  if (s != HIR_OK) return s;
  for (i = 1; i < t->n; i++) /* every member sees the same disagreement, and all return it before moving data */
    if (t->at[i].amount != t->at[0].amount || (elements && t->at[i].dtype != t->at[0].dtype)) {
      char first[96], other[96];
      hir_comm_what_snprint(&t->at[0].what, first, sizeof first);
      hir_comm_what_snprint(&t->at[i].what, other, sizeof other);
      snprintf(c->error, sizeof c->error, "local world: %s over ranks that disagree: rank %d gives %s (%zu %s), rank %d "
               "%s (%zu %s); every member must pass the same shape", what, t->devices[0], first, t->at[0].amount,
               elements ? hir_dtype_name(t->at[0].dtype) : "bytes", t->devices[i], other, t->at[i].amount,
               elements ? hir_dtype_name(t->at[i].dtype) : "bytes");
      return HIR_ERR_SHAPE;
    }
  switch (kind) {
  case HIR__LW_ALLGATHER:
    for (i = 0; i < t->n; i++)
      if ((char *)recv + (size_t)i * bytes != t->at[i].send) memcpy((char *)recv + (size_t)i * bytes, t->at[i].send, bytes);
    break;
  case HIR__LW_ALLREDUCE: { /* my share of the elements into the scratch; all copy it after the barrier */
    size_t lo = count * (size_t)me / (size_t)t->n, hi = count * (size_t)(me + 1) / (size_t)t->n, e;
    if (t->scratch_cap < count * es) break;
    for (e = lo; e < hi; e++) hir__lw_sum(t, dt, e, t->scratch, e);
    break;
  }
  case HIR__LW_REDUCE_SCATTER: { /* reads then writes each of my elements: in place is safe */
    size_t e;
    for (e = 0; e < count; e++) hir__lw_sum(t, dt, (size_t)me * count + e, recv, e);
    break;
  }
  case HIR__LW_REDUCE:
    if (me == r) {
      size_t e;
      for (e = 0; e < count; e++) hir__lw_sum(t, dt, e, recv, e);
    }
    break;
  case HIR__LW_BROADCAST:
    if (recv && recv != t->at[r].send) memcpy(recv, t->at[r].send, bytes);
    break;
  case HIR__LW_GATHER:
    if (me == r) {
      size_t at = 0;
      for (i = 0; i < t->n; i++)
        if (t->at[i].send) {
          if ((char *)recv + at != t->at[i].send) memcpy((char *)recv + at, t->at[i].send, bytes);
          at += bytes;
        }
    }
    break;
  case HIR__LW_SCATTER:
    if ((const char *)t->at[r].send + (size_t)me * bytes != recv) memcpy(recv, (const char *)t->at[r].send + (size_t)me * bytes, bytes);
    break;
  }
  pthread_mutex_lock(&w->mu);
  s = hir__lw_barrier(c, t, what, 0);
  pthread_mutex_unlock(&w->mu);
  if (s == HIR_OK && kind == HIR__LW_ALLREDUCE) {
    if (t->scratch_cap < count * es) {
      snprintf(c->error, sizeof c->error, "local world: Allreduce: out of memory for a %zu-byte scratch", count * es);
      return HIR_ERR_NOMEM;
    }
    if (count) memcpy(recv, t->scratch, count * es); /* nobody writes the scratch before all arrive at the next op */
  }
  return s;
}

static hir_status hir__lw_allgather(hir_comm *c, void *t, const void *s, void *r, size_t bytes, void *st) {
  (void)st;
  return hir__lw_collective(c, t, HIR__LW_ALLGATHER, s, r, 0, HIR_F32, -1, bytes);
}
static hir_status hir__lw_allreduce(hir_comm *c, void *t, const void *s, void *r, size_t n, hir_dtype dt, void *st) {
  (void)st;
  return hir__lw_collective(c, t, HIR__LW_ALLREDUCE, s, r, n, dt, -1, 0);
}
static hir_status hir__lw_reduce_scatter(hir_comm *c, void *t, const void *s, void *r, size_t n, hir_dtype dt, void *st) {
  (void)st;
  return hir__lw_collective(c, t, HIR__LW_REDUCE_SCATTER, s, r, n, dt, -1, 0);
}
static hir_status hir__lw_reduce(hir_comm *c, void *t, const void *s, void *r, size_t n, hir_dtype dt, int root, void *st) {
  (void)st;
  return hir__lw_collective(c, t, HIR__LW_REDUCE, s, r, n, dt, root, 0);
}
static hir_status hir__lw_broadcast(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  (void)st;
  return hir__lw_collective(c, t, HIR__LW_BROADCAST, s, r, 0, HIR_F32, root, bytes);
}
static hir_status hir__lw_gather(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  (void)st;
  return hir__lw_collective(c, t, HIR__LW_GATHER, s, r, 0, HIR_F32, root, bytes);
}
static hir_status hir__lw_scatter(hir_comm *c, void *t, const void *s, void *r, size_t bytes, int root, void *st) {
  (void)st;
  return hir__lw_collective(c, t, HIR__LW_SCATTER, s, r, 0, HIR_F32, root, bytes);
}
/* hir_comm.allreduce_rms_norm on host memory: the all-reduce into h, then
   the add and the norm as the CPU backend's ops run them (the same
   rounding, so the numbers are those of the three apart). */
static hir_status hir__lw_allreduce_rms_norm(hir_comm *c, void *t, const void *send, const void *residual, const void *weight,
                                             void *h, void *out, size_t rows, size_t cols, hir_dtype dt, double eps, void *st) {
  hir_tensor hv, ov, wv;
  size_t i;
  hir_status s;
  if (dt != HIR_F32 && dt != HIR_F64 && dt != HIR_F16 && dt != HIR_BF16) return HIR_ERR_UNSUPPORTED;
  if ((s = hir__lw_allreduce(c, t, send, h, rows * cols, dt, st)) != HIR_OK) return s;
  for (i = 0; i < rows * cols; i++) hir__store(h, dt, (int64_t)i, hir__load(h, dt, (int64_t)i) + hir__load(residual, dt, (int64_t)i));
  memset(&hv, 0, sizeof hv);
  hv.dtype = dt, hv.ndims = 2, hv.sizes[0] = (int64_t)rows, hv.sizes[1] = (int64_t)cols, hv.data = h;
  hir__contiguous_strides(&hv);
  ov = hv, ov.data = out;
  wv = hv, wv.ndims = 1, wv.sizes[0] = (int64_t)cols, wv.data = (void *)(uintptr_t)weight;
  hir__contiguous_strides(&wv);
  hir__cpu_norm(&ov, &hv, weight ? &wv : NULL, NULL, 1, eps, 0);
  return HIR_OK;
}

/* Mailboxes (mu held): post a send; take the oldest post from src to dst. */
static int hir__lw_post_send(hir_local_world *w, hir__lw_post *post) {
  int box = post->src * w->n + post->dst;
  if (!hir__grow_heap((void **)&w->mail[box], &w->cap_mail[box], w->nmail[box] + 1, sizeof(hir__lw_post *))) return 0;
  w->mail[box][w->nmail[box]++] = post;
  pthread_cond_broadcast(&w->cv);
  return 1;
}

static hir_status hir__lw_take(hir_comm *c, const hir__lw_op *op, const struct timespec *deadline) {
  hir_local_world *w = ((hir__lw_rank *)c->ctx)->w;
  int src = op->peer, box = src * w->n + c->rank;
  hir__lw_post *post;
  while (!w->nmail[box]) {
    hir_status s = hir__lw_wait(c, deadline, "recv");
    if (s != HIR_OK && !w->nmail[box]) return s;
  }
  post = w->mail[box][0];
  memmove(w->mail[box], w->mail[box] + 1, (size_t)(--w->nmail[box]) * sizeof(hir__lw_post *));
  post->taken = 1;
  pthread_cond_broadcast(&w->cv);
  if (post->bytes != op->bytes) {
    char mine[96], theirs[96];
    hir_comm_what_snprint(&op->what, mine, sizeof mine);
    hir_comm_what_snprint(&post->what, theirs, sizeof theirs);
    snprintf(c->error, sizeof c->error, "local world: rank %d receives %s (%zu bytes) from rank %d, which sends %s (%zu "
             "bytes); the ranks must pass matching shapes", c->rank, mine, op->bytes, src, theirs, post->bytes);
    hir__lw_abort_locked(w, c->error);
    return HIR_ERR_SHAPE;
  }
  memcpy(op->buf, post->buf, op->bytes);
  return HIR_OK;
}

static hir_status hir__lw_wait_taken(hir_comm *c, hir__lw_post *post, const struct timespec *deadline) {
  while (!post->taken) {
    hir_status s = hir__lw_wait(c, deadline, "send");
    if (s != HIR_OK && !post->taken) return s;
  }
  return HIR_OK;
}

static hir_status hir__lw_check_peer(hir_comm *c, int peer) {
  hir_local_world *w = ((hir__lw_rank *)c->ctx)->w;
  if (peer >= 0 && peer < w->n) return HIR_OK;
  snprintf(c->error, sizeof c->error, "local world: peer %d is outside the world of %d ranks", peer, w->n);
  return HIR_ERR_INVALID;
}

/* In a group, ops are queued and run at group_end: all sends posted first,
   then the recvs, then the sends awaited, so exchanges never deadlock. */
static hir_status hir__lw_queue(hir_comm *c, int is_send, void *buf, size_t bytes, int peer) {
  hir__lw_rank *r = (hir__lw_rank *)c->ctx;
  hir_status s = hir__lw_check_peer(c, peer);
  if (s != HIR_OK) return s;
  if (r->nops == HIR__LW_GROUP_MAX) {
    snprintf(c->error, sizeof c->error, "local world: more than %d sends and recvs in one group", HIR__LW_GROUP_MAX);
    return HIR_ERR_UNSUPPORTED;
  }
  r->ops[r->nops].is_send = is_send;
  r->ops[r->nops].buf = buf;
  r->ops[r->nops].bytes = bytes;
  r->ops[r->nops].what = c->what;
  r->ops[r->nops++].peer = peer;
  return HIR_OK;
}

static hir_status hir__lw_group_start(hir_comm *c) {
  hir__lw_rank *r = (hir__lw_rank *)c->ctx;
  if (!r->grouping++) r->nops = 0;
  return HIR_OK;
}

static hir_status hir__lw_group_end(hir_comm *c) {
  hir__lw_rank *r = (hir__lw_rank *)c->ctx;
  hir_local_world *w = r->w;
  struct timespec deadline;
  hir_status s = HIR_OK;
  int i;
  if (r->grouping == 0) {
    snprintf(c->error, sizeof c->error, "local world: group_end without group_start");
    return HIR_ERR_INVALID;
  }
  if (--r->grouping) return HIR_OK;
  deadline = hir__deadline(w->timeout_ms);
  pthread_mutex_lock(&w->mu);
  for (i = 0; i < r->nops && s == HIR_OK; i++)
    if (r->ops[i].is_send) {
      hir__lw_post *post = &r->posts[i];
      post->buf = r->ops[i].buf;
      post->bytes = r->ops[i].bytes;
      post->src = c->rank;
      post->dst = r->ops[i].peer;
      post->taken = 0;
      post->what = r->ops[i].what;
      if (!hir__lw_post_send(w, post)) {
        snprintf(c->error, sizeof c->error, "local world: out of memory posting a send");
        s = HIR_ERR_NOMEM;
      }
    }
  for (i = 0; i < r->nops && s == HIR_OK; i++)
    if (!r->ops[i].is_send) s = hir__lw_take(c, &r->ops[i], &deadline);
  for (i = 0; i < r->nops && s == HIR_OK; i++)
    if (r->ops[i].is_send) s = hir__lw_wait_taken(c, &r->posts[i], &deadline);
  pthread_mutex_unlock(&w->mu);
  r->nops = 0;
  return s;
}

static hir_status hir__lw_send(hir_comm *c, const void *buf, size_t bytes, int peer, void *stream) {
  hir__lw_rank *r = (hir__lw_rank *)c->ctx;
  hir_status s;
  (void)stream;
  if (r->grouping) return hir__lw_queue(c, 1, (void *)buf, bytes, peer);
  if (peer == c->rank) {
    snprintf(c->error, sizeof c->error, "local world: rank %d sends to itself outside a group; it would wait forever", peer);
    return HIR_ERR_INVALID;
  }
  hir__lw_group_start(c);
  s = hir__lw_queue(c, 1, (void *)buf, bytes, peer);
  return s == HIR_OK ? hir__lw_group_end(c) : (r->grouping = 0, s);
}

static hir_status hir__lw_recv(hir_comm *c, void *buf, size_t bytes, int peer, void *stream) {
  hir__lw_rank *r = (hir__lw_rank *)c->ctx;
  hir_status s;
  (void)stream;
  if (r->grouping) return hir__lw_queue(c, 0, buf, bytes, peer);
  hir__lw_group_start(c);
  s = hir__lw_queue(c, 0, buf, bytes, peer);
  return s == HIR_OK ? hir__lw_group_end(c) : (r->grouping = 0, s);
}

static void hir__lw_abort(hir_comm *c) {
  hir_local_world *w = ((hir__lw_rank *)c->ctx)->w;
  char msg[sizeof w->abort_msg];
  if (c->error[0]) snprintf(msg, sizeof msg, "rank %d failed: %.370s", c->rank, c->error);
  else snprintf(msg, sizeof msg, "rank %d aborted", c->rank);
  pthread_mutex_lock(&w->mu);
  hir__lw_abort_locked(w, msg);
  pthread_mutex_unlock(&w->mu);
}

HIRDEF hir_local_world *hir_local_world_create(int nranks) {
  hir_local_world *w;
  int i;
  if (nranks < 1) return NULL;
  if (!(w = (hir_local_world *)HIR_MALLOC(sizeof(hir_local_world)))) return NULL;
  memset(w, 0, sizeof *w);
  w->n = nranks;
  w->timeout_ms = 60000;
  w->comms = (hir_comm *)HIR_MALLOC((size_t)nranks * sizeof(hir_comm));
  w->ranks = (hir__lw_rank *)HIR_MALLOC((size_t)nranks * sizeof(hir__lw_rank));
  w->mail = (hir__lw_post ***)HIR_MALLOC((size_t)nranks * (size_t)nranks * sizeof(hir__lw_post **));
  w->nmail = (int *)HIR_MALLOC((size_t)nranks * (size_t)nranks * sizeof(int));
  w->cap_mail = (int *)HIR_MALLOC((size_t)nranks * (size_t)nranks * sizeof(int));
  if (!w->comms || !w->ranks || !w->mail || !w->nmail || !w->cap_mail) {
    HIR_FREE(w->comms);
    HIR_FREE(w->ranks);
    HIR_FREE(w->mail);
    HIR_FREE(w->nmail);
    HIR_FREE(w->cap_mail);
    HIR_FREE(w);
    return NULL;
  }
  memset(w->comms, 0, (size_t)nranks * sizeof(hir_comm));
  memset(w->ranks, 0, (size_t)nranks * sizeof(hir__lw_rank));
  memset(w->mail, 0, (size_t)nranks * (size_t)nranks * sizeof(hir__lw_post **));
  memset(w->nmail, 0, (size_t)nranks * (size_t)nranks * sizeof(int));
  memset(w->cap_mail, 0, (size_t)nranks * (size_t)nranks * sizeof(int));
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  for (i = 0; i < nranks; i++) {
    hir_comm *c = &w->comms[i];
    w->ranks[i].w = w;
    c->ctx = &w->ranks[i];
    c->rank = i;
    c->size = nranks;
    c->what.tensor = -1; /* until an evaluator says */
    c->team = hir__lw_make_team;
    c->allgather = hir__lw_allgather;
    c->allreduce = hir__lw_allreduce;
    c->allreduce_rms_norm = hir__lw_allreduce_rms_norm;
    c->reduce_scatter = hir__lw_reduce_scatter;
    c->reduce = hir__lw_reduce;
    c->broadcast = hir__lw_broadcast;
    c->gather = hir__lw_gather;
    c->scatter = hir__lw_scatter;
    c->send = hir__lw_send;
    c->recv = hir__lw_recv;
    c->group_start = hir__lw_group_start;
    c->group_end = hir__lw_group_end;
    c->abort = hir__lw_abort;
  }
  return w;
}

HIRDEF void hir_local_world_set_timeout(hir_local_world *w, int milliseconds) {
  if (w && milliseconds > 0) w->timeout_ms = milliseconds;
}

HIRDEF hir_comm *hir_local_comm(hir_local_world *w, int rank) {
  return (w && rank >= 0 && rank < w->n) ? &w->comms[rank] : NULL;
}

HIRDEF void hir_local_world_free(hir_local_world *w) {
  int i;
  if (!w) return;
  while (w->teams) {
    hir__lw_team *t = w->teams;
    w->teams = t->next;
    HIR_FREE(t->devices);
    HIR_FREE(t->at);
    HIR_FREE(t->scratch);
    HIR_FREE(t);
  }
  for (i = 0; i < w->n * w->n; i++) HIR_FREE(w->mail[i]);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  HIR_FREE(w->comms);
  HIR_FREE(w->ranks);
  HIR_FREE(w->mail);
  HIR_FREE(w->nmail);
  HIR_FREE(w->cap_mail);
  HIR_FREE(w);
}

/* A rank waits at the gate until every rank's thread exists: where one
   could not be made, none runs (rather than waiting out the world's
   timeout for a peer that never came). */
typedef struct hir__spmd_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;                     /* 0: shut; 1: every rank started, run; -1: one could not start, return */
} hir__spmd_gate;

typedef struct hir__spmd_arg {
  int rank;
  hir_status (*fn)(int rank, void *user);
  void *user;
  hir__spmd_gate *gate;
  hir_status status;
} hir__spmd_arg;

static void *hir__spmd_main(void *p) {
  hir__spmd_arg *a = (hir__spmd_arg *)p;
  int open;
  pthread_mutex_lock(&a->gate->mu);
  while (!a->gate->open) pthread_cond_wait(&a->gate->cv, &a->gate->mu);
  open = a->gate->open;
  pthread_mutex_unlock(&a->gate->mu);
  a->status = open > 0 ? a->fn(a->rank, a->user) : HIR_ERR_BACKEND;
  return NULL;
}

HIRDEF hir_status hir_spmd(int nranks, hir_status (*fn)(int rank, void *user), void *user) {
  hir__spmd_arg *args;
  pthread_t *threads;
  hir__spmd_gate gate;
  hir_status result = HIR_OK;
  int i, started = 0;
  if (nranks < 1 || !fn) return HIR_ERR_INVALID;
  args = (hir__spmd_arg *)HIR_MALLOC((size_t)nranks * sizeof(hir__spmd_arg));
  threads = (pthread_t *)HIR_MALLOC((size_t)nranks * sizeof(pthread_t));
  if (!args || !threads) {
    HIR_FREE(args);
    HIR_FREE(threads);
    return HIR_ERR_NOMEM;
  }
  pthread_mutex_init(&gate.mu, NULL);
  pthread_cond_init(&gate.cv, NULL);
  gate.open = 0;
  for (i = 0; i < nranks; i++) {
    args[i].rank = i;
    args[i].fn = fn;
    args[i].user = user;
    args[i].gate = &gate;
    args[i].status = HIR_ERR_INTERNAL;
    if (HIR_THREAD_CREATE(&threads[i], hir__spmd_main, &args[i]) != 0) break;
    started++;
  }
  pthread_mutex_lock(&gate.mu);
  gate.open = started == nranks ? 1 : -1;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
  for (i = 0; i < started; i++) pthread_join(threads[i], NULL);
  pthread_cond_destroy(&gate.cv);
  pthread_mutex_destroy(&gate.mu);
  for (i = 0; i < nranks && result == HIR_OK; i++) result = i < started ? args[i].status : HIR_ERR_BACKEND;
  for (i = 0; i < started && (result == HIR_ERR_COMM || result == HIR_ERR_TIMEOUT); i++) /* the cause, where a rank knows it */
    if (args[i].status != HIR_OK && args[i].status != HIR_ERR_COMM && args[i].status != HIR_ERR_TIMEOUT) result = args[i].status;
  HIR_FREE(args);
  HIR_FREE(threads);
  return result;
}

// >>eval_plan

typedef struct hir__block {
  void *ptr;
  size_t bytes;
  int in_use;
} hir__block;

typedef struct hir__shape {  /* a tensor's local shape on this rank (axes holding data) */
  int nd, known;
  int64_t sizes[HIR_MAX_DIMS];
} hir__shape;

typedef struct hir__span {   /* one executed host IR node: host clock, microseconds */
  const hir_expr *e;
  int track;                    /* 0: the caller's stream; k + 1: pool stream k */
  double t0, t1;
  void *start, *end;            /* GPU spans: timing events around the node's work */
} hir__span;

/* Where a team's ranks meet (hir__meet), kept from one meeting to the next:
   backend memory for the collective and, where the backend has it, pinned
   host memory the copies to and from it go through. */
typedef struct hir__meeting {
  void *dev, *host;
  size_t cap;
} hir__meeting;

enum { HIR__SHAPE_WORDS = 2 + HIR_MAX_DIMS }; /* an input in a row of shapes: kind, ndims, sizes (hir__shape_words) */
struct hir_evaluator {
  const hir_program *p;
  hir_backend *b;
  int owns_backend;
  hir_comm *comm;
  int device, nstreams, ntv, nval, nexpr, nvars;
  void **pool, **pool_ev;       /* the stream pool and an event per stream */
  void **vars, **vars_ev;       /* stream variables ("Stream 0") and their events */
  void *current;
  void **team, **done;          /* by expr name: team handle; event recorded after it */
  struct hir__staging *staging; /* by (expr name, stream track, in/out): contiguous copies of strided collective buffers */
  const hir_expr **epilogue;    /* by expr name: a linear's next op, done in its epilogue (hir__find_epilogues); and back */
  struct hir__fused_run *fused; /* by expr name: the run of a composite starting there, done in one call (hir__find_fused) */
  hir__env env;
  hir_tensor *slot;             /* by tensor name */
  int *slot_block;
  struct hir__into *into; /* by tensor name: the permute that is its only reader, where the tensor may lie in its output */
  unsigned char *bound;
  hir__shape *shape;
  hir__block *blocks;
  int nblocks, cap_blocks;
  int64_t *key;                 /* the input shapes the plan was made for */
  int key_n, planned, started_comm;
  hir_status status;
  int broken, timeout_ms;
  int communicates, told_world;  /* the program talks to other ranks; this rank aborted the world with its error */
  int comm_ops;                  /* it has communication ops (with a one-member team they talk to no one) */
  int *devices, ndevices;       /* the fusion's devices (lowered programs): who compares new shapes together */
  int64_t *shape_rows;          /* this rank's row of shapes, then every device's (hir__shapes_agree) */
  size_t shape_words;           /* a row's */
  void *devices_team;
  hir__meeting meeting;
  int shapes_unchecked;         /* planned for shapes the ranks have not compared yet */
  int check_shapes;             /* hir_eval_desc.check_shapes: compared on every run */
  int shared_error;             /* every rank found this run's error itself: the world needs no telling */
  struct hir__span *spans;      /* the timeline, when recording */
  int nspans, recording, current_track;
  struct hir__span *gpu_spans;  /* when the backend keeps time: when each stream ran the work */
  int ngpu_spans, in_group;
  void *epoch;                  /* a timing event passed at host time epoch_us */
  double epoch_us;
  int graph, warm;              /* hir_eval_desc.graph; the current plan has run eagerly (its buffers exist) */
  unsigned char *warm_dense;    /* which arguments were dense in that run (a strided one takes a buffer to copy through) */
  hir_tensor *boundary;         /* the user's tensors seen with their split axes (hir_split), inputs then outputs; made at create */
  void **retired;               /* buffers outgrown in a run, released once the streams are idle (hir__retire) */
  int nretired, cap_retired;
  const void **reached;         /* inputs then outputs: the last address the backend said it reaches (hir_backend.reachable) */
  struct hir__graph *graphs;    /* captured runs of the current plan, by their tensors' addresses */
  int ngraphs;
  struct hir__range *touched;   /* while capturing: the bytes the run's ops have touched so far (hir__touch) */
  int ntouched, cap_touched, capturing;
  int staged, nstage;           /* hir_eval_desc.graph is HIR_GRAPH_STAGED; the staged arguments (inputs, then outputs), and a run's copy */
  hir_tensor *stage, *stage_run;
  unsigned long long graph_uses;
  char error[512];
};

enum { HIR__GRAPHS = 8 };
typedef struct hir__range {
  uintptr_t lo, hi;
} hir__range;
typedef struct hir__staging {   /* a collective's strided buffer moves through this one */
  void *data;
  size_t bytes;
} hir__staging;

typedef struct hir__graph {
  hir_tensor *args;             /* the inputs and outputs as passed: a graph replays at their addresses and strides */
  unsigned long long *allocs;   /* and in their allocations, where the communicator says (hir_comm.allocation_of) */
  void *exec;                   /* the backend's graph */
  hir_tensor *outs;             /* the outputs it fills (the evaluator's buffers, or those passed) */
  void *start_signals;          /* its receives posted at its start (hir_comm.recv_at_start), raised before each launch */
  unsigned long long used;
} hir__graph;

static int hir__ev_fail(hir_evaluator *ev, hir_status s, const char *fmt, ...) HIR__PRINTF(3, 4);
static int hir__ev_fail(hir_evaluator *ev, hir_status s, const char *fmt, ...) {
  va_list ap;
  if (ev->status != HIR_OK) return 0; /* keep the first */
  ev->status = s;
  va_start(ap, fmt);
  vsnprintf(ev->error, sizeof ev->error, fmt, ap);
  va_end(ap);
  return 0;
}

static int hir__ev_backend(hir_evaluator *ev, hir_status s, const hir_expr *e) {
  if (s == HIR_OK) return 1;
  return hir__ev_fail(ev, s, "hir_run: %s %d failed on the %s backend: %s", hir__ops[e->kind].name, e->name,
                      ev->b->name, ev->b->error);
}

static int hir__ev_comm(hir_evaluator *ev, hir_status s, const hir_expr *e) {
  if (s == HIR_OK) return 1;
  ev->broken = 1;
  return hir__ev_fail(ev, s, "hir_run: %s %d failed: %s", hir__ops[e->kind].name, e->name, ev->comm->error);
}

/* This rank failed, and the others would wait for it in their next
   communication, or in comparing shapes (hir__shapes_agree), where its
   program has none: the communicator aborts the world with this rank's
   message (unless the failure came from it), so that they return at once,
   naming it. The evaluator is done with the world. */
static hir_status hir__tell_world(hir_evaluator *ev) {
  if (ev->status == HIR_OK || !ev->comm || !(ev->communicates || ev->devices_team) || ev->told_world) return ev->status;
  if (!ev->broken) snprintf(ev->comm->error, sizeof ev->comm->error, "%s", ev->error);
  ev->comm->abort(ev->comm);
  ev->broken = ev->told_world = 1;
  return ev->status;
}

/* Whether a scope has communication ops (peers 0), or talks to other ranks
   (peers 1): a collective of a one-member team (a Broadcast from device 0 to
   device 0) talks to none, so a graph of it is this rank's alone,
   recaptured when its buffers move. */
static int hir__communicates(const hir_scope *s, int peers) {
  int i;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    int teamed = (hir__ops[e->kind].flags & HIR__OP_TEAM) != 0;
    int talks = (hir__ops[e->kind].flags & HIR__OP_COMM) && (!peers || !teamed || e->team_size > 1);
    if (talks || hir__communicates(&e->body, peers) || hir__communicates(&e->orelse, peers)) return 1;
  }
  return 0;
}

static int hir__local_size(const hir_evaluator *ev, const hir_tv *tv, const hir_id *id, int64_t *size) {
  if (hir__shards(tv, id->ptype) > 1 || id->iter == HIR_BROADCAST) {
    *size = 1;
    return 1;
  }
  if (hir__unbound(&ev->env, id->extent)) return 0;
  *size = hir__eval_val(&ev->env, id->extent);
  return 1;
}

static void hir__compute_shape(hir_evaluator *ev, const hir_tv *tv) {
  hir__shape *sh = &ev->shape[tv->name];
  int i;
  sh->nd = 0;
  sh->known = 1;
  for (i = 0; i < tv->ndims; i++) {
    if (tv->ids[i]->iter == HIR_REDUCTION) continue;
    if (!hir__local_size(ev, tv, tv->ids[i], &sh->sizes[sh->nd])) sh->known = 0;
    sh->nd++;
  }
}

/* The program input and axis a size comes from, or 0. */
static int hir__size_source(const hir_fusion *f, const hir_val *size, int *input, int *axis) {
  for (*input = 0; *input < f->inputs.n; (*input)++) {
    const hir_tv *in = (const hir_tv *)f->inputs.items[*input];
    for (*axis = 0; *axis < in->ndims; (*axis)++)
      if (in->ids[*axis]->extent == size) return 1;
  }
  return 0;
}

/* " (input i, Tn, axis a)" where the size of tv's data axis k comes from a
   program input, else "": messages in the caller's terms. */
static void hir__size_from(const hir_evaluator *ev, const hir_tv *tv, int k, char *buf, size_t cap) {
  int i, input, axis;
  buf[0] = '\0';
  for (i = 0; i < tv->ndims; i++) {
    if (tv->ids[i]->iter == HIR_REDUCTION || k--) continue;
    if (hir__size_source(&ev->p->ir, tv->ids[i]->extent, &input, &axis))
      snprintf(buf, cap, " (input %d, T%d, axis %d)", input, ((const hir_tv *)ev->p->ir.inputs.items[input])->name, axis);
    return;
  }
}

/* Names the input whose sizes this rank lacks. */
static int hir__unknown_shape(hir_evaluator *ev, const hir_tv *tv) {
  const hir_fusion *f = &ev->p->ir;
  const hir_val *u = NULL;
  int i, a;
  for (i = 0; i < tv->ndims && !u; i++)
    if (tv->ids[i]->iter != HIR_REDUCTION) u = hir__unbound(&ev->env, tv->ids[i]->extent);
  if (u && hir__size_source(f, u, &i, &a))
    return hir__ev_fail(ev, HIR_ERR_SHAPE,
                        "hir_run: this rank needs the sizes of T%d, which come from input %d (T%d) axis %d (i%d); "
                        "that input lives elsewhere and was passed empty: pass it shape-only (data NULL, ndims "
                        "and sizes set)",
                        tv->name, i, ((const hir_tv *)f->inputs.items[i])->name, a, u->name);
  return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: the sizes of T%d are unknown on this rank", tv->name);
}

static const hir__shape *hir__need_shape(hir_evaluator *ev, const hir_tv *tv) {
  const hir__shape *sh = &ev->shape[tv->name];
  if (!sh->known) {
    hir__unknown_shape(ev, tv);
    return NULL;
  }
  return sh;
}

static int hir__shapes_equal(const hir__shape *a, const hir__shape *b) {
  return a->nd == b->nd && memcmp(a->sizes, b->sizes, (size_t)a->nd * sizeof(int64_t)) == 0;
}

static void hir__shape_str(const hir__shape *sh, char *buf, size_t cap) {
  hir__writer w = hir__buffer_writer(buf, cap);
  hir__emit_sizes(&w, sh->nd, sh->sizes);
}

static int hir__shape_mismatch(hir_evaluator *ev, const hir_expr *e, const hir_tv *x, const hir__shape *sx,
                               const hir_tv *y, const hir__shape *sy, const char *why) {
  char a[160], b[160];
  hir__shape_str(sx, a, sizeof a);
  hir__shape_str(sy, b, sizeof b);
  return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: %s %d (T%d): T%d is %s and T%d is %s; %.300s", hir__ops[e->kind].name,
                      e->name, e->nout ? e->out[0]->name : x->name, x->name, a, y->name, b, why);
}

static int64_t hir__shape_numel(const hir__shape *sh) { return hir__numel(sh->nd, sh->sizes); }

/* HirAliasSelect drops `axis` of its source; HirAliasSlice (parts > 0) cuts
   it into equal parts. */
static int hir__check_view(hir_evaluator *ev, const hir_expr *e) {
  const hir__shape *a, *o;
  hir__shape want;
  int i, k = hir__data_index(e->in[0], e->axis);
  if (!(a = hir__need_shape(ev, e->in[0])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
  if (e->in[0]->ids[e->axis]->iter == HIR_REDUCTION)
    return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: %s %d selects a reduction axis of T%d", hir__ops[e->kind].name,
                        e->name, e->in[0]->name);
  want = *a;
  if (!e->parts) {
    for (i = k; i + 1 < a->nd; i++) want.sizes[i] = a->sizes[i + 1];
    want.nd--;
  } else if (a->sizes[k] % e->parts) {
    int input, axis;
    char from[96] = "";
    if (hir__size_source(&ev->p->ir, e->id->extent, &input, &axis))
      snprintf(from, sizeof from, ", the size of input %d (T%d) axis %d,", input,
               ((const hir_tv *)ev->p->ir.inputs.items[input])->name, axis);
    return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: HirAliasSlice %d: T%d axis %d has size %lld%s which does not cut "
                        "into %d equal parts; give it a size that %d divides, or cut it into fewer parts "
                        "(stream.parts or experimental.column_parts)",
                        e->name, e->in[0]->name, e->axis, (long long)a->sizes[k], from, e->parts, e->parts);
  } else {
    want.sizes[k] /= e->parts;
  }
  if (hir__shapes_equal(&want, o)) return 1;
  return hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o,
                             e->parts ? "the view cuts one axis of its source" : "the view drops one axis of its source");
}

/* select: the index inside the axis; slice: the range inside it; reshape:
   the same number of elements (an inferred size that does not divide shows
   here), kept axes the same. */
/* A SliceOp's [from, to) on an axis of `size`; 0 where it is empty or
   leaves the axis. */
static int hir__slice_range(const hir_expr *e, int64_t size, int64_t *from, int64_t *to) {
  *from = e->params[0] < 0 ? size + e->params[0] : e->params[0];
  *to = e->params[1] == HIR_END ? size : e->params[1] < 0 ? size + e->params[1] : e->params[1];
  return *from >= 0 && *from < *to && *to <= size;
}

static int hir__check_view_op(hir_evaluator *ev, const hir_expr *e) {
  const hir__shape *a, *o;
  hir__shape want;
  int64_t from = 0, to = 0;
  int i;
  if (!(a = hir__need_shape(ev, e->in[0])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
  want = *a;
  if (e->kind == HIR_EXPR_RESHAPE) {
    int ok = hir__shape_numel(a) == hir__shape_numel(o);
    for (i = 0; ok && i < o->nd; i++) ok = e->params[i] != 0 || o->sizes[i] == a->sizes[i];
    return ok ? 1 : hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "a reshape keeps the number of elements (does the inferred size divide?)");
  }
  if (e->kind == HIR_EXPR_SELECT ? e->params[0] >= a->sizes[e->axis] : !hir__slice_range(e, a->sizes[e->axis], &from, &to)) {
    char what[96];
    if (e->kind == HIR_EXPR_SELECT) snprintf(what, sizeof what, "index %lld", (long long)e->params[0]);
    else if (e->params[1] == HIR_END) snprintf(what, sizeof what, "the range %lld: (step %lld)", (long long)e->params[0], (long long)e->params[2]);
    else snprintf(what, sizeof what, "the range %lld:%lld (step %lld)", (long long)e->params[0], (long long)e->params[1], (long long)e->params[2]);
    return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: %s %d: %s is outside T%d's axis %d of size %lld", hir__ops[e->kind].name,
                        e->name, what, e->in[0]->name, e->axis, (long long)a->sizes[e->axis]);
  }
  if (e->kind == HIR_EXPR_SELECT) {
    for (i = e->axis; i + 1 < a->nd; i++) want.sizes[i] = a->sizes[i + 1];
    want.nd--;
  } else {
    want.sizes[e->axis] = (to - from + e->params[2] - 1) / e->params[2];
  }
  return hir__shapes_equal(&want, o) ? 1 : hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "the output is the input's selected part");
}

static int hir__check_binary(hir_evaluator *ev, const hir_expr *e) {
  const hir__shape *a, *b, *o;
  int i;
  if (!(a = hir__need_shape(ev, e->in[0])) || !(b = hir__need_shape(ev, e->in[1])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
  if (a->nd != o->nd || b->nd != o->nd) return hir__shape_mismatch(ev, e, e->in[0], a, e->in[1], b, "operands need the output's number of axes");
  for (i = 0; i < o->nd; i++)
    if ((a->sizes[i] != o->sizes[i] && a->sizes[i] != 1) || (b->sizes[i] != o->sizes[i] && b->sizes[i] != 1) ||
        (a->sizes[i] != o->sizes[i] && b->sizes[i] != o->sizes[i])) {
      char why[96];
      snprintf(why, sizeof why, "axis %d differs and neither side is size 1 (output size %lld)", i, (long long)o->sizes[i]);
      return hir__shape_mismatch(ev, e, e->in[0], a, e->in[1], b, why);
    }
  return 1;
}

static int hir__check_reduction(hir_evaluator *ev, const hir_expr *e) {
  const hir__shape *a, *o;
  int map[HIR_MAX_DIMS], i, j, k;
  if (!(a = hir__need_shape(ev, e->in[0])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
  hir__axis_map(e, 0, map);
  for (i = 0, j = 0, k = 0; i < e->in[0]->ndims; i++) {
    if (e->in[0]->ids[i]->iter == HIR_REDUCTION) continue;
    if (e->out[0]->ids[map[i]]->iter != HIR_REDUCTION && (j >= o->nd || o->sizes[j++] != a->sizes[k]))
      return hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "a reduction keeps the unreduced axes");
    k++;
  }
  return 1;
}

static int hir__check_broadcast(hir_evaluator *ev, const hir_expr *e) {
  const hir__shape *a, *o;
  int i, k;
  if (!(a = hir__need_shape(ev, e->in[0])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
  for (i = 0, k = 0; i < o->nd; i++)
    if (!((e->flags >> i) & 1u) && (k >= a->nd || a->sizes[k++] != o->sizes[i]))
      return hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "a broadcast only adds size-1 axes");
  return 1;
}

static int hir__check_matmul(hir_evaluator *ev, const hir_expr *e) {
  const hir__shape *a, *b, *o, *c = NULL;
  int i, has_m, has_n, nbatch_a, nbatch_b, nbatch, bk, bn; /* bk, bn: B's K and N axes (bn < 0: none) */
  if (!(a = hir__need_shape(ev, e->in[0])) || !(b = hir__need_shape(ev, e->in[1])) || !(o = hir__need_shape(ev, e->out[0])) ||
      (e->nin > 2 && !(c = hir__need_shape(ev, e->in[2]))) || (e->nin > 3 && !hir__need_shape(ev, e->in[3])))
    return 0;
  if (a->nd < 1 || b->nd < 1)
    return hir__shape_mismatch(ev, e, e->in[0], a, e->in[1], b, "a matmul operand needs at least one axis");
  hir__matmul_roles(e, a->nd, b->nd, &has_m, &has_n);
  nbatch_a = a->nd - 1 - has_m;
  nbatch_b = b->nd - 1 - has_n;
  nbatch = o->nd - has_m - has_n;
  bk = (e->flags & HIR__MATMUL_LINEAR) ? b->nd - 1 : nbatch_b;
  bn = !has_n ? -1 : (e->flags & HIR__MATMUL_LINEAR) ? b->nd - 2 : b->nd - 1;
  if (nbatch < nbatch_a || nbatch < nbatch_b)
    return hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "the output has fewer axes than [batch..., M, N]");
  if (a->sizes[a->nd - 1] != b->sizes[bk]) {
    char why[256], from_a[64], from_b[64];
    hir__size_from(ev, e->in[0], a->nd - 1, from_a, sizeof from_a);
    hir__size_from(ev, e->in[1], bk, from_b, sizeof from_b);
    snprintf(why, sizeof why, "the contracted sizes differ (%lld%s vs %lld%s); give them one size",
             (long long)a->sizes[a->nd - 1], from_a, (long long)b->sizes[bk], from_b);
    return hir__shape_mismatch(ev, e, e->in[0], a, e->in[1], b, why);
  }
  if (e->flags & HIR__MATMUL_SCALED) { /* the scales: one value, or a's (the weight's) shape without K */
    const hir__shape *sw = hir__need_shape(ev, e->in[3]);
    int ok = hir__scale_is_scalar(e->in[2]) || (c->nd == a->nd - 1 && !memcmp(c->sizes, a->sizes, (size_t)c->nd * sizeof(int64_t)));
    if (!ok) return hir__shape_mismatch(ev, e, e->in[0], a, e->in[2], c, "a_scale holds one value or a's shape without K");
    ok = hir__scale_is_scalar(e->in[3]) || (sw->nd == b->nd - 1 && !memcmp(sw->sizes, b->sizes, (size_t)sw->nd * sizeof(int64_t)));
    if (!ok) return hir__shape_mismatch(ev, e, e->in[1], b, e->in[3], sw, "w_scale holds one value or the weight's shape without K");
    c = NULL;
  }
  if (c) { /* the bias: B's shape without K */
    int ok = c->nd == b->nd - 1;
    for (i = 0; ok && i < c->nd; i++) ok = c->sizes[i] == b->sizes[i < bk ? i : i + 1];
    if (!ok) return hir__shape_mismatch(ev, e, e->in[1], b, e->in[2], c, "the bias is the weight's shape without K");
  }
  for (i = 0; i < nbatch; i++) {
    int ia = i - (nbatch - nbatch_a), ib = i - (nbatch - nbatch_b);
    int64_t sa = ia >= 0 ? a->sizes[ia] : 1, sb = ib >= 0 ? b->sizes[ib] : 1;
    if ((sa != o->sizes[i] && sa != 1) || (sb != o->sizes[i] && sb != 1))
      return hir__shape_mismatch(ev, e, e->in[0], a, e->in[1], b, "batch axes differ and neither is size 1");
  }
  if ((has_m && o->sizes[nbatch] != a->sizes[a->nd - 2]) || (has_n && o->sizes[nbatch + has_m] != b->sizes[bn]))
    return hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "the output is [..., M, N]");
  return 1;
}

/* The element counts of a collective's input and output on this rank fit its
   type over its team. */
static int hir__check_communication(hir_evaluator *ev, const hir_expr *e) {
  int in_here = e->nin && hir__in_mesh(e->in[0], ev->device), out_here = e->nout && hir__in_mesh(e->out[0], ev->device);
  int64_t ni, no, n = e->team_size, senders = n;
  if (!ev->team[e->name]) return 1;
  if ((in_here && !hir__need_shape(ev, e->in[0])) || (out_here && !hir__need_shape(ev, e->out[0]))) return 0;
  if (!in_here || !out_here) return 1;
  ni = hir__shape_numel(&ev->shape[e->in[0]->name]);
  no = hir__shape_numel(&ev->shape[e->out[0]->name]);
  if ((e->sub == HIR_COLL_GATHER || e->sub == HIR_COLL_REDUCE) && !hir__in_mesh(e->in[0], e->root)) senders--;
  if ((e->sub == HIR_COLL_ALLGATHER && no != n * ni) || (e->sub == HIR_COLL_GATHER && no != senders * ni) ||
      ((e->sub == HIR_COLL_REDUCESCATTER || e->sub == HIR_COLL_SCATTER) && ni != n * no) ||
      ((e->sub == HIR_COLL_ALLREDUCE || e->sub == HIR_COLL_REDUCE || e->sub == HIR_COLL_BROADCAST ||
        e->sub == HIR_COLL_SENDRECV || e->sub == HIR_COLL_ALLTOALL) && ni != no))
    return hir__shape_mismatch(ev, e, e->in[0], &ev->shape[e->in[0]->name], e->out[0], &ev->shape[e->out[0]->name],
                               "their element counts do not fit the collective over its team (a DIDx axis must have the mesh size as extent)");
  return 1;
}

/* An MoE op's operands: the backend's row moves; dispatch's topk_idx and
   topk_weights one per row of x ([T, 1]); combine's src_idx one per row of
   x, its counts one per team member. Leading device axes hold one element. */
static int hir__check_moe(hir_evaluator *ev, const hir_expr *e) {
  const hir__shape *sh[4] = {NULL, NULL, NULL, NULL};
  int k, combine = e->kind == HIR_EXPR_MOE_COMBINE;
  if (hir_team_index(e->team, e->team_size, ev->device) < 0) return 1;
  if (!ev->b->scatter_rows || !ev->b->moe_index)
    return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: %s %d: the %s backend has no MoE row moves (its scatter_rows or "
                        "moe_index is NULL)", hir__ops[e->kind].name, e->name, ev->b->name);
  for (k = 0; k < e->nin; k++)
    if (!(sh[k] = hir__need_shape(ev, e->in[k]))) return 0;
  if (sh[0]->nd < 2) return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: %s %d: x T%d has fewer than 2 axes", hir__ops[e->kind].name,
                                        e->name, e->in[0]->name);
  for (k = 0; k < e->nin; k++) { /* sizes from the last: leading axes (devices) hold one element */
    const hir__shape *t = sh[k];
    int rank = combine && k ? 1 : 2, i, bad = t->nd < rank;
    const int64_t *x = sh[0]->sizes + sh[0]->nd - 2, *z = t->sizes + t->nd - rank;
    for (i = 0; i < t->nd - rank; i++) bad |= t->sizes[i] != 1;
    if (!combine) bad |= k > 0 && (z[0] != x[0] || z[1] != 1);
    else bad |= k == 1 ? z[0] != x[0] : k > 1 ? z[0] != e->team_size : 0;
    if (bad)
      return hir__shape_mismatch(ev, e, e->in[0], sh[0], e->in[k], t, combine ? "src_idx takes one row of x each, the counts one "
                                 "element per team member" : "topk_idx and topk_weights are [T, 1] for x [T, H] (top-1)");
  }
  if (combine && sh[0]->sizes[sh[0]->nd - 2] != (int64_t)e->team_size * hir__eval_val(&ev->env, e->val))
    return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: MoeCombine %d: x T%d has %lld rows; dispatch's rows are num_tokens (%lld) "
                        "times the team's %d members", e->name, e->in[0]->name, (long long)sh[0]->sizes[sh[0]->nd - 2],
                        (long long)hir__eval_val(&ev->env, e->val), e->team_size);
  return 1;
}

/* Plan-time check of one expr's local shapes on this rank. */
static int hir__check_expr(hir_evaluator *ev, const hir_expr *e) {
  const hir__shape *a, *o;
  int i;
  switch (e->kind) {
  case HIR_EXPR_ALLOCATE:
    return !hir__in_mesh(e->in[0], ev->device) || hir__need_shape(ev, e->in[0]) != NULL;
  case HIR_EXPR_FOR_LOOP:
    if (hir__unbound(&ev->env, e->id->extent)) return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: the extent of ForLoop %d is unknown on this rank", e->name);
    hir__bind_index(&ev->env, e->val, 0); /* bound at each iteration: for its body's checks (a scalar of it), the first */
    return 1;
  case HIR_EXPR_ALIAS_SELECT:
  case HIR_EXPR_ALIAS_SLICE: return hir__check_view(ev, e);
  case HIR_EXPR_LOAD_STORE:
    if (!(a = hir__need_shape(ev, e->in[0])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
    if (e->flags & HIR__SET_PERMUTE) {
      int ok = a->nd == o->nd;
      for (i = 0; ok && i < o->nd; i++) ok = e->perm[i] < a->nd && o->sizes[i] == a->sizes[e->perm[i]];
      return ok ? 1 : hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "a permute reorders the axes");
    }
    return hir__shapes_equal(a, o) ? 1 : hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "a set copies one shape");
  case HIR_EXPR_BINARY: return hir__check_binary(ev, e);
  case HIR_EXPR_UNARY:
    if (!ev->b->unary)
      return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: UnaryOp %d (T%d): the %s backend has no unary ops (its `unary` "
                          "is NULL)", e->name, e->out[0]->name, ev->b->name);
    if (e->val && hir__unbound(&ev->env, e->val))
      return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: the scalar of UnaryOp %d is unknown on this rank", e->name);
    if (!(a = hir__need_shape(ev, e->in[0])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
    return hir__shapes_equal(a, o) ? 1 : hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "an elementwise op keeps the shape");
  case HIR_EXPR_RNG:
    if (!ev->b->rand)
      return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: RNGOp %d (T%d): the %s backend has no random numbers (its "
                          "`rand` is NULL)", e->name, e->out[0]->name, ev->b->name);
    if (e->val && hir__unbound(&ev->env, e->val))
      return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: the seed of RNGOp %d is unknown on this rank", e->name);
    if (!(a = hir__need_shape(ev, e->in[0])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
    return hir__shapes_equal(a, o) ? 1 : hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "random numbers take their "
                                                             "tensor's shape");
  case HIR_EXPR_REDUCTION: return hir__check_reduction(ev, e);
  case HIR_EXPR_MAX:
    if (!ev->b->max)
      return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: MaxOp %d (T%d): the %s backend has no max (its `max` is NULL)",
                          e->name, e->out[0]->name, ev->b->name);
    return hir__check_reduction(ev, e);
  case HIR_EXPR_BROADCAST: return hir__check_broadcast(ev, e);
  case HIR_EXPR_MATMUL: return hir__check_matmul(ev, e);
  case HIR_EXPR_SELECT:
  case HIR_EXPR_SLICE:
  case HIR_EXPR_RESHAPE: return hir__check_view_op(ev, e);
  case HIR_EXPR_COMMUNICATION: return hir__check_communication(ev, e);
  case HIR_EXPR_COLLECTIVE_PERMUTE: {
    const hir__shape *a, *o;
    if (hir_team_index(e->team, e->team_size, ev->device) < 0) return 1;
    if (!(a = hir__need_shape(ev, e->in[0])) || !(o = hir__need_shape(ev, e->out[0]))) return 0;
    return hir__shapes_equal(a, o) ? 1 : hir__shape_mismatch(ev, e, e->in[0], a, e->out[0], o, "a permute moves one shape");
  }
  case HIR_EXPR_MOE_DISPATCH:
  case HIR_EXPR_MOE_COMBINE: return hir__check_moe(ev, e);
  case HIR_EXPR_P2P_COMMUNICATION:
  case HIR_EXPR_DEALLOCATE:
    return hir__need_shape(ev, e->in[0]) != NULL;
  case HIR_EXPR_POST_ON_STREAM:
    for (i = 0; i < e->unit->exprs.n; i++)
      if (!hir__check_expr(ev, (const hir_expr *)e->unit->exprs.items[i])) return 0;
    return 1;
  default:
    return 1;
  }
}

/* Visits every expr of a scope, nested bodies and HostUnits included. */
static int hir__walk(const hir_scope *s, int (*fn)(hir_evaluator *ev, const hir_expr *e), hir_evaluator *ev) {
  int i;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    if (!fn(ev, e) || !hir__walk(&e->body, fn, ev) || !hir__walk(&e->orelse, fn, ev)) return 0;
  }
  return 1;
}

static int hir__bind_symbol(hir_evaluator *ev, const hir_id *id, int64_t value, int input, const hir_tv *tv, int axis) {
  const hir_val *x = id->extent;
  int64_t have;
  if (x->kind == HIR__VAL_SYMBOL && !ev->env.sym_bound[x->name]) {
    ev->env.sym[x->name] = value;
    ev->env.sym_bound[x->name] = 1;
    return 1;
  }
  if (hir__unbound(&ev->env, x)) return 1; /* an expression of unknowns: checked by use */
  have = hir__eval_val(&ev->env, x);
  if (have == value) return 1;
  return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: input %d (T%d) axis %d has size %lld, but its extent is %lld (%s)", input,
                      tv->name, axis, (long long)value, (long long)have,
                      x->kind == HIR__VAL_CONST ? "fixed when the fusion was built" : "set by an earlier input or the mesh");
}

/* Binds the sizes of the inputs, then derives and checks every local shape.
   Runs when the input shapes change; later runs reuse it. */
static int hir__plan(hir_evaluator *ev, const hir_tensor *in) {
  const hir_fusion *f = &ev->p->ir;
  int i, a, k;
  memset(ev->env.sym_bound, 0, (size_t)ev->nval + 1);
  for (i = 0; i < f->inputs.n; i++) {
    const hir_tv *tv = (const hir_tv *)f->inputs.items[i];
    int l;
    if (tv->scalar) {
      ev->env.sym[tv->scalar->name] = in[i].sizes[0];
      ev->env.sym_bound[tv->scalar->name] = 1;
      continue;
    }
    if (in[i].ndims == 0) continue;
    for (l = 0; l < tv->nlogical; l++) { /* a split axis: its whole extent from its parts (DIDx: the mesh's) */
      const hir_val *x = tv->logical_extent[l];
      int64_t whole = 1;
      for (a = 0, k = 0; a < tv->ndims; a++) {
        if (tv->ids[a]->iter == HIR_REDUCTION) continue;
        if (tv->logical_of[a] == l) whole *= hir__split_axis(tv, a) ? hir__shards(tv, tv->ids[a]->ptype) : in[i].sizes[k];
        k++;
      }
      if (x->kind == HIR__VAL_SYMBOL && !ev->env.sym_bound[x->name]) ev->env.sym[x->name] = whole, ev->env.sym_bound[x->name] = 1;
    }
    for (a = 0, k = 0; a < tv->ndims; a++) {
      const hir_id *id = tv->ids[a];
      int64_t size;
      if (id->iter == HIR_REDUCTION) continue;
      size = in[i].sizes[k++];
      if (hir__split_axis(tv, a)) {
        if (size != 1)
          return hir__ev_fail(ev, HIR_ERR_SHAPE,
                              "hir_run: input %d (T%d) axis %d is split across %d devices (%s): this rank's shard has "
                              "size 1 there, got %lld",
                              i, tv->name, a, hir__shards(tv, id->ptype), hir__ptype_labels[id->ptype], (long long)size);
        if (!hir__bind_symbol(ev, id, hir__shards(tv, id->ptype), i, tv, a)) return 0;
      } else if (id->iter == HIR_BROADCAST) {
        if (size != 1)
          return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: input %d (T%d) axis %d is a broadcast axis: size 1, got %lld", i,
                              tv->name, a, (long long)size);
      } else if (!hir__bind_symbol(ev, id, size, i, tv, a)) {
        return 0;
      }
    }
  }
  for (i = 0; i < f->tvs.n; i++) {
    const hir_tv *tv = (const hir_tv *)f->tvs.items[i];
    const hir__shape *sh = &ev->shape[tv->name];
    hir__compute_shape(ev, tv);
    if (sh->known && !hir__sizes_fit(sh->nd, sh->sizes, hir_dtype_size(tv->dtype))) {
      char shape[160];
      hir__shape_str(sh, shape, sizeof shape);
      return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: T%d would be %s %s elements: a negative size, or more bytes "
                          "than this machine addresses; check the input sizes", tv->name, shape, hir_dtype_name(tv->dtype));
    }
  }
  for (i = 0; i < f->tvs.n * 2; i++) { /* a sharded axis spans its mesh axis: extent D */
    const hir_tv *tv = (const hir_tv *)f->tvs.items[i / 2];
    hir_ptype p = i % 2 ? HIR_DIDY : HIR_DIDX;
    int d = hir__shard_axis(tv, p);
    if (d >= 0 && hir__in_mesh(tv, ev->device) && !hir__unbound(&ev->env, tv->ids[d]->extent) &&
        hir__eval_val(&ev->env, tv->ids[d]->extent) != hir__shards(tv, p))
      return hir__ev_fail(ev, HIR_ERR_SHAPE,
                          "hir_run: T%d axis %d is split across %d devices (%s) but has extent %lld; a %s axis has "
                          "its mesh axis's size as extent (reshape to [D, n/D] first)",
                          tv->name, d, hir__shards(tv, p), hir__ptype_labels[p],
                          (long long)hir__eval_val(&ev->env, tv->ids[d]->extent), hir__ptype_labels[p]);
  }
  for (i = 0; i < ev->p->same_extents.n; i++) { /* what stream lowering read chunk by chunk */
    const hir__same_extent *x = (const hir__same_extent *)ev->p->same_extents.items[i];
    int64_t loop, size;
    if (hir__unbound(&ev->env, x->loop) || hir__unbound(&ev->env, x->tv->ids[x->axis]->extent)) continue;
    loop = hir__eval_val(&ev->env, x->loop);
    size = hir__eval_val(&ev->env, x->tv->ids[x->axis]->extent);
    if (loop != size) {
      int input, axis;
      char from[96] = "";
      if (hir__size_source(f, x->tv->ids[x->axis]->extent, &input, &axis) && f->inputs.items[input] != (void *)x->tv)
        snprintf(from, sizeof from, " (the size of input %d, T%d, axis %d)", input,
                 ((const hir_tv *)f->inputs.items[input])->name, axis);
      return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: T%d axis %d has size %lld%s, but the Stream axis it is read along "
                          "has %lld chunks; give it that size (or declare it a broadcast axis with hir_broadcast)",
                          x->tv->name, x->axis, (long long)size, from, (long long)loop);
    }
  }
  return hir__walk(&ev->p->top, hir__check_expr, ev);
}

/* ---- buffers ---- */

/* A buffer outgrown in a run: work issued before may still use it, and the
   backend's release may wait for the whole device (cudaFree) with no
   deadline, behind a dead peer's collective. So it is released once the
   streams are known idle (hir__release_retired). */
static void hir__retire(hir_evaluator *ev, void *ptr) {
  if (ev->nretired == ev->cap_retired) {
    int cap = ev->cap_retired ? 2 * ev->cap_retired : 8;
    void **grown = (void **)HIR_REALLOC(ev->retired, (size_t)cap * sizeof *grown);
    if (!grown) {
      ev->b->release(ev->b, ptr); /* no memory to keep it: released now */
      return;
    }
    ev->retired = grown, ev->cap_retired = cap;
  }
  ev->retired[ev->nretired++] = ptr;
}

static void hir__release_retired(hir_evaluator *ev) {
  while (ev->nretired > 0) ev->b->release(ev->b, ev->retired[--ev->nretired]);
}

static void hir__meeting_free(hir_backend *b, hir__meeting *m) {
  if (m->dev) b->release(b, m->dev);
  if (m->host) b->host_release(b, m->host);
  memset(m, 0, sizeof *m);
}

/* tv's slot bound to `data`, in its planned shape, contiguous; `block`:
   the evaluator's buffer holding it, or (negative) what kind of view. */
static void hir__bind_at(hir_evaluator *ev, const hir_tv *tv, void *data, int block) {
  const hir__shape *sh = &ev->shape[tv->name];
  hir_tensor *t = &ev->slot[tv->name];
  t->data = data;
  t->dtype = tv->dtype;
  t->ndims = sh->nd;
  memcpy(t->sizes, sh->sizes, (size_t)sh->nd * sizeof(int64_t));
  hir__contiguous_strides(t);
  ev->bound[tv->name] = 1;
  ev->slot_block[tv->name] = block;
}

/* Whether a and b (one start) put every element in one place: the same
   sizes, the same strides wherever an axis has more than one element. */
static int hir__same_places(const hir_tensor *a, const hir_tensor *b) {
  int i, strided = 0;
  if (a->ndims != b->ndims) return 0;
  for (i = 0; i < a->ndims; i++) {
    if (a->sizes[i] != b->sizes[i] || (a->sizes[i] > 1 && a->strides[i] != b->strides[i])) return 0;
    strided |= a->sizes[i] > 1 && a->strides[i] != 0;
  }
  return strided || hir__numel(a->ndims, a->sizes) <= 1; /* all strides 0 say row-major, not where the permute puts them */
}

/* Whether permute e, its input of these sizes, moves only axes of size 1:
   the axes of size > 1 keep their order, so no byte changes place. */
static int hir__moves_size_one(const hir_expr *e, const int64_t *in_sizes, int nd) {
  int i, last = -1;
  for (i = 0; i < nd; i++) {
    if (in_sizes[e->perm[i]] == 1) continue;
    if (e->perm[i] < last) return 0;
    last = e->perm[i];
  }
  return 1;
}

/* Counts each tensor's readers in scope s and its nested scopes; `last`
   is the expr that read it last. */
static void hir__count_readers(const hir_scope *s, int *readers, const hir_expr **last) {
  int i, k;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    for (k = 0; k < e->nin; k++)
      if (e->in[k] && !(hir__ops[e->kind].flags & HIR__OP_BUFFER)) readers[e->in[k]->name]++, last[e->in[k]->name] = e;
    hir__count_readers(&e->body, readers, last);
    hir__count_readers(&e->orelse, readers, last);
  }
}

/* Whether tv's one writer is an elementwise op at the top level (a unary
   op not fused into a linear's epilogue, a binary op, a local set or cast),
   which writes any strides: tv may then be a strided view. */
static int hir__writes_strided(const hir_evaluator *ev, const hir_tv *tv) {
  const hir_expr *w = NULL;
  int i, writers = 0;
  for (i = 0; i < ev->p->top.exprs.n; i++) {
    const hir_expr *x = (const hir_expr *)ev->p->top.exprs.items[i];
    if (x->nout && x->out[0] == tv) writers++, w = x;
  }
  return writers == 1 && !ev->epilogue[w->name] &&
         ((hir__ops[w->kind].flags & HIR__OP_ANY_STRIDES) ||
          (w->kind == HIR_EXPR_LOAD_STORE && !(w->flags & HIR__SET_PERMUTE) && !hir_expr_is_resharding(w)));
}

/* ev->into, made once with the evaluator (after its epilogues): for a
   tensor of the program's own whose only reader is a top-level permute,
   that permute (hir__bind_into lays the tensor into its output where the
   permute moves only axes of size 1, or where the tensor's writer writes
   any strides); or whose only reader is a loop's chunk of it, read only by
   a permute into the same chunk of another tensor (a column-parallel
   product chunk by chunk): that permute and the two chunks. */
typedef struct hir__into {
  const hir_expr *permute;       /* NULL: none */
  const hir_expr *mine, *theirs; /* in a loop: the HirAliasSelects the permute reads and writes; NULL at the top */
  int strided;                   /* at the top: the tensor's writer writes any strides (hir__writes_strided) */
} hir__into;

static void hir__permutes_into(hir_evaluator *ev) {
  const hir_fusion *f = &ev->p->ir;
  int *readers = (int *)HIR_MALLOC(((size_t)ev->ntv + 1) * sizeof(int)), i;
  const hir_expr **last = (const hir_expr **)HIR_MALLOC(((size_t)ev->ntv + 1) * sizeof(void *));
  memset(ev->into, 0, ((size_t)ev->ntv + 1) * sizeof *ev->into);
  if (readers && last) {
    memset(readers, 0, ((size_t)ev->ntv + 1) * sizeof(int));
    hir__count_readers(&ev->p->top, readers, last);
    for (i = 0; i <= ev->ntv; i++) {
      const hir_expr *e = readers[i] == 1 ? last[i] : NULL, *mine = NULL, *theirs = NULL;
      if (e && e->kind == HIR_EXPR_ALIAS_SELECT && readers[e->out[0]->name] == 1) /* a loop's chunk of it, then its permute */
        mine = e, e = last[e->out[0]->name];
      if (!e || e->kind != HIR_EXPR_LOAD_STORE || !(e->flags & HIR__SET_PERMUTE)) continue;
      if (mine && (e->scope != mine->scope || !(theirs = hir__defined_in(e->scope, e->out[0], HIR_EXPR_ALIAS_SELECT)) ||
                   theirs->val != mine->val))
        continue;
      if (!mine && e->scope != &ev->p->top) continue;
      ev->into[i].permute = e, ev->into[i].mine = mine, ev->into[i].theirs = theirs;
      ev->into[i].strided = !mine && hir__writes_strided(ev, (const hir_tv *)f->tvs.items[i]);
    }
    for (i = 0; i < f->inputs.n + f->outputs.n; i++) /* the caller's tensors are where the caller put them */
      ev->into[((const hir_tv *)(i < f->inputs.n ? f->inputs.items[i] : f->outputs.items[i - f->inputs.n]))->name].permute = NULL;
  }
  HIR_FREE(readers);
  HIR_FREE((void *)last);
}

/* tv (unbound, about to be made) as a view of the output of the permute
   that is its only reader (ev->into): where that permute moves only axes of
   size 1, the same bytes in tv's shape (a column-parallel product into its
   output, an activation into its row-parallel layout, a loop's chunks into
   the output's); else, where tv's writer writes any strides, the output
   seen in tv's order (relu into a column-major output). The producer writes
   straight into the permute's output, which then has nothing to copy. The
   output is bound first where the caller gave none; one the caller gave
   must be dense. */
enum { HIR__INTO_VIEW = -3 };
static int hir__bind_new(hir_evaluator *ev, const hir_tv *tv);
/* Whether the chunks' permute e, laying chunk `in_axis` of a tensor of
   shape `sh` into chunk `out_axis` of one of shape `to` (data axes), keeps
   the order of every axis of size > 1 and their sizes: the whole tensor is
   then the other's bytes, in its order. */
static int hir__chunks_in_order(const hir_expr *e, const hir__shape *sh, int in_axis, const hir__shape *to, int out_axis) {
  int map[HIR_MAX_DIMS], a, i, k, last = -1;
  if (sh->nd != to->nd || sh->sizes[in_axis] != to->sizes[out_axis]) return 0;
  map[in_axis] = out_axis;
  for (i = 0, k = 0; i < to->nd; i++) /* the output chunk's axis k is `to`'s axis i (out_axis skipped) */
    if (i != out_axis) a = e->perm[k++], map[a + (a >= in_axis)] = i;
  for (a = 0; a < sh->nd; a++) {
    if (sh->sizes[a] != to->sizes[map[a]]) return 0;
    if (sh->sizes[a] == 1) continue;
    if (map[a] < last) return 0;
    last = map[a];
  }
  return 1;
}

static int hir__bind_into(hir_evaluator *ev, const hir_tv *tv) {
  const hir__into *in = &ev->into[tv->name];
  const hir_expr *e = in->permute;
  const hir__shape *sh = &ev->shape[tv->name];
  const hir_tv *out;
  int i, caller = 0, size_one = 1;
  if (!e) return 0;
  if (in->mine) { /* tv's chunk into `out`'s: tv laid into out where the two hold their bytes in one order */
    out = in->theirs->in[0];
    if (!ev->shape[out->name].known || !hir__chunks_in_order(e, sh, hir__data_index(tv, in->mine->axis), &ev->shape[out->name],
                                                             hir__data_index(out, in->theirs->axis)))
      return 0;
  } else {
    if (!(size_one = hir__moves_size_one(e, sh->sizes, sh->nd)) && !in->strided) return 0;
    out = e->out[0];
  }
  for (i = 0; i < ev->p->ir.outputs.n; i++) caller |= ev->p->ir.outputs.items[i] == (const void *)out;
  if (ev->bound[out->name] ? ev->slot_block[out->name] < 0 && !caller : !hir__bind_new(ev, out)) return 0;
  if (!hir__is_contiguous(&ev->slot[out->name])) return 0;
  hir__bind_at(ev, tv, ev->slot[out->name].data, HIR__INTO_VIEW);
  for (i = 0; !size_one && i < ev->slot[out->name].ndims; i++) /* the output seen in tv's order: a strided view */
    ev->slot[tv->name].strides[e->perm[i]] = ev->slot[out->name].strides[i];
  return 1;
}

static int hir__bind_new(hir_evaluator *ev, const hir_tv *tv) {
  const hir__shape *sh = &ev->shape[tv->name];
  size_t bytes = (size_t)hir__shape_numel(sh) * hir_dtype_size(tv->dtype);
  int i;
  if (ev->into[tv->name].permute && hir__bind_into(ev, tv)) return 1;
  for (i = 0; i < ev->nblocks; i++) /* same program, same order: same addresses every run */
    if (!ev->blocks[i].in_use && ev->blocks[i].bytes == bytes) break;
  if (i == ev->nblocks) {
    hir_status s;
    if (ev->nblocks == ev->cap_blocks)
      return hir__ev_fail(ev, HIR_ERR_INTERNAL, "hir_run: more live buffers than tensors (a hostir bug)");
    s = ev->b->alloc(ev->b, bytes, &ev->blocks[i].ptr);
    if (s != HIR_OK)
      return hir__ev_fail(ev, s, "hir_run: allocating %zu bytes for T%d failed: %s", bytes, tv->name, ev->b->error);
    ev->blocks[i].bytes = bytes;
    ev->nblocks++;
    if (ev->comm && ev->comm->register_buffer && !ev->b->host_memory) ev->comm->register_buffer(ev->comm, ev->blocks[i].ptr, bytes);
  }
  ev->blocks[i].in_use = 1;
  hir__bind_at(ev, tv, ev->blocks[i].ptr, i);
  return 1;
}

static void hir__unbind(hir_evaluator *ev, const hir_tv *tv) {
  int blk = ev->slot_block[tv->name];
  if (blk >= 0) ev->blocks[blk].in_use = 0;
  ev->slot_block[tv->name] = -1;
  ev->bound[tv->name] = 0;
}

static void hir__free_graph(hir_evaluator *ev, hir__graph *g) {
  if (g->exec) ev->b->graph_destroy(ev->b, g->exec);
  if (g->start_signals) ev->comm->start_signals_release(ev->comm, g->start_signals);
  HIR_FREE(g->args);
  HIR_FREE(g->allocs);
  HIR_FREE(g->outs);
  memset(g, 0, sizeof *g);
}

/* Graph mode 2's arguments (hir__stage). */
static void hir__free_stage(hir_evaluator *ev) {
  int i;
  for (i = 0; ev->stage && i < ev->nstage; i++)
    if (ev->stage[i].data) ev->b->release(ev->b, ev->stage[i].data);
  HIR_FREE(ev->stage);
  ev->stage = ev->stage_run = NULL;
  ev->nstage = 0;
}

/* Graphs record the buffers' addresses: they go with the buffers. */
static void hir__free_blocks(hir_evaluator *ev) {
  int i;
  for (i = 0; i < ev->ngraphs; i++) hir__free_graph(ev, &ev->graphs[i]);
  ev->ngraphs = 0;
  ev->warm = 0;
  for (i = 0; i < ev->nblocks; i++) {
    if (ev->comm && ev->comm->deregister_buffer && !ev->b->host_memory) ev->comm->deregister_buffer(ev->comm, ev->blocks[i].ptr);
    ev->b->release(ev->b, ev->blocks[i].ptr);
  }
  ev->nblocks = 0;
}

/* The bytes t spans, [lo, hi); lo == hi when it holds none. */
static hir__range hir__range_of(const hir_tensor *t) {
  hir__range r = {0, 0};
  int64_t first = 0, last = 0, numel = hir__numel(t->ndims, t->sizes);
  int i, strided = 0;
  if (!t->data || numel == 0) return r;
  for (i = 0; i < t->ndims; i++) strided |= t->strides[i] != 0;
  for (i = 0; i < t->ndims; i++) {
    int64_t reach = (t->sizes[i] - 1) * t->strides[i];
    if (reach < 0) first += reach;
    else last += reach;
  }
  if (!strided) last = numel - 1; /* all strides 0: contiguous (hir_tensor's convention) */
  r.lo = (uintptr_t)t->data + (uintptr_t)(first * (int64_t)hir_dtype_size(t->dtype));
  r.hi = (uintptr_t)t->data + (uintptr_t)((last + 1) * (int64_t)hir_dtype_size(t->dtype));
  return r;
}

/* While capturing, every tensor an op reads or writes is noted, so that a
   receive into bytes nothing touched before it can be posted at the
   replay's start (hir_comm.recv_at_start). Out of memory, everything counts
   as touched. */
static void hir__touch(hir_evaluator *ev, const hir_tensor *t) {
  hir__range r;
  if (!ev->capturing || ev->ntouched < 0) return;
  r = hir__range_of(t);
  if (r.lo == r.hi) return;
  if (ev->ntouched == ev->cap_touched) {
    int cap = ev->cap_touched ? 2 * ev->cap_touched : 64;
    hir__range *grown = (hir__range *)HIR_REALLOC(ev->touched, (size_t)cap * sizeof *grown);
    if (!grown) {
      ev->ntouched = -1;
      return;
    }
    ev->touched = grown;
    ev->cap_touched = cap;
  }
  ev->touched[ev->ntouched++] = r;
}

static int hir__untouched(const hir_evaluator *ev, const hir_tensor *t) {
  hir__range r = hir__range_of(t);
  int i;
  if (ev->ntouched < 0) return 0;
  for (i = 0; i < ev->ntouched; i++)
    if (r.lo < ev->touched[i].hi && ev->touched[i].lo < r.hi) return 0;
  return 1;
}

/* What T holds, for a view of it (no bytes touched). */
static const hir_tensor *hir__peek(hir_evaluator *ev, const hir_tv *tv, const hir_expr *e) {
  if (ev->bound[tv->name]) return &ev->slot[tv->name];
  hir__ev_fail(ev, HIR_ERR_INTERNAL, "hir_run: %s %d reads T%d, which holds no data on this rank", hir__ops[e->kind].name,
               e->name, tv->name);
  return NULL;
}

/* An op's input and output tensors: bound (an output on first write), and noted as touched. */
static const hir_tensor *hir__get(hir_evaluator *ev, const hir_tv *tv, const hir_expr *e) {
  const hir_tensor *t = hir__peek(ev, tv, e);
  if (t) hir__touch(ev, t);
  return t;
}

static const hir_tensor *hir__bind_out(hir_evaluator *ev, const hir_tv *tv) {
  if (!ev->bound[tv->name] && !hir__bind_new(ev, tv)) return NULL;
  return &ev->slot[tv->name];
}

static const hir_tensor *hir__get_out(hir_evaluator *ev, const hir_tv *tv) {
  const hir_tensor *t = hir__bind_out(ev, tv);
  if (t) hir__touch(ev, t);
  return t;
}

// >>eval_exec
/* ---- views handed to the backend ---- */
static void hir__insert_dim(hir_tensor *t, int at, int64_t size, int64_t stride) {
  int i;
  for (i = t->ndims; i > at; i--) {
    t->sizes[i] = t->sizes[i - 1];
    t->strides[i] = t->strides[i - 1];
  }
  t->sizes[at] = size;
  t->strides[at] = stride;
  t->ndims++;
}

/* t's batch axes right-aligned onto c's, size-1 and missing ones broadcast. */
static void hir__expand_batch(hir_tensor *t, const hir_tensor *c) {
  hir_tensor r = *t;
  int nbatch = c->ndims - 2, tb = t->ndims - 2, i;
  r.ndims = c->ndims;
  for (i = 0; i < nbatch; i++) {
    int k = i - (nbatch - tb);
    r.sizes[i] = c->sizes[i];
    r.strides[i] = (k < 0 || t->sizes[k] == 1) ? 0 : t->strides[k];
  }
  for (i = 0; i < 2; i++) {
    r.sizes[nbatch + i] = t->sizes[tb + i];
    r.strides[nbatch + i] = t->strides[tb + i];
  }
  *t = r;
}

/* Whether x lies in the memory of one of the caller's inputs, which lives
   for the whole run. */
static int hir__in_caller_input(const hir_evaluator *ev, const hir_tensor *x) {
  const hir_fusion *f = &ev->p->ir;
  int i, k;
  for (i = 0; i < f->inputs.n; i++) {
    const hir_tv *tv = (const hir_tv *)f->inputs.items[i];
    const hir_tensor *t = &ev->slot[tv->name];
    int64_t span = 1;
    if (!ev->bound[tv->name] || !t->data || tv->scalar) continue;
    for (k = 0; k < t->ndims; k++) {
      if (t->sizes[k] == 0) span = 0;
      if (t->strides[k] > 0 && span) span += (t->sizes[k] - 1) * t->strides[k];
    }
    if ((const char *)x->data >= (const char *)t->data &&
        (const char *)x->data < (const char *)t->data + span * (int64_t)hir_dtype_size(t->dtype))
      return 1;
  }
  return 0;
}

/* A broadcast that only inserts axes of size 1, or a permute that moves
   only axes of size 1 (a DIDx part, a broadcast axis), changes no byte's
   place: its output is a view of a contiguous input that lies in the
   caller's inputs, which outlive the run (a weight broadcast, or its DIDx
   part moved first, is not copied), where the output is not the caller's.
   Made again at each run and loop iteration, as the input may move
   (slot_block marks the view; one an alias or an allocation bound is left
   to them). */
enum { HIR__INPUT_VIEW = -2 };
static int hir__input_view(hir_evaluator *ev, const hir_expr *e, const hir_tensor *x) {
  const hir_fusion *f = &ev->p->ir;
  const hir__shape *sh = &ev->shape[e->out[0]->name];
  int i;
  if ((ev->bound[e->out[0]->name] && ev->slot_block[e->out[0]->name] != HIR__INPUT_VIEW) || !hir__is_contiguous(x) ||
      !hir__in_caller_input(ev, x))
    return 0;
  for (i = 0; i < f->outputs.n; i++)
    if (f->outputs.items[i] == (void *)e->out[0]) return 0;
  if (e->kind == HIR_EXPR_BROADCAST) {
    for (i = 0; i < sh->nd; i++)
      if (((e->flags >> i) & 1u) && sh->sizes[i] != 1) return 0;
  } else if (sh->nd != x->ndims || !hir__moves_size_one(e, x->sizes, x->ndims)) {
    return 0;
  }
  hir__bind_at(ev, e->out[0], x->data, HIR__INPUT_VIEW);
  return 1;
}

static int hir__exec_binary(hir_evaluator *ev, const hir_expr *e, hir_tensor *ov, hir_tensor *av, hir_tensor *bv) {
  int i;
  for (i = 0; i < ov->ndims; i++) { /* size-1 axes broadcast */
    if (av->sizes[i] != ov->sizes[i]) av->sizes[i] = ov->sizes[i], av->strides[i] = 0;
    if (bv->sizes[i] != ov->sizes[i]) bv->sizes[i] = ov->sizes[i], bv->strides[i] = 0;
  }
  return hir__ev_backend(ev, ev->b->binary(ev->b, ev->current, (hir_binary_op)e->sub, ov, av, bv), e);
}

/* The backend sums (or takes the max) into dst with the reduced axes kept at size 1. */
static int hir__exec_reduce(hir_evaluator *ev, const hir_expr *e, const hir_tensor *ov, const hir_tensor *av) {
  int map[HIR_MAX_DIMS], i, j, k;
  hir_tensor keep = *ov;
  hir__axis_map(e, 0, map);
  keep.ndims = av->ndims;
  for (i = 0, j = 0, k = 0; i < e->in[0]->ndims; i++) {
    if (e->in[0]->ids[i]->iter == HIR_REDUCTION) continue;
    if (e->out[0]->ids[map[i]]->iter == HIR_REDUCTION) {
      keep.sizes[k] = 1;
      keep.strides[k] = 0;
    } else {
      keep.sizes[k] = ov->sizes[j];
      keep.strides[k] = ov->strides[j];
      j++;
    }
    k++;
  }
  return hir__ev_backend(ev, (e->kind == HIR_EXPR_MAX ? ev->b->max : ev->b->sum)(ev->b, ev->current, &keep, av), e);
}

/* A copy of the source seen through the output's axes (stride 0 on the new ones). */
static int hir__exec_broadcast(hir_evaluator *ev, const hir_expr *e, const hir_tensor *ov, const hir_tensor *av) {
  hir_tensor src = *ov;
  int i, k;
  src.data = av->data;
  for (i = 0, k = 0; i < ov->ndims; i++) src.strides[i] = (e->flags >> i) & 1u ? 0 : av->strides[k++];
  return hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, ov, &src), e);
}

/* Input k of e seen through out's axes (stride 0 on those it lacks, and on
   its size-1 axes where out's are longer: a broadcast one): a bias or a
   scale. */
static void hir__seen_as_output(hir_evaluator *ev, const hir_expr *e, int k, const hir_tensor *out, hir_tensor *view) {
  const hir_tensor *in = &ev->slot[e->in[k]->name];
  int map[HIR_MAX_DIMS], i, d;
  *view = *out;
  view->data = in->data;
  view->dtype = e->in[k]->dtype;
  for (i = 0; i < out->ndims; i++) view->strides[i] = 0;
  hir__axis_map(e, k, map);
  for (i = 0, d = 0; i < e->in[k]->ndims; i++)
    if (e->in[k]->ids[i]->iter != HIR_REDUCTION) {
      if (map[i] >= 0 && in->sizes[d] != 1) view->strides[map[i]] = in->strides[d];
      d++;
    }
}

/* torch.matmul on the backend's [..., M, K] x [..., K, N]: a missing M or N
   axis (1-D operands, chunks along M or N) comes back with size 1, batch
   axes are broadcast to the output's. */
static int hir__exec_matmul(hir_evaluator *ev, const hir_expr *e, hir_tensor *ov, hir_tensor *av, hir_tensor *bv,
                            hir_unary_op op) {
  hir_tensor out = *ov, bias;
  int has_m, has_n, i, k;
  hir__matmul_roles(e, av->ndims, bv->ndims, &has_m, &has_n);
  if ((e->flags & HIR__MATMUL_LINEAR) && has_n) { /* the weight [.., N, K] read as [.., K, N] */
    int64_t sz = bv->sizes[bv->ndims - 1], st = bv->strides[bv->ndims - 1];
    bv->sizes[bv->ndims - 1] = bv->sizes[bv->ndims - 2], bv->strides[bv->ndims - 1] = bv->strides[bv->ndims - 2];
    bv->sizes[bv->ndims - 2] = sz, bv->strides[bv->ndims - 2] = st;
  }
  if (!has_m) hir__insert_dim(av, av->ndims - 1, 1, 0);       /* [.., K] -> [.., 1, K] */
  if (!has_n) hir__insert_dim(bv, bv->ndims, 1, 0);           /* [.., K] -> [.., K, 1] */
  if (!has_m) hir__insert_dim(ov, ov->ndims - has_n, 1, 0);   /* [.., N] -> [.., 1, N] */
  if (!has_n) hir__insert_dim(ov, ov->ndims, 1, 0);           /* [.., M] -> [.., M, 1] */
  hir__expand_batch(av, ov);
  hir__expand_batch(bv, ov);
  if (e->nin < 3) return hir__ev_backend(ev, ev->b->matmul(ev->b, ev->current, ov, av, bv), e);
  hir__seen_as_output(ev, e, 2, &out, &bias);
  if (e->flags & HIR__MATMUL_SCALED) { /* the scales, as the bias: in ov's axes */
    hir_tensor sa = *ov, sb = *ov, w;
    hir__seen_as_output(ev, e, 3, &out, &w);
    for (i = 0, k = 0; i < ov->ndims; i++) /* out's axes, with the size-1 M or N of a chunk inserted */
      if (!(!has_m && i == ov->ndims - 2) && !(!has_n && i == ov->ndims - 1)) sa.strides[i] = bias.strides[k], sb.strides[i] = w.strides[k++];
      else sa.strides[i] = sb.strides[i] = 0;
    sa.dtype = sb.dtype = HIR_F32;
    sa.data = bias.data, sb.data = w.data;
    if (!ev->b->matmul_scaled) {
      snprintf(ev->b->error, sizeof ev->b->error, "this backend has no fp8 matmul (hir_backend.matmul_scaled)");
      return hir__ev_backend(ev, HIR_ERR_UNSUPPORTED, e);
    }
    return hir__ev_backend(ev, ev->b->matmul_scaled(ev->b, ev->current, ov, av, bv, &sa, &sb), e);
  }
  if (ev->b->matmul_bias && has_n) { /* in the GEMM's epilogue, where the backend takes it */
    hir_tensor epi = *ov; /* the bias in ov's axes: only N (ov's last) may vary */
    int only_n = 1;
    for (i = 0; i < epi.ndims; i++) epi.strides[i] = 0;
    for (i = 0; i < out.ndims; i++) only_n &= bias.strides[i] == 0 || i == out.ndims - 1;
    epi.data = bias.data;
    epi.strides[epi.ndims - 1] = bias.strides[out.ndims - 1];
    if (only_n) {
      hir_status s = ev->b->matmul_bias(ev->b, ev->current, ov, av, bv, &epi, op);
      if (s != HIR_ERR_UNSUPPORTED) return hir__ev_backend(ev, s, e);
    }
  }
  if (!hir__ev_backend(ev, ev->b->matmul(ev->b, ev->current, ov, av, bv), e) ||
      !hir__ev_backend(ev, ev->b->binary(ev->b, ev->current, HIR_BINARY_ADD, &out, &out, &bias), e)) /* in place */
    return 0;
  return op == HIR_UNARY_COUNT || hir__ev_backend(ev, ev->b->unary(ev->b, ev->current, op, &out, &out, 0), e);
}

/* An RNGOp: where each element of this rank's part lies in the whole logical
   tensor. A data axis of the output is a logical axis, or a part of one that
   hir_split made (the parts outer to inner); a device-parallel part holds one
   element here, at this device's place on that mesh axis; the op runs whole
   (HIR__OP_WHOLE), so every other axis is here whole. An element's index is
   then the sum of (base + its coordinate) times the product of the extents
   after its axis (the parts of a logical axis follow one another, outer to
   inner, in the logical axes' order). */
static int hir__exec_rand(hir_evaluator *ev, const hir_expr *e, const hir_tensor *out) {
  const hir_tv *tv = e->out[0];
  int64_t base[HIR_MAX_DIMS], stride[HIR_MAX_DIMS], extent[HIR_MAX_DIMS];
  int logical[HIR_MAX_DIMS], nd = 0, i, at = hir_team_index(tv->mesh, tv->mesh_size, ev->device);
  for (i = 0; i < tv->ndims; i++) {
    const hir_id *id = tv->ids[i];
    if (id->iter == HIR_REDUCTION) continue;
    extent[nd] = id->iter == HIR_BROADCAST ? 1 : hir__eval_val(&ev->env, id->extent);
    logical[nd] = tv->nlogical ? tv->logical_of[i] : nd;
    base[nd] = id->iter != HIR_BROADCAST && hir__shards(tv, id->ptype) > 1 && at >= 0
                   ? (id->ptype == HIR_DIDY ? at / tv->mesh_cols : tv->mesh_cols ? at % tv->mesh_cols : at)
                   : 0;
    nd++;
  }
  for (i = 1; i < nd && logical[i] >= logical[i - 1]; i++) continue;
  if (nd != out->ndims || i < nd)
    return hir__ev_fail(ev, HIR_ERR_INTERNAL, "hir_run: RNGOp %d: T%d's %d data axes are not its logical axes in order, as "
                        "its %d-axis buffer needs (a hostir bug)", e->name, tv->name, nd, out->ndims);
  for (i = nd - 1; i >= 0; i--) stride[i] = i == nd - 1 ? 1 : stride[i + 1] * extent[i + 1];
  if (e->sub == HIR__RNG_IOTA) { /* the index along one logical axis: its parts only, numbered among themselves */
    for (i = nd - 1; i >= 0; i--)
      stride[i] = logical[i] != e->axis ? 0 : i + 1 < nd && logical[i + 1] == e->axis ? stride[i + 1] * extent[i + 1] : 1;
    return hir__ev_backend(ev, ev->b->rand(ev->b, ev->current, out, 0, base, stride, 0), e);
  }
  return hir__ev_backend(ev, ev->b->rand(ev->b, ev->current, out, (uint64_t)hir__eval_val(&ev->env, e->val), base, stride,
                                         hir__rand_bits(out->dtype)), e);
}

static int hir__exec_compute(hir_evaluator *ev, const hir_expr *e) {
  const hir_tensor *x, *y = NULL, *o;
  const hir_expr *epi = ev->epilogue[e->name];
  hir_tensor av, bv, ov;
  if (epi && e->kind == HIR_EXPR_UNARY) return 1; /* done in the linear's epilogue */
  if (!(x = hir__get(ev, e->in[0], e)) || (e->nin > 1 && !(y = hir__get(ev, e->in[1], e))) ||
      (e->nin > 2 && !hir__get(ev, e->in[2], e)) || (e->nin > 3 && !hir__get(ev, e->in[3], e)))
    return 0;
  if ((e->kind == HIR_EXPR_BROADCAST || (e->kind == HIR_EXPR_LOAD_STORE && (e->flags & HIR__SET_PERMUTE))) &&
      hir__input_view(ev, e, x))
    return 1;
  if (!(o = hir__get_out(ev, epi ? epi->out[0] : e->out[0]))) return 0;
  ov = *o;
  av = *x;
  bv = y ? *y : av;
  switch (e->kind) {
  case HIR_EXPR_LOAD_STORE:
    if (e->flags & HIR__SET_PERMUTE) { /* the source seen in the output's order */
      int i;
      for (i = 0; i < ov.ndims; i++) av.sizes[i] = x->sizes[e->perm[i]], av.strides[i] = x->strides[e->perm[i]];
    }
    if (av.data == ov.data && hir__same_places(&av, &ov)) return 1; /* in place already (hir__bind_into) */
    return hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, &ov, &av), e);
  case HIR_EXPR_BINARY: return hir__exec_binary(ev, e, &ov, &av, &bv);
  case HIR_EXPR_UNARY:
    return hir__ev_backend(ev, ev->b->unary(ev->b, ev->current, (hir_unary_op)e->sub, &ov, &av,
                                            e->val ? (double)hir__eval_val(&ev->env, e->val) : e->scalar), e);
  case HIR_EXPR_REDUCTION:
  case HIR_EXPR_MAX: return hir__exec_reduce(ev, e, &ov, &av);
  case HIR_EXPR_RNG: return hir__exec_rand(ev, e, &ov);
  case HIR_EXPR_BROADCAST: return hir__exec_broadcast(ev, e, &ov, &av);
  case HIR_EXPR_MATMUL: return hir__exec_matmul(ev, e, &ov, &av, &bv, epi ? (hir_unary_op)epi->sub : HIR_UNARY_COUNT);
  case HIR_EXPR_SELECT:
  case HIR_EXPR_SLICE: { /* the part, copied */
    int i, a = e->axis;
    int64_t from = e->params[0], to;
    if (e->kind == HIR_EXPR_SLICE) hir__slice_range(e, x->sizes[a], &from, &to);
    av.data = (char *)x->data + from * x->strides[a] * (int64_t)hir_dtype_size(x->dtype);
    if (e->kind == HIR_EXPR_SLICE) {
      av.sizes[a] = ov.sizes[a];
      av.strides[a] *= e->params[2];
    } else {
      for (i = a; i + 1 < x->ndims; i++) av.sizes[i] = x->sizes[i + 1], av.strides[i] = x->strides[i + 1];
      av.ndims--;
    }
    return hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, &ov, &av), e);
  }
  case HIR_EXPR_RESHAPE: /* the output's buffer seen in the input's shape: a copy in row-major order */
    if (!hir__is_contiguous(&ov))
      return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: ViewOp %d writes T%d, a strided view; reshape into a whole tensor",
                          e->name, e->out[0]->name);
    ov.ndims = x->ndims;
    memcpy(ov.sizes, x->sizes, sizeof ov.sizes);
    hir__contiguous_strides(&ov);
    return hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, &ov, &av), e);
  default:
    return hir__ev_fail(ev, HIR_ERR_INTERNAL, "hir_run: %s %d is not a compute op", hir__ops[e->kind].name, e->name);
  }
}

/* A collective moves whole buffers. A strided one (a part of every chunk,
   HIR_SCHEDULE_COLLECTIVE) moves through a contiguous buffer of the
   evaluator's, one per (collective, stream, side), so iterations on other
   streams never share it; *dense is that buffer, shaped as t (copied into
   when `in`). Made in the first run of a shape, before any capture; the
   table of them when the evaluator is. */
static int hir__staging_n(const hir_evaluator *ev) { return (ev->nexpr + 1) * (ev->nstreams + 1) * 2; }

static int hir__contiguous_buffer(hir_evaluator *ev, const hir_tensor *t, const hir_expr *e, int in, hir_tensor *dense) {
  size_t bytes = (size_t)hir__numel(t->ndims, t->sizes) * hir_dtype_size(t->dtype);
  hir__staging *st;
  hir_status s;
  *dense = *t;
  if (hir__is_contiguous(t)) return 1;
  st = &ev->staging[((size_t)e->name * (size_t)(ev->nstreams + 1) + (size_t)ev->current_track) * 2 + (size_t)in];
  if (st->bytes < bytes) {
    if (st->data) hir__retire(ev, st->data);
    st->data = NULL;
    st->bytes = 0;
    if ((s = ev->b->alloc(ev->b, bytes, &st->data)) != HIR_OK) return hir__ev_backend(ev, s, e);
    st->bytes = bytes;
  }
  dense->data = st->data;
  hir__contiguous_strides(dense);
  return !in || hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, dense, t), e);
}

/* Tells the communicator what this rank moves, for its messages when the
   ranks disagree: a copy, no formatting in the run loop. */
static void hir__comm_what(hir_evaluator *ev, const hir_tv *tv, const hir_tensor *t) {
  hir_comm_what *what = &ev->comm->what;
  what->tensor = tv->name;
  what->dtype = tv->dtype;
  what->ndims = t->ndims;
  memcpy(what->sizes, t->sizes, (size_t)t->ndims * sizeof t->sizes[0]);
}

/* AllToAll from send/recv: chunk j of the input goes to member j, chunk i of
   the output comes from member i, all in one group; the own chunk is a copy. */
static int hir__exec_alltoall(hir_evaluator *ev, const hir_expr *e, const hir_tensor *in, const hir_tensor *out, size_t bytes) {
  hir_comm *c = ev->comm;
  size_t chunk = bytes / (size_t)e->team_size;
  int me = hir_team_index(e->team, e->team_size, ev->device), j;
  hir_tensor dst, src;
  memset(&dst, 0, sizeof dst);
  dst.dtype = in->dtype;
  dst.ndims = 1;
  dst.sizes[0] = (int64_t)(chunk / hir_dtype_size(in->dtype));
  hir__contiguous_strides(&dst);
  src = dst;
  dst.data = (char *)out->data + (size_t)me * chunk;
  src.data = (char *)in->data + (size_t)me * chunk;
  if (!hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, &dst, &src), e)) return 0;
  if (e->team_size == 1) return 1;
  if (!hir__ev_comm(ev, c->group_start(c), e)) return 0;
  for (j = 0; j < e->team_size; j++) {
    hir_status s = HIR_OK;
    if (j == me) continue;
    s = c->send(c, (const char *)in->data + (size_t)j * chunk, chunk, e->team[j], ev->current);
    if (s == HIR_OK) s = c->recv(c, (char *)out->data + (size_t)j * chunk, chunk, e->team[j], ev->current);
    if (s != HIR_OK) {
      hir__ev_comm(ev, s, e);
      c->group_end(c);
      return 0;
    }
  }
  return hir__ev_comm(ev, c->group_end(c), e);
}

/* A dense [rows, cols] (cols 0: [rows]) view of dtype dt at p. */
static hir_tensor hir__rows_view(void *p, hir_dtype dt, int64_t rows, int64_t cols) {
  hir_tensor t;
  memset(&t, 0, sizeof t);
  t.data = p, t.dtype = dt, t.ndims = cols ? 2 : 1;
  t.sizes[0] = rows, t.sizes[1] = cols;
  hir__contiguous_strides(&t);
  return t;
}

/* MoeDispatch and MoeCombine (hir_host_moe_*): row numbers and row moves by
   the backend, and AllToAlls of T rows a member, through buffers of the
   expr's own (its staging slot, made in the first run of a shape). */
static int hir__exec_moe(hir_evaluator *ev, const hir_expr *e) {
  enum { WHERE, SRC, COUNTS, SX, SIDX, SW, RX, RIDX, RW, RSRC, WHERE2, NBUF };
  const hir_tensor *in[4];
  hir_tensor o[6], v[NBUF], x;
  int combine = e->kind == HIR_EXPR_MOE_COMBINE, R = e->team_size, k;
  int64_t T, H, C;
  size_t at[NBUF + 1], es[NBUF];
  hir__staging *st;
  hir_backend *b = ev->b;
  if (hir_team_index(e->team, e->team_size, ev->device) < 0) return 1; /* not in its team */
  for (k = 0; k < e->nin; k++)
    if (!(in[k] = hir__get(ev, e->in[k], e))) return 0;
  for (k = 0; k < e->nout; k++) {
    const hir_tensor *t = hir__get_out(ev, e->out[k]);
    if (!t) return 0;
    o[k] = *t;
  }
  for (k = 0; k < e->nin + e->nout; k++)
    if (!hir__is_contiguous(k < e->nin ? in[k] : &o[k - e->nin]))
      return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: %s %d: T%d is a strided view; MoE ops take dense tensors (copy it "
                          "with a set first)", hir__ops[e->kind].name, e->name,
                          k < e->nin ? e->in[k]->name : e->out[k - e->nin]->name);
  H = in[0]->sizes[in[0]->ndims - 1];
  T = combine ? hir__eval_val(&ev->env, e->val) : in[0]->sizes[in[0]->ndims - 2];
  C = T * R;
  x = hir__rows_view(in[0]->data, in[0]->dtype, combine ? C : T, H);
  for (k = 0; k < NBUF; k++) es[k] = 8; /* int64 */
  es[SX] = es[RX] = hir_dtype_size(in[0]->dtype) * (size_t)H;
  es[SW] = es[RW] = combine ? 8 : hir_dtype_size(in[2]->dtype);
  for (k = 0, at[0] = 0; k < NBUF; k++) /* each buffer 256-byte aligned: [T] where, [R] counts, [C] rows else */
    at[k + 1] = at[k] + ((es[k] * (size_t)(k == WHERE ? T : k == COUNTS ? R : C) + 255) & ~(size_t)255);
  st = &ev->staging[((size_t)e->name * (size_t)(ev->nstreams + 1) + (size_t)ev->current_track) * 2];
  if (st->bytes < at[NBUF]) {
    hir_status s;
    if (st->data) hir__retire(ev, st->data);
    st->data = NULL, st->bytes = 0;
    if ((s = b->alloc(b, at[NBUF] ? at[NBUF] : 1, &st->data)) != HIR_OK) return hir__ev_backend(ev, s, e);
    st->bytes = at[NBUF];
  }
  for (k = 0; k < NBUF; k++)
    v[k] = hir__rows_view((char *)st->data + at[k], k == SX || k == RX ? in[0]->dtype : k == SW || k == RW ? (combine ? HIR_I64 : in[2]->dtype) : HIR_I64,
                          k == WHERE ? T : k == COUNTS ? R : C, k == SX || k == RX ? H : 0);
  ev->started_comm = 1;
  hir__comm_what(ev, e->in[0], in[0]);
  if (!combine) {
    hir_tensor idx = hir__rows_view(in[1]->data, HIR_I64, T, 0), idx2 = hir__rows_view(in[1]->data, HIR_I64, T, 1);
    hir_tensor w = hir__rows_view(in[2]->data, in[2]->dtype, T, 1), sidx = hir__rows_view(v[SIDX].data, HIR_I64, C, 1);
    hir_tensor sw = hir__rows_view(v[SW].data, in[2]->dtype, C, 1), ridx = hir__rows_view(v[RIDX].data, HIR_I64, C, 1);
    hir_tensor rw = hir__rows_view(v[RW].data, in[2]->dtype, C, 1), n_from = hir__rows_view(o[5].data, HIR_I64, R, 0);
    hir_tensor outs[4];
    outs[0] = hir__rows_view(o[0].data, o[0].dtype, C, H), outs[1] = hir__rows_view(o[1].data, HIR_I64, C, 1);
    outs[2] = hir__rows_view(o[2].data, o[2].dtype, C, 1), outs[3] = hir__rows_view(o[3].data, HIR_I64, C, 0);
    if (!hir__ev_backend(ev, b->moe_index(b, ev->current, HIR_MOE_ROUTE, &v[WHERE], &v[SRC], &idx, &v[COUNTS], T, e->params[0]), e) ||
        !hir__ev_backend(ev, b->scatter_rows(b, ev->current, &v[SX], &x, &v[WHERE]), e) ||
        !hir__ev_backend(ev, b->scatter_rows(b, ev->current, &sidx, &idx2, &v[WHERE]), e) ||
        !hir__ev_backend(ev, b->scatter_rows(b, ev->current, &sw, &w, &v[WHERE]), e) ||
        !hir__exec_alltoall(ev, e, &v[SX], &v[RX], es[SX] * (size_t)C) || !hir__exec_alltoall(ev, e, &sidx, &ridx, 8 * (size_t)C) ||
        !hir__exec_alltoall(ev, e, &sw, &rw, es[SW] * (size_t)C) || !hir__exec_alltoall(ev, e, &v[SRC], &v[RSRC], 8 * (size_t)C) ||
        !hir__exec_alltoall(ev, e, &v[COUNTS], &n_from, 8 * (size_t)R) ||
        !hir__ev_backend(ev, b->moe_index(b, ev->current, HIR_MOE_COMPACT, &v[WHERE2], NULL, NULL, &n_from, T, e->params[0]), e) ||
        !hir__ev_backend(ev, b->scatter_rows(b, ev->current, &outs[0], &v[RX], &v[WHERE2]), e) ||
        !hir__ev_backend(ev, b->scatter_rows(b, ev->current, &outs[1], &ridx, &v[WHERE2]), e) ||
        !hir__ev_backend(ev, b->scatter_rows(b, ev->current, &outs[2], &rw, &v[WHERE2]), e) ||
        !hir__ev_backend(ev, b->scatter_rows(b, ev->current, &outs[3], &v[RSRC], &v[WHERE2]), e))
      return 0;
    outs[0] = hir__rows_view(o[4].data, HIR_I64, R, 0);
    return hir__ev_backend(ev, b->copy(b, ev->current, &outs[0], &v[COUNTS]), e);
  } else {
    hir_tensor src = hir__rows_view(in[1]->data, HIR_I64, C, 0), n_to = hir__rows_view(in[2]->data, HIR_I64, R, 0);
    hir_tensor n_from = hir__rows_view(in[3]->data, HIR_I64, R, 0), out = hir__rows_view(o[0].data, o[0].dtype, T, H);
    return hir__ev_backend(ev, b->moe_index(b, ev->current, HIR_MOE_EXPAND, &v[WHERE2], NULL, NULL, &n_from, T, 0), e) &&
           hir__ev_backend(ev, b->scatter_rows(b, ev->current, &v[SX], &x, &v[WHERE2]), e) &&
           hir__ev_backend(ev, b->scatter_rows(b, ev->current, &v[SRC], &src, &v[WHERE2]), e) &&
           hir__exec_alltoall(ev, e, &v[SX], &v[RX], es[SX] * (size_t)C) && hir__exec_alltoall(ev, e, &v[SRC], &v[RSRC], 8 * (size_t)C) &&
           hir__ev_backend(ev, b->moe_index(b, ev->current, HIR_MOE_COMBINE, &v[WHERE2], NULL, &v[RSRC], &n_to, T, 0), e) &&
           hir__ev_backend(ev, b->scatter_rows(b, ev->current, &out, &v[RX], &v[WHERE2]), e);
  }
}

static int hir__exec_comm(hir_evaluator *ev, const hir_expr *e) {
  hir_comm *c = ev->comm;
  void *team = ev->team[e->name];
  const hir_tensor *in = NULL, *out = NULL, *given, *out_given = NULL;
  hir_tensor in_dense, out_dense;
  int writes, in_here = e->nin && hir__in_mesh(e->in[0], ev->device), out_here = e->nout && hir__in_mesh(e->out[0], ev->device);
  size_t es = hir_dtype_size(e->nin ? e->in[0]->dtype : e->out[0]->dtype), ni = 0, no = 0;
  hir_status s = HIR_OK;
  if (in_here && (!(given = hir__get(ev, e->in[0], e)) || !hir__contiguous_buffer(ev, given, e, 1, &in_dense))) return 0;
  if (in_here) in = &in_dense;
  if (out_here && (!(out_given = hir__get_out(ev, e->out[0])) || !hir__contiguous_buffer(ev, out_given, e, 0, &out_dense)))
    return 0;
  if (out_here) out = &out_dense;
  if (in) ni = (size_t)hir__numel(in->ndims, in->sizes);
  if (out) no = (size_t)hir__numel(out->ndims, out->sizes);
  if (in || out) hir__comm_what(ev, in ? e->in[0] : e->out[0], in ? in : out);
  ev->started_comm = 1;
  switch (e->sub) {
  case HIR_COLL_ALLGATHER:
    s = c->allgather(c, team, in->data, out->data, ni * es, ev->current);
    break;
  case HIR_COLL_ALLREDUCE:
    s = c->allreduce(c, team, in->data, out->data, no, e->out[0]->dtype, ev->current);
    break;
  case HIR_COLL_REDUCESCATTER:
    s = c->reduce_scatter(c, team, in->data, out->data, no, e->out[0]->dtype, ev->current);
    break;
  case HIR_COLL_REDUCE:
    s = c->reduce(c, team, in ? in->data : NULL, out ? out->data : NULL, in ? ni : no, e->in[0]->dtype, e->root, ev->current);
    break;
  case HIR_COLL_BROADCAST:
    s = c->broadcast(c, team, in ? in->data : NULL, out ? out->data : NULL, (in ? ni : no) * es, e->root, ev->current);
    break;
  case HIR_COLL_GATHER: {
    int senders = e->team_size - !hir__in_mesh(e->in[0], e->root);
    s = c->gather(c, team, in ? in->data : NULL, out ? out->data : NULL, (in ? ni : no / (size_t)senders) * es, e->root,
                  ev->current);
    break;
  }
  case HIR_COLL_SCATTER:
    s = c->scatter(c, team, ev->device == e->root ? in->data : NULL, out->data, no * es, e->root, ev->current);
    break;
  case HIR_COLL_SENDRECV:
    if (e->team_size == 1) { /* sender and receiver are one device: a copy */
      hir_tensor dst = *out, src = *in;
      s = ev->b->copy(ev->b, ev->current, &dst, &src);
      if (s != HIR_OK) return hir__ev_backend(ev, s, e);
    } else if (ev->device == e->root) { /* to the other member, whichever comes first in the team */
      s = c->send(c, in->data, ni * es, e->team[e->team[0] == e->root], ev->current);
    } else {
      s = c->recv(c, out->data, no * es, e->root, ev->current);
    }
    break;
  case HIR_COLL_ALLTOALL:
    if (!hir__exec_alltoall(ev, e, in, out, ni * es)) return 0;
    break;
  default:
    return hir__ev_fail(ev, HIR_ERR_INTERNAL, "hir_run: unknown collective %d", e->sub);
  }
  if (!hir__ev_comm(ev, s, e)) return 0;
  writes = e->sub == HIR_COLL_GATHER || e->sub == HIR_COLL_REDUCE ? ev->device == e->root
         : e->sub == HIR_COLL_SENDRECV                           ? e->team_size == 1 || ev->device != e->root
                                                                 : 1;
  if (out && writes && out->data != out_given->data &&
      !hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, out_given, out), e)) /* a staged output, where this rank got it */
    return 0;
  return hir__ev_backend(ev, ev->b->event_record(ev->b, ev->done[e->name], ev->current), e);
}

/* 0: a stream variable; k + 1: pool stream k (the timeline's track). */
static int hir__resolve_stream(hir_evaluator *ev, const hir_stream *s, void **handle, void **event, int *track) {
  int64_t i;
  *track = 0;
  if (!s->index) {
    *handle = ev->vars[s->name];
    *event = ev->vars_ev[s->name];
    return 1;
  }
  i = hir__eval_val(&ev->env, s->index);
  if (i < 0 || i >= ev->nstreams)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: stream index %lld is outside the pool of %d streams (numberOfStreams)",
                        (long long)i, ev->nstreams);
  *handle = ev->pool[i];
  *event = ev->pool_ev[i];
  *track = (int)i + 1;
  return 1;
}

static int hir__exec_scope(hir_evaluator *ev, const hir_scope *s);

/* The current stream waits for S's work so far; the host does not block. */
static int hir__exec_synchronize(hir_evaluator *ev, const hir_expr *e) {
  void *h, *evt;
  int track;
  if (!hir__resolve_stream(ev, e->stream, &h, &evt, &track)) return 0;
  if (h == ev->current) return 1;
  return hir__ev_backend(ev, ev->b->event_record(ev->b, evt, h), e) &&
         hir__ev_backend(ev, ev->b->stream_wait_event(ev->b, ev->current, evt), e);
}

static int hir__exec_for(hir_evaluator *ev, const hir_expr *e) {
  int64_t i, n = hir__eval_val(&ev->env, e->id->extent);
  for (i = 0; i < n; i++) {
    hir__bind_index(&ev->env, e->val, i);
    if (!hir__exec_scope(ev, &e->body)) return 0;
  }
  return 1;
}

/* A HostUnit's exprs in order, those whose output lives here (a unit may
   span meshes); its intermediates die with it. */
static int hir__exec_post(hir_evaluator *ev, const hir_expr *e) {
  const hir__host_unit *u = e->unit;
  int k, m;
  for (k = 0; k < u->exprs.n; k++) {
    const hir_expr *x = (const hir_expr *)u->exprs.items[k];
    if (hir__in_mesh(x->out[0], ev->device) && !hir__exec_compute(ev, x)) return 0;
  }
  for (k = 0; k < u->exprs.n; k++) {
    const hir_tv *t = ((const hir_expr *)u->exprs.items[k])->out[0];
    for (m = 0; m < u->outs.n && u->outs.items[m] != t; m++) {}
    if (m == u->outs.n) hir__unbind(ev, t);
  }
  return 1;
}

static int hir__exec_p2p(hir_evaluator *ev, const hir_expr *e) {
  const hir_tensor *t = e->sub == HIR_P2P_SEND ? hir__get(ev, e->in[0], e) : hir__bind_out(ev, e->in[0]);
  int64_t peer = hir__eval_val(&ev->env, e->val);
  size_t bytes;
  hir_status s;
  if (!t) return 0;
  if (!hir__is_contiguous(t)) /* a receive completes later, in another call: no staging */
    return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: %s %d moves T%d, a strided view; send/recv need contiguous "
                        "buffers (slice the outermost axis)", hir__ops[e->kind].name, e->name, e->in[0]->name);
  bytes = (size_t)hir__numel(t->ndims, t->sizes) * hir_dtype_size(t->dtype);
  hir__comm_what(ev, e->in[0], t);
  ev->started_comm = 1;
  if (e->sub == HIR_P2P_RECV) { /* its buffer, if nothing touched it yet, free from the replay's start */
    ev->comm->recv_at_start = ev->capturing && ev->comm->start_signals_take && hir__untouched(ev, t);
    hir__touch(ev, t);
  }
  s = e->sub == HIR_P2P_SEND ? ev->comm->send(ev->comm, t->data, bytes, (int)peer, ev->current)
                             : ev->comm->recv(ev->comm, t->data, bytes, (int)peer, ev->current);
  ev->comm->recv_at_start = 0;
  if (!hir__ev_comm(ev, s, e)) return 0;
  return hir__ev_backend(ev, ev->b->event_record(ev->b, ev->done[e->name], ev->current), e);
}

/* CollectivePermute: a send and a receive in one group (inside an open
   StartCoalescing, part of that group); to itself, a copy. */
static int hir__exec_permute(hir_evaluator *ev, const hir_expr *e) {
  const hir_tensor *src, *dst;
  int64_t to = hir__eval_val(&ev->env, e->val), from = hir__eval_val(&ev->env, e->recv_peer);
  size_t bytes;
  hir_status s, end;
  if (hir_team_index(e->team, e->team_size, ev->device) < 0) return 1; /* not in its team */
  if (!(src = hir__get(ev, e->in[0], e)) || !(dst = hir__get_out(ev, e->out[0]))) return 0;
  if (to < 0 || to >= ev->comm->size || from < 0 || from >= ev->comm->size ||
      hir_team_index(e->team, e->team_size, (int)to) < 0 || hir_team_index(e->team, e->team_size, (int)from) < 0)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: CollectivePermute %d on device %d sends to %lld and receives from %lld; "
                        "both peers must be in its team", e->name, ev->device, (long long)to, (long long)from);
  if (to == ev->device && from == ev->device)
    return hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, dst, src), e) &&
           hir__ev_backend(ev, ev->b->event_record(ev->b, ev->done[e->name], ev->current), e);
  if (!hir__is_contiguous(src) || !hir__is_contiguous(dst))
    return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: CollectivePermute %d moves T%d into T%d, one of them a strided view; "
                        "send/recv need contiguous buffers (slice the outermost axis)", e->name, e->in[0]->name,
                        e->out[0]->name);
  bytes = (size_t)hir__numel(src->ndims, src->sizes) * hir_dtype_size(src->dtype);
  hir__comm_what(ev, e->in[0], src);
  ev->started_comm = 1;
  if (!hir__ev_comm(ev, ev->comm->group_start(ev->comm), e)) return 0;
  if ((s = ev->comm->send(ev->comm, src->data, bytes, (int)to, ev->current)) == HIR_OK)
    s = ev->comm->recv(ev->comm, dst->data, bytes, (int)from, ev->current);
  end = ev->comm->group_end(ev->comm);
  if (!hir__ev_comm(ev, s != HIR_OK ? s : end, e)) return 0;
  return hir__ev_backend(ev, ev->b->event_record(ev->b, ev->done[e->name], ev->current), e);
}

/* HirAliasSelect (index `i` of the axis, which goes) or HirAliasSlice (part
   `i` of `parts`, the axis kept): pointer arithmetic on the source. */
static int hir__exec_view(hir_evaluator *ev, const hir_expr *e) {
  const hir_tensor *src;
  if (!hir__in_mesh(e->in[0], ev->device)) return 1; /* nothing of it here: its view is not here either */
  src = hir__peek(ev, e->in[0], e);
  hir_tensor *view = &ev->slot[e->out[0]->name];
  int a = hir__data_index(e->in[0], e->axis), k;
  int64_t i = hir__eval_val(&ev->env, e->val), len;
  if (!src) return 0;
  len = e->parts ? src->sizes[a] / e->parts : 1;
  if (i < 0 || i >= (e->parts ? e->parts : src->sizes[a])) {
    if (e->parts)
      return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: HirAliasSlice %d: part %lld of T%d does not exist; it has %d parts",
                          e->name, (long long)i, e->in[0]->name, e->parts);
    return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: HirAliasSelect %d: index %lld is outside T%d's axis %d of size %lld",
                        e->name, (long long)i, e->in[0]->name, e->axis, (long long)src->sizes[a]);
  }
  *view = *src;
  view->data = (char *)src->data + i * len * src->strides[a] * (int64_t)hir_dtype_size(src->dtype);
  if (e->parts) {
    view->sizes[a] = len;
  } else {
    for (k = a; k + 1 < src->ndims; k++) {
      view->sizes[k] = src->sizes[k + 1];
      view->strides[k] = src->strides[k + 1];
    }
    view->ndims = src->ndims - 1;
  }
  ev->bound[e->out[0]->name] = 1;
  ev->slot_block[e->out[0]->name] = -1;
  return 1;
}

static int hir__exec(hir_evaluator *ev, const hir_expr *e) {
  hir_backend *b = ev->b;
  void *evt;
  switch (e->kind) {
  case HIR_EXPR_ALLOCATE:
    return ev->bound[e->in[0]->name] || !hir__in_mesh(e->in[0], ev->device) || hir__bind_new(ev, e->in[0]);
  case HIR_EXPR_DEALLOCATE:
    hir__unbind(ev, e->in[0]);
    return 1;
  case HIR_EXPR_GET_CURRENT_STREAM:
    ev->vars[e->stream->name] = ev->current;
    return 1;
  case HIR_EXPR_SET_CURRENT_STREAM:
    return hir__resolve_stream(ev, e->stream, &ev->current, &evt, &ev->current_track);
  case HIR_EXPR_SYNCHRONIZE: return hir__exec_synchronize(ev, e);
  case HIR_EXPR_FOR_LOOP: return hir__exec_for(ev, e);
  case HIR_EXPR_IF_THEN_ELSE: return hir__exec_scope(ev, hir__eval_val(&ev->env, e->val) ? &e->body : &e->orelse);
  case HIR_EXPR_POST_ON_STREAM: return hir__exec_post(ev, e);
  case HIR_EXPR_COMMUNICATION:
    return !ev->team[e->name] || hir__exec_comm(ev, e); /* no team handle: this rank is not in it */
  case HIR_EXPR_P2P_COMMUNICATION: return hir__exec_p2p(ev, e);
  case HIR_EXPR_COLLECTIVE_PERMUTE: return hir__exec_permute(ev, e);
  case HIR_EXPR_MOE_DISPATCH:
  case HIR_EXPR_MOE_COMBINE: return hir__exec_moe(ev, e);
  case HIR_EXPR_START_COALESCING:
    return hir__ev_comm(ev, ev->comm->group_start(ev->comm), e);
  case HIR_EXPR_END_COALESCING:
    if (!hir__ev_comm(ev, ev->comm->group_end(ev->comm), e)) return 0;
    return hir__ev_backend(ev, b->event_record(b, ev->done[e->name], ev->current), e);
  case HIR_EXPR_WAIT: /* the current stream waits for the communication; no host block */
    return hir__ev_backend(ev, b->stream_wait_event(b, ev->current, ev->done[e->target->name]), e);
  case HIR_EXPR_ALIAS_SELECT:
  case HIR_EXPR_ALIAS_SLICE: return hir__exec_view(ev, e);
  default:
    return hir__exec_compute(ev, e);
  }
}

enum { HIR__TIMELINE_CAP = 1 << 16, HIR__GPU_TIMELINE_CAP = 1 << 13 };

static void hir__note_span(hir_evaluator *ev, const hir_expr *e, int track, double t0) {
  hir__span *sp;
  if (ev->nspans == HIR__TIMELINE_CAP) return; /* full: the run goes on unrecorded */
  sp = &ev->spans[ev->nspans++];
  sp->e = e;
  sp->track = track;
  sp->t0 = t0;
  sp->t1 = hir__now_ms() * 1e3;
}

/* Inside StartCoalescing .. EndCoalescing nothing reaches a stream until the
   end, so only EndCoalescing gets a GPU span. */
static hir__span *hir__gpu_span_begin(hir_evaluator *ev, const hir_expr *e) {
  hir__span *sp;
  if (e->kind == HIR_EXPR_END_COALESCING) ev->in_group = 0;
  else if (e->kind == HIR_EXPR_START_COALESCING) ev->in_group = 1;
  if (!(hir__ops[e->kind].flags & HIR__OP_ON_STREAM) || ev->in_group || ev->ngpu_spans == HIR__GPU_TIMELINE_CAP) return NULL;
  sp = &ev->gpu_spans[ev->ngpu_spans];
  sp->e = e;
  sp->track = ev->current_track;
  return hir__ev_backend(ev, ev->b->event_record(ev->b, sp->start, ev->current), e) ? sp : NULL;
}

/* Whether tv is one of the program's outputs. */
static int hir__is_output(const hir_program *p, const hir_tv *tv) {
  int i;
  for (i = 0; i < p->ir.outputs.n; i++)
    if (p->ir.outputs.items[i] == (const void *)tv) return 1;
  return 0;
}

/* How many exprs of the program name tv (reads and writes; Allocate and
   Deallocate do not count). */
static int hir__mentions(const hir_scope *s, const hir_tv *tv) {
  int i, k, n = 0;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    if (!(hir__ops[e->kind].flags & HIR__OP_BUFFER)) {
      for (k = 0; k < e->nin; k++) n += e->in[k] == tv;
      for (k = 0; k < e->nout; k++) n += e->out[k] == tv;
    }
    n += hir__mentions(&e->body, tv) + hir__mentions(&e->orelse, tv);
  }
  return n;
}

/* The exprs a scope's expr runs: a PostOnStream its unit's, others themselves. */
static int hir__unit_size(const hir_expr *e) { return e->kind == HIR_EXPR_POST_ON_STREAM ? e->unit->exprs.n : 1; }
static const hir_expr *hir__unit_at(const hir_expr *e, int k) {
  return e->kind == HIR_EXPR_POST_ON_STREAM ? (const hir_expr *)e->unit->exprs.items[k] : e;
}

/* How many exprs of composite c the scope runs, units and bodies included. */
static int hir__composite_count(const hir_scope *s, int c) {
  int i, k, n = 0;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    for (k = 0; k < hir__unit_size(e); k++) n += hir__unit_at(e, k)->composite == c;
    n += hir__composite_count(&e->body, c) + hir__composite_count(&e->orelse, c);
  }
  return n;
}

/* Whether an expr of composite c among s's exprs from..to wrote t. */
static int hir__composite_made(const hir_scope *s, int from, int to, int c, const hir_tv *t) {
  int i, k;
  for (i = from; i <= to; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    for (k = 0; k < hir__unit_size(e); k++)
      if (hir__unit_at(e, k)->composite == c && hir__unit_at(e, k)->out[0] == t) return 1;
  }
  return 0;
}

/* The run of composite c starting at s's expr `from`: its last expr's
   index, or -1 where it is not whole and alone - every one of c's exprs,
   in one scope, nothing else between them but Deallocates and Allocates of
   their own tensors, and none of their tensors but the last read or kept
   elsewhere (nothing else may see the primitives skipped). */
static int hir__composite_run(const hir_program *p, const hir_scope *s, int from, int c) {
  int i, k, mine = 0, end = -1;
  for (i = from; i < s->exprs.n && end < 0; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    if (hir__ops[e->kind].flags & HIR__OP_BUFFER) continue;
    for (k = 0; k < hir__unit_size(e); k++) {
      const hir_expr *u = hir__unit_at(e, k);
      if (u->composite != c) return -1;
      mine++;
      if (u->composite_role == HIR__ROLE_OUT) end = i;
    }
  }
  if (end < 0 || mine != hir__composite_count(&p->top, c)) return -1;
  for (i = from; i <= end; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    if (e->kind == HIR_EXPR_ALLOCATE && !hir__composite_made(s, from, end, c, e->in[0])) return -1;
    for (k = 0; k < hir__unit_size(e); k++) {
      const hir_tv *t = hir__unit_at(e, k)->out ? hir__unit_at(e, k)->out[0] : NULL;
      int q, inside = 0;
      if ((hir__ops[e->kind].flags & HIR__OP_BUFFER) || hir__unit_at(e, k)->composite_role == HIR__ROLE_OUT)
        continue;
      if (hir__is_output(p, t)) return -1;
      for (q = from; q <= end; q++) { /* mentions in the run: its scope's exprs (a unit's ins and outs) */
        const hir_expr *x = (const hir_expr *)s->exprs.items[q];
        int m;
        if (hir__ops[x->kind].flags & HIR__OP_BUFFER) continue;
        for (m = 0; m < x->nin; m++) inside += x->in[m] == t;
        for (m = 0; m < x->nout; m++) inside += x->out[m] == t;
      }
      if (hir__mentions(&p->top, t) != inside) return -1;
    }
  }
  return end;
}

/* A composite's run whose primitives a backend call replaces, described
   once when the evaluator is made (hir__find_fused): what the call reads and
   writes, and how many of its scope's exprs it stands for. */
typedef struct hir__fused_run {
  const hir_expr *x;               /* the expr reading x (its input 0); NULL: no run starts here */
  const hir_tv *weight, *bias, *out;
  const hir_expr *allreduce, *add; /* a run from an Allreduce whose sum `add` adds to `residual`, giving the
                                      rms_norm's x (hir_comm.allreduce_rms_norm); NULL: the norm alone */
  const hir_tv *residual;
  int center;                      /* 1: layer_norm (the mean taken out); 0: rms_norm */
  int span;                        /* the run's exprs after its first, Deallocates and Allocates included */
  int nred;                        /* the normalized axes: x's last */
  double eps;
} hir__fused_run;

/* The run of composite c from s's expr `from` to `end` (hir__composite_run),
   described. */
static void hir__describe_run(const hir_scope *s, int from, int end, hir__fused_run *run) {
  int i, k, m;
  memset(run, 0, sizeof *run);
  run->span = end - from;
  for (i = from; i <= end; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    if (hir__ops[e->kind].flags & HIR__OP_BUFFER) continue;
    for (k = 0; k < hir__unit_size(e); k++) {
      const hir_expr *u = hir__unit_at(e, k);
      if (u->composite_role == HIR__ROLE_X) run->x = u;
      if (u->composite_role == HIR__ROLE_EPS) run->eps = u->scalar;
      if (u->composite_role == HIR__ROLE_OUT) run->out = u->out[0];
      if (u->composite_role == HIR__ROLE_CENTER) run->center = 1;
      if (u->kind == HIR_EXPR_REDUCTION && !run->nred) /* the first mean's sum: the normalized axes, x's last */
        for (m = u->out[0]->ndims - 1; m >= 0 && u->out[0]->ids[m]->iter == HIR_REDUCTION; m--) run->nred++;
      if (u->composite_role == HIR__ROLE_WEIGHT || u->composite_role == HIR__ROLE_BIAS)
        for (m = 0; m < u->nin; m++) /* the operand from outside the run */
          if (!hir__composite_made(s, from, end, u->composite, u->in[m])) {
            *(u->composite_role == HIR__ROLE_WEIGHT ? &run->weight : &run->bias) = u->in[m];
            break;
          }
    }
  }
}

/* An Allreduce, its residual add and an rms_norm from s's expr *at as one
   call of the communicator (hir__find_allreduce_norm), on dense copies
   where the views are not, then the run's Deallocates; *at moves to its
   last expr. Where the communicator declines, the Allreduce runs as usual
   (the rest follow). */
static int hir__exec_allreduce_norm(hir_evaluator *ev, const hir_scope *s, int *at) {
  const hir_expr *e = (const hir_expr *)s->exprs.items[*at];
  const hir__fused_run *run = &ev->fused[e->name];
  const hir_tensor *t[5];
  hir_tensor d[5];
  const hir_expr *slot_of[5];
  int64_t cols = 1, rows;
  int k;
  hir_status st;
  slot_of[0] = e, slot_of[1] = run->add, slot_of[2] = run->x, slot_of[3] = run->add, slot_of[4] = run->x;
  if (!(t[0] = hir__get(ev, e->in[0], e)) || !(t[1] = hir__get(ev, run->residual, run->add)) ||
      (run->weight && !(t[2] = hir__get(ev, run->weight, run->x))) || !(t[3] = hir__get_out(ev, run->add->out[0])) ||
      !(t[4] = hir__get_out(ev, run->out)))
    return 0;
  if (!run->weight) t[2] = NULL;
  for (k = t[3]->ndims - run->nred; k < t[3]->ndims && k >= 0; k++) cols *= t[3]->sizes[k];
  rows = cols ? hir__numel(t[3]->ndims, t[3]->sizes) / cols : 0;
  for (k = 0; k < 5; k++) /* one shape: the program's (every rank's alike); else the three apart */
    if (t[k] && hir__numel(t[k]->ndims, t[k]->sizes) != (k == 2 ? cols : rows * cols)) return hir__exec(ev, e);
  for (k = 0; k < 5; k++) /* staged through the slots of exprs the call stands for (the sizes match: the program checked them) */
    if (t[k] && !hir__contiguous_buffer(ev, t[k], slot_of[k], k < 3, &d[k])) return 0;
  ev->started_comm = 1;
  hir__comm_what(ev, e->in[0], t[0]);
  st = ev->comm->allreduce_rms_norm(ev->comm, ev->team[e->name], d[0].data, d[1].data, t[2] ? d[2].data : NULL, d[3].data, d[4].data,
                                    (size_t)rows, (size_t)cols, t[3]->dtype, run->eps, ev->current);
  if (st == HIR_ERR_UNSUPPORTED) return hir__exec(ev, e);
  if (!hir__ev_comm(ev, st, e) || !hir__ev_backend(ev, ev->b->event_record(ev->b, ev->done[e->name], ev->current), e)) return 0;
  for (k = 3; k < 5; k++)
    if (d[k].data != t[k]->data && !hir__ev_backend(ev, ev->b->copy(ev->b, ev->current, t[k], &d[k]), e)) return 0;
  for (k = *at + 1; k <= *at + run->span; k++)
    if (((const hir_expr *)s->exprs.items[k])->kind == HIR_EXPR_DEALLOCATE && !hir__exec(ev, (const hir_expr *)s->exprs.items[k]))
      return 0;
  *at += run->span;
  return 1;
}

/* A composite's run from s's expr *at (hir__find_fused): one backend call
   on the views its primitives would read and write, then the run's
   Deallocates; *at moves to its last expr. Where the views are not dense,
   or the backend declines, the first expr runs as usual (the rest follow). */
static int hir__exec_fused(hir_evaluator *ev, const hir_scope *s, int *at) {
  const hir_expr *first = (const hir_expr *)s->exprs.items[*at];
  const hir__fused_run *run = &ev->fused[first->name];
  const hir_tensor *xv, *ov, *w = NULL, *bias = NULL;
  int i, k, dense;
  int64_t cols = 1;
  hir_status st = HIR_ERR_UNSUPPORTED;
  if (run->allreduce) return hir__exec_allreduce_norm(ev, s, at);
  if (!(xv = hir__get(ev, run->x->in[0], run->x)) || !(ov = hir__get_out(ev, run->out)) ||
      (run->weight && !(w = hir__get(ev, run->weight, run->x))) || (run->bias && !(bias = hir__get(ev, run->bias, run->x))))
    return 0;
  for (k = xv->ndims - run->nred; k < xv->ndims && k >= 0; k++) cols *= xv->sizes[k];
  dense = run->nred > 0 && run->nred <= xv->ndims && hir__is_contiguous(xv) && hir__is_contiguous(ov) && ov->ndims == xv->ndims &&
          !memcmp(ov->sizes, xv->sizes, (size_t)xv->ndims * sizeof(int64_t));
  dense = dense && (!w || (hir__is_contiguous(w) && hir__numel(w->ndims, w->sizes) == cols));
  dense = dense && (!bias || (hir__is_contiguous(bias) && hir__numel(bias->ndims, bias->sizes) == cols));
  if (dense)
    st = run->center ? ev->b->layer_norm(ev->b, ev->current, ov, xv, w, bias, run->nred, run->eps)
                     : ev->b->rms_norm(ev->b, ev->current, ov, xv, w, run->nred, run->eps);
  if (!dense || st == HIR_ERR_UNSUPPORTED) return hir__exec(ev, first);
  if (!hir__ev_backend(ev, st, first)) return 0;
  for (i = *at + 1; i < *at + run->span; i++)
    if (((const hir_expr *)s->exprs.items[i])->kind == HIR_EXPR_DEALLOCATE && !hir__exec(ev, (const hir_expr *)s->exprs.items[i]))
      return 0;
  *at += run->span;
  return 1;
}

static int hir__exec_scope(hir_evaluator *ev, const hir_scope *s) {
  int i;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    int track = ev->current_track; /* the stream it runs on, before it switches */
    double t0 = ev->recording ? hir__now_ms() * 1e3 : 0;
    hir__span *gpu = NULL;
    int ok;
    if (ev->recording && ev->gpu_spans && !(gpu = hir__gpu_span_begin(ev, e)) && ev->status != HIR_OK) return 0;
    HIR__RANGE_PUSH(!ev->fused[e->name].x ? hir__ops[e->kind].name : ev->fused[e->name].allreduce ? "AllreduceRMSNorm"
                    : ev->fused[e->name].center ? "LayerNorm" : "RMSNorm");
    ok = ev->fused[e->name].x ? hir__exec_fused(ev, s, &i) : hir__exec(ev, e);
    HIR__RANGE_POP();
    if (!ok) return 0;
    if (gpu) {
      if (!hir__ev_backend(ev, ev->b->event_record(ev->b, gpu->end, ev->current), e)) return 0;
      ev->ngpu_spans++;
    }
    if (ev->recording && !(hir__ops[e->kind].flags & HIR__OP_SCOPED)) hir__note_span(ev, e, track, t0);
  }
  return 1;
}

// >>eval_create
/* The devices of a fusion's meshes, ascending, into *devices (allocated,
   with room for one more; NULL when out of memory): who runs it together.
   Returns how many. */
static int hir__fusion_devices(const hir_fusion *f, int **devices) {
  int i, k, n = 0, room = 1;
  for (i = 0; i < f->tvs.n; i++) room += ((const hir_tv *)f->tvs.items[i])->mesh_size;
  if (!(*devices = (int *)HIR_MALLOC((size_t)room * sizeof(int)))) return 0;
  for (i = 0; i < f->tvs.n; i++) {
    const hir_tv *tv = (const hir_tv *)f->tvs.items[i];
    for (k = 0; k < tv->mesh_size; k++) {
      int at = n, dev = tv->mesh[k];
      if (hir_team_index(*devices, n, dev) >= 0) continue;
      while (at > 0 && (*devices)[at - 1] > dev) (*devices)[at] = (*devices)[at - 1], at--;
      (*devices)[at] = dev;
      n++;
    }
  }
  return n;
}

static int hir__setup_expr(hir_evaluator *ev, const hir_expr *e) {
  hir_status s;
  if (hir__ops[e->kind].flags & HIR__OP_COMM) {
    int i;
    if (!ev->comm)
      return hir__ev_fail(ev, HIR_ERR_INVALID,
                          "hir_evaluator_create: the program communicates (%s %d); give a communicator in hir_eval_desc.comm",
                          hir__ops[e->kind].name, e->name);
    for (i = 0; (hir__ops[e->kind].flags & HIR__OP_TEAM) && i < e->team_size; i++)
      if (e->team[i] >= ev->comm->size)
        return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_evaluator_create: %s %d names device %d, outside the world of %d ranks",
                            hir__ops[e->kind].name, e->name, e->team[i], ev->comm->size);
  }
  if (e->kind == HIR_EXPR_COMMUNICATION) {
    if (hir_team_index(e->team, e->team_size, ev->device) >= 0 &&
        (s = ev->comm->team(ev->comm, e->team, e->team_size, &ev->team[e->name])) != HIR_OK)
      return hir__ev_fail(ev, s, "hir_evaluator_create: the team of Communication %d: %s", e->name, ev->comm->error);
  }
  if (hir__ops[e->kind].flags & HIR__OP_WAITABLE) {
    if ((s = ev->b->event_create(ev->b, &ev->done[e->name])) != HIR_OK)
      return hir__ev_fail(ev, s, "hir_evaluator_create: creating an event: %s", ev->b->error);
  }
  return 1;
}

static hir_evaluator *hir__evaluator_new(void) {
  hir_evaluator *ev = (hir_evaluator *)HIR_MALLOC(sizeof(hir_evaluator));
  if (!ev) return NULL;
  memset(ev, 0, sizeof *ev);
  return ev;
}

static hir_status hir__evaluator_create(hir_evaluator *ev, const hir_program *p, const hir_eval_desc *d);

/* A linear with a bias whose output only the next op reads, a relu or
   gelu_tanh into the same dtype: that op goes into the linear's epilogue
   (cuBLASLt's RELU_BIAS / GELU_BIAS on the CUDA backend; elsewhere applied
   in place), the linear writing the op's output and its own never made.
   The plan says so. */
static void hir__find_epilogues(hir_evaluator *ev, const hir_scope *s) {
  hir_program *p = (hir_program *)ev->p; /* the plan is the program's note to its reader */
  int i;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i], *u = i + 1 < s->exprs.n ? (const hir_expr *)s->exprs.items[i + 1] : NULL;
    hir__find_epilogues(ev, &e->body);
    hir__find_epilogues(ev, &e->orelse);
    if (e->kind != HIR_EXPR_MATMUL || !(e->flags & HIR__MATMUL_LINEAR) || e->nin != 3 || !u || u->kind != HIR_EXPR_UNARY ||
        (u->sub != HIR_UNARY_RELU && u->sub != HIR_UNARY_GELU_TANH) || u->val || u->in[0] != e->out[0] ||
        u->out[0]->dtype != e->out[0]->dtype)
      continue;
    if (hir__is_output(p, e->out[0]) || hir__mentions(&p->top, e->out[0]) != 2) continue;
    ev->epilogue[e->name] = u;
    ev->epilogue[u->name] = e;
    if (!strstr(p->plan, "epilogue")) {
      size_t n = strlen(p->plan);
      snprintf(p->plan + n, sizeof p->plan - n, "%sepilogue: MatmulOp %d takes UnaryOp %d (%s)", n ? "; " : "", e->name, u->name,
               hir__unary_names[u->sub]);
    }
  }
}

/* Composites (hir_layer_norm's and hir_rms_norm's primitives) the backend
   runs in one call (hir_backend.layer_norm, rms_norm), where their run is whole and alone
   (hir__composite_run): the first expr's entry describes the run. Elsewhere
   (a normalized axis sharded, say: a collective among them) the
   primitives run. The plan says so. */
static void hir__find_fused(hir_evaluator *ev, const hir_scope *s) {
  hir_program *p = (hir_program *)ev->p; /* the plan is the program's note to its reader */
  hir__fused_run run;
  int i, k, end;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i], *x = NULL;
    hir__find_fused(ev, &e->body);
    hir__find_fused(ev, &e->orelse);
    for (k = 0; k < hir__unit_size(e); k++)
      if (hir__unit_at(e, k)->composite_role == HIR__ROLE_X) x = hir__unit_at(e, k);
    if (!x || (end = hir__composite_run(p, s, i, x->composite)) < 0) continue;
    hir__describe_run(s, i, end, &run);
    if (!(run.center ? ev->b->layer_norm != NULL : ev->b->rms_norm != NULL)) continue;
    ev->fused[e->name] = run;
    if (!strstr(p->plan, "fused:")) {
      size_t n = strlen(p->plan);
      snprintf(p->plan + n, sizeof p->plan - n, "%sfused: the %s of T%d in one call (%s)", n ? "; " : "",
               run.center ? "layer_norm" : "rms_norm", x->in[0]->name, ev->b->name);
    }
    i = end;
  }
}

/* An Allreduce whose sum only an add reads, with a residual of its dtype,
   the add's output then the x of an rms_norm the backend runs in one call
   (hir__find_fused), nothing but a Wait and Deallocates between: the
   communicator runs the three in one call where it offers to
   (hir_comm.allreduce_rms_norm), the entry of the Allreduce describing
   them. The plan says so. */
static void hir__find_allreduce_norm(hir_evaluator *ev, const hir_scope *s) {
  hir_program *p = (hir_program *)ev->p; /* the plan is the program's note to its reader */
  int i, j, k, alike;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i], *u = NULL;
    const hir__fused_run *norm;
    const hir_tv *y;
    hir__fused_run *run;
    hir__find_allreduce_norm(ev, &e->body);
    hir__find_allreduce_norm(ev, &e->orelse);
    if (!ev->comm || !ev->comm->allreduce_rms_norm || e->kind != HIR_EXPR_COMMUNICATION || e->sub != HIR_COLL_ALLREDUCE ||
        !ev->team[e->name])
      continue;
    y = e->out[0];
    for (j = i + 1; j < s->exprs.n; j++) { /* past the Wait and Deallocates, the add */
      const hir_expr *n = (const hir_expr *)s->exprs.items[j];
      if (n->kind == HIR_EXPR_DEALLOCATE || (n->kind == HIR_EXPR_WAIT && n->target == e)) continue;
      if (n->kind == HIR_EXPR_BINARY && n->sub == HIR_BINARY_ADD && (n->in[0] == y) != (n->in[1] == y) &&
          n->in[n->in[0] == y]->dtype == y->dtype && n->out[0]->dtype == y->dtype)
        u = n;
      break;
    }
    for (k = j + 1; u && k < s->exprs.n && ((const hir_expr *)s->exprs.items[k])->kind == HIR_EXPR_DEALLOCATE; k++) {}
    if (!u || k >= s->exprs.n) continue;
    norm = &ev->fused[((const hir_expr *)s->exprs.items[k])->name]; /* an rms_norm of the add's output, alone */
    if (!norm->x || norm->center || norm->allreduce || norm->x->in[0] != u->out[0] || hir__mentions(&p->top, y) != 2 ||
        hir__is_output(p, y))
      continue;
    run = &ev->fused[e->name];
    *run = *norm;
    run->allreduce = e, run->add = u, run->residual = u->in[u->in[0] == y];
    for (j = 0, alike = !run->weight || run->weight->dtype == y->dtype; alike && j < e->team_size; j++) /* every member decides so */
      alike = hir__in_mesh(u->out[0], e->team[j]) && hir__in_mesh(run->out, e->team[j]) && hir__in_mesh(run->residual, e->team[j]) &&
              (!run->weight || hir__in_mesh(run->weight, e->team[j]));
    if (!alike) {
      memset(run, 0, sizeof *run);
      continue;
    }
    run->span += k - i;
    if (!strstr(p->plan, "the rms_norm after it")) { /* the first such run, as the other fusions' notes */
      size_t n = strlen(p->plan);
      snprintf(p->plan + n, sizeof p->plan - n, "%sfused: %s %d, the add of T%d and the rms_norm after it in one call of the "
               "communicator where it takes them", n ? "; " : "", hir__ops[e->kind].name, e->name, run->residual->name);
    }
    i += run->span;
  }
}

HIRDEF hir_status hir_evaluator_create(const hir_program *p, const hir_eval_desc *given, hir_evaluator **out) {
  hir_eval_desc filled = hir__eval_desc_filled(given), *d = &filled;
  hir_evaluator *ev;
  if (!out) return HIR_ERR_INVALID;
  if (!(ev = *out = hir__evaluator_new())) return HIR_ERR_NOMEM;
  if (hir__evaluator_create(ev, p, d) == HIR_OK) return HIR_OK;
  if (!ev->comm && p && d->comm && p->ir.status == HIR_OK) { /* it failed before taking the communicator: tell the world */
    ev->comm = d->comm;
    ev->communicates = hir__communicates(&p->top, 1) || p->my_device >= 0; /* a lowered program's ranks compare shapes */
  }
  return hir__tell_world(ev);
}

static hir_status hir__evaluator_create(hir_evaluator *ev, const hir_program *p, const hir_eval_desc *d) {
  char msg[sizeof ev->error];
  int i, ok;
  if (!p) return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_evaluator_create: the program is NULL"), ev->status;
  ev->p = p;
  if (p->ir.status != HIR_OK)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_evaluator_create: the program has an error: %s", p->ir.error), ev->status;
  if (!hir__verify(p, msg, sizeof msg))
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_evaluator_create: the program is malformed: %s", msg), ev->status;
  if (d->number_of_streams < 0)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_evaluator_create: number_of_streams is %d; give 1 or more (0: 4)",
                        d->number_of_streams), ev->status;
  ev->nstreams = d->number_of_streams;
  ev->timeout_ms = d->timeout_ms;
  if ((unsigned)d->graph > (unsigned)HIR_GRAPH_STAGED)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_evaluator_create: graph is %d; give HIR_GRAPH_OFF, HIR_GRAPH_BY_ADDRESS or "
                        "HIR_GRAPH_STAGED", (int)d->graph), ev->status;
  ev->staged = d->graph == HIR_GRAPH_STAGED;
  if ((ev->graph = d->graph != HIR_GRAPH_OFF) && !(ev->graphs = (hir__graph *)HIR_MALLOC(HIR__GRAPHS * sizeof *ev->graphs)))
    return hir__ev_fail(ev, HIR_ERR_NOMEM, "hir_evaluator_create: out of memory"), ev->status;
  if (ev->graphs) memset(ev->graphs, 0, HIR__GRAPHS * sizeof *ev->graphs);
  if (ev->graph && !(ev->warm_dense = (unsigned char *)HIR_MALLOC((size_t)(p->ir.inputs.n + p->ir.outputs.n + 1))))
    return hir__ev_fail(ev, HIR_ERR_NOMEM, "hir_evaluator_create: out of memory"), ev->status;
  ev->env.named[HIR_NAMED_NUM_STREAMS] = ev->nstreams;
  ev->comm = d->comm;
  ev->communicates = hir__communicates(&p->top, 1);
  ev->comm_ops = hir__communicates(&p->top, 0);
  ev->check_shapes = d->check_shapes != 0;
  ev->device = d->comm ? d->comm->rank : p->my_device > 0 ? p->my_device : 0;
  ev->env.named[HIR_NAMED_RANK] = ev->device;
  for (i = 0; d->comm && i < p->ir.tvs.n; i++) {
    const hir_tv *tv = (const hir_tv *)p->ir.tvs.items[i];
    int k;
    for (k = 0; k < tv->mesh_size; k++)
      if (tv->mesh[k] >= d->comm->size)
        return hir__ev_fail(ev, HIR_ERR_INVALID,
                            "hir_evaluator_create: T%d lives on device %d, outside the world of %d ranks; give meshes of "
                            "devices 0 to %d, or a larger world", tv->name, tv->mesh[k], d->comm->size, d->comm->size - 1),
             ev->status;
  }
  if (d->comm && p->my_device >= 0 && d->comm->rank != p->my_device)
    return hir__ev_fail(ev, HIR_ERR_INVALID,
                        "hir_evaluator_create: the program was lowered for device %d but the communicator is rank %d",
                        p->my_device, d->comm->rank), ev->status;
  ev->b = d->backend;
  if (!ev->b) {
    if (!(ev->b = hir_backend_cpu_create())) return hir__ev_fail(ev, HIR_ERR_NOMEM, "hir_evaluator_create: out of memory"), ev->status;
    ev->owns_backend = 1;
  }
  if (d->comm && d->comm->needs_device_memory && ev->b->host_memory)
    return hir__ev_fail(ev, HIR_ERR_INVALID,
                        "hir_evaluator_create: the communicator moves device memory but the %s backend holds host memory; "
                        "give hir_eval_desc.backend = hir_backend_cuda_create(device) (an implementation compiled with "
                        "HOSTIR_CUDA)", ev->b->name), ev->status;
  ev->ntv = p->ir.next_tv;
  ev->nval = p->ir.next_val;
  ev->nexpr = p->ir.next_expr;
  ev->nvars = p->next_stream;
  ev->cap_blocks = ev->ntv + 1;
  ev->key_n = p->ir.inputs.n * (HIR_MAX_DIMS + 1);
  ok = (ev->pool = (void **)HIR_MALLOC((size_t)ev->nstreams * sizeof(void *))) != NULL;
  ok = ok && (ev->pool_ev = (void **)HIR_MALLOC((size_t)ev->nstreams * sizeof(void *))) != NULL;
  ok = ok && (ev->vars = (void **)HIR_MALLOC(((size_t)ev->nvars + 1) * sizeof(void *))) != NULL;
  ok = ok && (ev->vars_ev = (void **)HIR_MALLOC(((size_t)ev->nvars + 1) * sizeof(void *))) != NULL;
  ok = ok && (ev->team = (void **)HIR_MALLOC(((size_t)ev->nexpr + 1) * sizeof(void *))) != NULL;
  ok = ok && (ev->done = (void **)HIR_MALLOC(((size_t)ev->nexpr + 1) * sizeof(void *))) != NULL;
  ok = ok && (ev->epilogue = (const hir_expr **)HIR_MALLOC(((size_t)ev->nexpr + 1) * sizeof(void *))) != NULL;
  ok = ok && (ev->fused = (hir__fused_run *)HIR_MALLOC(((size_t)ev->nexpr + 1) * sizeof *ev->fused)) != NULL;
  ok = ok && (ev->env.sym = (int64_t *)HIR_MALLOC(((size_t)ev->nval + 1) * sizeof(int64_t))) != NULL;
  ok = ok && (ev->env.sym_bound = (unsigned char *)HIR_MALLOC((size_t)ev->nval + 1)) != NULL;
  ok = ok && (ev->slot = (hir_tensor *)HIR_MALLOC(((size_t)ev->ntv + 1) * sizeof(hir_tensor))) != NULL;
  ok = ok && (ev->slot_block = (int *)HIR_MALLOC(((size_t)ev->ntv + 1) * sizeof(int))) != NULL;
  ok = ok && (ev->into = (hir__into *)HIR_MALLOC(((size_t)ev->ntv + 1) * sizeof *ev->into)) != NULL;
  ok = ok && (ev->bound = (unsigned char *)HIR_MALLOC((size_t)ev->ntv + 1)) != NULL;
  ok = ok && (ev->shape = (hir__shape *)HIR_MALLOC(((size_t)ev->ntv + 1) * sizeof(hir__shape))) != NULL;
  ok = ok && (ev->blocks = (hir__block *)HIR_MALLOC((size_t)ev->cap_blocks * sizeof(hir__block))) != NULL;
  ok = ok && (ev->key = (int64_t *)HIR_MALLOC(((size_t)ev->key_n + 1) * sizeof(int64_t))) != NULL;
  ok = ok && (ev->boundary = (hir_tensor *)HIR_MALLOC(((size_t)(p->ir.inputs.n + p->ir.outputs.n) + 1) * sizeof(hir_tensor))) != NULL;
  ok = ok && (ev->reached = (const void **)HIR_MALLOC(((size_t)(p->ir.inputs.n + p->ir.outputs.n) + 1) * sizeof(void *))) != NULL;
  ok = ok && (!ev->comm_ops || (ev->staging = (hir__staging *)HIR_MALLOC((size_t)hir__staging_n(ev) * sizeof *ev->staging)));
  if (!ok) return hir__ev_fail(ev, HIR_ERR_NOMEM, "hir_evaluator_create: out of memory"), ev->status;
  if (ev->staging) memset(ev->staging, 0, (size_t)hir__staging_n(ev) * sizeof *ev->staging);
  memset(ev->reached, 0, ((size_t)(p->ir.inputs.n + p->ir.outputs.n) + 1) * sizeof(void *));
  memset(ev->pool, 0, (size_t)ev->nstreams * sizeof(void *));
  memset(ev->pool_ev, 0, (size_t)ev->nstreams * sizeof(void *));
  memset(ev->vars, 0, ((size_t)ev->nvars + 1) * sizeof(void *));
  memset(ev->vars_ev, 0, ((size_t)ev->nvars + 1) * sizeof(void *));
  memset(ev->team, 0, ((size_t)ev->nexpr + 1) * sizeof(void *));
  memset(ev->done, 0, ((size_t)ev->nexpr + 1) * sizeof(void *));
  memset(ev->epilogue, 0, ((size_t)ev->nexpr + 1) * sizeof(void *));
  memset(ev->fused, 0, ((size_t)ev->nexpr + 1) * sizeof *ev->fused);
  memset(ev->bound, 0, (size_t)ev->ntv + 1);
  memset(ev->key, 0, ((size_t)ev->key_n + 1) * sizeof(int64_t));
  for (i = 0; i <= ev->ntv; i++) ev->slot_block[i] = -1;
  for (i = 0; i < ev->nstreams; i++)
    if ((ev->b->stream_shared ? ev->b->stream_shared(ev->b, i, &ev->pool[i]) : ev->b->stream_create(ev->b, &ev->pool[i])) != HIR_OK ||
        ev->b->event_create(ev->b, &ev->pool_ev[i]) != HIR_OK)
      return hir__ev_fail(ev, HIR_ERR_BACKEND, "hir_evaluator_create: creating stream %d: %s", i, ev->b->error), ev->status;
  for (i = 0; i < ev->nvars; i++)
    if (ev->b->event_create(ev->b, &ev->vars_ev[i]) != HIR_OK)
      return hir__ev_fail(ev, HIR_ERR_BACKEND, "hir_evaluator_create: creating an event: %s", ev->b->error), ev->status;
  if (d->comm && p->my_device >= 0) { /* before the collectives' teams: the same first team on every rank */
    ev->ndevices = hir__fusion_devices(&p->ir, &ev->devices);
    ev->shape_words = 2 + (size_t)p->ir.inputs.n * HIR__SHAPE_WORDS;
    if (!ev->devices || !(ev->shape_rows = (int64_t *)HIR_MALLOC(ev->shape_words * sizeof(int64_t) * (size_t)(ev->ndevices + 1))))
      return hir__ev_fail(ev, HIR_ERR_NOMEM, "hir_evaluator_create: out of memory"), ev->status;
    if (ev->ndevices > 1 && hir_team_index(ev->devices, ev->ndevices, ev->device) >= 0 &&
        ev->comm->team(ev->comm, ev->devices, ev->ndevices, &ev->devices_team) != HIR_OK)
      return hir__ev_fail(ev, HIR_ERR_COMM, "hir_evaluator_create: the team of the fusion's devices: %s", ev->comm->error),
             ev->status;
  }
  hir__walk(&p->top, hir__setup_expr, ev);
  hir__find_epilogues(ev, &p->top);
  hir__find_fused(ev, &p->top);
  hir__find_allreduce_norm(ev, &p->top);
  hir__permutes_into(ev); /* after the epilogues: a fused op writes no strides */
  return ev->status;
}

static void hir__gpu_timeline_free(hir_evaluator *ev) {
  int i;
  for (i = 0; ev->gpu_spans && i < HIR__GPU_TIMELINE_CAP; i++) {
    if (ev->gpu_spans[i].start) ev->b->event_destroy(ev->b, ev->gpu_spans[i].start);
    if (ev->gpu_spans[i].end) ev->b->event_destroy(ev->b, ev->gpu_spans[i].end);
  }
  if (ev->epoch) ev->b->event_destroy(ev->b, ev->epoch);
  HIR_FREE(ev->gpu_spans);
  ev->gpu_spans = NULL;
  ev->epoch = NULL;
  ev->ngpu_spans = 0;
}

HIRDEF void hir_evaluator_free(hir_evaluator *ev) {
  int i;
  if (!ev) return;
  if (ev->b) {
    if (ev->blocks) hir__free_blocks(ev);
    hir__free_stage(ev);
    for (i = 0; ev->pool && i < ev->nstreams; i++)
      if (ev->pool[i]) ev->b->stream_destroy(ev->b, ev->pool[i]);
    for (i = 0; ev->pool_ev && i < ev->nstreams; i++)
      if (ev->pool_ev[i]) ev->b->event_destroy(ev->b, ev->pool_ev[i]);
    for (i = 0; ev->vars_ev && i < ev->nvars; i++)
      if (ev->vars_ev[i]) ev->b->event_destroy(ev->b, ev->vars_ev[i]);
    for (i = 0; ev->done && i <= ev->nexpr; i++)
      if (ev->done[i]) ev->b->event_destroy(ev->b, ev->done[i]);
    hir__gpu_timeline_free(ev);
    hir__meeting_free(ev->b, &ev->meeting);
    hir__release_retired(ev);
    for (i = 0; ev->staging && i < hir__staging_n(ev); i++)
      if (ev->staging[i].data) ev->b->release(ev->b, ev->staging[i].data);
    if (ev->owns_backend) hir_backend_free(ev->b);
  }
  HIR_FREE(ev->devices);
  HIR_FREE(ev->shape_rows);
  HIR_FREE(ev->spans);
  HIR_FREE(ev->pool);
  HIR_FREE(ev->pool_ev);
  HIR_FREE(ev->vars);
  HIR_FREE(ev->vars_ev);
  HIR_FREE(ev->team);
  HIR_FREE(ev->done);
  HIR_FREE(ev->staging);
  HIR_FREE(ev->epilogue);
  HIR_FREE(ev->fused);
  HIR_FREE(ev->env.sym);
  HIR_FREE(ev->env.sym_bound);
  HIR_FREE(ev->slot);
  HIR_FREE(ev->slot_block);
  HIR_FREE(ev->into);
  HIR_FREE(ev->bound);
  HIR_FREE(ev->shape);
  HIR_FREE(ev->blocks);
  HIR_FREE(ev->key);
  HIR_FREE(ev->reached);
  HIR_FREE(ev->graphs);
  HIR_FREE(ev->touched);
  HIR_FREE(ev->warm_dense);
  HIR_FREE(ev->boundary);
  HIR_FREE(ev->retired);
  HIR_FREE(ev);
}

HIRDEF const char *hir_evaluator_error(const hir_evaluator *ev) { return ev ? ev->error : "hir_evaluator_error: evaluator is NULL"; }
HIRDEF hir_backend *hir_evaluator_backend(const hir_evaluator *ev) { return ev ? ev->b : NULL; }

HIRDEF size_t hir_evaluator_memory(const hir_evaluator *ev) {
  size_t n = 0;
  int i;
  for (i = 0; ev && i < ev->nblocks; i++) n += ev->blocks[i].bytes;
  for (i = 0; ev && ev->staging && i < hir__staging_n(ev); i++) n += ev->staging[i].bytes;
  return n;
}

// >>eval_meet
/* Waits for a stream without trusting it to finish: polls it and the
   communicator (*from_comm: the communicator failed); HIR_ERR_TIMEOUT past
   the deadline, never HIR_OK while the stream is busy. Short waits spin, as
   cudaStreamSynchronize does; longer ones nap 50 us at a time (a nap costs
   ~60 us). */
static hir_status hir__wait_stream(hir_backend *b, void *stream, hir_comm *comm, double deadline, int *from_comm) {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  double spin_until = hir__now_ms() + 2;
  hir_status s, polled;
  *from_comm = 0;
  pthread_mutex_init(&mu, NULL);
  pthread_cond_init(&cv, NULL);
  while ((s = b->stream_query(b, stream)) == HIR_ERR_TIMEOUT) {
    struct timespec nap = hir__deadline(0.05);
    if (comm && comm->poll && (polled = comm->poll(comm)) != HIR_OK) {
      *from_comm = 1;
      s = polled;
      break;
    }
    if (hir__now_ms() > deadline) break;
    if (hir__now_ms() < spin_until) continue;
    pthread_mutex_lock(&mu);
    pthread_cond_timedwait(&cv, &mu, &nap);
    pthread_mutex_unlock(&mu);
  }
  /* work that ended by giving up (a kernel collective past its deadline) ends clean for the stream */
  if (s == HIR_OK && comm && comm->poll && (polled = comm->poll(comm)) != HIR_OK) {
    *from_comm = 1;
    s = polled;
  }
  pthread_cond_destroy(&cv);
  pthread_mutex_destroy(&mu);
  return s;
}

/* The ranks of a team meet: every member's `bytes` into all (team order),
   through the backend's memory (kept in *m: a meeting must not cost an
   allocation each time), waiting under the deadline: with copy_async the
   host waits for the GPU only in hir__wait_stream. *from_comm: the
   communicator failed (its error says why); else HIR_ERR_TIMEOUT past the
   deadline, or the backend's error. */
static hir_status hir__meet(hir_comm *c, void *team, int nteam, hir_backend *b, hir__meeting *m, const void *mine, void *all,
                            size_t bytes, double deadline, int *from_comm) {
  size_t need = bytes * (size_t)(nteam + 1);
  int async = b->copy_async && b->host_alloc && b->host_release;
  void *stream = b->current_stream(b);
  char *dev, *host;
  hir_status s;
  *from_comm = 0;
  memset(&c->what, 0, sizeof c->what);
  c->what.tensor = -1; /* "a buffer" */
  if (b->host_memory) return (s = c->allgather(c, team, mine, all, bytes, stream)) != HIR_OK ? (*from_comm = 1, s) : s;
  if (m->cap < need) {
    hir__meeting_free(b, m);
    if ((s = b->alloc(b, need, &m->dev)) != HIR_OK || (async && (s = b->host_alloc(b, need, &m->host)) != HIR_OK)) {
      hir__meeting_free(b, m);
      return s;
    }
    m->cap = need;
  }
  dev = (char *)m->dev, host = (char *)m->host;
  if (async) {
    memcpy(host, mine, bytes);
    s = b->copy_async(b, stream, dev, host, bytes);
  } else {
    s = b->upload(b, dev, mine, bytes);
  }
  if (s != HIR_OK) return s;
  if ((s = c->allgather(c, team, dev, dev + bytes, bytes, stream)) != HIR_OK) return *from_comm = 1, s;
  if (async && (s = b->copy_async(b, stream, host + bytes, dev + bytes, bytes * (size_t)nteam)) != HIR_OK) return s;
  if ((s = hir__wait_stream(b, stream, c, deadline, from_comm)) == HIR_OK && async)
    memcpy(all, host + bytes, bytes * (size_t)nteam);
  else if (s == HIR_OK)
    s = b->download(b, all, dev + bytes, bytes * (size_t)nteam);
  if (s != HIR_OK && s != HIR_ERR_BACKEND) memset(m, 0, sizeof *m); /* a dead peer may still write them: left */
  return s;
}

/* A stream of the evaluator, under its deadline; past it the caller aborts
   the communicator with this message (hir__tell_world), `who`'s. */
static int hir__sync_stream(hir_evaluator *ev, void *stream, double deadline, const char *who) {
  int from_comm;
  hir_status s = hir__wait_stream(ev->b, stream, ev->comm, deadline, &from_comm);
  if (s == HIR_OK) return 1;
  if (from_comm) {
    ev->broken = 1;
    return hir__ev_fail(ev, s, "%s: a communication failed: %s", who, ev->comm->error);
  }
  if (s == HIR_ERR_TIMEOUT)
    return hir__ev_fail(ev, HIR_ERR_TIMEOUT,
                        "%s: the streams were still busy after %d ms; a peer is dead or stuck, so the communicator was "
                        "aborted (raise hir_eval_desc.timeout_ms if the work is that long)", who, ev->timeout_ms);
  return hir__ev_fail(ev, s, "%s: %s", who, ev->b->error);
}

/* The pool's streams, then the caller's, under one deadline. */
static hir_status hir__sync_streams(hir_evaluator *ev, const char *who) {
  double deadline = hir__now_ms() + ev->timeout_ms;
  int i;
  for (i = 0; i <= ev->nstreams; i++)
    if (!hir__sync_stream(ev, i < ev->nstreams ? ev->pool[i] : ev->b->current_stream(ev->b), deadline, who))
      return hir__tell_world(ev);
  hir__release_retired(ev);
  return HIR_OK;
}

HIRDEF hir_status hir_evaluator_sync(hir_evaluator *ev) {
  if (!ev || !ev->b) return HIR_ERR_INVALID;
  ev->status = HIR_OK;
  return hir__sync_streams(ev, "hir_evaluator_sync");
}

/* One input as a rank passed it, for comparing across ranks: kind (0: not
   given, a rank outside its mesh passing it empty; 1: a tensor; 2: a
   scalar, its value in sizes[0]), ndims, sizes. */
static void hir__shape_words(const hir_evaluator *ev, int i, const hir_tensor *t, int64_t *w) {
  const hir_tv *tv = (const hir_tv *)ev->p->ir.inputs.items[i];
  int a;
  memset(w, 0, HIR__SHAPE_WORDS * sizeof *w);
  if (tv->scalar) w[0] = 2, w[2] = t->sizes[0];
  else if (t->ndims > 0 || hir__in_mesh(tv, ev->device)) w[0] = 1;
  if (w[0] != 1) return;
  w[1] = t->ndims;
  for (a = 0; a < t->ndims; a++) w[2 + a] = t->sizes[a];
}

static int hir__same_shape_words(const int64_t *x, const int64_t *y) {
  return x[0] == y[0] && x[1] == y[1] && memcmp(x + 2, y + 2, (size_t)(x[0] == 2 ? 1 : x[1]) * sizeof *x) == 0;
}

/* Input i's words in rank r's row of `all` (rows of `words`: a header of 2, then the inputs). */
static const int64_t *hir__shape_of(const int64_t *all, size_t words, int r, int i) {
  return all + (size_t)r * words + 2 + (size_t)i * HIR__SHAPE_WORDS;
}

/* Ranks that pass different shapes would move different byte counts in one
   collective: NCCL then hangs or reads past a buffer, returning wrong
   numbers at worst. So the shapes a rank plans for are compared across the
   fusion's devices before anything moves (one small allgather each time the
   ranks plan anew), and a difference is refused on every rank with one
   message. The ranks must plan at the same run: one that alone passes a new
   shape meets the others' communication instead, which fails or times out. */
static int hir__shapes_agree(hir_evaluator *ev, const hir_tensor *in, int nin) {
  size_t words = ev->shape_words, row = words * sizeof(int64_t), n;
  int64_t *mine = ev->shape_rows, *all = mine + words;
  int i, r, q, from_comm, bad = -1, first = -1;
  hir_status s;
  char msg[sizeof ev->error];
  mine[0] = 0x6869727368617065ll; /* "hirshape": a row from a rank running something else is not read as shapes */
  mine[1] = nin;
  for (i = 0; i < nin; i++) hir__shape_words(ev, i, &in[i], mine + 2 + i * HIR__SHAPE_WORDS);
  s = hir__meet(ev->comm, ev->devices_team, ev->ndevices, ev->b, &ev->meeting, mine, all, row,
                hir__now_ms() + ev->timeout_ms, &from_comm);
  if (s != HIR_OK) {
    if (from_comm) {
      ev->broken = 1;
      return hir__ev_fail(ev, s, "hir_run: comparing this run's shapes with the other ranks failed: %s", ev->comm->error);
    }
    if (s == HIR_ERR_TIMEOUT)
      return hir__ev_fail(ev, s, "hir_run: the other ranks did not come to compare this run's shapes within %d ms: a peer is "
                          "dead or stuck, has no communicator (every device of the fusion's meshes runs it with one), or "
                          "passed the shapes of its last run while this rank passed new ones", ev->timeout_ms);
    return hir__ev_fail(ev, s, "hir_run: comparing this run's shapes with the other ranks: %s", ev->b->error);
  }
  for (r = 0; r < ev->ndevices && bad < 0; r++) {
    const int64_t *x = all + (size_t)r * words;
    if (x[0] != mine[0] || x[1] != nin) /* not a row of shapes: the world is told (its data may have been taken as one) */
      return hir__ev_fail(ev, HIR_ERR_COMM, "hir_run: comparing this run's shapes, device %d sent something else: it runs "
                          "another fusion's program, or passed its last run's shapes while this rank passed new ones (every "
                          "device of the fusion's meshes runs the same fusion and changes shapes at the same run)",
                          ev->devices[r]);
  }
  for (i = 0; i < nin && bad < 0; i++) /* the first input two ranks disagree on */
    for (first = -1, r = 0; r < ev->ndevices && bad < 0; r++) {
      if (!hir__shape_of(all, words, r, i)[0]) continue;
      if (first < 0) first = r;
      else if (!hir__same_shape_words(hir__shape_of(all, words, r, i), hir__shape_of(all, words, first, i))) bad = i;
    }
  if (bad < 0) return 1;
  if (((const hir_tv *)ev->p->ir.inputs.items[bad])->scalar)
    n = (size_t)snprintf(msg, sizeof msg, "hir_run: the ranks passed different values for scalar input %d:", bad);
  else
    n = (size_t)snprintf(msg, sizeof msg, "hir_run: the ranks passed different shapes for input %d (T%d):", bad,
                         ((const hir_tv *)ev->p->ir.inputs.items[bad])->name);
  for (r = 0; r < ev->ndevices; r++) { /* each shape once, with the devices that passed it */
    const int64_t *x = hir__shape_of(all, words, r, bad);
    int seen = 0, k, count = 0;
    for (q = 0; q < r && !seen; q++) seen = hir__same_shape_words(x, hir__shape_of(all, words, q, bad));
    if (!x[0] || seen) continue;
    for (q = r; q < ev->ndevices; q++) count += hir__same_shape_words(x, hir__shape_of(all, words, q, bad));
    if (n < sizeof msg) n += (size_t)snprintf(msg + n, sizeof msg - n, "%s ", r == first ? "" : ";");
    for (k = 0; x[0] == 1 && k < x[1] && n < sizeof msg; k++)
      n += (size_t)snprintf(msg + n, sizeof msg - n, "%s%lld", k ? ", " : "[", (long long)x[2 + k]);
    if (n < sizeof msg)
      n += (size_t)(x[0] == 2 ? snprintf(msg + n, sizeof msg - n, "%lld", (long long)x[2])
                              : snprintf(msg + n, sizeof msg - n, "%s", x[1] ? "]" : "[]"));
    if (n < sizeof msg) n += (size_t)snprintf(msg + n, sizeof msg - n, " on device%s", count > 1 ? "s" : "");
    for (q = r, k = 0; q < ev->ndevices && n < sizeof msg; q++)
      if (hir__same_shape_words(x, hir__shape_of(all, words, q, bad)))
        n += (size_t)snprintf(msg + n, sizeof msg - n, "%s%d", k++ ? ", " : " ", ev->devices[q]);
  }
  if (n < sizeof msg)
    snprintf(msg + n, sizeof msg - n, "; every rank passes the same %s", ((const hir_tv *)ev->p->ir.inputs.items[bad])->scalar
             ? "value" : "shape (its own shard where an axis is split across devices)");
  ev->planned = 0; /* the next run compares again, whatever it passes */
  ev->shared_error = 1;
  return hir__ev_fail(ev, HIR_ERR_SHAPE, "%s", msg);
}

// >>eval_eager
/* Whether the backend's ops reach a caller's tensor (asked once per address
   of each argument k: inputs, then outputs). */
static int hir__check_reached(hir_evaluator *ev, int k, const char *what, int i, int name, const void *data) {
  char why[300];
  if (!data || !ev->b->reachable || ev->reached[k] == data) return 1;
  if (!ev->b->reachable(ev->b, data, why, sizeof why))
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: %s %d (T%d) at %p is %s (the %s backend)", what, i, name, data, why,
                        ev->b->name);
  ev->reached[k] = data;
  return 1;
}

static int hir__check_input(hir_evaluator *ev, int i, const hir_tensor *t) {
  const hir_tv *tv = (const hir_tv *)ev->p->ir.inputs.items[i];
  int nd = 0, a, here = hir__in_mesh(tv, ev->device);
  if (tv->scalar) { /* by value, on every rank */
    if (t->ndims != 0 || t->data)
      return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: input %d is a scalar: pass it by value, ndims 0 and data NULL with "
                          "the value in sizes[0]", i);
    return 1;
  }
  for (a = 0; a < tv->ndims; a++) nd += tv->ids[a]->iter != HIR_REDUCTION;
  if (!here && t->data)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: input %d (T%d) does not live on device %d; pass it empty (data NULL) "
                        "or shape-only", i, tv->name, ev->device);
  if (!here && t->ndims == 0) return 1;
  if (t->ndims != nd)
    return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: input %d (T%d) has %d axes; the program expects %d", i, tv->name, t->ndims, nd);
  if (t->dtype != tv->dtype)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: input %d (T%d) is %s; the program expects %s", i, tv->name,
                        hir_dtype_name(t->dtype), hir_dtype_name(tv->dtype));
  for (a = 0; a < nd; a++)
    if (t->sizes[a] < 0)
      return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: input %d (T%d) axis %d has negative size %lld", i, tv->name, a, (long long)t->sizes[a]);
  if (!hir__sizes_fit(nd, t->sizes, hir_dtype_size(tv->dtype)))
    return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: input %d (T%d) has more bytes than this machine addresses", i, tv->name);
  if (here && !t->data && hir__numel(nd, t->sizes) > 0)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: input %d (T%d) has NULL data", i, tv->name);
  for (a = 0; here && a < nd; a++)
    if (t->strides[a] < 0)
      return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: input %d (T%d) axis %d has stride %lld; strides are >= 0", i,
                          tv->name, a, (long long)t->strides[a]);
  return !here || hir__check_reached(ev, i, "input", i, tv->name, t->data);
}

/* The user's tensors may have any layout (a transpose's strides, an
   expanded axis's 0): where it is not the dense row-major one (strides all
   0 say row-major too) an input is copied into a buffer of the evaluator's
   as the run starts, and an output is computed in one and copied out as it
   ends, both on the run's stream. */
static int hir__dense(const hir_tensor *t) {
  int a, zero = 1;
  for (a = 0; a < t->ndims; a++) zero &= t->strides[a] == 0;
  return zero || hir__is_contiguous(t);
}

/* Whether no two elements of t share an address (sufficient: each axis of
   size > 1, by stride, steps past everything the smaller ones span). */
static int hir__no_overlap(const hir_tensor *t) {
  int64_t span = 1, best;
  int a, k, done[HIR_MAX_DIMS] = {0};
  if (hir__dense(t) || hir__numel(t->ndims, t->sizes) == 0) return 1;
  for (k = 0; k < t->ndims; k++) {
    int pick = -1;
    for (a = 0; a < t->ndims; a++)
      if (!done[a] && t->sizes[a] > 1 && (pick < 0 || t->strides[a] < t->strides[pick])) pick = a;
    if (pick < 0) return 1;
    done[pick] = 1;
    best = t->strides[pick];
    if (best < span) return 0;
    span = best * t->sizes[pick];
  }
  return 1;
}

static int hir__check_output(hir_evaluator *ev, int i, const hir_tensor *t) {
  const hir_tv *tv = (const hir_tv *)ev->p->ir.outputs.items[i];
  const hir__shape *sh;
  int a;
  if (!t->data) return 1;
  if (!hir__in_mesh(tv, ev->device))
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: output %d (T%d) does not live on device %d; pass it empty", i, tv->name, ev->device);
  if (!(sh = hir__need_shape(ev, tv))) return 0;
  if (t->dtype != tv->dtype)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: output %d (T%d) is %s; the program writes %s", i, tv->name,
                        hir_dtype_name(t->dtype), hir_dtype_name(tv->dtype));
  if (t->ndims != sh->nd || memcmp(t->sizes, sh->sizes, (size_t)sh->nd * sizeof(int64_t)) != 0) {
    hir__shape got;
    char a1[160], a2[160];
    got.nd = t->ndims < 0 || t->ndims > HIR_MAX_DIMS ? 0 : t->ndims;
    memcpy(got.sizes, t->sizes, (size_t)got.nd * sizeof(int64_t));
    hir__shape_str(&got, a1, sizeof a1);
    hir__shape_str(sh, a2, sizeof a2);
    return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: output %d (T%d) is %s; the program writes %s here", i, tv->name, a1, a2);
  }
  for (a = 0; a < t->ndims; a++)
    if (t->strides[a] < 0)
      return hir__ev_fail(ev, HIR_ERR_UNSUPPORTED, "hir_run: output %d (T%d) axis %d has stride %lld; strides are >= 0", i,
                          tv->name, a, (long long)t->strides[a]);
  if (!hir__no_overlap(t))
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: output %d (T%d): its strides make elements share memory (an expanded "
                        "axis?); pass a tensor each element of which has its own place", i, tv->name);
  return hir__check_reached(ev, ev->p->ir.inputs.n + i, "output", i, tv->name, t->data);
}

/* ---- split axes at the boundary: the user's tensors hold logical axes ---- */
/* t (logical axes) seen as tv's axes: a split axis of local size L becomes
   its parts, a DIDx part of size 1, a part of fixed extent that extent, and
   the one left L / (the others), each part strided within the axis's
   stride. A view: the data does not move. */
static int hir__unfold(hir_evaluator *ev, const hir_tv *tv, const hir_tensor *t, hir_tensor *u, const char *what, int index) {
  int a, l, nd = 0, zero = 1, at[HIR_MAX_DIMS];
  int64_t stride, row_major[HIR_MAX_DIMS];
  *u = *t;
  if (!tv->nlogical || (!t->data && t->ndims == 0)) return 1;
  if (t->ndims != tv->nlogical)
    return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: %s %d (T%d) has %d axes; the program expects %d (its logical axes: split "
                        "axes count once)", what, index, tv->name, t->ndims, tv->nlogical);
  for (a = t->ndims - 1, stride = 1; a >= 0; a--) zero &= t->strides[a] == 0, row_major[a] = stride, stride *= t->sizes[a];
  for (a = 0; a < tv->ndims; a++) at[a] = tv->ids[a]->iter == HIR_REDUCTION ? -1 : nd++; /* a laid-out tensor's parts */
  for (l = 0; l < tv->nlogical; l++) {                                                  /* need not follow its axes */
    int64_t known = 1;
    int rest = -1, parts = 0, only = -1;
    for (a = 0; a < tv->ndims; a++) {
      const hir_id *id = tv->ids[a];
      if (at[a] < 0 || tv->logical_of[a] != l) continue;
      if (hir__shards(tv, id->ptype) > 1) u->sizes[at[a]] = 1;
      else if (id->extent->kind == HIR__VAL_CONST) known *= (u->sizes[at[a]] = id->extent->value);
      else rest = at[a];
      parts++, only = at[a];
    }
    if (rest >= 0 ? (known == 0 || t->sizes[l] % known) : known != t->sizes[l] && parts > 1)
      return hir__ev_fail(ev, HIR_ERR_SHAPE, "hir_run: %s %d (T%d) axis %d has size %lld, which its split parts (%lld) %s", what,
                          index, tv->name, l, (long long)t->sizes[l], (long long)known, rest >= 0 ? "do not divide" : "do not make");
    if (rest >= 0) u->sizes[rest] = t->sizes[l] / known;
    else if (parts == 1) u->sizes[only] = t->sizes[l];
    for (a = tv->ndims - 1, stride = zero ? row_major[l] : t->strides[l]; a >= 0; a--) /* zeros: row-major, of t's order */
      if (at[a] >= 0 && tv->logical_of[a] == l) u->strides[at[a]] = stride, stride *= u->sizes[at[a]];
  }
  u->ndims = nd;
  return 1;
}

/* An output written with tv's axes, handed back with its logical ones: a
   logical axis strided as its innermost part (as hir__unfold made them). */
static void hir__fold(const hir_tv *tv, hir_tensor *t) {
  int64_t sizes[HIR_MAX_DIMS], strides[HIR_MAX_DIMS];
  int a, k = 0, l, zero = 1;
  if (!tv->nlogical || t->ndims == 0) return;
  for (a = 0; a < t->ndims; a++) zero &= t->strides[a] == 0;
  for (l = 0; l < tv->nlogical; l++) sizes[l] = 1;
  for (a = 0; a < tv->ndims; a++)
    if (tv->ids[a]->iter != HIR_REDUCTION) {
      strides[tv->logical_of[a]] = t->strides[k];
      sizes[tv->logical_of[a]] *= t->sizes[k++];
    }
  t->ndims = tv->nlogical;
  memcpy(t->sizes, sizes, sizeof sizes);
  memcpy(t->strides, strides, sizeof strides);
  if (zero) hir__contiguous_strides(t);
}

/* The arguments seen with the program's split axes: *in and *out point at
   ev->boundary where an input or output has them. 0 (error recorded) when
   one does not fit. */
static int hir__unfold_args(hir_evaluator *ev, const hir_tensor **in, int nin, hir_tensor **out, int nout) {
  const hir_fusion *f = ev->p ? &ev->p->ir : NULL;
  int i, split = 0;
  if (!f || nin != f->inputs.n || nout != f->outputs.n || (nin && !*in) || (nout && !*out)) return 1; /* hir__prepare says why */
  for (i = 0; i < nin + nout; i++)
    split |= ((const hir_tv *)(i < nin ? f->inputs.items[i] : f->outputs.items[i - nin]))->nlogical > 0;
  if (!split) return 1;
  ev->status = HIR_OK; /* this run's errors, not the last one's */
  ev->error[0] = '\0';
  for (i = 0; i < nin; i++)
    if (!hir__unfold(ev, (const hir_tv *)f->inputs.items[i], &(*in)[i], &ev->boundary[i], "input", i)) return 0;
  for (i = 0; i < nout; i++)
    if (!hir__unfold(ev, (const hir_tv *)f->outputs.items[i], &(*out)[i], &ev->boundary[nin + i], "output", i)) return 0;
  *in = ev->boundary;
  *out = ev->boundary + nin;
  return 1;
}

/* The outputs of a run back in the user's terms (where unfolded). */
static void hir__fold_outputs(hir_evaluator *ev, const hir_tensor *done, hir_tensor *out, int nout) {
  int i;
  if (done == out) return;
  for (i = 0; i < nout; i++) {
    out[i] = done[i];
    hir__fold((const hir_tv *)ev->p->ir.outputs.items[i], &out[i]);
  }
}

/* A matmul or linear that reads t, or what local sets and permutes make of
   it, as its weight (operand 1), in exprs or the scopes under them; NULL
   where none does. */
static const hir_expr *hir__weight_use(const hir_program *p, const hir_tv *t, int depth);
static const hir_expr *hir__weight_use_in(const hir_program *p, const hir__vec *exprs, const hir_tv *t, int depth) {
  int i, k;
  for (i = 0; i < exprs->n; i++) {
    const hir_expr *e = (const hir_expr *)exprs->items[i], *use;
    if ((use = hir__weight_use_in(p, &e->body.exprs, t, depth)) || (use = hir__weight_use_in(p, &e->orelse.exprs, t, depth)))
      return use;
    for (k = 0; k < e->nin; k++) {
      if (e->in[k] != t) continue;
      if (e->kind == HIR_EXPR_MATMUL && k == 1) return e;
      if (e->kind == HIR_EXPR_LOAD_STORE && depth < 4 && (use = hir__weight_use(p, e->out[0], depth + 1))) return use;
    }
  }
  return NULL;
}
static const hir_expr *hir__weight_use(const hir_program *p, const hir_tv *t, int depth) {
  const hir_expr *use = hir__weight_use_in(p, &p->top.exprs, t, depth);
  int i;
  for (i = 0; i < p->units.n && !use; i++) use = hir__weight_use_in(p, &((const hir__host_unit *)p->units.items[i])->exprs, t, depth);
  return use;
}

/* The program input t is, or is a local set or permute of; NULL if none. */
static const hir_tv *hir__input_behind(const hir_tv *t) {
  int depth;
  for (depth = 0; t && !t->is_input && depth < 4; depth++)
    t = t->definition && t->definition->kind == HIR_EXPR_LOAD_STORE ? t->definition->in[0] : NULL;
  return t && t->is_input ? t : NULL;
}

/* The plan's "collectives:" part, for the shapes just planned: each
   collective this rank takes part in, the bytes it moves here (an
   all-gather's output, a reduce-scatter's input, the larger side of the
   others) and, where the communicator says, the path it takes; an
   all-gather that leaves an input whole on every rank for a matmul's or
   linear's weight is named a replicated weight (often a mesh set on an
   intermediate without a DIDx axis: the numbers are right, the weight's
   bytes and memory D times). Replaced at each new plan; the program's one
   evaluator writes it (as its epilogue notes). */
static void hir__collectives_of(hir_evaluator *ev, const hir_scope *sc, char *text, size_t cap, int *listed, int *more) {
  int i;
  for (i = 0; i < sc->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)sc->exprs.items[i];
    const hir__shape *a, *o;
    const hir_tv *weight;
    const hir_expr *use;
    size_t n = strlen(text), in_bytes = 0, out_bytes = 0, bytes;
    const char *path = NULL;
    hir__collectives_of(ev, &e->body, text, cap, listed, more);
    hir__collectives_of(ev, &e->orelse, text, cap, listed, more);
    if (e->kind != HIR_EXPR_COMMUNICATION || !ev->team[e->name]) continue;
    if (e->nin && hir__in_mesh(e->in[0], ev->device) && (a = &ev->shape[e->in[0]->name])->known)
      in_bytes = (size_t)hir__shape_numel(a) * hir_dtype_size(e->in[0]->dtype);
    if (e->nout && hir__in_mesh(e->out[0], ev->device) && (o = &ev->shape[e->out[0]->name])->known)
      out_bytes = (size_t)hir__shape_numel(o) * hir_dtype_size(e->out[0]->dtype);
    bytes = e->sub == HIR_COLL_ALLGATHER ? out_bytes : e->sub == HIR_COLL_REDUCESCATTER ? in_bytes
            : in_bytes > out_bytes ? in_bytes : out_bytes;
    if (ev->comm->collective_path)
      path = ev->comm->collective_path(ev->comm, ev->team[e->name], (hir_collective)e->sub, bytes,
                                       e->nout ? e->out[0]->dtype : e->in[0]->dtype);
    if (*listed == 8) {
      (*more)++;
      continue;
    }
    snprintf(text + n, cap - n, "%s%s %d (T%d) %.1f %s%s%s", *listed ? ", " : "", hir__collective_names[e->sub], e->name,
             e->nout ? e->out[0]->name : e->in[0]->name, (double)bytes / (bytes >> 20 ? 1 << 20 : 1 << 10),
             bytes >> 20 ? "MiB" : "KiB", path ? " on " : "", path ? path : "");
    if (e->sub == HIR_COLL_ALLGATHER && e->nout && hir__shard_axis(e->out[0], HIR_DIDX) < 0 &&
        hir__shard_axis(e->out[0], HIR_DIDY) < 0 && (weight = hir__input_behind(e->in[0])) &&
        (use = hir__weight_use(ev->p, e->out[0], 0))) {
      n = strlen(text);
      snprintf(text + n, cap - n, ", a replicated weight (input T%d whole on every rank for %s %d)", weight->name,
               hir__ops[use->kind].name, use->name);
    }
    (*listed)++;
  }
}

static void hir__plan_collectives(hir_evaluator *ev) {
  hir_program *p = (hir_program *)ev->p;
  char text[1200] = "", *at, *end; /* eight collectives, each with its path in words */
  int listed = 0, more = 0;
  size_t n;
  if (!ev->comm) return;
  hir__collectives_of(ev, &p->top, text, sizeof text, &listed, &more);
  if ((at = strstr(p->plan, "collectives: "))) { /* the last plan's, dropped with its "; " */
    const char *rest = (end = strstr(at, "; ")) ? (at > p->plan ? end : end + 2) : "";
    if (at > p->plan) at -= 2;
    memmove(at, rest, strlen(rest) + 1);
  }
  if (!listed) return;
  n = strlen(p->plan);
  snprintf(p->plan + n, sizeof p->plan - n, "%scollectives: %s%s", n ? "; " : "", text, more ? ", more" : "");
}

/* What hir_run checks and plans before it runs anything: the arguments,
   every input, the shapes (replanned when they change), every output. No
   communication, so a tuner can ask it of a candidate on its own. */
static hir_status hir__prepare(hir_evaluator *ev, const hir_tensor *in, int nin, hir_tensor *out, int nout) {
  const hir_fusion *f;
  int i, a, changed = 0;
  if (!ev) return HIR_ERR_INVALID;
  if (!ev->p || !ev->b) return ev->status ? ev->status : HIR_ERR_INVALID; /* a failed create */
  if (ev->broken) {
    ev->status = HIR_OK;
    hir__ev_fail(ev, HIR_ERR_COMM, "hir_run: an earlier run failed while communicating; the world is unusable (%s)",
                 ev->comm ? ev->comm->error : "");
    return ev->status;
  }
  f = &ev->p->ir;
  ev->status = HIR_OK;
  ev->error[0] = '\0';
  ev->started_comm = 0;
  if (nin != f->inputs.n || nout != f->outputs.n || (nin && !in) || (nout && !out))
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: got %d inputs and %d outputs%s; the program takes %d and %d", nin, nout,
                        (nin && !in) || (nout && !out) ? " (a NULL array)" : "", f->inputs.n, f->outputs.n), ev->status;
  for (i = 0; i < nin; i++)
    if (!hir__check_input(ev, i, &in[i])) return ev->status;
  for (i = 0; i < nout; i++) { /* an output holding a buffer of ours (the last run's) asks for a new one */
    for (a = 0; out[i].data && a < ev->nblocks; a++)
      if (out[i].data == ev->blocks[a].ptr) out[i].data = NULL;
    if (out[i].data && ev->stage && ev->nstage == nin + nout && out[i].data == ev->stage[nin + i].data) out[i].data = NULL;
  }
  for (i = 0; i < nin; i++) { /* replan when the shapes change, or a scalar's value */
    int64_t *k = ev->key + i * (HIR_MAX_DIMS + 1);
    if (((const hir_tv *)f->inputs.items[i])->scalar) {
      if (k[0] != -1 || k[1] != in[i].sizes[0]) changed = 1;
      k[0] = -1;
      k[1] = in[i].sizes[0];
      continue;
    }
    if (k[0] != in[i].ndims) changed = 1;
    k[0] = in[i].ndims;
    for (a = 0; a < in[i].ndims; a++) {
      if (k[1 + a] != in[i].sizes[a]) changed = 1;
      k[1 + a] = in[i].sizes[a];
    }
  }
  if (changed || !ev->planned) {
    int was_planned = ev->planned;
    ev->planned = 0; /* until the new plan is made: the old one must not serve the new shapes at the next run */
    /* The old plan's buffers may be in use by work a dead peer holds forever: it is waited for here, under the
       deadline, not in the backend's release (cudaFree waits for the whole device, without one). */
    if (was_planned && hir__sync_streams(ev, "hir_run: waiting for the last run's work before planning new shapes") != HIR_OK)
      return ev->status;
    hir__free_blocks(ev);
    if (!hir__plan(ev, in)) return ev->status;
    hir__plan_collectives(ev);
    ev->planned = 1;
    ev->shapes_unchecked = 1;
  }
  for (i = 0; i < nout; i++)
    if (!hir__check_output(ev, i, &out[i])) return ev->status;
  return HIR_OK;
}

/* The host program walked, its work issued (or, under a capture, recorded). */
static hir_status hir__run_eager(hir_evaluator *ev, const hir_tensor *in, int nin, hir_tensor *out, int nout) {
  const hir_fusion *f = &ev->p->ir;
  int i;
  memset(ev->bound, 0, (size_t)ev->ntv + 1);
  for (i = 0; i <= ev->ntv; i++) ev->slot_block[i] = -1;
  for (i = 0; i < ev->nblocks; i++) ev->blocks[i].in_use = 0;
  ev->current = ev->b->current_stream(ev->b);
  ev->current_track = 0;
  for (i = 0; i < nin; i++) {
    const hir_tv *tv = (const hir_tv *)f->inputs.items[i];
    if (tv->scalar) continue; /* bound when planned */
    if (!in[i].data && hir__numel(in[i].ndims, in[i].sizes) > 0) continue; /* lives elsewhere */
    if (!hir__in_mesh(tv, ev->device)) continue;
    if (!hir__dense(&in[i])) { /* copied in, dense (see hir__dense) */
      hir_status s;
      if (!hir__bind_new(ev, tv)) return ev->status;
      hir__touch(ev, &ev->slot[tv->name]);
      if ((s = ev->b->copy(ev->b, ev->current, &ev->slot[tv->name], &in[i])) != HIR_OK)
        return hir__ev_fail(ev, s, "hir_run: copying strided input %d (T%d) failed on the %s backend: %s", i, tv->name,
                            ev->b->name, ev->b->error), ev->status;
      continue;
    }
    ev->slot[tv->name] = in[i];
    hir__contiguous_strides(&ev->slot[tv->name]);
    ev->bound[tv->name] = 1;
  }
  for (i = 0; i < nout; i++)
    if (out[i].data && hir__dense(&out[i])) { /* a strided one is computed in a buffer of ours, copied out below */
      const hir_tv *tv = (const hir_tv *)f->outputs.items[i];
      ev->slot[tv->name] = out[i];
      hir__contiguous_strides(&ev->slot[tv->name]);
      ev->bound[tv->name] = 1;
    }
  if (!hir__exec_scope(ev, &ev->p->top)) {
    static const char incomplete[] = " (the outputs of this run are incomplete)";
    size_t n = strlen(ev->error), k = sizeof incomplete - 1;
    if (ev->started_comm && nout && (n < k || strcmp(ev->error + n - k, incomplete))) /* not said yet (a peer's message may end with it) */
      snprintf(ev->error + n, sizeof ev->error - n, "%s", incomplete);
    return ev->status;
  }
  for (i = 0; i < nout; i++) {
    const hir_tv *tv = (const hir_tv *)f->outputs.items[i];
    if (out[i].data && !hir__dense(&out[i]) && ev->bound[tv->name]) { /* on the caller's stream, which joined every other */
      hir_status s = ev->b->copy(ev->b, ev->b->current_stream(ev->b), &out[i], &ev->slot[tv->name]);
      if (s != HIR_OK)
        return hir__ev_fail(ev, s, "hir_run: copying into strided output %d (T%d) failed on the %s backend: %s (the outputs "
                            "of this run are incomplete)", i, tv->name, ev->b->name, ev->b->error), ev->status;
    }
    if (out[i].data) continue;
    if (!hir__in_mesh(tv, ev->device)) { /* lives elsewhere */
      memset(&out[i], 0, sizeof out[i]);
      out[i].dtype = tv->dtype;
      continue;
    }
    if (!ev->bound[tv->name])
      return hir__ev_fail(ev, HIR_ERR_INTERNAL, "hir_run: output %d (T%d) lives here but the program never wrote it", i, tv->name),
             ev->status;
    out[i] = ev->slot[tv->name];
  }
  return HIR_OK;
}

// >>eval_graph
/* Why runs stay eager in graph mode ("" where they need not). */
static const char *hir__graph_obstacle(const hir_evaluator *ev) {
  if (!ev->b->graph_begin) return "the backend has nothing to capture";
  if (ev->recording) return "a timeline is being recorded (it times each node as it runs)";
  if (ev->comm_ops && ev->comm && !ev->comm->capturable)
    return "the communicator cannot be captured (hir_comm.capturable is 0)";
  return "";
}

/* The plan says once why graph mode runs eagerly. */
static void hir__graph_note(hir_evaluator *ev, const char *why) {
  hir_program *p = (hir_program *)ev->p; /* the plan is the program's note to its reader */
  size_t n = strlen(p->plan);
  if (strstr(p->plan, "graph: eager")) return;
  snprintf(p->plan + n, sizeof p->plan - n, "%sgraph: eager, because %s", n ? "; " : "", why);
}

/* Graph mode: the graph of these addresses launched, else (once the shape
   has run eagerly) captured and launched. A failed capture is named in the
   plan and the run goes eager - unless the program communicates, whose
   peers captured theirs: then it is this run's error, on every rank. Never a
   half-captured graph. */
/* Whether t is the argument a graph was captured with: the same address,
   and the same strides where either is not dense (a graph copies a strided
   one in or out). */
static int hir__same_arg(const hir_tensor *kept, const hir_tensor *t) {
  int dense = hir__dense(t);
  if (kept->data != t->data || dense != hir__dense(kept)) return 0;
  return dense || memcmp(kept->strides, t->strides, (size_t)t->ndims * sizeof(int64_t)) == 0;
}

/* The allocation holding a communicating program's output, where its
   communicator's captured receives depend on it (0: only addresses do). */
static unsigned long long hir__allocation_of(const hir_evaluator *ev, const void *data) {
  return ev->communicates && ev->comm && ev->comm->allocation_of && data ? ev->comm->allocation_of(ev->comm, data) : 0;
}

/* Whether graph g was captured with these arguments. */
static int hir__graph_fits(const hir_evaluator *ev, const hir__graph *g, const hir_tensor *in, int nin, const hir_tensor *out,
                           int nout) {
  int i;
  for (i = 0; i < nin + nout; i++) {
    const hir_tensor *t = i < nin ? &in[i] : &out[i - nin];
    if (!hir__same_arg(&g->args[i], t) || (i >= nin && g->allocs[i] != hir__allocation_of(ev, t->data))) return 0;
  }
  return 1;
}

/* Graph mode's eager run that makes the buffers a capture then finds: the
   first of a shape, and the first where other arguments are strided (each
   is copied through a buffer of ours). */
static hir_status hir__run_warming(hir_evaluator *ev, const hir_tensor *in, int nin, hir_tensor *out, int nout) {
  int i;
  hir_status s = hir__run_eager(ev, in, nin, out, nout);
  if (s != HIR_OK) return s;
  for (i = 0; i < nin + nout; i++) ev->warm_dense[i] = (unsigned char)hir__dense(i < nin ? &in[i] : &out[i - nin]);
  ev->warm = 1;
  return HIR_OK;
}

static hir_status hir__run_graph(hir_evaluator *ev, const hir_tensor *in, int nin, hir_tensor *out, int nout) {
  hir__graph *g = NULL;
  int i, k, n = nin + nout;
  hir_status s;
  const char *why = hir__graph_obstacle(ev);
  if (why[0]) return hir__graph_note(ev, why), hir__run_eager(ev, in, nin, out, nout);
  if (!ev->warm) return hir__run_warming(ev, in, nin, out, nout);
  for (k = 0; k < ev->ngraphs && !g; k++)
    if (ev->graphs[k].exec && hir__graph_fits(ev, &ev->graphs[k], in, nin, out, nout)) g = &ev->graphs[k];
  if (!g && ev->communicates && ev->ngraphs > 0)
    return hir__ev_fail(ev, HIR_ERR_INVALID,
                        "hir_run: graph mode: an input or output moved (or changed its strides, or is a new allocation at "
                        "its old address where peers copy into it) after this program, which communicates, was captured; "
                        "its graph replays only on the buffers every rank captured it with (NCCL launches a captured "
                        "collective on all ranks alike): keep them, or set hir_eval_desc.graph to HIR_GRAPH_STAGED (or HIR_GRAPH_OFF)"),
           ev->status;
  for (i = 0; i < n && !g; i++)
    if (ev->warm_dense[i] != hir__dense(i < nin ? &in[i] : &out[i - nin])) return hir__run_warming(ev, in, nin, out, nout);
  if (!g) { /* capture: into a free place, or the least recently used one's */
    void *exec = NULL;
    for (k = 0; k < ev->ngraphs && ev->ngraphs == HIR__GRAPHS; k++)
      if (!g || ev->graphs[k].used < g->used) g = &ev->graphs[k];
    if (!g) g = &ev->graphs[ev->ngraphs++];
    hir__free_graph(ev, g);
    if (!(g->args = (hir_tensor *)HIR_MALLOC((size_t)(n + 1) * sizeof *g->args)) ||
        !(g->allocs = (unsigned long long *)HIR_MALLOC((size_t)(n + 1) * sizeof *g->allocs)) ||
        !(g->outs = (hir_tensor *)HIR_MALLOC((size_t)(nout + 1) * sizeof *g->outs)))
      return hir__free_graph(ev, g), hir__ev_fail(ev, HIR_ERR_NOMEM, "hir_run: out of memory for a graph"), ev->status;
    for (i = 0; i < nin; i++) g->args[i] = in[i];
    for (i = 0; i < nout; i++) g->args[nin + i] = out[i];
    for (i = 0; i < n; i++) g->allocs[i] = i < nin ? 0 : hir__allocation_of(ev, g->args[i].data); /* outputs receive */
    if ((s = ev->b->graph_begin(ev->b)) != HIR_OK) {
      hir__graph_note(ev, ev->b->error);
      ev->graph = 0;
      return hir__run_eager(ev, in, nin, out, nout);
    }
    ev->capturing = 1;
    ev->ntouched = 0;
    s = hir__run_eager(ev, in, nin, out, nout);
    ev->capturing = 0;
    if (ev->comm && ev->comm->start_signals_take) g->start_signals = ev->comm->start_signals_take(ev->comm);
    if (ev->b->graph_end(ev->b, &exec) != HIR_OK || s != HIR_OK) {
      char why[sizeof ev->error + 32];
      if (exec) ev->b->graph_destroy(ev->b, exec);
      hir__free_graph(ev, g);
      if (g == &ev->graphs[ev->ngraphs - 1]) ev->ngraphs--;
      if (s != HIR_OK && (ev->communicates || ev->broken)) return s; /* its peers captured theirs: an error everywhere */
      snprintf(why, sizeof why, "the capture failed: %s", s != HIR_OK ? ev->error : ev->b->error);
      hir__graph_note(ev, why);
      ev->graph = 0;
      ev->status = HIR_OK;
      ev->error[0] = 0;
      return hir__run_eager(ev, in, nin, out, nout); /* the captured work never ran: run it */
    }
    g->exec = exec;
    memcpy(g->outs, out, (size_t)nout * sizeof *out);
  }
  g->used = ++ev->graph_uses;
  if (g->start_signals &&
      (s = ev->comm->start_signals_raise(ev->comm, g->start_signals, ev->b->current_stream(ev->b))) != HIR_OK)
    return hir__ev_fail(ev, s, "hir_run: marking the graph's receive buffers free before its launch: %s", ev->comm->error),
           ev->status;
  HIR__RANGE_PUSH("GraphReplay"); /* the whole run, one range: its nodes were walked when it was captured */
  s = ev->b->graph_launch(ev->b, g->exec);
  HIR__RANGE_POP();
  if (s != HIR_OK)
    return hir__ev_fail(ev, s, "hir_run: launching the graph failed on the %s backend: %s", ev->b->name, ev->b->error), ev->status;
  memcpy(out, g->outs, (size_t)nout * sizeof *out);
  return HIR_OK;
}

/* Graph mode 2's arguments: dense buffers of ours shaped as the caller's
   (an output the caller leaves to the evaluator stays so), made when the
   inputs' shapes change - the graphs, captured on the old ones, go with
   them. Only the inputs decide: every rank sees their shapes change at the
   same run (hir__shapes_agree), while whether a rank passes an output is
   its own affair. Capturing anew on one rank while its peers replay would
   hang a copy-engine receive: a captured one posts nothing to its sender. */
static int hir__stage(hir_evaluator *ev, const hir_tensor *in, int nin, const hir_tensor *out, int nout) {
  int i, k, n = nin + nout, shapes = ev->stage && ev->nstage == n, given = shapes;
  for (i = 0; i < nin && shapes; i++) {
    const hir_tensor *t = &in[i], *st = &ev->stage[i];
    shapes = t->dtype == st->dtype && t->ndims == st->ndims && !memcmp(t->sizes, st->sizes, (size_t)t->ndims * sizeof *t->sizes);
    given = given && (t->data != NULL) == (st->data != NULL);
  }
  if (shapes && given) return 1;
  if (shapes && ev->communicates && ev->ngraphs > 0)
    return hir__ev_fail(ev, HIR_ERR_INVALID, "hir_run: graph mode 2: an input that lived elsewhere (no data) is now passed, "
                        "or the other way round, after this program, which communicates, was captured on every rank; keep "
                        "passing inputs as the first captured run did"), 0;
  for (k = 0; k < ev->ngraphs; k++) hir__free_graph(ev, &ev->graphs[k]);
  ev->ngraphs = 0;
  ev->warm = 0; /* the new copies run eagerly first: a capture finds all made for them (between processes, peers' mappings) */
  hir__free_stage(ev);
  if (!(ev->stage = (hir_tensor *)HIR_MALLOC(2 * (size_t)(n + 1) * sizeof *ev->stage)))
    return hir__ev_fail(ev, HIR_ERR_NOMEM, "hir_run: out of memory for graph mode 2's arguments"), 0;
  ev->stage_run = ev->stage + n + 1;
  for (i = 0; i < n; i++) {
    const hir_tensor *t = i < nin ? &in[i] : &out[i - nin];
    size_t bytes = (size_t)hir__numel(t->ndims, t->sizes) * hir_dtype_size(t->dtype);
    ev->stage[i] = *t;
    memset(ev->stage[i].strides, 0, sizeof ev->stage[i].strides);
    ev->stage[i].data = NULL;
    ev->nstage = i + 1;
    if (t->data && ev->b->alloc(ev->b, bytes ? bytes : 1, &ev->stage[i].data) != HIR_OK)
      return hir__ev_fail(ev, HIR_ERR_NOMEM, "hir_run: graph mode 2: no memory for a copy of %s %d (%zu bytes): %s",
                          i < nin ? "input" : "output", i < nin ? i : i - nin, bytes, ev->b->error), 0;
  }
  return 1;
}

/* A copy from src to dst on the backend, their strides written out (all 0
   is row-major to hir_run, not to a backend). */
static hir_status hir__copy_args(hir_evaluator *ev, void *stream, const hir_tensor *dst, const hir_tensor *src) {
  hir_tensor d = *dst, x = *src;
  if (hir__dense(&d)) hir__contiguous_strides(&d);
  if (hir__dense(&x)) hir__contiguous_strides(&x);
  return ev->b->copy(ev->b, stream, &d, &x);
}

/* Graph mode 2: the graph replays on the staged arguments, the caller's
   inputs copied in before it and its outputs out after, in stream order.
   New copies run once eagerly, as graph mode 1's new shapes do. An output
   the caller passes now but left to the evaluator when staged is copied
   out of the evaluator's buffer; one it leaves now is handed back in ours. */
static hir_status hir__run_staged(hir_evaluator *ev, const hir_tensor *in, int nin, hir_tensor *out, int nout) {
  void *stream;
  hir_tensor *run;
  hir_status s = HIR_OK;
  int i;
  if (hir__graph_obstacle(ev)[0]) return hir__run_graph(ev, in, nin, out, nout); /* eager: says why */
  if (!hir__stage(ev, in, nin, out, nout)) return ev->status;
  run = ev->stage_run;
  memcpy(run, ev->stage, (size_t)(nin + nout) * sizeof *run);
  stream = ev->b->current_stream(ev->b);
  for (i = 0; i < nin && s == HIR_OK; i++)
    if (in[i].data) s = hir__copy_args(ev, stream, &run[i], &in[i]);
    else run[i] = in[i]; /* a scalar, by value; an input that lives elsewhere */
  if (s != HIR_OK)
    return hir__ev_fail(ev, s, "hir_run: graph mode 2: copying input %d in failed on the %s backend: %s", i - 1, ev->b->name,
                        ev->b->error), ev->status;
  if ((s = hir__run_graph(ev, run, nin, run + nin, nout)) != HIR_OK) return s;
  for (i = 0; i < nout && s == HIR_OK; i++)
    if (out[i].data) s = hir__copy_args(ev, stream, &out[i], &run[nin + i]);
    else out[i] = run[nin + i]; /* the evaluator's own buffer */
  if (s != HIR_OK)
    return hir__ev_fail(ev, s, "hir_run: graph mode 2: copying output %d out failed on the %s backend: %s", i - 1, ev->b->name,
                        ev->b->error), ev->status;
  return HIR_OK;
}

// >>eval_run
static hir_status hir__run(hir_evaluator *ev, const hir_tensor *user_in, int nin, hir_tensor *user_out, int nout) {
  const hir_tensor *in = user_in;
  hir_tensor *out = user_out;
  hir_status s;
  if (ev && !hir__unfold_args(ev, &in, nin, &out, nout)) return ev->status;
  if ((s = hir__prepare(ev, in, nin, out, nout)) != HIR_OK) return s;
  if ((ev->shapes_unchecked || ev->check_shapes) && ev->devices_team && !hir__shapes_agree(ev, user_in, nin)) return ev->status;
  ev->shapes_unchecked = 0;
  s = !ev->graph ? hir__run_eager(ev, in, nin, out, nout)
      : ev->staged ? hir__run_staged(ev, in, nin, out, nout)
                   : hir__run_graph(ev, in, nin, out, nout);
  if (s == HIR_OK) hir__fold_outputs(ev, out, user_out, nout);
  return s;
}

/* A run that fails on this rank tells the world (hir__tell_world). */
HIRDEF hir_status hir_run(hir_evaluator *ev, const hir_tensor *in, int nin, hir_tensor *out, int nout) {
  hir_status s;
  if (!ev) return HIR_ERR_INVALID;
  if ((s = hir__run(ev, in, nin, out, nout)) == HIR_OK) return HIR_OK;
  if (ev->shared_error) return ev->shared_error = 0, s;
  return hir__tell_world(ev);
}

// >>tune
/* The automatic choice by measurement. A candidate is data (hir__cand); the
   tuner lowers each on this rank, checks it on the given shapes (no
   communication), and the ranks agree on which to run (an allgather of a
   byte each). Each runnable candidate runs warmup + iters times, the ranks
   meeting before every timed run; its outputs are compared with serial's,
   its buffers with the memory limit. A second allgather carries each
   rank's medians and verdicts: a candidate's time is its slowest rank's,
   a verdict against it anywhere drops it. The fastest few are then timed
   again in turns (the final round), and every rank picks the same fastest
   of those. The choice is cached by the input shapes; at most
   HIR__TUNE_LIVE choices keep their program and buffers at once. */
enum { HIR__TUNE_LIVE = 4, HIR__TUNE_MAX_CANDS = 64, HIR__TUNE_EAGER = 3 }; /* each live choice holds its buffers and streams */
enum { HIR__TUNE_FINAL = 3, HIR__TUNE_TURNS = 3 }; /* the final round: how many candidates, how many turns each */

typedef struct hir__cand {
  int serial;                   /* the fusion without its Stream axes */
  int collective;               /* the P2P chains as collective pipelines of `parts` parts (HIR_SCHEDULE_COLLECTIVE) */
  int gather_first;             /* the P2P allgathers' loops first, their readers whole (stream.gather_first) */
  int column_parts;             /* a GEMM on a P2P allgather's chunks cut by columns (stream.experimental.column_parts) */
  int ring;                     /* P2P steps around a ring, else linear */
  int parts, streams, bounded;
  int nccl_p2p;                 /* send/recv on NCCL, not the copy engines (hir_tuner.vary_p2p) */
  int eager;                    /* in graph mode, run without a graph (the eager round of hir__tune_shape) */
} hir__cand;

enum { HIR__CAND_DROPPED, HIR__CAND_RUN, HIR__CAND_SAME };
typedef struct hir__cand_state {
  hir__cand c;
  int state, same_as;
  double ms;                    /* this rank's median; once agreed, the slowest rank's */
  int finalist;                 /* in the final round, where final_ms is its time as ms is the first round's */
  double final_ms;
  size_t memory;
  char why[200];                /* why it was dropped */
  hir_program *p;
  hir_evaluator *ev;
  uint64_t text_hash;
} hir__cand_state;

typedef struct hir__tune_entry {
  int64_t *key;                 /* nin, then per input: dtype, ndims, sizes */
  int nkey;
  hir__cand choice;
  double ms;                    /* the choice's agreed time; < 0: loaded from a file */
  int agreed;                   /* the ranks have checked they run the same choice */
  hir_program *p;               /* live: the choice lowered, and its evaluator */
  hir_evaluator *ev;
  unsigned long long used;
  char *report;                 /* what the tuning measured (hir_program_plan of p) */
} hir__tune_entry;

struct hir_tuner {
  const hir_fusion *f;
  hir_tune_desc d;
  char machine[200];
  uint64_t fusion_hash;
  int *team, nteam;             /* the devices of the fusion's meshes, ascending */
  void *team_handle;
  hir_backend *own_backend;     /* for meeting the ranks when the caller gave no backend */
  hir__meeting meeting;         /* the ranks', on the backend they meet through */
  hir__tune_entry *entries;
  int n, cap;
  int *slots, nslots;           /* entries by key: open addressing, entry index + 1 (0: empty) */
  int last;                     /* the last run's entry + 1; 0: none */
  unsigned long long uses;
  int vary_p2p;                 /* graph mode on copy-engine send/recv: candidates on NCCL's too */
  char report[4096];            /* the last tuning's, until its entry takes it */
  char *choice;                 /* the communicator's collective choice loaded with the plans (HIR_MALLOC'd), or NULL */
  int choice_agreed;            /* the ranks met over it (and took it): once */
  char error[1024];
};

static hir_status hir__tune_fail(hir_tuner *t, hir_status s, const char *fmt, ...) HIR__PRINTF(3, 4);
static hir_status hir__tune_fail(hir_tuner *t, hir_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->error, sizeof t->error, fmt, ap);
  va_end(ap);
  return s;
}

/* "serial", "p2p ring, 2 parts, 4 streams, bounded, eager" (the plan's
   words), or with file = 1 the saved form "serial nccl 0 eager 0" / "ring
   parts 2 streams 4 bounded 0 nccl 0 eager 0" ("collective parts 4 ...":
   collective pipelines; "gather first, ring" / "gather-ring": the
   allgathers first; "split weight 1/2, ring" / "split2-ring": a GEMM cut
   by columns). */
static size_t hir__cand_snprint(const hir__cand *c, int file, char *buf, size_t cap) {
  const char *sched = c->collective ? "collective" : c->ring ? "ring" : "linear";
  const char *nccl = c->nccl_p2p ? ", NCCL" : "", *eager = c->eager ? ", eager" : "";
  char first[32] = "";
  if (c->gather_first) snprintf(first, sizeof first, "%s", file ? "gather-" : "gather first, ");
  else if (c->column_parts > 1) snprintf(first, sizeof first, file ? "split%d-" : "split weight 1/%d, ", c->column_parts);
  if (c->serial)
    return (size_t)(file ? snprintf(buf, cap, "serial nccl %d eager %d", c->nccl_p2p, c->eager)
                         : snprintf(buf, cap, "serial%s%s", nccl, eager));
  if (file)
    return (size_t)snprintf(buf, cap, "%s%s parts %d streams %d bounded %d nccl %d eager %d", first, sched, c->parts, c->streams,
                            c->bounded, c->nccl_p2p, c->eager);
  if (c->parts > 1)
    return (size_t)snprintf(buf, cap, "%s%s, %d parts, %d streams%s%s%s", first, sched, c->parts, c->streams,
                            c->bounded ? ", bounded" : "", nccl, eager);
  return (size_t)snprintf(buf, cap, "%s%s, %d streams%s%s%s", first, sched, c->streams, c->bounded ? ", bounded" : "", nccl, eager);
}

/* The candidates, serial first (the reference): ring and linear, 1, 2 and 4
   parts a peer, 2 and 4 streams, and bounded buffers under a memory limit;
   collective pipelines of 2 and 4 parts on 2 and 4 streams; the P2P
   allgathers first and their readers whole (a ring on 2 streams); a plan
   file may also name column parts (stream.experimental.column_parts), which are not
   timed. Options that do not apply to a fusion lower to the same program as
   another candidate, and are timed once. In graph mode on copy-engine
   send/recv (hir_tuner.vary_p2p), each pipeline is also timed with its
   send/recv on NCCL: in a graph NCCL's kernels launch at no host cost and
   may win on small messages; a communicator that cannot capture its copy
   engines gets captured pipelines this way. Serial runs on NCCL's path. */
static int hir__candidates(const hir_tuner *t, hir__cand *c) {
  static const int parts[3] = {1, 2, 4}, streams[2] = {2, 4};
  int n = 0, s, p, k, b, nccl;
  memset(c, 0, HIR__TUNE_MAX_CANDS * sizeof *c);
  c[n].serial = 1, c[n].parts = 1, c[n].nccl_p2p = t->vary_p2p, c[n++].streams = 1;
  for (nccl = 0; nccl <= t->vary_p2p; nccl++)
    for (s = 0; s < 2; s++)
      for (p = 0; p < 3; p++)
        for (k = 0; k < 2; k++)
          for (b = 0; b <= (t->d.memory_limit > 0); b++) {
            c[n].ring = s == 0;
            c[n].parts = parts[p];
            c[n].streams = streams[k];
            c[n].nccl_p2p = nccl;
            c[n++].bounded = b;
          }
  for (p = 1; p < 3; p++)
    for (k = 0; k < 2; k++) {
      c[n].collective = 1;
      c[n].parts = parts[p];
      c[n].streams = streams[k];
      c[n++].nccl_p2p = t->vary_p2p; /* no send/recv: NCCL's path, as serial's */
    }
  for (nccl = 0; nccl <= t->vary_p2p; nccl++) { /* not column_parts: it lost every decode shape on 2 GPUs (NOTES.md 43) */
    c[n].gather_first = 1;
    c[n].ring = 1;
    c[n].parts = 1;
    c[n].streams = 2;
    c[n++].nccl_p2p = nccl;
  }
  return n;
}

/* The communicator's send/recv as candidate c wants them: on NCCL (0) or
   back on the copy engines. A no-op unless the tuner varies them. */
static hir_status hir__cand_p2p(hir_tuner *t, const hir__cand *c) {
  hir_comm *comm = t->d.eval.comm;
  if (!t->vary_p2p || comm->set_copy_engine(comm, !c->nccl_p2p) == HIR_OK) return HIR_OK;
  return hir__tune_fail(t, HIR_ERR_COMM, "hir_tuner: switching send/recv %s the copy engines: %s", c->nccl_p2p ? "off" : "onto",
                        comm->error);
}

/* A candidate's evaluator, on the caller's backend and communicator. */
static hir_status hir__cand_evaluator(hir_tuner *t, const hir__cand *c, const hir_program *p, hir_evaluator **ev) {
  hir_eval_desc e = t->d.eval;
  e.number_of_streams = c->streams;
  if (c->eager) e.graph = HIR_GRAPH_OFF;
  return hir_evaluator_create(p, &e, ev);
}

/* The candidate's program, and its evaluator unless ev is NULL. */
static hir_status hir__cand_lower(hir_tuner *t, const hir__cand *c, hir_program **p, hir_evaluator **ev) {
  hir_lower_desc d = t->d.lower;
  hir_status s;
  if (ev) *ev = NULL;
  d.stream.automatic = 0;
  d.stream.schedule = c->serial       ? HIR_SCHEDULE_SERIAL
                      : c->collective ? HIR_SCHEDULE_COLLECTIVE
                      : c->ring       ? HIR_SCHEDULE_RING
                                      : HIR_SCHEDULE_LINEAR;
  d.stream.parts = c->serial ? 0 : c->parts;
  d.stream.bounded_buffers = c->bounded;
  d.stream.gather_first = c->gather_first;
  d.stream.experimental.column_parts = c->column_parts;
  if (!d.comm) d.comm = t->d.eval.comm; /* what the candidates run on says how its send/recv run */
  d.stream.experimental.copy_own_chunk |= c->nccl_p2p; /* as hir_lower does for NCCL send/recv (the communicator is on copy engines now) */
  if ((s = hir_lower(t->f, &d, p)) != HIR_OK || !ev) return s;
  return hir__cand_evaluator(t, c, *p, ev);
}

static void hir__cand_free(hir_program **p, hir_evaluator **ev) {
  hir_evaluator_free(*ev);
  hir_program_free(*p);
  *ev = NULL;
  *p = NULL;
}

/* The backend the ranks meet through: the caller's, else a CPU one of the
   tuner's own (an evaluator's own lives only as long as it). */
static hir_backend *hir__tune_backend(hir_tuner *t) {
  if (t->d.eval.backend) return t->d.eval.backend;
  if (!t->own_backend) t->own_backend = hir_backend_cpu_create();
  return t->own_backend;
}

/* Every rank of the team's `bytes` into all (team order); a rank alone, or
   without a communicator, has only its own. */
static hir_status hir__tune_exchange(hir_tuner *t, hir_backend *b, const void *mine, void *all, size_t bytes) {
  hir_comm *c = t->d.eval.comm;
  int ms = t->d.eval.timeout_ms, from_comm;
  hir_status s;
  if (!c || t->nteam < 2) return memcpy(all, mine, bytes), HIR_OK;
  if (!t->team_handle && (s = c->team(c, t->team, t->nteam, &t->team_handle)) != HIR_OK)
    return hir__tune_fail(t, s, "hir_tuner: the team of the fusion's devices: %s", c->error);
  s = hir__meet(c, t->team_handle, t->nteam, b, &t->meeting, mine, all, bytes, hir__now_ms() + ms, &from_comm);
  if (s == HIR_OK) return HIR_OK;
  if (from_comm) return hir__tune_fail(t, s, "hir_tuner: the ranks could not meet: %s", c->error);
  if (s != HIR_ERR_TIMEOUT) return hir__tune_fail(t, s, "hir_tuner: %s", b->error);
  hir__tune_fail(t, HIR_ERR_TIMEOUT, "hir_tuner: the ranks did not meet within %d ms; a peer is dead or stuck, so the "
                 "communicator was aborted", ms);
  snprintf(c->error, sizeof c->error, "%.500s", t->error);
  c->abort(c);
  return HIR_ERR_TIMEOUT;
}

/* The largest difference between a candidate's output and serial's, both
   where the backend keeps them, relative to serial's largest value (compared
   there by max_abs, else on the host); < 0 where the shapes differ or the
   comparison failed. */
static double hir__output_diff(hir_backend *b, const hir_tensor *got, const hir_tensor *ref) {
  int64_t n = hir__numel(ref->ndims, ref->sizes);
  size_t bytes = (size_t)n * hir_dtype_size(ref->dtype);
  double diff = 0, scale = 0;
  char *host;
  if (got->dtype != ref->dtype || got->ndims != ref->ndims || memcmp(got->sizes, ref->sizes, (size_t)got->ndims * sizeof(int64_t)) != 0)
    return -1;
  if (!b->max_abs || b->max_abs(b, b->current_stream(b), got, ref, &diff, &scale) != HIR_OK) {
    if (!(host = (char *)HIR_MALLOC(2 * bytes + 1))) return -1;
    if (b->stream_synchronize(b, b->current_stream(b)) != HIR_OK || b->download(b, host, got->data, bytes) != HIR_OK ||
        b->download(b, host + bytes, ref->data, bytes) != HIR_OK)
      return HIR_FREE(host), -1;
    hir__host_max_abs(host, host + bytes, ref->dtype, n, &diff, &scale);
    HIR_FREE(host);
  }
  return diff / (scale > 0 ? scale : 1);
}

static int hir__cmp_ms(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double hir__dtype_tolerance(hir_dtype d) {
  return d == HIR_F64 ? 1e-9 : d == HIR_F32 ? 1e-4 : d == HIR_F16 ? 1e-2 : d == HIR_BF16 ? 3e-2 : d == HIR_F8E4M3 ? 0.13 : 0.26;
}

/* One run of a candidate and its sync; *ms: its wall time on this rank. */
static hir_status hir__cand_run(hir_tuner *t, hir__cand_state *cs, const hir_tensor *in, int nin, hir_tensor *out, int nout,
                                double *ms) {
  double t0 = hir__now_ms();
  hir_status s;
  memset(out, 0, (size_t)nout * sizeof *out);
  if ((s = hir_run(cs->ev, in, nin, out, nout)) != HIR_OK || (s = hir_evaluator_sync(cs->ev)) != HIR_OK) {
    char name[96];
    hir__cand_snprint(&cs->c, 0, name, sizeof name);
    return hir__tune_fail(t, s, "hir_tuner: candidate %s failed: %s", name, hir_evaluator_error(cs->ev));
  }
  *ms = hir__now_ms() - t0;
  return HIR_OK;
}

static double hir__median(double *ms, int n) {
  qsort(ms, (size_t)n, sizeof *ms, hir__cmp_ms);
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

/* How many runs of `ms` fill HIR__TUNE_FILL_MS, within [lo, hi]. */
enum { HIR__TUNE_FILL_MS = 10 };
static int hir__runs_to_fill(double ms, int lo, int hi) {
  double n = ms > 0 ? HIR__TUNE_FILL_MS / ms : hi;
  return n < lo ? lo : n > hi ? hi : (int)n;
}

/* One candidate's runs on this rank: the first (its buffers made, its
   outputs checked against serial's: ref, kept when this is serial; *worst
   > 1 where one differs beyond the tolerance, by that many tolerances),
   then warm-up runs, then timed ones, each timed one after the ranks meet.
   Unless the caller fixed the counts, the warm-up and the timed runs each
   fill about HIR__TUNE_FILL_MS on the slowest rank (short runs get enough
   samples), counted from a second run's time that the ranks share. */
static hir_status hir__cand_time(hir_tuner *t, hir__cand_state *cs, const hir_tensor *in, int nin, hir_tensor *ref,
                                 hir_tensor *out, int nout, double *worst, double *compare_ms, double *heard) {
  hir_backend *b = hir_evaluator_backend(cs->ev), *rb = hir__tune_backend(t);
  double ms[64], first, warm;
  int warmup, iters, k, i;
  hir_status s;
  char one = 1;
  *worst = 0;
  if ((s = hir__cand_run(t, cs, in, nin, out, nout, &first)) != HIR_OK) return s;
  cs->memory = hir_evaluator_memory(cs->ev);
  for (i = 0; i < nout; i++) {
    size_t bytes = (size_t)hir__numel(out[i].ndims, out[i].sizes) * hir_dtype_size(out[i].dtype);
    if (!out[i].data) continue; /* lives on another rank */
    cs->memory -= bytes <= cs->memory ? bytes : cs->memory; /* the limit is on what it holds besides the outputs */
    if (cs->c.serial && !ref[i].data) { /* the reference, kept where computed (once: serial may run eagerly too) */
      ref[i] = out[i];
      ref[i].data = NULL;
      hir__contiguous_strides(&ref[i]);
      if ((s = rb->alloc(rb, bytes, &ref[i].data)) != HIR_OK || (s = rb->copy(rb, rb->current_stream(rb), &ref[i], &out[i])) != HIR_OK)
        return hir__tune_fail(t, s, "hir_tuner: keeping serial's output: %s", rb->error);
    } else if (ref[i].data) {
      double t1 = hir__now_ms(), d = hir__output_diff(rb, &out[i], &ref[i]);
      *compare_ms += hir__now_ms() - t1;
      if (!(d >= 0 && d <= hir__dtype_tolerance(out[i].dtype)) && !(*worst > 1)) /* the first bad output, as a ratio */
        *worst = d >= 0 ? d / hir__dtype_tolerance(out[i].dtype) : 1e300;
    }
  }
  if ((s = hir__cand_run(t, cs, in, nin, out, nout, &warm)) != HIR_OK) return s;
  if ((s = hir__tune_exchange(t, b, &warm, heard, sizeof warm)) != HIR_OK) return s;
  for (i = 0; i < t->nteam; i++) warm = heard[i] > warm ? heard[i] : warm;
  warmup = t->d.warmup > 0 ? t->d.warmup - 2 : hir__runs_to_fill(warm, 0, 64);
  iters = t->d.iters > 0 ? (t->d.iters < 64 ? t->d.iters : 64) : hir__runs_to_fill(warm, 3, 64);
  for (k = 0; k < warmup; k++)
    if ((s = hir__cand_run(t, cs, in, nin, out, nout, &ms[0])) != HIR_OK) return s;
  for (k = 0; k < iters; k++) {
    if ((s = hir__tune_exchange(t, b, &one, heard, 1)) != HIR_OK) return s; /* the ranks meet */
    if ((s = hir__cand_run(t, cs, in, nin, out, nout, &ms[k])) != HIR_OK) return s;
  }
  cs->ms = hir__median(ms, iters);
  return HIR_OK;
}

/* Whether a scope switches streams (a program that does not runs alike
   with any number of them). */
static int hir__switches_streams(const hir_scope *s) {
  int i;
  for (i = 0; i < s->exprs.n; i++) {
    const hir_expr *e = (const hir_expr *)s->exprs.items[i];
    if (e->kind == HIR_EXPR_SET_CURRENT_STREAM || hir__switches_streams(&e->body) || hir__switches_streams(&e->orelse)) return 1;
  }
  return 0;
}

/* Lowers and checks every candidate on these shapes; marks the ones that
   lower to an earlier one's program. No communication. */
static void hir__cands_check(hir_tuner *t, hir__cand_state *cs, int n, const hir_tensor *in, int nin, hir_tensor *out, int nout) {
  const hir_tensor *uin;
  hir_tensor *uout;
  int k, j;
  for (k = 0; k < n; k++) {
    hir_status s = hir__cand_lower(t, &cs[k].c, &cs[k].p, &cs[k].ev);
    size_t len;
    char *text;
    cs[k].state = HIR__CAND_RUN;
    cs[k].same_as = -1;
    if (s != HIR_OK) {
      snprintf(cs[k].why, sizeof cs[k].why, "%.190s", cs[k].ev ? hir_evaluator_error(cs[k].ev) : hir_program_error(cs[k].p));
      cs[k].state = HIR__CAND_DROPPED;
      continue;
    }
    memset(out, 0, (size_t)nout * sizeof *out);
    uin = in, uout = out;
    if (!hir__unfold_args(cs[k].ev, &uin, nin, &uout, nout) || hir__prepare(cs[k].ev, uin, nin, uout, nout) != HIR_OK) {
      snprintf(cs[k].why, sizeof cs[k].why, "%.190s", hir_evaluator_error(cs[k].ev));
      cs[k].state = HIR__CAND_DROPPED;
      continue;
    }
    hir_evaluator_free(cs[k].ev); /* its streams and their workspaces come back when it is timed */
    cs[k].ev = NULL;
    len = hir_program_snprint(cs[k].p, NULL, 0);
    if (!(text = (char *)HIR_MALLOC(len + 1))) continue; /* not compared: timed on its own */
    hir_program_snprint(cs[k].p, text, len + 1);
    cs[k].text_hash = hir__fnv(text, len, 1469598103934665603ull);
    HIR_FREE(text);
    for (j = 0; j < k && cs[k].state == HIR__CAND_RUN; j++)
      if (cs[j].state != HIR__CAND_DROPPED && cs[j].same_as < 0 && cs[j].text_hash && cs[j].text_hash == cs[k].text_hash &&
          cs[j].c.nccl_p2p == cs[k].c.nccl_p2p && (cs[j].c.streams == cs[k].c.streams || !hir__switches_streams(&cs[k].p->top)))
        cs[k].state = HIR__CAND_SAME, cs[k].same_as = j;
  }
}

typedef struct hir__cand_verdict { /* what each rank says of a candidate after timing it */
  double ms, worst;                /* its median; how far its outputs are from serial's, in tolerances */
  uint64_t memory;                 /* its buffers' bytes */
} hir__cand_verdict;

/* Times candidates [from, n) that run, one at a time (its buffers go
   before the next's come), then agrees with the other ranks: a candidate's
   time is its slowest rank's; the first rank (in team order) that finds it
   wrong or too big drops it, with the same words everywhere. spent adds
   this rank's ms making evaluators, running, comparing outputs. */
static hir_status hir__cands_time(hir_tuner *t, hir_backend *b, hir__cand_state *cs, int from, int n, const hir_tensor *in,
                                  int nin, hir_tensor *ref, hir_tensor *out, int nout, hir__cand_verdict *verdicts,
                                  hir__cand_verdict *heard, double *spent) {
  int k, r, m = n - from;
  hir_status s;
  double t1;
  if (m <= 0) return HIR_OK;
  for (k = from; k < n; k++) {
    double worst = 0;
    memset(&verdicts[k], 0, sizeof verdicts[k]);
    if (cs[k].state != HIR__CAND_RUN) continue;
    t1 = hir__now_ms();
    if ((s = hir__cand_p2p(t, &cs[k].c)) != HIR_OK) return s;
    if ((s = hir__cand_evaluator(t, &cs[k].c, cs[k].p, &cs[k].ev)) != HIR_OK)
      return hir__tune_fail(t, s, "hir_tuner: %s", cs[k].ev ? hir_evaluator_error(cs[k].ev) : "out of memory");
    spent[0] += hir__now_ms() - t1;
    t1 = hir__now_ms();
    if ((s = hir__cand_time(t, &cs[k], in, nin, ref, out, nout, &worst, &spent[2], (double *)heard)) != HIR_OK) return s;
    spent[1] += hir__now_ms() - t1;
    verdicts[k].ms = cs[k].ms;
    verdicts[k].worst = worst;
    verdicts[k].memory = cs[k].memory;
    hir__cand_free(&cs[k].p, &cs[k].ev);
  }
  if ((s = hir__tune_exchange(t, b, verdicts + from, heard, (size_t)m * sizeof *verdicts)) != HIR_OK) return s;
  for (k = from; k < n; k++) {
    if (cs[k].state != HIR__CAND_RUN) continue;
    cs[k].ms = 0;
    for (r = 0; r < t->nteam; r++) {
      const hir__cand_verdict *v = &heard[r * m + k - from];
      if (v->ms > cs[k].ms) cs[k].ms = v->ms;
      if (cs[k].state != HIR__CAND_RUN) continue;
      if (v->worst > 1) {
        cs[k].state = HIR__CAND_DROPPED;
        snprintf(cs[k].why, sizeof cs[k].why, "its outputs differ from serial's on device %d by %.3g times the tolerance",
                 t->team[r], v->worst);
      } else if (t->d.memory_limit && v->memory > t->d.memory_limit) {
        cs[k].state = HIR__CAND_DROPPED;
        snprintf(cs[k].why, sizeof cs[k].why, "its buffers take %llu bytes on device %d, over the limit of %zu",
                 (unsigned long long)v->memory, t->team[r], t->d.memory_limit);
      }
    }
  }
  return HIR_OK;
}

/* The eager round: in graph mode on a backend that captures, the
   HIR__TUNE_EAGER fastest candidates again without a graph, appended after
   cs[n - 1]; returns how many (the agreed times make every rank pick the
   same). A graph can lose to its own eager run: on 4 H100 a copy-engine
   ring ran slower captured (bench/NOTES.md section 38). */
static int hir__eager_round(hir_tuner *t, hir__cand_state *cs, int n, hir_status *s) {
  unsigned char picked[HIR__TUNE_MAX_CANDS] = {0};
  int m = 0, k, pick;
  *s = HIR_OK;
  if (!t->d.eval.graph || !t->d.eval.backend || !t->d.eval.backend->graph_begin) return 0;
  while (m < HIR__TUNE_EAGER && n + m < HIR__TUNE_MAX_CANDS) {
    hir__cand_state *e = &cs[n + m];
    for (pick = -1, k = 0; k < n; k++)
      if (cs[k].state == HIR__CAND_RUN && !picked[k] && (pick < 0 || cs[k].ms < cs[pick].ms)) pick = k;
    if (pick < 0) break;
    picked[pick] = 1;
    memset(e, 0, sizeof *e);
    e->c = cs[pick].c;
    e->c.eager = 1;
    e->state = HIR__CAND_RUN;
    e->same_as = -1;
    m++;
    if ((*s = hir__cand_lower(t, &e->c, &e->p, NULL)) != HIR_OK) {
      char name[96];
      hir__cand_snprint(&e->c, 0, name, sizeof name);
      *s = hir__tune_fail(t, *s, "hir_tuner: %s, lowered again: %s", name, e->p ? hir_program_error(e->p) : "out of memory");
      break;
    }
  }
  return m;
}

/* The final round: the HIR__TUNE_FINAL fastest candidates timed again in
   turns (some runs of one, then of the next, HIR__TUNE_TURNS times over, the
   order rotating), one candidate's buffers at a time. Timed in a block each,
   a schedule could win by a few percent because the GPU's clocks drifted
   between blocks (a GEMM-bound shape runs slower for a while after
   back-to-back runs) or by a lucky block, and then serve 5-15% slower
   (bench/NOTES.md section 40). Each finalist's final_ms is the median of
   these runs, agreed as before. Returns how many finalists there were. */
static int hir__final_round(hir_tuner *t, hir_backend *b, hir__cand_state *cs, int n, const hir_tensor *in, int nin,
                            hir_tensor *out, int nout, hir__cand_verdict *verdicts, hir__cand_verdict *heard, double *spent,
                            hir_status *s) {
  enum { MOST = (64 + HIR__TUNE_TURNS - 1) / HIR__TUNE_TURNS * HIR__TUNE_TURNS };
  int pick[HIR__TUNE_FINAL], per[HIR__TUNE_FINAL], got[HIR__TUNE_FINAL] = {0}, m = 0, k, j, turn, i, r;
  double ms[HIR__TUNE_FINAL][MOST], warm, t1;
  char one = 1;
  *s = HIR_OK;
  while (m < HIR__TUNE_FINAL) { /* from the agreed times: the same finalists on every rank */
    int best = -1;
    for (k = 0; k < n; k++)
      if (cs[k].state == HIR__CAND_RUN && !cs[k].finalist && (best < 0 || cs[k].ms < cs[best].ms)) best = k;
    if (best < 0) break;
    cs[best].finalist = 1;
    pick[m] = best;
    j = t->d.iters > 0 ? (t->d.iters < 64 ? t->d.iters : 64) : hir__runs_to_fill(cs[best].ms, 3, 64);
    per[m++] = (j + HIR__TUNE_TURNS - 1) / HIR__TUNE_TURNS;
  }
  if (m < 2) {
    for (k = 0; k < m; k++) cs[pick[k]].finalist = 0;
    return 0;
  }
  for (turn = 0; turn < HIR__TUNE_TURNS && *s == HIR_OK; turn++)
    for (i = 0; i < m && *s == HIR_OK; i++) {
      int f = (i + turn) % m;
      hir__cand_state *c = &cs[pick[f]];
      t1 = hir__now_ms();
      if ((*s = hir__cand_p2p(t, &c->c)) != HIR_OK) break;
      if ((!c->p && (*s = hir__cand_lower(t, &c->c, &c->p, NULL)) != HIR_OK) ||
          (*s = hir__cand_evaluator(t, &c->c, c->p, &c->ev)) != HIR_OK) {
        *s = hir__tune_fail(t, *s, "hir_tuner: the final round: %s",
                            c->ev ? hir_evaluator_error(c->ev) : c->p ? hir_program_error(c->p) : "out of memory");
        break;
      }
      spent[0] += hir__now_ms() - t1;
      t1 = hir__now_ms();
      for (k = 0; k < 2 && *s == HIR_OK; k++) *s = hir__cand_run(t, c, in, nin, out, nout, &warm); /* buffers, then settled */
      for (k = 0; k < per[f] && *s == HIR_OK; k++) /* each timed run after the ranks meet */
        if ((*s = hir__tune_exchange(t, b, &one, heard, 1)) == HIR_OK) *s = hir__cand_run(t, c, in, nin, out, nout, &ms[f][got[f]++]);
      spent[1] += hir__now_ms() - t1;
      hir_evaluator_free(c->ev);
      c->ev = NULL;
    }
  if (*s != HIR_OK) return m;
  for (j = 0; j < m; j++) {
    memset(&verdicts[j], 0, sizeof verdicts[j]);
    verdicts[j].ms = hir__median(ms[j], got[j]);
  }
  if ((*s = hir__tune_exchange(t, b, verdicts, heard, (size_t)m * sizeof *verdicts)) != HIR_OK) return m;
  for (j = 0; j < m; j++)
    for (cs[pick[j]].final_ms = 0, r = 0; r < t->nteam; r++)
      if (heard[r * m + j].ms > cs[pick[j]].final_ms) cs[pick[j]].final_ms = heard[r * m + j].ms;
  return m;
}

/* The tuning of one shape: every rank checks, the ranks agree on what runs,
   time it, and agree on the fastest. The report goes to t->report. */
static hir_status hir__tune_shape(hir_tuner *t, const hir_tensor *in, int nin, hir__cand *choice, double *choice_ms) {
  hir__cand cands[HIR__TUNE_MAX_CANDS];
  hir__cand_state cs[HIR__TUNE_MAX_CANDS];
  unsigned char mine[HIR__TUNE_MAX_CANDS + 200], *all = NULL; /* each candidate's state, then why serial was dropped */
  const size_t said = HIR__TUNE_MAX_CANDS + 200;
  hir__cand_verdict verdicts[HIR__TUNE_MAX_CANDS], *heard = NULL;
  hir_backend *b = NULL;
  hir_tensor *out = NULL, *ref = NULL;
  int n = hir__candidates(t, cands), nout = t->f->outputs.n, k, r, best = -1, same = 0, from, finalists = 0;
  hir_status s = HIR_OK;
  double t0 = hir__now_ms(), lower_ms, spent[3] = {0, 0, 0}; /* making evaluators, running, comparing outputs */
  size_t at;
  memset(cs, 0, sizeof cs);
  for (k = 0; k < n; k++) cs[k].c = cands[k];
  out = (hir_tensor *)HIR_MALLOC((size_t)(nout + 1) * sizeof *out);
  ref = (hir_tensor *)HIR_MALLOC((size_t)(nout + 1) * sizeof *ref);
  all = (unsigned char *)HIR_MALLOC((size_t)t->nteam * said);
  heard = (hir__cand_verdict *)HIR_MALLOC((size_t)t->nteam * sizeof verdicts + 1);
  if (!out || !ref || !all || !heard) {
    s = hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner: out of memory");
    goto done;
  }
  memset(ref, 0, (size_t)(nout + 1) * sizeof *ref);
  hir__cands_check(t, cs, n, in, nin, out, nout);
  lower_ms = hir__now_ms() - t0;
  if (!(b = hir__tune_backend(t))) {
    s = hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner: out of memory");
    goto done;
  }
  /* 1. what runs: dropped on any rank drops it; the same program as another on every rank, once */
  memset(mine, 0, sizeof mine);
  for (k = 0; k < n; k++) mine[k] = (unsigned char)cs[k].state;
  snprintf((char *)mine + HIR__TUNE_MAX_CANDS, 200, "%s", cs[0].why);
  if ((s = hir__tune_exchange(t, b, mine, all, said)) != HIR_OK) goto done;
  for (k = 0; k < n; k++) {
    int dropped_on = -1, all_same = 1;
    for (r = 0; r < t->nteam; r++) {
      if (all[r * said + k] == HIR__CAND_DROPPED && dropped_on < 0) dropped_on = r;
      all_same &= all[r * said + k] == HIR__CAND_SAME;
    }
    if (k == 0 && dropped_on >= 0) /* serial: every rank says why, alike */
      snprintf(cs[k].why, sizeof cs[k].why, "on device %d: %.170s", t->team[dropped_on], (const char *)all + dropped_on * said + HIR__TUNE_MAX_CANDS);
    else if (dropped_on >= 0 && cs[k].state != HIR__CAND_DROPPED)
      snprintf(cs[k].why, sizeof cs[k].why, "refused on device %d", t->team[dropped_on]);
    cs[k].state = dropped_on >= 0 ? HIR__CAND_DROPPED : all_same ? HIR__CAND_SAME : HIR__CAND_RUN;
    if (cs[k].state != HIR__CAND_RUN) hir__cand_free(&cs[k].p, &cs[k].ev);
  }
  /* 2. time each, 3. agree on the times and verdicts; 4. the eager round; 5. the final round */
  if ((s = hir__cands_time(t, b, cs, 0, n, in, nin, ref, out, nout, verdicts, heard, spent)) != HIR_OK) goto done;
  from = n;
  n += hir__eager_round(t, cs, n, &s);
  if (s != HIR_OK || (s = hir__cands_time(t, b, cs, from, n, in, nin, ref, out, nout, verdicts, heard, spent)) != HIR_OK) goto done;
  finalists = hir__final_round(t, b, cs, n, in, nin, out, nout, verdicts, heard, spent, &s);
  if (s != HIR_OK) goto done;
  for (k = 0; k < n; k++)
    if (cs[k].state == HIR__CAND_RUN && (finalists ? cs[k].finalist && (best < 0 || cs[k].final_ms < cs[best].final_ms)
                                                   : best < 0 || cs[k].ms < cs[best].ms))
      best = k;
  if (best < 0) {
    s = hir__tune_fail(t, cs[0].state == HIR__CAND_DROPPED && strstr(cs[0].why, "over the limit") ? HIR_ERR_NOMEM : HIR_ERR_SHAPE,
                       "hir_tuner: every candidate was dropped; serial %s", cs[0].why);
    goto done;
  }
  *choice = cs[best].c;
  *choice_ms = finalists ? cs[best].final_ms : cs[best].ms;
  { /* the report: what was measured, chosen, dropped */
    char name[96];
    hir__cand_snprint(&cs[best].c, 0, name, sizeof name);
    at = (size_t)snprintf(t->report, sizeof t->report, "tuned on %d rank%s in %.0f ms: %s, %.3f ms (the slowest rank's median; "
                          "this rank's tuning: lowering and checking %.0f ms, evaluators %.0f, runs %.0f, comparing outputs "
                          "%.0f); measured:", t->nteam, t->nteam == 1 ? "" : "s", hir__now_ms() - t0, name, *choice_ms,
                          lower_ms, spent[0], spent[1] - spent[2], spent[2]);
    for (k = 0; k < n && at < sizeof t->report; k++)
      if (cs[k].state == HIR__CAND_RUN) {
        hir__cand_snprint(&cs[k].c, 0, name, sizeof name);
        at += (size_t)snprintf(t->report + at, sizeof t->report - at, " %s %.3f;", name, cs[k].ms);
      }
    if (finalists && at < sizeof t->report)
      at += (size_t)snprintf(t->report + at, sizeof t->report - at, " then the %d fastest again, in turns:", finalists);
    for (k = 0; finalists && k < n && at < sizeof t->report; k++)
      if (cs[k].state == HIR__CAND_RUN && cs[k].finalist) {
        hir__cand_snprint(&cs[k].c, 0, name, sizeof name);
        at += (size_t)snprintf(t->report + at, sizeof t->report - at, " %s %.3f;", name, cs[k].final_ms);
      }
    for (k = 0; k < n && at < sizeof t->report; k++)
      if (cs[k].state == HIR__CAND_DROPPED) {
        int len = (int)strcspn(cs[k].why, ";"); /* the reason's first clause */
        hir__cand_snprint(&cs[k].c, 0, name, sizeof name);
        at += (size_t)snprintf(t->report + at, sizeof t->report - at, " dropped %s: %.*s;", name, len < 120 ? len : 120, cs[k].why);
      }
    for (k = 0; k < n; k++) same += cs[k].state == HIR__CAND_SAME;
    if (at < sizeof t->report && same)
      snprintf(t->report + at, sizeof t->report - at, " %d of %d candidates lowered to another's program", same, n);
  }
done:
  for (k = 0; k < n; k++) hir__cand_free(&cs[k].p, &cs[k].ev);
  for (k = 0; ref && k < nout; k++)
    if (ref[k].data) b->release(b, ref[k].data);
  if (t->vary_p2p) t->d.eval.comm->set_copy_engine(t->d.eval.comm, 1); /* as the caller left it */
  HIR_FREE(out);
  HIR_FREE(ref);
  HIR_FREE(all);
  HIR_FREE(heard);
  return s;
}

/* ---- the cache: choices by input shapes ---- */
static int hir__tune_key(const hir_tensor *in, int nin, int64_t *key) {
  int i, a, n = 0;
  if (key) key[n] = nin;
  n++;
  for (i = 0; i < nin; i++) {
    if (key) key[n] = in[i].dtype, key[n + 1] = in[i].ndims;
    n += 2;
    for (a = 0; a < in[i].ndims; a++, n++)
      if (key) key[n] = in[i].sizes[a];
  }
  return n;
}

/* The slot of key in t->slots: its entry's, or the empty one it would take. */
static int hir__tune_slot(const hir_tuner *t, const int64_t *key, int nkey) {
  int at = (int)(hir__fnv(key, (size_t)nkey * sizeof *key, 1469598103934665603ull) & (uint64_t)(t->nslots - 1));
  for (;; at = (at + 1) & (t->nslots - 1)) {
    const hir__tune_entry *e = t->slots[at] ? &t->entries[t->slots[at] - 1] : NULL;
    if (!e || (e->nkey == nkey && !memcmp(e->key, key, (size_t)nkey * sizeof *key))) return at;
  }
}

static hir__tune_entry *hir__tune_find(hir_tuner *t, const int64_t *key, int nkey) {
  int at;
  if (!t->nslots) return NULL;
  at = hir__tune_slot(t, key, nkey);
  return t->slots[at] ? &t->entries[t->slots[at] - 1] : NULL;
}

/* The slots again, room for `room` entries at most half full. */
static int hir__tune_index(hir_tuner *t, int room) {
  int n = 16, i;
  while (n < 2 * room) n *= 2;
  if (n != t->nslots) {
    int *slots = (int *)HIR_MALLOC((size_t)n * sizeof *slots);
    if (!slots) return 0;
    HIR_FREE(t->slots);
    t->slots = slots;
    t->nslots = n;
  }
  memset(t->slots, 0, (size_t)n * sizeof *t->slots);
  for (i = 0; i < t->n; i++) t->slots[hir__tune_slot(t, t->entries[i].key, t->entries[i].nkey)] = i + 1;
  return 1;
}

/* A new entry (its key not there yet); its pointer lasts until the next add. */
static hir__tune_entry *hir__tune_add(hir_tuner *t, const int64_t *key, int nkey, const hir__cand *c, double ms) {
  hir__tune_entry *e;
  if (!hir__grow_heap((void **)&t->entries, &t->cap, t->n + 1, sizeof *t->entries) ||
      (2 * (t->n + 1) > t->nslots && !hir__tune_index(t, t->n + 1)))
    return NULL;
  e = &t->entries[t->n];
  memset(e, 0, sizeof *e);
  if (!(e->key = (int64_t *)HIR_MALLOC((size_t)nkey * sizeof *key))) return NULL;
  memcpy(e->key, key, (size_t)nkey * sizeof *key);
  e->nkey = nkey;
  e->choice = *c;
  e->ms = ms;
  t->slots[hir__tune_slot(t, key, nkey)] = ++t->n;
  return e;
}

static hir__tune_entry *hir__tune_last(const hir_tuner *t) { return t && t->last ? &t->entries[t->last - 1] : NULL; }

/* The entry's choice, lowered and ready; the least recently used live
   entry beyond HIR__TUNE_LIVE gives back its program and buffers. A choice
   loaded from a file is checked against the other ranks' first (every rank
   must run the same schedule). */
/* The collective choice loaded with the plans, given to the communicator
   on every rank, where the ranks loaded the same (by hash; none counts as
   the empty text): at the tuner's first run, once, before it tunes or runs
   a saved plan (every rank's tuner runs it there). */
static hir_status hir__tune_take_choice(hir_tuner *t) {
  hir_comm *c = t->d.eval.comm;
  const char *text = t->choice ? t->choice : "";
  uint64_t mine = hir__fnv(text, strlen(text), 1469598103934665603ull), *all;
  hir_status s = HIR_OK;
  int r;
  if (!(all = (uint64_t *)HIR_MALLOC((size_t)(t->nteam > 0 ? t->nteam : 1) * sizeof *all)))
    return hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner: out of memory");
  if (!hir__tune_backend(t)) s = hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner: out of memory");
  else s = hir__tune_exchange(t, hir__tune_backend(t), &mine, all, sizeof mine);
  for (r = 0; s == HIR_OK && r < t->nteam; r++)
    if (all[r] != mine)
      s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner: the ranks' saved plans hold different choices of collective paths "
                         "(device %d's and device %d's 'collectives' lines differ); load the same plans on every rank, or tune "
                         "again", t->team[r], t->d.lower.my_device);
  HIR_FREE(all);
  if (s == HIR_OK && t->choice && c) {
    if (!c->set_collective_choice)
      s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner: the saved plans hold a choice of collective paths ('collectives' "
                         "line), which this communicator cannot take; tune again with it");
    else if ((s = c->set_collective_choice(c, t->choice)) != HIR_OK)
      s = hir__tune_fail(t, s, "hir_tuner: the saved choice of collective paths: %.900s", c->error);
  }
  if (s == HIR_OK) t->choice_agreed = 1;
  return s;
}

static hir_status hir__tune_live(hir_tuner *t, hir__tune_entry *e) {
  hir_status s;
  int i, live = 0, oldest = -1;
  e->used = ++t->uses;
  if (e->ev) return HIR_OK;
  for (i = 0; i < t->n; i++)
    if (t->entries[i].ev) {
      live++;
      if (oldest < 0 || t->entries[i].used < t->entries[oldest].used) oldest = i;
    }
  if (live >= HIR__TUNE_LIVE) hir__cand_free(&t->entries[oldest].p, &t->entries[oldest].ev);
  if ((s = hir__cand_lower(t, &e->choice, &e->p, &e->ev)) != HIR_OK) {
    s = hir__tune_fail(t, s, "hir_tuner: the chosen schedule: %s", e->ev ? hir_evaluator_error(e->ev) : hir_program_error(e->p));
    hir__cand_free(&e->p, &e->ev);
    return s;
  }
  if (!e->agreed) {
    char text[96], mine[96];
    int r;
    char *all = (char *)HIR_MALLOC((size_t)t->nteam * sizeof mine);
    memset(mine, 0, sizeof mine);
    hir__cand_snprint(&e->choice, 1, mine, sizeof mine);
    if (!all) s = hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner: out of memory");
    else if (!hir__tune_backend(t)) s = hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner: out of memory");
    else s = hir__tune_exchange(t, hir__tune_backend(t), mine, all, sizeof mine);
    for (r = 0; s == HIR_OK && r < t->nteam; r++)
      if (strcmp(all + r * sizeof mine, mine) != 0) {
        snprintf(text, sizeof text, "%s", all + r * sizeof mine);
        s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner: the ranks' saved plans differ for these shapes: device %d runs "
                           "'%s', device %d '%s'; load the same plans on every rank, or tune again", t->team[r], text,
                           t->d.lower.my_device, mine);
      }
    HIR_FREE(all);
    if (s != HIR_OK) return hir__cand_free(&e->p, &e->ev), s;
    e->agreed = 1;
  }
  if (e->report) snprintf(e->p->plan, sizeof e->p->plan, "%s", e->report);
  else {
    char name[96];
    hir__cand_snprint(&e->choice, 0, name, sizeof name);
    snprintf(e->p->plan, sizeof e->p->plan, "from a saved plan: %s (not measured in this process)", name);
  }
  return HIR_OK;
}

/* The entry for these shapes: found, or tuned now. */
static hir_status hir__tune_entry_for(hir_tuner *t, const hir_tensor *in, int nin, hir__tune_entry **out) {
  int64_t stack[64], *key = stack;
  int nkey = hir__tune_key(in, nin, NULL);
  hir__cand choice;
  double ms;
  hir_status s = HIR_OK;
  *out = NULL;
  if (!t->choice_agreed && (s = hir__tune_take_choice(t)) != HIR_OK) return s;
  if (nkey > 64 && !(key = (int64_t *)HIR_MALLOC((size_t)nkey * sizeof *key))) return hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner: out of memory");
  hir__tune_key(in, nin, key);
  if (!(*out = hir__tune_find(t, key, nkey))) {
    if ((s = hir__tune_shape(t, in, nin, &choice, &ms)) == HIR_OK &&
        (!(*out = hir__tune_add(t, key, nkey, &choice, ms)) || !((*out)->report = (char *)HIR_MALLOC(strlen(t->report) + 1))))
      s = hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner: out of memory");
    if (s == HIR_OK) {
      memcpy((*out)->report, t->report, strlen(t->report) + 1);
      (*out)->agreed = 1; /* the ranks chose it together */
    }
  }
  if (key != stack) HIR_FREE(key);
  if (s == HIR_OK) s = hir__tune_live(t, *out);
  if (s == HIR_OK) t->last = (int)(*out - t->entries) + 1;
  return s;
}

HIRDEF hir_status hir_tuner_create(const hir_fusion *f, const hir_tune_desc *d, hir_tuner **out) {
  hir_tuner *t;
  size_t len;
  char *text;
  int i;
  if (!out) return HIR_ERR_INVALID;
  if (!(t = *out = (hir_tuner *)HIR_MALLOC(sizeof *t))) return HIR_ERR_NOMEM;
  memset(t, 0, sizeof *t);
  if (!f || !d) return hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_create: the %s is NULL", f ? "desc" : "fusion");
  if (hir_fusion_error(f)[0]) return hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_create: the fusion failed: %s", hir_fusion_error(f));
  t->f = f;
  t->d = hir_desc_defaults(d);
  len = hir_fusion_snprint(f, NULL, 0);
  t->nteam = hir__fusion_devices(f, &t->team); /* who tunes together */
  if (!(text = (char *)HIR_MALLOC(len + 1)) || !t->team) {
    HIR_FREE(text);
    return hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner_create: out of memory");
  }
  hir_fusion_snprint(f, text, len + 1);
  t->fusion_hash = hir__fnv(text, len, 1469598103934665603ull);
  HIR_FREE(text);
  t->vary_p2p = d->eval.graph && d->eval.comm && d->eval.comm->set_copy_engine && d->eval.comm->p2p_copy_engine;
  if (!t->nteam) t->team[t->nteam++] = d->lower.my_device;
  if (d->machine) snprintf(t->machine, sizeof t->machine, "%s", d->machine);
  else snprintf(t->machine, sizeof t->machine, "%s, %d ranks%s", d->eval.backend && d->eval.backend->device ? d->eval.backend->device
                : d->eval.backend ? d->eval.backend->name : "cpu", t->nteam,
                d->eval.comm && d->eval.comm->p2p_copy_engine ? ", copy-engine send/recv" : "");
  for (i = 0; i < (int)strlen(t->machine); i++) /* one line in a saved plan */
    if (t->machine[i] == '\n' || t->machine[i] == '\r') t->machine[i] = ' ';
  if (hir_team_index(t->team, t->nteam, d->lower.my_device) < 0) /* none of the fusion's devices: every candidate does */
    t->team[0] = d->lower.my_device, t->nteam = 1;                 /* nothing here, so this rank tunes alone */
  return HIR_OK;
}

HIRDEF hir_status hir_tuner_tune(hir_tuner *t, const hir_tensor *in, int nin) {
  hir__tune_entry *e;
  if (!t || !t->f) return HIR_ERR_INVALID;
  t->error[0] = 0;
  return hir__tune_entry_for(t, in, nin, &e);
}

HIRDEF hir_status hir_tuner_run(hir_tuner *t, const hir_tensor *in, int nin, hir_tensor *out, int nout) {
  hir__tune_entry *e;
  hir_status s;
  if (!t || !t->f) return HIR_ERR_INVALID;
  t->error[0] = 0;
  if ((s = hir__tune_entry_for(t, in, nin, &e)) != HIR_OK || (s = hir__cand_p2p(t, &e->choice)) != HIR_OK) return s;
  if ((s = hir_run(e->ev, in, nin, out, nout)) != HIR_OK) hir__tune_fail(t, s, "%s", hir_evaluator_error(e->ev));
  if (t->vary_p2p) t->d.eval.comm->set_copy_engine(t->d.eval.comm, 1); /* issued: the copy engines again, for others */
  return s;
}

HIRDEF hir_status hir_tuner_sync(hir_tuner *t) {
  hir_status s;
  if (!hir__tune_last(t) || !hir__tune_last(t)->ev) return HIR_ERR_INVALID;
  if ((s = hir_evaluator_sync(hir__tune_last(t)->ev)) != HIR_OK) hir__tune_fail(t, s, "%s", hir_evaluator_error(hir__tune_last(t)->ev));
  return s;
}

HIRDEF const hir_program *hir_tuner_program(const hir_tuner *t) { return hir__tune_last(t) ? hir__tune_last(t)->p : NULL; }
HIRDEF hir_evaluator *hir_tuner_evaluator(const hir_tuner *t) { return hir__tune_last(t) ? hir__tune_last(t)->ev : NULL; }
HIRDEF const char *hir_tuner_error(const hir_tuner *t) { return t ? t->error : "hir_tuner: NULL"; }

HIRDEF void hir_tuner_free(hir_tuner *t) {
  int i;
  if (!t) return;
  for (i = 0; i < t->n; i++) {
    hir__cand_free(&t->entries[i].p, &t->entries[i].ev);
    HIR_FREE(t->entries[i].key);
    HIR_FREE(t->entries[i].report);
  }
  HIR_FREE(t->entries);
  HIR_FREE(t->slots);
  HIR_FREE(t->team);
  HIR_FREE(t->choice);
  if (t->meeting.cap) hir__meeting_free(hir__tune_backend(t), &t->meeting);
  hir_backend_free(t->own_backend);
  HIR_FREE(t);
}

/* ---- saved plans: a text file ----
       hostir tuning plans 1
       version 0.23
       machine NVIDIA H200, 2 ranks, copy-engine send/recv
       fusion 3f2a9c0d11e4b7a5
       collectives kc1 2 | ar one/32 one/32 ... two/32 nccl | rs k/32 ... nccl | ag k/32 ... nccl
       plan 2 | bf16 3 1 4096 4096 | bf16 2 4096 1024 | ring parts 2 streams 4 bounded 0 nccl 0 eager 0 | 0.112
   The collectives line, where the communicator has a choice of paths to
   save (hir_comm.collective_choice), holds it in the communicator's words
   (at most 4,096 characters); the tuner gives it back to the communicator
   on every rank at its first run, where every rank loaded the same, and
   refuses that run on every rank where they differ.
   One plan a line: the inputs (count, then each one's dtype, rank and
   sizes), the choice (ring, linear, collective, or ring or linear after
   gather- or splitN-; nccl 1: its send/recv on
   NCCL, in graph mode; eager 1: run without a graph, in graph mode), its
   time in ms (-1: loaded, not measured). A file made by another hostir version, on another machine or
   for another fusion is refused by name. Loading is strict and whole: a
   line of more than 16,384 characters, a number out of range, NaN, text
   after a plan, a NUL byte or any malformed line refuses the file with its
   line number, and a refused file changes nothing; lines may end in CRLF. */
enum { HIR__PLAN_LINE_MAX = 16384, HIR__PLAN_FILE_MAX = 64 << 20, HIR__CHOICE_MAX = 4096 };

/* Appends printf's output to a growing heap text; 0 when out of memory. */
static int hir__text_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...) HIR__PRINTF(4, 5);
static int hir__text_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
  va_list ap;
  int n;
  va_start(ap, fmt);
  n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
  va_end(ap);
  if (n < 0) return 0;
  if (!*buf || *len + (size_t)n + 1 > *cap) {
    size_t want = (*cap ? *cap : 4096);
    char *grown;
    while (want < *len + (size_t)n + 1) want *= 2;
    if (!(grown = (char *)HIR_REALLOC(*buf, want))) return 0;
    *buf = grown, *cap = want;
    va_start(ap, fmt);
    vsnprintf(*buf + *len, *cap - *len, fmt, ap);
    va_end(ap);
  }
  *len += (size_t)n;
  return 1;
}

/* The plans as hir_tuner_save writes them (HIR_MALLOC'd), or NULL. */
static char *hir__tuner_text(const hir_tuner *t, size_t *len) {
  char *buf = NULL, choice[96];
  size_t cap = 0;
  int i, k, at, ok;
  *len = 0;
  hir_comm *c = t->d.eval.comm;
  ok = hir__text_add(&buf, len, &cap, "hostir tuning plans 1\nversion %s\nmachine %s\nfusion %016llx\n", HOSTIR_VERSION,
                     t->machine, (unsigned long long)t->fusion_hash);
  if (ok && (t->choice || (c && c->collective_choice))) { /* a loaded one the ranks have not taken yet, or the one in use */
    char coll[HIR__CHOICE_MAX + 1];
    size_t n = t->choice && (!t->choice_agreed || !c || !c->collective_choice) ? (size_t)snprintf(coll, sizeof coll, "%s", t->choice)
               : c->collective_choice(c, coll, sizeof coll);
    if (n > 0 && n <= HIR__CHOICE_MAX) ok = hir__text_add(&buf, len, &cap, "collectives %s\n", coll);
  }
  for (i = 0; ok && i < t->n; i++) {
    const hir__tune_entry *e = &t->entries[i];
    ok = hir__text_add(&buf, len, &cap, "plan %lld", (long long)e->key[0]);
    for (k = 0, at = 1; ok && k < e->key[0]; k++) {
      int nd = (int)e->key[at + 1], a;
      ok = hir__text_add(&buf, len, &cap, " | %s %d", hir_dtype_name((hir_dtype)e->key[at]), nd);
      for (a = 0; ok && a < nd; a++) ok = hir__text_add(&buf, len, &cap, " %lld", (long long)e->key[at + 2 + a]);
      at += 2 + nd;
    }
    hir__cand_snprint(&e->choice, 1, choice, sizeof choice);
    ok = ok && hir__text_add(&buf, len, &cap, " | %s | %.4f\n", choice, e->ms);
  }
  if (!ok) HIR_FREE(buf);
  return ok ? buf : NULL;
}

HIRDEF hir_status hir_tuner_save(const hir_tuner *t, FILE *f) {
  size_t len;
  char *text;
  hir_status s;
  if (!t || !f || !t->f) return HIR_ERR_INVALID;
  if (!(text = hir__tuner_text(t, &len))) return HIR_ERR_NOMEM;
  s = fwrite(text, 1, len, f) == len && !ferror(f) ? HIR_OK : HIR_ERR_INVALID;
  HIR_FREE(text);
  return s;
}

/* A whole decimal token as an integer in [lo, hi]. */
static int hir__plan_int(const char *tok, long long lo, long long hi, long long *v) {
  char *end;
  if (!((tok[0] >= '0' && tok[0] <= '9') || (tok[0] == '-' && tok[1] >= '0' && tok[1] <= '9'))) return 0;
  errno = 0;
  *v = strtoll(tok, &end, 10);
  return !*end && errno == 0 && *v >= lo && *v <= hi;
}

/* One "plan" line, split into its space-separated tokens, into key and
   choice; 0 with why if malformed. */
static int hir__parse_plan(char **tok, int ntok, int64_t *key, int cap, int *nkey, hir__cand *c, double *ms, char *why, size_t wcap) {
  long long v, nin, nd, f[6];
  int i, a, at = 1, n = 0, k;
  const char *sched, *base;
  char *end;
#define HIR__PLAN_NEED(cond, ...) \
  do {                            \
    if (!(cond)) {                \
      snprintf(why, wcap, __VA_ARGS__); \
      return 0;                   \
    }                             \
  } while (0)
  HIR__PLAN_NEED(ntok >= 2 && !strcmp(tok[0], "plan"), "not a plan");
  HIR__PLAN_NEED(hir__plan_int(tok[1], 0, 64, &nin), "the input count '%.20s' is not 0 to 64", tok[1]);
  key[n++] = nin;
  at = 2;
  for (i = 0; i < nin; i++) {
    hir_dtype dt;
    HIR__PLAN_NEED(at + 2 < ntok && !strcmp(tok[at], "|"), "input %d is missing", i);
    for (dt = HIR_F32; dt < HIR_DTYPE_COUNT && strcmp(hir_dtype_name(dt), tok[at + 1]); dt = (hir_dtype)(dt + 1)) {}
    HIR__PLAN_NEED(dt < HIR_DTYPE_COUNT, "input %d's dtype '%.20s' is none of hostir's", i, tok[at + 1]);
    HIR__PLAN_NEED(hir__plan_int(tok[at + 2], 0, HIR_MAX_DIMS, &nd), "input %d's rank '%.20s' is not 0 to %d", i, tok[at + 2],
                   HIR_MAX_DIMS);
    HIR__PLAN_NEED(n + 2 + nd <= cap && at + 3 + nd <= ntok, "input %d has fewer than its %lld sizes", i, nd);
    key[n++] = dt;
    key[n++] = nd;
    for (a = 0; a < nd; a++) {
      HIR__PLAN_NEED(hir__plan_int(tok[at + 3 + a], 0, INT64_MAX, &v), "input %d's size '%.24s' is not a size (0 to 2^63-1)", i,
                     tok[at + 3 + a]);
      key[n++] = v;
    }
    at += 3 + (int)nd;
  }
  memset(c, 0, sizeof *c);
  HIR__PLAN_NEED(at + 1 < ntok && !strcmp(tok[at], "|"), "the choice is missing");
  sched = tok[++at];
  k = !strcmp(sched, "serial") ? 2 : 5; /* serial nccl N eager N; S parts N streams N bounded N nccl N eager N */
  {
    static const char *const words[5] = {"parts", "streams", "bounded", "nccl", "eager"};
    for (a = 0; a < k; a++) {
      const char *word = words[a + 5 - k];
      HIR__PLAN_NEED(at + 2 + 2 * a < ntok && !strcmp(tok[at + 1 + 2 * a], word), "the choice lacks '%s'", word);
      HIR__PLAN_NEED(hir__plan_int(tok[at + 2 + 2 * a], 0, 1024, &f[a + 5 - k]), "the choice's %s '%.20s' is not a count", word,
                     tok[at + 2 + 2 * a]);
    }
  }
  at += 1 + 2 * k;
  c->nccl_p2p = (int)f[3], c->eager = (int)f[4];
  if (k == 2) {
    c->serial = 1, c->parts = c->streams = 1;
  } else {
    int skip = 0;
    c->parts = (int)f[0], c->streams = (int)f[1], c->bounded = (int)f[2];
    HIR__PLAN_NEED(c->parts >= 1 && c->parts <= 64 && c->streams >= 1 && c->streams <= 64 && c->bounded <= 1,
                   "the choice's parts, streams or bounded are out of range (1-64, 1-64, 0-1)");
    base = sched;
    if (!strncmp(sched, "gather-", 7)) c->gather_first = 1, base += 7; /* a prefix: gather-, splitN- */
    else if (sscanf(sched, "split%d-%n", &c->column_parts, &skip) == 1 && skip > 0) base += skip;
    HIR__PLAN_NEED(!(c->column_parts != 0 && (c->column_parts < 2 || c->column_parts > 1024)) &&
                   !(strcmp(base, "ring") && strcmp(base, "linear") && (strcmp(base, "collective") || base != sched)),
                   "the schedule '%.30s' is none of hostir's", sched);
    c->ring = !strcmp(base, "ring");
    c->collective = !strcmp(base, "collective");
  }
  HIR__PLAN_NEED(c->nccl_p2p <= 1 && c->eager <= 1, "the choice's nccl and eager must be 0 or 1");
  HIR__PLAN_NEED(at + 1 < ntok && !strcmp(tok[at], "|"), "the time is missing");
  errno = 0;
  *ms = strtod(tok[at + 1], &end);
  HIR__PLAN_NEED(strspn(tok[at + 1], "0123456789.eE+-") == strlen(tok[at + 1]) && !*end && errno == 0 && *ms == *ms &&
                 *ms >= -1 && *ms < 1e300, "the time '%.24s' is not a number of milliseconds", tok[at + 1]);
  HIR__PLAN_NEED(at + 2 == ntok, "text after the plan ('%.24s')", tok[at + 2]);
#undef HIR__PLAN_NEED
  *nkey = n;
  return 1;
}

/* The plans of a file's text (text[size] == 0), all or none: a refused
   file leaves the tuner as it was. Linear in the text's size. */
static hir_status hir__tuner_load_text(hir_tuner *t, char *text, size_t size) {
  enum { MAX_TOKENS = 2 + 64 * (3 + HIR_MAX_DIMS) + 16 };
  char *line = text, *tok[MAX_TOKENS], want[256], why[200];
  int64_t key[4096];
  int lineno = 0, nkey, ntok, old_n = t->n, i, plans_from = 5;
  const char *choice = NULL;
  hir__cand c;
  double ms;
  hir_status s = HIR_OK;
  const char *nul = (const char *)memchr(text, 0, size);
  if (nul)
    return hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: the file holds a NUL byte (at byte %zu); it is not a plans file",
                          (size_t)(nul - text));
  while (s == HIR_OK && line < text + size) {
    char *nl = strchr(line, '\n'), *next = nl ? nl + 1 : text + size, *p;
    size_t len = (size_t)((nl ? nl : text + size) - line);
    lineno++;
    if (len > HIR__PLAN_LINE_MAX) {
      s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: line %d is %zu characters, more than %d: not a plans file", lineno,
                         len, HIR__PLAN_LINE_MAX);
      break;
    }
    if (len && line[len - 1] == '\r') len--; /* CRLF */
    line[len] = 0;
    for (p = line; *p; p++)
      if ((unsigned char)*p < 32 || *p == 127) break;
    if (*p) {
      s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: line %d holds a control character (byte %d)", lineno, (unsigned char)*p);
      break;
    }
    if (lineno == 1 && strcmp(line, "hostir tuning plans 1"))
      s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: not a file of hostir tuning plans (line 1: '%.60s')", line);
    else if (lineno == 2 && (snprintf(want, sizeof want, "version %s", HOSTIR_VERSION), strcmp(line, want)))
      s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: the plans were made by hostir %.40s, this is %s; tune again",
                         line + (len > 8 ? 8 : len), HOSTIR_VERSION);
    else if (lineno == 3 && (snprintf(want, sizeof want, "machine %s", t->machine), strcmp(line, want)))
      s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: the plans were made on '%.100s', this is '%s'; tune again",
                         line + (len > 8 ? 8 : len), t->machine);
    else if (lineno == 4 && (snprintf(want, sizeof want, "fusion %016llx", (unsigned long long)t->fusion_hash), strcmp(line, want)))
      s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: the plans are for another fusion (%.40s; this one is %016llx)", line,
                         (unsigned long long)t->fusion_hash);
    else if (lineno == 5 && !strncmp(line, "collectives ", 12)) { /* words one space apart, as a plan's */
      choice = line + 12, plans_from = 6;
      if (len - 12 > HIR__CHOICE_MAX || !*choice || *choice == ' ' || line[len - 1] == ' ' || strstr(choice, "  "))
        s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: line 5 is not a collectives line: %s", len - 12 > HIR__CHOICE_MAX
                           ? "over 4,096 characters" : "its words must be one space apart");
    } else if (lineno >= plans_from) {
      int gap = 0; /* two spaces, or one at either end */
      for (ntok = 0, p = line; *p && ntok < MAX_TOKENS && !gap;) { /* tokens: one space apart */
        tok[ntok++] = p;
        p += strcspn(p, " ");
        if (*p) *p++ = 0, gap = !*p || *p == ' ';
        gap |= !*tok[ntok - 1];
      }
      if (*p || gap)
        s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: line %d is not a plan: %s", lineno,
                           gap ? "its fields must be one space apart" : "too many fields");
      else if (!hir__parse_plan(tok, ntok, key, 4096, &nkey, &c, &ms, why, sizeof why))
        s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: line %d is not a plan: %s", lineno, why);
      else if (!hir__tune_find(t, key, nkey) && !hir__tune_add(t, key, nkey, &c, -1)) /* the first plan for a shape stays */
        s = hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner_load: out of memory");
    }
    line = next;
  }
  if (s == HIR_OK && lineno < 4)
    s = hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: the file ends after %d lines; a header has 4", lineno);
  if (s == HIR_OK) { /* the file's choice of collective paths replaces the one loaded before; none: none */
    char *kept = choice ? (char *)HIR_MALLOC(strlen(choice) + 1) : NULL;
    if (choice && !kept) s = hir__tune_fail(t, HIR_ERR_NOMEM, "hir_tuner_load: out of memory");
    else {
      if (kept) memcpy(kept, choice, strlen(choice) + 1);
      HIR_FREE(t->choice);
      t->choice = kept;
      t->choice_agreed = 0;
    }
  }
  if (s != HIR_OK) { /* as it was */
    for (i = old_n; i < t->n; i++) HIR_FREE(t->entries[i].key);
    t->n = old_n;
    if (t->nslots) hir__tune_index(t, t->n);
  }
  return s;
}

HIRDEF hir_status hir_tuner_load(hir_tuner *t, FILE *f) {
  char *text = NULL, *grown;
  size_t size = 0, cap = 0, k;
  hir_status s;
  if (!t || !f || !t->f) return HIR_ERR_INVALID;
  do {
    if (size + 65536 + 1 > cap) {
      if (cap > HIR__PLAN_FILE_MAX || !(grown = (char *)HIR_REALLOC(text, cap = cap ? 2 * cap : 65536 + 1))) {
        HIR_FREE(text);
        return hir__tune_fail(t, cap > HIR__PLAN_FILE_MAX ? HIR_ERR_INVALID : HIR_ERR_NOMEM, "hir_tuner_load: %s",
                              cap > HIR__PLAN_FILE_MAX ? "the file is over 64 MiB: not a plans file" : "out of memory");
      }
      text = grown;
    }
    size += k = fread(text + size, 1, cap - size - 1, f);
  } while (k > 0);
  if (ferror(f)) {
    HIR_FREE(text);
    return hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load: the file could not be read");
  }
  text[size] = 0;
  s = hir__tuner_load_text(t, text, size);
  HIR_FREE(text);
  return s;
}

HIRDEF hir_status hir_tuner_load_file(hir_tuner *t, const char *path) {
  char *text, why[300];
  const char *name;
  size_t size;
  int dirfd, ok;
  hir_status s;
  if (!t || !path || !t->f) return HIR_ERR_INVALID;
  if (!hir__open_parent(path, &dirfd, &name, why, sizeof why))
    return hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load_file: %.300s: %s", path, why);
  ok = hir__read_file_at(dirfd, name, HIR__PLAN_FILE_MAX, &text, &size, why, sizeof why);
  hir__close_dir(dirfd);
  if (!ok) return hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_load_file: %.300s refused: %s", path, why);
  s = hir__tuner_load_text(t, text, size);
  HIR_FREE(text);
  return s;
}

HIRDEF hir_status hir_tuner_save_file(hir_tuner *t, const char *path) {
  char *text, why[300];
  const char *name;
  size_t len;
  int dirfd, ok;
  if (!t || !path || !t->f) return HIR_ERR_INVALID;
  if (!(text = hir__tuner_text(t, &len))) return HIR_ERR_NOMEM;
  ok = hir__open_parent(path, &dirfd, &name, why, sizeof why) && hir__write_file_at(dirfd, name, text, len, why, sizeof why);
  hir__close_dir(dirfd);
  HIR_FREE(text);
  if (!ok) return hir__tune_fail(t, HIR_ERR_INVALID, "hir_tuner_save_file: %.300s: %s", path, why);
  return HIR_OK;
}

// >>timeline
/* GPU spans need timing events, made here so that runs only record them;
   the epoch event ties the GPU's clock to the host's: on the streams the
   caller has drained (hir__sync_streams) the event passes at once, and the
   host notes the time. */
static hir_status hir__gpu_timeline_start(hir_evaluator *ev) {
  hir_backend *b = ev->b;
  void *s = b->current_stream(b);
  hir_status st = HIR_OK;
  int i;
  if (!ev->gpu_spans) {
    if (!(ev->gpu_spans = (hir__span *)HIR_MALLOC(HIR__GPU_TIMELINE_CAP * sizeof *ev->gpu_spans))) return HIR_ERR_NOMEM;
    memset(ev->gpu_spans, 0, HIR__GPU_TIMELINE_CAP * sizeof *ev->gpu_spans);
    st = b->timer_create(b, &ev->epoch);
    for (i = 0; st == HIR_OK && i < HIR__GPU_TIMELINE_CAP; i++)
      if ((st = b->timer_create(b, &ev->gpu_spans[i].start)) == HIR_OK) st = b->timer_create(b, &ev->gpu_spans[i].end);
    if (st != HIR_OK) return hir__gpu_timeline_free(ev), st;
  }
  if ((st = b->event_record(b, ev->epoch, s)) != HIR_OK || (st = b->stream_synchronize(b, s)) != HIR_OK) return st;
  ev->epoch_us = hir__now_ms() * 1e3;
  return HIR_OK;
}

HIRDEF hir_status hir_evaluator_record_timeline(hir_evaluator *ev, int record) {
  hir_status s;
  if (!ev) return HIR_ERR_INVALID;
  if (!ev->b) return ev->status ? ev->status : HIR_ERR_INVALID; /* a failed create */
  if (record && !ev->spans && !(ev->spans = (hir__span *)HIR_MALLOC(HIR__TIMELINE_CAP * sizeof *ev->spans)))
    return HIR_ERR_NOMEM;
  if (record && !ev->recording && ev->b->timer_create && ev->b->timer_elapsed) {
    /* the epoch needs idle streams: waited for under the deadline (a dead peer's work may hold them) */
    ev->status = HIR_OK;
    if ((s = hir__sync_streams(ev, "hir_evaluator_record_timeline: waiting for the streams")) != HIR_OK) return s;
    if ((s = hir__gpu_timeline_start(ev)) != HIR_OK) {
      snprintf(ev->error, sizeof ev->error, "hir_evaluator_record_timeline: GPU timing events: %s", ev->b->error);
      return s;
    }
  }
  ev->recording = record != 0;
  ev->in_group = 0;
  if (!record) ev->nspans = ev->ngpu_spans = 0;
  return HIR_OK;
}

HIRDEF int hir_evaluator_timeline_size(const hir_evaluator *ev) { return ev ? ev->nspans : 0; }

/* A GPU span's times on the host clock, from its events. */
static hir_status hir__gpu_span_times(hir_evaluator *ev, hir__span *sp) {
  double a, b;
  hir_status s;
  if ((s = ev->b->timer_elapsed(ev->b, ev->epoch, sp->start, &a)) != HIR_OK ||
      (s = ev->b->timer_elapsed(ev->b, ev->epoch, sp->end, &b)) != HIR_OK)
    return s;
  sp->t0 = ev->epoch_us + a * 1e3;
  sp->t1 = ev->epoch_us + b * 1e3;
  return HIR_OK;
}

HIRDEF hir_status hir_timeline_write(hir_evaluator *const *evs, int n, FILE *out) {
  double epoch = 0;
  int r, k, g, first = 1, any = 0;
  hir_status s;
  if (!evs || n < 1 || !out) return HIR_ERR_INVALID;
  for (r = 0; r < n; r++) /* the GPU's times first: nothing is written unless all have passed */
    for (k = 0; evs[r] && k < evs[r]->ngpu_spans; k++)
      if ((s = hir__gpu_span_times(evs[r], &evs[r]->gpu_spans[k])) != HIR_OK) return s;
  for (r = 0; r < n; r++) /* times from the earliest record */
    for (k = 0; evs[r] && k < evs[r]->nspans + evs[r]->ngpu_spans; k++) {
      double t0 = k < evs[r]->nspans ? evs[r]->spans[k].t0 : evs[r]->gpu_spans[k - evs[r]->nspans].t0;
      if (!any++ || t0 < epoch) epoch = t0;
    }
  fprintf(out, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  for (r = 0; r < n; r++) {
    const hir_evaluator *ev = evs[r];
    if (!ev) continue;
    fprintf(out, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d (%s)\"}}",
            first ? "" : ",\n", ev->device, ev->device, ev->b ? ev->b->name : "?");
    first = 0;
    /* tracks: 0 the caller's stream, k + 1 pool stream k, as the host issued
       them; then the same again as the GPU ran them (when it keeps time) */
    for (g = 0; g < (ev->gpu_spans ? 2 : 1); g++) {
      int base = g * (ev->nstreams + 1);
      for (k = 0; k <= ev->nstreams; k++) {
        char name[48] = "the caller's stream";
        if (k) snprintf(name, sizeof name, "stream %d", k - 1);
        fprintf(out, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s%s\"}}",
                ev->device, base + k, name, !ev->gpu_spans ? "" : g ? " (GPU)" : " (host)");
      }
      for (k = 0; k < (g ? ev->ngpu_spans : ev->nspans); k++) {
        const hir__span *sp = g ? &ev->gpu_spans[k] : &ev->spans[k];
        fprintf(out, ",\n{\"name\": \"%s %d\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, "
                "\"ts\": %.3f, \"dur\": %.3f}",
                hir__ops[sp->e->kind].name, sp->e->name, g ? "gpu" : "host_ir", ev->device, base + sp->track,
                sp->t0 - epoch, sp->t1 - sp->t0);
      }
    }
  }
  fprintf(out, "\n]}\n");
  return ferror(out) ? HIR_ERR_INVALID : HIR_OK;
}


#endif /* HOSTIR_IMPLEMENTATION_DONE */
#endif /* HOSTIR_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the hostir authors

Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
*/
