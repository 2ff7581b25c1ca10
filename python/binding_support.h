// Helpers shared by the pybind11 binding files: how a kvferry Status becomes a Python
// exception, and how numpy arrays are read without copying.
//
// Errors: every binding throws StatusError for a non-OK Status; the translator registered in
// kvferry_py.cc turns it into the matching kvferry.errors class (KvferryError subclasses that
// carry .code, a kvferry.StatusCode), so Python code branches on types or codes, never on
// message text.
//
// Thread-safety: stateless helpers.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "kvferry/metrics.h"
#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::python {

namespace py = pybind11;

// Carries a non-OK Status out of C++ to the exception translator.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status)
      : std::runtime_error(status.to_string()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// {family: {"type", "help", "samples": [(labels, value)]}} (metrics_bindings.cc).
py::dict metrics_to_python(const MetricsSnapshot& snapshot);

inline void throw_if_error(Status status) {
  if (!status.ok()) throw StatusError(std::move(status));
}

template <typename T>
T value_or_throw(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// A read-only view of a 1-D C-contiguous numpy array of exactly type T (no conversion, no
// copy). InvalidArgument naming `what` for any other dtype or shape: the Python layer converts
// (once, explicitly) before calling when it has to.
template <typename T>
std::span<const T> borrow_array(const py::array& array, const char* what) {
  if (!py::isinstance<py::array_t<T>>(array) && !array.dtype().is(py::dtype::of<T>())) {
    throw StatusError(InvalidArgument(std::string(what) + ": dtype " +
                                      std::string(py::str(array.dtype())) + " is not " +
                                      std::string(py::str(py::dtype::of<T>()))));
  }
  if (array.ndim() != 1) {
    throw StatusError(InvalidArgument(std::string(what) + ": " + std::to_string(array.ndim()) +
                                      "-D array, expected 1-D"));
  }
  if (array.shape(0) > 1 && array.strides(0) != static_cast<py::ssize_t>(sizeof(T))) {
    throw StatusError(InvalidArgument(std::string(what) + ": array is not contiguous"));
  }
  return {static_cast<const T*>(array.data()), static_cast<size_t>(array.shape(0))};
}

// uint64 numbers from a list, tuple or any array-like: numpy converts (forcecast) when it is
// not already a contiguous uint64 array, so Mooncake-style Python lists work unchanged.
using U64Array = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

inline std::span<const uint64_t> as_span(const U64Array& array) {
  return {array.data(), static_cast<size_t>(array.size())};
}

// Returns the status as a kvferry.errors exception instance (None when OK), for APIs that
// report a failure instead of raising it (KvSender.failure()).
py::object status_to_exception(const Status& status);

// The C++ engine inside a kvferry.Engine (a TypeError for anything else). The caller keeps
// the Python object alive (py::keep_alive) for as long as it uses the engine.
TransferEngine& unwrap_engine(const py::object& engine);

void bind_engine(py::module_& m);
void bind_plan(py::module_& m);
void bind_pd(py::module_& m);
// kvferry.nixl's core (nixl_bindings.cc).
void bind_nixl(py::module_& m);

}  // namespace kvferry::python
