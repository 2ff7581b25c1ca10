// The C++ core of kvferry.nixl (python/kvferry/nixl/_api.py): a NIXL-style agent over one
// TransferEngine. Descriptor lists are flat arrays (addresses, lengths, devices) built in one
// pass from an Nx3 uint64 array or a list of tuples; a prepared list is a reference to such
// arrays plus the peer it addresses; make_prepped_xfer gathers the indexed descriptors of
// both sides into one engine batch without creating a Python object per descriptor.
//
// Thread-safety: every NixlAgent method may be called from any thread. The tables of
// peers, prepared lists and transfers are guarded by one mutex held only to look up or
// insert; engine calls run with the GIL released and without that mutex.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "binding_support.h"

namespace kvferry::python {
namespace {

using std::chrono::milliseconds;

// One list of descriptors (NIXL's nixlXferDList / nixlRegDList), columns stored flat.
struct DescColumns {
  MemoryLocation::Kind kind = MemoryLocation::Kind::kHost;
  std::vector<uint64_t> addr;
  std::vector<uint64_t> len;
  std::vector<int64_t> dev;
  bool operator==(const DescColumns&) const = default;
};

class PyDescList {
 public:
  explicit PyDescList(std::shared_ptr<const DescColumns> c) : columns(std::move(c)) {}
  std::shared_ptr<const DescColumns> columns;
};

MemoryLocation::Kind parse_mem_type(const std::string& mem_type) {
  if (mem_type == "DRAM" || mem_type == "cpu") return MemoryLocation::Kind::kHost;
  if (mem_type == "VRAM" || mem_type == "cuda") return MemoryLocation::Kind::kCuda;
  throw StatusError(InvalidArgument(
      fmt::format("memory type '{}' is not one of DRAM, VRAM (cpu, cuda)", mem_type)));
}

// From an Nx3 (or Nx4 for registration: the 4th column is ignored) uint64 array, or a
// sequence of tuples (addr, len, dev[, name]).
PyDescList make_desc_list(const py::object& descs, const std::string& mem_type, size_t width) {
  auto columns = std::make_shared<DescColumns>();
  columns->kind = parse_mem_type(mem_type);
  if (py::isinstance<py::array>(descs)) {
    auto array = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(descs);
    if (!array || array.ndim() != 2 || array.shape(1) < 3) {
      throw StatusError(
          InvalidArgument("descriptors: expected an Nx3 array of uint64 (addr, len, dev)"));
    }
    const auto n = static_cast<size_t>(array.shape(0));
    const auto stride = static_cast<size_t>(array.shape(1));
    const uint64_t* data = array.data();
    columns->addr.resize(n);
    columns->len.resize(n);
    columns->dev.resize(n);
    for (size_t i = 0; i < n; ++i) {
      columns->addr[i] = data[i * stride];
      columns->len[i] = data[i * stride + 1];
      columns->dev[i] = static_cast<int64_t>(data[i * stride + 2]);
    }
  } else {
    auto sequence = py::reinterpret_borrow<py::sequence>(descs);
    const auto n = static_cast<size_t>(py::len(sequence));
    columns->addr.reserve(n);
    columns->len.reserve(n);
    columns->dev.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      py::sequence t = sequence[i];
      if (static_cast<size_t>(py::len(t)) < width) {
        throw StatusError(InvalidArgument(
            fmt::format("descriptor {} has {} fields, expected {}", i, py::len(t), width)));
      }
      columns->addr.push_back(t[0].cast<uint64_t>());
      columns->len.push_back(t[1].cast<uint64_t>());
      columns->dev.push_back(t[2].cast<int64_t>());
    }
  }
  return PyDescList(std::move(columns));
}

struct Telemetry {
  double start_time_us = 0;  // microseconds since the epoch, at the last post
  double xfer_duration_us = 0;
  double post_duration_us = 0;
  uint64_t total_bytes = 0;
  uint64_t desc_count = 0;
};

// A prepared list: the descriptors and whom they address (no peer: this agent's memory).
struct Prepped {
  std::shared_ptr<const DescColumns> columns;
  std::string agent;  // empty: local
  std::optional<PeerHandle> peer;
};

struct Xfer {
  PeerHandle peer;
  std::vector<TransferOp> ops;
  std::optional<std::string> notification;
  std::mutex mu;
  std::optional<BatchHandle> batch;                 // guarded by mu
  Status error;                                     // guarded by mu: a failed submit
  std::chrono::system_clock::time_point posted_at;  // guarded by mu
};

class NixlAgent {
 public:
  NixlAgent(EngineOptions options, NotificationCompletion completion)
      : engine_(value_or_throw(TransferEngine::create(std::move(options)))),
        completion_(completion) {}
  ~NixlAgent() {
    // Handles must go before the engine.
    std::lock_guard lock(mu_);
    xfers_.clear();
    prepped_.clear();
    peers_.clear();
  }

  TransferEngine& engine() { return *engine_; }

  void register_memory(const PyDescList& list) {
    std::vector<MemoryRegion> regions;
    const DescColumns& c = *list.columns;
    regions.reserve(c.addr.size());
    for (size_t i = 0; i < c.addr.size(); ++i) {
      MemoryLocation where{c.kind,
                           c.kind == MemoryLocation::Kind::kCuda ? static_cast<int>(c.dev[i]) : -1};
      regions.push_back({reinterpret_cast<void*>(c.addr[i]), c.len[i], where});
    }
    throw_if_error(engine_->register_memory(regions));
  }

  void deregister_memory(const PyDescList& list) {
    std::vector<void*> addrs;
    for (uint64_t a : list.columns->addr) addrs.push_back(reinterpret_cast<void*>(a));
    throw_if_error(engine_->unregister_memory(addrs));
  }

  // Opens the peer as `name` at the first of `endpoints` that answers as the engine of
  // `incarnation` (0: any); a previous peer of that name is closed first (its handles fail
  // from then on). The error names every endpoint tried and why it failed.
  uint64_t add_remote(const std::string& name, const std::vector<std::string>& endpoints,
                      uint64_t incarnation) {
    if (endpoints.empty()) {
      throw StatusError(InvalidArgument(
          fmt::format("add_remote_agent: agent '{}' advertises no endpoint", name)));
    }
    std::optional<PeerHandle> found;
    std::string tried;
    for (const std::string& endpoint : endpoints) {
      Result<PeerHandle> opened = engine_->open_peer(endpoint);
      if (opened.ok() && (incarnation == 0 || opened->incarnation() == incarnation)) {
        found = *opened;
        break;
      }
      tried += fmt::format(
          "{}{}: {}", tried.empty() ? "" : "; ", endpoint,
          opened.ok() ? fmt::format("another engine (incarnation {:016x})", opened->incarnation())
                      : opened.status().message());
    }
    if (!found) {
      throw StatusError(PeerUnreachable(fmt::format(
          "add_remote_agent: agent '{}' answered at none of its endpoints ({})", name, tried)));
    }
    PeerHandle peer = *found;
    std::optional<PeerHandle> replaced;
    {
      std::lock_guard lock(mu_);
      auto it = peers_.find(name);
      if (it != peers_.end() && it->second.incarnation() != peer.incarnation())
        replaced = it->second;
      peers_[name] = peer;
    }
    if (replaced) engine_->close_peer(*replaced);
    return peer.incarnation();
  }

  // Throws NotRegistered unless `name` was added (and not removed).
  void check_remote(const std::string& name) { find_peer(name); }

  void remove_remote(const std::string& name) {
    std::optional<PeerHandle> peer;
    {
      std::lock_guard lock(mu_);
      auto it = peers_.find(name);
      if (it == peers_.end()) {
        throw StatusError(NotRegistered(fmt::format("no remote agent named '{}'", name)));
      }
      peer = it->second;
      peers_.erase(it);
    }
    engine_->close_peer(*peer);
  }

  int64_t prep(const std::string& agent, const PyDescList& list, bool local) {
    Prepped p{list.columns, local ? std::string() : agent, std::nullopt};
    std::lock_guard lock(mu_);
    if (!local) {
      auto it = peers_.find(agent);
      if (it == peers_.end() && agent == engine_->options().name) {
        // NIXL's loopback: an agent addresses its own memory by its own name.
        it = peers_.emplace(agent, value_or_throw(engine_->open_peer(engine_->endpoint()))).first;
      }
      if (it == peers_.end()) {
        throw StatusError(NotRegistered(fmt::format(
            "prep_xfer_dlist: remote agent '{}' is not loaded (add_remote_agent first)", agent)));
      }
      p.peer = it->second;
    }
    const int64_t h = next_handle_++;
    prepped_.emplace(h, std::move(p));
    return h;
  }

  void release_prepped(int64_t h) {
    std::lock_guard lock(mu_);
    if (prepped_.erase(h) == 0) {
      throw StatusError(NotRegistered(fmt::format("no prepared descriptor list {}", h)));
    }
  }

  int64_t make_xfer(const std::string& operation, int64_t local_h, const py::object& local_idx,
                    int64_t remote_h, const py::object& remote_idx,
                    std::optional<std::string> notification) {
    OpKind kind;
    if (operation == "WRITE") {
      kind = OpKind::kWrite;
    } else if (operation == "READ") {
      kind = OpKind::kRead;
    } else {
      throw StatusError(
          InvalidArgument(fmt::format("operation '{}' is not one of READ, WRITE", operation)));
    }
    Prepped local;
    Prepped remote;
    std::optional<PeerHandle> current;
    {
      std::lock_guard lock(mu_);
      local = find_prepped(local_h, "local");
      remote = find_prepped(remote_h, "remote");
      if (remote.peer) {
        auto it = peers_.find(remote.agent);
        if (it != peers_.end()) current = it->second;
      }
    }
    if (local.peer) {
      throw StatusError(InvalidArgument(
          fmt::format("local handle {} was prepared for remote agent '{}', not NIXL_INIT_AGENT",
                      local_h, local.agent)));
    }
    if (!remote.peer) {
      throw StatusError(InvalidArgument(
          fmt::format("remote handle {} was prepared for this agent (NIXL_INIT_AGENT)", remote_h)));
    }
    if (!current || current->incarnation() != remote.peer->incarnation()) {
      throw StatusError(PeerDisconnected(fmt::format(
          "remote handle {} belongs to agent '{}' as it was when prepared; the agent was removed "
          "or re-added since: prepare its descriptors again",
          remote_h, remote.agent)));
    }
    using Indices = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
    Indices li = Indices::ensure(local_idx);
    Indices ri = Indices::ensure(remote_idx);
    if (!li || !ri || li.ndim() != 1 || ri.ndim() != 1) {
      throw StatusError(InvalidArgument("indices: expected 1-D sequences of integers"));
    }
    if (li.size() != ri.size()) {
      throw StatusError(InvalidArgument(
          fmt::format("{} local indices but {} remote indices", li.size(), ri.size())));
    }
    check_notification_size(notification);
    auto xfer = std::make_shared<Xfer>();
    xfer->peer = *remote.peer;
    if (notification) xfer->notification = std::move(notification);
    const DescColumns& l = *local.columns;
    const DescColumns& r = *remote.columns;
    const int64_t* lp = li.data();
    const int64_t* rp = ri.data();
    const auto n = static_cast<size_t>(li.size());
    {
      py::gil_scoped_release release;  // the arrays stay alive: li, ri are held
      xfer->ops.resize(n);
      for (size_t i = 0; i < n; ++i) {
        const int64_t a = lp[i];
        const int64_t b = rp[i];
        if (a < 0 || static_cast<size_t>(a) >= l.addr.size() || b < 0 ||
            static_cast<size_t>(b) >= r.addr.size()) {
          throw StatusError(OutOfRange(fmt::format(
              "index pair {}: ({}, {}) outside the lists of {} local and {} remote descriptors", i,
              a, b, l.addr.size(), r.addr.size())));
        }
        if (l.len[a] != r.len[b]) {
          throw StatusError(InvalidArgument(fmt::format(
              "index pair {}: local descriptor {} has {} bytes, remote descriptor {} has {} bytes",
              i, a, l.len[a], b, r.len[b])));
        }
        xfer->ops[i] = TransferOp{kind, l.addr[a], r.addr[b], l.len[a]};
      }
    }
    std::lock_guard lock(mu_);
    const int64_t h = next_handle_++;
    xfers_.emplace(h, std::move(xfer));
    return h;
  }

  // Posts the transfer: "DONE", "PROC", or "ERR" (the error is kept for check_xfer_state).
  // A notification given here replaces the transfer's, for this post and the later ones.
  std::string post(int64_t h, std::optional<std::string> notification) {
    std::shared_ptr<Xfer> x = find_xfer(h);
    check_notification_size(notification);
    py::gil_scoped_release release;
    std::lock_guard lock(x->mu);
    if (x->batch || !x->error.ok()) {
      // NIXL reposts a finished request; a pending one cannot be posted again.
      if (x->batch && engine_->status(*x->batch).state == BatchState::kPending) {
        throw StatusError(FailedPrecondition(fmt::format("transfer {} is still in progress", h)));
      }
      x->batch.reset();
      x->error = Status::Ok();
    }
    if (notification) x->notification = std::move(notification);
    SubmitOptions options;
    options.notification = x->notification;
    options.notification_completion = completion_;
    x->posted_at = std::chrono::system_clock::now();
    Result<BatchHandle> batch = engine_->submit(x->peer, x->ops, options);
    if (!batch.ok()) {
      x->error = batch.status();
      return "ERR";
    }
    x->batch = *batch;
    return state_name(engine_->status(*x->batch).state);
  }

  std::string state(int64_t h) {
    std::shared_ptr<Xfer> x = find_xfer(h);
    py::gil_scoped_release release;
    std::lock_guard lock(x->mu);
    if (!x->error.ok() || !x->batch) return "ERR";
    return state_name(engine_->status(*x->batch).state);
  }

  // The error of a failed transfer (empty when none).
  std::string error(int64_t h) {
    std::shared_ptr<Xfer> x = find_xfer(h);
    std::lock_guard lock(x->mu);
    if (!x->error.ok()) return x->error.to_string();
    if (x->batch) {
      BatchStatus s = engine_->status(*x->batch);
      if (s.state == BatchState::kFailed) return s.status.to_string();
    }
    return {};
  }

  Telemetry telemetry(int64_t h) {
    std::shared_ptr<Xfer> x = find_xfer(h);
    std::lock_guard lock(x->mu);
    Telemetry t;
    t.desc_count = x->ops.size();
    if (!x->batch) return t;
    BatchStatus s = engine_->status(*x->batch);
    t.total_bytes = s.telemetry.bytes;
    t.start_time_us = static_cast<double>(
        std::chrono::duration_cast<std::chrono::microseconds>(x->posted_at.time_since_epoch())
            .count());
    t.post_duration_us = static_cast<double>(s.telemetry.post_time.count()) / 1e3;
    t.xfer_duration_us = static_cast<double>(s.telemetry.complete_time.count()) / 1e3;
    return t;
  }

  void release_xfer(int64_t h) {
    std::shared_ptr<Xfer> x;
    {
      std::lock_guard lock(mu_);
      auto it = xfers_.find(h);
      if (it == xfers_.end()) throw StatusError(NotRegistered(fmt::format("no transfer {}", h)));
      x = std::move(it->second);
      xfers_.erase(it);
    }
    py::gil_scoped_release release;
    std::lock_guard lock(x->mu);
    // Releasing a transfer in progress aborts it (as NIXL does).
    if (x->batch && engine_->status(*x->batch).state == BatchState::kPending) {
      engine_->cancel(*x->batch);
    }
  }

  // bench_nixl.py's C++ reference: the same transfer as make_prepped_xfer + transfer + polling,
  // done by the engine directly: ops gathered from the index arrays in a C++ loop, one
  // submit, one wait. Returns the nanoseconds it took.
  int64_t reference_transfer_ns(const std::string& agent, int64_t local_h,
                                const py::array_t<int64_t>& local_idx, int64_t remote_h,
                                const py::array_t<int64_t>& remote_idx) {
    Prepped local;
    Prepped remote;
    {
      std::lock_guard lock(mu_);
      local = find_prepped(local_h, "local");
      remote = find_prepped(remote_h, "remote");
    }
    PeerHandle peer = find_peer(agent);
    const int64_t* lp = local_idx.data();
    const int64_t* rp = remote_idx.data();
    const auto n = static_cast<size_t>(local_idx.size());
    py::gil_scoped_release release;
    const auto start = std::chrono::steady_clock::now();
    std::vector<TransferOp> ops(n);
    for (size_t i = 0; i < n; ++i) {
      ops[i] = TransferOp{OpKind::kRead, local.columns->addr[lp[i]], remote.columns->addr[rp[i]],
                          local.columns->len[lp[i]]};
    }
    BatchHandle b = value_or_throw(engine_->submit(peer, ops));
    BatchStatus s = engine_->wait(b, milliseconds(60'000));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    throw_if_error(s.status);
    return ns;
  }

  void send_notif(const std::string& agent, const std::string& bytes, int64_t timeout_ms) {
    PeerHandle peer = find_peer(agent);
    py::gil_scoped_release release;
    Status s = engine_->send_notification(peer, bytes, milliseconds(timeout_ms));
    py::gil_scoped_acquire acquire;
    throw_if_error(std::move(s));
  }

  // [(kind, sender, bytes)], kind 0 = message, 1 = sender lost (bytes: why).
  py::list notifications() {
    std::vector<Notification> got;
    {
      py::gil_scoped_release release;
      got = engine_->get_notifications();
    }
    py::list out;
    for (Notification& n : got) {
      out.append(py::make_tuple(static_cast<int>(n.kind), n.sender, py::bytes(n.bytes)));
    }
    return out;
  }

 private:
  void check_notification_size(const std::optional<std::string>& notification) const {
    if (notification && notification->size() > engine_->options().max_notification_bytes) {
      throw StatusError(InvalidArgument(
          fmt::format("notif_msg of {} bytes exceeds max_notification_bytes {}",
                      notification->size(), engine_->options().max_notification_bytes)));
    }
  }

  static std::string state_name(BatchState s) {
    switch (s) {
      case BatchState::kCompleted: return "DONE";
      case BatchState::kPending: return "PROC";
      case BatchState::kFailed: return "ERR";
    }
    return "ERR";
  }

  // mu_ held.
  Prepped find_prepped(int64_t h, const char* side) {
    auto it = prepped_.find(h);
    if (it == prepped_.end()) {
      throw StatusError(NotRegistered(fmt::format("no prepared {} descriptor list {}", side, h)));
    }
    return it->second;
  }

  std::shared_ptr<Xfer> find_xfer(int64_t h) {
    std::lock_guard lock(mu_);
    auto it = xfers_.find(h);
    if (it == xfers_.end()) throw StatusError(NotRegistered(fmt::format("no transfer {}", h)));
    return it->second;
  }

  PeerHandle find_peer(const std::string& agent) {
    std::lock_guard lock(mu_);
    auto it = peers_.find(agent);
    if (it == peers_.end()) {
      throw StatusError(NotRegistered(fmt::format("no remote agent named '{}'", agent)));
    }
    return it->second;
  }

  std::unique_ptr<TransferEngine> engine_;
  const NotificationCompletion completion_;
  std::mutex mu_;
  std::unordered_map<std::string, PeerHandle> peers_;         // guarded by mu_
  std::unordered_map<int64_t, Prepped> prepped_;              // guarded by mu_
  std::unordered_map<int64_t, std::shared_ptr<Xfer>> xfers_;  // guarded by mu_
  int64_t next_handle_ = 1;                                   // guarded by mu_
};

}  // namespace

void bind_nixl(py::module_& m) {
  // NIXL's descriptor-list objects (kvferry/nixl/_bindings.py subclasses it): immutable once
  // made, compared by value, read back as rows.
  py::class_<PyDescList>(m, "NixlDescList")
      .def(py::init(&make_desc_list), py::arg("descs"), py::arg("mem_type"), py::arg("width"))
      .def("__len__", [](const PyDescList& d) { return d.columns->addr.size(); })
      .def("descCount", [](const PyDescList& d) { return d.columns->addr.size(); })
      .def("isEmpty", [](const PyDescList& d) { return d.columns->addr.empty(); })
      .def("getType",
           [](const PyDescList& d) {
             return d.columns->kind == MemoryLocation::Kind::kCuda ? "VRAM" : "DRAM";
           })
      .def("__eq__",
           [](const PyDescList& a, const py::object& b) {
             return py::isinstance<PyDescList>(b) &&
                    *a.columns == *b.cast<const PyDescList&>().columns;
           })
      .def("__getitem__",
           [](const PyDescList& d, int64_t i) {
             const auto n = static_cast<int64_t>(d.columns->addr.size());
             if (i < 0) i += n;
             if (i < 0 || i >= n) {
               throw py::index_error(fmt::format("descriptor {} of a list of {}", i, n));
             }
             const auto k = static_cast<size_t>(i);
             return py::make_tuple(d.columns->addr[k], d.columns->len[k], d.columns->dev[k]);
           })
      // An Nx3 uint64 copy (addr, len, dev): what pickling carries.
      .def("rows",
           [](const PyDescList& d) {
             const DescColumns& c = *d.columns;
             py::array_t<uint64_t> rows({c.addr.size(), size_t{3}});
             auto r = rows.mutable_unchecked<2>();
             for (size_t i = 0; i < c.addr.size(); ++i) {
               r(i, 0) = c.addr[i];
               r(i, 1) = c.len[i];
               r(i, 2) = static_cast<uint64_t>(c.dev[i]);
             }
             return rows;
           })
      .def_property_readonly("is_device", [](const PyDescList& d) {
        return d.columns->kind == MemoryLocation::Kind::kCuda;
      });

  // bench_nixl.py's C++ reference for get_xfer_descs + prep_xfer_dlist: the same flat
  // columns built from an Nx3 uint64 array with no Python in the loop. Nanoseconds.
  m.def("nixl_reference_desc_list_ns", [](const py::array_t<uint64_t>& rows) {
    const auto n = static_cast<size_t>(rows.shape(0));
    const uint64_t* data = rows.data();
    py::gil_scoped_release release;
    const auto start = std::chrono::steady_clock::now();
    auto columns = std::make_shared<DescColumns>();
    columns->addr.resize(n);
    columns->len.resize(n);
    columns->dev.resize(n);
    for (size_t i = 0; i < n; ++i) {
      columns->addr[i] = data[i * 3];
      columns->len[i] = data[i * 3 + 1];
      columns->dev[i] = static_cast<int64_t>(data[i * 3 + 2]);
    }
    Prepped p{std::move(columns), {}, std::nullopt};
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                start)
        .count();
  });

  py::class_<Telemetry>(m, "NixlTelemetry")
      .def_readonly("startTime", &Telemetry::start_time_us)
      .def_readonly("xferDuration", &Telemetry::xfer_duration_us)
      .def_readonly("postDuration", &Telemetry::post_duration_us)
      .def_readonly("totalBytes", &Telemetry::total_bytes)
      .def_readonly("descCount", &Telemetry::desc_count);

  py::class_<NixlAgent>(m, "NixlAgent")
      .def(py::init([](std::string name, std::string listen_address, int64_t batch_timeout_ms,
                       std::optional<std::string> transport, std::optional<std::string> secret,
                       int worker_threads, bool acknowledged_notifications) {
             EngineOptions o;
             o.name = std::move(name);
             o.listen_address = std::move(listen_address);
             o.batch_timeout = milliseconds(batch_timeout_ms);
             if (transport) o.forced_transport = value_or_throw(parse_transport_kind(*transport));
             o.secret = std::move(secret);
             o.worker_threads = worker_threads;
             py::gil_scoped_release release;
             return std::make_unique<NixlAgent>(
                 std::move(o), acknowledged_notifications ? NotificationCompletion::kAcknowledged
                                                          : NotificationCompletion::kQueued);
           }),
           py::arg("name"), py::arg("listen_address") = "127.0.0.1:0",
           py::arg("batch_timeout_ms") = 30'000, py::arg("transport") = py::none(),
           py::arg("secret") = py::none(), py::arg("worker_threads") = 2,
           py::arg("acknowledged_notifications") = false)
      .def_property_readonly("endpoints", [](NixlAgent& a) { return a.engine().endpoints(); })
      // The secret the engine proves and requires (its option, else KVFERRY_SECRET), for the
      // metadata listener; None without one.
      .def_property_readonly("secret",
                             [](NixlAgent& a) -> std::optional<py::bytes> {
                               const auto& secret = a.engine().secret();
                               if (!secret) return std::nullopt;
                               return py::bytes(*secret);
                             })
      .def_property_readonly("incarnation", [](NixlAgent& a) { return a.engine().incarnation(); })
      .def("register_memory", &NixlAgent::register_memory, py::call_guard<py::gil_scoped_release>())
      .def("deregister_memory", &NixlAgent::deregister_memory,
           py::call_guard<py::gil_scoped_release>())
      .def("add_remote", &NixlAgent::add_remote, py::call_guard<py::gil_scoped_release>())
      .def("remove_remote", &NixlAgent::remove_remote, py::call_guard<py::gil_scoped_release>())
      .def("check_remote", &NixlAgent::check_remote, py::call_guard<py::gil_scoped_release>())
      .def("prep", &NixlAgent::prep, py::call_guard<py::gil_scoped_release>())
      .def("release_prepped", &NixlAgent::release_prepped)
      .def("make_xfer", &NixlAgent::make_xfer)
      .def("post", &NixlAgent::post, py::arg("handle"), py::arg("notification") = py::none())
      .def("state", &NixlAgent::state)
      .def("error", &NixlAgent::error, py::call_guard<py::gil_scoped_release>())
      .def("telemetry", &NixlAgent::telemetry, py::call_guard<py::gil_scoped_release>())
      .def("release_xfer", &NixlAgent::release_xfer)
      .def("send_notif", &NixlAgent::send_notif, py::arg("agent"), py::arg("bytes"),
           py::arg("timeout_ms") = 0)
      .def("notifications", &NixlAgent::notifications)
      .def("reference_transfer_ns", &NixlAgent::reference_transfer_ns);
}

}  // namespace kvferry::python
