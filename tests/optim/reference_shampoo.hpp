#pragma once
// A plain, independent model of the JAX reference `distributed_shampoo` (non-sharded update_fn)
// for tests: double precision, std::vector storage, index arithmetic and triple loops instead of
// BLAS and Kokkos. Written from the reference's Python, not from Lather's implementation.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace lather::test {

struct ReferenceOptions {
  double learning_rate = 0.1;
  long block_size = 128;
  double beta1 = 0.9, beta2 = 0.999, diagonal_epsilon = 1e-10, matrix_epsilon = 1e-6, weight_decay = 0;
  long start_preconditioning_step = 5, preconditioning_compute_steps = 1, statistics_compute_steps = 1;
  bool best_effort_shape_interpretation = true;
  int graft_type = 0;  // 0 SGD, 1 ADAGRAD, 2 RMSPROP, 3 RMSPROP_NORMALIZED, 4 SQRT_N, 5 ADAGRAD_NORMALIZED
  bool nesterov = true;
  int exponent_override = 0;
  bool moving_average_for_momentum = false;
  long skip_preconditioning_dim_size_gt = 4096;
  double clip_by_scaled_gradient_norm = 0;
  long merge_small_dims_block_size = 4096;
  int skip_preconditioning_rank_lt = 1;
  bool decoupled_learning_rate = true, decoupled_weight_decay = false;
  double inverse_failure_threshold = 0.1;
  double root_tolerance = 1e-6;
  int root_max_iterations = 100;
  int preconditioner_side = 0;  // the reference's precondtioner_type: 0 ALL, 1 INPUT, 2 OUTPUT
  // Lather's own: one-sided, the block extent along the dimensions without a statistic (0: block_size).
  long unpreconditioned_block_size = 0;
};

class ReferenceShampoo {
 public:
  using Shape = std::vector<std::int64_t>;

  ReferenceShampoo(const std::vector<Shape>& shapes, ReferenceOptions o) : m_o(o) {
    for (const auto& shape : shapes) m_params.push_back(make_param(shape));
  }

  void step(std::vector<std::vector<double>>& params, const std::vector<std::vector<double>>& grads) {
    const long t = m_count;
    const double w1 = m_o.beta2, w2 = m_o.beta2 == 1.0 ? 1.0 : 1.0 - m_o.beta2;
    // _compute_stats
    if (t % m_o.statistics_compute_steps == 0)
      for (std::size_t p = 0; p < m_params.size(); ++p) {
        auto& st = m_params[p];
        if (st.skip) continue;
        int s = 0;
        for (const auto& block : st.blocks) {
          const auto g = extract(grads[p], st.tshape, block);
          for (std::size_t j : st.dims) {
            const auto gram = mode_gram(g, block.size, j);
            for (std::size_t k = 0; k < gram.size(); ++k) st.stats[s][k] = w1 * st.stats[s][k] + w2 * gram[k];
            ++s;
          }
        }
      }
    // _compute_preconditioners
    if (t % m_o.preconditioning_compute_steps == 0)
      for (auto& st : m_params)
        for (std::size_t s = 0; s < st.stats.size(); ++s) {
          auto [root, error] = inverse_root(st.stats[s], st.sizes[s], st.exponent);
          if (std::isnan(error) || error >= m_o.inverse_failure_threshold) continue;  // keep the old one
          st.precs[s] = root;
        }
    // _transform_grad
    const double lr = m_o.learning_rate;
    for (std::size_t p = 0; p < m_params.size(); ++p) {
      auto& st = m_params[p];
      const auto& g = grads[p];
      const std::size_t n = g.size();
      std::vector<double> graft(n);
      if (m_o.graft_type == 1 || m_o.graft_type == 5 || m_o.graft_type == 2 || m_o.graft_type == 3) {
        const bool normalized = m_o.graft_type == 5 || m_o.graft_type == 3;
        const double scale = normalized ? 1.0 / (norm(g) + 1e-16) : 1.0;
        for (std::size_t k = 0; k < n; ++k) {
          const double sg = g[k] * scale;
          st.diagonal[k] = (m_o.graft_type == 1 || m_o.graft_type == 5) ? st.diagonal[k] + sg * sg
                                                                        : w1 * st.diagonal[k] + w2 * sg * sg;
          graft[k] = sg / (std::sqrt(st.diagonal[k]) + m_o.diagonal_epsilon);
        }
        if ((m_o.graft_type == 2 || m_o.graft_type == 3) && m_o.clip_by_scaled_gradient_norm > 0) {
          const double scaled = norm(graft) / std::sqrt(double(n));
          const double denom = std::max(1.0, scaled / m_o.clip_by_scaled_gradient_norm);
          for (auto& x : graft) x /= denom;
        }
      } else if (m_o.graft_type == 4) {
        for (std::size_t k = 0; k < n; ++k) graft[k] = g[k] > 0 ? 1.0 : (g[k] < 0 ? -1.0 : 0.0);
      } else {
        graft = g;
      }
      if (!m_o.decoupled_learning_rate)
        for (auto& x : graft) x *= lr;
      std::vector<double> precond = st.skip ? graft : preconditioned(st, g);
      const double multiplier = norm(graft) / (norm(precond) + 1e-16);
      const double w = m_o.moving_average_for_momentum ? 1.0 - m_o.beta1 : 1.0;
      const bool run = t >= m_o.start_preconditioning_step;
      for (std::size_t k = 0; k < n; ++k) {
        const double x = params[p][k];
        double shampoo_update = precond[k] * multiplier, grafting_update = graft[k];
        if (m_o.weight_decay != 0 && !m_o.decoupled_weight_decay) {
          shampoo_update += m_o.weight_decay * x;
          grafting_update += m_o.weight_decay * x;
        }
        const double shampoo_momentum = st.momentum[k] * m_o.beta1 + w * shampoo_update;
        const double grafting_momentum = st.diagonal_momentum[k] * m_o.beta1 + w * grafting_update;
        const double momentum_update = run ? shampoo_momentum : grafting_momentum;
        const double wd_update = run ? shampoo_update : grafting_update;
        double update = m_o.nesterov ? w * wd_update + m_o.beta1 * momentum_update : momentum_update;
        if (m_o.weight_decay != 0 && m_o.decoupled_weight_decay) update += lr * m_o.weight_decay * x;
        params[p][k] = x - (m_o.decoupled_learning_rate ? lr : 1.0) * update;
        st.momentum[k] = shampoo_momentum;
        st.diagonal_momentum[k] = grafting_momentum;
      }
    }
    ++m_count;
  }

  /// Statistics of parameter p, row-major n x n each.
  const std::vector<std::vector<double>>& statistics(std::size_t p) const { return m_params[p].stats; }

 private:
  struct Block {
    Shape offset, size;
  };
  struct Param {
    Shape shape, tshape;
    bool skip = false;
    std::vector<Block> blocks;
    std::vector<std::size_t> dims;  // the dimensions with a statistic (should_precondition_dims)
    int exponent = 0;
    std::vector<int> sizes;
    std::vector<std::vector<double>> stats, precs;
    std::vector<double> diagonal, momentum, diagonal_momentum;
  };

  static double norm(const std::vector<double>& x) {
    double s = 0;
    for (double v : x) s += v * v;
    return std::sqrt(s);
  }

  Shape merge(const Shape& shape) const {
    if (!shape.empty() && std::all_of(shape.begin(), shape.end(), [](auto d) { return d == 1; })) return {1};
    Shape out;
    std::int64_t product = 1;
    for (auto d : shape) {
      if (product * d <= m_o.merge_small_dims_block_size) {
        product *= d;
      } else {
        if (product > 1) out.push_back(product);
        product = d;
      }
    }
    if (product > 1) out.push_back(product);
    return out;
  }

  Param make_param(const Shape& shape) const {
    Param st;
    st.shape = shape;
    st.tshape = m_o.best_effort_shape_interpretation ? merge(shape) : shape;
    std::int64_t elements = 1;
    for (auto d : shape) elements *= d;
    st.skip = int(shape.size()) < m_o.skip_preconditioning_rank_lt;
    for (auto d : shape) st.skip = st.skip || d > m_o.skip_preconditioning_dim_size_gt;
    if (st.tshape.empty()) st.skip = true;
    st.diagonal.assign(elements, 0.0);
    st.momentum.assign(elements, 0.0);
    st.diagonal_momentum.assign(elements, 0.0);
    if (st.skip) return st;
    // One-sided (the reference's should_precondition_dims): INPUT all but the last dimension,
    // OUTPUT the last only; rank <= 1 and ALL every dimension.
    const std::size_t rank_of_shape = st.tshape.size();
    for (std::size_t d = 0; d < rank_of_shape; ++d) {
      const bool last = d + 1 == rank_of_shape;
      if (rank_of_shape <= 1 || m_o.preconditioner_side == 0 || (m_o.preconditioner_side == 1 && !last) ||
          (m_o.preconditioner_side == 2 && last))
        st.dims.push_back(d);
    }
    // Blocks: split every dimension at multiples of block_size (one with no statistic at
    // unpreconditioned_block_size where it is set); enumerate the first dimension slowest
    // (odometer over block indices).
    std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> splits;
    for (std::size_t axis = 0; axis < rank_of_shape; ++axis) {
      const std::int64_t d = st.tshape[axis];
      const bool has_statistic = std::find(st.dims.begin(), st.dims.end(), axis) != st.dims.end();
      const std::int64_t wanted =
          has_statistic || m_o.unpreconditioned_block_size <= 0 ? m_o.block_size : m_o.unpreconditioned_block_size;
      std::vector<std::pair<std::int64_t, std::int64_t>> parts;
      const std::int64_t b = (wanted > 0 && wanted < d) ? wanted : d;
      for (std::int64_t start = 0; start < d; start += b) parts.push_back({start, std::min(b, d - start)});
      splits.push_back(parts);
    }
    std::vector<std::size_t> odometer(splits.size(), 0);
    for (bool more = true; more;) {
      Block block;
      for (std::size_t d = 0; d < splits.size(); ++d) {
        block.offset.push_back(splits[d][odometer[d]].first);
        block.size.push_back(splits[d][odometer[d]].second);
      }
      st.blocks.push_back(block);
      more = false;
      for (int d = int(splits.size()) - 1; d >= 0; --d) {
        if (++odometer[d] < splits[d].size()) {
          more = true;
          break;
        }
        odometer[d] = 0;
      }
    }
    st.exponent = m_o.exponent_override ? m_o.exponent_override : 2 * int(st.dims.size());
    for (const auto& block : st.blocks)
      for (std::size_t j : st.dims) {
        const std::int64_t n = block.size[j];
        st.sizes.push_back(int(n));
        std::vector<double> eye(n * n, 0.0), eps(n * n, 0.0);
        for (std::int64_t i = 0; i < n; ++i) {
          eye[i * n + i] = 1.0;
          eps[i * n + i] = m_o.matrix_epsilon;
        }
        st.stats.push_back(eps);
        st.precs.push_back(eye);
      }
    return st;
  }

  /// The block's elements, row-major within the block.
  static std::vector<double> extract(const std::vector<double>& x, const Shape& shape, const Block& block) {
    std::int64_t count = 1;
    for (auto s : block.size) count *= s;
    std::vector<double> out(count);
    for (std::int64_t e = 0; e < count; ++e) out[e] = x[global_index(shape, block, e)];
    return out;
  }
  static std::int64_t global_index(const Shape& shape, const Block& block, std::int64_t e) {
    std::int64_t global = 0, stride = 1;
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      global += (block.offset[d] + e % block.size[d]) * stride;
      e /= block.size[d];
      stride *= shape[d];
    }
    return global;
  }
  static std::int64_t stride_of(const Shape& size, std::size_t j) {
    std::int64_t s = 1;
    for (std::size_t d = j + 1; d < size.size(); ++d) s *= size[d];
    return s;
  }

  /// Sum over the fibres along dimension j of v v^T.
  static std::vector<double> mode_gram(const std::vector<double>& x, const Shape& size, std::size_t j) {
    const std::int64_t n = size[j], stride = stride_of(size, j);
    std::vector<double> gram(n * n, 0.0);
    for (std::int64_t e = 0; e < std::int64_t(x.size()); ++e) {
      if ((e / stride) % n != 0) continue;  // e starts a fibre
      for (std::int64_t a = 0; a < n; ++a)
        for (std::int64_t b = 0; b < n; ++b) gram[a * n + b] += x[e + a * stride] * x[e + b * stride];
    }
    return gram;
  }

  /// For each block, contract every dimension j with its preconditioner: y_k = sum_i P[i][k] x_i
  /// along the fibres of j; scatter back to the parameter's layout.
  std::vector<double> preconditioned(const Param& st, const std::vector<double>& g) const {
    std::vector<double> out(g.size());
    int s = 0;
    for (const auto& block : st.blocks) {
      auto x = extract(g, st.tshape, block);
      for (std::size_t j : st.dims) {
        const std::int64_t n = block.size[j], stride = stride_of(block.size, j);
        std::vector<double> y(x.size());
        for (std::int64_t e = 0; e < std::int64_t(x.size()); ++e) {
          if ((e / stride) % n != 0) continue;
          for (std::int64_t k = 0; k < n; ++k) {
            double sum = 0;
            for (std::int64_t i = 0; i < n; ++i) sum += st.precs[s][i * n + k] * x[e + i * stride];
            y[e + k * stride] = sum;
          }
        }
        x.swap(y);
        ++s;
      }
      for (std::int64_t e = 0; e < std::int64_t(x.size()); ++e) out[global_index(st.tshape, block, e)] = x[e];
    }
    return out;
  }

  /// Statistics of parameter p, row-major n x n each (declared again below for the root helper).
 public:
  /// matrix_inverse_pth_root of the reference: ridge = matrix_epsilon * max(lambda, 1e-6) with
  /// lambda from power iteration (start RandomState(1729).uniform(-1, 1, n), |change| <= 1e-6),
  /// then the coupled Newton iteration with its stopping rules. Returns the root and the error.
  std::pair<std::vector<double>, double> inverse_root(const std::vector<double>& a, int n, int p) const {
    std::mt19937 gen(1729);
    std::vector<double> v(n), av(n);
    for (auto& x : v) {
      const std::uint32_t hi = gen() >> 5, lo = gen() >> 6;
      x = -1.0 + 2.0 * ((hi * 67108864.0 + lo) / 9007199254740992.0);
    }
    double lambda = 0;
    for (int it = 0; it < 100; ++it) {
      const double nv = norm(v);
      for (auto& x : v) x /= nv;
      for (int i = 0; i < n; ++i) {
        av[i] = 0;
        for (int j = 0; j < n; ++j) av[i] += a[i * n + j] * v[j];
      }
      double next = 0;
      for (int i = 0; i < n; ++i) next += v[i] * av[i];
      const bool run = std::fabs(next - lambda) > 1e-6;
      lambda = next;
      v = av;
      if (!run) break;
    }
    const double ridge = m_o.matrix_epsilon * std::max(lambda, 1e-6);
    if (n == 1) return {{std::pow(a[0] + ridge, -1.0 / p)}, 0.0};
    const auto matmul = [n](const std::vector<double>& x, const std::vector<double>& y) {
      std::vector<double> z(n * n, 0.0);
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k)
          for (int j = 0; j < n; ++j) z[i * n + j] += x[i * n + k] * y[k * n + j];
      return z;
    };
    const auto error_of = [n](const std::vector<double>& m) {
      double e = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) e = std::max(e, std::fabs(m[i * n + j] - (i == j ? 1.0 : 0.0)));
      return e;
    };
    std::vector<double> damped = a;
    for (int i = 0; i < n; ++i) damped[i * n + i] += ridge;
    const double z = (1.0 + p) / (2.0 * norm(damped));
    std::vector<double> m(n * n), h(n * n, 0.0);
    for (int k = 0; k < n * n; ++k) m[k] = damped[k] * z;
    for (int i = 0; i < n; ++i) h[i * n + i] = std::pow(z, 1.0 / p);
    const double alpha = -1.0 / p;
    double error = error_of(m), ratio = 1.0;
    std::vector<double> old_h = h;
    for (int it = 0; it < m_o.root_max_iterations && error > m_o.root_tolerance && ratio < 1.2; ++it) {
      std::vector<double> t(n * n);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) t[i * n + j] = alpha * m[i * n + j] + (i == j ? 1.0 - alpha : 0.0);
      std::vector<double> power(n * n, 0.0);
      for (int i = 0; i < n; ++i) power[i * n + i] = 1.0;
      for (int k = 0; k < p; ++k) power = matmul(power, t);
      m = matmul(power, m);
      old_h = h;
      h = matmul(h, t);
      const double next = error_of(m);
      ratio = next / error;
      error = next;
    }
    return {ratio < 1.2 ? h : old_h, error};
  }

 private:
  ReferenceOptions m_o;
  std::vector<Param> m_params;
  long m_count = 0;
};

}  // namespace lather::test
