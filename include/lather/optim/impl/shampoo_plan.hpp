#pragma once
// Host-side plan of a Shampoo state: how each parameter is interpreted, partitioned and mapped to
// statistics of the global stack. Depends on the parameter shapes and options only, so every rank
// derives the same plan without communication.
//
// Statistics are numbered over the GLOBAL model (every block of every global parameter), so that
// a weight-sharded run (tensor parallelism) and an unsharded one number them alike: a rank holding
// a slice of a parameter holds the statistics of the blocks inside its slice, which requires the
// slice boundaries to fall on block boundaries.

#include <lather/optim/optimizer.hpp>
#include <lather/optim/partition.hpp>
#include <lather/optim/shampoo_options.hpp>

#include <vector>

namespace lather::optim::Impl {

struct ParameterPlan {
  ParameterSpec spec;
  std::int64_t elements = 0;    ///< local elements
  bool preconditioned = false;  ///< false: the graft update is used (skip rules of the reference)
  BlockPartition partition;     ///< of the interpreted GLOBAL shape
  TensorShape local_shape;      ///< the interpreted shape of the local tensor
  std::vector<Block> local_blocks;         ///< blocks of the local tensor (local offsets, packed order)
  std::vector<int> local_block_statistic;  ///< global id of the first statistic of each local block
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
  std::int64_t max_elements = 0;        ///< largest local parameter

  int num_statistics() const { return int(statistic_size.size()); }
  bool all_local() const { return int(local_statistics.size()) == num_statistics(); }
};

ShampooPlan make_plan(const std::vector<ParameterSpec>& parameters, const ShampooOptions& options);

}  // namespace lather::optim::Impl
