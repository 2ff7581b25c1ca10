// The public TransferEngine: a thin facade over detail::EngineImpl.
#include "kvferry/transfer_engine.h"

#include "engine/engine_impl.h"
#include "transport/landing_fence.h"

namespace kvferry {

const std::string& PeerHandle::name() const { return state_->name; }
TransportKind PeerHandle::transport() const {
  return detail::EngineImpl::preferred_transport(*this);
}
std::vector<Route> PeerHandle::routes() const { return detail::EngineImpl::routes(*this); }
uint64_t PeerHandle::incarnation() const { return state_->incarnation; }

Result<std::unique_ptr<TransferEngine>> TransferEngine::create(EngineOptions options) {
  KVF_ASSIGN_OR_RETURN(auto impl, detail::EngineImpl::create(std::move(options)));
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

TransferEngine::TransferEngine(std::unique_ptr<detail::EngineImpl> impl) : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

const std::string& TransferEngine::endpoint() const { return impl_->endpoint(); }
const std::vector<std::string>& TransferEngine::endpoints() const { return impl_->endpoints(); }
const EngineOptions& TransferEngine::options() const { return impl_->options(); }
uint64_t TransferEngine::incarnation() const { return impl_->incarnation(); }
const std::optional<std::string>& TransferEngine::secret() const { return impl_->secret(); }
MetricsSnapshot TransferEngine::metrics() const { return impl_->metrics(); }

Status TransferEngine::register_memory(void* addr, size_t length, MemoryLocation location) {
  MemoryRegion region{addr, length, location};
  return impl_->register_memory({&region, 1});
}
Status TransferEngine::register_memory(std::span<const MemoryRegion> regions) {
  return impl_->register_memory(regions);
}
Status TransferEngine::unregister_memory(void* addr) {
  return impl_->unregister_memory({&addr, 1});
}
Status TransferEngine::unregister_memory(std::span<void* const> addrs) {
  return impl_->unregister_memory(addrs);
}
Result<MemoryLocation> TransferEngine::registered_location(const void* addr, size_t length) const {
  return impl_->registered_location(reinterpret_cast<uint64_t>(addr), length);
}
Result<SharedBuffer> TransferEngine::allocate_shared(size_t bytes) {
  return impl_->allocate_shared(bytes);
}
Status TransferEngine::free_shared(void* addr) { return impl_->free_shared(addr); }

Result<PeerHandle> TransferEngine::open_peer(std::string_view name, const PeerOptions& options) {
  return impl_->open_peer(name, options);
}

void TransferEngine::close_peer(const PeerHandle& peer) { impl_->close_peer(peer); }

void TransferEngine::wait_for_landings() const { kvferry::wait_for_landings(); }

Status TransferEngine::probe_peer(std::string_view name, std::chrono::milliseconds timeout) {
  return impl_->probe_peer(name, timeout);
}

Result<BatchHandle> TransferEngine::submit(const PeerHandle& peer, std::span<const TransferOp> ops,
                                           const SubmitOptions& options) {
  return impl_->submit(peer, ops, options);
}
BatchStatus TransferEngine::status(const BatchHandle& batch) const { return impl_->status(batch); }
BatchStatus TransferEngine::wait(const BatchHandle& batch,
                                 std::chrono::milliseconds timeout) const {
  return impl_->wait(batch, timeout);
}
void TransferEngine::cancel(const BatchHandle& batch) { impl_->cancel(batch); }

Status TransferEngine::send_notification(const PeerHandle& peer, std::string_view bytes,
                                         std::chrono::milliseconds timeout) {
  return impl_->send_notification(peer, bytes, timeout);
}

std::vector<Notification> TransferEngine::get_notifications(size_t max) {
  return impl_->get_notifications(max);
}

Status TransferEngine::transfer_sync(const PeerHandle& peer, std::span<const TransferOp> ops,
                                     const SubmitOptions& options) {
  KVF_ASSIGN_OR_RETURN(BatchHandle batch, submit(peer, ops, options));
  auto timeout = options.timeout.count() > 0 ? options.timeout : impl_->options().batch_timeout;
  // The batch's own deadline bounds this wait; a margin lets the deadline fire first.
  BatchStatus s = wait(batch, timeout + std::chrono::milliseconds(1000));
  return s.state == BatchState::kPending ? Internal("batch still pending after its timeout")
                                         : s.status;
}

}  // namespace kvferry
