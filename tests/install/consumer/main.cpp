// Embeds Lather the way a user does: include the umbrella header, run one inverse root.
#include <lather/lather.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  using Space = Kokkos::DefaultExecutionSpace;
  Kokkos::View<double***, Kokkos::LayoutRight, Space::memory_space> stack("stack", 1, 2, 2);
  auto host = Kokkos::create_mirror_view(stack);
  host(0, 0, 0) = 4.0;
  host(0, 1, 1) = 9.0;
  Kokkos::deep_copy(stack, host);
  lather::linalg::InverseRootOptions options;
  options.ridge_epsilon = 0.0;
  options.tolerance = 1e-12;
  const auto result = lather::linalg::inverse_pth_root(Space(), stack, stack, 2, options);
  Kokkos::deep_copy(host, stack);
  const bool ok = std::fabs(host(0, 0, 0) - 0.5) < 1e-9 && std::fabs(host(0, 1, 1) - 1.0 / 3) < 1e-9 &&
                  result.status[0] == lather::linalg::RootStatus::converged;
  std::printf("lather %s consumer: %s\n", LATHER_VERSION_STRING, ok ? "OK" : "WRONG");
  return ok ? 0 : 1;
}
