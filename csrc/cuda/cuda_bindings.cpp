// pybind11 module odc_pp._C_cuda: CUDA IPC backend of the ODC transport. Built only when
// nvcc is found; imported lazily so odc_pp._C works on machines without CUDA.
#include <pybind11/pybind11.h>

#include "cuda_transport.h"

namespace py = pybind11;

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "ODC one-sided transport, CUDA IPC backend";
  using namespace odc_cuda;
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("device_count", &device_count);
  m.def("pci_bus_id", &pci_bus_id, py::arg("device"));
  m.def("device_by_pci_bus_id", &device_by_pci_bus_id, py::arg("bus_id"));
  m.def("native_peer_atomics", &native_peer_atomics, py::arg("device"), py::arg("peer_device"));
  m.def("malloc_device", &malloc_device, py::arg("nbytes"), py::arg("device"));
  m.def("free_device", &free_device, py::arg("ptr"), py::arg("device"));
  m.def("ipc_handle", [](uintptr_t ptr, int device) { return py::bytes(ipc_handle(ptr, device)); },
        py::arg("ptr"), py::arg("device"));
  m.def("ipc_open", [](py::bytes handle, int device) { return ipc_open(std::string(handle), device); },
        py::arg("handle"), py::arg("device"));
  m.def("ipc_close", &ipc_close, py::arg("ptr"), py::arg("device"));
  m.def("stream_create", &stream_create, py::arg("device"));
  m.def("stream_destroy", &stream_destroy, py::arg("stream"), py::arg("device"));
  m.def("event_create", &event_create, py::arg("device"));
  m.def("event_destroy", &event_destroy, py::arg("event"), py::arg("device"));
  m.def("event_record", &event_record, py::arg("event"), py::arg("stream"), py::arg("device"));
  m.def("stream_wait_event", &stream_wait_event, py::arg("stream"), py::arg("event"),
        py::arg("device"));
  m.def("event_wait", &event_wait, py::arg("event"), py::arg("timeout_s"), nogil);
  m.def("copy_async", &copy_async, py::arg("dst"), py::arg("src"), py::arg("nbytes"),
        py::arg("stream"), py::arg("device"));
  m.def("accumulate_async", &accumulate_async, py::arg("dst"), py::arg("src"), py::arg("dtype"),
        py::arg("count"), py::arg("atomic"), py::arg("stream"), py::arg("device"));
}
