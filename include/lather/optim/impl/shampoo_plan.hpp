#pragma once
// Host-side plan of a Shampoo state: how each parameter is interpreted, partitioned and mapped to
// statistics of the global stack. Depends on the parameter shapes and options only, so every rank
// derives the same plan without communication.
//
// Statistics are numbered over the GLOBAL model (every block of every global parameter), so that
// a weight-sharded run (tensor parallelism) and an unsharded one number them alike: a rank holding
// a slice of a parameter holds the statistics of the blocks inside its slice, which requires the
// slice boundaries to fall on block boundaries.
//
// Terms (distribution.hpp defines block, part, share and segment):
//  * a *unit* is what one rank updates whole: a block of a preconditioned parameter (with its
//    statistics), or a range of a graft-path tensor (a block in the Distributor's terms);
//  * a *slot* is a matrix's place in a rank's statistics or preconditioner store;
//  * the units of a part lie one after another in its *packed* order (shape groups first), which
//    is also the layout of the part's segment of the exchange.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/optim/distribution.hpp>
#include <lather/optim/optimizer.hpp>
#include <lather/optim/partition.hpp>
#include <lather/optim/shampoo_options.hpp>

#include <functional>
#include <vector>

namespace lather::optim::Impl {

struct ParameterPlan {
  ParameterSpec spec;
  std::int64_t elements = 0;               ///< local elements
  bool preconditioned = false;             ///< false: the graft update is used (skip rules of the reference)
  BlockPartition partition;                ///< of the interpreted GLOBAL shape
  TensorShape local_shape;                 ///< the interpreted shape of the local tensor
  std::vector<Block> local_blocks;         ///< blocks of the local tensor (local offsets, packed order)
  std::vector<int> local_block_statistic;  ///< global id of the first statistic of each local block
  /// The dimensions of its blocks that have a statistic (all of them unless one-sided), in order:
  /// a block's statistics are those of dims[0], dims[1], ...
  std::vector<int> dims;
  int exponent = 0;
  int first_statistic = 0;  ///< global id of this parameter's first statistic
  int statistics = 0;       ///< statistics of the global parameter (blocks * rank)
  bool quantized_momentum = false;
};

struct ShampooPlan {
  std::vector<ParameterPlan> parameters;
  std::vector<int> statistic_size;      ///< per global statistic
  std::vector<int> statistic_exponent;  ///< per global statistic
  std::vector<int> statistic_owner;     ///< parameter index of each global statistic
  std::vector<int> local_statistics;    ///< global ids of the statistics of this rank's blocks, in order
  int max_size = 0;                     ///< the stack's padded matrix size (>= 1)

  int num_statistics() const { return int(statistic_size.size()); }
  bool all_local() const { return int(local_statistics.size()) == num_statistics(); }
};

ShampooPlan make_plan(const std::vector<ParameterSpec>& parameters, const ShampooOptions& options);

/// A piece of a parameter that one rank updates whole: a block of a preconditioned parameter
/// (its statistics go with it), or a range of the flattened tensor of a parameter on the graft
/// path (large ones are cut so that the ranks can share them).
struct WorkUnit {
  int parameter = 0;
  int block = -1;          ///< index into ParameterPlan::local_blocks; -1: a range of the flat tensor
  std::int64_t begin = 0;  ///< graft path: first element of the range
  std::int64_t elements = 0;
  double cost = 0;  ///< relative time of its share of a step, for balancing
};

/// Preconditioned units of one rank with blocks of the same shape: their products go through
/// one batched call per dimension. The statistic of dimension dims[j] of the group's k-th unit
/// sits in slot first_slot + j * units.size() + k.
struct ShapeGroup {
  std::vector<std::int64_t> size;  ///< the blocks' extents
  std::vector<int> dims;           ///< the dimensions with a statistic (one-sided: not all)
  std::vector<int> units;          ///< indices into StepPlan::units
  int first_slot = 0;
};

/// Who updates what in a step, the same on every rank of a data-parallel group. Replicated: one
/// part (every rank updates every unit; the roots are split by root_owner and exchanged).
/// Distributed: the units are split into one part per rank by greedy longest-processing-time on
/// their cost, and each rank computes the roots of its units' statistics.
struct StepPlan {
  bool distributed = false;
  int parts = 1;                            ///< ranks the units are split over (1: replicated)
  int part = 0;                             ///< this rank's part
  std::vector<WorkUnit> units;              ///< every unit of this rank's shard, in parameter order
  std::vector<int> owner;                   ///< per unit: its part
  std::vector<std::vector<int>> order;      ///< per part: its units in packed order (shape groups first)
  std::vector<std::int64_t> packed_offset;  ///< per unit: where it starts in its part's packed buffer
  std::vector<std::int64_t> part_elements;  ///< per part: elements it updates
  std::vector<ShapeGroup> groups;           ///< this rank's preconditioned units by block shape
  std::vector<int> slot;                    ///< per global statistic: slot on this rank, -1 if not here
  std::vector<int> stored;                  ///< statistics stored on this rank, by slot
  std::vector<int> root_owner;              ///< per global statistic: rank computing its root (-1: other shard)

  const std::vector<int>& mine() const { return order[part]; }
  std::int64_t my_elements() const { return part_elements[part]; }
};

/// `ranks`: the data-parallel group (its ranks share the roots of a replicated step); `parts`,
/// `part`, `assign`: how the distribution strategy splits the units.
StepPlan make_step_plan(const ShampooPlan& plan, const ShampooOptions& options, int ranks, int parts, int part,
                        const PartAssignment& assign);
/// The same with a Distributor's parts and assignment.
template <class ExecutionSpace, class Scalar>
StepPlan make_step_plan(const ShampooPlan& plan, const ShampooOptions& options, int ranks,
                        const Distributor<ExecutionSpace, Scalar>& distributor) {
  return make_step_plan(plan, options, ranks, distributor.parts(), distributor.part(),
                        [&](const std::vector<double>& costs) { return distributor.assign(costs); });
}

}  // namespace lather::optim::Impl
