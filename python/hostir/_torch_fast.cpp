/* hostir.torch's calls seen before, in C++: the part of
   all_gather_matmul and matmul_reduce_scatter that runs on every call once
   a call with the same operands' shapes, strides, dtypes and devices, the
   same group and arguments has run through the Python path (hostir/torch.py)
   and made its plan. Here such a call costs a few microseconds of host time:
   the key is read from the tensors, the outputs come from at::empty, the
   evaluator runs on torch's current stream. Anything else (a call not seen,
   a tensor subclass, a gradient to record, a CUDA graph being captured)
   returns None and the Python path takes it.

   Built by setup.py where torch (with CUDA) is importable at build time
   (pip install --no-build-isolation ./python); without it hostir.torch
   runs its Python path alone. The library is not linked here: hostir/torch.py
   hands over the addresses of the few C functions called (from the
   hostir._native that ctypes loaded), so there is one hostir per process. */
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
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

enum Kind { ALL_GATHER_MATMUL, MATMUL_REDUCE_SCATTER };

struct Seen {  // one call seen before
  int kind;
  std::vector<int64_t> key;  // what key_of reads from the call's arguments but the group
  PyObject *group;           // the group argument as given (a strong reference: its identity is the key)
  void *runner;              // hir_evaluator or hir_tuner
  int tuner;
  hir_tensor *ins, *outs;  // the plan's views (ctypes arrays kept by the Python plan); data set per call
  int nin, nout;
  void *backend;
  std::vector<std::vector<int64_t>> out_shapes;  // empty: an output not returned (data NULL)
  at::ScalarType dtype;
  int device;
  int divide_by;  // "avg": the group's size, else 0
};
std::vector<Seen> seen;
long long taken;  // calls run here, for tests

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

/* The key of a call's arguments (all but the group), into `key`, and its
   tensors in the plan's input order. 0: not a call this path takes. */
int key_of(int kind, PyObject *const *args, std::vector<int64_t> &key, std::vector<const at::Tensor *> &tensors) {
  key.clear();
  tensors.clear();
  key.push_back(kind);
  const at::Tensor *a = plain_cuda(args[0]);
  if (!a) return 0;
  tensors.push_back(a);
  push_tensor(key, *a);
  if (kind == ALL_GATHER_MATMUL) {  // a_shard, bs, gather_dim, group, return_A
    PyObject *bs = args[1];
    if (!PyList_CheckExact(bs) && !PyTuple_CheckExact(bs)) return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(bs);
    key.push_back(n);
    for (Py_ssize_t i = 0; i < n; i++) {
      const at::Tensor *b = plain_cuda(PySequence_Fast_GET_ITEM(bs, i));
      if (!b) return 0;
      tensors.push_back(b);
      push_tensor(key, *b);
    }
    int return_a = PyObject_IsTrue(args[4]);
    if (return_a < 0) return PyErr_Clear(), 0;
    key.push_back(return_a);
  } else {  // a, b, reduce_op, scatter_dim, group
    const at::Tensor *b = plain_cuda(args[1]);
    if (!b) return 0;
    tensors.push_back(b);
    push_tensor(key, *b);
    Py_ssize_t len;
    const char *op = PyUnicode_Check(args[2]) ? PyUnicode_AsUTF8AndSize(args[2], &len) : nullptr;
    if (!op) return PyErr_Clear(), 0;
    if (!std::strcmp(op, "sum"))
      key.push_back(0);
    else if (!std::strcmp(op, "avg"))
      key.push_back(1);
    else
      return 0;
  }
  if (!PyLong_CheckExact(args[2 + (kind == MATMUL_REDUCE_SCATTER)])) return 0;
  long long dim = PyLong_AsLongLong(args[2 + (kind == MATMUL_REDUCE_SCATTER)]);
  if (dim == -1 && PyErr_Occurred()) return PyErr_Clear(), 0;
  key.push_back(dim);
  return 1;
}

int group_arg(int kind) { return kind == ALL_GATHER_MATMUL ? 3 : 4; }

/* call(kind, *the op's five arguments): the op's result, or None. */
PyObject *call(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  thread_local std::vector<int64_t> key;
  thread_local std::vector<const at::Tensor *> tensors;
  if (!ready || nargs != 6 || !PyLong_CheckExact(args[0])) Py_RETURN_NONE;
  int kind = (int)PyLong_AsLong(args[0]);
  if (kind != ALL_GATHER_MATMUL && kind != MATMUL_REDUCE_SCATTER) Py_RETURN_NONE;
  args++;
  if (!key_of(kind, args, key, tensors)) Py_RETURN_NONE;
  Seen *s = nullptr;
  for (Seen &e : seen)
    if (e.kind == kind && e.group == args[group_arg(kind)] && e.key == key) {
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
    at::TensorOptions options = at::TensorOptions().dtype(s->dtype).device(at::kCUDA, s->device);
    for (int k = 0; k < s->nout; k++) {
      if (s->out_shapes[k].empty()) {
        outs.emplace_back();
        s->outs[k].data = nullptr;
        continue;
      }
      outs.push_back(at::empty(s->out_shapes[k], options));
      s->outs[k].data = outs.back().data_ptr();
    }
    for (int k = 0; k < s->nin; k++) s->ins[k].data = tensors[k]->data_ptr();
    /* Without the GIL while it runs, as through ctypes; what is read after
       is copied first: another thread may change `seen` meanwhile. */
    void *runner = s->runner;
    int tuner = s->tuner, divide_by = s->divide_by;
    hir_tensor *ins = s->ins, *out_views = s->outs;
    int nin = s->nin, nout = s->nout;
    hir_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = (tuner ? api.tuner_run : api.run)(runner, ins, nin, out_views, nout);
    Py_END_ALLOW_THREADS;
    if (st != HIR_OK) {
      PyObject *e = PyObject_CallFunction(api.error, "ss", api.status_str(st),
                                          tuner ? api.tuner_error(runner) : api.evaluator_error(runner));
      if (e) PyErr_SetObject(api.error, e), Py_DECREF(e);
      return nullptr;
    }
    taken++;
    if (kind == MATMUL_REDUCE_SCATTER) {
      if (divide_by) outs[0].div_(divide_by);
      return THPVariable_Wrap(outs[0]);
    }
    PyObject *products = PyList_New(nout - 1);
    if (!products) return nullptr;
    for (int k = 1; k < nout; k++) PyList_SET_ITEM(products, k - 1, THPVariable_Wrap(outs[k]));
    PyObject *gathered = outs[0].defined() ? THPVariable_Wrap(outs[0]) : (Py_INCREF(Py_None), Py_None);
    return Py_BuildValue("(NN)", gathered, products);
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

/* remember(kind, *the op's five arguments, runner, tuner, ins, outs, nin,
   nout, backend, out_shapes, divide_by): a call the Python path has just
   run, so that the next one like it runs here. */
PyObject *remember(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  std::vector<int64_t> key;
  std::vector<const at::Tensor *> tensors;
  if (nargs != 15) return PyErr_SetString(PyExc_TypeError, "remember: 15 arguments"), nullptr;
  int kind = (int)PyLong_AsLong(args[0]);
  if (!key_of(kind, args + 1, key, tensors)) Py_RETURN_NONE;
  Seen s;
  s.kind = kind;
  s.key = key;
  s.group = args[1 + group_arg(kind)];
  s.runner = PyLong_AsVoidPtr(args[6]);
  s.tuner = PyObject_IsTrue(args[7]);
  s.ins = (hir_tensor *)PyLong_AsVoidPtr(args[8]);
  s.outs = (hir_tensor *)PyLong_AsVoidPtr(args[9]);
  s.nin = (int)PyLong_AsLong(args[10]);
  s.nout = (int)PyLong_AsLong(args[11]);
  s.backend = PyLong_AsVoidPtr(args[12]);
  s.divide_by = (int)PyLong_AsLong(args[14]);
  PyObject *shapes = args[13];
  if (PyErr_Occurred()) return nullptr;
  if (!PyList_Check(shapes) || PyList_GET_SIZE(shapes) != s.nout || s.nin != (int)tensors.size())
    return PyErr_SetString(PyExc_ValueError, "remember: out_shapes must list nout shapes; ins must be the call's tensors"),
           nullptr;
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
  s.dtype = tensors[0]->scalar_type();
  s.device = tensors[0]->device().index();
  Py_INCREF(s.group);
  seen.push_back(std::move(s));
  Py_RETURN_NONE;
}

/* forget(runner): the calls seen that run this evaluator or tuner (its
   plan is being freed); None: every call (the options or a group's capture
   state changed). */
PyObject *forget(PyObject *, PyObject *runner) {
  void *which = runner == Py_None ? nullptr : PyLong_AsVoidPtr(runner);
  if (PyErr_Occurred()) return nullptr;
  std::vector<PyObject *> groups;  // let go of after: a group's finalizer may call in here
  auto gone = [which, &groups](Seen &s) {
    if (which && s.runner != which) return false;
    groups.push_back(s.group);
    return true;
  };
  seen.erase(std::remove_if(seen.begin(), seen.end(), gone), seen.end());
  for (PyObject *g : groups) Py_DECREF(g);
  Py_RETURN_NONE;
}

PyObject *taken_count(PyObject *, PyObject *) { return PyLong_FromLongLong(taken); }

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
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, "the C functions' addresses"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_fast", "hostir.torch's calls seen before", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch_fast(void) { return PyModule_Create(&module); }
