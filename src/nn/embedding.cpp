#include <lather/nn/embedding.hpp>

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

namespace lather::nn {

namespace {
template <class ExecutionSpace>
Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>> elements(const ExecutionSpace& space, std::size_t rows,
                                                                std::size_t columns) {
  return Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {std::int64_t(0), std::int64_t(0)},
                                                                {std::int64_t(rows), std::int64_t(columns)});
}
}  // namespace

template <class ExecutionSpace, class Scalar>
void token_embedding_forward(const ExecutionSpace& space,
                             const Kokkos::View<const std::int32_t*, typename ExecutionSpace::memory_space>& tokens,
                             const Matrix<const Scalar, typename ExecutionSpace::memory_space>& table, int vocab_begin,
                             const Matrix<Scalar, typename ExecutionSpace::memory_space>& out) {
  LATHER_REQUIRE(out.extent(0) == tokens.extent(0) && out.extent(1) == table.extent(1),
                 "token_embedding_forward: ", tokens.extent(0), " tokens of a table with ", table.extent(1),
                 " columns, out is [", out.extent(0), ", ", out.extent(1), "]");
  LATHER_REQUIRE(vocab_begin >= 0, "token_embedding_forward: vocab_begin must be >= 0, got ", vocab_begin);
  if (out.size() == 0) return;
  const std::int64_t vocab_count = std::int64_t(table.extent(0));
  Kokkos::parallel_for(
      "Lather::nn::token_embedding_forward", elements(space, out.extent(0), out.extent(1)),
      KOKKOS_LAMBDA(std::int64_t n, std::int64_t j) {
        const std::int64_t v = std::int64_t(tokens(n)) - vocab_begin;
        out(n, j) = (v >= 0 && v < vocab_count) ? table(v, j) : Scalar(0);
      });
}

template <class ExecutionSpace, class Scalar>
void token_embedding_backward(const ExecutionSpace& space,
                              const Kokkos::View<const std::int32_t*, typename ExecutionSpace::memory_space>& tokens,
                              const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dout, int vocab_begin,
                              const Matrix<Scalar, typename ExecutionSpace::memory_space>& dtable, bool accumulate) {
  LATHER_REQUIRE(dout.extent(0) == tokens.extent(0) && dout.extent(1) == dtable.extent(1),
                 "token_embedding_backward: ", tokens.extent(0), " tokens, dout is [", dout.extent(0), ", ",
                 dout.extent(1), "], dtable has ", dtable.extent(1), " columns");
  LATHER_REQUIRE(vocab_begin >= 0, "token_embedding_backward: vocab_begin must be >= 0, got ", vocab_begin);
  const std::int64_t vocab_count = std::int64_t(dtable.extent(0)), count = std::int64_t(tokens.extent(0));
  // A thread per column walks the tokens in order: several tokens may share a row, and summing
  // them in a fixed order keeps the gradient bit-reproducible.
  Kokkos::parallel_for(
      "Lather::nn::token_embedding_backward", Kokkos::RangePolicy<ExecutionSpace>(space, 0, dtable.extent(1)),
      KOKKOS_LAMBDA(std::size_t j) {
        if (!accumulate)
          for (std::int64_t v = 0; v < vocab_count; ++v) dtable(v, j) = Scalar(0);
        for (std::int64_t n = 0; n < count; ++n) {
          const std::int64_t v = std::int64_t(tokens(n)) - vocab_begin;
          if (v >= 0 && v < vocab_count) dtable(v, j) += dout(n, j);
        }
      });
}

template <class ExecutionSpace, class Scalar>
void position_embedding_forward(const ExecutionSpace& space, int batch, int time,
                                const Matrix<const Scalar, typename ExecutionSpace::memory_space>& table,
                                const Matrix<Scalar, typename ExecutionSpace::memory_space>& out) {
  LATHER_REQUIRE(batch >= 0 && time >= 0 && std::size_t(time) <= table.extent(0), "position_embedding_forward: batch ",
                 batch, " and time ", time, " for a table of ", table.extent(0), " positions");
  LATHER_REQUIRE(out.extent(0) == std::size_t(batch) * std::size_t(time) && out.extent(1) == table.extent(1),
                 "position_embedding_forward: out is [", out.extent(0), ", ", out.extent(1), "], expected [",
                 std::size_t(batch) * std::size_t(time), ", ", table.extent(1), "]");
  if (out.size() == 0) return;
  Kokkos::parallel_for(
      "Lather::nn::position_embedding_forward", elements(space, out.extent(0), out.extent(1)),
      KOKKOS_LAMBDA(std::int64_t row, std::int64_t j) { out(row, j) = table(row % time, j); });
}

template <class ExecutionSpace, class Scalar>
void position_embedding_backward(const ExecutionSpace& space, int batch, int time,
                                 const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dout,
                                 const Matrix<Scalar, typename ExecutionSpace::memory_space>& dtable, bool accumulate) {
  LATHER_REQUIRE(batch >= 0 && time >= 0 && std::size_t(time) <= dtable.extent(0),
                 "position_embedding_backward: batch ", batch, " and time ", time, " for a table of ", dtable.extent(0),
                 " positions");
  LATHER_REQUIRE(dout.extent(0) == std::size_t(batch) * std::size_t(time) && dout.extent(1) == dtable.extent(1),
                 "position_embedding_backward: dout is [", dout.extent(0), ", ", dout.extent(1), "], expected [",
                 std::size_t(batch) * std::size_t(time), ", ", dtable.extent(1), "]");
  if (dtable.size() == 0) return;
  Kokkos::parallel_for(
      "Lather::nn::position_embedding_backward", elements(space, dtable.extent(0), dtable.extent(1)),
      KOKKOS_LAMBDA(std::int64_t t, std::int64_t j) {
        if (t >= time) {
          if (!accumulate) dtable(t, j) = Scalar(0);
          return;
        }
        Scalar sum = accumulate ? dtable(t, j) : Scalar(0);
        for (std::int64_t b = 0; b < batch; ++b) sum += dout(b * time + t, j);
        dtable(t, j) = sum;
      });
}

#define LATHER_NN_EMBEDDING_INSTANTIATE(SPACE, SCALAR)                                                          \
  template void token_embedding_forward<SPACE, SCALAR>(                                                         \
      const SPACE&, const Kokkos::View<const std::int32_t*, SPACE::memory_space>&,                              \
      const Matrix<const SCALAR, SPACE::memory_space>&, int, const Matrix<SCALAR, SPACE::memory_space>&);       \
  template void token_embedding_backward<SPACE, SCALAR>(                                                        \
      const SPACE&, const Kokkos::View<const std::int32_t*, SPACE::memory_space>&,                              \
      const Matrix<const SCALAR, SPACE::memory_space>&, int, const Matrix<SCALAR, SPACE::memory_space>&, bool); \
  template void position_embedding_forward<SPACE, SCALAR>(const SPACE&, int, int,                               \
                                                          const Matrix<const SCALAR, SPACE::memory_space>&,     \
                                                          const Matrix<SCALAR, SPACE::memory_space>&);          \
  template void position_embedding_backward<SPACE, SCALAR>(const SPACE&, int, int,                              \
                                                           const Matrix<const SCALAR, SPACE::memory_space>&,    \
                                                           const Matrix<SCALAR, SPACE::memory_space>&, bool);

LATHER_NN_EMBEDDING_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_NN_EMBEDDING_INSTANTIATE(DefaultExecutionSpace, double)
#if LATHER_HOST_SPACE_DIFFERS
LATHER_NN_EMBEDDING_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_NN_EMBEDDING_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::nn
