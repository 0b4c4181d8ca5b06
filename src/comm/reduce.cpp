#include <lather/comm/impl/reduce_impl.hpp>

namespace lather::comm {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::mean:
      return "mean";
    case ReduceOp::weighted_mean:
      return "weighted_mean";
    case ReduceOp::adasum:
      return "adasum";
    case ReduceOp::adasum_approx:
      return "adasum_approx";
  }
  return "unknown";
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (auto op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::weighted_mean, ReduceOp::adasum, ReduceOp::adasum_approx})
    if (name == to_string(op)) return op;
  LATHER_FAIL("unknown reduction '", name, "' (expected sum, mean, weighted_mean, adasum or adasum_approx)");
}

std::string to_string(WirePrecision precision) {
  switch (precision) {
    case WirePrecision::native:
      return "native";
    case WirePrecision::bfloat16:
      return "bfloat16";
    case WirePrecision::float16:
      return "float16";
  }
  return "unknown";
}

WirePrecision parse_wire_precision(const std::string& name) {
  if (name == "native") return WirePrecision::native;
  if (name == "bfloat16" || name == "bf16") return WirePrecision::bfloat16;
  if (name == "float16" || name == "fp16") return WirePrecision::float16;
  LATHER_FAIL("unknown wire precision '", name, "' (expected native, bfloat16 or float16)");
}

void ReduceOptions::validate() const {
  LATHER_REQUIRE(fusion_bytes >= 16, "ReduceOptions::fusion_bytes must be >= 16, got ", fusion_bytes);
  LATHER_REQUIRE(wire_precision == WirePrecision::native || wire_precision == WirePrecision::bfloat16 ||
                     wire_precision == WirePrecision::float16,
                 "ReduceOptions::wire_precision has an unknown value ", int(wire_precision));
}

template class GradientReducer<DefaultExecutionSpace, float>;
template class GradientReducer<DefaultExecutionSpace, double>;
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
template class GradientReducer<DefaultHostExecutionSpace, float>;
template class GradientReducer<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::comm
