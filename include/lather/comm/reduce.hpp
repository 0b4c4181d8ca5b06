#pragma once
// Data-parallel gradient reductions over a group communicator (typically Mesh::data_parallel()):
// sum, mean, token-weighted mean, Adasum (exact, Horovod's vector-halving distance-doubling) and
// approximate Adasum, on lists of Views, fused into few large messages (tensor fusion / DDP
// buckets). Semantics, costs and error rules: docs/reference/collectives.md.
//
// Every call is collective over the group and begins with one small MPI_Allreduce in which the
// ranks agree on what they are about to do (operation, tensor count and sizes, options, argument
// validity); any disagreement throws the same lather::Error on every rank, never a hang.
//
// Failures: everything a rank does before the data moves (the check_finite scan, the fusion and
// Adasum buffers, a caller's own `local_error`) is agreed in that same MPI_Allreduce, so a
// failure on one rank is a lather::Error on every rank, "GradientReducer::<op>: <message> (on
// group rank k of n)", with every tensor untouched and the reducer usable: the next call reduces
// as if the failed one had not been made. The exception is verify_layout = false with an
// unchanged layout and check_finite off, where no agreement is made: a failure there is thrown
// on its rank alone. An MPI error during the data movement itself is thrown where MPI reports it.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/mesh.hpp>
#include <lather/comm/wire_precision.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace lather::comm {

enum class ReduceOp { sum, mean, weighted_mean, adasum, adasum_approx };
std::string to_string(ReduceOp op);
/// "sum", "mean", "weighted_mean", "adasum", "adasum_approx"; throws lather::Error otherwise.
ReduceOp parse_reduce_op(const std::string& name);

struct ReduceOptions {
  /// Size of the fusion buffer: consecutive tensors are packed into buckets of at most this many
  /// bytes and each bucket costs one reduction; a tensor larger than this is its own bucket and is
  /// reduced in place (Horovod's default threshold is 64 MiB, DDP's bucket 25 MiB).
  std::size_t fusion_bytes = std::size_t(64) << 20;
  /// bfloat16/float16: sum, mean, weighted mean and approximate Adasum send 16-bit values and
  /// accumulate in float. Exact Adasum and broadcast always use the native type.
  WirePrecision wire_precision = WirePrecision::native;
  /// Exact Adasum of a bucket whose bytes times the group size are at most this gathers every
  /// rank's bucket (one MPI_Allgatherv) and computes the same pairwise tree on every rank,
  /// instead of the 3 log2(P) messages of the vector-halving scheme; 0 always uses the latter.
  std::size_t adasum_gather_bytes = std::size_t(64) << 10;
  /// Agree on the layout before every call (one small MPI_Allreduce). When false, the agreement
  /// runs only on a reducer's first call and whenever this rank's list changes; every rank must then
  /// guarantee it passes the same layout as the others, or the collectives may hang.
  bool verify_layout = true;
  /// Refuse non-finite gradients: before reducing, every rank scans its tensors (one read of the
  /// gradient bytes) and a NaN or Inf anywhere is a lather::Error on every rank naming the rank
  /// and the tensor, with the tensors untouched. The verdict travels in the layout agreement, or
  /// in one small MPI_Allreduce when verify_layout is off. Off by default, as in PyTorch DDP and
  /// Horovod: then sum and mean carry a NaN or Inf through element by element (the elements it
  /// reaches become NaN or Inf on every rank), and Adasum turns the whole tensor into NaN, because
  /// its dot products do. lather-train turns it on.
  bool check_finite = false;
  /// Sum, mean and weighted mean (native wire precision, host memory) of a group whose ranks all
  /// sit on one node go through a node-shared window (MPI_Win_allocate_shared, one slot per rank,
  /// made at the first such call): each bucket is in its rank's slot (a list placed there by
  /// shared_gradient_storage lies in it; buckets up to 4 MiB are copied in, larger ones go through
  /// MPI), and after a barrier each rank sums its share of the elements over every slot and writes
  /// the result into every slot, one rank per element, so all hold the same bits; after a second
  /// barrier copied buckets are copied back. No message carries tensor data. Figures: see
  /// collectives.md. False: MPI's collectives, as across nodes. Agreed.
  bool shared_memory = true;

  void validate() const;  ///< Throws lather::Error naming the first bad field.
};

/// An integer every rank of the group must pass identically (optionally an exact required value),
/// checked in the same agreement as the layout: used by GradientAccumulator for its micro-batch
/// count.
struct AgreedValue {
  std::string name;
  std::int64_t value = 0;
  bool has_required = false;
  std::int64_t required = 0;
};

/// What a reducer handed to MPI, for tests and benchmarks.
struct ReducerStatistics {
  long calls = 0;               ///< reductions and broadcasts performed
  long agreements = 0;          ///< layout agreements (one small MPI_Allreduce each)
  long data_messages = 0;       ///< MPI calls that carried tensor data
  long scalar_collectives = 0;  ///< small collectives besides the agreement (Adasum dot products)
  double bytes = 0;             ///< tensor bytes this rank sent or contributed
  long shared_memory_sums = 0;  ///< buckets summed through the node-shared window (no message)
};

/// Reduces lists of tensors over one group, reusing its fusion and scratch buffers across calls.
/// Built from a Mesh it reduces over the mesh's data-parallel group; built from an MPI_Comm it
/// works on its own duplicate of it (collective), so its messages never mix with the caller's.
/// Instantiated for lather::DefaultExecutionSpace (and the host space on device builds) with
/// float and double; the implementation (src/comm/reduce.cpp) can be instantiated for others.
template <class ExecutionSpace, class Scalar>
class GradientReducer {
  static_assert(std::is_same<Scalar, float>::value || std::is_same<Scalar, double>::value,
                "GradientReducer reduces float or double tensors");

 public:
  using execution_space = ExecutionSpace;
  using memory_space = typename ExecutionSpace::memory_space;
  using tensor_list = TensorList<Scalar, memory_space>;

  /// Over `mesh.data_parallel()`: the replicas holding this rank's shard.
  explicit GradientReducer(const Mesh& mesh, const ReduceOptions& options = {});
  explicit GradientReducer(const Group& group, const ReduceOptions& options = {});
  ~GradientReducer();
  GradientReducer(GradientReducer&&) noexcept;
  GradientReducer& operator=(GradientReducer&&) noexcept;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// g := sum over the group of g, per element.
  void sum(const ExecutionSpace& space, const tensor_list& gradients);
  /// g := (1/n) sum over the group of g.
  void mean(const ExecutionSpace& space, const tensor_list& gradients);
  /// Token-weighted mean. Each rank's gradients must be SUMS over its tokens (not means) and
  /// `local_weight` its token count (any weight >= 0): g := (sum_r g_r) / (sum_r w_r), equal to the
  /// mean over all tokens of the group. Returns the global weight sum_r w_r. A global weight of
  /// zero, or a negative or non-finite local weight on any rank, is an error on every rank.
  double weighted_mean(const ExecutionSpace& space, const tensor_list& gradients, double local_weight);
  /// Exact Adasum per tensor (Horovod's VHDD), any group size; see collectives.md for the
  /// definition on sizes that are not powers of two.
  void adasum(const ExecutionSpace& space, const tensor_list& gradients);
  /// Approximate Adasum per tensor: g := sum_r g_r (1 - (g_r.s - |g_r|^2) / (n |g_r|^2)), s = sum_r g_r.
  void adasum_approx(const ExecutionSpace& space, const tensor_list& gradients);
  /// t := root's t (parameters, optimizer state); always in the native type.
  void broadcast(const ExecutionSpace& space, const tensor_list& tensors, int root = 0);

  /// The general entry: any ReduceOp; `local_weight` is used by weighted_mean only; `agreed`
  /// values join the layout agreement. Returns the global weight (weighted_mean) or the group size.
  /// `local_error`, when not empty, says that the caller's own work before this call failed on
  /// this rank: it travels in the layout agreement and becomes the error of every rank, so a
  /// caller whose preparation fails on one rank still enters the call on every rank, and no rank
  /// waits for it (GradientAccumulator::reduce does this).
  double reduce(const ExecutionSpace& space, const tensor_list& gradients, ReduceOp op, double local_weight = 1.0,
                const std::vector<AgreedValue>& agreed = {}, const std::string& local_error = std::string());

  // ---- the reduction overlapped with the backward pass ------------------------------------------
  // As PyTorch DDP's autograd hooks: start() before the backward, ready() as each tensor's
  // gradient becomes final (the models report it from their backward, layer by layer, last layer
  // first), progress() between layers, finish() after the backward. A bucket starts as soon as it
  // and every bucket after it in the list are ready (the backward finishes the last tensors
  // first; the order is the same on every rank whatever the order of ready()), as nonblocking
  // transfers that MPI moves whenever this rank calls into it (ready, progress, finish). The
  // buckets, pieces, kernels and order of the sums are reduce()'s: the results are the same bits.
  // Sum, mean and weighted mean, at any wire precision; Adasum's dot products need whole buckets
  // and its partners wait on each other, so its buckets all wait for finish(), which reduces them
  // as reduce() does.
  //
  // Failures: start() makes reduce()'s agreement (the layout, the options, the weight, the
  // caller's `local_error`), so what fails before the backward is an error on every rank, with the
  // tensors untouched. After it, a rank that fails (its backward throws, a bucket's local work
  // fails, check_finite finds a NaN or Inf, a tensor is never reported ready) must still call
  // finish(), with its message: it starts the buckets not yet started, so every transfer of the
  // other ranks is matched, and one small agreement then makes the first failure the same
  // lather::Error on every rank. The tensors are then partly reduced: drop the step (the next
  // backward overwrites them). Adasum's finish() agrees before it reduces, leaving them untouched.

  /// Collective: the agreement of reduce(), then the reduction waits for ready(). One overlapped
  /// reduction at a time; reduce() and broadcast() may not be called until finish().
  void start(const ExecutionSpace& space, const tensor_list& gradients, ReduceOp op, double local_weight = 1.0,
             const std::vector<AgreedValue>& agreed = {}, const std::string& local_error = std::string());
  /// Tensors [first, last) of the list hold their final gradients (written by kernels on `space`).
  /// Starts the buckets that are now ready and lets MPI progress those in flight. Local.
  void ready(const ExecutionSpace& space, std::size_t first, std::size_t last);
  /// Lets MPI progress the buckets in flight without waiting (call between layers). Local.
  void progress(const ExecutionSpace& space);
  /// Collective: starts what is left, waits for every bucket, and agrees on failure (above).
  /// Returns what reduce() returns: the global weight (weighted_mean) or the group size.
  double finish(const ExecutionSpace& space, const std::string& local_error = std::string());
  /// True between start() and finish().
  bool overlapping() const;

  /// Memory for a ParameterList's gradients that the group's ranks on this node share, where sums
  /// go through the node-shared window (ReduceOptions::shared_memory; a group on one node, host
  /// memory, native wire precision): a list placed here (ParameterList::place_gradients, or the
  /// models' place_gradients) is summed where it lies, without the copies into the window and back,
  /// as PyTorch DDP's gradient_as_bucket_view. Elsewhere an empty View: keep the list's own
  /// gradients. Collective; the window is sized to the largest `elements` of the group. The memory
  /// lives as long as the reducer and is never reallocated: asking again for more elements than
  /// the first call gave is an error on every rank, and buckets of other lists that do not fit
  /// go through MPI.
  FlatTensor<Scalar, memory_space> shared_gradient_storage(std::int64_t elements);

  /// Names of the tensors of the lists this reducer is given, in list order, for error messages
  /// (check_finite); without them a tensor is named by its position.
  void set_tensor_names(std::vector<std::string> names);

  /// The group the reducer works over.
  const Group& group() const;
  int group_size() const;
  int group_rank() const;
  const ReduceOptions& options() const;
  ReducerStatistics statistics() const;

 private:
  struct State;
  std::unique_ptr<State> m_state;
};

// ---- one-shot conveniences: each builds a GradientReducer (fresh buffers); hold a
// GradientReducer to reduce repeatedly. They keep MPI's collectives (shared_memory off): setting
// up and freeing a node-shared window costs on the order of a millisecond, more than a one-off
// reduction of a few MB gains.

namespace Impl {
inline ReduceOptions one_shot(ReduceOptions options) {
  options.shared_memory = false;
  return options;
}
}  // namespace Impl

template <class ExecutionSpace, class Scalar>
void allreduce_sum(const ExecutionSpace& space, const Group& group,
                   const TensorList<Scalar, typename ExecutionSpace::memory_space>& gradients,
                   const ReduceOptions& options = {}) {
  GradientReducer<ExecutionSpace, Scalar>(group, Impl::one_shot(options)).sum(space, gradients);
}

template <class ExecutionSpace, class Scalar>
void allreduce_mean(const ExecutionSpace& space, const Group& group,
                    const TensorList<Scalar, typename ExecutionSpace::memory_space>& gradients,
                    const ReduceOptions& options = {}) {
  GradientReducer<ExecutionSpace, Scalar>(group, Impl::one_shot(options)).mean(space, gradients);
}

template <class ExecutionSpace, class Scalar>
double allreduce_weighted_mean(const ExecutionSpace& space, const Group& group,
                               const TensorList<Scalar, typename ExecutionSpace::memory_space>& gradients,
                               double local_weight, const ReduceOptions& options = {}) {
  return GradientReducer<ExecutionSpace, Scalar>(group, Impl::one_shot(options))
      .weighted_mean(space, gradients, local_weight);
}

template <class ExecutionSpace, class Scalar>
void allreduce_adasum(const ExecutionSpace& space, const Group& group,
                      const TensorList<Scalar, typename ExecutionSpace::memory_space>& gradients,
                      const ReduceOptions& options = {}) {
  GradientReducer<ExecutionSpace, Scalar>(group, Impl::one_shot(options)).adasum(space, gradients);
}

template <class ExecutionSpace, class Scalar>
void allreduce_adasum_approx(const ExecutionSpace& space, const Group& group,
                             const TensorList<Scalar, typename ExecutionSpace::memory_space>& gradients,
                             const ReduceOptions& options = {}) {
  GradientReducer<ExecutionSpace, Scalar>(group, Impl::one_shot(options)).adasum_approx(space, gradients);
}

// Compiled into liblather (src/comm/reduce.cpp); other spaces: <lather/comm/impl/reduce_impl.hpp>.
extern template class GradientReducer<DefaultExecutionSpace, float>;
extern template class GradientReducer<DefaultExecutionSpace, double>;

}  // namespace lather::comm
