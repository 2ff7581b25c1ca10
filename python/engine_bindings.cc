// Bindings of kvferry::TransferEngine: the Pythonic Engine (raises kvferry.errors classes)
// that kvferry.TransferEngine (the Mooncake-compatible facade, kvferry/mooncake.py) is built on.
//
// Every call that may move bytes or wait releases the GIL. Peers are named "host:port" and
// opened on first use (the engine caches them); a transfer that finds its peer gone closes
// it so the next call reconnects to a restarted peer.
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "binding_support.h"
#include "core/own_memory.h"
#include "kvferry/kv/plan_executor.h"
#include "kvferry/kv/transfer_plan.h"
#include "kvferry/metrics_server.h"
#include "kvferry/transfer_engine.h"
#ifdef KVFERRY_WITH_UCX
#include "transport/ucx/ucx_worker.h"
#endif

namespace kvferry::python {

using std::chrono::milliseconds;

// Owns the engine. Batch and peer handles held by Python objects keep this wrapper alive
// (py::keep_alive), so they are always destroyed before the engine, as the C++ API requires.
class PyEngine {
 public:
  explicit PyEngine(EngineOptions options) {
    engine_ = value_or_throw(TransferEngine::create(std::move(options)));
  }

  TransferEngine& engine() { return *engine_; }

  PeerHandle peer(const std::string& name) { return value_or_throw(engine_->open_peer(name)); }

  // The status of a finished transfer; closes the peer when it went away so the next call
  // opens it afresh (a restarted peer has a new incarnation and new regions).
  Status settle(const PeerHandle& peer, Status status) {
    if (status.code() == StatusCode::kPeerDisconnected ||
        status.code() == StatusCode::kPeerUnreachable) {
      engine_->close_peer(peer);
    }
    return status;
  }

 private:
  std::unique_ptr<TransferEngine> engine_;
};

TransferEngine& unwrap_engine(const py::object& engine) {
  return engine.cast<PyEngine&>().engine();
}

namespace {

std::vector<TransferOp> make_ops(OpKind kind, std::span<const uint64_t> local,
                                 std::span<const uint64_t> remote,
                                 std::span<const uint64_t> lengths) {
  if (local.size() != remote.size() || local.size() != lengths.size()) {
    throw StatusError(
        InvalidArgument("buffers, peer_buffer_addresses and lengths differ in length: " +
                        std::to_string(local.size()) + ", " + std::to_string(remote.size()) + ", " +
                        std::to_string(lengths.size())));
  }
  std::vector<TransferOp> ops(local.size());
  for (size_t i = 0; i < ops.size(); ++i) ops[i] = {kind, local[i], remote[i], lengths[i]};
  return ops;
}

MemoryLocation parse_location(const std::string& location) {
  // Mooncake passes "*" (wildcard) or "cpu:N" for host memory and "cuda:N" for a GPU.
  constexpr std::string_view kCuda = "cuda:";
  if (location.rfind(kCuda, 0) == 0) {
    return {MemoryLocation::Kind::kCuda, std::stoi(location.substr(kCuda.size()))};
  }
  if (location.empty() || location == "*" || location.rfind("cpu", 0) == 0) return {};
  throw StatusError(
      InvalidArgument("memory location '" + location + "' (valid: '*', 'cpu[:N]', 'cuda:N')"));
}

// Refuses (NotRegistered, naming the call and the range) a range that is not inside one
// registered region of the engine, or lies in device memory, before anything touches it.
void check_host_range(const TransferEngine& engine, uint64_t addr, uint64_t length,
                      const char* what) {
  Result<MemoryLocation> where = engine.registered_location(reinterpret_cast<void*>(addr), length);
  if (!where.ok()) {
    throw StatusError(Status(where.status().code(),
                             std::string(what) + ": " + std::string(where.status().message())));
  }
  if (where->kind != MemoryLocation::Kind::kHost) {
    throw StatusError(InvalidArgument(std::string(what) + ": [" + std::to_string(addr) + ", +" +
                                      std::to_string(length) +
                                      ") is registered device memory, not host memory"));
  }
}

// A copy that faulted inside registered memory: the application unmapped it while it was
// registered, which callers see as NotRegistered.
Status as_not_registered(Status copied, const char* what) {
  if (copied.code() != StatusCode::kInvalidArgument) return copied;
  return NotRegistered(std::string(what) + ": registered memory " + copied.message() +
                       " (unmapped while registered)");
}

struct PyBatch {
  BatchHandle handle;
  PeerHandle peer;
};

py::tuple status_tuple(const BatchStatus& s) {
  return py::make_tuple(static_cast<int>(s.state), static_cast<int>(s.status.code()),
                        s.status.message());
}

}  // namespace

void bind_engine(py::module_& m) {
  py::enum_<OpKind>(m, "OpKind").value("WRITE", OpKind::kWrite).value("READ", OpKind::kRead);
  py::enum_<BatchState>(m, "BatchState")
      .value("PENDING", BatchState::kPending)
      .value("COMPLETED", BatchState::kCompleted)
      .value("FAILED", BatchState::kFailed);

  py::class_<PyBatch>(m, "Batch").def_property_readonly("peer", [](const PyBatch& b) {
    return b.peer.name();
  });

  py::class_<PyEngine>(m, "Engine")
      .def(py::init([](std::string name, std::string listen_address, std::string metadata_uri,
                       std::optional<std::string> transport, int64_t batch_timeout_ms,
                       int64_t handshake_timeout_ms, int worker_threads,
                       std::optional<std::string> secret, bool metrics) {
             EngineOptions o;
             o.name = std::move(name);
             o.listen_address = std::move(listen_address);
             o.metadata_uri = std::move(metadata_uri);
             if (transport) o.forced_transport = value_or_throw(parse_transport_kind(*transport));
             o.batch_timeout = milliseconds(batch_timeout_ms);
             o.handshake_timeout = milliseconds(handshake_timeout_ms);
             o.worker_threads = worker_threads;
             o.secret = std::move(secret);
             o.metrics = metrics;
             py::gil_scoped_release release;
             return std::make_unique<PyEngine>(std::move(o));
           }),
           py::arg("name") = "kvferry", py::arg("listen_address") = "127.0.0.1:0",
           py::arg("metadata_uri") = "p2p", py::arg("transport") = py::none(),
           py::arg("batch_timeout_ms") = 30'000,
           py::arg("handshake_timeout_ms") = kDefaultHandshakeTimeout.count(),
           py::arg("worker_threads") = 2, py::arg("secret") = py::none(),
           py::arg("metrics") = false)
      .def(
          "metrics", [](PyEngine& e) { return metrics_to_python(e.engine().metrics()); },
          "What the engine counted (empty unless metrics=True): {family name: {'type', 'help', "
          "'samples': [(labels dict, value)]}}; a histogram's value is a dict with count, sum "
          "and buckets [(upper bound in s, cumulative count)].")
      .def(
          "metrics_text", [](PyEngine& e) { return to_prometheus_text(e.engine().metrics()); },
          "The engine's metrics in Prometheus text format.")
      .def_property_readonly("endpoint", [](PyEngine& e) { return e.engine().endpoint(); })
      .def_property_readonly("incarnation", [](PyEngine& e) { return e.engine().incarnation(); })
      .def_property_readonly("batch_timeout_ms",
                             [](PyEngine& e) { return e.engine().options().batch_timeout.count(); })
      .def(
          "register_memory",
          [](PyEngine& e, uint64_t addr, uint64_t length, const std::string& location) {
            const MemoryLocation where = parse_location(location);
            py::gil_scoped_release release;
            throw_if_error(
                e.engine().register_memory(reinterpret_cast<void*>(addr), length, where));
          },
          py::arg("addr"), py::arg("length"), py::arg("location") = "*")
      .def(
          "register_memory_batch",
          [](PyEngine& e, const U64Array& addrs, const U64Array& lengths,
             const std::string& location) {
            if (addrs.size() != lengths.size()) {
              throw StatusError(InvalidArgument(
                  "buffer_addresses and capacities differ: " + std::to_string(addrs.size()) +
                  " vs " + std::to_string(lengths.size())));
            }
            const MemoryLocation where = parse_location(location);
            std::vector<MemoryRegion> regions(static_cast<size_t>(addrs.size()));
            for (size_t i = 0; i < regions.size(); ++i) {
              regions[i] = {reinterpret_cast<void*>(addrs.at(i)), lengths.at(i), where};
            }
            py::gil_scoped_release release;
            throw_if_error(e.engine().register_memory(regions));
          },
          py::arg("addrs"), py::arg("lengths"), py::arg("location") = "*")
      .def(
          "unregister_memory",
          [](PyEngine& e, uint64_t addr) {
            py::gil_scoped_release release;
            throw_if_error(e.engine().unregister_memory(reinterpret_cast<void*>(addr)));
          },
          py::arg("addr"))
      .def(
          "unregister_memory_batch",
          [](PyEngine& e, const U64Array& addrs) {
            std::vector<void*> pointers(static_cast<size_t>(addrs.size()));
            for (size_t i = 0; i < pointers.size(); ++i) {
              pointers[i] = reinterpret_cast<void*>(addrs.at(i));
            }
            py::gil_scoped_release release;
            throw_if_error(e.engine().unregister_memory(pointers));
          },
          py::arg("addrs"))
      .def(
          "allocate_shared",
          [](PyEngine& e, uint64_t bytes) {
            py::gil_scoped_release release;
            return reinterpret_cast<uint64_t>(
                value_or_throw(e.engine().allocate_shared(bytes)).addr);
          },
          py::arg("bytes"),
          "Shared memory (registered) that same-host peers reach through shm; returns its "
          "address. Freed by free_shared or with the engine.")
      .def(
          "free_shared",
          [](PyEngine& e, uint64_t addr) {
            py::gil_scoped_release release;
            throw_if_error(e.engine().free_shared(reinterpret_cast<void*>(addr)));
          },
          py::arg("addr"))
      .def(
          "shared_array",
          [](py::object self, uint64_t bytes) {
            auto& e = self.cast<PyEngine&>();
            SharedBuffer buffer;
            {
              py::gil_scoped_release release;
              buffer = value_or_throw(e.engine().allocate_shared(bytes));
            }
            // The array keeps the engine (which owns the mapping) alive.
            return py::array_t<uint8_t>({static_cast<py::ssize_t>(bytes)}, {1},
                                        static_cast<uint8_t*>(buffer.addr), self);
          },
          py::arg("bytes"),
          "A numpy uint8 array over freshly allocated shared memory (see allocate_shared).")
      .def(
          "write_bytes",
          [](PyEngine& e, uint64_t dest, const py::bytes& data) {
            const std::string_view view = data;
            check_host_range(e.engine(), dest, view.size(), "write_bytes");
            const iovec target{reinterpret_cast<void*>(dest), view.size()};
            throw_if_error(as_not_registered(
                copy_to_own_memory({&target, 1}, view.data(), view.size()), "write_bytes"));
          },
          py::arg("dest"), py::arg("data"),
          "Copies `data` to dest, which must lie inside one registered host region of this "
          "engine: NotRegistered otherwise, and for memory unmapped while registered (never a "
          "crash).")
      .def(
          "read_bytes",
          [](PyEngine& e, uint64_t source, uint64_t length) {
            check_host_range(e.engine(), source, length, "read_bytes");
            std::string out(length, '\0');
            throw_if_error(as_not_registered(
                copy_from_own_memory(out.data(), reinterpret_cast<const void*>(source), length),
                "read_bytes"));
            return py::bytes(out);
          },
          py::arg("source"), py::arg("length"),
          "The `length` bytes at source, which must lie inside one registered host region of "
          "this engine: NotRegistered otherwise, and for memory unmapped while registered.")
      .def(
          "open_peer",
          [](PyEngine& e, const std::string& name) {
            PeerHandle peer;
            {
              py::gil_scoped_release release;
              peer = e.peer(name);
            }
            return py::make_tuple(peer.name(), std::string(transport_kind_name(peer.transport())),
                                  peer.incarnation());
          },
          py::arg("name"), "Opens (or returns the cached) peer: (name, transport, incarnation).")
      .def(
          "close_peer",
          [](PyEngine& e, const std::string& name) {
            py::gil_scoped_release release;
            e.engine().close_peer(e.peer(name));
          },
          py::arg("name"))
      .def(
          "transfer",
          [](PyEngine& e, const std::string& peer_name, OpKind kind, const U64Array& local,
             const U64Array& remote, const U64Array& lengths, int64_t timeout_ms) {
            std::vector<TransferOp> ops =
                make_ops(kind, as_span(local), as_span(remote), as_span(lengths));
            py::gil_scoped_release release;
            PeerHandle peer = e.peer(peer_name);
            throw_if_error(e.settle(
                peer, e.engine().transfer_sync(peer, ops, {.timeout = milliseconds(timeout_ms)})));
          },
          py::arg("peer"), py::arg("kind"), py::arg("local"), py::arg("remote"), py::arg("lengths"),
          py::arg("timeout_ms") = 0,
          "Submits the ops and waits until they ended; raises the batch's error. A timed-out "
          "call returns only once no byte of it can still land.")
      .def(
          "transfer_one",
          [](PyEngine& e, const std::string& peer_name, OpKind kind, uint64_t local,
             uint64_t remote, uint64_t length, int64_t timeout_ms) {
            const TransferOp op{kind, local, remote, length};
            py::gil_scoped_release release;
            PeerHandle peer = e.peer(peer_name);
            throw_if_error(e.settle(
                peer,
                e.engine().transfer_sync(peer, {&op, 1}, {.timeout = milliseconds(timeout_ms)})));
          },
          py::arg("peer"), py::arg("kind"), py::arg("local"), py::arg("remote"), py::arg("length"),
          py::arg("timeout_ms") = 0)
      .def(
          "submit",
          [](PyEngine& e, const std::string& peer_name, OpKind kind, const U64Array& local,
             const U64Array& remote, const U64Array& lengths, int64_t timeout_ms) {
            std::vector<TransferOp> ops =
                make_ops(kind, as_span(local), as_span(remote), as_span(lengths));
            py::gil_scoped_release release;
            PeerHandle peer = e.peer(peer_name);
            Result<BatchHandle> batch =
                e.engine().submit(peer, ops, {.timeout = milliseconds(timeout_ms)});
            if (!batch.ok()) throw_if_error(e.settle(peer, batch.status()));
            return PyBatch{std::move(batch).value(), peer};
          },
          py::arg("peer"), py::arg("kind"), py::arg("local"), py::arg("remote"), py::arg("lengths"),
          py::arg("timeout_ms") = 0, py::keep_alive<0, 1>())
      .def(
          "probe",
          [](PyEngine& e, const std::string& peer_name, int64_t timeout_ms) {
            py::gil_scoped_release release;
            throw_if_error(e.engine().probe_peer(peer_name, milliseconds(timeout_ms)));
          },
          py::arg("peer"), py::arg("timeout_ms"),
          "A fresh handshake with the peer within timeout_ms (never the cache); raises if it "
          "does not answer.")
      .def(
          "routes",
          [](PyEngine& e, const std::string& peer_name) {
            std::vector<Route> routes;
            {
              py::gil_scoped_release release;
              routes = e.peer(peer_name).routes();
            }
            py::list out;
            for (const Route& r : routes) {
              py::object transport = py::none();
              if (r.transport) transport = py::str(std::string(transport_kind_name(*r.transport)));
              out.append(py::make_tuple(std::string(memory_kind_name(r.local)),
                                        std::string(memory_kind_name(r.remote)), transport,
                                        r.reason));
            }
            return out;
          },
          py::arg("peer"),
          "The peer's routes: (local kind, remote kind, transport or None, reason) for each pair "
          "of memory kinds ('host', 'shared_host', 'device').")
      .def(
          "batch_status",
          [](PyEngine& e, const PyBatch& b) {
            BatchStatus s;
            {
              py::gil_scoped_release release;  // may land answers that have arrived
              s = e.engine().status(b.handle);
            }
            return status_tuple(s);
          },
          py::arg("batch"),
          "(state, code, message) now; never waits for the peer (takes in what has arrived).")
      .def(
          "wait",
          [](PyEngine& e, const PyBatch& b, int64_t timeout_ms) {
            BatchStatus s;
            {
              py::gil_scoped_release release;
              s = e.engine().wait(b.handle, milliseconds(timeout_ms));
              if (s.state == BatchState::kFailed) e.settle(b.peer, s.status).ignore();
            }
            return status_tuple(s);
          },
          py::arg("batch"), py::arg("timeout_ms"),
          "Waits up to timeout_ms; (state, code, message). Still PENDING after a short wait.")
      .def(
          "wait_final",
          [](PyEngine& e, const PyBatch& b) {
            // The batch ends within its own timeout (then cancelled, nothing lands later), so
            // waiting in slices of the engine's batch timeout always terminates.
            BatchStatus s;
            {
              py::gil_scoped_release release;
              const milliseconds slice = e.engine().options().batch_timeout;
              do {
                s = e.engine().wait(b.handle, slice);
              } while (s.state == BatchState::kPending);
              if (s.state == BatchState::kFailed) e.settle(b.peer, s.status).ignore();
            }
            return status_tuple(s);
          },
          py::arg("batch"), "Waits until the batch ended; (state, code, message).")
      .def(
          "cancel",
          [](PyEngine& e, const PyBatch& b) {
            py::gil_scoped_release release;
            e.engine().cancel(b.handle);
          },
          py::arg("batch"))
      .def(
          "execute_plan",
          [](PyEngine& e, const std::shared_ptr<kv::TransferPlan>& plan,
             const std::string& peer_name, OpKind kind, int64_t call_timeout_ms) {
            py::gil_scoped_release release;
            PeerHandle peer = e.peer(peer_name);
            kv::ExecuteOptions options{kind, milliseconds(call_timeout_ms)};
            throw_if_error(e.settle(peer, kv::execute(*plan, e.engine(), peer, options)));
          },
          py::arg("plan"), py::arg("peer"), py::arg("kind") = OpKind::kWrite,
          py::arg("call_timeout_ms") = 0,
          "Runs a kvferry Plan against the peer with the plan's strategy.");

  m.def(
      "ucx_hardware_rma",
      [] {
#ifdef KVFERRY_WITH_UCX
        Result<detail::UcxResources> resources = detail::query_ucx_resources();
        return resources.ok() && resources->hardware_rma;
#else
        return false;
#endif
      },
      "Whether this build has ucx and UCX here reports a hardware RMA transport (rc, dc, ud, "
      "verbs): where both peers have one, the engine routes cross-host ops over ucx.");
}

}  // namespace kvferry::python
