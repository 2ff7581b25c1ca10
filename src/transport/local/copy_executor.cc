#include "transport/local/copy_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>

#include "transport/region_index.h"
#include "transport/shm_mapping.h"

namespace kvferry {
namespace {

// A byte range of a part's spans that one thread copies.
struct CopySlice {
  size_t first_span = 0;
  uint64_t first_offset = 0;  // bytes of first_span owned by the previous slice
  size_t last_span = 0;       // inclusive
  uint64_t last_end = 0;      // end offset within last_span
};

// The copy step of copy_slice: memmove, or a ChunkCopier handed each chunk's pieces.
struct MemmoveStep {
  void piece(const ResolvedOp& span, uint64_t offset, uint64_t n) {
    // memmove: a self-peer op may overlap its own source; as fast as memcpy otherwise.
    std::memmove(span.dst() + offset, span.src() + offset, n);
  }
  Status end_chunk() { return Status::Ok(); }
};

struct PluggedStep {
  explicit PluggedStep(const ChunkCopier& c) : copier(c) {}
  void piece(const ResolvedOp& span, uint64_t offset, uint64_t n) {
    pieces[count++] = CopyPiece{&span, offset, n};
  }
  Status end_chunk() {
    Status s = copier.copy_chunk({pieces.data(), count});
    count = 0;
    return s;
  }
  const ChunkCopier& copier;
  std::array<CopyPiece, kMaxChunkPieces> pieces{};
  size_t count = 0;
};

// After a chunk's copy: every peer shm region it touched must still be registered, or the
// bytes went into memory the peer no longer reads (it unregistered or freed the region while
// its memfd stayed mapped here). A guard that still holds its generation, read after the
// copy (shm_guard_held_after_copy), means the bytes were in place while the region was
// registered.
Status check_remote_guards(std::span<const ResolvedOp> spans) {
  const RegionEntry* checked = nullptr;
  for (const ResolvedOp& op : spans) {
    if (op.remote_shm == nullptr || op.remote_shm == checked) continue;
    if (!shm_guard_held_after_copy(op.remote_shm->shm_guard, op.remote_shm->shm->generation)) {
      return NotRegistered(
          fmt::format("the peer unregistered the shared region holding {:#x} while the batch ran",
                      op.remote_addr));
    }
    checked = op.remote_shm;
  }
  return Status::Ok();
}

// Copies one slice chunk by chunk.
template <typename Step>
Status copy_slice(BatchProgress& b, std::span<const ResolvedOp> spans, const CopySlice& s,
                  Step& step) {
  size_t span = s.first_span;
  uint64_t offset = s.first_offset;
  while (span <= s.last_span) {
    auto guard = b.copying();
    if (Status why = b.stop_reason(); !why.ok()) return why;
    const size_t chunk_first = span;
    uint64_t chunk_bytes = 0;
    size_t chunk_spans = 0;
    while (span <= s.last_span && chunk_bytes < kCopyChunkBytes && chunk_spans < kCopyChunkSpans) {
      uint64_t end = span == s.last_span ? s.last_end : spans[span].length;
      uint64_t n = std::min(end - offset, kCopyChunkBytes - chunk_bytes);
      step.piece(spans[span], offset, n);
      chunk_bytes += n;
      offset += n;
      if (offset == end) {
        ++span;
        offset = 0;
        ++chunk_spans;
      }
    }
    if (Status copied = step.end_chunk(); !copied.ok()) return copied;
    // The chunk covered spans [chunk_first, span], the last one possibly not at all.
    const size_t chunk_end = std::min(span + 1, s.last_span + 1);
    KVF_RETURN_IF_ERROR(check_remote_guards(spans.subspan(chunk_first, chunk_end - chunk_first)));
  }
  return Status::Ok();
}

Status copy_slice(const ChunkCopier* copier, BatchProgress& b, std::span<const ResolvedOp> spans,
                  const CopySlice& s) {
  if (copier == nullptr) {
    MemmoveStep step;
    return copy_slice(b, spans, s, step);
  }
  auto step = std::make_unique<PluggedStep>(*copier);  // ~12 KiB: not on a worker's stack
  return copy_slice(b, spans, s, *step);
}

// The spans cut into `count` slices of `per_slice` bytes each (the last one the rest), cut
// as they are claimed: whoever claims slice i walks the spans' lengths from where slice i - 1
// ended. A pass over every span before the first copy cost as much as a third of the copies
// (a million 64-byte spans: every span record read once more, about 3 ns a span, by the
// submitting thread while the workers waited); claimed in turn, one copier's walk overlaps
// the others' copies, and the records it reads are the ones it copies next.
class SliceCutter {
 public:
  SliceCutter(std::span<const ResolvedOp> spans, uint64_t total, uint64_t slices)
      : spans_(spans),
        per_slice_((total + slices - 1) / slices),
        count_((total + per_slice_ - 1) / per_slice_) {}
  uint64_t count() const { return count_; }
  // The next slice, or nullopt once all were claimed.
  std::optional<CopySlice> claim() {
    std::lock_guard lock(mu_);
    if (claimed_ == count_) return std::nullopt;
    ++claimed_;
    CopySlice slice{span_, offset_, 0, 0};
    uint64_t wanted = per_slice_;
    for (;;) {
      const uint64_t left = spans_[span_].length - offset_;
      if (left > wanted) {
        offset_ += wanted;
        slice.last_span = span_;
        slice.last_end = offset_;
        return slice;
      }
      wanted -= left;
      slice.last_span = span_;
      slice.last_end = spans_[span_].length;
      offset_ = 0;
      if (++span_ == spans_.size() || wanted == 0) return slice;
    }
  }

 private:
  const std::span<const ResolvedOp> spans_;
  const uint64_t per_slice_;
  const uint64_t count_;
  std::mutex mu_;
  uint64_t claimed_ = 0;  // under mu_, as are the two below
  size_t span_ = 0;       // where the next slice starts
  uint64_t offset_ = 0;
};

// A part split over workers: slices are claimed in order (SliceCutter) by whoever is free
// (a worker, or a thread waiting for the batch), so a worker that wakes late finds only
// what is left and the waiter never waits for a slice nobody is copying. At most
// `max_copiers` threads copy at once: one that comes when that many already do leaves the
// rest to them (they claim until no slice is left, so nothing is stranded). Owned by the
// batch (as its helper) and by the worker tasks; it points at the batch without owning it,
// so the two never keep each other alive.
class SlicedCopy final : public BatchHelper {
 public:
  SlicedCopy(BatchProgress& batch, std::span<const ResolvedOp> spans, uint64_t total,
             uint64_t slices, std::shared_ptr<const ChunkCopier> copier, int max_copiers)
      : copier_(std::move(copier)),
        batch_(batch),
        spans_(spans),
        cutter_(spans, total, slices),
        max_copiers_(max_copiers) {}

  uint64_t size() const { return cutter_.count(); }
  void help(Clock::time_point /*until*/) override { run_some(); }
  // Claims and copies slices until none is left, unless max_copiers threads already do.
  void run_some() {
    if (copiers_.fetch_add(1) >= max_copiers_) {
      copiers_.fetch_sub(1);
      return;
    }
    while (std::optional<CopySlice> slice = cutter_.claim()) {
      batch_.finish_task(copy_slice(copier_.get(), batch_, spans_, *slice));
    }
    copiers_.fetch_sub(1);
  }

 private:
  std::shared_ptr<const ChunkCopier> copier_;
  BatchProgress& batch_;
  std::span<const ResolvedOp> spans_;
  SliceCutter cutter_;
  const int max_copiers_;
  std::atomic<int> copiers_{0};
};

}  // namespace

uint64_t copy_slice_count(uint64_t bytes, int workers) {
  const uint64_t most = kCopySlicesPerWorker * static_cast<uint64_t>(std::max(workers, 1));
  return std::clamp<uint64_t>(bytes / kMinCopySliceBytes, 1, most);
}

void CopyExecutor::run(const BatchPart& part) {
  BatchProgress& batch = *part.batch;
  const std::span<const ResolvedOp> spans = part.spans;
  int parts = pool_.size();
  if (part.bytes <= inline_bytes_ || parts == 0) {
    batch.add_tasks(1);
    batch.mark_posted();
    batch.finish_task(copy_slice(copier_.get(), batch, spans,
                                 CopySlice{0, 0, spans.size() - 1, spans.back().length}));
    return;
  }
  auto job = std::make_shared<SlicedCopy>(
      batch, spans, part.bytes, copy_slice_count(part.bytes, parts), copier_, max_copiers_);
  const uint64_t n = job->size();
  batch.add_tasks(static_cast<int>(n));
  batch.add_helper(job);
  bool pooled = true;
  for (size_t i = 0; pooled && i < std::min<size_t>(n, static_cast<size_t>(parts)); ++i) {
    pooled = pool_.post([keep = part.batch, job] { job->run_some(); }).ok();
  }
  batch.mark_posted();
  if (!pooled) job->run_some();  // the pool has no thread and none starts: copied here
}

}  // namespace kvferry
