// pybind11 module odc_pp._C: the host backend of the ODC transport (no torch, no CUDA).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <new>
#include <optional>

#include "host_transport.h"

namespace py = pybind11;
using odc::HostGroup;
using odc::Segment;

namespace {

void init_control(const std::shared_ptr<Segment>& segment, int64_t pid) {
  if (segment->size() < sizeof(odc::ControlBlock))
    throw std::invalid_argument("control segment smaller than a ControlBlock");
  auto* block = new (reinterpret_cast<void*>(segment->address())) odc::ControlBlock;
  block->pid = pid;
  block->sync_epoch.store(0);
  block->turn.store(0);
  for (auto& lock : block->locks) lock.store(0);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  block->magic = odc::kControlMagic;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ODC one-sided transport, host backend (POSIX shared memory)";
  py::register_exception<odc::PeerError>(m, "PeerError", PyExc_RuntimeError);
  m.attr("CONTROL_BYTES") = py::int_(sizeof(odc::ControlBlock));
  m.attr("NUM_LOCKS") = py::int_(odc::kNumLocks);

  py::class_<Segment, std::shared_ptr<Segment>>(m, "Segment", py::buffer_protocol())
      .def_static("create", &Segment::create, py::arg("name"), py::arg("nbytes"),
                  "Create (O_EXCL) and map a shared-memory segment; this mapping owns the name.")
      .def_static("open", &Segment::open, py::arg("name"), py::arg("nbytes"),
                  "Map an existing segment created by a peer.")
      .def_property_readonly("address", &Segment::address)
      .def_property_readonly("nbytes", &Segment::size)
      .def_property_readonly("name", &Segment::name)
      .def_property_readonly("is_owner", &Segment::is_owner)
      .def("unlink", &Segment::unlink)
      .def_buffer([](Segment& s) {
        return py::buffer_info(reinterpret_cast<void*>(s.address()), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.size())}, {1}, false);
      });

  m.def("init_control", &init_control, py::arg("segment"), py::arg("pid"));
  m.def("pid_alive", &odc::pid_alive, py::arg("pid"));
  m.def(
      "copy_bytes",
      [](uintptr_t dst, uintptr_t src, size_t nbytes, int num_threads,
         std::optional<size_t> transfer_bytes) {
        odc::copy_bytes(dst, src, nbytes, num_threads,
                        odc::prefers_streaming(transfer_bytes.value_or(nbytes)));
      },
      py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("num_threads"),
      py::arg("transfer_bytes") = py::none(), py::call_guard<py::gil_scoped_release>(),
      "Copy nbytes on up to num_threads threads. transfer_bytes: size of the whole transfer "
      "this copy is a piece of (decides streaming stores; default nbytes).");
  m.def("prefers_streaming", &odc::prefers_streaming, py::arg("total_bytes"));
  m.def("streaming_min_bytes", &odc::streaming_min_bytes,
        "Transfers of at least this many bytes use streaming stores (where available).");
  m.def(
      "libc_copy_bytes",
      [](uintptr_t dst, uintptr_t src, size_t nbytes) {
        odc::libc_copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes);
      },
      py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::call_guard<py::gil_scoped_release>(),
      "Single-threaded libc memcpy (the reference the transport benchmark compares to).");
  m.def("copy_kernel", &odc::fast_copy_kernel,
        "Kernel copy_bytes uses for large copies on this CPU (for example 'avx512 streaming stores').");
  m.def("accumulate_local", &odc::accumulate_local, py::arg("dst"), py::arg("src"),
        py::arg("dtype"), py::arg("count"), py::arg("num_threads"),
        py::call_guard<py::gil_scoped_release>(),
        "fp32 dst += src (dtype code 0 fp32, 1 bf16, 2 fp16) without locking.");

  py::class_<HostGroup, std::shared_ptr<HostGroup>>(m, "HostGroup")
      .def(py::init<int, std::vector<std::shared_ptr<Segment>>, std::vector<int64_t>,
                    std::vector<int64_t>, double, int>(),
           py::arg("rank"), py::arg("controls"), py::arg("global_ranks"), py::arg("pids"),
           py::arg("timeout_s"), py::arg("num_threads"))
      .def_property_readonly("rank", &HostGroup::rank)
      .def_property_readonly("world_size", &HostGroup::world_size)
      .def("accumulate_into", &HostGroup::accumulate_into, py::arg("owner"), py::arg("dst"),
           py::arg("alloc_id"), py::arg("dst_offset"), py::arg("src"), py::arg("dtype"),
           py::arg("count"), py::call_guard<py::gil_scoped_release>())
      .def("barrier", &HostGroup::barrier, py::arg("epoch"),
           py::call_guard<py::gil_scoped_release>())
      .def("open_turns", &HostGroup::open_turns, py::arg("epoch"),
           py::call_guard<py::gil_scoped_release>(),
           "Deterministic sync `epoch`: this rank's own writes are done; sources may add.")
      .def("take_turn", &HostGroup::take_turn, py::arg("owner"), py::arg("epoch"),
           py::call_guard<py::gil_scoped_release>(),
           "Wait until owner opened `epoch` and every lower source rank passed.")
      .def("pass_turn", &HostGroup::pass_turn, py::arg("owner"), py::arg("epoch"))
      .def("check_peer", &HostGroup::check_peer, py::arg("peer"), py::arg("what"));
}
