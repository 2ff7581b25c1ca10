// Plans for aux rows and Mamba state slots: one call, one block per buffer.
#include "kvferry/kv/slot_plan.h"

#include <string>

namespace kvferry::kv {
namespace {

Status check_counts(size_t src, size_t dst, std::string_view what) {
  if (src != dst) {
    return InvalidArgument(std::string(what) + " counts differ: source has " + std::to_string(src) +
                           ", destination has " + std::to_string(dst));
  }
  if (src == 0) return InvalidArgument(std::string(what) + " list is empty");
  return Status::Ok();
}

// Address of row `row` of `buffer`, or an error when the row is not inside it.
Result<uint64_t> row_address(const RowBuffer& buffer, uint64_t row, std::string_view where) {
  if (buffer.row_bytes == 0) return InvalidArgument(std::string(where) + "row_bytes 0 must be > 0");
  const uint64_t rows = buffer.bytes / buffer.row_bytes;
  if (row >= rows) {
    return OutOfRange(std::string(where) + "row " + std::to_string(row) + " is beyond the " +
                      std::to_string(rows) + " rows of " + std::to_string(buffer.row_bytes) +
                      " bytes its " + std::to_string(buffer.bytes) + " bytes hold");
  }
  return buffer.base + row * buffer.row_bytes;
}

std::string where(std::string_view side, std::string_view what, size_t index) {
  return std::string(side) + " " + std::string(what) + " " + std::to_string(index) + ": ";
}

}  // namespace

Result<TransferPlan> build_aux_plan(std::span<const RowBuffer> src, std::span<const RowBuffer> dst,
                                    uint64_t src_row, uint64_t dst_row) {
  KVF_RETURN_IF_ERROR(check_counts(src.size(), dst.size(), "aux buffer"));
  TransferPlan plan(SendStrategy::kAllLayers, /*coalesce=*/false);
  plan.reserve(src.size(), 1);
  plan.start_call();
  for (size_t i = 0; i < src.size(); ++i) {
    KVF_ASSIGN_OR_RETURN(uint64_t from,
                         row_address(src[i], src_row, where("source", "aux buffer", i)));
    KVF_ASSIGN_OR_RETURN(uint64_t to,
                         row_address(dst[i], dst_row, where("destination", "aux buffer", i)));
    if (src[i].row_bytes != dst[i].row_bytes) {
      return InvalidArgument("aux buffer " + std::to_string(i) + ": source row_bytes " +
                             std::to_string(src[i].row_bytes) + " differs from destination " +
                             std::to_string(dst[i].row_bytes));
    }
    plan.add_block(from, to, src[i].row_bytes);
  }
  return plan;
}

Result<TransferPlan> build_mamba_state_plan(std::span<const MambaStateTensor> src,
                                            std::span<const MambaStateTensor> dst,
                                            uint64_t src_slot, uint64_t dst_slot,
                                            const TpPair& tp) {
  KVF_RETURN_IF_ERROR(check_counts(src.size(), dst.size(), "state tensor"));
  KVF_RETURN_IF_ERROR(validate_tp_pair(tp));
  const bool same_tp = tp.prefill_tp_size == tp.decode_tp_size;
  TransferPlan plan(SendStrategy::kAllLayers, /*coalesce=*/false);
  plan.reserve(src.size(), 1);
  plan.start_call();
  for (size_t i = 0; i < src.size(); ++i) {
    const MambaStateTensor& s = src[i];
    const MambaStateTensor& d = dst[i];
    KVF_ASSIGN_OR_RETURN(uint64_t from,
                         row_address(s.rows, src_slot, where("source", "state tensor", i)));
    KVF_ASSIGN_OR_RETURN(uint64_t to,
                         row_address(d.rows, dst_slot, where("destination", "state tensor", i)));
    const std::string tensor = "state tensor " + std::to_string(i) + ": ";
    if (same_tp) {
      if (s.rows.row_bytes != d.rows.row_bytes) {
        return InvalidArgument(tensor + "slot sizes differ (source " +
                               std::to_string(s.rows.row_bytes) + ", destination " +
                               std::to_string(d.rows.row_bytes) + ") with equal TP");
      }
      plan.add_block(from, to, s.rows.row_bytes);
      continue;
    }
    KVF_ASSIGN_OR_RETURN(DimSlice slice, compute_state_dim_slice(tp, s.tp_dim, d.tp_dim));
    if (s.rows.row_bytes % s.tp_dim != 0 || d.rows.row_bytes % d.tp_dim != 0) {
      return InvalidArgument(tensor + "slot bytes (source " + std::to_string(s.rows.row_bytes) +
                             ", destination " + std::to_string(d.rows.row_bytes) +
                             ") are not multiples of tp_dim (source " + std::to_string(s.tp_dim) +
                             ", destination " + std::to_string(d.tp_dim) + ")");
    }
    if (slice.src_dim_start + slice.num_dims > s.tp_dim) {
      return OutOfRange(tensor + "dimension slice [" + std::to_string(slice.src_dim_start) + ", +" +
                        std::to_string(slice.num_dims) + ") runs past the source tp_dim " +
                        std::to_string(s.tp_dim));
    }
    const uint64_t src_bytes_per_dim = s.rows.row_bytes / s.tp_dim;
    const uint64_t dst_bytes_per_dim = d.rows.row_bytes / d.tp_dim;
    const uint64_t bytes = slice.num_dims * src_bytes_per_dim;
    const uint64_t dst_offset = slice.dst_dim_start * dst_bytes_per_dim;
    if (src_bytes_per_dim != dst_bytes_per_dim || dst_offset + bytes > d.rows.row_bytes) {
      return InvalidArgument(tensor + "slice of " + std::to_string(bytes) + " bytes at offset " +
                             std::to_string(dst_offset) + " does not fit the destination slot of " +
                             std::to_string(d.rows.row_bytes) + " bytes");
    }
    plan.add_block(from + slice.src_dim_start * src_bytes_per_dim, to + dst_offset, bytes);
  }
  return plan;
}

}  // namespace kvferry::kv
