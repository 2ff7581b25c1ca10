#include "transport/ucx/ucx_transport.h"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "core/logging.h"
#include "core/spin_gate.h"
#include "transport/ucx/ucx_channel.h"
#include "transport/ucx/ucx_log.h"
#include "transport/ucx/ucx_sealed_address.h"
#include "transport/ucx/ucx_worker.h"

namespace kvferry {
namespace {

using detail::UcxChannel;
using detail::UcxJob;
using detail::UcxOp;
using detail::UcxWorker;

constexpr std::string_view kAllowHint =
    "allow them with EngineOptions::ucx_allow_emulated or KVFERRY_UCX_ALLOW_EMULATED=1 on "
    "trusted hosts";

// A small part's answer comes sooner than a sleeping waiter wakes: the thread that waits for
// its batch polls for up to kHotWait first, while polling pays (SpinGate), rather than sleep
// until the progress thread's completion wakes it. It polls by running the worker's turns
// itself (UcxWorker::Driver), so the progress thread does not poll beside it.
constexpr uint64_t kHotWaitBytes = uint64_t{256} << 10;
constexpr std::chrono::microseconds kHotWait{100};

// The waiting role of one link: one thread at a time polls, the others sleep.
struct UcxWaitRole {
  std::mutex mu;
  SpinGate gate;
};

class UcxHotWait final : public BatchHelper {
 public:
  // Weak: a batch may outlive the engine's transports, and must not keep the worker (whose
  // last owner joins its thread) alive on the progress thread.
  UcxHotWait(std::shared_ptr<UcxWaitRole> role, std::weak_ptr<UcxWorker> worker,
             const BatchProgress* batch)
      : role_(std::move(role)), worker_(std::move(worker)), batch_(batch) {}
  void help(Clock::time_point until) override {
    std::unique_lock lock(role_->mu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    SpinGate& gate = role_->gate;
    Clock::time_point now = Clock::now();
    gate.open(now, kHotWait);
    const std::shared_ptr<UcxWorker> worker = worker_.lock();
    if (!worker) return;
    if (!gate.spinning()) {
      worker->will_not_poll();
      return;
    }
    UcxWorker::Driver driver(*worker);
    while (gate.spinning()) {
      Clock::time_point began = now;
      // A turn that moved something did work, not lose the core: the gate times the rest.
      if (driver.turn()) began = Clock::now();
      if (batch_->is_final()) {
        gate.settle();
        gate.stop();
        return;
      }
      now = Clock::now();
      if (now >= until) {
        gate.stop();
        return;
      }
      gate.keep_polling(began, now);
    }
  }
  void collect() override {
    if (const std::shared_ptr<UcxWorker> worker = worker_.lock()) worker->poll_here();
  }

 private:
  std::shared_ptr<UcxWaitRole> role_;
  std::weak_ptr<UcxWorker> worker_;
  const BatchProgress* batch_;
};

// The initiating side for one peer incarnation: checks and hands parts to the progress
// thread. Its channel outlives it until the endpoint is closed; it keeps the worker alive
// (the engine destroys its transports before its peers).
class UcxLink final : public TransportLink {
 public:
  UcxLink(std::shared_ptr<UcxWorker> worker, std::shared_ptr<UcxChannel> channel,
          std::string peer_name)
      : worker_(std::move(worker)),
        channel_(std::move(channel)),
        peer_name_(std::move(peer_name)) {}
  ~UcxLink() override {
    worker_->post([channel = channel_] { channel->shut(PeerDisconnected("the link was closed")); });
  }

  Status post(const BatchPart& part) override {
    auto job = std::make_unique<UcxJob>();
    job->batch = part.batch;
    job->ops.reserve(part.spans.size());
    size_t hint = 0;
    for (const ResolvedOp& op : part.spans) {
      const RegionEntry* region =
          part.remote != nullptr ? part.remote->find(op.remote_addr, op.length, hint) : nullptr;
      if (region == nullptr) {
        return NotRegistered(fmt::format("ucx: [{:#x}, +{}) lies in no region {} advertises",
                                         op.remote_addr, op.length, peer_name_));
      }
      if (region->ucx_rkey.empty()) {
        return FailedPrecondition(
            fmt::format("ucx: {}'s region [{:#x}, +{}) holding {:#x} carries no ucx rkey",
                        peer_name_, region->addr, region->length, op.remote_addr));
      }
      job->ops.push_back(
          UcxOp{op.kind, op.local, op.remote_addr, op.length, region->addr, &region->ucx_rkey});
    }
    part.batch->add_tasks(1);
    auto enqueue = [channel = channel_, job = std::shared_ptr<UcxJob>(std::move(job))]() mutable {
      channel->enqueue(std::make_unique<UcxJob>(std::move(*job)));
    };
    if (part.bytes > kHotWaitBytes) {
      worker_->post(std::move(enqueue));
      return Status::Ok();
    }
    // A small part is sent from here, and its waiter polls for the answer (UcxHotWait).
    part.batch->add_helper(std::make_shared<UcxHotWait>(wait_role_, worker_, part.batch.get()));
    worker_->post_here(std::move(enqueue));
    return Status::Ok();
  }

  void shutdown() override {
    worker_->post(
        [channel = channel_] { channel->shut(PeerDisconnected("closed by this engine")); });
  }

 private:
  std::shared_ptr<UcxWorker> worker_;
  std::shared_ptr<UcxChannel> channel_;
  std::string peer_name_;
  std::shared_ptr<UcxWaitRole> wait_role_ = std::make_shared<UcxWaitRole>();
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(const TransportEnv& env, std::shared_ptr<UcxWorker> worker,
               detail::UcxResources resources, std::string inert_reason)
      : env_(env),
        worker_(std::move(worker)),
        resources_(std::move(resources)),
        inert_reason_(std::move(inert_reason)) {}

  ~UcxTransport() override {
    if (!worker_) return;
    worker_
        ->call([this] {
          for (auto& [addr, memh] : memory_) ucp_mem_unmap(worker_->context(), memh);
          memory_.clear();
          return Status::Ok();
        })
        .ignore();
  }

  TransportKind kind() const override { return TransportKind::kUcx; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kRemoteAddress;
    // Active messages are served by the target's progress thread; hardware RMA by its NIC.
    caps.target_runs_progress = !resources_.hardware_rma;
    return caps;
  }

  void describe(SegmentDescriptor& self) const override {
    if (!worker_) return;
    if (!env_.secret) {
      self.ucx = UcxEndpoint{worker_->address(), resources_.hardware_rma};
      return;
    }
    // With a secret, only peers holding it can read the address (ucx_sealed_address.h).
    Result<std::string> sealed =
        detail::seal_worker_address(*env_.secret, worker_->address(), env_.incarnation);
    if (!sealed.ok()) {
      log().warn("ucx: not advertising the worker: {}", sealed.status().to_string());
      return;
    }
    self.ucx = UcxEndpoint{std::move(sealed).value(), resources_.hardware_rma};
  }

  Status register_region(RegionEntry& entry) override {
    if (!worker_) return Status::Ok();
    if (entry.location.kind == MemoryLocation::Kind::kCuda) {
      // Device memory is left to cuda_ipc: why_not refuses ucx routes to it.
      return Status::Ok();
    }
    std::string packed;
    Status mapped = worker_->call([&] {
      ucp_mem_map_params_t params{};
      params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      params.address = entry.host_ptr;
      params.length = entry.length;
      ucp_mem_h memh = nullptr;
      ucs_status_t s = ucp_mem_map(worker_->context(), &params, &memh);
      if (s != UCS_OK) {
        return Internal(fmt::format("ucp_mem_map of [{:#x}, +{}) failed: {}", entry.addr,
                                    entry.length, detail::ucx_status_text(s)));
      }
      void* buffer = nullptr;
      size_t bytes = 0;
      s = ucp_rkey_pack(worker_->context(), memh, &buffer, &bytes);
      if (s != UCS_OK) {
        ucp_mem_unmap(worker_->context(), memh);
        return Internal(fmt::format("ucp_rkey_pack of [{:#x}, +{}) failed: {}", entry.addr,
                                    entry.length, detail::ucx_status_text(s)));
      }
      packed.assign(static_cast<const char*>(buffer), bytes);
      ucp_rkey_buffer_release(buffer);
      if (packed.size() > kMaxUcxRkeyBytes) {
        ucp_mem_unmap(worker_->context(), memh);
        return Internal(
            fmt::format("packed rkey of [{:#x}, +{}) has {} bytes, over the "
                        "descriptor's limit of {}",
                        entry.addr, entry.length, packed.size(), kMaxUcxRkeyBytes));
      }
      memory_[entry.addr] = memh;
      return Status::Ok();
    });
    if (mapped.ok()) entry.ucx_rkey = std::move(packed);
    return mapped;
  }

  void unregister_region(const RegionEntry& entry) override {
    if (!worker_ || entry.ucx_rkey.empty()) return;
    worker_
        ->call([&] {
          auto it = memory_.find(entry.addr);
          if (it != memory_.end()) {
            ucp_mem_unmap(worker_->context(), it->second);
            memory_.erase(it);
          }
          return Status::Ok();
        })
        .ignore();
  }

  std::string why_not(RouteKey key, PeerPlace, const SegmentDescriptor& peer) const override {
    if (!worker_) return inert_reason_;
    if (key.local == MemoryKind::kDevice || key.remote == MemoryKind::kDevice) {
      return resources_.cuda_memory ? "ucx moves host memory only (device memory over UCX is "
                                      "not implemented)"
                                    : "ucx moves host memory only (this UCX has no CUDA "
                                      "memory support: ucx_info -d lists no cuda transport)";
    }
    if (!peer.ucx) return "the peer advertises no ucx worker";
    if (Result<std::string> address = peer_worker_address(peer); !address.ok()) {
      return address.status().message();
    }
    if (!peer.ucx->hardware_rma && !env_.ucx_allow_emulated) {
      return fmt::format(
          "the peer's UCX has no hardware RMA transport, and emulated paths (tcp, shared "
          "memory) authenticate nothing and carry UCX's unchecked writes; {}",
          kAllowHint);
    }
    return "";
  }

  std::string why_not_preferred(RouteKey, PeerPlace, const SegmentDescriptor& peer) const override {
    if (resources_.hardware_rma && peer.ucx && peer.ucx->hardware_rma) return "";
    return fmt::format(
        "UCX has no hardware RMA transport on both sides (here: {}), so tcp stays the default; "
        "force ucx to use it",
        detail::join_transports(resources_.transports));
  }

  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo& peer) override {
    if (!worker_) return NotSupported(inert_reason_);
    if (!peer.descriptor.ucx) {
      return NotSupported(fmt::format("peer {} advertises no ucx worker", peer.name));
    }
    // The caller names the peer in its message.
    KVF_ASSIGN_OR_RETURN(std::string address, peer_worker_address(peer.descriptor));
    const detail::UcxDataPath path =
        detail::choose_ucx_data_path(resources_.hardware_rma, peer.descriptor.ucx->hardware_rma);
    log().debug("ucx: peer {} over {}", peer.name, detail::ucx_data_path_name(path));
    auto channel = std::make_shared<UcxChannel>(*worker_, peer.name, address, peer.liveness, path);
    return std::shared_ptr<TransportLink>(
        std::make_shared<UcxLink>(worker_, std::move(channel), peer.name));
  }

 private:
  // The peer's worker address, usable only once it proved the secret (if one is set here):
  // sealed with it for the incarnation it advertises. Without a secret here, a sealed address
  // is refused too (it cannot be used, and the peer expects authenticated peers only).
  Result<std::string> peer_worker_address(const SegmentDescriptor& peer) const {
    const std::string& advertised = peer.ucx->worker_address;
    const bool sealed = detail::is_sealed_worker_address(advertised);
    if (!env_.secret) {
      if (sealed) {
        return Unauthenticated(
            "the peer's ucx worker address is sealed with a secret and this engine has none "
            "(set KVFERRY_SECRET to the peer's)");
      }
      return advertised;
    }
    if (!sealed) {
      return Unauthenticated(
          "the peer advertises its ucx worker address unsealed, so it has not proved "
          "KVFERRY_SECRET; ucx is refused (it has no secret set, or runs an older kvferry)");
    }
    return detail::open_sealed_worker_address(*env_.secret, advertised, peer.incarnation);
  }

  TransportEnv env_;
  std::shared_ptr<UcxWorker> worker_;  // null: inert (inert_reason_ says why)
  detail::UcxResources resources_;
  std::string inert_reason_;
  std::map<uint64_t, ucp_mem_h> memory_;  // by region address; in the worker's turns
};

}  // namespace

Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportEnv& env) {
  detail::install_ucx_log_handler();
  Result<detail::UcxResources> resources = detail::query_ucx_resources();
  if (!resources.ok()) {
    return std::unique_ptr<Transport>(new UcxTransport(
        env, nullptr, {}, "UCX did not start here: " + resources.status().message()));
  }
  if (!resources->hardware_rma && !env.ucx_allow_emulated) {
    return std::unique_ptr<Transport>(new UcxTransport(
        env, nullptr, *resources,
        fmt::format("UCX here has only emulated put/get ({}), which authenticate nothing and "
                    "carry UCX's unchecked writes; {}",
                    detail::join_transports(resources->transports), kAllowHint)));
  }
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<UcxWorker> worker,
                       UcxWorker::create(env.engine_name, env.local_regions,
                                         resources->hardware_rma, env.frame_rest_timeout));
  detail::UcxResources used = worker->resources();
  log().info("ucx: worker up ({}; hardware RMA: {}{})", detail::join_transports(used.transports),
             used.hardware_rma ? "yes" : "no", used.hardware_rma ? "" : ", emulation allowed");
  return std::unique_ptr<Transport>(new UcxTransport(env, std::move(worker), std::move(used), ""));
}

}  // namespace kvferry
