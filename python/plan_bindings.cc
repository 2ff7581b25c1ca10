// Bindings of the planner: KvLayout, build_transfer_plan / build_head_sliced_plan over numpy
// page arrays read in place, and Plan, whose calls are numpy views of the C++ plan's own
// arrays (each view's base is the Plan object, so the plan lives while any view does).
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "binding_support.h"
#include "kvferry/kv/kv_layout.h"
#include "kvferry/kv/planner.h"
#include "kvferry/kv/send_strategy.h"
#include "kvferry/kv/transfer_plan.h"

namespace kvferry::python {
namespace {

using kv::KvLayout;
using kv::PageIndex;
using kv::TransferPlan;
using PlanPtr = std::shared_ptr<TransferPlan>;

// The head-slicing request of a plan for prefill TP != decode TP.
struct HeadSliceArgs {
  kv::TpPair tp;
  uint32_t total_kv_heads = 0;
};

struct PlanArgs {
  kv::PlanOptions options;
  std::optional<HeadSliceArgs> head_slice;
};

PlanArgs make_plan_args(const std::string& strategy, uint32_t max_pages_per_call, bool coalesce,
                        const std::optional<py::tuple>& head_slice) {
  PlanArgs args;
  args.options.strategy = value_or_throw(kv::parse_send_strategy(strategy));
  args.options.max_pages_per_call = max_pages_per_call;
  args.options.coalesce = coalesce;
  if (head_slice) {
    if (head_slice->size() != 5) {
      throw StatusError(
          InvalidArgument("head_slice must be (prefill_tp_size, prefill_tp_rank, decode_tp_size, "
                          "decode_tp_rank, total_kv_heads), got " +
                          std::to_string(head_slice->size()) + " values"));
    }
    HeadSliceArgs h;
    h.tp = {(*head_slice)[0].cast<uint32_t>(), (*head_slice)[1].cast<uint32_t>(),
            (*head_slice)[2].cast<uint32_t>(), (*head_slice)[3].cast<uint32_t>()};
    h.total_kv_heads = (*head_slice)[4].cast<uint32_t>();
    args.head_slice = h;
  }
  return args;
}

Result<TransferPlan> build(const KvLayout& src, const KvLayout& dst,
                           std::span<const PageIndex> src_pages,
                           std::span<const PageIndex> dst_pages, const PlanArgs& args) {
  if (args.head_slice) {
    return kv::build_head_sliced_plan(src, dst, src_pages, dst_pages, args.head_slice->tp,
                                      args.head_slice->total_kv_heads, args.options);
  }
  return kv::build_transfer_plan(src, dst, src_pages, dst_pages, args.options);
}

// A 1-D uint64 view of [data, +n) owned by `base` (the Plan object).
py::array_t<uint64_t> view(const uint64_t* data, size_t n, const py::object& base) {
  static const uint64_t kEmpty = 0;
  const auto array = py::array_t<uint64_t>({static_cast<py::ssize_t>(n)}, {sizeof(uint64_t)},
                                           n == 0 ? &kEmpty : data, base);
  // Read-only: a caller must not change a plan's blocks under a running execute().
  py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return array;
}

py::tuple call_views(const py::object& self, size_t i) {
  const TransferPlan& plan = self.cast<const TransferPlan&>();
  if (i >= plan.num_calls()) {
    throw StatusError(OutOfRange("call " + std::to_string(i) + " of a plan with " +
                                 std::to_string(plan.num_calls()) + " calls"));
  }
  const kv::PlanCall call = plan.call(i);
  return py::make_tuple(view(call.src.data(), call.num_blocks(), self),
                        view(call.dst.data(), call.num_blocks(), self),
                        view(call.len.data(), call.num_blocks(), self));
}

KvLayout layout_from_pointers(const U64Array& ptrs, const U64Array& item_lens,
                              const U64Array& bytes, uint32_t page_size_tokens,
                              const std::string& role, uint32_t kv_heads, uint32_t head_dim,
                              uint32_t dtype_bytes) {
  const auto n = static_cast<size_t>(ptrs.size());
  if (static_cast<size_t>(item_lens.size()) != n || static_cast<size_t>(bytes.size()) != n) {
    throw StatusError(
        InvalidArgument("ptrs, item_lens and bytes differ in length: " + std::to_string(n) + ", " +
                        std::to_string(item_lens.size()) + ", " + std::to_string(bytes.size())));
  }
  std::vector<kv::KvEntry> entries(n);
  for (size_t i = 0; i < n; ++i) {
    kv::KvEntry& e = entries[i];
    e.base = ptrs.at(i);
    e.item_len = item_lens.at(i);
    e.page_stride = item_lens.at(i);
    e.bytes = bytes.at(i);
    // sglang's pointer lists: MHA is all K layers then all V layers; MLA one latent per layer.
    if (role == "kv") {
      e.role = i < n / 2 ? kv::KvRole::kKey : kv::KvRole::kValue;
      e.layer_id = static_cast<uint32_t>(i < n / 2 ? i : i - n / 2);
    } else if (role == "latent") {
      e.role = kv::KvRole::kLatent;
      e.layer_id = static_cast<uint32_t>(i);
    } else if (role == "opaque") {
      e.role = kv::KvRole::kOpaque;
      e.layer_id = static_cast<uint32_t>(i);
    } else {
      throw StatusError(InvalidArgument("role '" + role + "' (valid: 'kv', 'latent', 'opaque')"));
    }
  }
  kv::KvLayoutInfo info;
  info.page_size_tokens = page_size_tokens;
  info.kv_heads = kv_heads;
  info.head_dim = head_dim;
  info.dtype_bytes = dtype_bytes;
  return value_or_throw(KvLayout::create(info, std::move(entries)));
}

kv::PageOrder page_order(bool page_major) {
  return page_major ? kv::PageOrder::kPageMajor : kv::PageOrder::kLayerMajor;
}

}  // namespace

void bind_plan(py::module_& m) {
  py::class_<kv::KvEntry>(m, "KvEntry")
      .def_readonly("base", &kv::KvEntry::base)
      .def_readonly("bytes", &kv::KvEntry::bytes)
      .def_readonly("item_len", &kv::KvEntry::item_len)
      .def_readonly("page_stride", &kv::KvEntry::page_stride)
      .def_readonly("layer_id", &kv::KvEntry::layer_id)
      .def_property_readonly("role",
                             [](const kv::KvEntry& e) { return std::string(kv_role_name(e.role)); })
      .def_readonly("draft", &kv::KvEntry::draft);

  py::class_<KvLayout>(m, "KvLayout")
      .def_static(
          "mla",
          [](uint32_t num_layers, uint32_t page_size_tokens, uint32_t bytes_per_token,
             uint64_t num_pages, uint64_t base, bool page_major) {
            kv::MlaShape shape{num_layers, page_size_tokens, bytes_per_token, num_pages};
            return value_or_throw(KvLayout::mla(shape, base, page_order(page_major)));
          },
          py::arg("num_layers"), py::arg("page_size_tokens"), py::arg("bytes_per_token"),
          py::arg("num_pages"), py::arg("base"), py::arg("page_major") = false)
      .def_static(
          "mha",
          [](uint32_t num_layers, uint32_t page_size_tokens, uint32_t kv_heads, uint32_t k_head_dim,
             uint32_t v_head_dim, uint32_t dtype_bytes, uint64_t num_pages, uint64_t base,
             bool page_major) {
            kv::MhaShape shape{num_layers, page_size_tokens, kv_heads, k_head_dim,
                               v_head_dim, dtype_bytes,      num_pages};
            return value_or_throw(KvLayout::mha(shape, base, page_order(page_major)));
          },
          py::arg("num_layers"), py::arg("page_size_tokens"), py::arg("kv_heads"),
          py::arg("k_head_dim"), py::arg("v_head_dim"), py::arg("dtype_bytes"),
          py::arg("num_pages"), py::arg("base"), py::arg("page_major") = false)
      .def_static(
          "mla_region_bytes",
          [](uint32_t num_layers, uint32_t page_size_tokens, uint32_t bytes_per_token,
             uint64_t num_pages) {
            return value_or_throw(KvLayout::region_bytes(
                kv::MlaShape{num_layers, page_size_tokens, bytes_per_token, num_pages}));
          },
          py::arg("num_layers"), py::arg("page_size_tokens"), py::arg("bytes_per_token"),
          py::arg("num_pages"))
      .def_static(
          "mha_region_bytes",
          [](uint32_t num_layers, uint32_t page_size_tokens, uint32_t kv_heads, uint32_t k_head_dim,
             uint32_t v_head_dim, uint32_t dtype_bytes, uint64_t num_pages) {
            return value_or_throw(KvLayout::region_bytes(
                kv::MhaShape{num_layers, page_size_tokens, kv_heads, k_head_dim, v_head_dim,
                             dtype_bytes, num_pages}));
          },
          py::arg("num_layers"), py::arg("page_size_tokens"), py::arg("kv_heads"),
          py::arg("k_head_dim"), py::arg("v_head_dim"), py::arg("dtype_bytes"),
          py::arg("num_pages"))
      .def_static("from_pointers", &layout_from_pointers, py::arg("ptrs"), py::arg("item_lens"),
                  py::arg("bytes"), py::arg("page_size_tokens") = 1, py::arg("role") = "opaque",
                  py::arg("kv_heads") = 0, py::arg("head_dim") = 0, py::arg("dtype_bytes") = 0,
                  "Entry i is (ptrs[i], item_lens[i], bytes[i]), pages back to back. role "
                  "'kv': first half K layers, second half V layers (sglang's order); 'latent': "
                  "one MLA entry per layer; 'opaque': no structure.")
      .def_property_readonly("num_entries", &KvLayout::num_entries)
      .def_property_readonly("num_pages", &KvLayout::num_pages)
      .def_property_readonly("page_size_tokens",
                             [](const KvLayout& l) { return l.info().page_size_tokens; })
      .def_property_readonly("entries", [](const KvLayout& l) {
        return std::vector<kv::KvEntry>(l.entries().begin(), l.entries().end());
      });

  py::class_<TransferPlan, PlanPtr>(m, "Plan")
      .def_property_readonly(
          "strategy",
          [](const TransferPlan& p) { return std::string(kv::send_strategy_name(p.strategy())); })
      .def_property_readonly("coalesce", &TransferPlan::coalesce)
      .def_property_readonly("num_calls", &TransferPlan::num_calls)
      .def_property_readonly("num_blocks", &TransferPlan::num_blocks)
      .def_property_readonly("total_bytes", &TransferPlan::total_bytes)
      .def_property_readonly("memory_bytes", &TransferPlan::memory_bytes)
      .def("call", &call_views, py::arg("i"),
           "(src, dst, len) of call i: read-only uint64 numpy views of the plan's arrays.")
      .def_property_readonly(
          "calls",
          [](const py::object& self) {
            const size_t n = self.cast<const TransferPlan&>().num_calls();
            py::list calls(n);
            for (size_t i = 0; i < n; ++i) calls[i] = call_views(self, i);
            return calls;
          },
          "Every call as (src, dst, len) views, in execution order.")
      .def("__len__", &TransferPlan::num_calls)
      .def_property_readonly(
          "blocks",
          [](const py::object& self) {
            const TransferPlan& plan = self.cast<const TransferPlan&>();
            const size_t n = plan.num_blocks();
            if (n == 0)
              return py::make_tuple(view(nullptr, 0, self), view(nullptr, 0, self),
                                    view(nullptr, 0, self));
            // Calls are stored back to back from block 0, so call 0's spans start the arrays.
            size_t first = 0;
            while (plan.call(first).num_blocks() == 0) ++first;
            const kv::PlanCall c = plan.call(first);
            return py::make_tuple(view(c.src.data(), n, self), view(c.dst.data(), n, self),
                                  view(c.len.data(), n, self));
          },
          "(src, dst, len) of every block of the plan, calls back to back.")
      .def_property_readonly("call_offsets", [](const TransferPlan& plan) {
        py::array_t<uint64_t> offsets(static_cast<py::ssize_t>(plan.num_calls() + 1));
        auto out = offsets.mutable_unchecked<1>();
        uint64_t at = 0;
        for (size_t i = 0; i < plan.num_calls(); ++i) {
          out(static_cast<py::ssize_t>(i)) = at;
          at += plan.call(i).num_blocks();
        }
        out(static_cast<py::ssize_t>(plan.num_calls())) = at;
        return offsets;
      });

  m.def(
      "build_plan",
      [](const KvLayout& src, const KvLayout& dst, const py::array& src_pages,
         const py::array& dst_pages, const std::string& strategy, uint32_t max_pages_per_call,
         bool coalesce, const std::optional<py::tuple>& head_slice) {
        const PlanArgs args = make_plan_args(strategy, max_pages_per_call, coalesce, head_slice);
        const auto src_span = borrow_array<PageIndex>(src_pages, "src_pages");
        const auto dst_span = borrow_array<PageIndex>(dst_pages, "dst_pages");
        py::gil_scoped_release release;
        return std::make_shared<TransferPlan>(
            value_or_throw(build(src, dst, src_span, dst_span, args)));
      },
      py::arg("src"), py::arg("dst"), py::arg("src_pages"), py::arg("dst_pages"),
      py::arg("strategy") = "all_layers", py::arg("max_pages_per_call") = 0,
      py::arg("coalesce") = true, py::arg("head_slice") = py::none(),
      "Builds a plan; page arrays must be 1-D contiguous uint32 (read in place).");

  m.def(
      "time_build_plan_ns",
      [](const KvLayout& src, const KvLayout& dst, const py::array& src_pages,
         const py::array& dst_pages, const std::string& strategy, uint32_t max_pages_per_call,
         bool coalesce, int iterations) {
        const PlanArgs args = make_plan_args(strategy, max_pages_per_call, coalesce, {});
        const auto src_span = borrow_array<PageIndex>(src_pages, "src_pages");
        const auto dst_span = borrow_array<PageIndex>(dst_pages, "dst_pages");
        std::vector<int64_t> times;
        times.reserve(static_cast<size_t>(std::max(iterations, 1)));
        py::gil_scoped_release release;
        for (int i = 0; i < std::max(iterations, 1); ++i) {
          const auto start = std::chrono::steady_clock::now();
          TransferPlan plan = value_or_throw(build(src, dst, src_span, dst_span, args));
          times.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count());
        }
        return times;
      },
      py::arg("src"), py::arg("dst"), py::arg("src_pages"), py::arg("dst_pages"),
      py::arg("strategy") = "all_layers", py::arg("max_pages_per_call") = 0,
      py::arg("coalesce") = true, py::arg("iterations") = 20,
      "Benchmark support: times the pure C++ build (no Python in the loop), one entry per "
      "iteration, in nanoseconds. Freeing each plan is outside the timed region.");
}

}  // namespace kvferry::python
