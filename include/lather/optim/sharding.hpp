#pragma once
// What each optimizer lets fully sharded parameters (comm::ParameterShards) cut: the layout of
// every parameter, so that every rank owns whole units of its optimizer's work and no
// preconditioner is ever split.
//
//  * Shampoo: whole rows of blocks (a band begins and ends on its partition's cuts along the
//    first dimension; for a small tensor read with its rows merged into the next dimension, a
//    [256, 10] kernel read as one vector of 2560, on rows whose elements fill whole blocks),
//    costed by the memory they hold (values, gradients, per-element state, the statistics' padded
//    slots). A tensor whose band is read otherwise than the whole (no band reads like it) is
//    replicated. With weight shards, the layouts cut each shard's slice the same way (a band of a
//    column slice is a piece cut along two axes, ParameterSpec::row_offset). Build the optimizer on
//    ParameterShards::slices() with the sharding group as its weight shards -- with weight shards,
//    the whole mesh (mesh.world()) -- so that its statistics keep the whole model's numbering and
//    a tensor's norms are summed over its pieces, each counted once.
//  * SOAP: whole rows of its blocks, as Shampoo's; build it on ParameterShards::slices() with the
//    sharding group as its shards, which sum a parameter's update norm over the bands.
//  * Muon: any row (the default layout): its state is elementwise, and ShardedMuon, built on
//    ParameterShards::slices() over the sharding group, gathers each matrix's rows to the rank
//    that orthogonalises it.
//  * SGD, Adagrad, Adam, AdamW: any row (the default layout).
//
//   const auto layouts = optim::shampoo_shard_layouts(model.parameter_specs(), options);
//   comm::ParameterShards<Space, float> shards(space, group, model.parameter_specs(), layers, layouts);
//   optim::Shampoo<Space, float> shampoo(space, shards.slices().specs(), options, comm::Group(), group);

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/parameter_shards.hpp>
#include <lather/core/parameters.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/soap.hpp>

#include <vector>

namespace lather::optim {

/// Shampoo's layouts for `parameters` (whole tensors, or a weight shard's slices; a band of rows
/// already is refused with a lather::Error naming the parameter).
std::vector<comm::ShardLayout> shampoo_shard_layouts(const std::vector<ParameterSpec>& parameters,
                                                     const ShampooOptions& options);

/// SOAP's layouts for `parameters` (whole tensors: SOAP takes no weight shards): whole rows of its
/// blocks, read as Soap reads them (merge_small_dims, then block_size), costed by the memory they
/// hold. Build the optimizer on ParameterShards::slices() with the sharding group as its `shards`.
std::vector<comm::ShardLayout> soap_shard_layouts(const std::vector<ParameterSpec>& parameters,
                                                  const SoapOptions& options);

}  // namespace lather::optim
