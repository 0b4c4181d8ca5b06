#pragma once
// Every option of the JAX reference `distributed_shampoo`, under the reference's names, plus the
// few Lather adds (marked "beyond the reference"). docs/reference/optimizer.md lists them all.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/product_precision.hpp>
#include <lather/linalg/inverse_root.hpp>
#include <lather/optim/schedule.hpp>

#include <string>
#include <vector>

namespace lather::optim {

/// The first-order method whose per-tensor step size Shampoo's direction is rescaled to; none
/// (beyond the reference, Meta's grafting_config=None) uses the direction as it is, and the plain
/// gradient before start_preconditioning_step.
enum class GraftType { sgd, adagrad, rmsprop, rmsprop_normalized, sqrt_n, adagrad_normalized, none };

/// Which dimensions of a block are preconditioned: the reference's `precondtioner_type`. Blocks
/// of rank <= 1 are always preconditioned along their one dimension.
enum class PreconditionerType {
  all,     ///< every dimension (two-sided Shampoo for matrices)
  input,   ///< every dimension but the last (the reference treats the last as the output)
  output,  ///< the last dimension only (upstream google-research's later OUTPUT)
};
std::string to_string(PreconditionerType type);
/// Accepts the reference's names ("ALL", "INPUT", "OUTPUT") and lower case.
PreconditionerType parse_preconditioner_type(const std::string& name);
/// The dimensions of a block of rank `rank` that get a statistic, in order.
std::vector<int> preconditioned_dimensions(int rank, PreconditionerType type);

/// How the ranks of a data-parallel group share a step (Lather's; the reference replicates it).
enum class StepMode {
  automatic,    ///< distributed when the group has more than one rank
  replicated,   ///< every rank updates every parameter; the inverse roots are split and exchanged
  distributed,  ///< each rank updates its share of the blocks, then one all-gather of parameters
};
std::string to_string(StepMode mode);
/// "auto", "replicated" or "distributed".
StepMode parse_step_mode(const std::string& name);

/// What the graft's norm is taken over: the reference grafts per tensor (the whole parameter's
/// preconditioned direction rescaled to the norm of its graft); Meta's DistributedShampoo per
/// block (each block's direction rescaled to that block's graft norm).
enum class GraftGranularity { tensor, block };
std::string to_string(GraftGranularity granularity);
/// "tensor" or "block".
GraftGranularity parse_graft_granularity(const std::string& name);

std::string to_string(GraftType graft);
/// Accepts the reference's names ("RMSPROP_NORMALIZED") and lower case ("rmsprop_normalized").
GraftType parse_graft_type(const std::string& name);
/// True for the grafts that keep a diagonal second-moment accumulator (AdaGrad and RMSProp).
bool graft_has_diagonal_statistics(GraftType graft);

struct ShampooOptions {
  LearningRateSchedule learning_rate = LearningRateSchedule::constant(1e-3);
  int block_size = 128;
  double beta1 = 0.9;
  double beta2 = 0.999;  ///< 1 means a plain sum of Gram matrices
  double diagonal_epsilon = 1e-10;
  double matrix_epsilon = 1e-6;
  double weight_decay = 0.0;
  long start_preconditioning_step = 5;
  long preconditioning_compute_steps = 1;
  long statistics_compute_steps = 1;
  bool best_effort_shape_interpretation = true;
  GraftType graft_type = GraftType::sgd;
  /// Per tensor (the reference) or per block (Meta's): the norm each preconditioned direction is
  /// rescaled to. The graft's learning-rate and clipping multipliers stay per tensor.
  GraftGranularity graft_granularity = GraftGranularity::tensor;
  bool nesterov = true;
  int exponent_override = 0;  ///< 0: exponent 2 * (preconditioned dimensions of the block)
  /// KL-Shampoo's statistics (Lin et al. 2025, arXiv 2509.03378, in the form of Meta's
  /// DistributedShampoo, without the per-factor eigenvalue correction): the statistic of a
  /// block's dimension k blends the Gram matrix along k of the block contracted along its other
  /// preconditioned dimensions with their current preconditioners, instead of the block's own.
  /// With exponent_override 2 on matrices this is the paper's update (L += G R^-1 G^T, the
  /// direction L^-1/2 G R^-1/2); the paper drops grafting (graft_type none).
  bool kl_shampoo = false;
  /// The reference's `precondtioner_type` (set_option accepts that spelling and
  /// "preconditioner_type"): one-sided Shampoo keeps statistics for one side only.
  PreconditionerType preconditioner_type = PreconditionerType::all;
  /// The reference's state sharding: each rank of the data-parallel group keeps only its share of
  /// the state. In Lather it selects the distributed step (step_mode), which shares the work too.
  bool shard_optimizer_states = false;
  /// int8 momentum (rank > 1 parameters) and int16 statistics/preconditioners with the diagonal
  /// kept apart in float, per-column scales.
  bool best_effort_memory_usage_reduction = false;
  double inverse_failure_threshold = 0.1;
  bool moving_average_for_momentum = false;
  long skip_preconditioning_dim_size_gt = 4096;
  double clip_by_scaled_gradient_norm = 0.0;  ///< 0 disables; only used by RMSProp grafting
  bool relative_matrix_epsilon = true;
  long merge_small_dims_block_size = 4096;
  int skip_preconditioning_rank_lt = 1;
  bool decoupled_learning_rate = true;
  bool decoupled_weight_decay = false;
  bool generate_training_metrics = true;

  // Beyond the reference.
  /// One-sided Shampoo (preconditioner_type INPUT or OUTPUT): the blocks' extent along the
  /// dimensions that have no statistic, where the reference cuts every dimension at block_size.
  /// Each statistic then sums its block-row over that many columns (or the whole dimension), and
  /// a tensor has fewer statistics and roots for the same products. 0: block_size, as the
  /// reference. Along a weight-shard split axis the slices must be multiples of it, as of
  /// block_size.
  long unpreconditioned_block_size = 0;
  /// Inverse-root method and iteration settings (ridge_epsilon and relative_ridge are taken from
  /// matrix_epsilon and relative_matrix_epsilon). Default: Newton in double, as the reference
  /// recommends where double is available.
  linalg::InverseRootOptions root;
  /// Host backends: the threads that share out the blocks' statistics and preconditioning products
  /// (quantized stores: the statistics' only), each block's through the BLAS on one thread (a
  /// threaded BLAS gains less by splitting one small product); on a threaded host backend (OpenMP,
  /// Threads) the backend's own threads run them. 0: as for the roots (the CPUs this rank has to
  /// itself on its node, or the threaded backend's threads), fewer where a step's products are too
  /// small to pay for them (20 MFLOP per thread). The results do not depend on it where the BLAS
  /// rounds a product alike on any number of its threads (OpenBLAS's GEMM and syrk do: tested).
  /// Ignored on device backends, and with async_roots in the background on a host backend (1: the
  /// roots' LAPACK calls, made meanwhile, must find the BLAS's thread count unchanged). On a host
  /// backend the same threads also share out the blocks of the step's element-wise passes (pack,
  /// graft, update, the gathered values' scatter; 0: no more than one per 65,536 values), with
  /// the same results for any count.
  int product_host_threads = 0;
  /// A root computed in float that fails is recomputed once in double before it is rejected.
  bool retry_failed_roots_in_double = true;
  /// After this many consecutive failed root computations of the same statistic, step() throws
  /// naming the parameter (as Meta's num_tolerated_failed_amortized_computations). 0: never.
  int max_consecutive_root_failures = 0;
  /// Precision of the statistics and preconditioner stacks.
  linalg::Precision statistics_precision = linalg::Precision::float32;
  /// What the inputs of the statistics products (the blocks' Gram matrices, KL-Shampoo's
  /// contractions included) and of the preconditioning products (the blocks contracted with their
  /// preconditioners) are rounded to, the products accumulated in float32: tf32 or bfloat16 run
  /// on tensor cores on CUDA (cuBLAS), elsewhere through rounded copies (for testing: slower than
  /// float32). The roots are not affected. Needs statistics_precision float32.
  ProductPrecision product_precision = ProductPrecision::float32;
  /// Replicated step: assign statistics to the ranks of the data-parallel group by greedy
  /// longest-processing-time on their root cost (n^3) instead of the reference's even split by
  /// count. (The distributed step always balances its blocks by their whole cost.)
  bool balance_root_work = true;
  /// Replicated or distributed step; automatic: distributed on groups of more than one rank.
  StepMode step_mode = StepMode::automatic;
  /// Anil et al. 2020, section 5: the roots of the statistics at a preconditioning step are
  /// installed at the next one (one interval of staleness), computed meanwhile on host threads
  /// (root_method eigh, which needs no execution space) while the steps run: root.host_threads
  /// of them, or where that is 0 one on a host backend (the step's kernels need the other cores)
  /// and the rank's CPUs less one on a device backend.
  bool async_roots = false;
  /// With async_roots: false computes the same stale schedule in the foreground at the step the
  /// roots are started (for comparison, and where nothing would overlap).
  bool async_roots_in_background = true;
  /// Distributed step on a group whose ranks share one node (host memory): the new parameter
  /// values are gathered through a node-shared buffer (each rank writes its part, a barrier) instead
  /// of MPI_Allgatherv. False: MPI's all-gather, as across nodes.
  bool shared_memory_gather = true;

  void validate() const;  ///< Throws lather::Error naming the first bad field and its value.
};

/// Sets one option from text, by the reference's name (e.g. "graft_type", "RMSPROP_NORMALIZED";
/// "learning_rate", "0.01"; "nesterov", "true"); Lather's own options are "root_method",
/// "root_compute_precision", "root_max_iterations", "root_tolerance",
/// "retry_failed_roots_in_double", "max_consecutive_root_failures", "statistics_precision",
/// "product_precision", "balance_root_work". Throws lather::Error naming the key and the value it
/// could not use.
void set_option(ShampooOptions& options, const std::string& name, const std::string& value);
/// The names set_option accepts, in documentation order.
const std::vector<std::string>& option_names();
/// One line on what an option means (for --help and the reference documentation).
std::string option_help(const std::string& name);
/// The option's current value in `options` as set_option would accept it.
std::string option_value(const ShampooOptions& options, const std::string& name);

}  // namespace lather::optim
