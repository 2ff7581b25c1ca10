// Bindings of the PD session layer: BootstrapServer, PrefillServer / KvSender, DecodeClient /
// KvReceiver, with the C++ request states (RequestState). Servers and clients borrow a
// kvferry.Engine and keep it alive; senders and receivers keep their server or client alive,
// so no Python object can outlive what its C++ handle points into.
//
// Waits (wait_final, wait_at_least, wait_abort_acked) and anything that talks to a peer or
// joins threads at construction release the GIL.
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "binding_support.h"
#include "kvferry/kv/send_strategy.h"
#include "kvferry/pd/bootstrap.h"
#include "kvferry/pd/decode_client.h"
#include "kvferry/pd/prefill_server.h"
#include "kvferry/pd/request_state.h"

namespace kvferry::python {
namespace {

using std::chrono::milliseconds;
using AuxRow = std::tuple<uint64_t, uint64_t, uint64_t>;               // base, bytes, row_bytes
using StateRows = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>;  // ... + tp_dim

pd::RankBuffers make_buffers(const kv::KvLayout& layout, const std::vector<AuxRow>& aux,
                             const std::vector<StateRows>& state) {
  pd::RankBuffers buffers;
  buffers.layout = layout;
  for (const auto& [base, bytes, row_bytes] : aux) buffers.aux.push_back({base, bytes, row_bytes});
  for (const auto& [base, bytes, row_bytes, tp_dim] : state) {
    buffers.state.push_back({{base, bytes, row_bytes}, tp_dim});
  }
  return buffers;
}

// Page lists: uint32 arrays are read in place; anything else goes through kvferry's checked
// conversion (negative or > 2^32-1 values are an InvalidArgument, never wrapped).
std::vector<kv::PageIndex> page_vector(const py::object& pages, const char* what) {
  py::object array = py::module_::import("kvferry").attr("as_pages")(pages, what);
  const auto span = borrow_array<kv::PageIndex>(array.cast<py::array>(), what);
  return {span.begin(), span.end()};
}

uint64_t slot_or_none(const std::optional<uint64_t>& slot) { return slot ? *slot : pd::kNoSlot; }

template <typename Handle>
void bind_request_handle(py::class_<Handle>& cls) {
  cls.def_property_readonly("room", &Handle::room)
      .def("poll", &Handle::poll, "The request's state now; never blocks.")
      .def(
          "failure", [](const Handle& h) { return status_to_exception(h.failure()); },
          "The reason (a kvferry.KvferryError instance) when Failed, else None.")
      .def(
          "wait_final",
          [](const Handle& h, int64_t timeout_ms) {
            py::gil_scoped_release release;
            return h.wait_final(milliseconds(timeout_ms));
          },
          py::arg("timeout_ms"), "Waits until Success or Failed or the timeout; the state then.")
      .def(
          "wait_at_least",
          [](const Handle& h, pd::RequestState state, int64_t timeout_ms) {
            py::gil_scoped_release release;
            return h.wait_at_least(state, milliseconds(timeout_ms));
          },
          py::arg("state"), py::arg("timeout_ms"))
      .def(
          "abort",
          [](Handle& h, std::string reason) {
            py::gil_scoped_release release;
            h.abort(std::move(reason));
          },
          py::arg("reason"));
}

}  // namespace

void bind_pd(py::module_& m) {
  py::enum_<pd::RequestState>(m, "RequestState")
      .value("FAILED", pd::RequestState::kFailed)
      .value("BOOTSTRAPPING", pd::RequestState::kBootstrapping)
      .value("WAITING_FOR_INPUT", pd::RequestState::kWaitingForInput)
      .value("TRANSFERRING", pd::RequestState::kTransferring)
      .value("SUCCESS", pd::RequestState::kSuccess);

  py::class_<pd::PdTimeouts>(m, "PdTimeouts")
      .def(py::init([](int64_t heartbeat_interval_ms, int64_t heartbeat_timeout_ms,
                       int64_t bootstrap_timeout_ms, int64_t waiting_timeout_ms,
                       int64_t transfer_call_timeout_ms) {
             pd::PdTimeouts t;
             t.heartbeat_interval = milliseconds(heartbeat_interval_ms);
             t.heartbeat_timeout = milliseconds(heartbeat_timeout_ms);
             t.bootstrap_timeout = milliseconds(bootstrap_timeout_ms);
             t.waiting_timeout = milliseconds(waiting_timeout_ms);
             t.transfer_call_timeout = milliseconds(transfer_call_timeout_ms);
             return t;
           }),
           py::arg("heartbeat_interval_ms") = 500, py::arg("heartbeat_timeout_ms") = 0,
           py::arg("bootstrap_timeout_ms") = 10'000, py::arg("waiting_timeout_ms") = 30'000,
           py::arg("transfer_call_timeout_ms") = 10'000);

  py::class_<pd::BootstrapServer>(m, "BootstrapServer")
      .def(py::init([](std::string listen_address, int64_t rank_stale_after_ms,
                       std::optional<std::string> secret) {
             pd::BootstrapServerOptions o{std::move(listen_address),
                                          milliseconds(rank_stale_after_ms), std::move(secret)};
             py::gil_scoped_release release;
             return value_or_throw(pd::BootstrapServer::start(std::move(o)));
           }),
           py::arg("listen_address") = "127.0.0.1:0", py::arg("rank_stale_after_ms") = 0,
           py::arg("secret") = py::none())
      .def_property_readonly("address", &pd::BootstrapServer::address)
      .def("stop", &pd::BootstrapServer::stop, py::call_guard<py::gil_scoped_release>());

  py::class_<pd::KvSender> sender(m, "KvSender");
  bind_request_handle(sender);
  sender.def(
      "send",
      [](pd::KvSender& s, const py::object& pages, bool last, std::optional<uint64_t> aux_row,
         std::optional<uint64_t> state_slot) {
        const std::vector<kv::PageIndex> page_list = page_vector(pages, "pages");
        const pd::LastChunkExtras extras{slot_or_none(aux_row), slot_or_none(state_slot)};
        py::gil_scoped_release release;
        throw_if_error(s.send(page_list, last ? &extras : nullptr));
      },
      py::arg("pages"), py::arg("last") = false, py::arg("aux_row") = py::none(),
      py::arg("state_slot") = py::none(),
      "Queues one chunk of this rank's pages; last=True on the final chunk (with its aux row "
      "and state slot).");

  py::class_<pd::KvReceiver> receiver(m, "KvReceiver");
  bind_request_handle(receiver);
  receiver
      .def(
          "init",
          [](pd::KvReceiver& r, const py::object& dst_pages, std::optional<uint64_t> aux_row,
             std::optional<uint64_t> state_slot) {
            std::vector<kv::PageIndex> pages = page_vector(dst_pages, "dst_pages");
            py::gil_scoped_release release;
            throw_if_error(
                r.init(std::move(pages), slot_or_none(aux_row), slot_or_none(state_slot)));
          },
          py::arg("dst_pages"), py::arg("aux_row") = py::none(), py::arg("state_slot") = py::none(),
          "Gives the request's destination pages (and aux row, state slot). Raises the "
          "request's error when it failed before init (e.g. the bootstrap server refused it); "
          "a failure after init shows in poll(), wait_final() and failure().")
      .def(
          "wait_abort_acked",
          [](const pd::KvReceiver& r, int64_t timeout_ms) {
            py::gil_scoped_release release;
            throw_if_error(r.wait_abort_acked(milliseconds(timeout_ms)));
          },
          py::arg("timeout_ms"))
      .def_property_readonly("transfer_time_ns",
                             [](const pd::KvReceiver& r) { return r.transfer_time().count(); });

  py::class_<pd::PrefillServer>(m, "PrefillServer")
      .def(py::init([](const py::object& engine, const kv::KvLayout& layout,
                       const std::vector<AuxRow>& aux, const std::vector<StateRows>& state,
                       uint32_t tp_rank, uint32_t tp_size, uint32_t total_kv_heads,
                       std::string bootstrap_address, std::string control_listen, int worker_shards,
                       const pd::PdTimeouts& timeouts, std::optional<std::string> strategy,
                       uint32_t max_pages_per_call, uint32_t max_open_rooms,
                       uint32_t max_open_rooms_per_decode) {
             pd::PrefillServerOptions o;
             o.engine = &unwrap_engine(engine);
             o.buffers = make_buffers(layout, aux, state);
             o.tp = {tp_rank, tp_size, total_kv_heads};
             o.bootstrap_address = std::move(bootstrap_address);
             o.control_listen = std::move(control_listen);
             o.worker_shards = worker_shards;
             o.timeouts = timeouts;
             if (strategy) o.send.strategy = value_or_throw(kv::parse_send_strategy(*strategy));
             o.send.max_pages_per_call = max_pages_per_call;
             o.max_open_rooms = max_open_rooms;
             o.max_open_rooms_per_decode = max_open_rooms_per_decode;
             py::gil_scoped_release release;
             return value_or_throw(pd::PrefillServer::create(std::move(o)));
           }),
           py::arg("engine"), py::arg("layout"), py::arg("aux") = std::vector<AuxRow>{},
           py::arg("state") = std::vector<StateRows>{}, py::arg("tp_rank") = 0,
           py::arg("tp_size") = 1, py::arg("total_kv_heads") = 0, py::arg("bootstrap_address") = "",
           py::arg("control_listen") = "127.0.0.1:0", py::arg("worker_shards") = 2,
           py::arg("timeouts") = pd::PdTimeouts{}, py::arg("strategy") = py::none(),
           py::arg("max_pages_per_call") = 0,
           py::arg("max_open_rooms") = pd::PrefillServerOptions{}.max_open_rooms,
           py::arg("max_open_rooms_per_decode") =
               pd::PrefillServerOptions{}.max_open_rooms_per_decode,
           py::keep_alive<1, 2>())
      .def_property_readonly("control_endpoint", &pd::PrefillServer::control_endpoint)
      .def(
          "create_sender",
          [](pd::PrefillServer& s, uint64_t room) { return value_or_throw(s.create_sender(room)); },
          py::arg("room"), py::keep_alive<0, 1>())
      .def("stats", [](const pd::PrefillServer& s) {
        const pd::PrefillStats st = s.stats();
        py::dict d;
        d["requests_succeeded"] = st.requests_succeeded;
        d["requests_failed"] = st.requests_failed;
        d["bytes_sent"] = st.bytes_sent;
        d["decode_connections"] = st.decode_connections;
        d["open_rooms"] = st.open_rooms;
        return d;
      });

  py::class_<pd::DecodeClient>(m, "DecodeClient")
      .def(py::init([](const py::object& engine, const kv::KvLayout& layout,
                       const std::vector<AuxRow>& aux, const std::vector<StateRows>& state,
                       uint32_t tp_rank, uint32_t tp_size, uint32_t total_kv_heads,
                       const pd::PdTimeouts& timeouts, int bootstrap_threads) {
             pd::DecodeClientOptions o;
             o.engine = &unwrap_engine(engine);
             o.buffers = make_buffers(layout, aux, state);
             o.tp = {tp_rank, tp_size, total_kv_heads};
             o.timeouts = timeouts;
             o.bootstrap_threads = bootstrap_threads;
             py::gil_scoped_release release;
             return value_or_throw(pd::DecodeClient::create(std::move(o)));
           }),
           py::arg("engine"), py::arg("layout"), py::arg("aux") = std::vector<AuxRow>{},
           py::arg("state") = std::vector<StateRows>{}, py::arg("tp_rank") = 0,
           py::arg("tp_size") = 1, py::arg("total_kv_heads") = 0,
           py::arg("timeouts") = pd::PdTimeouts{}, py::arg("bootstrap_threads") = 2,
           py::keep_alive<1, 2>())
      .def(
          "create_receiver",
          [](pd::DecodeClient& c, const std::string& bootstrap_address, uint64_t room) {
            py::gil_scoped_release release;
            return value_or_throw(c.create_receiver(bootstrap_address, room));
          },
          py::arg("bootstrap_address"), py::arg("room"), py::keep_alive<0, 1>())
      .def("stats", [](const pd::DecodeClient& c) {
        const pd::DecodeStats st = c.stats();
        py::dict d;
        d["requests_succeeded"] = st.requests_succeeded;
        d["requests_failed"] = st.requests_failed;
        d["prefill_connections"] = st.prefill_connections;
        return d;
      });
}

}  // namespace kvferry::python
