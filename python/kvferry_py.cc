// The _kvferry extension module: kvferry's engine, planner and PD session layer for Python.
// The Python package (python/kvferry/) wraps it: kvferry.TransferEngine (Mooncake-compatible),
// kvferry.plan (numpy in, numpy views out), context managers and the exception classes.
//
// Errors: a StatusError thrown by any binding becomes the kvferry.errors class for its code.
#include <pybind11/pybind11.h>

#include "binding_support.h"
#include "kvferry/status.h"

namespace kvferry::python {

py::object status_to_exception(const Status& status) {
  if (status.ok()) return py::none();
  return py::module_::import("kvferry.errors")
      .attr("error_from_status")(static_cast<int>(status.code()), status.message());
}

namespace {

void translate_status_error(std::exception_ptr error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const StatusError& e) {
    py::object exception = status_to_exception(e.status());
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
  }
}

}  // namespace
}  // namespace kvferry::python

PYBIND11_MODULE(_kvferry, m) {
  namespace py = pybind11;
  using namespace kvferry;
  m.doc() = "kvferry transfer engine bindings (use the kvferry package, not this module)";
  py::register_exception_translator(&python::translate_status_error);

  py::enum_<StatusCode> codes(m, "StatusCode");
  for (int code = 0; code <= static_cast<int>(kLastStatusCode); ++code) {
    const auto c = static_cast<StatusCode>(code);
    const std::string name(status_code_name(c));
    codes.value(name.c_str(), c);
  }
  // The highest StatusCode number, so Python never repeats which code is last.
  m.attr("LAST_STATUS_CODE") = static_cast<int>(kLastStatusCode);

  python::bind_engine(m);
  python::bind_plan(m);
  python::bind_pd(m);
  python::bind_nixl(m);
}
