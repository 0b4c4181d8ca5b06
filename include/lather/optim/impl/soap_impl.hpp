#pragma once
// The implementation of Soap, for explicit instantiation: src/optim/soap.cpp instantiates it for
// lather::DefaultExecutionSpace (and the host space on device builds); a program that needs
// another execution space includes this header and uses the class as usual.

#include <lather/core/error.hpp>
#include <lather/core/impl/gemm.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/soap.hpp>

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

inline std::string soap_text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}
}  // namespace Impl

template <class ExecutionSpace, class Scalar>
Soap<ExecutionSpace, Scalar>::Soap(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                   SoapOptions options)
    : Optimizer<ExecutionSpace, Scalar>(std::move(parameters)), m_options(std::move(options)) {
  m_options.validate();
  const auto& o = m_options;
  std::int64_t packed = 0, factors = 0, largest = 1;
  for (std::size_t p = 0; p < this->m_parameters.size(); ++p) {
    const auto& shape = this->m_parameters[p].shape;
    const TensorShape merged = o.merge_small_dims_block_size > 0 ? merge_small_dims(shape, o.merge_small_dims_block_size)
                                                                 : shape;
    LATHER_REQUIRE(merged.size() <= std::size_t(Impl::soap_max_rank), "Soap: parameter '", this->m_parameters[p].name,
                   "' has ", merged.size(), " dimensions after merging; at most ", Impl::soap_max_rank,
                   " are supported");
    m_merged.push_back(merged);
    m_partitions.emplace_back(merged, o.block_size);
    // The reference's rule: rank-1 parameters only with precondition_1d; a dimension above
    // max_precond_dim never (checked on the merged shape, before blocking, as Shampoo does).
    const bool rank_ok = shape.size() >= 2 || (shape.size() == 1 && o.precondition_1d);
    const std::size_t first = m_blocks.size();
    const std::int64_t packed_begin = packed, factors_begin = factors;
    for (const auto& block : m_partitions.back().blocks()) {
      if (block.elements() == 0) continue;
      BlockInfo info;
      info.parameter = int(p);
      info.block = block;
      info.packed = packed;
      packed += block.elements();
      largest = std::max(largest, block.elements());
      for (std::size_t d = 0; d < block.size.size(); ++d) {
        if (rank_ok && merged[d] <= o.max_precond_dim) {
          info.factor.push_back(factors);
          m_factor_list.emplace_back(factors, int(block.size[d]));
          factors += block.size[d] * block.size[d];
        } else {
          info.factor.push_back(-1);
        }
      }
      m_blocks.push_back(std::move(info));
    }
    m_parameter_blocks.emplace_back(first, m_blocks.size());
    m_parameter_packed.emplace_back(packed_begin, packed);
    m_parameter_factors.emplace_back(factors_begin, factors);
  }
  const auto alloc = [&](const char* what, std::int64_t n) {
    return Buffer(Kokkos::view_alloc(space, std::string("Lather::soap::") + what), std::size_t(n));
  };
  // view_alloc without WithoutInitializing zero-fills: moments and factors start at zero.
  m_exp_avg = alloc("exp_avg", packed);
  m_exp_avg_sq = alloc("exp_avg_sq", packed);
  m_factors = alloc("factors", factors);
  m_bases = alloc("bases", factors);
  m_gradient = alloc("packed_gradient", packed);
  m_update = alloc("update", packed);
  m_scratch_a = alloc("scratch_a", largest);
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

namespace Impl {
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
}  // namespace Impl

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::pack_gradient(const ExecutionSpace& space, const BlockInfo& b,
                                                 const FlatTensor<Scalar, memory_space>& g) {
  const Impl::SoapBlockMap map = Impl::soap_block_map(b, m_merged[b.parameter]);
  Scalar* out = m_gradient.data() + b.packed;
  const Scalar* in = g.data();
  Kokkos::parallel_for(
      "Lather::soap::pack_gradient", Kokkos::RangePolicy<ExecutionSpace>(space, 0, b.block.elements()),
      KOKKOS_LAMBDA(std::int64_t e) { out[e] = in[map.flat(e)]; });
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::apply_update(const ExecutionSpace& space, std::size_t p,
                                                const FlatTensor<Scalar, memory_space>& x, Scalar step_size,
                                                Scalar decay) {
  const auto [begin, end] = m_parameter_packed[p];
  const Scalar* update = m_update.data();
  Scalar denominator = 1;
  if (m_options.normalize_grads && end > begin) {
    // The reference: u / (sqrt(mean(u^2)) + eps), the mean over the whole parameter.
    double sum = 0;
    Kokkos::parallel_reduce(
        "Lather::soap::update_norm", Kokkos::RangePolicy<ExecutionSpace>(space, begin, end),
        KOKKOS_LAMBDA(std::int64_t k, double& s) { s += double(update[k]) * double(update[k]); }, sum);
    denominator = Scalar(std::sqrt(sum / double(end - begin))) + Scalar(m_options.epsilon);
  }
  Scalar* values = x.data();
  const auto [first, last] = m_parameter_blocks[p];
  for (std::size_t k = first; k < last; ++k) {
    const Impl::SoapBlockMap map = Impl::soap_block_map(m_blocks[k], m_merged[p]);
    const Scalar* u = update + m_blocks[k].packed;
    // Two roundings as the reference: p += -step_size u, then p *= 1 - lr weight_decay.
    Kokkos::parallel_for(
        "Lather::soap::apply_update", Kokkos::RangePolicy<ExecutionSpace>(space, 0, m_blocks[k].block.elements()),
        KOKKOS_LAMBDA(std::int64_t e) {
          const std::int64_t i = map.flat(e);
          const Scalar moved = values[i] - step_size * (u[e] / denominator);
          values[i] = moved * decay;
        });
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::rotate(const ExecutionSpace& space, const BlockInfo& b, Scalar* from,
                                          Scalar* scratch, bool forward) {
  // Mode-d product of the block viewed as [outer, n, inner]: forward Y[a] = Q^T X[a], backward
  // Y[a] = Q X[a]. The order of the modes does not matter (they commute); the result ends in
  // `from`, copied back when an odd number of products left it in `scratch`.
  const auto& size = b.block.size;
  Scalar* in = from;
  Scalar* out = scratch;
  for (std::size_t d = 0; d < size.size(); ++d) {
    if (b.factor[d] < 0) continue;
    const int n = int(size[d]);
    std::int64_t outer = 1, inner = 1;
    for (std::size_t e = 0; e < d; ++e) outer *= size[e];
    for (std::size_t e = d + 1; e < size.size(); ++e) inner *= size[e];
    const Scalar* q = m_bases.data() + b.factor[d];
    using ::lather::Impl::gemm_strided_batched;
    if (inner == 1)  // X is [outer, n]: one product X Q (forward) or X Q^T (backward)
      gemm_strided_batched(space, 'N', forward ? 'N' : 'T', int(outer), n, n, Scalar(1), in, 0, q, 0, Scalar(0), out, 0,
                           1);
    else
      gemm_strided_batched(space, forward ? 'T' : 'N', 'N', n, int(inner), n, Scalar(1), q, 0, in, n * inner, Scalar(0),
                           out, n * inner, int(outer));
    std::swap(in, out);
  }
  if (in != from) {
    const Scalar* result = in;
    Kokkos::parallel_for(
        "Lather::soap::copy_rotated", Kokkos::RangePolicy<ExecutionSpace>(space, 0, b.block.elements()),
        KOKKOS_LAMBDA(std::int64_t e) { from[e] = result[e]; });
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::accumulate_factors(const ExecutionSpace& space, const BlockInfo& b, const Scalar* g,
                                                      Scalar beta) {
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  using Const = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space, Unmanaged>;
  using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space, Unmanaged>;
  const auto& size = b.block.size;
  for (std::size_t d = 0; d < size.size(); ++d) {
    if (b.factor[d] < 0) continue;
    const int n = int(size[d]);
    std::int64_t outer = 1, inner = 1;
    for (std::size_t e = 0; e < d; ++e) outer *= size[e];
    for (std::size_t e = d + 1; e < size.size(); ++e) inner *= size[e];
    const Matrix factor(m_factors.data() + b.factor[d], n, n);
    // GG = beta GG + (1 - beta) sum_a X[a] X[a]^T over the [outer, n, inner] view.
    using ::lather::Impl::gemm;
    if (inner == 1) {
      const Const x(g, outer, n);
      gemm(space, "T", "N", Scalar(1) - beta, x, x, beta, factor);
    } else {
      for (std::int64_t a = 0; a < outer; ++a) {
        const Const x(g + a * n * inner, n, inner);
        gemm(space, "N", "T", Scalar(1) - beta, x, x, a == 0 ? beta : Scalar(1), factor);
      }
    }
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::refresh_bases(const ExecutionSpace& space, bool first) {
  if (m_factor_list.empty()) return;
  ::lather::Impl::ScopedRegion region(first ? "Lather::soap::eigh" : "Lather::soap::power_qr");
  auto factors = Kokkos::create_mirror_view(m_factors);
  auto bases = Kokkos::create_mirror_view(m_bases);
  Kokkos::deep_copy(space, factors, m_factors);
  Kokkos::deep_copy(space, bases, m_bases);
  ::lather::Impl::fence(space, "Lather::soap: factors on the host");
  std::vector<double> f, q;
  std::vector<int> order;
  std::vector<int> all_orders;  // every factor's column order, in factor order
  for (const auto& [start, n] : m_factor_list) {
    const std::size_t nn = std::size_t(n) * n;
    f.assign(factors.data() + start, factors.data() + start + nn);
    q.assign(bases.data() + start, bases.data() + start + nn);
    if (first) {
      Impl::soap_eigenbasis(n, f.data(), q.data());
    } else {
      Impl::soap_power_qr(n, f.data(), q.data(), order);
      all_orders.insert(all_orders.end(), order.begin(), order.end());
    }
    for (std::size_t k = 0; k < nn; ++k) bases(std::size_t(start) + k) = Scalar(q[k]);
  }
  Kokkos::deep_copy(space, m_bases, bases);
  if (first) return;
  // The estimated eigenvalues reorder the columns; exp_avg_sq follows along the same dimension.
  Kokkos::View<int*, memory_space> device_orders("Lather::soap::orders", all_orders.size());
  {
    Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(all_orders.data(),
                                                                                              all_orders.size());
    Kokkos::deep_copy(space, device_orders, host);
  }
  std::int64_t cursor = 0;
  for (const auto& b : m_blocks) {
    const auto& size = b.block.size;
    for (std::size_t d = 0; d < size.size(); ++d) {
      if (b.factor[d] < 0) continue;
      const std::int64_t n = size[d];
      bool identity = true;
      for (std::int64_t j = 0; j < n; ++j) identity = identity && all_orders[std::size_t(cursor + j)] == j;
      if (!identity) {
        std::int64_t inner = 1;
        for (std::size_t e = d + 1; e < size.size(); ++e) inner *= size[e];
        Scalar* v = m_exp_avg_sq.data() + b.packed;
        Scalar* tmp = m_scratch_a.data();
        const int* perm = device_orders.data() + cursor;
        const std::int64_t elements = b.block.elements();
        Kokkos::parallel_for(
            "Lather::soap::permute_exp_avg_sq", Kokkos::RangePolicy<ExecutionSpace>(space, 0, elements),
            KOKKOS_LAMBDA(std::int64_t e) {
              const std::int64_t j = (e / inner) % n, base = e - j * inner;
              tmp[e] = v[base + std::int64_t(perm[j]) * inner];
            });
        Kokkos::parallel_for(
            "Lather::soap::copy_exp_avg_sq", Kokkos::RangePolicy<ExecutionSpace>(space, 0, elements),
            KOKKOS_LAMBDA(std::int64_t e) { v[e] = tmp[e]; });
      }
      cursor += n;
    }
  }
  // device_orders is freed here: keep it alive until the kernels ran.
  ::lather::Impl::fence(space, "Lather::soap: permutations done");
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::do_step(const ExecutionSpace& space, const Tensors& values,
                                           const Tensors& gradients) {
  ::lather::Impl::ScopedRegion region("Lather::soap::step");
  const auto& o = m_options;
  const long t = m_step;
  const Scalar shampoo_beta = Scalar(o.shampoo_beta < 0 ? o.beta2 : o.shampoo_beta);
  for (const auto& b : m_blocks) pack_gradient(space, b, gradients[b.parameter]);
  if (t == 0) {
    // The reference's first step only builds the factors and their eigenbases.
    for (const auto& b : m_blocks) accumulate_factors(space, b, m_gradient.data() + b.packed, shampoo_beta);
    refresh_bases(space, true);
    ++m_step;
    return;
  }
  const double lr = o.learning_rate(t);
  double step_size = lr;
  if (o.correct_bias)  // the reference counts the steps after the first: t here
    step_size *= std::sqrt(1.0 - std::pow(o.beta2, double(t))) / (1.0 - std::pow(o.beta1, double(t)));
  const Scalar b1 = Scalar(o.beta1), b2 = Scalar(o.beta2), eps = Scalar(o.epsilon);
  for (const auto& b : m_blocks) {
    const std::int64_t n = b.block.elements();
    Scalar* g = m_gradient.data() + b.packed;
    Scalar* m = m_exp_avg.data() + b.packed;
    Scalar* v = m_exp_avg_sq.data() + b.packed;
    Scalar* u = m_update.data() + b.packed;
    Scalar* projected = m_scratch_a.data();
    // m in the original basis; v of the gradient rotated into the current eigenbasis.
    Kokkos::parallel_for(
        "Lather::soap::copy_gradient", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n),
        KOKKOS_LAMBDA(std::int64_t e) { u[e] = g[e]; });
    rotate(space, b, u, projected, true);
    Kokkos::parallel_for(
        "Lather::soap::moments", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n), KOKKOS_LAMBDA(std::int64_t e) {
          m[e] = b1 * m[e] + (Scalar(1) - b1) * g[e];
          v[e] = b2 * v[e] + (Scalar(1) - b2) * u[e] * u[e];
          u[e] = m[e];
        });
    rotate(space, b, u, projected, true);
    Kokkos::parallel_for(
        "Lather::soap::adam_direction", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n),
        KOKKOS_LAMBDA(std::int64_t e) { u[e] = u[e] / (::lather::Impl::kmath::sqrt(v[e]) + eps); });
    rotate(space, b, u, projected, false);
  }
  const Scalar decay = Scalar(1.0 - o.weight_decay * lr);
  for (std::size_t p = 0; p < values.size(); ++p) apply_update(space, p, values[p], Scalar(step_size), decay);
  for (const auto& b : m_blocks) accumulate_factors(space, b, m_gradient.data() + b.packed, shampoo_beta);
  if (t % o.precondition_frequency == 0) refresh_bases(space, false);
  ++m_step;
}

template <class ExecutionSpace, class Scalar>
StateMemoryReport Soap<ExecutionSpace, Scalar>::memory_report() const {
  StateMemoryReport r;
  const auto bytes = [](const Buffer& b) { return std::int64_t(b.size() * sizeof(Scalar)); };
  r.local_bytes = bytes(m_exp_avg) + bytes(m_exp_avg_sq);
  r.stack_bytes = bytes(m_factors) + bytes(m_bases);
  r.workspace_bytes = bytes(m_gradient) + bytes(m_update) + bytes(m_scratch_a);
  return r;
}

template <class ExecutionSpace, class Scalar>
auto Soap<ExecutionSpace, Scalar>::state_arrays(const ExecutionSpace&) -> std::vector<StateArray<memory_space>> {
  std::vector<StateArray<memory_space>> arrays;
  m_step_host = m_step;
  StateArray<memory_space> step;
  step.name = "step";
  step.dtype = DType::int64;
  step.host_bytes = Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      reinterpret_cast<char*>(&m_step_host), sizeof m_step_host);
  arrays.push_back(step);
  const auto add = [&](std::size_t p, const char* what, const Buffer& buffer, std::pair<std::int64_t, std::int64_t> range) {
    if (range.second == range.first) return;
    StateArray<memory_space> a;
    a.name = "soap/" + this->m_parameters[p].name + "/" + what;
    a.dtype = dtype_of<Scalar>();
    a.shape = {range.second - range.first};
    a.device_bytes = as_bytes<memory_space>(Kokkos::subview(buffer, range), std::size_t(range.second - range.first));
    arrays.push_back(a);
  };
  for (std::size_t p = 0; p < this->m_parameters.size(); ++p) {
    add(p, "exp_avg", m_exp_avg, m_parameter_packed[p]);
    add(p, "exp_avg_sq", m_exp_avg_sq, m_parameter_packed[p]);
    add(p, "factors", m_factors, m_parameter_factors[p]);
    add(p, "bases", m_bases, m_parameter_factors[p]);
  }
  return arrays;
}

template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::string, std::string>> Soap<ExecutionSpace, Scalar>::describe() const {
  const auto& o = m_options;
  const auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  using Impl::soap_text;
  return {{"optimizer", "soap"},
          {"learning_rate", o.learning_rate.describe()},
          {"beta1", soap_text(o.beta1)},
          {"beta2", soap_text(o.beta2)},
          {"shampoo_beta", soap_text(o.shampoo_beta)},
          {"epsilon", soap_text(o.epsilon)},
          {"weight_decay", soap_text(o.weight_decay)},
          {"precondition_frequency", std::to_string(o.precondition_frequency)},
          {"max_precond_dim", std::to_string(o.max_precond_dim)},
          {"block_size", std::to_string(o.block_size)},
          {"merge_small_dims_block_size", std::to_string(o.merge_small_dims_block_size)},
          {"precondition_1d", flag(o.precondition_1d)},
          {"normalize_grads", flag(o.normalize_grads)},
          {"correct_bias", flag(o.correct_bias)}};
}

}  // namespace lather::optim
