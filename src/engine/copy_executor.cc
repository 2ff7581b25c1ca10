#include "engine/copy_executor.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kvferry::detail {
namespace {

// Why a copier must stop now, or OK.
Status stop_reason(const BatchRecord& b) {
  if (b.cancelled.load()) return b.stop_reason();
  if (b.peer->is_disconnected()) {
    return PeerDisconnected("peer " + b.peer->name() +
                            " disconnected: " + b.peer->disconnect_reason());
  }
  if (Clock::now() >= b.deadline) {
    return Timeout("batch exceeded its timeout of " + std::to_string(b.timeout.count()) + " ms");
  }
  return Status::Ok();
}

// Copies one slice chunk by chunk.
Status copy_slice(BatchRecord& b, const CopySlice& s) {
  const auto& spans = b.work.spans;
  size_t span = s.first_span;
  uint64_t offset = s.first_offset;
  while (span <= s.last_span) {
    b.active_copies.fetch_add(1);
    Status why = stop_reason(b);
    if (!why.ok()) {
      b.active_copies.fetch_sub(1);
      return why;
    }
    uint64_t chunk_bytes = 0;
    size_t chunk_spans = 0;
    while (span <= s.last_span && chunk_bytes < kCopyChunkBytes && chunk_spans < kCopyChunkSpans) {
      uint64_t end = span == s.last_span ? s.last_end : spans[span].length;
      uint64_t n = std::min(end - offset, kCopyChunkBytes - chunk_bytes);
      // memmove: a self-peer op may overlap its own source; as fast as memcpy otherwise.
      std::memmove(spans[span].dst() + offset, spans[span].src() + offset, n);
      chunk_bytes += n;
      offset += n;
      if (offset == end) {
        ++span;
        offset = 0;
        ++chunk_spans;
      }
    }
    b.active_copies.fetch_sub(1);
  }
  return Status::Ok();
}

// Cuts the spans into `parts` slices of about equal bytes.
std::vector<CopySlice> balance(const std::vector<ResolvedOp>& spans, uint64_t total, int parts) {
  std::vector<CopySlice> slices;
  uint64_t per_slice = (total + parts - 1) / parts;
  CopySlice current;
  uint64_t filled = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    uint64_t offset = 0;
    while (offset < spans[i].length) {
      uint64_t take = std::min(spans[i].length - offset, per_slice - filled);
      offset += take;
      filled += take;
      if (filled == per_slice || (i + 1 == spans.size() && offset == spans[i].length)) {
        current.last_span = i;
        current.last_end = offset;
        slices.push_back(current);
        current = CopySlice{offset == spans[i].length ? i + 1 : i,
                            offset == spans[i].length ? 0 : offset, 0, 0};
        filled = 0;
      }
    }
  }
  return slices;
}

}  // namespace

bool CopyExecutor::run_slice(BatchRecord& batch, size_t i) {
  if (batch.slice_claimed[i].exchange(true)) return false;
  batch.finish_task(copy_slice(batch, batch.slices[i]));
  return true;
}

void CopyExecutor::help(BatchRecord& batch) {
  if (!batch.slice_claimed) return;  // ran inline
  for (size_t i = 0; i < batch.slices.size(); ++i) run_slice(batch, i);
}

void CopyExecutor::run(const std::shared_ptr<BatchRecord>& batch) {
  const auto& spans = batch->work.spans;
  const uint64_t bytes = batch->work.bytes;
  int parts = pool_.size();
  if (bytes <= inline_bytes_ || parts == 0) {
    batch->pending_tasks.store(1);
    {
      std::lock_guard lock(batch->mu);
      batch->post_time = Clock::now() - batch->start;
    }
    batch->finish_task(copy_slice(*batch, CopySlice{0, 0, spans.size() - 1, spans.back().length}));
    return;
  }
  parts = static_cast<int>(std::min<uint64_t>(
      parts, std::max<uint64_t>(1, bytes / std::max<uint64_t>(1, inline_bytes_))));
  batch->slices = balance(spans, bytes, parts);
  const size_t n = batch->slices.size();
  batch->slice_claimed = std::make_unique<std::atomic<bool>[]>(n);
  batch->pending_tasks.store(static_cast<int>(n));
  for (size_t i = 0; i < n; ++i) {
    pool_.post([batch, i] { run_slice(*batch, i); });
  }
  std::lock_guard lock(batch->mu);
  batch->post_time = Clock::now() - batch->start;
}

}  // namespace kvferry::detail
