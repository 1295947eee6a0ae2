// The declarations Focus's native kernels share (native_step.cpp, native_route.cpp, native_rectangle.cpp,
// native_segments.cpp, native_merge.cpp): the few ATen headers they use, and the functions native_bindings.cpp hands
// to Python.
//
// Only native_bindings.cpp includes <torch/python.h>: the kernels include ATen's tensor and op headers alone, which
// compile in about 8 s each where <torch/extension.h> (the whole C++ frontend and pybind11) took 50 s per file here.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Optional.h>

#include <tuple>

// native_step.cpp: one layer's decoding step.
at::Tensor masked_step(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, at::Tensor key_groups,
                       at::Tensor key_bits, const at::Tensor& positions, const c10::optional<at::Tensor>& inv_freq,
                       const at::Tensor& unit, const at::Tensor& bias, const c10::optional<at::Tensor>& base_mask,
                       const c10::optional<at::Tensor>& dense, double temperature, int64_t top_k, int64_t window,
                       bool route_on_value, int64_t route_queries, c10::optional<double> scaling);

// native_rectangle.cpp: the query-routed prefill's rectangles.
std::tuple<at::Tensor, at::Tensor> rectangles(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                              const at::Tensor& key_first, const at::Tensor& key_count, double scale,
                                              const c10::optional<at::Tensor>& query_rows,
                                              const c10::optional<at::Tensor>& key_rows,
                                              const c10::optional<at::Tensor>& query_skip,
                                              const c10::optional<at::Tensor>& key_bits);

// native_route.cpp: a prompt's routing, every token and head.
at::Tensor route_tokens(const at::Tensor& vectors, const c10::optional<at::Tensor>& cos,
                        const c10::optional<at::Tensor>& sin, const at::Tensor& unit,
                        const c10::optional<at::Tensor>& bias, double temperature, int64_t top_k, int64_t share);

// native_segments.cpp: the query-routed prefill's segments, each kept pair once.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> segment_rows(
    const at::Tensor& groups_q, const at::Tensor& groups_k, const at::Tensor& valid, const at::Tensor& sinks,
    int64_t window);

// native_merge.cpp: the query-routed prefill's merge.
at::Tensor merge_parts(const at::Tensor& local_out, const at::Tensor& local_lse, const at::Tensor& part_out,
                       const at::Tensor& part_lse, const at::Tensor& part_row, const at::Tensor& part_sign,
                       const at::Tensor& valid);
