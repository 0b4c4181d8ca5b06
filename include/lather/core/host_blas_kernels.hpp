#pragma once
// The kernels the host BLAS runs, and a remedy when they are below what the CPU can run.
//
// OpenBLAS built for many CPUs (DYNAMIC_ARCH, as Debian's is) picks its kernels from the CPUID at
// load time. On a CPU it does not recognise it falls back to its generic x86-64 kernels
// ("Prescott"), and nothing says so: on an AVX-512 Xeon unknown to Debian's OpenBLAS 0.3.21 the
// GEMM of `lather-bench root --n 256` ran at 3.3 GFLOP/s with them against 19 with
// OPENBLAS_CORETYPE=SkylakeX, and the transformer trained 3.9 times slower. OpenBLAS reads
// OPENBLAS_CORETYPE only while it loads, before main(), so the remedy is to start the program
// again with it set: choose_host_blas_kernels() does that, first thing in main(), before MPI or
// Kokkos start (the restarted process keeps its PID, environment and open descriptors, so
// mpiexec, srun and their PMI connections do not notice).
//
// Measured on the machines of docs/reference/benchmarks.md, the kernels for the CPU's widest
// vector instructions are the fastest: SkylakeX where AVX-512 (F, BW, DQ, VL) is present, Zen
// (AMD) or Haswell (Intel) with AVX2 and FMA, Sandybridge with AVX.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_CORE)
#error "lather/core/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <string>

namespace lather {

/// The kernels the host BLAS chose for this CPU: OpenBLAS's core name ("Zen", "Haswell",
/// "SkylakeX", "Prescott", ...), or "unknown" for a BLAS that does not say.
std::string host_blas_kernels();

/// The kernels OpenBLAS has for the widest vector instructions this CPU runs ("SkylakeX", "Zen",
/// "Haswell", "Sandybridge"), or "" where it has nothing better than its generic ones or the CPU
/// is not x86-64.
std::string best_host_blas_kernels();

/// Call first in main(), before MPI, Kokkos or any thread starts, with main's own argv. Where
/// OpenBLAS runs kernels below what the CPU supports and the user did not choose (no
/// OPENBLAS_CORETYPE; LATHER_BLAS_KERNELS=keep turns the remedy off), starts the program again
/// with OPENBLAS_CORETYPE set to best_host_blas_kernels() and does not return; if that cannot
/// be done, returns. Returns the line to show the user (once, e.g. on rank 0's stderr): what was
/// chosen and why, or what is wrong and the remedy; "" when there is nothing to say.
///
/// For tests, LATHER_TEST_BLAS_FALLBACK=<core> makes this function see <core> as OpenBLAS's
/// choice: on a CPU OpenBLAS recognises, the remedy is then exercised as on one it does not.
std::string choose_host_blas_kernels(char** argv);

}  // namespace lather
