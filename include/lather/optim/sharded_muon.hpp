#pragma once
// Muon on pieces of its parameters: sharded parameters (comm::ParameterShards), where each rank of
// a group holds a band of rows of every parameter, its gradient, and the state of those rows only
// -- the momentum of a matrix's rows, AdamW's moments of the other parameters' rows -- so that the
// state falls as 1/P like the first-order optimizers'; and weight shards (tensor parallelism),
// whose slices are runs of a matrix's columns (or bands of those). The Newton-Schulz iteration
// needs a matrix whole: each matrix has an owner (greedy longest-processing-time on its cost, as
// the distributed Muon assigns them), to which the ranks send their pieces of the momentum's
// estimate, and from which they receive their pieces of the orthogonalized matrix; the whole
// matrix exists only there, in the iteration's scratch. The numbers are Muon's (muon.hpp) on the
// whole parameters, bit for bit: the momentum and AdamW are elementwise, and the owner
// orthogonalizes exactly the matrix one rank would.
//
//   lather::optim::ShardedMuon<Kokkos::DefaultExecutionSpace, float> muon(space, shards.slices().specs(),
//                                                                       options, shards.group());
//   muon.step(space, shards.slices());   // after ParameterShards::finish_step
//
// Per matrix and step: one exchange of pieces to the owner, one agreement (a failure in the
// owner's iteration is an error on every rank, before any rank's piece changes), one exchange of
// pieces back.
// A NaN or Inf in any rank's gradient piece is refused on every rank before any state moves.
// Checkpoints: state_arrays() gives each parameter's state as this rank's piece of the arrays Muon
// writes (named alike, shaped as the piece), which a checkpoint assembles into Muon's as it
// assembles the parameters.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/optimizer.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lather::optim {

namespace Impl {
template <class ExecutionSpace, class Scalar>
struct ShardedMuonState;
}

template <class ExecutionSpace, class Scalar>
class ShardedMuon final : public Optimizer<ExecutionSpace, Scalar> {
 public:
  using typename Optimizer<ExecutionSpace, Scalar>::Tensors;
  using typename Optimizer<ExecutionSpace, Scalar>::memory_space;

  /// `bands`: this rank's piece of every parameter, in the model's order -- a slice along axis 0
  /// of the whole tensor (split_axis 0, global_shape the whole; possibly without rows), a slice
  /// along axis 1 (a weight shard's columns, possibly a band of its rows: row_offset), or the
  /// whole tensor. Between them the ranks of `group` hold each matrix once (pieces that several
  /// ranks hold alike, such as a weight shard's slice on every replica, count once), or each the
  /// whole of it. Collective over `group`: the ranks agree on the whole parameters, the options
  /// and the pieces (a gap or an overlap is an error on every rank).
  ShardedMuon(const ExecutionSpace& space, std::vector<ParameterSpec> bands, MuonOptions options,
              const comm::Group& group);
  ~ShardedMuon() override;
  ShardedMuon(const ShardedMuon&) = delete;
  ShardedMuon& operator=(const ShardedMuon&) = delete;

  std::string name() const override { return "muon"; }
  long step_count() const override { return m_step; }
  StateMemoryReport memory_report() const override;
  /// This rank's rows of Muon's arrays (the step: rank 0's).
  std::vector<StateArray<memory_space>> state_arrays(const ExecutionSpace& space) override;
  void state_restored(const ExecutionSpace& space, long step_count) override;
  std::vector<std::pair<std::string, std::string>> describe() const override { return describe_muon(m_options); }

  const MuonOptions& options() const { return m_options; }
  /// Per parameter, of the whole tensor: Muon matrix or AdamW, and the rank of the group that
  /// orthogonalizes it.
  const std::vector<MuonParameterPlan>& plan() const { return m_plan; }

  /// Implementation step. Public only because nvcc rejects an extended __host__ __device__ lambda
  /// (KOKKOS_LAMBDA) in a private or protected member function.
  /// Matrix p's update from this rank's piece of its momentum estimate (in the band buffer), which
  /// receives this rank's piece of the orthogonalized matrix.
  void orthogonalize_pieces(const ExecutionSpace& space, std::size_t p, long t);

 protected:
  void do_step(const ExecutionSpace& space, const Tensors& values, const Tensors& gradients) override;

 private:
  MuonOptions m_options;
  comm::Group m_group;
  std::vector<MuonParameterPlan> m_plan;
  std::unique_ptr<Impl::ShardedMuonState<ExecutionSpace, Scalar>> m_state;
  long m_step = 0;
  std::int64_t m_step_host = 0;
};

// Compiled into liblather (src/optim/sharded_muon.cpp); other spaces:
// <lather/optim/impl/sharded_muon_impl.hpp>.
extern template class ShardedMuon<DefaultExecutionSpace, float>;
extern template class ShardedMuon<DefaultExecutionSpace, double>;

}  // namespace lather::optim
