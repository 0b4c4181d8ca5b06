#pragma once
// SOAP (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam", arXiv 2409.11321):
// Adam run in the eigenbasis of Shampoo's Kronecker factors. The algorithm is the authors' as
// pytorch-optimizer 4.1.0 ships it (tests/data/soap_reference holds its trajectories); Lather adds
// Shampoo's blocking, so that a large parameter is preconditioned block by block.
//
// Per parameter: the shape is merged (merge_small_dims) and partitioned into blocks of at most
// block_size per dimension; every block is what the reference calls a parameter. For each block
// dimension of size n a factor GG (n x n) is kept unless the merged dimension exceeds
// max_precond_dim or the parameter is rank 1 and precondition_1d is off; a dimension without a
// factor is left in the original basis.
//   step 1:  GG_i = (1 - shampoo_beta) Gram_i(g); Q_i = eigh(GG_i), columns by descending
//            eigenvalue. No parameter update (the reference never projects with the gradient
//            that built the basis).
//   step t+1 (t >= 1), with the bases of the previous step:
//            m = beta1 m + (1 - beta1) g                   (m in the original basis)
//            v = beta2 v + (1 - beta2) (Q^T g)^2           (v in the rotated basis)
//            u = Q [(Q^T m) / (sqrt(v) + epsilon)]         (every factor's mode product)
//            u /= rms(u) + epsilon                          (normalize_grads, per parameter)
//            p -= lr sqrt(1 - beta2^t) / (1 - beta1^t) u    (bias factor only with correct_bias)
//            p *= 1 - lr weight_decay                       (decoupled, after the update)
//            GG_i = shampoo_beta GG_i + (1 - shampoo_beta) Gram_i(g)
//            every precondition_frequency steps (t % frequency == 0): one power iteration with
//            QR from the previous basis: order the columns of Q_i by descending diag(Q^T GG Q),
//            permute v along dimension i the same way, Q_i = qr(GG_i Q_i).Q.
// Keeping m in the original basis (projected afresh with the current bases) makes the update
// independent of the signs of eigenvectors and QR columns. The eigendecompositions and QR
// factorizations run in double on the host (LAPACK dsyevd, dgeqrf + dorgqr) on a mirror of the
// factors; everything else stays in the optimizer's memory space.
//
// Distributed (a group of more than one rank, every rank holding the same reduced gradients):
// every block is a unit of work, assigned to one rank by greedy longest-processing-time on
// block_cost() (ties: the lower block index first, then the lower rank), blocks of parameters
// without factors (the plain Adam path) included. A rank keeps exp_avg, exp_avg_sq, the factors
// and the bases of its own blocks only, updates them and its blocks' parameter values, and one
// all-gather per step brings every rank every other block's new values. The eigh/QR refreshes
// run on the owner only. normalize_grads sums the squares of the update per block; one small
// allreduce of these sums (only with normalize_grads) gives every rank the same per-parameter
// RMS, summed block by block in block order, so the trajectory is the same bits on any number of
// ranks. A failure in a rank's share (a flag with the all-gather, the allreduce, or an agreement
// on the first step) is the same lather::Error on every rank; the parameters are then partly
// updated and must be restored from a checkpoint. A NaN or Inf in any rank's gradient is refused
// before any state moves: every rank scans its whole gradient (its share reads only its own
// blocks) and the ranks agree, one small collective per step, so every rank throws the same
// lather::Error naming the parameter and the optimizer and the parameters are unchanged.
//
// Sharded parameters (comm::ParameterShards::slices(), built with optim::soap_shard_layouts):
// with a group of `shards` of more than one rank, a parameter whose shape is not its global
// shape is this rank's band of rows of the whole tensor (split_axis 0 at the band's first row),
// which holds whole rows of the whole tensor's blocks. The band is read as the whole tensor is
// (merged, then blocked), and this rank keeps the blocks inside it; normalize_grads's RMS of a
// parameter sums every band's block sums over `shards` (one allreduce, which carries the failure
// flag too), block by block in the whole tensor's order, so the trajectory is the same bits as on
// the whole parameters. A band that cuts a block is an error naming the parameter.
//
// Weight shards (tensor parallelism), with `shards` the ranks that hold a tensor's slices: a slice
// along axis 0 is read as rows of the whole tensor, as a band is; a slice along a later axis (and
// a band of rows of one) is read as the whole tensor with its split axis kept apart from the
// dimensions around it (merge_small_dims_around, as Shampoo reads weight shards), and holds the
// blocks inside it. Its update norm sums over the shards as a band's does.
//
// Checkpoints: each state array of a parameter has one row per block of the whole tensor's reading
// (the rows a piece holds listed as StateArray::rows), so the pieces of any layout that reads the
// tensor alike write and read the whole tensor's state; a "blocks" array records the reading, and
// state_restored refuses a checkpoint blocked otherwise (soap_state.hpp).
//
// Locally, a rank's blocks of one shape and factor layout (a "shape class") are consecutive in its
// packed buffers, and their factors and bases of one dimension are consecutive matrices: the
// factor updates and the rotations of a class are one strided-batched GEMM per dimension.
//
// best_effort_memory_usage_reduction (Shampoo's option, the JAX reference's meaning): the
// factors are kept as int16 off-diagonal codes with per-column scales and the diagonal apart in
// float (quantize_symmetric_matrices), the bases as int16 codes with per-column scales (each
// column of an orthogonal matrix has norm 1), exp_avg of blocks of rank > 1 as int8 codes with
// per-column scales (each block viewed as [size[0], elements / size[0]]); exp_avg_sq (a second
// moment) stays in float. A step dequantizes what it reads into workspace, computes as the float
// path does, and quantizes back what it writes (soap_quantized.hpp).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>
#include <lather/core/product_precision.hpp>
#include <lather/optim/distribution.hpp>
#include <lather/optim/optimizer.hpp>
#include <lather/optim/partition.hpp>
#include <lather/optim/schedule.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lather::optim {

struct SoapOptions {
  LearningRateSchedule learning_rate = LearningRateSchedule::constant(3e-3);
  double beta1 = 0.95;
  double beta2 = 0.95;
  double shampoo_beta = -1.0;  ///< decay of the factors; < 0: use beta2 (the reference's None)
  double epsilon = 1e-8;
  double weight_decay = 0.01;        ///< decoupled: p *= 1 - lr weight_decay after the update
  long precondition_frequency = 10;  ///< steps between QR refreshes of the eigenbases
  /// A merged dimension larger than this gets no factor (the reference's max_precondition_dim,
  /// Shampoo's skip_preconditioning_dim_size_gt; checked before blocking).
  long max_precond_dim = 10000;
  /// Lather's: dimensions larger than this are split into blocks (remainder last), each block
  /// preconditioned on its own. <= 0: no blocking (the reference).
  long block_size = 0;
  /// merge_small_dims limit (the reference's merge_dims, which uses max_precond_dim as the limit);
  /// <= 0: the shape is used as it is.
  long merge_small_dims_block_size = 0;
  bool precondition_1d = false;  ///< rank-1 parameters get a factor too
  bool normalize_grads = false;  ///< divide the update by its RMS over the parameter (+ epsilon)
  bool correct_bias = true;
  /// int8 exp_avg (blocks of rank > 1), int16 factors and bases (see above).
  bool best_effort_memory_usage_reduction = false;
  /// Lather's: host threads that share out a refresh's eigendecompositions and QR factorizations
  /// and, on a host backend, the blocks' products (rotations and factor updates), each on one BLAS
  /// thread (the results do not depend on it where the BLAS rounds a product alike on any number
  /// of its threads, as OpenBLAS's GEMM does). 0: the threads of a threaded host backend (OpenMP,
  /// Threads), else the CPUs this rank has to itself on its node, as Shampoo's root_host_threads;
  /// there the products take no more than one thread per 20 MFLOP. 0 to 1024.
  int host_threads = 0;
  /// Lather's: what the inputs of the factor updates (the blocks' Gram matrices) and of the
  /// rotations into and out of the eigenbases are rounded to, the products accumulated in
  /// float32: tf32 or bfloat16 run on tensor cores on CUDA (cuBLAS), elsewhere through rounded
  /// copies (for testing: slower than float32). The eigendecompositions and QR refreshes (double,
  /// host) are not affected. Soap<..., double> takes float32 only.
  ProductPrecision product_precision = ProductPrecision::float32;
  void validate() const;  ///< Throws lather::Error naming the first bad field and its value.
};

/// The work of one block per step, in GEMM flop units: per factor of size n, 8 n elements (two
/// Gram halves, three rotations in, one out, rounded up) + 10 n^3 / precondition_frequency (the
/// amortised QR refresh); plus 10 per element for the element-wise passes.
double soap_block_cost(const std::vector<std::int64_t>& size, const std::vector<bool>& factored,
                       long precondition_frequency);

namespace Impl {
struct SoapStateKind;
/// Per block, what one array of the checkpoint state holds (impl/soap_state.hpp).
enum class SoapStatePiece { avg_codes, avg_floats, avg_scales, packed, matrix, diagonal };
}  // namespace Impl

/// SOAP, its blocks shared by the ranks of a group (see above).
template <class ExecutionSpace, class Scalar>
class Soap final : public Optimizer<ExecutionSpace, Scalar> {
 public:
  using typename Optimizer<ExecutionSpace, Scalar>::Tensors;
  using typename Optimizer<ExecutionSpace, Scalar>::Parameters;
  using typename Optimizer<ExecutionSpace, Scalar>::memory_space;
  using Buffer = Kokkos::View<Scalar*, memory_space>;

  /// The state is allocated (zero) on `space`. The ranks of `group` hold the same parameters and
  /// reduced gradients and share the blocks (collective over `group`: the ranks check that they
  /// agree on the parameters and options).
  /// With `shards` of more than one rank, the parameters are bands of rows (see above; collective
  /// over `shards` too).
  Soap(const ExecutionSpace& space, std::vector<ParameterSpec> parameters, SoapOptions options,
       const comm::Group& group = comm::Group(), const comm::Group& shards = comm::Group());
  Soap(const ExecutionSpace& space, const Parameters& parameters, SoapOptions options,
       const comm::Group& group = comm::Group(), const comm::Group& shards = comm::Group())
      : Soap(space, parameters.specs(), std::move(options), group, shards) {}
  ~Soap() override;
  Soap(const Soap&) = delete;
  Soap& operator=(const Soap&) = delete;

  std::string name() const override { return "soap"; }
  long step_count() const override { return m_step; }
  StateMemoryReport memory_report() const override;
  /// Per parameter, arrays of [blocks, length]: one row per block of the whole tensor's reading
  /// (row-major over the block grid), holding that block's state from the row's start (the rest
  /// zero, `length` the longest block's): exp_avg and exp_avg_sq (row-major over the block), the
  /// factors and bases (n x n row-major, dimension by dimension). Quantized: exp_avg/codes (int8)
  /// + exp_avg/scales (column by column) for parameters of rank > 1 after merging, else exp_avg;
  /// exp_avg_sq; factors/codes (int16, n x n), factors/diagonal and factors/scales (n per
  /// matrix); bases/codes (int16) and bases/scales. Plus "blocks" (int64 [blocks, 2 x rank]: each
  /// block's offset and size in the reading) and the step. The same arrays on any number of ranks:
  /// each rank's share is gathered into full copies of its pieces' rows (distributed: on every
  /// rank, rank 0 the writer; of ranks holding the same piece, the first), a piece listing its
  /// blocks' rows; state_restored() checks the blocks and takes each rank's share back.
  std::vector<StateArray<memory_space>> state_arrays(const ExecutionSpace& space) override;
  void state_restored(const ExecutionSpace& space, long step_count) override;
  void state_released() override;
  std::vector<std::pair<std::string, std::string>> describe() const override;

  /// How parameter p is blocked (its merged shape and blocks), for tests and logs.
  const BlockPartition& partition(std::size_t parameter) const { return m_partitions.at(parameter); }
  /// Sizes of the factors of parameter p, block by block (0: that dimension has none).
  std::vector<std::vector<int>> factor_sizes(std::size_t parameter) const;
  bool distributed() const { return m_distributor->distributed(); }
  bool overlap_exchange(const ExecutionSpace& space, std::vector<std::pair<std::size_t, std::size_t>> layers) override;
  void values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) override;
  using Optimizer<ExecutionSpace, Scalar>::values_needed;
  /// The group rank that owns each block (blocks of all parameters, in order).
  std::vector<int> block_owners() const;
  /// The cost (soap_block_cost) of each block, in the same order.
  std::vector<double> block_costs() const;
  /// GEMM launches of the last step on this rank (batching: one per class and dimension).
  long gemm_launches() const { return m_launches; }

 protected:
  void do_step(const ExecutionSpace& space, const Tensors& values, const Tensors& gradients) override;

 public:  // for the device lambdas (CUDA needs them public); not part of the interface
  /// One block: where it lies in its parameter and in the packed buffers, and its factors.
  struct BlockInfo {
    int parameter = 0;
    std::int64_t global = 0;                 ///< its number among the whole parameters' blocks
    Block block;                             ///< offset and size in the merged shape (of the band)
    std::vector<std::int64_t> factor;        ///< per dimension: 0 where it has a factor, else -1
    int owner = 0;                           ///< the group rank that computes it
    int shape_class = 0;                     ///< index in m_classes
    std::int64_t local = 0;                  ///< start in the owner's packed buffers
    std::int64_t exchange = 0;               ///< start in the owner's exchange segment (block order)
    std::vector<std::int64_t> local_factor;  ///< per dimension: start in the owner's factors, or -1
    double cost = 0;
    // best_effort_memory_usage_reduction: where the block's quantized state lies.
    std::int64_t avg_local = 0;                ///< in the owner's exp_avg codes (rank > 1) or floats
    std::int64_t avg_columns = 0;              ///< scales of exp_avg: columns (0: kept in float)
    std::int64_t local_avg_scales = 0;         ///< start of its scales in the owner's
    std::vector<std::int64_t> local_diagonal;  ///< per dimension: start of its n values, or -1
  };
  /// Blocks of one owner with the same size and factor layout: consecutive in the owner's packed
  /// buffers, their factors of one dimension consecutive n x n matrices.
  struct ShapeClass {
    int owner = 0;
    std::vector<std::int64_t> size;
    std::vector<std::int64_t> factor;      ///< per dimension: start of the class's matrices, or -1
    std::vector<std::size_t> blocks;       ///< in m_blocks, in order
    std::int64_t local = 0, elements = 0;  ///< first element; elements per block
    // best_effort_memory_usage_reduction (own classes): starts in the owner's quantized buffers.
    std::int64_t avg = 0, avg_scales = 0, columns = 0;  ///< columns 0: exp_avg kept in float
    std::vector<std::int64_t> diagonal;                 ///< per dimension: start of the diagonals/scales, or -1
    std::vector<std::int64_t> sizes;                    ///< per dimension: start of `count` copies of n in m_q_index
  };
  void pack_gradient(const ExecutionSpace& space, const BlockInfo& b, const FlatTensor<Scalar, memory_space>& g);
  /// Block k's new values into the parameter (and, distributed, into this rank's gather segment).
  void apply_update(const ExecutionSpace& space, std::size_t k, const FlatTensor<Scalar, memory_space>& x,
                    Scalar step_size, Scalar decay, Scalar denominator);
  /// Y = X x_d Q^T (forward) or X x_d Q (backward) for every factor of every block of the class,
  /// X in `from`, result in `from` too (ping-pong through `scratch`).
  void rotate(const ExecutionSpace& space, const ShapeClass& c, Scalar* from, Scalar* scratch, bool forward);
  void accumulate_factors(const ExecutionSpace& space, const ShapeClass& c, const Scalar* g, Scalar beta);
  void refresh_bases(const ExecutionSpace& space, bool first);
  /// The exchange of every rank's new block values, then the other ranks' blocks into the
  /// parameters (by layers, when values_needed() asks); throws the same lather::Error on every
  /// rank if any rank's `error` is not empty.
  void gather_values(const ExecutionSpace& space, const Tensors& values, const std::string& error,
                     const std::string& context);
  /// The other ranks' blocks of parameters [first, last), from the exchange into `values`.
  void unpack_blocks(const ExecutionSpace& space, const Tensors& values, std::size_t first, std::size_t last);
  // best_effort_memory_usage_reduction (soap_quantized.hpp).
  bool quantized() const { return m_options.best_effort_memory_usage_reduction; }
  /// The layout of the quantized state, after the float layout is planned.
  void plan_quantized(const ExecutionSpace& space);
  /// The factors (bases = false) or bases of this rank, dequantized into m_matrix_work / quantized
  /// from it.
  void load_matrices(const ExecutionSpace& space, bool bases);
  void store_matrices(const ExecutionSpace& space, bool bases);
  /// f(class, blocks in it, dimension, n) for every factored dimension of this rank's classes:
  /// one batch of `blocks` n x n factors (and bases) each.
  template <class F>
  void for_each_own_matrices(F&& f) const;
  /// exp_avg of this rank into m_avg_work / back from it.
  void load_exp_avg(const ExecutionSpace& space);
  void store_exp_avg(const ExecutionSpace& space);
  Scalar* factor_data() { return quantized() ? m_matrix_work.data() : m_factors.data(); }
  const Scalar* basis_data() const { return quantized() ? m_matrix_work.data() : m_bases.data(); }
  StateMemoryReport quantized_memory_report() const;
  // The checkpoint state (soap_state.hpp), float or quantized.
  /// The arrays of the state: name, pieces, dtype, this rank's buffer, every rank's count.
  std::vector<Impl::SoapStateKind> state_kinds();
  /// Where block k's elements of one kind lie, piece after piece: f(owner's local start, count).
  template <class F>
  void for_each_piece(std::size_t k, Impl::SoapStatePiece piece, F&& f) const;
  /// Per parameter, in elements of one kind: where its rows of this rank's blocks start in the
  /// checkpoint layout (one more entry: the kind's total).
  std::vector<std::int64_t> state_row_starts(Impl::SoapStatePiece piece) const;
  /// Parameter p's whole-tensor blocks as its "blocks" array holds them.
  std::vector<std::int64_t> block_table(std::size_t parameter) const;
  /// Between the checkpoint layout (m_state_full) and the local layouts (see state_arrays()).
  void copy_state(const ExecutionSpace& space, bool to_full);

 private:
  SoapOptions m_options;
  std::vector<BlockPartition> m_partitions;                               // per parameter, of the merged shape
  std::vector<TensorShape> m_merged;                                      // per parameter (its band)
  std::vector<std::int64_t> m_parameter_elements;                         // per parameter, whole
  std::vector<std::pair<std::int64_t, std::int64_t>> m_parameter_global;  // per parameter: block numbers
  std::int64_t m_global_blocks = 0;                                       // of the whole parameters
  /// Per parameter: whether this rank's block sums enter the sum over the shards (not for a
  /// parameter every shard holds whole, but on the first).
  std::vector<char> m_sums_counted;
  /// Per parameter: whether this rank holds a piece of it (its state arrays list their rows).
  std::vector<char> m_pieces;
  /// Per parameter and kind of state (Impl::SoapStatePiece): the elements of the checkpoint's rows,
  /// the most any of the whole tensor's blocks holds of that kind.
  std::vector<std::array<std::int64_t, 6>> m_row_lengths;
  std::vector<BlockInfo> m_blocks;                                      // all parameters, in order
  std::vector<std::pair<std::size_t, std::size_t>> m_parameter_blocks;  // [first, end) per parameter
  std::vector<ShapeClass> m_classes;                                    // every rank's, by owner then first block
  std::vector<std::size_t> m_own_classes;                               // this rank's, in local order
  std::vector<std::int64_t> m_local_packed, m_local_factors;            // per rank: sizes of its share
  comm::Group m_group;
  comm::Group m_shards;  ///< the holders of the bands (one rank: the parameters are whole)
  /// Where each block is updated and how the new values reach every rank: its exchange buffer
  /// holds, per rank, the new values of its blocks in block order (so in parameter order).
  std::unique_ptr<Distributor<ExecutionSpace, Scalar>> m_distributor;
  Tensors m_exchanged;     ///< the values of the step whose exchange by layers is pending
  int m_host_threads = 1;  // host threads of the products and refreshes (SoapOptions::host_threads)
  // This rank's share, in its local layout.
  Buffer m_exp_avg, m_exp_avg_sq, m_factors, m_bases;
  Buffer m_gradient, m_update, m_scratch_a;  // workspace
  Buffer m_rounded;  // the products' rounded inputs (SoapOptions::product_precision), where needed
  Kokkos::View<double*, memory_space> m_block_sums;  // normalize_grads: sum of u^2 per block
  // best_effort_memory_usage_reduction: this rank's quantized state (m_exp_avg keeps the float
  // exp_avg of rank-1 blocks only), the workspace it is dequantized into, and index lists.
  Kokkos::View<std::int8_t*, memory_space> m_avg_codes;
  Kokkos::View<std::int16_t*, memory_space> m_factor_codes, m_basis_codes;
  Buffer m_avg_scales, m_factor_diagonal, m_factor_scales, m_basis_scales;
  Buffer m_avg_work, m_matrix_work;
  Kokkos::View<int*, memory_space> m_q_index;  // 0, 1, ..., then per class and dimension count n's
  // Per rank: elements of exp_avg codes, float exp_avg, exp_avg scales, diagonals (= scales).
  std::vector<std::int64_t> m_local_avg_codes, m_local_avg_floats, m_local_avg_scales, m_local_diagonal;
  // state_arrays(), in bytes: the checkpoint layout (state_kinds() of all parameters), and
  // (distributed) the all-gather of every rank's state it is assembled from.
  Kokkos::View<char*, memory_space> m_state_full, m_state_gathered;
  /// Per parameter: its whole tensor's blocks as its "blocks" array holds them (state_arrays()).
  std::vector<std::vector<std::int64_t>> m_block_tables;
  long m_step = 0;
  long m_launches = 0;
  std::int64_t m_step_host = 0;
};

// Compiled into liblather (src/optim/soap.cpp); other spaces: <lather/optim/impl/soap_impl.hpp>.
extern template class Soap<DefaultExecutionSpace, float>;
extern template class Soap<DefaultExecutionSpace, double>;

}  // namespace lather::optim
