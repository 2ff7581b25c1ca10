#include "engine/copy_executor.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kvferry::detail {
namespace {

struct Slice {
  size_t first_span = 0;
  uint64_t first_offset = 0;  // bytes of first_span already owned by the previous slice
  size_t last_span = 0;       // inclusive
  uint64_t last_end = 0;      // end offset within last_span
};

// Why a copier must stop now, or OK.
Status stop_reason(const BatchRecord& b) {
  if (b.cancelled.load()) return b.stop_reason();
  if (b.peer->is_disconnected()) {
    return PeerDisconnected("peer " + b.peer->name + " disconnected: " + b.peer->disconnect_reason());
  }
  if (Clock::now() >= b.deadline) {
    return Timeout("batch exceeded its timeout of " + std::to_string(b.timeout.count()) + " ms");
  }
  return Status::Ok();
}

// Copies one slice chunk by chunk.
Status copy_slice(BatchRecord& b, const Slice& s) {
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
      std::memcpy(spans[span].dst + offset, spans[span].src + offset, n);
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
std::vector<Slice> balance(const std::vector<CopySpan>& spans, uint64_t total, int parts) {
  std::vector<Slice> slices;
  uint64_t per_slice = (total + parts - 1) / parts;
  Slice current;
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
        current = Slice{offset == spans[i].length ? i + 1 : i,
                        offset == spans[i].length ? 0 : offset, 0, 0};
        filled = 0;
      }
    }
  }
  return slices;
}

}  // namespace

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
    batch->finish_task(copy_slice(*batch, Slice{0, 0, spans.size() - 1, spans.back().length}));
    return;
  }
  parts = static_cast<int>(std::min<uint64_t>(parts, std::max<uint64_t>(1, bytes / inline_bytes_)));
  std::vector<Slice> slices = balance(spans, bytes, parts);
  batch->pending_tasks.store(static_cast<int>(slices.size()));
  for (const Slice& slice : slices) {
    pool_.post([batch, slice] { batch->finish_task(copy_slice(*batch, slice)); });
  }
  std::lock_guard lock(batch->mu);
  batch->post_time = Clock::now() - batch->start;
}

}  // namespace kvferry::detail
