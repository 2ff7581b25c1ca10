// CopyExecutor: runs a part of a batch with memcpy — the data path of the local and shm
// transports. Parts of at most EngineOptions::inline_batch_bytes (4 MiB by default) run on
// the submitting thread; larger ones are cut into byte-balanced slices of at least 1 MiB,
// about four per worker (copy_slice_count), claimed in order by whoever is free (the
// workers, and a thread that waits for the batch: BatchHelper) and cut as they are claimed,
// so a worker that wakes late finds only what the others left. At most `max_copiers`
// threads copy one part at once (by default the CPUs this process may use): one that comes
// when that many already copy leaves the rest to them. Without the cap the default two
// workers and the waiter are three copiers on a 2-CPU machine, and the batch waits for
// whichever one the scheduler set aside (the likely cost, not measured apart). 64 KiB x
// 1024 on 2 threads went from 0.85-1.00x memcpy to 0.92-1.09x; where the CPUs outnumber the
// workers the cap never binds (docs/PERFORMANCE.md, "Engine: local and shm against
// memcpy").
//
// Why a fixed 4 MiB threshold and not a probe at engine start, nor a lower threshold: on a
// 2-core AMD EPYC VM one thread copies a cache-resident 4 MiB at ~60 GB/s, and a second
// thread adds no bandwidth there but costs a worker's wake-up and the cache lines it pulls
// from the other core: with the split (2 MiB threshold) 4 MiB x 1 on 2 threads measured
// 0.75-0.93x memcpy, inline 0.96-1.08x. From 8 MiB on (64 KiB x 128, 1 MiB x 16, DRAM-sized
// batches) the split wins or ties, so the threshold sits between. No threshold is right
// everywhere: where a core's copy is slower than the memory system, splitting 4 MiB pays. On
// the 2-core Xeon VM of docs/PERFORMANCE.md ("Engine: local and shm against memcpy") one
// thread copies 4 MiB at ~14 GB/s and two at ~27, so single 1-4 MiB ops run at 0.5-0.7 of a
// two-thread memcpy there; with inline_batch_bytes = 1 MiB one 4 MiB shm write went from
// 13.5-14.4 to 24.8-25.1 GB/s, but 4 MiB x 16 from 21-23 to 19 GB/s (2 runs each),
// and a probe of a few milliseconds at engine start measures whoever else runs at that moment
// (the cells here swing by 10-30% from run to run) and fixes that answer for the engine's
// life; a deployment that knows better sets inline_batch_bytes. Slices are decoupled from
// the threshold: at least 1 MiB (a slice's claim and chunk checks are a call's cost below
// that), and four per worker so a late worker costs at most a quarter of its share (64 KiB
// x 128 with 2 MiB slices: 0.88x; with 1 MiB slices 0.94-1.09x). The cma transport passes
// at most 2 MiB: its process_vm_writev copy runs ~14 GB/s on one core, so splitting 4 MiB
// pays there (17-19 GB/s split against 13-15 GB/s inline).
//
// CopyLink: the TransportLink of both memcpy transports (the peer's memory is mapped here).
//
// ChunkCopier: the copy step of a transport that moves the same chunks another way (cma:
// process_vm_writev/readv). Without one, a chunk is copied with memmove, exactly as before.
//
// Thread-safety: run() may be called concurrently; the pool is shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/thread_pool.h"
#include "transport/transport.h"

namespace kvferry {

inline constexpr uint64_t kCopyChunkBytes = 4u << 20;
inline constexpr size_t kCopyChunkSpans = 512;

// Bytes [offset, offset + length) of one span: a piece of a chunk.
struct CopyPiece {
  const ResolvedOp* span = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
};
// The most pieces one chunk has: kCopyChunkSpans whole spans and a partial one.
inline constexpr size_t kMaxChunkPieces = kCopyChunkSpans + 1;

class ChunkCopier {
 public:
  virtual ~ChunkCopier() = default;
  // Copies every piece of one chunk (called with the batch's CopyGuard held, after its
  // stop_reason() was OK), or says why not. Called concurrently, one chunk per thread.
  virtual Status copy_chunk(std::span<const CopyPiece> pieces) const = 0;
};

// How a part larger than the inline threshold is cut: slices of at least
// kMinCopySliceBytes, at most kCopySlicesPerWorker per worker, at least one.
inline constexpr uint64_t kMinCopySliceBytes = 1u << 20;
inline constexpr uint64_t kCopySlicesPerWorker = 4;
uint64_t copy_slice_count(uint64_t bytes, int workers);

class CopyExecutor {
 public:
  // `copier` null: memmove. `max_copiers`: the most threads copying one part at once.
  CopyExecutor(ThreadPool& pool, uint64_t inline_bytes,
               std::shared_ptr<const ChunkCopier> copier = nullptr,
               int max_copiers = usable_cpu_count())
      : pool_(pool),
        inline_bytes_(inline_bytes),
        copier_(std::move(copier)),
        max_copiers_(max_copiers) {}
  // Takes the part from posted to finished (inline) or hands it to workers.
  void run(const BatchPart& part);

 private:
  ThreadPool& pool_;
  uint64_t inline_bytes_;
  std::shared_ptr<const ChunkCopier> copier_;
  int max_copiers_;
};

class CopyLink final : public TransportLink {
 public:
  explicit CopyLink(std::shared_ptr<CopyExecutor> copier) : copier_(std::move(copier)) {}
  Status post(const BatchPart& part) override {
    copier_->run(part);
    return Status::Ok();
  }

 private:
  std::shared_ptr<CopyExecutor> copier_;
};

// What both memcpy transports share: host pointers on both sides, copies that may run on
// the submitting thread, and a CopyLink per peer over one executor. They differ in reach
// (why_not) and in whether the peer's memory must be mapped here.
class CopyTransport : public Transport {
 public:
  CopyTransport(const TransportEnv& env, bool maps_remote_host_memory)
      : copier_(std::make_shared<CopyExecutor>(*env.workers, env.inline_batch_bytes)),
        maps_remote_host_memory_(maps_remote_host_memory) {}
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kHostPointers;
    caps.maps_remote_host_memory = maps_remote_host_memory_;
    caps.may_copy_in_post = true;
    return caps;
  }
  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo&) override {
    return std::shared_ptr<TransportLink>(std::make_shared<CopyLink>(copier_));
  }

 private:
  std::shared_ptr<CopyExecutor> copier_;
  bool maps_remote_host_memory_;
};

}  // namespace kvferry
