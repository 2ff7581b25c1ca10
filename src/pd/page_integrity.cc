#include "pd/page_integrity.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "core/pattern.h"

namespace kvferry::pd::detail {
namespace {

// A piece of one block that lies inside one page of one entry.
struct Piece {
  PageRange range;
  uint64_t src = 0;
};

struct Location {
  uint32_t entry = 0;
  kv::PageIndex page = 0;
  uint64_t offset = 0;
  uint64_t left_in_page = 0;
};

// The entry page holding address `dst`, or nullopt. Entries are few (layers x roles).
std::optional<Location> locate(const kv::KvLayout& layout, uint64_t dst) {
  const std::span<const kv::KvEntry> entries = layout.entries();
  for (size_t e = 0; e < entries.size(); ++e) {
    const kv::KvEntry& entry = entries[e];
    if (dst < entry.base || entry.page_stride == 0) continue;
    const uint64_t rel = dst - entry.base;
    const uint64_t page = rel / entry.page_stride;
    const uint64_t offset = rel % entry.page_stride;
    if (page >= entry.num_pages() || offset >= entry.item_len) continue;
    return Location{static_cast<uint32_t>(e), static_cast<kv::PageIndex>(page), offset,
                    entry.item_len - offset};
  }
  return std::nullopt;
}

std::string hex(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

Status PageDigester::add_chunk(const kv::TransferPlan& plan, const kv::KvLayout& dst) {
  std::map<kv::PageIndex, std::vector<Piece>> pages;
  for (size_t c = 0; c < plan.num_calls(); ++c) {
    const kv::PlanCall call = plan.call(c);
    for (size_t b = 0; b < call.num_blocks(); ++b) {
      uint64_t at = call.dst[b];
      uint64_t src = call.src[b];
      uint64_t left = call.len[b];
      while (left > 0) {
        std::optional<Location> where = locate(dst, at);
        if (!where) {
          return Internal("integrity: destination address " + hex(at) +
                          " is outside every page of decode's layout");
        }
        const uint64_t n = std::min(left, where->left_in_page);
        pages[where->page].push_back({{where->entry, where->offset, n}, src});
        at += n;
        src += n;
        left -= n;
      }
    }
  }
  for (auto& [page, pieces] : pages) {
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
      return std::tie(a.range.entry, a.range.offset) < std::tie(b.range.entry, b.range.offset);
    });
    std::vector<PageRange> footprint;
    StreamingChecksum sum;
    for (const Piece& piece : pieces) {
      sum.update({reinterpret_cast<const std::byte*>(piece.src), piece.range.bytes});
      PageRange* last = footprint.empty() ? nullptr : &footprint.back();
      if (last != nullptr && last->entry == piece.range.entry &&
          last->offset + last->bytes == piece.range.offset) {
        last->bytes += piece.range.bytes;
      } else {
        footprint.push_back(piece.range);
      }
    }
    if (footprint.size() > kMaxFootprintRanges) {
      return Internal("integrity: page " + std::to_string(page) + " has " +
                      std::to_string(footprint.size()) + " ranges, over the limit of " +
                      std::to_string(kMaxFootprintRanges));
    }
    if (!has_footprint_) {
      footprint_ = std::move(footprint);
      has_footprint_ = true;
    } else if (footprint_ != footprint) {
      return Internal("integrity: page " + std::to_string(page) +
                      " was written with a different footprint than the request's other pages");
    }
    if (!digests_.emplace(page, sum.digest()).second) {
      return Internal("integrity: page " + std::to_string(page) + " written by two chunks");
    }
  }
  return Status::Ok();
}

PageIntegrity PageDigester::result() const {
  PageIntegrity out;
  if (has_footprint_) out.footprint = footprint_;
  out.digests.reserve(digests_.size());
  for (const auto& [page, digest] : digests_) out.digests.push_back({page, digest});
  return out;
}

Status verify_pages(const PageIntegrity& integrity, const kv::KvLayout& layout,
                    std::span<const kv::PageIndex> pages, const std::string& who) {
  const std::span<const kv::KvEntry> entries = layout.entries();
  uint64_t max_pages = ~uint64_t{0};
  for (const PageRange& range : integrity.footprint) {
    if (range.entry >= entries.size()) {
      return ProtocolError(who + ": integrity footprint names entry " +
                           std::to_string(range.entry) + " of " + std::to_string(entries.size()));
    }
    const kv::KvEntry& entry = entries[range.entry];
    if (range.offset > entry.item_len || range.bytes > entry.item_len - range.offset) {
      return ProtocolError(who + ": integrity footprint range [" + std::to_string(range.offset) +
                           ", +" + std::to_string(range.bytes) + ") runs past the " +
                           std::to_string(entry.item_len) + "-byte page of entry " +
                           std::to_string(range.entry));
    }
    max_pages = std::min(max_pages, entry.num_pages());
  }
  std::vector<kv::PageIndex> expected(pages.begin(), pages.end());
  std::sort(expected.begin(), expected.end());
  expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
  if (integrity.digests.size() != expected.size()) {
    return ProtocolError(who + ": " + std::to_string(integrity.digests.size()) +
                         " page digests for a request of " + std::to_string(expected.size()) +
                         " pages");
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const PageDigest& d = integrity.digests[i];
    if (d.page != expected[i] || d.page >= max_pages) {
      return ProtocolError(who + ": digest for page " + std::to_string(d.page) +
                           " where the request's page " + std::to_string(expected[i]) +
                           " was expected");
    }
  }
  for (const PageDigest& d : integrity.digests) {
    StreamingChecksum sum;
    for (const PageRange& range : integrity.footprint) {
      const kv::KvEntry& entry = entries[range.entry];
      const uint64_t addr = entry.base + d.page * entry.page_stride + range.offset;
      sum.update({reinterpret_cast<const std::byte*>(addr), range.bytes});
    }
    const uint64_t got = sum.digest();
    if (got != d.xxh3) {
      return DataCorrupted(who + ": page " + std::to_string(d.page) + " hashes to " + hex(got) +
                           " but the sender's xxh3 is " + hex(d.xxh3));
    }
  }
  return Status::Ok();
}

}  // namespace kvferry::pd::detail
