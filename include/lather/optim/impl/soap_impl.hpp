#pragma once
// The implementation of Soap, for explicit instantiation: src/optim/soap.cpp instantiates it for
// lather::DefaultExecutionSpace (and the host space on device builds); a program that needs
// another execution space includes this header and uses the class as usual.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/host_blas_threads.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/gemm.hpp>
#include <lather/core/host_threads.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/impl/finite_gradients.hpp>
#include <lather/optim/impl/group_agreement.hpp>
#include <lather/optim/impl/soap_reading.hpp>
#include <lather/optim/soap.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace lather::optim {

namespace Impl {

/// basis (n x n, row-major) = the eigenvectors of the symmetric `factor` as columns, by
/// descending eigenvalue (LAPACK dsyevd). Throws lather::Error when LAPACK fails.
void soap_eigenbasis(int n, const double* factor, double* basis);
/// One step of power iteration warm-started from `basis`: order = the columns by descending
/// diag(Q^T F Q) (ties by index), basis = Q of the QR factorization of F Q[:, order] (dgeqrf +
/// dorgqr).
void soap_power_qr(int n, const double* factor, double* basis, std::vector<int>& order);

constexpr int soap_max_rank = 8;

/// Where the elements of one block lie in its parameter (row-major over the merged shape).
struct SoapBlockMap {
  int rank = 0;
  std::int64_t size[soap_max_rank] = {}, offset[soap_max_rank] = {}, stride[soap_max_rank] = {};
  /// Flat index in the parameter of element e of the block (row-major over the block).
  KOKKOS_INLINE_FUNCTION std::int64_t flat(std::int64_t e) const {
    std::int64_t index = 0;
    for (int d = rank - 1; d >= 0; --d) {
      index += (offset[d] + e % size[d]) * stride[d];
      e /= size[d];
    }
    return index;
  }
};

template <class BlockInfo>
SoapBlockMap soap_block_map(const BlockInfo& b, const TensorShape& merged) {
  SoapBlockMap map;
  map.rank = int(merged.size());
  std::int64_t stride = 1;
  for (int d = map.rank - 1; d >= 0; --d) {
    map.size[d] = b.block.size[d];
    map.offset[d] = b.block.offset[d];
    map.stride[d] = stride;
    stride *= merged[d];
  }
  return map;
}

inline std::int64_t soap_product(const std::vector<std::int64_t>& size, std::size_t begin, std::size_t end) {
  std::int64_t n = 1;
  for (std::size_t e = begin; e < end; ++e) n *= size[e];
  return n;
}

/// The elements one block of `size` (its dimensions `factored` or not) holds of one kind of state
/// (Soap::for_each_piece): quantized, exp_avg is int8 codes with a scale per column of the block
/// viewed as [size[0], elements / size[0]] where it has two or more dimensions, else float.
inline std::int64_t soap_piece_elements(SoapStatePiece piece, const std::vector<std::int64_t>& size,
                                        const std::vector<bool>& factored) {
  const std::int64_t elements = soap_product(size, 0, size.size());
  const bool codes = size.size() >= 2;
  std::int64_t matrices = 0, diagonals = 0;
  for (std::size_t d = 0; d < size.size(); ++d)
    if (factored[d]) matrices += size[d] * size[d], diagonals += size[d];
  switch (piece) {
    case SoapStatePiece::avg_codes:
      return codes ? elements : 0;
    case SoapStatePiece::avg_floats:
      return codes ? 0 : elements;
    case SoapStatePiece::avg_scales:
      return codes ? elements / size[0] : 0;
    case SoapStatePiece::packed:
      return elements;
    case SoapStatePiece::matrix:
      return matrices;
    case SoapStatePiece::diagonal:
      return diagonals;
  }
  return 0;
}

}  // namespace Impl

template <class ExecutionSpace, class Scalar>
Soap<ExecutionSpace, Scalar>::Soap(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                   SoapOptions options, const comm::Group& group, const comm::Group& shards)
    : Optimizer<ExecutionSpace, Scalar>(std::move(parameters),
                                        typename Optimizer<ExecutionSpace, Scalar>::ValidateLater()),
      m_options(std::move(options)),
      m_group(group),
      m_shards(shards),
      m_distributor(make_distributor<ExecutionSpace, Scalar>(Placement::distributed, group)) {
  const int ranks = m_distributor->parts(), rank = m_distributor->part();
  // The one collective that does not wait for the agreement below (every rank reaches it before
  // anything that may throw on one rank only): the refresh's host threads.
  m_host_threads = ::lather::Impl::host_threads_for(
      space, m_options.host_threads, (m_shards.size() > 1 ? m_shards : m_group).node_occupancy().cpu_share());
  const auto setup = [&] {
    this->validate_parameters();
    m_options.validate();
    const auto& o = m_options;
    LATHER_REQUIRE((std::is_same<Scalar, float>::value || o.product_precision == ProductPrecision::float32),
                   "SoapOptions::product_precision ", to_string(o.product_precision),
                   " rounds float products; this Soap computes in double (use float32)");
    for (std::size_t p = 0; p < this->m_parameters.size(); ++p) {
      const auto& spec = this->m_parameters[p];
      // A piece (a band of rows, a weight shard's slice) is read as the whole tensor: its reading,
      // its blocks, of which it keeps those inside it (soap_reading.hpp).
      const Impl::SoapReading reading = Impl::soap_reading(spec, o.merge_small_dims_block_size, m_shards.size() > 1);
      const bool band = reading.piece;
      m_pieces.push_back(band ? 1 : 0);
      const auto& shape = band ? spec.global() : spec.shape;
      const TensorShape& merged = reading.shape;
      LATHER_REQUIRE(merged.size() <= std::size_t(Impl::soap_max_rank), "Soap: parameter '", spec.name, "' has ",
                     merged.size(), " dimensions after merging; at most ", Impl::soap_max_rank, " are supported");
      m_partitions.emplace_back(merged, o.block_size);
      m_parameter_elements.push_back(element_count(shape));
      m_merged.push_back(reading.local());
      // The reference's rule: rank-1 parameters only with precondition_1d; a dimension above
      // max_precond_dim never (checked on the merged shape, before blocking, as Shampoo does).
      const bool rank_ok = shape.size() >= 2 || (shape.size() == 1 && o.precondition_1d);
      std::vector<bool> factored;
      for (auto extent : merged) factored.push_back(rank_ok && extent <= o.max_precond_dim);
      const std::size_t first = m_blocks.size();
      const std::int64_t global_begin = m_global_blocks;
      auto& row_lengths = m_row_lengths.emplace_back();
      for (const auto& whole_block : m_partitions.back().blocks()) {
        if (whole_block.elements() == 0) continue;
        const std::int64_t number = m_global_blocks++;
        // The checkpoint's rows are the whole tensor's blocks, each as long as the longest.
        for (std::size_t i = 0; i < row_lengths.size(); ++i)
          row_lengths[i] =
              std::max(row_lengths[i], Impl::soap_piece_elements(Impl::SoapStatePiece(i), whole_block.size, factored));
        Block block = whole_block;
        if (band && !reading.place(block, spec.name)) continue;  // another piece's block
        BlockInfo info;
        info.parameter = int(p);
        info.global = number;
        info.block = block;
        for (std::size_t d = 0; d < block.size.size(); ++d) info.factor.push_back(factored[d] ? 0 : -1);
        info.cost = soap_block_cost(block.size, factored, o.precondition_frequency);
        m_blocks.push_back(std::move(info));
      }
      m_parameter_blocks.emplace_back(first, m_blocks.size());
      m_parameter_global.emplace_back(global_begin, m_global_blocks);
    }
    // Owners: the distributor's assignment by cost (the same on every rank).
    std::vector<double> costs;
    for (const auto& b : m_blocks) costs.push_back(b.cost);
    const std::vector<int> owners = m_distributor->assign(costs);
    for (std::size_t k = 0; k < m_blocks.size(); ++k) m_blocks[k].owner = owners[k];
    // Shape classes per owner (in block order), then each owner's local layout class by class.
    for (int r = 0; r < ranks; ++r) {
      const std::size_t first_class = m_classes.size();
      for (std::size_t k = 0; k < m_blocks.size(); ++k) {
        auto& b = m_blocks[k];
        if (b.owner != r) continue;
        std::size_t c = first_class;
        for (; c < m_classes.size(); ++c)
          if (m_classes[c].size == b.block.size &&
              std::equal(b.factor.begin(), b.factor.end(), m_classes[c].factor.begin(),
                         [](std::int64_t x, std::int64_t y) { return (x >= 0) == (y >= 0); }))
            break;
        if (c == m_classes.size()) {
          ShapeClass added;
          added.owner = r;
          added.size = b.block.size;
          added.factor = b.factor;  // the layout only; the starts are set below
          added.elements = b.block.elements();
          m_classes.push_back(std::move(added));
        }
        m_classes[c].blocks.push_back(k);
        b.shape_class = int(c);
      }
      std::int64_t cursor = 0, factor_cursor = 0;
      for (std::size_t c = first_class; c < m_classes.size(); ++c) {
        auto& cls = m_classes[c];
        const auto count = std::int64_t(cls.blocks.size());
        cls.local = cursor;
        cursor += count * cls.elements;
        for (std::size_t d = 0; d < cls.size.size(); ++d) {
          if (cls.factor[d] < 0) continue;
          cls.factor[d] = factor_cursor;
          factor_cursor += count * cls.size[d] * cls.size[d];
        }
        for (std::size_t i = 0; i < cls.blocks.size(); ++i) {
          auto& b = m_blocks[cls.blocks[i]];
          b.local = cls.local + std::int64_t(i) * cls.elements;
          b.local_factor.assign(cls.size.size(), -1);
          for (std::size_t d = 0; d < cls.size.size(); ++d)
            if (cls.factor[d] >= 0) b.local_factor[d] = cls.factor[d] + std::int64_t(i) * cls.size[d] * cls.size[d];
        }
        if (r == rank) m_own_classes.push_back(c);
      }
      m_local_packed.push_back(cursor);
      m_local_factors.push_back(factor_cursor);
    }
    const auto alloc = [&](const char* what, std::int64_t n) {
      return Buffer(Kokkos::view_alloc(space, std::string("Lather::soap::") + what), std::size_t(n));
    };
    // view_alloc without WithoutInitializing zero-fills: moments and factors start at zero.
    const std::int64_t mine = m_local_packed[std::size_t(rank)], my_factors = m_local_factors[std::size_t(rank)];
    m_exp_avg_sq = alloc("exp_avg_sq", mine);
    if (quantized()) {
      plan_quantized(space);  // m_exp_avg: the float exp_avg of rank-1 blocks only
    } else {
      m_exp_avg = alloc("exp_avg", mine);
      m_factors = alloc("factors", my_factors);
      m_bases = alloc("bases", my_factors);
    }
    m_gradient = alloc("packed_gradient", mine);
    m_update = alloc("update", mine);
    m_scratch_a = alloc("scratch_a", std::max<std::int64_t>(mine, 1));
    if (o.normalize_grads)
      m_block_sums =
          Kokkos::View<double*, memory_space>(Kokkos::view_alloc(space, "Lather::soap::block_sums"), m_blocks.size());
    // The exchange segments hold each owner's blocks in block order, so each parameter's blocks
    // (and a layer's) are one range of every segment.
    std::vector<std::vector<std::int64_t>> starts(std::size_t(ranks), std::vector<std::int64_t>(1, 0));
    for (std::size_t p = 0; p < m_parameter_blocks.size(); ++p) {
      for (auto& part : starts) part.push_back(part.back());
      for (std::size_t k = m_parameter_blocks[p].first; k < m_parameter_blocks[p].second; ++k) {
        auto& owner_end = starts[std::size_t(m_blocks[k].owner)].back();
        m_blocks[k].exchange = owner_end;
        owner_end += m_blocks[k].block.elements();
      }
    }
    m_distributor->lay_out(space, m_local_packed, "Lather::soap::gathered", std::move(starts));
  };
  if (ranks == 1 && m_shards.size() == 1) {
    setup();
    return;
  }
  // Options, plan and allocations may fail on one rank only: the ranks agree on it, with the
  // check that they hold the same parameters and options, before any of them reaches a step.
  const std::string local_error = ::lather::Impl::local_failure("soap.construct", setup);
  Impl::agree_on_construction(m_group, m_shards, "Soap", this->m_parameters, describe(), local_error);
  // A parameter every shard holds whole (a scalar, a replicated tensor) counts its block sums once.
  m_sums_counted = m_shards.size() > 1 ? Impl::counted_pieces(m_shards, this->m_parameters)
                                       : std::vector<char>(this->m_parameters.size(), 1);
}

template <class ExecutionSpace, class Scalar>
Soap<ExecutionSpace, Scalar>::~Soap() = default;

template <class ExecutionSpace, class Scalar>
std::vector<std::vector<int>> Soap<ExecutionSpace, Scalar>::factor_sizes(std::size_t parameter) const {
  std::vector<std::vector<int>> sizes;
  const auto [first, end] = m_parameter_blocks.at(parameter);
  for (std::size_t k = first; k < end; ++k) {
    sizes.emplace_back();
    for (std::size_t d = 0; d < m_blocks[k].factor.size(); ++d)
      sizes.back().push_back(m_blocks[k].factor[d] >= 0 ? int(m_blocks[k].block.size[d]) : 0);
  }
  return sizes;
}

template <class ExecutionSpace, class Scalar>
std::vector<int> Soap<ExecutionSpace, Scalar>::block_owners() const {
  std::vector<int> owners;
  for (const auto& b : m_blocks) owners.push_back(b.owner);
  return owners;
}

template <class ExecutionSpace, class Scalar>
std::vector<double> Soap<ExecutionSpace, Scalar>::block_costs() const {
  std::vector<double> costs;
  for (const auto& b : m_blocks) costs.push_back(b.cost);
  return costs;
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::pack_gradient(const ExecutionSpace& space, const BlockInfo& b,
                                                 const FlatTensor<Scalar, memory_space>& g) {
  const Impl::SoapBlockMap map = Impl::soap_block_map(b, m_merged[b.parameter]);
  Scalar* out = m_gradient.data() + b.local;
  const Scalar* in = g.data();
  Kokkos::parallel_for(
      "Lather::soap::pack_gradient", Kokkos::RangePolicy<ExecutionSpace>(space, 0, b.block.elements()),
      KOKKOS_LAMBDA(std::int64_t e) { out[e] = in[map.flat(e)]; });
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::apply_update(const ExecutionSpace& space, std::size_t k,
                                                const FlatTensor<Scalar, memory_space>& x, Scalar step_size,
                                                Scalar decay, Scalar denominator) {
  const BlockInfo& b = m_blocks[k];
  const Impl::SoapBlockMap map = Impl::soap_block_map(b, m_merged[std::size_t(b.parameter)]);
  const Scalar* u = m_update.data() + b.local;
  Scalar* values = x.data();
  // Distributed, the new values also go to this rank's segment of the exchange.
  Scalar* copy = distributed() ? m_distributor->segment().data() + b.exchange : nullptr;
  // Two roundings as the reference: p += -step_size u, then p *= 1 - lr weight_decay.
  Kokkos::parallel_for(
      "Lather::soap::apply_update", Kokkos::RangePolicy<ExecutionSpace>(space, 0, b.block.elements()),
      KOKKOS_LAMBDA(std::int64_t e) {
        const std::int64_t i = map.flat(e);
        const Scalar moved = values[i] - step_size * (u[e] / denominator);
        values[i] = moved * decay;
        if (copy) copy[e] = values[i];
      });
}

namespace Impl {
// The element-wise passes of Soap::do_step, outside it: nvcc takes no device lambda in a
// protected member function.

/// u = g over n elements.
template <class ExecutionSpace, class Scalar>
void soap_copy(const ExecutionSpace& space, std::int64_t n, const Scalar* g, Scalar* u) {
  Kokkos::parallel_for(
      "Lather::soap::copy_gradient", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n),
      KOKKOS_LAMBDA(std::int64_t e) { u[e] = g[e]; });
}

/// Adam's moments: m of the gradient g, v of the rotated gradient u; then u = m.
template <class ExecutionSpace, class Scalar>
void soap_moments(const ExecutionSpace& space, std::int64_t n, const Scalar* g, Scalar* m, Scalar* v, Scalar* u,
                  Scalar b1, Scalar b2) {
  Kokkos::parallel_for(
      "Lather::soap::moments", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n), KOKKOS_LAMBDA(std::int64_t e) {
        m[e] = b1 * m[e] + (Scalar(1) - b1) * g[e];
        v[e] = b2 * v[e] + (Scalar(1) - b2) * u[e] * u[e];
        u[e] = m[e];
      });
}

/// u = u / (sqrt(v) + eps).
template <class ExecutionSpace, class Scalar>
void soap_adam_direction(const ExecutionSpace& space, std::int64_t n, const Scalar* v, Scalar* u, Scalar eps) {
  Kokkos::parallel_for(
      "Lather::soap::adam_direction", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n),
      KOKKOS_LAMBDA(std::int64_t e) { u[e] = u[e] / (::lather::Impl::kmath::sqrt(v[e]) + eps); });
}

/// sum = sum over n elements of u^2, in double.
template <class ExecutionSpace, class Scalar, class Sum>
void soap_sum_of_squares(const ExecutionSpace& space, std::int64_t n, const Scalar* u, const Sum& sum) {
  Kokkos::parallel_reduce(
      "Lather::soap::update_norm", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n),
      KOKKOS_LAMBDA(std::int64_t e, double& s) { s += double(u[e]) * double(u[e]); }, sum);
}

}  // namespace Impl

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::do_step(const ExecutionSpace& space, const Tensors& values,
                                           const Tensors& gradients) {
  ::lather::Impl::ScopedRegion region("Lather::soap::step");
  const auto& o = m_options;
  const long t = m_step;
  const int rank = m_group.rank();
  const std::string context = "Soap::step " + std::to_string(t);
  const Scalar shampoo_beta = Scalar(o.shampoo_beta < 0 ? o.beta2 : o.shampoo_beta);
  m_launches = 0;
  values_needed(space);  // the last step's exchange by layers, where the forward left any
  // A NaN or Inf in any rank's gradient, before the moments and factors move: a rank's share reads
  // only its own blocks, so every rank scans its whole gradient and the group agrees (distributed:
  // one agreement, a collective of its own, since the share changes state before any other).
  const int bad = Impl::first_non_finite(space, gradients);
  m_distributor->agree(
      context, bad < 0 ? std::string() : Impl::non_finite_gradient_message(this->m_parameters[std::size_t(bad)].name));
  // One rank: exceptions propagate as they are. Distributed: this rank's verdict, agreed on below.
  const auto local = [&](const std::function<void()>& work) { return m_distributor->run_share(nullptr, work); };
  const auto own_gradients = [&] {
    ::lather::Impl::fault_point("soap.distributed_step");
    for (const auto& b : m_blocks)
      if (b.owner == rank) pack_gradient(space, b, gradients[std::size_t(b.parameter)]);
  };
  if (t == 0) {
    // The reference's first step only builds the factors and their eigenbases.
    const std::string error = local([&] {
      own_gradients();
      if (quantized()) load_matrices(space, false);
      for (std::size_t c : m_own_classes)
        accumulate_factors(space, m_classes[c], m_gradient.data() + m_classes[c].local, shampoo_beta);
      if (quantized()) store_matrices(space, false);
      refresh_bases(space, true);
    });
    m_distributor->agree(context, error);
    ++m_step;
    return;
  }
  const double lr = o.learning_rate(t);
  double step_size = lr;
  if (o.correct_bias)  // the reference counts the steps after the first: t here
    step_size *= std::sqrt(1.0 - std::pow(o.beta2, double(t))) / (1.0 - std::pow(o.beta1, double(t)));
  const Scalar b1 = Scalar(o.beta1), b2 = Scalar(o.beta2), eps = Scalar(o.epsilon);
  // Phase 1: the update of this rank's blocks, element-wise passes over its whole share (every
  // class is consecutive in it), the rotations class by class.
  std::string error = local([&] {
    own_gradients();
    const std::int64_t n = m_local_packed[std::size_t(rank)];
    Scalar* g = m_gradient.data();
    if (quantized()) {  // exp_avg and the bases dequantized into workspace
      load_exp_avg(space);
      load_matrices(space, true);
    }
    Scalar* m = quantized() ? m_avg_work.data() : m_exp_avg.data();
    Scalar* v = m_exp_avg_sq.data();
    Scalar* u = m_update.data();
    Scalar* scratch = m_scratch_a.data();
    const auto rotate_all = [&](bool forward) {
      for (std::size_t c : m_own_classes)
        rotate(space, m_classes[c], u + m_classes[c].local, scratch + m_classes[c].local, forward);
    };
    // m in the original basis; v of the gradient rotated into the current eigenbasis.
    Impl::soap_copy(space, n, g, u);
    rotate_all(true);
    Impl::soap_moments(space, n, g, m, v, u, b1, b2);
    if (quantized()) store_exp_avg(space);
    rotate_all(true);
    Impl::soap_adam_direction(space, n, v, u, eps);
    rotate_all(false);
    if (!o.normalize_grads) return;
    // Sums of u^2 block by block: the same bits whichever rank computes a block.
    Kokkos::deep_copy(space, m_block_sums, 0.0);
    for (std::size_t k = 0; k < m_blocks.size(); ++k)
      if (m_blocks[k].owner == rank)
        Impl::soap_sum_of_squares(space, m_blocks[k].block.elements(), u + m_blocks[k].local,
                                  Kokkos::subview(m_block_sums, k));
  });
  // normalize_grads: the RMS of each whole parameter's update (the reference: u / (sqrt(mean(u^2))
  // + eps)), from every rank's block sums (one allreduce, which carries the failure flag too).
  // With bands, every band's blocks, over the shards (by the blocks' numbers in the whole model).
  std::vector<Scalar> denominator(values.size(), Scalar(1));
  if (o.normalize_grads) {
    std::vector<double> sums(std::size_t(m_global_blocks) + 1, 0.0);
    if (error.empty()) {
      std::vector<double> mine(m_blocks.size());
      Kokkos::deep_copy(space, Kokkos::View<double*, Kokkos::HostSpace>(mine.data(), mine.size()), m_block_sums);
      ::lather::Impl::fence(space, "Lather::soap: block sums on the host");
      for (std::size_t k = 0; k < m_blocks.size(); ++k)
        if (m_sums_counted.empty() || m_sums_counted[std::size_t(m_blocks[k].parameter)])
          sums[std::size_t(m_blocks[k].global)] = mine[k];
    }
    sums.back() = error.empty() ? 0.0 : 1.0;
    m_distributor->combine(sums, comm::Combine::sum);  // x + 0 + ... = x exactly
    if (m_shards.size() > 1) m_shards.allreduce(sums, comm::Combine::sum);
    if (sums.back() != 0.0) {
      if (m_shards.size() > 1) m_shards.agree_on_failure(context, error);
      m_distributor->agree(context, error);
    }
    for (std::size_t p = 0; p < values.size(); ++p) {
      const auto [first, last] = m_parameter_global[p];
      if (m_parameter_elements[p] == 0) continue;
      double sum = 0;
      for (auto k = first; k < last; ++k) sum += sums[std::size_t(k)];
      denominator[p] = Scalar(std::sqrt(sum / double(m_parameter_elements[p]))) + eps;
    }
  }
  // Phase 2: the new values of this rank's blocks, its factors, and (every
  // precondition_frequency steps) its bases.
  if (error.empty())
    error = local([&] {
      const Scalar decay = Scalar(1.0 - o.weight_decay * lr);
      for (std::size_t k = 0; k < m_blocks.size(); ++k)
        if (m_blocks[k].owner == rank) {
          const auto p = std::size_t(m_blocks[k].parameter);
          apply_update(space, k, values[p], Scalar(step_size), decay, denominator[p]);
        }
      if (quantized()) load_matrices(space, false);
      for (std::size_t c : m_own_classes)
        accumulate_factors(space, m_classes[c], m_gradient.data() + m_classes[c].local, shampoo_beta);
      if (quantized()) store_matrices(space, false);  // the factors stay in m_matrix_work
      if (t % o.precondition_frequency == 0) refresh_bases(space, false);
    });
  gather_values(space, values, error, context);
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::gather_values(const ExecutionSpace& space, const Tensors& values,
                                                 const std::string& error, const std::string& context) {
  m_exchanged = values;
  const bool in_flight = m_distributor->start_exchange(space, error, context);
  ++m_step;
  if (!in_flight) values_needed(space);
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::unpack_blocks(const ExecutionSpace& space, const Tensors& values, std::size_t first,
                                                 std::size_t last) {
  const auto rank = std::size_t(m_distributor->part());
  for (std::size_t p = first; p < last; ++p) {
    Scalar* out = values[p].data();
    for (std::size_t k = m_parameter_blocks[p].first; k < m_parameter_blocks[p].second; ++k) {
      const BlockInfo& b = m_blocks[k];
      if (std::size_t(b.owner) == rank) continue;
      const Impl::SoapBlockMap map = Impl::soap_block_map(b, m_merged[p]);
      const Scalar* in = m_distributor->buffer().data() + m_distributor->offset(b.owner) + b.exchange;
      Kokkos::parallel_for(
          "Lather::soap::unpack_values", Kokkos::RangePolicy<ExecutionSpace>(space, 0, b.block.elements()),
          KOKKOS_LAMBDA(std::int64_t e) { out[map.flat(e)] = in[e]; });
    }
  }
}

template <class ExecutionSpace, class Scalar>
bool Soap<ExecutionSpace, Scalar>::overlap_exchange(const ExecutionSpace&,
                                                    std::vector<std::pair<std::size_t, std::size_t>> layers) {
  return m_distributor->set_layers(std::move(layers), this->m_parameters.size());
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) {
  m_distributor->complete(first, last,
                          [&](std::size_t begin, std::size_t end) { unpack_blocks(space, m_exchanged, begin, end); });
}

template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::string, std::string>> Soap<ExecutionSpace, Scalar>::describe() const {
  const auto& o = m_options;
  const auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  using ::lather::Impl::concat;
  return {{"optimizer", "soap"},
          {"learning_rate", o.learning_rate.describe()},
          {"beta1", concat(o.beta1)},
          {"beta2", concat(o.beta2)},
          {"shampoo_beta", concat(o.shampoo_beta)},
          {"epsilon", concat(o.epsilon)},
          {"weight_decay", concat(o.weight_decay)},
          {"precondition_frequency", std::to_string(o.precondition_frequency)},
          {"max_precond_dim", std::to_string(o.max_precond_dim)},
          {"block_size", std::to_string(o.block_size)},
          {"merge_small_dims_block_size", std::to_string(o.merge_small_dims_block_size)},
          {"precondition_1d", flag(o.precondition_1d)},
          {"normalize_grads", flag(o.normalize_grads)},
          {"correct_bias", flag(o.correct_bias)},
          {"best_effort_memory_usage_reduction", flag(o.best_effort_memory_usage_reduction)},
          {"product_precision", to_string(o.product_precision)}};
}

}  // namespace lather::optim

#include <lather/optim/impl/soap_products.hpp>
#include <lather/optim/impl/soap_state.hpp>
#include <lather/optim/impl/soap_quantized.hpp>
