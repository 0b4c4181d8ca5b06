#include <lather/optim/quantization.hpp>

#include <lather/core/kokkos_compat.hpp>

namespace lather::optim {

namespace kmath = ::lather::Impl::kmath;

template <class ExecutionSpace, class Value, class Code>
void quantize_columns(const ExecutionSpace& space,
                      const Kokkos::View<const Value*, typename ExecutionSpace::memory_space>& values,
                      std::int64_t rows, std::int64_t columns,
                      const Kokkos::View<Code*, typename ExecutionSpace::memory_space>& codes,
                      const Kokkos::View<Value*, typename ExecutionSpace::memory_space>& scales) {
  const Value buckets = Value(max_code<Code>());
  Kokkos::parallel_for(
      "Lather::quantize_columns", Kokkos::RangePolicy<ExecutionSpace>(space, 0, columns),
      KOKKOS_LAMBDA(std::int64_t j) {
        Value largest = 0;
        for (std::int64_t i = 0; i < rows; ++i) {
          const Value a = kmath::fabs(values(i * columns + j));
          if (a > largest) largest = a;
        }
        const Value scale = largest / buckets;
        scales(j) = scale;
        const Value divisor = scale > Value(0) ? scale : Value(1);
        for (std::int64_t i = 0; i < rows; ++i)
          codes(i * columns + j) = Code(kmath::nearbyint(values(i * columns + j) / divisor));
      });
}

template <class ExecutionSpace, class Value, class Code>
void dequantize_columns(const ExecutionSpace& space,
                        const Kokkos::View<const Code*, typename ExecutionSpace::memory_space>& codes,
                        const Kokkos::View<const Value*, typename ExecutionSpace::memory_space>& scales,
                        std::int64_t rows, std::int64_t columns,
                        const Kokkos::View<Value*, typename ExecutionSpace::memory_space>& values) {
  Kokkos::parallel_for(
      "Lather::dequantize_columns", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows * columns),
      KOKKOS_LAMBDA(std::int64_t k) { values(k) = Value(codes(k)) * scales(k % columns); });
}

template <class ExecutionSpace, class Value>
void quantize_symmetric(
    const ExecutionSpace& space,
    const Kokkos::View<const Value***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& values,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& index,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& size,
    const Kokkos::View<std::int16_t***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& codes,
    const Kokkos::View<Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& diagonal,
    const Kokkos::View<Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& scales) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  const Value buckets = Value(max_code<std::int16_t>());
  Kokkos::parallel_for(
      "Lather::quantize_symmetric",
      Kokkos::TeamPolicy<ExecutionSpace>(space, int(index.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const int b = index(member.league_rank());
        const int n = size(member.league_rank());
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int j) {
          diagonal(b, j) = values(b, j, j);
          Value largest = 0;
          for (int i = 0; i < n; ++i) {
            const Value a = i == j ? Value(0) : kmath::fabs(values(b, i, j));
            if (a > largest) largest = a;
          }
          const Value scale = largest / buckets;
          scales(b, j) = scale;
          const Value divisor = scale > Value(0) ? scale : Value(1);
          for (int i = 0; i < n; ++i)
            codes(b, i, j) = i == j ? std::int16_t(0)
                                    : std::int16_t(kmath::nearbyint(values(b, i, j) / divisor));
        });
      });
}

template <class ExecutionSpace, class Value>
void dequantize_symmetric(
    const ExecutionSpace& space,
    const Kokkos::View<const std::int16_t***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& codes,
    const Kokkos::View<const Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& diagonal,
    const Kokkos::View<const Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& scales,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& index,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& size,
    const Kokkos::View<Value***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& values) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::dequantize_symmetric",
      Kokkos::TeamPolicy<ExecutionSpace>(space, int(index.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const int b = index(member.league_rank());
        const int n = size(member.league_rank());
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int i) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, n), [&](int j) {
            values(b, i, j) = Value(codes(b, i, j)) * scales(b, j) + (i == j ? diagonal(b, j) : Value(0));
          });
        });
      });
}

#define LATHER_INSTANTIATE_QUANTIZATION(SPACE, VALUE)                                                     \
  template void quantize_columns<SPACE, VALUE, std::int8_t>(                                              \
      const SPACE&, const Kokkos::View<const VALUE*, SPACE::memory_space>&, std::int64_t, std::int64_t,   \
      const Kokkos::View<std::int8_t*, SPACE::memory_space>&, const Kokkos::View<VALUE*, SPACE::memory_space>&); \
  template void quantize_columns<SPACE, VALUE, std::int16_t>(                                             \
      const SPACE&, const Kokkos::View<const VALUE*, SPACE::memory_space>&, std::int64_t, std::int64_t,   \
      const Kokkos::View<std::int16_t*, SPACE::memory_space>&, const Kokkos::View<VALUE*, SPACE::memory_space>&); \
  template void dequantize_columns<SPACE, VALUE, std::int8_t>(                                            \
      const SPACE&, const Kokkos::View<const std::int8_t*, SPACE::memory_space>&,                         \
      const Kokkos::View<const VALUE*, SPACE::memory_space>&, std::int64_t, std::int64_t,                 \
      const Kokkos::View<VALUE*, SPACE::memory_space>&);                                                  \
  template void dequantize_columns<SPACE, VALUE, std::int16_t>(                                           \
      const SPACE&, const Kokkos::View<const std::int16_t*, SPACE::memory_space>&,                        \
      const Kokkos::View<const VALUE*, SPACE::memory_space>&, std::int64_t, std::int64_t,                 \
      const Kokkos::View<VALUE*, SPACE::memory_space>&);                                                  \
  template void quantize_symmetric<SPACE, VALUE>(                                                         \
      const SPACE&, const Kokkos::View<const VALUE***, Kokkos::LayoutRight, SPACE::memory_space>&,        \
      const Kokkos::View<const int*, SPACE::memory_space>&, const Kokkos::View<const int*, SPACE::memory_space>&, \
      const Kokkos::View<std::int16_t***, Kokkos::LayoutRight, SPACE::memory_space>&,                     \
      const Kokkos::View<VALUE**, Kokkos::LayoutRight, SPACE::memory_space>&,                             \
      const Kokkos::View<VALUE**, Kokkos::LayoutRight, SPACE::memory_space>&);                            \
  template void dequantize_symmetric<SPACE, VALUE>(                                                       \
      const SPACE&, const Kokkos::View<const std::int16_t***, Kokkos::LayoutRight, SPACE::memory_space>&, \
      const Kokkos::View<const VALUE**, Kokkos::LayoutRight, SPACE::memory_space>&,                       \
      const Kokkos::View<const VALUE**, Kokkos::LayoutRight, SPACE::memory_space>&,                       \
      const Kokkos::View<const int*, SPACE::memory_space>&, const Kokkos::View<const int*, SPACE::memory_space>&, \
      const Kokkos::View<VALUE***, Kokkos::LayoutRight, SPACE::memory_space>&);

LATHER_INSTANTIATE_QUANTIZATION(DefaultExecutionSpace, float)
LATHER_INSTANTIATE_QUANTIZATION(DefaultExecutionSpace, double)

}  // namespace lather::optim
