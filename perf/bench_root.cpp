// lather-bench root: inverse p-th roots per second and GFLOP/s of the Newton iteration, beside the
// GEMM throughput of the same BLAS at the same size, precision and batch measured in the same run.
#include "bench_common.hpp"

#include <lather/core/host_threads.hpp>
#include <lather/linalg/inverse_root.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Random.hpp>

#include <cmath>
#include <numeric>

namespace lather::bench {
namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Stack = Kokkos::View<double***, Kokkos::LayoutRight, Space::memory_space>;
using Matrix = Kokkos::View<double**, Kokkos::LayoutRight, Space::memory_space>;

struct RootBenchOptions {
  std::vector<int> n = {128, 256, 512, 1024};
  std::vector<int> batch = {1, 4, 16, 64};
  std::vector<int> p = {2, 4};
  std::string method = "all";
  std::string precision = "float64";
  double gemm_seconds = 0.3;
  int batched_gemm_max_size = -1;
  int host_threads = 0;  ///< eigh: the threads taking a batch's matrices (0: as Shampoo chooses)
  int batched_eigh_max_size = -1;
};

/// Statistics-like SPD matrices: A = G diag(s) G^T / m with G normal n x 2n and column scales s
/// weighted over three decades, as the Gram matrices of real gradients are.
Stack make_statistics(int batch, int n, unsigned seed) {
  const int m = 2 * n;
  Stack stack("bench::statistics", batch, n, n);
  Matrix g("bench::g", n, m), gs("bench::gs", n, m);
  Kokkos::Random_XorShift64_Pool<Space> pool(seed);
  for (int b = 0; b < batch; ++b) {
    Kokkos::fill_random(g, pool, -1.0, 1.0);
    Kokkos::parallel_for(
        "bench::scale_columns", Kokkos::MDRangePolicy<Space, Kokkos::Rank<2>>({0, 0}, {n, m}),
        KOKKOS_LAMBDA(int i, int j) { gs(i, j) = g(i, j) * std::pow(10.0, -3.0 * j / m) / m; });
    KokkosBlas::gemm("N", "T", 1.0, gs, g, 0.0, Kokkos::subview(stack, b, Kokkos::ALL, Kokkos::ALL));
  }
  return stack;
}

/// Refuses sizes whose stacks cannot fit, before allocating any: per case the statistics and the
/// roots in float64, the iteration's workspace (about eight more matrices per root: Newton's
/// iterates and products, or the eigendecomposition's vectors and LAPACK's work), and the GEMM
/// baseline's three operands.
void check_root_memory(const RootBenchOptions& o) {
  std::int64_t largest = 0;
  for (int n : o.n)
    for (int batch : o.batch)
      if (n >= 1 && batch >= 1) largest = std::max(largest, std::int64_t(13) * batch * n * std::int64_t(n) * 8);
  check_memory(largest, "the largest --n x --batch case", "13 matrices of n x n float64 per root");
}

void run_root(const RootBenchOptions& o) {
  check_root_memory(o);
  std::vector<linalg::RootMethod> methods;
  if (o.method == "all" || o.method == "newton") methods.push_back(linalg::RootMethod::newton);
  if (o.method == "all" || o.method == "eigh") methods.push_back(linalg::RootMethod::eigh);
  // On a host backend eigh is the host path; on a device, "all" times both.
  const bool device = !lather::Impl::host_accessible<Space::memory_space>;
  if ((o.method == "all" && device) || o.method == "eigh_host") methods.push_back(linalg::RootMethod::eigh_host);
  LATHER_REQUIRE(!methods.empty(), "--method must be newton, eigh, eigh_host or all, got '", o.method, "'");
  const auto precision = linalg::parse_precision(o.precision);
  const bool in_float = precision == linalg::Precision::float32;
  // The eigh roots' host threads as Shampoo takes them (optim::Impl::host_threads): asked for, else
  // a threaded host backend's own, else the CPUs this rank has to itself on its node (one thread,
  // a direct call's default, would understate what Shampoo's roots get).
  const int host_threads =
      lather::Impl::host_threads_for(Space(), o.host_threads, world_group().node_occupancy().cpu_share());
  for (int n : o.n) {
    LATHER_REQUIRE(n >= 1, "--n values must be >= 1, got ", n);
    // GEMMs in the iteration's precision (float64 GEMMs would overstate a float32 iteration's
    // ratio by the BLAS's float-to-double rate): one at a time here, and in
    // the loop below the case's batch at once as the iteration issues them (one strided-batched
    // call on a GPU, where one small GEMM at a time measures launches; on a host one BLAS call
    // each, as Newton makes them).
    const double gemm_one = in_float ? gemm_gflops<float>(n, o.gemm_seconds) : gemm_gflops<double>(n, o.gemm_seconds);
    for (int batch : o.batch) {
      LATHER_REQUIRE(batch >= 1, "--batch values must be >= 1, got ", batch);
      const double gemm_batched = batch == 1 ? gemm_one
                                  : in_float ? batched_gemm_gflops<float>(n, batch, 1, o.gemm_seconds)
                                             : batched_gemm_gflops<double>(n, batch, 1, o.gemm_seconds);
      const double baseline = std::max(gemm_one, gemm_batched);
      const Stack statistics = make_statistics(batch, n, 1234u + unsigned(n));
      Stack roots("bench::roots", batch, n, n);
      for (int p : o.p) {
        for (auto method : methods) {
          linalg::InverseRootOptions options;
          options.method = method;
          options.compute_precision = precision;
          options.batched_gemm_max_size = o.batched_gemm_max_size;
          options.batched_eigh_max_size = o.batched_eigh_max_size;
          options.host_threads = host_threads;
          // One untimed call first: a process's first call of a kernel pays one-time costs (on an
          // H200 the first cuBLAS strided-batched call took 80-115 ms, so the first case listed
          // ran at 4% of its rate later in the same run).
          const auto timed = [&](const linalg::InverseRootOptions& with) {
            linalg::inverse_pth_root(Space(), statistics, roots, p, with);
            Kokkos::fence();
            Kokkos::Timer timer;
            auto outcome = linalg::inverse_pth_root(Space(), statistics, roots, p, with);
            return std::make_pair(timer.seconds(), std::move(outcome));
          };
          const auto [seconds, result] = timed(options);
          const double iterations = std::accumulate(result.iterations.begin(), result.iterations.end(), 0.0) / batch;
          const double power_iterations =
              std::accumulate(result.power_iterations.begin(), result.power_iterations.end(), 0.0) / batch;
          const double gflops = result.gemm_flops / seconds / 1e9;
          nlohmann::json line{{"bench", "root"},
                              {"method", linalg::to_string(method)},
                              {"precision", linalg::to_string(precision)},
                              {"n", n},
                              {"batch", batch},
                              {"p", p},
                              {"iterations", iterations},
                              {"power_iterations", power_iterations},
                              {"seconds", seconds},
                              {"roots_per_second", batch / seconds},
                              {"gflops", gflops},
                              {"gemm_gflops", baseline},
                              {"gemm_gflops_one", gemm_one},
                              {"gemm_gflops_batched", gemm_batched},
                              {"ratio", gflops / baseline},
                              {"max_error", *std::max_element(result.error.begin(), result.error.end())}};
          if (method != linalg::RootMethod::newton) line["host_threads"] = host_threads;
          if (method == linalg::RootMethod::eigh && device) {
            // The baseline of the device's eigensolver: the host path (eigh_host) in the same run.
            auto host_path = options;
            host_path.method = linalg::RootMethod::eigh_host;
            const double host_seconds = timed(host_path).first;
            line["host_path_roots_per_second"] = batch / host_seconds;
            line["ratio_to_host_path"] = host_seconds / seconds;
            line["batched_eigh_max_size"] = o.batched_eigh_max_size;
          }
          emit(std::move(line));
        }
      }
    }
  }
}

}  // namespace

void register_root(CLI::App& app) {
  auto options = std::make_shared<RootBenchOptions>();
  auto* sub =
      app.add_subcommand("root",
                         "Batched inverse p-th roots: Newton GFLOP/s (flops of the GEMMs executed) against same-run "
                         "GEMM GFLOP/s at the same n; the eigendecomposition method's time beside it.");
  add_list_option(*sub, "--n", options->n, "Matrix sizes");
  add_list_option(*sub, "--batch", options->batch, "Matrices per batched call");
  add_list_option(*sub, "--p", options->p, "Root exponents p (computes A^(-1/p))");
  sub->add_option("--method", options->method,
                  "newton, eigh (on the execution space; on a device its lines carry the host path's rate), "
                  "eigh_host or all")
      ->check(CLI::IsMember({"newton", "eigh", "eigh_host", "all"}))
      ->capture_default_str();
  sub->add_option("--precision", options->precision, "Compute precision: float32 or float64")
      ->check(CLI::IsMember({"float32", "float64"}))
      ->capture_default_str();
  sub->add_option("--gemm-seconds", options->gemm_seconds, "Time spent measuring the GEMM baseline per size")
      ->capture_default_str();
  sub->add_option("--batched-gemm-max-size", options->batched_gemm_max_size,
                  "Largest n that uses batched small GEMMs instead of one BLAS call per matrix "
                  "(-1: the backend's default)")
      ->capture_default_str();
  sub->add_option("--batched-eigh-max-size", options->batched_eigh_max_size,
                  "eigh on a device: largest n for the batched eigensolver instead of one solver call per "
                  "matrix (-1: the backend's default)")
      ->capture_default_str();
  sub->add_option("--host-threads", options->host_threads,
                  "eigh: host threads taking a batch's matrices (0: as Shampoo takes them: a threaded "
                  "host backend's threads, else the CPUs this rank has to itself on its node)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  sub->callback([options] { run_root(*options); });
}

}  // namespace lather::bench
