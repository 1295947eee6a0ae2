// The declarations Focus's native kernels share (step.cpp, indexer_step.cpp, route.cpp, rectangle.cpp, segments.cpp,
// merge.cpp): the few ATen headers they use, and the functions bindings.cpp hands to Python.
//
// Only bindings.cpp includes <torch/python.h>: the kernels include ATen's tensor and op headers alone, which compile
// several times faster than <torch/extension.h> (the whole C++ frontend and pybind11).
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Optional.h>

#include <tuple>

namespace focus_native {

// The values Python shares with this code, defined once there (focus/attention/native/build.py's DEFINES, handed to
// the compiler): group ids below GROUP_BITS are bits of one int64 (focus.attention.pattern.rule); heads of at most
// MAX_DIM dimensions take the prompt kernels; FocusConfig.route_queries as the step's code.
constexpr int64_t GROUP_BITS = FOCUS_GROUP_BITS;
constexpr int64_t MAX_DIM = FOCUS_MAX_DIM;
constexpr int64_t ROUTE_BY_KEY = FOCUS_ROUTE_BY_KEY;
constexpr int64_t ROUTE_BY_QUERY = FOCUS_ROUTE_BY_QUERY;
constexpr int64_t ROUTE_BY_KV_HEAD = FOCUS_ROUTE_BY_KV_HEAD;

// rectangle_amx.cpp: the rectangles in bfloat16 on matrix units (AMX), where the caller asks for them (the plan's
// row, focus.attention.dispatch.kernel_table) and `rectangles_on_matrix_units` says the CPU has them for this query;
// `rectangles` (rectangle.cpp) checks the arguments and sends them there.
bool rectangles_on_matrix_units(const at::Tensor& query, bool asked);
// Whether this CPU has bfloat16 matrix units (AMX) the rectangles can use.
bool matrix_units();
std::tuple<at::Tensor, at::Tensor> rectangles_amx(const at::Tensor& query, const at::Tensor& key,
                                                  const at::Tensor& value, const int64_t* first, const int64_t* count,
                                                  int64_t n, double scale, const int64_t* q_index,
                                                  const int64_t* k_index, int64_t keys, const int64_t* skip,
                                                  const int64_t* bits);

}  // namespace focus_native

// step.cpp: one layer's decoding step.
at::Tensor masked_step(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, at::Tensor key_groups,
                       at::Tensor key_bits, const at::Tensor& positions, const c10::optional<at::Tensor>& inv_freq,
                       const at::Tensor& panel, const at::Tensor& bias, const c10::optional<at::Tensor>& base_mask,
                       const c10::optional<at::Tensor>& dense, double temperature, int64_t top_k, int64_t window,
                       bool route_on_value, int64_t route_queries, c10::optional<double> scaling);

// indexer_step.cpp: one layer's decoding step of the per-key indexer.
at::Tensor indexer_step(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& codes,
                        const at::Tensor& query_weights, const c10::optional<at::Tensor>& base_mask, int64_t window,
                        int64_t sink_tokens, double budget, int64_t budget_keys, bool shared,
                        c10::optional<double> scaling);
// indexer_step.cpp: per row of index scores (N, L), -inf where a key is not a candidate, the `need`-th largest
// candidate's score (+inf where it keeps none): the threshold of the indexer's prompt (indexer_prompt.py).
at::Tensor indexer_thresholds(const at::Tensor& scores, const at::Tensor& need);

// pattern.cpp: the pattern of pattern.h over a grid (tests/test_pattern.py).
at::Tensor pattern_pairs(const at::Tensor& query_groups, const at::Tensor& key_groups, const at::Tensor& sinks,
                         int64_t window, int64_t first_position);

// rectangle.cpp: the query-routed prefill's rectangles.
std::tuple<at::Tensor, at::Tensor> rectangles(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                              const at::Tensor& key_first, const at::Tensor& key_count, double scale,
                                              const c10::optional<at::Tensor>& query_rows,
                                              const c10::optional<at::Tensor>& key_rows,
                                              const c10::optional<at::Tensor>& query_skip,
                                              const c10::optional<at::Tensor>& key_bits, bool matrix_units);

// route.cpp: a prompt's routing, every token and head; and the centroids in the layout the router reads (router.h).
at::Tensor route_tokens(const at::Tensor& vectors, const c10::optional<at::Tensor>& cos,
                        const c10::optional<at::Tensor>& sin, const at::Tensor& unit,
                        const c10::optional<at::Tensor>& bias, double temperature, int64_t top_k, int64_t share);
at::Tensor router_panel(const at::Tensor& unit);

// segments.cpp: the query-routed prefill's segments, each kept pair once.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> segment_rows(
    const at::Tensor& groups_q, const at::Tensor& groups_k, const at::Tensor& valid, const at::Tensor& sinks,
    int64_t window);

// merge.cpp: the query-routed prefill's merge.
at::Tensor merge_parts(const at::Tensor& local_out, const at::Tensor& local_lse, const at::Tensor& part_out,
                       const at::Tensor& part_lse, const at::Tensor& part_row, const at::Tensor& part_sign,
                       const at::Tensor& valid);
