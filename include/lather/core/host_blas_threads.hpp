#pragma once
// The threads the host BLAS runs each call on. Lather's host products and LAPACK's eigensolvers
// go through the system BLAS, whose own thread count is its business: OpenBLAS starts as many
// threads as the node has CPUs unless OPENBLAS_NUM_THREADS (or GOTO_NUM_THREADS, OMP_NUM_THREADS)
// says otherwise. Several ranks on one node, each with a full set of BLAS threads, fight over the
// CPUs: Shampoo trains several times slower with OpenBLAS's default than with one BLAS thread per
// rank (docs/reference/benchmarks.md). comm::fit_host_blas_threads (comm/blas_threads.hpp) gives
// each rank its share of the node; the drivers call it.
//
// The count is asked of and set through the BLAS's own calls, found at run time: OpenBLAS
// (openblas_get_num_threads / openblas_set_num_threads), BLIS (bli_thread_get_num_threads /
// bli_thread_set_num_threads) and MKL (MKL_Get_Max_Threads / MKL_Set_Num_Threads). A BLAS without
// them (the reference BLAS, single-threaded) is left alone.

namespace lather {

/// The threads of one host BLAS call, or 0 where the BLAS does not say.
int host_blas_threads() noexcept;

/// Sets the threads of each host BLAS call (for the whole process: the BLAS keeps one count).
/// Returns false, changing nothing, where the BLAS offers no way to set it or `threads` < 1.
bool set_host_blas_threads(int threads) noexcept;

/// Whether the environment fixes the BLAS's threads (OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS,
/// BLIS_NUM_THREADS, MKL_NUM_THREADS or OMP_NUM_THREADS set): the user's choice, which
/// comm::fit_host_blas_threads keeps.
bool host_blas_threads_from_environment() noexcept;

/// Sets the host BLAS to `threads` for this object's lifetime and restores the count it found:
/// for host threads that each call the BLAS at once (Shampoo's eigh roots), where a threaded BLAS
/// under each would start more threads than there are CPUs. Does nothing where the BLAS does not
/// say its count, already runs `threads`, or `threads` < 1.
class ScopedHostBlasThreads {
 public:
  explicit ScopedHostBlasThreads(int threads) noexcept;
  ~ScopedHostBlasThreads();
  ScopedHostBlasThreads(const ScopedHostBlasThreads&) = delete;
  ScopedHostBlasThreads& operator=(const ScopedHostBlasThreads&) = delete;

 private:
  int m_restore = 0;  // the count to set back, 0: nothing was changed
};

}  // namespace lather
