/* hostir.torch's calls seen before, in C++: the part of its four fused ops
   (bf16/f16/f32 and fp8, AG+GEMM and GEMM+RS) that runs on every call once
   a call with the same operands' shapes, strides, dtypes and devices, the
   same group and arguments has run through the Python path (hostir/torch.py)
   and made its plan. Here such a call costs a few microseconds of host time:
   the key is read from the tensors, the outputs come from at::empty, the
   evaluator runs on torch's current stream. Anything else (a call not seen,
   a tensor subclass, a gradient to record, a CUDA graph being captured)
   returns None and the Python path takes it.

   Built by setup.py against the torch (with CUDA) that the installing
   Python imports; without it hostir.torch runs its Python path alone. The library is not linked here: hostir/torch.py
   hands over the addresses of the few C functions called (from the
   hostir._native that ctypes loaded), so there is one hostir per process. */
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "hostir.h"

namespace {

struct Api {  // hostir._native's functions, and hostir.Error
  hir_status (*run)(void *, hir_tensor *, int, hir_tensor *, int);  // hir_run or hir_tuner_run
  const char *(*evaluator_error)(void *);
  const char *(*tuner_error)(void *);
  const char *(*status_str)(int);
  void (*set_stream)(void *, void *);  // cheap when the stream is the backend's already
  int (*stream_capturing)(void *);
  hir_status (*tuner_run)(void *, hir_tensor *, int, hir_tensor *, int);
  PyObject *error;
};
Api api;
bool ready;

/* The ops, by the kind hostir/torch.py passes: how many arguments the
   wrapper gives here, and which is the group (RUN: hostir.torch.run's
   fusion, inputs and group). */
enum Kind { ALL_GATHER_MATMUL, MATMUL_REDUCE_SCATTER, ALL_GATHER_SCALED_MATMUL, SCALED_MATMUL_REDUCE_SCATTER, RUN, KINDS };
const struct { int nargs, group; } op_args[KINDS] = {{5, 3}, {5, 4}, {8, 5}, {8, 6}, {3, 2}};

struct Seen {  // one call seen before
  int kind;
  std::vector<int64_t> key;  // what key_of reads from the call's arguments but the group
  PyObject *group;           // the group argument as given (a strong reference: its identity is the key)
  PyObject *fusion;          // RUN's fusion, likewise (else NULL)
  void *runner;              // hir_evaluator or hir_tuner
  int tuner;
  hir_tensor *ins, *outs;  // the plan's views (ctypes arrays kept by the Python plan); data set per call (RUN: a
                           // scalar input's or an absent one's view stays as made)
  int nin, nout;
  void *backend;
  std::vector<std::vector<int64_t>> out_shapes;  // empty: an output not returned (data NULL)
  std::vector<at::ScalarType> out_dtypes;
  int device;
  int divide_by;  // "avg": the group's size, else 0
};
std::vector<Seen> seen;
long long taken;     // calls run here, for tests
double last_run_us;  // the last call's hir_run (or hir_tuner_run), host time: bench/torch_fused.py's Python layer is the rest

void push_tensor(std::vector<int64_t> &key, const at::Tensor &t) {
  key.push_back(t.dim());
  for (int64_t n : t.sizes()) key.push_back(n);
  for (int64_t s : t.strides()) key.push_back(s);
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.device().index());
}

/* A plain CUDA tensor the fast path may take: a torch.Tensor (or
   Parameter), with no gradient to record. */
const at::Tensor *plain_cuda(PyObject *o) {
  if (!THPVariable_CheckExact(o)) return nullptr;
  const at::Tensor &t = THPVariable_Unpack(o);
  if (!t.defined() || !t.is_cuda() || (t.requires_grad() && c10::GradMode::is_enabled())) return nullptr;
  return &t;
}

/* Tensors of a list or tuple into the key and `tensors`; f32 ones that
   the plan reads flat (fp8 scales: the Python path passes reshape(-1)). */
int push_list(PyObject *list, std::vector<int64_t> &key, std::vector<const at::Tensor *> &tensors, bool flat_f32) {
  if (!PyList_CheckExact(list) && !PyTuple_CheckExact(list)) return 0;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(list);
  key.push_back(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    const at::Tensor *t = plain_cuda(PySequence_Fast_GET_ITEM(list, i));
    if (!t || (flat_f32 && (t->scalar_type() != at::kFloat || !t->is_contiguous()))) return 0;
    tensors.push_back(t);
    push_tensor(key, *t);
  }
  return 1;
}

int push_int(PyObject *o, std::vector<int64_t> &key) {
  if (!PyLong_CheckExact(o)) return 0;
  long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) return PyErr_Clear(), 0;
  key.push_back(v);
  return 1;
}

/* A torch dtype (None: bfloat16, as the wrappers read it) into the key. */
int push_dtype(PyObject *d, std::vector<int64_t> &key) {
  if (d != Py_None && !THPDtype_Check(d)) return 0;
  key.push_back(static_cast<int64_t>(d == Py_None ? at::kBFloat16 : ((THPDtype *)d)->scalar_type));
  return 1;
}

/* A scale the plan reads flat: an f32 contiguous tensor. */
int push_scale(PyObject *o, std::vector<int64_t> &key, std::vector<const at::Tensor *> &tensors) {
  const at::Tensor *t = plain_cuda(o);
  if (!t || t->scalar_type() != at::kFloat || !t->is_contiguous()) return 0;
  tensors.push_back(t);
  push_tensor(key, *t);
  return 1;
}

/* "sum" or "avg" into the key. */
int push_reduce_op(PyObject *o, std::vector<int64_t> &key) {
  Py_ssize_t len;
  const char *op = PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &len) : nullptr;
  if (!op) return PyErr_Clear(), 0;
  if (std::strcmp(op, "sum") && std::strcmp(op, "avg")) return 0;
  key.push_back(op[0] == 'a');
  return 1;
}

int push_bool(PyObject *o, std::vector<int64_t> &key) {
  int v = PyObject_IsTrue(o);
  if (v < 0) return PyErr_Clear(), 0;
  key.push_back(v);
  return 1;
}

/* RUN's inputs: a tensor, an int (a scalar input's value, which its plan
   was made for) or None (an input not on this rank); nullptr in `tensors`
   for the last two. */
int push_inputs(PyObject *list, std::vector<int64_t> &key, std::vector<const at::Tensor *> &tensors) {
  if (!PyList_CheckExact(list) && !PyTuple_CheckExact(list)) return 0;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(list);
  key.push_back(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(list, i);
    const at::Tensor *t = o == Py_None || PyLong_CheckExact(o) ? nullptr : plain_cuda(o);
    if (o == Py_None) {
      key.push_back(-1);
    } else if (!t) {
      if (!PyLong_CheckExact(o) || (key.push_back(-2), !push_int(o, key))) return 0;
    } else {
      push_tensor(key, *t);
    }
    tensors.push_back(t);
  }
  return 1;
}

/* The key of a call's arguments (all but the group), into `key`, and its
   tensors in the plan's input order. 0: not a call this path takes. */
int key_of(int kind, PyObject *const *args, std::vector<int64_t> &key, std::vector<const at::Tensor *> &tensors) {
  key.clear();
  tensors.clear();
  key.push_back(kind);
  if (kind == RUN) return push_inputs(args[1], key, tensors); /* fusion, inputs, group */
  const at::Tensor *a = plain_cuda(args[0]);
  if (!a) return 0;
  tensors.push_back(a);
  push_tensor(key, *a);
  if (kind == ALL_GATHER_MATMUL) /* a_shard, bs, gather_dim, group, return_A */
    return push_list(args[1], key, tensors, false) && push_int(args[2], key) && push_bool(args[4], key);
  if (kind == ALL_GATHER_SCALED_MATMUL) { /* a_shard, bs, a_scale, b_scales, gather_dim, group, return_A, out_dtypes */
    PyObject *outs = args[7];
    Py_ssize_t nb;
    if (!push_list(args[1], key, tensors, false) || !push_scale(args[2], key, tensors) || !push_list(args[3], key, tensors, true) ||
        !push_int(args[4], key) || !push_bool(args[6], key))
      return 0;
    nb = PySequence_Fast_GET_SIZE(args[1]);
    if (outs != Py_None && (!PyList_CheckExact(outs) || PyList_GET_SIZE(outs) != nb)) return 0;
    for (Py_ssize_t i = 0; i < nb; i++) /* the products' dtypes */
      if (!push_dtype(outs == Py_None ? Py_None : PyList_GET_ITEM(outs, i), key)) return 0;
    return 1;
  }
  const at::Tensor *b = plain_cuda(args[1]);
  if (!b) return 0;
  tensors.push_back(b);
  push_tensor(key, *b);
  if (kind == SCALED_MATMUL_REDUCE_SCATTER) /* a, b, a_scale, b_scale, reduce_op, scatter_dim, group, out_dtype */
    return push_scale(args[2], key, tensors) && push_scale(args[3], key, tensors) && push_reduce_op(args[4], key) &&
           push_int(args[5], key) && push_dtype(args[7], key);
  /* MATMUL_REDUCE_SCATTER: a, b, reduce_op, scatter_dim, group */
  return push_reduce_op(args[2], key) && push_int(args[3], key);
}

/* call(kind, *the op's arguments): the op's result, or None. */
PyObject *call(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  thread_local std::vector<int64_t> key;
  thread_local std::vector<const at::Tensor *> tensors;
  if (!ready || nargs < 1 || !PyLong_CheckExact(args[0])) Py_RETURN_NONE;
  int kind = (int)PyLong_AsLong(args[0]);
  if (kind < 0 || kind >= KINDS || nargs != 1 + op_args[kind].nargs) Py_RETURN_NONE;
  args++;
  if (!key_of(kind, args, key, tensors)) Py_RETURN_NONE;
  Seen *s = nullptr;
  for (Seen &e : seen)
    if (e.kind == kind && e.group == args[op_args[kind].group] && (kind != RUN || e.fusion == args[0]) && e.key == key) {
      s = &e;
      break;
    }
  if (!s) Py_RETURN_NONE;
  try {
    void *stream = c10::cuda::getCurrentCUDAStream(s->device).stream();
    if (api.stream_capturing(stream)) Py_RETURN_NONE;  // the Python path switches the group to capturing
    api.set_stream(s->backend, stream);
    std::vector<at::Tensor> outs;
    outs.reserve(s->nout);
    for (int k = 0; k < s->nout; k++) {
      if (s->out_shapes[k].empty()) {
        outs.emplace_back();
        s->outs[k].data = nullptr;
        continue;
      }
      outs.push_back(at::empty(s->out_shapes[k], at::TensorOptions().dtype(s->out_dtypes[k]).device(at::kCUDA, s->device)));
      s->outs[k].data = outs.back().data_ptr();
    }
    for (int k = 0; k < s->nin; k++)
      if (tensors[k]) s->ins[k].data = tensors[k]->data_ptr();
    /* Without the GIL while it runs, as through ctypes; what is read after
       is copied first: another thread may change `seen` meanwhile. */
    void *runner = s->runner;
    int tuner = s->tuner, divide_by = s->divide_by;
    hir_tensor *ins = s->ins, *out_views = s->outs;
    int nin = s->nin, nout = s->nout;
    hir_status st;
    auto t0 = std::chrono::steady_clock::now();
    Py_BEGIN_ALLOW_THREADS;
    st = (tuner ? api.tuner_run : api.run)(runner, ins, nin, out_views, nout);
    Py_END_ALLOW_THREADS;
    last_run_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (st != HIR_OK) {
      PyObject *e = PyObject_CallFunction(api.error, "ss", api.status_str(st),
                                          tuner ? api.tuner_error(runner) : api.evaluator_error(runner));
      if (e) PyErr_SetObject(api.error, e), Py_DECREF(e);
      return nullptr;
    }
    taken++;
    if (kind == RUN) { /* this rank's outputs, None where one does not live here */
      PyObject *list = PyList_New(nout);
      for (int k = 0; list && k < nout; k++)
        PyList_SET_ITEM(list, k, outs[k].defined() ? THPVariable_Wrap(outs[k]) : (Py_INCREF(Py_None), Py_None));
      return list;
    }
    if (kind == MATMUL_REDUCE_SCATTER || kind == SCALED_MATMUL_REDUCE_SCATTER) {
      if (divide_by) outs[0].div_(divide_by);
      return THPVariable_Wrap(outs[0]);
    }
    PyObject *products = PyList_New(nout - 1);
    if (!products) return nullptr;
    for (int k = 1; k < nout; k++) PyList_SET_ITEM(products, k - 1, THPVariable_Wrap(outs[k]));
    int return_a = kind == ALL_GATHER_MATMUL ? outs[0].defined() : PyObject_IsTrue(args[6]) > 0;
    PyObject *gathered = return_a ? THPVariable_Wrap(outs[0]) : (Py_INCREF(Py_None), Py_None);
    return Py_BuildValue("(NN)", gathered, products);
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

/* remember(kind, *the op's arguments, runner, tuner, ins, outs, nin, nout,
   backend, out_shapes, out_dtypes, divide_by): a call the Python path has
   just run, so that the next one like it runs here. */
PyObject *remember(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  std::vector<int64_t> key;
  std::vector<const at::Tensor *> tensors;
  int kind = nargs > 0 ? (int)PyLong_AsLong(args[0]) : -1;
  if (kind < 0 || kind >= KINDS || nargs != 1 + op_args[kind].nargs + 10)
    return PyErr_SetString(PyExc_TypeError, "remember: the kind, the op's arguments and 10 more"), nullptr;
  if (!key_of(kind, args + 1, key, tensors)) Py_RETURN_NONE;
  PyObject *const *more = args + 1 + op_args[kind].nargs;
  Seen s;
  s.kind = kind;
  s.key = key;
  s.group = args[1 + op_args[kind].group];
  s.fusion = kind == RUN ? args[1] : nullptr;
  s.runner = PyLong_AsVoidPtr(more[0]);
  s.tuner = PyObject_IsTrue(more[1]);
  s.ins = (hir_tensor *)PyLong_AsVoidPtr(more[2]);
  s.outs = (hir_tensor *)PyLong_AsVoidPtr(more[3]);
  s.nin = (int)PyLong_AsLong(more[4]);
  s.nout = (int)PyLong_AsLong(more[5]);
  s.backend = PyLong_AsVoidPtr(more[6]);
  s.divide_by = (int)PyLong_AsLong(more[9]);
  PyObject *shapes = more[7], *dtypes = more[8];
  if (PyErr_Occurred()) return nullptr;
  if (!PyList_Check(shapes) || PyList_GET_SIZE(shapes) != s.nout || !PyList_Check(dtypes) ||
      PyList_GET_SIZE(dtypes) != s.nout || s.nin != (int)tensors.size())
    return PyErr_SetString(PyExc_ValueError, "remember: out_shapes and out_dtypes must list nout each; ins must be the call's "
                                             "tensors"),
           nullptr;
  for (Py_ssize_t k = 0; k < s.nout; k++) {
    PyObject *d = PyList_GET_ITEM(dtypes, k);
    if (!THPDtype_Check(d)) return PyErr_SetString(PyExc_TypeError, "remember: out_dtypes holds torch dtypes"), nullptr;
    s.out_dtypes.push_back(((THPDtype *)d)->scalar_type);
  }
  for (Py_ssize_t k = 0; k < s.nout; k++) {
    PyObject *shape = PyList_GET_ITEM(shapes, k);
    std::vector<int64_t> dims;
    if (shape != Py_None) {
      for (Py_ssize_t i = 0; i < PySequence_Size(shape); i++) {
        PyObject *n = PySequence_GetItem(shape, i);
        dims.push_back(n ? PyLong_AsLongLong(n) : -1);
        Py_XDECREF(n);
      }
      if (PyErr_Occurred()) return nullptr;
    }
    s.out_shapes.push_back(dims);
  }
  auto first = std::find_if(tensors.begin(), tensors.end(), [](const at::Tensor *t) { return t != nullptr; });
  if (first == tensors.end()) Py_RETURN_NONE; /* no tensor here: its device is not known */
  s.device = (*first)->device().index();
  Py_INCREF(s.group);
  Py_XINCREF(s.fusion);
  seen.push_back(std::move(s));
  Py_RETURN_NONE;
}

/* forget(runner): the calls seen that run this evaluator or tuner (its
   plan is being freed); None: every call (the options or a group's capture
   state changed). */
PyObject *forget(PyObject *, PyObject *runner) {
  void *which = runner == Py_None ? nullptr : PyLong_AsVoidPtr(runner);
  if (PyErr_Occurred()) return nullptr;
  std::vector<PyObject *> held;  // let go of after: a group's or fusion's finalizer may call in here
  auto gone = [which, &held](Seen &s) {
    if (which && s.runner != which) return false;
    held.push_back(s.group);
    if (s.fusion) held.push_back(s.fusion);
    return true;
  };
  seen.erase(std::remove_if(seen.begin(), seen.end(), gone), seen.end());
  for (PyObject *o : held) Py_DECREF(o);
  Py_RETURN_NONE;
}

PyObject *taken_count(PyObject *, PyObject *) { return PyLong_FromLongLong(taken); }
PyObject *last_run(PyObject *, PyObject *) { return PyFloat_FromDouble(last_run_us); }

/* setup(Error, run, tuner_run, evaluator_error, tuner_error, status_str,
   set_stream, stream_capturing): the functions' addresses. */
PyObject *setup(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 8) return PyErr_SetString(PyExc_TypeError, "setup: 8 arguments"), nullptr;
  void *p[7];
  for (int k = 0; k < 7; k++) {
    p[k] = PyLong_AsVoidPtr(args[1 + k]);
    if (!p[k]) return PyErr_Occurred() ? nullptr : (PyErr_SetString(PyExc_ValueError, "setup: a NULL function"), nullptr);
  }
  api.run = (hir_status(*)(void *, hir_tensor *, int, hir_tensor *, int))p[0];
  api.tuner_run = (hir_status(*)(void *, hir_tensor *, int, hir_tensor *, int))p[1];
  api.evaluator_error = (const char *(*)(void *))p[2];
  api.tuner_error = (const char *(*)(void *))p[3];
  api.status_str = (const char *(*)(int))p[4];
  api.set_stream = (void (*)(void *, void *))p[5];
  api.stream_capturing = (int (*)(void *))p[6];
  Py_INCREF(args[0]);
  api.error = args[0];
  ready = true;
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL, "call(kind, *args): the op's result, or None"},
    {"remember", (PyCFunction)(void (*)(void))remember, METH_FASTCALL, "remember a call the Python path ran"},
    {"forget", forget, METH_O, "forget the calls seen that run an evaluator or tuner (None: every call)"},
    {"taken", taken_count, METH_NOARGS, "how many calls ran here"},
    {"last_run_us", last_run, METH_NOARGS, "the host time of the last call's hir_run here, us"},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, "the C functions' addresses"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_fast", "hostir.torch's calls seen before", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch_fast(void) { return PyModule_Create(&module); }
