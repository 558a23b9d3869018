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

   A fusion, built and printed:

       hir_fusion *f = hir_fusion_create();
       hir_tv *a = hir_input(f, HIR_F32, 2);          // [M, K]
       hir_tv *b = hir_input(f, HIR_F32, 2);          // [K, N]
       hir_tv *c = hir_matmul(f, a, b);               // [M, N, rK]
       hir_output(f, c);
       if (hir_fusion_error(f)[0]) fprintf(stderr, "%s\n", hir_fusion_error(f));
       hir_fusion_print(f, stderr);
       hir_fusion_free(f);

   Table of contents (grep the markers):
       // >>api        public declarations
       // >>arena      chunked arena: one free releases a whole fusion or program
       // >>ir         scalars, IterDomains, TensorViews, exprs; the op table
       // >>build      the fusion builder (hir_input, hir_set, hir_matmul, ...)
       // >>host       building host programs by hand (hir_host_*)
       // >>print      the printer (nvFuser's dump format)

   Compile-time options (define before the implementation include):
       HOSTIR_STATIC                  every function static (private copy per file)
       HIR_MALLOC(sz) / HIR_REALLOC(p, sz) / HIR_FREE(p)
                                      all three or none; default: the C library
       HIR_ASSERT(x)                  internal invariants only; default assert()

   Errors are values: every fallible call returns a status or NULL and records
   a message that names the culprit and how to fix it. Builders are sticky: the
   first error is kept in the fusion (hir_fusion_error), later calls return NULL
   and accept NULL arguments, so a chain of calls is checked once. The library
   never aborts, never exits and never prints to stdout.
*/
#ifndef HOSTIR_H
#define HOSTIR_H

// >>api
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

typedef enum hir_dtype { HIR_F32, HIR_F64, HIR_F16, HIR_BF16, HIR_DTYPE_COUNT } hir_dtype;
typedef enum hir_ptype { HIR_SERIAL, HIR_DIDX, HIR_STREAM, HIR_PTYPE_COUNT } hir_ptype;
typedef enum hir_iter_type { HIR_ITERATION, HIR_REDUCTION, HIR_BROADCAST } hir_iter_type;
typedef enum hir_memory { HIR_MEM_GLOBAL, HIR_MEM_LOCAL } hir_memory;

/* Every expr kind; the string is what hir_expr_kind_name returns. */
#define HIR_EXPR_KIND_LIST(X)                                                \
  X(HIR_EXPR_ALLOCATE, "Allocate")                                           \
  X(HIR_EXPR_DEALLOCATE, "Deallocate")                                       \
  X(HIR_EXPR_GET_CURRENT_STREAM, "GetCurrentStream")                         \
  X(HIR_EXPR_SET_CURRENT_STREAM, "SetCurrentStream")                         \
  X(HIR_EXPR_SYNCHRONIZE, "Synchronize")                                     \
  X(HIR_EXPR_FOR_LOOP, "ForLoop")                                            \
  X(HIR_EXPR_IF_THEN_ELSE, "IfThenElse")                                     \
  X(HIR_EXPR_POST_ON_STREAM, "PostOnStream")                                 \
  X(HIR_EXPR_COMMUNICATION, "Communication")                                 \
  X(HIR_EXPR_P2P_COMMUNICATION, "P2PCommunication")                          \
  X(HIR_EXPR_WAIT, "Wait")                                                   \
  X(HIR_EXPR_START_COALESCING, "StartCoalescing")                            \
  X(HIR_EXPR_END_COALESCING, "EndCoalescing")                                \
  X(HIR_EXPR_ALIAS_SELECT, "HirAliasSelect")                                 \
  X(HIR_EXPR_LOAD_STORE, "LoadStoreOp")                                      \
  X(HIR_EXPR_BINARY, "BinaryOp")                                             \
  X(HIR_EXPR_REDUCTION, "ReductionOp")                                       \
  X(HIR_EXPR_BROADCAST, "BroadcastOp")                                       \
  X(HIR_EXPR_MATMUL, "MatmulOp")
typedef enum hir_expr_kind { HIR_EXPR_KIND_LIST(HIR__ENUM_NAME) HIR_EXPR_KIND_COUNT } hir_expr_kind;

typedef enum hir_binary_op { HIR_BINARY_ADD, HIR_BINARY_SUB, HIR_BINARY_MUL, HIR_BINARY_COUNT } hir_binary_op;

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
  X(HIR_COLL_BROADCAST, "Broadcast") X(HIR_COLL_SENDRECV, "SendRecv")
typedef enum hir_collective { HIR_COLLECTIVE_LIST(HIR__ENUM_NAME) HIR_COLLECTIVE_COUNT } hir_collective;
typedef enum hir_p2p_type { HIR_P2P_SEND, HIR_P2P_RECV } hir_p2p_type;

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
HIRDEF hir_tv     *hir_set(hir_fusion *f, hir_tv *in);
HIRDEF hir_tv     *hir_add(hir_fusion *f, hir_tv *a, hir_tv *b);
HIRDEF hir_tv     *hir_sub(hir_fusion *f, hir_tv *a, hir_tv *b);
HIRDEF hir_tv     *hir_mul(hir_fusion *f, hir_tv *a, hir_tv *b);
HIRDEF hir_tv     *hir_sum(hir_fusion *f, hir_tv *in, int naxes, const int *axes);
HIRDEF hir_tv     *hir_broadcast(hir_fusion *f, hir_tv *in, int ndims_out, const int *is_broadcast);
HIRDEF hir_tv     *hir_matmul(hir_fusion *f, hir_tv *a, hir_tv *b);
HIRDEF hir_status  hir_set_mesh(hir_tv *tv, int ndevices, const int *devices);
HIRDEF hir_status  hir_parallelize(hir_tv *tv, int axis, hir_ptype ptype);
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
HIRDEF hir_expr      *hir_tv_definition(const hir_tv *tv);          /* the fusion expr producing it */
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
HIRDEF const hir_expr *hir_program_top(const hir_program *p, int i);
/* The IR the program's tensors live in: hir_input and hir_output declare the
   program's inputs and outputs, hir_set/hir_matmul/... make compute exprs
   (take them with hir_tv_definition and append them to a scope). Owned by
   the program. */
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
HIRDEF hir_expr *hir_host_if(hir_program *p, hir_val *predicate);
HIRDEF hir_expr *hir_host_alias_select(hir_program *p, hir_tv *in, int axis, hir_val *index); /* output 0: the view */
HIRDEF hir_expr *hir_host_set(hir_program *p, hir_tv *out, hir_tv *in);
HIRDEF hir_expr *hir_host_binary(hir_program *p, hir_binary_op op, hir_tv *out, hir_tv *a, hir_tv *b);
HIRDEF hir_expr *hir_host_matmul(hir_program *p, hir_tv *out, hir_tv *a, hir_tv *b);
HIRDEF hir_expr *hir_host_communication(hir_program *p, hir_collective type, int nteam, const int *team,
                                        int root, hir_tv *in, hir_tv *out);   /* root ignored unless the type has one */
HIRDEF hir_expr *hir_host_p2p(hir_program *p, hir_p2p_type type, hir_tv *buffer, hir_val *peer);
HIRDEF hir_expr *hir_host_start_coalescing(hir_program *p);
HIRDEF hir_expr *hir_host_end_coalescing(hir_program *p);
HIRDEF hir_expr *hir_host_wait(hir_program *p, hir_expr *communication);
/* A HostUnit computing outs from ins with the program fusion's exprs between
   them, and the PostOnStream that runs it. */
HIRDEF hir_expr *hir_host_post_on_stream(hir_program *p, int nin, hir_tv *const *ins, int nout, hir_tv *const *outs);

#ifdef __cplusplus
}
#endif
#endif /* HOSTIR_H */

/* ======================================================================== */
#ifdef HOSTIR_IMPLEMENTATION
#ifndef HOSTIR_IMPLEMENTATION_DONE
#define HOSTIR_IMPLEMENTATION_DONE

#include <stdarg.h>
#include <string.h>

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

#ifndef HIR_ASSERT
#include <assert.h>
#define HIR_ASSERT(x) assert(x)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define HIR__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define HIR__PRINTF(a, b)
#endif

#define HIR__STATIC_ASSERT(name, cond) typedef char hir__static_assert_##name[(cond) ? 1 : -1]

#define HIR__ENUM_STRING(e, s) s,
static const char *const hir__status_names[] = {HIR_STATUS_LIST(HIR__ENUM_STRING)};
HIR__STATIC_ASSERT(status_names, sizeof(hir__status_names) / sizeof(hir__status_names[0]) == HIR_STATUS_COUNT);

HIRDEF const char *hir_status_str(hir_status s) {
  return ((unsigned)s < HIR_STATUS_COUNT) ? hir__status_names[s] : "unknown status";
}

static const char *const hir__dtype_names[] = {"float", "double", "__half", "__bfloat"};
static const size_t hir__dtype_sizes[] = {4, 8, 2, 2};
HIR__STATIC_ASSERT(dtype_names, sizeof(hir__dtype_names) / sizeof(hir__dtype_names[0]) == HIR_DTYPE_COUNT);

HIRDEF const char *hir_dtype_name(hir_dtype d) { return ((unsigned)d < HIR_DTYPE_COUNT) ? hir__dtype_names[d] : "?"; }
HIRDEF size_t hir_dtype_size(hir_dtype d) { return ((unsigned)d < HIR_DTYPE_COUNT) ? hir__dtype_sizes[d] : 0; }

// >>arena
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

// >>ir
typedef enum hir__val_kind { HIR__VAL_CONST, HIR__VAL_SYMBOL, HIR__VAL_NAMED, HIR__VAL_BINARY } hir__val_kind;

struct hir_val {
  hir_fusion *ir;
  hir__val_kind kind;
  int name;               /* symbols print as "i<name>"; constants take a name too */
  int64_t value;          /* constants */
  int which;              /* named scalars: hir_named_scalar */
  int op;                 /* binary: hir_scalar_op */
  hir_val *lhs, *rhs;
};

struct hir_id {
  int name;
  hir_val *extent;
  hir_iter_type iter;
  hir_ptype ptype;
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
  hir_expr *definition;   /* the fusion expr producing it, NULL for inputs and host-made views */
  unsigned char is_input, is_output;
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
  int sub;                /* hir_binary_op, hir_collective or hir_p2p_type */
  int nin, nout;
  hir_tv **in, **out;
  hir_val *val;           /* ForLoop index, IfThenElse predicate, P2P peer, AliasSelect index */
  hir_id *id;             /* ForLoop and AliasSelect axis */
  int axis;               /* AliasSelect axis */
  uint32_t flags;         /* BroadcastOp: bit i set = output axis i is new */
  int root, team_size;
  const int *team;
  hir_stream *stream;
  hir_expr *target;       /* Wait */
  hir__host_unit *unit;   /* PostOnStream */
  hir_scope *scope;       /* the scope holding this expr, if any */
  hir_scope body, orelse;
};

/* The op table: what every pass knows about an expr kind. */
enum {
  HIR__OP_COMPUTE = 1,    /* a tensor op of the fusion language */
  HIR__OP_HOST = 2,       /* a host IR node */
  HIR__OP_COMM = 4,       /* talks to other ranks */
  HIR__OP_SCOPED = 8,     /* has a body */
  HIR__OP_WAITABLE = 16   /* a Wait may name it */
};
typedef struct hir__op_info {
  hir_expr_kind kind;
  int nin, nout;          /* tensor operands; -1: any number */
  unsigned flags;
} hir__op_info;

static const hir__op_info hir__ops[] = {
    {HIR_EXPR_ALLOCATE, 1, 0, HIR__OP_HOST},
    {HIR_EXPR_DEALLOCATE, 1, 0, HIR__OP_HOST},
    {HIR_EXPR_GET_CURRENT_STREAM, 0, 0, HIR__OP_HOST},
    {HIR_EXPR_SET_CURRENT_STREAM, 0, 0, HIR__OP_HOST},
    {HIR_EXPR_SYNCHRONIZE, 0, 0, HIR__OP_HOST},
    {HIR_EXPR_FOR_LOOP, 0, 0, HIR__OP_HOST | HIR__OP_SCOPED},
    {HIR_EXPR_IF_THEN_ELSE, 0, 0, HIR__OP_HOST | HIR__OP_SCOPED},
    {HIR_EXPR_POST_ON_STREAM, -1, -1, HIR__OP_HOST},
    {HIR_EXPR_COMMUNICATION, -1, -1, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_WAITABLE},
    {HIR_EXPR_P2P_COMMUNICATION, 1, 0, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_WAITABLE},
    {HIR_EXPR_WAIT, 0, 0, HIR__OP_HOST},
    {HIR_EXPR_START_COALESCING, 0, 0, HIR__OP_HOST | HIR__OP_COMM},
    {HIR_EXPR_END_COALESCING, 0, 0, HIR__OP_HOST | HIR__OP_COMM | HIR__OP_WAITABLE},
    {HIR_EXPR_ALIAS_SELECT, 1, 1, HIR__OP_HOST},
    {HIR_EXPR_LOAD_STORE, 1, 1, HIR__OP_COMPUTE},
    {HIR_EXPR_BINARY, 2, 1, HIR__OP_COMPUTE},
    {HIR_EXPR_REDUCTION, 1, 1, HIR__OP_COMPUTE},
    {HIR_EXPR_BROADCAST, 1, 1, HIR__OP_COMPUTE},
    {HIR_EXPR_MATMUL, 2, 1, HIR__OP_COMPUTE},
};
HIR__STATIC_ASSERT(op_table, sizeof(hir__ops) / sizeof(hir__ops[0]) == HIR_EXPR_KIND_COUNT);

static const char *const hir__expr_kind_names[] = {HIR_EXPR_KIND_LIST(HIR__ENUM_STRING)};
static const char *const hir__scalar_op_names[] = {HIR_SCALAR_OP_LIST(HIR__ENUM_STRING)};
static const char *const hir__collective_names[] = {HIR_COLLECTIVE_LIST(HIR__ENUM_STRING)};
static const char *const hir__named_names[] = {"StreamIdx", "rank", "numberOfStreams"};
static const char *const hir__binary_symbols[] = {"+", "-", "*"};
static const char *const hir__binary_builders[] = {"hir_add", "hir_sub", "hir_mul"};
static const char *const hir__ptype_names[] = {"S", "deviceIdx.x", "StreamIdx"};
static const char hir__iter_chars[] = {'i', 'r', 'b'};
HIR__STATIC_ASSERT(scalar_ops, sizeof(hir__scalar_op_names) / sizeof(hir__scalar_op_names[0]) == HIR_SCALAR_OP_COUNT);
HIR__STATIC_ASSERT(collectives, sizeof(hir__collective_names) / sizeof(hir__collective_names[0]) == HIR_COLLECTIVE_COUNT);
HIR__STATIC_ASSERT(named, sizeof(hir__named_names) / sizeof(hir__named_names[0]) == HIR_NAMED_COUNT);
HIR__STATIC_ASSERT(binary, sizeof(hir__binary_symbols) / sizeof(hir__binary_symbols[0]) == HIR_BINARY_COUNT);
HIR__STATIC_ASSERT(ptypes, sizeof(hir__ptype_names) / sizeof(hir__ptype_names[0]) == HIR_PTYPE_COUNT);

static int hir__collective_has_root(int c) {
  return c == HIR_COLL_GATHER || c == HIR_COLL_SCATTER || c == HIR_COLL_REDUCE || c == HIR_COLL_BROADCAST ||
         c == HIR_COLL_SENDRECV;
}

/* The IR container of a fusion, and of a program (which embeds one). */
struct hir_fusion {
  hir__arena arena;
  hir_program *program;   /* set when this is a program's IR */
  int next_tv, next_id, next_val, next_expr;
  hir__vec tvs, exprs, inputs, outputs;
  hir_val *zero, *one, *named[HIR_NAMED_COUNT];
  hir_status status;
  char error[512];
};

struct hir_program {
  hir_fusion ir;
  hir_scope top;
  hir__vec units;
  int next_stream;
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

/* The axes that hold data: all but reduction axes. */
static int hir__data_axes(const hir_tv *tv, hir_id **ids) {
  int i, n = 0;
  for (i = 0; i < tv->ndims; i++)
    if (tv->ids[i]->iter != HIR_REDUCTION) ids[n++] = tv->ids[i];
  return n;
}

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

static hir_tv *hir__finish_op(hir_fusion *f, hir_expr *e, hir_tv *out) {
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
    hir__fail(f, HIR_ERR_INVALID, "hir_input: unknown dtype %d; use HIR_F32, HIR_F64, HIR_F16 or HIR_BF16", (int)dtype);
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

HIRDEF hir_tv *hir_set(hir_fusion *f, hir_tv *in) {
  hir_id *ids[HIR_MAX_DIMS];
  hir_tv *out;
  hir_expr *e;
  int i, n;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_set", "in")) return NULL;
  n = hir__data_axes(in, ids);
  if (!(out = hir__new_tv(f, in->dtype, HIR_MEM_GLOBAL, n))) return NULL;
  for (i = 0; i < n; i++)
    if (!(out->ids[i] = hir__clone_id(f, ids[i], 0))) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_LOAD_STORE, 1, 1))) return NULL;
  e->in[0] = in;
  e->out[0] = out;
  return hir__finish_op(f, e, out);
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

HIRDEF hir_tv *hir_sum(hir_fusion *f, hir_tv *in, int naxes, const int *axes) {
  hir_id *ids[HIR_MAX_DIMS];
  int reduced[HIR_MAX_DIMS] = {0};
  hir_tv *out;
  hir_expr *e;
  int i, n;
  if (!hir__live(f) || !hir__check_tv(f, in, "hir_sum", "in")) return NULL;
  n = hir__data_axes(in, ids);
  if (naxes < 1 || !axes) {
    hir__fail(f, HIR_ERR_INVALID, "hir_sum: give at least one axis to sum over (naxes = %d, axes %s)", naxes,
              axes ? "given" : "NULL");
    return NULL;
  }
  for (i = 0; i < naxes; i++) {
    int a = axes[i] < 0 ? axes[i] + n : axes[i];
    if (a < 0 || a >= n) {
      hir__fail(f, HIR_ERR_INVALID, "hir_sum: axis %d is out of range for T%d, which has %d data axes", axes[i],
                in->name, n);
      return NULL;
    }
    if (reduced[a]) {
      hir__fail(f, HIR_ERR_INVALID, "hir_sum: axis %d of T%d is listed twice", a, in->name);
      return NULL;
    }
    if (ids[a]->iter == HIR_BROADCAST) {
      hir__fail(f, HIR_ERR_INVALID, "hir_sum: axis %d of T%d is a broadcast axis; summing it is a no-op, drop it", a,
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
  if (!(e = hir__new_expr(f, HIR_EXPR_REDUCTION, 1, 1))) return NULL;
  e->in[0] = in;
  e->out[0] = out;
  return hir__finish_op(f, e, out);
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
   axes broadcast right-aligned, the contracted axis kept as a trailing rS. */
HIRDEF hir_tv *hir_matmul(hir_fusion *f, hir_tv *a, hir_tv *b) {
  hir_id *ia[HIR_MAX_DIMS], *ib[HIR_MAX_DIMS], *res[HIR_MAX_DIMS + 1];
  hir_tv *out;
  hir_expr *e;
  int i, na, nb, n = 0;
  if (!hir__live(f) || !hir__check_tv(f, a, "hir_matmul", "a") || !hir__check_tv(f, b, "hir_matmul", "b")) return NULL;
  if (a->dtype != b->dtype) {
    hir__fail(f, HIR_ERR_INVALID, "hir_matmul: mixed dtypes: T%d is %s, T%d is %s; both operands must have one dtype",
              a->name, hir_dtype_name(a->dtype), b->name, hir_dtype_name(b->dtype));
    return NULL;
  }
  na = hir__data_axes(a, ia);
  nb = hir__data_axes(b, ib);
  if (na < 1 || nb < 1) {
    hir__fail(f, HIR_ERR_INVALID, "hir_matmul: incompatible ranks: T%d has %d data axes, T%d has %d; both need at least 1",
              a->name, na, b->name, nb);
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
    hir__fail(f, HIR_ERR_INVALID, "hir_matmul: the result of T%d x T%d would have %d axes (with rK), more than HIR_MAX_DIMS (%d)",
              a->name, b->name, n, HIR_MAX_DIMS);
    return NULL;
  }
  if (!(out = hir__new_tv(f, a->dtype, HIR_MEM_GLOBAL, n))) return NULL;
  for (i = 0; i < n; i++)
    if (!(out->ids[i] = hir__clone_id(f, res[i], 0))) return NULL;
  out->ids[n - 1]->iter = HIR_REDUCTION;
  if (!(e = hir__new_expr(f, HIR_EXPR_MATMUL, 2, 1))) return NULL;
  e->in[0] = a;
  e->in[1] = b;
  e->out[0] = out;
  return hir__finish_op(f, e, out);
}

HIRDEF hir_status hir_set_mesh(hir_tv *tv, int ndevices, const int *devices) {
  hir_fusion *f;
  int *mesh, i, j;
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  if (ndevices < 1 || !devices) {
    hir__fail(f, HIR_ERR_INVALID, "hir_set_mesh: T%d: empty mesh; give at least one device id", tv->name);
    return f->status;
  }
  for (i = 0; i < ndevices; i++) {
    if (devices[i] < 0) {
      hir__fail(f, HIR_ERR_INVALID, "hir_set_mesh: T%d: device id %d at position %d is negative", tv->name, devices[i], i);
      return f->status;
    }
    for (j = 0; j < i; j++)
      if (devices[j] == devices[i]) {
        hir__fail(f, HIR_ERR_INVALID, "hir_set_mesh: T%d: device %d appears twice in the mesh (positions %d and %d)",
                  tv->name, devices[i], j, i);
        return f->status;
      }
  }
  if (!(mesh = (int *)hir__alloc(f, (size_t)ndevices * sizeof(int)))) return f->status;
  memcpy(mesh, devices, (size_t)ndevices * sizeof(int));
  tv->mesh = mesh;
  tv->mesh_size = ndevices;
  return HIR_OK;
}

HIRDEF hir_status hir_parallelize(hir_tv *tv, int axis, hir_ptype ptype) {
  hir_fusion *f;
  int a, i;
  if (!tv) return HIR_ERR_INVALID;
  f = tv->ir;
  if (f->status != HIR_OK) return f->status;
  if ((a = hir__norm_axis(f, axis, tv->ndims, "hir_parallelize", tv)) < 0) return f->status;
  if ((unsigned)ptype >= HIR_PTYPE_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "hir_parallelize: unknown parallel type %d; use HIR_SERIAL, HIR_DIDX or HIR_STREAM",
              (int)ptype);
    return f->status;
  }
  if (ptype != HIR_SERIAL) {
    for (i = 0; i < tv->ndims; i++)
      if (i != a && tv->ids[i]->ptype == ptype) {
        hir__fail(f, HIR_ERR_UNSUPPORTED, "hir_parallelize: T%d already has a %s axis (axis %d); one %s axis per tensor",
                  tv->name, ptype == HIR_DIDX ? "DIDx" : "Stream", i, ptype == HIR_DIDX ? "DIDx" : "Stream");
        return f->status;
      }
    if (tv->ids[a]->iter == HIR_BROADCAST && ptype == HIR_DIDX) {
      hir__fail(f, HIR_ERR_INVALID, "hir_parallelize: axis %d of T%d is a broadcast axis; it holds no data to split across devices",
                a, tv->name);
      return f->status;
    }
  }
  tv->ids[a]->ptype = ptype;
  return HIR_OK;
}

HIRDEF int hir_tv_ndims(const hir_tv *tv) { return tv ? tv->ndims : 0; }
HIRDEF int hir_tv_name(const hir_tv *tv) { return tv ? tv->name : -1; }
HIRDEF hir_dtype hir_tv_dtype(const hir_tv *tv) { return tv ? tv->dtype : HIR_F32; }
HIRDEF hir_iter_type hir_tv_iter_type(const hir_tv *tv, int axis) {
  return (tv && axis >= 0 && axis < tv->ndims) ? tv->ids[axis]->iter : HIR_ITERATION;
}
HIRDEF hir_ptype hir_tv_ptype(const hir_tv *tv, int axis) {
  return (tv && axis >= 0 && axis < tv->ndims) ? tv->ids[axis]->ptype : HIR_SERIAL;
}
HIRDEF hir_val *hir_tv_extent(const hir_tv *tv, int axis) {
  return (tv && axis >= 0 && axis < tv->ndims) ? tv->ids[axis]->extent : NULL;
}
HIRDEF const int *hir_tv_mesh(const hir_tv *tv, int *ndevices) {
  if (ndevices) *ndevices = tv ? tv->mesh_size : 0;
  return tv ? tv->mesh : NULL;
}
HIRDEF hir_expr *hir_tv_definition(const hir_tv *tv) { return tv ? tv->definition : NULL; }

HIRDEF hir_expr_kind hir_expr_kind_of(const hir_expr *e) { return e ? e->kind : HIR_EXPR_KIND_COUNT; }
HIRDEF const char *hir_expr_kind_name(const hir_expr *e) { return e ? hir__expr_kind_names[e->kind] : "(null)"; }
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
  return p;
}

HIRDEF void hir_program_free(hir_program *p) {
  if (!p) return;
  hir__arena_free(&p->ir.arena);
  HIR_FREE(p);
}

HIRDEF const char *hir_program_error(const hir_program *p) { return p ? p->ir.error : "hir_program_error: program is NULL"; }
HIRDEF hir_fusion *hir_program_fusion(hir_program *p) { return p ? &p->ir : NULL; }
HIRDEF hir_scope *hir_program_body(hir_program *p) { return p ? &p->top : NULL; }
HIRDEF int hir_program_ntop(const hir_program *p) { return p ? p->top.exprs.n : 0; }
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
    hir__fail(f, HIR_ERR_INVALID, "hir_scope_append: %s %d is already in a scope; an expr is placed once",
              hir__expr_kind_names[e->kind], e->name);
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
  if (!f) return NULL;
  if (!index || index->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "hir_stream_indexed: index is %s", index ? "from another program" : "NULL");
    return NULL;
  }
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
  if ((a = hir__norm_axis(f, axis, tv->ndims, "hir_host_for_loop", tv)) < 0) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_FOR_LOOP, 0, 0))) return NULL;
  e->id = tv->ids[a];
  if (!(e->val = hir__named(f, HIR_NAMED_STREAM_IDX))) return NULL;
  return e;
}

HIRDEF hir_expr *hir_host_if(hir_program *p, hir_val *predicate) {
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  if (!f) return NULL;
  if (!predicate || predicate->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "hir_host_if: predicate is %s", predicate ? "from another program" : "NULL");
    return NULL;
  }
  if (!(e = hir__new_expr(f, HIR_EXPR_IF_THEN_ELSE, 0, 0))) return NULL;
  e->val = predicate;
  return e;
}

/* A view of `in` at `index` along `axis`, that axis dropped. */
static hir_expr *hir__alias_select(hir_fusion *f, hir_tv *in, int axis, hir_val *index) {
  hir_tv *out;
  hir_expr *e;
  int i, n = 0;
  if (!(out = hir__new_tv(f, in->dtype, HIR_MEM_LOCAL, in->ndims - 1))) return NULL;
  for (i = 0; i < in->ndims; i++)
    if (i != axis && !(out->ids[n++] = hir__clone_id(f, in->ids[i], 1))) return NULL;
  out->mesh = in->mesh;
  out->mesh_size = in->mesh_size;
  if (!(e = hir__new_expr(f, HIR_EXPR_ALIAS_SELECT, 1, 1))) return NULL;
  e->in[0] = in;
  e->out[0] = out;
  e->axis = axis;
  e->id = in->ids[axis];
  e->val = index;
  return e;
}

HIRDEF hir_expr *hir_host_alias_select(hir_program *p, hir_tv *in, int axis, hir_val *index) {
  hir_fusion *f = hir__host(p);
  int a;
  if (!f || !hir__check_tv(f, in, "hir_host_alias_select", "in")) return NULL;
  if ((a = hir__norm_axis(f, axis, in->ndims, "hir_host_alias_select", in)) < 0) return NULL;
  if (in->ndims < 2) {
    hir__fail(f, HIR_ERR_INVALID, "hir_host_alias_select: T%d has one axis; selecting it would leave no axes", in->name);
    return NULL;
  }
  if (!index || index->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "hir_host_alias_select: index is %s", index ? "from another program" : "NULL");
    return NULL;
  }
  return hir__alias_select(f, in, a, index);
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
  int i, j;
  if (n < 1 || !team) {
    hir__fail(f, HIR_ERR_INVALID, "%s: empty team; give the device ids taking part", fn);
    return 0;
  }
  for (i = 0; i < n; i++) {
    if (team[i] < 0) {
      hir__fail(f, HIR_ERR_INVALID, "%s: device id %d in the team is negative", fn, team[i]);
      return 0;
    }
    for (j = 0; j < i; j++)
      if (team[i] == team[j]) {
        hir__fail(f, HIR_ERR_INVALID, "%s: device %d appears twice in the team", fn, team[i]);
        return 0;
      }
  }
  return 1;
}

HIRDEF hir_expr *hir_host_communication(hir_program *p, hir_collective type, int nteam, const int *team, int root,
                                        hir_tv *in, hir_tv *out) {
  const char *fn = "hir_host_communication";
  hir_fusion *f = hir__host(p);
  hir_expr *e;
  int *copy, i, has_root;
  if (!f) return NULL;
  if ((unsigned)type >= HIR_COLLECTIVE_COUNT) {
    hir__fail(f, HIR_ERR_INVALID, "%s: unknown collective type %d", fn, (int)type);
    return NULL;
  }
  if (!hir__check_team(f, nteam, team, fn)) return NULL;
  has_root = hir__collective_has_root(type);
  if (has_root) {
    for (i = 0; i < nteam && team[i] != root; i++) {}
    if (i == nteam) {
      hir__fail(f, HIR_ERR_INVALID, "%s: the root %d of the %s is not in its team", fn, root, hir__collective_names[type]);
      return NULL;
    }
  }
  if (!in && !out) {
    hir__fail(f, HIR_ERR_INVALID, "%s: the %s has neither an input nor an output", fn, hir__collective_names[type]);
    return NULL;
  }
  if ((in && !hir__check_tv(f, in, fn, "in")) || (out && !hir__check_tv(f, out, fn, "out"))) return NULL;
  if (!(e = hir__new_expr(f, HIR_EXPR_COMMUNICATION, in ? 1 : 0, out ? 1 : 0))) return NULL;
  /* A collective's buffers are device-global memory (nvFuser marks them so). */
  if (in) (e->in[0] = in)->mem = HIR_MEM_GLOBAL;
  if (out) (e->out[0] = out)->mem = HIR_MEM_GLOBAL;
  if (!(copy = (int *)hir__alloc(f, (size_t)nteam * sizeof(int)))) return NULL;
  memcpy(copy, team, (size_t)nteam * sizeof(int));
  e->sub = (int)type;
  e->team = copy;
  e->team_size = nteam;
  e->root = has_root ? root : -1;
  return e;
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
  if (!peer || peer->ir != f) {
    hir__fail(f, HIR_ERR_INVALID, "%s: peer is %s", fn, peer ? "from another program" : "NULL");
    return NULL;
  }
  if (!(e = hir__new_expr(f, HIR_EXPR_P2P_COMMUNICATION, 1, 0))) return NULL;
  e->sub = (int)type;
  e->in[0] = buffer;
  e->val = peer;
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
    hir__fail(f, HIR_ERR_INVALID, "hir_host_wait: %s; wait on a Communication, P2PCommunication or EndCoalescing",
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

HIRDEF hir_expr *hir_host_post_on_stream(hir_program *p, int nin, hir_tv *const *ins, int nout, hir_tv *const *outs) {
  const char *fn = "hir_host_post_on_stream";
  hir_fusion *f = hir__host(p);
  hir__host_unit *u;
  hir_expr *e;
  int i;
  if (!f) return NULL;
  if (nin < 0 || nout < 1 || (nin > 0 && !ins) || !outs) {
    hir__fail(f, HIR_ERR_INVALID, "%s: a unit needs arrays of its inputs (%d) and at least one output (%d)", fn, nin, nout);
    return NULL;
  }
  if (!(u = (hir__host_unit *)hir__alloc(f, sizeof(hir__host_unit)))) return NULL;
  u->name = p->units.n;
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
  if (!hir__push(f, &p->units, u) || !(e = hir__new_expr(f, HIR_EXPR_POST_ON_STREAM, nin, nout))) return NULL;
  for (i = 0; i < nin; i++) e->in[i] = ins[i];
  for (i = 0; i < nout; i++) e->out[i] = outs[i];
  e->unit = u;
  return e;
}

// >>print
/* Output to a FILE or to a buffer with snprintf's contract (len counts all). */
typedef struct hir__writer {
  FILE *fp;
  char *buf;
  size_t cap, len;
} hir__writer;

static void hir__w(hir__writer *w, const char *fmt, ...) HIR__PRINTF(2, 3);
static void hir__w(hir__writer *w, const char *fmt, ...) {
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
  for (; n > 0; n--) hir__w(w, "  ");
}

static void hir__print_val(hir__writer *w, const hir_val *v) {
  switch (v->kind) {
  case HIR__VAL_CONST: hir__w(w, "%lld", (long long)v->value); break;
  case HIR__VAL_SYMBOL: hir__w(w, "i%d", v->name); break;
  case HIR__VAL_NAMED: hir__w(w, "%s", hir__named_names[v->which]); break;
  case HIR__VAL_BINARY:
    hir__w(w, "( ");
    hir__print_val(w, v->lhs);
    hir__w(w, " %s ", hir__scalar_op_names[v->op]);
    hir__print_val(w, v->rhs);
    hir__w(w, " )");
    break;
  }
}

static void hir__print_id(hir__writer *w, const hir_id *id) {
  hir__w(w, "%c%s%d{", hir__iter_chars[id->iter], hir__ptype_names[id->ptype], id->name);
  hir__print_val(w, id->extent);
  hir__w(w, "}");
}

static void hir__print_tv(hir__writer *w, const hir_tv *tv) {
  int i;
  hir__w(w, "T%d_%c_%s[", tv->name, tv->mem == HIR_MEM_GLOBAL ? 'g' : 'l', hir__dtype_names[tv->dtype]);
  for (i = 0; i < tv->ndims; i++) {
    if (i) hir__w(w, ", ");
    hir__print_id(w, tv->ids[i]);
  }
  hir__w(w, "]");
  if (tv->mesh_size) {
    hir__w(w, " (DeviceMesh{");
    for (i = 0; i < tv->mesh_size; i++) hir__w(w, i ? " %d" : "%d", tv->mesh[i]);
    hir__w(w, "})");
  }
}

static void hir__print_stream(hir__writer *w, const hir_stream *s) {
  hir__w(w, "Stream ");
  if (s->index)
    hir__print_val(w, s->index);
  else
    hir__w(w, "%d", s->name);
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
    hir__w(w, "1");
    return;
  }
  for (i = 1; i < n; i++) hir__w(w, "( ");
  hir__print_val(w, ext[0]);
  for (i = 1; i < n; i++) {
    hir__w(w, " * ");
    hir__print_val(w, ext[i]);
    hir__w(w, " )");
  }
}

static void hir__print_scope(hir__writer *w, const hir_scope *s, int ind);

/* A tensor op: "<out>" then, one level deeper, " = ...". */
static void hir__print_assign(hir__writer *w, const hir_tv *out, int ind) {
  hir__indent(w, ind);
  hir__print_tv(w, out);
  hir__w(w, "\n");
  hir__indent(w, ind + 1);
}

static void hir__print_expr(hir__writer *w, const hir_expr *e, int ind) {
  int i;
  switch (e->kind) {
  case HIR_EXPR_ALLOCATE:
    hir__indent(w, ind);
    hir__print_tv(w, e->in[0]);
    hir__w(w, " = ALLOCATE(buffer=");
    hir__print_tv(w, e->in[0]);
    hir__w(w, ", mem_type=%s, size=", e->in[0]->mem == HIR_MEM_GLOBAL ? "global" : "local");
    hir__print_alloc_size(w, e->in[0]);
    hir__w(w, ", zero_init=false, resets_to_zero=false)\n");
    break;
  case HIR_EXPR_DEALLOCATE:
    hir__indent(w, ind);
    hir__w(w, "Deallocate {\n");
    hir__indent(w, ind + 1);
    hir__print_tv(w, e->in[0]);
    hir__w(w, "\n");
    hir__indent(w, ind);
    hir__w(w, "}\n");
    break;
  case HIR_EXPR_GET_CURRENT_STREAM:
  case HIR_EXPR_SET_CURRENT_STREAM:
  case HIR_EXPR_SYNCHRONIZE:
    hir__indent(w, ind);
    hir__w(w, "%s", e->kind == HIR_EXPR_GET_CURRENT_STREAM   ? "GetCurrentStream into "
                    : e->kind == HIR_EXPR_SET_CURRENT_STREAM ? "SetCurrentStream to "
                                                             : "Synchronize ");
    hir__print_stream(w, e->stream);
    hir__w(w, "\n");
    break;
  case HIR_EXPR_FOR_LOOP:
    hir__indent(w, ind);
    hir__w(w, "FOR ");
    hir__print_val(w, e->val);
    hir__w(w, " in ");
    hir__print_id(w, e->id);
    hir__w(w, ":\n");
    hir__print_scope(w, &e->body, ind + 1);
    break;
  case HIR_EXPR_IF_THEN_ELSE:
    hir__indent(w, ind);
    hir__w(w, "IF Manual ");
    hir__print_val(w, e->val);
    hir__w(w, ":\n");
    hir__print_scope(w, &e->body, ind + 1);
    if (e->orelse.exprs.n) {
      hir__indent(w, ind);
      hir__w(w, "ELSE:\n");
      hir__print_scope(w, &e->orelse, ind + 1);
    }
    break;
  case HIR_EXPR_POST_ON_STREAM:
    hir__indent(w, ind);
    hir__w(w, "PostOnStream (HostUnit%d, Inputs:{", e->unit->name);
    for (i = 0; i < e->nin; i++) {
      hir__print_tv(w, e->in[i]);
      hir__w(w, ", ");
    }
    hir__w(w, "}, Outputs:{");
    for (i = 0; i < e->nout; i++) {
      hir__print_tv(w, e->out[i]);
      hir__w(w, ", ");
    }
    hir__w(w, "})\n");
    break;
  case HIR_EXPR_COMMUNICATION:
    hir__indent(w, ind);
    hir__w(w, "Communication %d (type=%s, team=(", e->name, hir__collective_names[e->sub]);
    for (i = 0; i < e->team_size; i++) hir__w(w, i ? " %d" : "%d", e->team[i]);
    hir__w(w, ")");
    if (hir__collective_has_root(e->sub)) hir__w(w, ", root=%d", e->root);
    if (e->nin) {
      hir__w(w, ", input=");
      hir__print_tv(w, e->in[0]);
    }
    if (e->nout) {
      hir__w(w, ", output=");
      hir__print_tv(w, e->out[0]);
    }
    hir__w(w, ", backend=NCCL)\n");
    break;
  case HIR_EXPR_P2P_COMMUNICATION:
    hir__indent(w, ind);
    hir__w(w, "P2PCommunication %d (type=%s, buffer=", e->name, e->sub == HIR_P2P_SEND ? "send" : "recv");
    hir__print_tv(w, e->in[0]);
    hir__w(w, ", peer=");
    hir__print_val(w, e->val);
    hir__w(w, ", backend=NCCL)\n");
    break;
  case HIR_EXPR_WAIT:
    hir__indent(w, ind);
    hir__w(w, "Wait Communication %d\n", e->target->name);
    break;
  case HIR_EXPR_START_COALESCING:
    hir__indent(w, ind);
    hir__w(w, "StartCoalescing\n");
    break;
  case HIR_EXPR_END_COALESCING:
    hir__indent(w, ind);
    hir__w(w, "EndCoalescing %d\n", e->name);
    break;
  case HIR_EXPR_ALIAS_SELECT:
    hir__print_assign(w, e->out[0], ind);
    hir__w(w, " = HirAliasSelect( ");
    hir__print_tv(w, e->in[0]);
    hir__w(w, ", axis = ");
    hir__print_id(w, e->id);
    hir__w(w, ", index = ");
    hir__print_val(w, e->val);
    hir__w(w, " )\n");
    break;
  case HIR_EXPR_LOAD_STORE:
    hir__print_assign(w, e->out[0], ind);
    hir__w(w, " = Set( ");
    hir__print_tv(w, e->in[0]);
    hir__w(w, ", cache_op=Streaming )\n");
    break;
  case HIR_EXPR_BINARY:
    hir__print_assign(w, e->out[0], ind);
    hir__w(w, " = ");
    hir__print_tv(w, e->in[0]);
    hir__w(w, "\n");
    hir__indent(w, ind + 1);
    hir__w(w, " %s ", hir__binary_symbols[e->sub]);
    hir__print_tv(w, e->in[1]);
    hir__w(w, ";\n");
    break;
  case HIR_EXPR_REDUCTION:
    hir__print_assign(w, e->out[0], ind);
    hir__w(w, " = reduction( ");
    hir__print_tv(w, e->in[0]);
    hir__w(w, ", op = add, initial value = 0, allreduce = false )\n");
    break;
  case HIR_EXPR_BROADCAST:
    hir__print_assign(w, e->out[0], ind);
    hir__w(w, " = broadcast( ");
    hir__print_tv(w, e->in[0]);
    hir__w(w, ", flags = {");
    for (i = 0; i < e->out[0]->ndims; i++) hir__w(w, "%s%s", i ? ", " : "", (e->flags >> i) & 1u ? "true" : "false");
    hir__w(w, "} )\n");
    break;
  case HIR_EXPR_MATMUL:
    hir__print_assign(w, e->out[0], ind);
    hir__w(w, " = matmul(");
    hir__print_tv(w, e->in[0]);
    hir__w(w, ",\n");
    hir__indent(w, ind + 1);
    hir__w(w, "          ");
    hir__print_tv(w, e->in[1]);
    hir__w(w, ")\n");
    break;
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
  hir__w(w, "Inputs:\n");
  for (i = 0; i < ins->n; i++) {
    hir__w(w, "  ");
    hir__print_tv(w, (const hir_tv *)ins->items[i]);
    hir__w(w, "\n");
  }
  hir__w(w, "Outputs:\n");
  for (i = 0; i < outs->n; i++) {
    hir__w(w, "  ");
    hir__print_tv(w, (const hir_tv *)outs->items[i]);
    hir__w(w, "\n");
  }
  hir__w(w, "\n%%kernel {\n");
  for (i = 0; i < exprs->n; i++) hir__print_expr(w, (const hir_expr *)exprs->items[i], 0);
  hir__w(w, "} // %%kernel\n");
}

static void hir__print_tv_list(hir__writer *w, const hir__vec *v, const char *sep, const char *last) {
  int i;
  for (i = 0; i < v->n; i++) {
    hir__print_tv(w, (const hir_tv *)v->items[i]);
    hir__w(w, "%s", i + 1 < v->n ? sep : last);
  }
}

static void hir__print_program(hir__writer *w, const hir_program *p) {
  int i;
  hir__w(w, "\n%%HostIrContainer { (");
  hir__print_tv_list(w, &p->ir.inputs, ", ", "");
  hir__w(w, ") -> (");
  hir__print_tv_list(w, &p->ir.outputs, ", ", "");
  hir__w(w, ") :\n");
  hir__print_scope(w, &p->top, 1);
  for (i = 0; i < p->units.n; i++) {
    const hir__host_unit *u = (const hir__host_unit *)p->units.items[i];
    hir__w(w, "\nHostUnit%d: Inputs={", u->name);
    hir__print_tv_list(w, &u->ins, ", ", ", ");
    hir__w(w, "} -> Outputs={");
    hir__print_tv_list(w, &u->outs, ", ", ", ");
    hir__w(w, "}"); /* nvFuser starts the unit's fusion on this line */
    hir__print_kernel(w, &u->ins, &u->outs, &u->exprs);
  }
  hir__w(w, "} // %%HostIrContainer\n\n");
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
