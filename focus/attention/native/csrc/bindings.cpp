// Focus's native kernels as one Python module (focus/attention/native/build.py builds it): the only file that includes
// <torch/python.h> (pybind11 and torch's tensor casters), so the kernels' files compile without it, beside it.

#include <torch/python.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("masked_step", &masked_step);
  m.def("indexer_step", &indexer_step);
  m.def("indexer_thresholds", &indexer_thresholds);
  m.def("route_tokens", &route_tokens);
  m.def("router_panel", &router_panel);
  m.def("rectangles", &rectangles);
  m.def("matrix_units", &focus_native::matrix_units);
  m.def("segment_rows", &segment_rows);
  m.def("merge_parts", &merge_parts);
  m.def("pattern_pairs", &pattern_pairs);
}
