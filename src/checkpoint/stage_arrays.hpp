#pragma once
// The arrays of all pipeline stages as one list. With pipeline stages, each stage's ranks hold
// only the parameters of their stage and an optimizer over just those, so the stages pass
// different lists of arrays to a save or a load; the file holds one list, the one a single stage
// over the whole parameter list would pass. Each rank's slices are turned into its part of that
// list:
//
//  * an array only some stages hold: the other ranks take part with an empty selection of the
//    same kind (no rows; a block of zero counts; a 0-D array whole, not written, into a scratch
//    value);
//  * a stacked array (ArraySlice::stacked: the optimizer's own numbering, Shampoo's statistics):
//    the stages' leading dimensions one after the other in stage order, each stage's rows shifted
//    by the rows of the stages before it (a whole selection becomes that range of rows);
//  * any other array held by several stages (the step, the RNG words) must have the same type and
//    shape on each: all of them read it, the first stage holding it writes it.
//
// The stages' lists travel once over the pipeline group (every rank of a stage passes the same
// list, checked afterwards over the whole mesh).

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/comm/group.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lather::checkpoint::Impl {

/// What a stage says of one of its arrays.
struct StageArray {
  std::string path;
  DType dtype = DType::float32;
  TensorShape shape;
  bool stacked = false;
  ArraySlice::Selection selection = ArraySlice::Selection::whole;
};

/// Every stage's list of arrays, stage by stage: one exchange over `pipeline` (rank within =
/// stage), collective over it.
std::vector<std::vector<StageArray>> exchange_stage_arrays(const comm::Group& pipeline,
                                                           const std::vector<ArraySlice>& arrays);

/// This rank's part of the stages' common list.
class StageArrays {
 public:
  /// `arrays` are this rank's, of stage `stage`; `stages` every stage's list
  /// (exchange_stage_arrays). `saving`: later stages holding an array that is not stacked do not
  /// write it. Throws lather::Error naming the array and the stages when the stages' arrays do not
  /// combine (types, shapes or stacking differ).
  StageArrays(const std::vector<std::vector<StageArray>>& stages, int stage, const std::vector<ArraySlice>& arrays,
              bool saving);
  StageArrays(const StageArrays&) = delete;
  StageArrays& operator=(const StageArrays&) = delete;

  /// The common list, in the order a single stage would list it (parameters first, in stage
  /// order, where each stage lists them first); the slices point into the caller's buffers, or
  /// into this object's scratch values.
  const std::vector<ArraySlice>& arrays() const { return m_arrays; }

 private:
  std::vector<ArraySlice> m_arrays;
  std::vector<std::uint64_t> m_scratch;  ///< 0-D arrays this rank's stage does not hold
};

}  // namespace lather::checkpoint::Impl
