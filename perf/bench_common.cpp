#include "bench_common.hpp"

#include <lather/core/host_blas_kernels.hpp>
#include <lather/core/host_blas_threads.hpp>
#include <lather/core/memory_budget.hpp>
#include <lather/core/gemm.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

namespace lather::bench {

comm::Group world_group() {
#if LATHER_ENABLE_MPI
  return comm::Group(MPI_COMM_WORLD);
#else
  return comm::Group();
#endif
}

void check_memory(std::int64_t bytes, const std::string& what, const std::string& how) {
  const comm::Group world = world_group();
  const std::string beyond = beyond_rank_memory(bytes, world.ranks_on_node());
  world.agree_on_failure("", beyond.empty() ? beyond
                                            : what + " needs an estimated " + format_bytes(bytes) + " (" + how + "), " +
                                                  beyond + "; give smaller sizes");
}

void emit(nlohmann::json record) {
  record["blas_kernels"] = host_blas_kernels();
  record["blas_threads"] = host_blas_threads();  // each rank's, 0: the BLAS does not say
  std::cout << record.dump() << std::endl;
}

namespace {

/// GFLOP/s of `call` (which fences), doing `flops` each time: one untimed call (a warm-up, and
/// cuBLAS's handle), then as many as fit in at least `seconds`.
template <class Call>
double repeated_gflops(const Call& call, double flops, double seconds) {
  call();
  long reps = 0;
  Kokkos::Timer timer;
  do {
    call();
    ++reps;
  } while (timer.seconds() < seconds);
  return flops * double(reps) / timer.seconds() / 1e9;
}

}  // namespace

template <class Scalar>
double gemm_gflops(int n, double seconds) {
  using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space>;
  Matrix a("bench::gemm_a", n, n), b("bench::gemm_b", n, n), c("bench::gemm_c", n, n);
  Kokkos::deep_copy(a, Scalar(1.0 / n));
  Kokkos::deep_copy(b, Scalar(0.5));
  const auto call = [&] {
    KokkosBlas::gemm("N", "N", Scalar(1), a, b, Scalar(0), c);
    Kokkos::fence();
  };
  return repeated_gflops(call, 2.0 * double(n) * n * n, seconds);
}
template double gemm_gflops<float>(int, double);
template double gemm_gflops<double>(int, double);

template <class Scalar>
double batched_gemm_gflops(int n, int batch, int host_threads, double seconds) {
  using Space = Kokkos::DefaultExecutionSpace;
  // A and B are shared by every product (stride 0), each product has its own C: the rate of the
  // batched call itself, without a stack of inputs to stream.
  Kokkos::View<Scalar*, Space::memory_space> a("bench::batched_a", std::size_t(n) * n),
      b("bench::batched_b", std::size_t(n) * n), c("bench::batched_c", std::size_t(n) * n * batch);
  Kokkos::deep_copy(a, Scalar(1.0 / n));
  Kokkos::deep_copy(b, Scalar(0.5));
  const Space space;
  const std::int64_t stride_c = std::int64_t(n) * n;
  const auto call = [&] {
    // On a host backend shared out among host_threads threads as Shampoo's products are, every
    // one of them used (by_work false: the batch is the baseline's, not a step's).
    lather::Impl::gemm_strided_batched(space, 'N', 'N', n, n, n, Scalar(1), a.data(), 0, b.data(), 0, Scalar(0),
                                       c.data(), stride_c, batch, host_threads, false);
    space.fence();
  };
  return repeated_gflops(call, 2.0 * double(n) * n * n * double(batch), seconds);
}
template double batched_gemm_gflops<float>(int, int, int, double);
template double batched_gemm_gflops<double>(int, int, int, double);

}  // namespace lather::bench
