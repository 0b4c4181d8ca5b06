#pragma once
// Kernels of the Shampoo step: block packing and the element-wise graft, momentum and update
// passes, following the reference's `_transform_grad` term by term.

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/partition.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lather::optim::Impl {

namespace kmath = ::lather::Impl::kmath;

constexpr int max_block_rank = 8;

/// A parameter's blocks on the device: per block its packed offset, per-dimension offsets and
/// sizes; plus the strides of the interpreted shape.
template <class MemorySpace>
struct BlockTable {
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, MemorySpace> table;  // [blocks, 1 + 2 * rank]
  std::int64_t strides[max_block_rank] = {};
  int rank = 0;
  int blocks = 0;
};

/// The table of `blocks` of a tensor of (interpreted) shape `shape`, uploaded on `space`.
template <class ExecutionSpace, class MemorySpace = typename ExecutionSpace::memory_space>
BlockTable<MemorySpace> make_block_table(const ExecutionSpace& space, const TensorShape& shape,
                                         const std::vector<Block>& blocks, const std::string& label) {
  BlockTable<MemorySpace> t;
  t.rank = int(shape.size());
  t.blocks = int(blocks.size());
  LATHER_REQUIRE(t.rank <= max_block_rank, "Shampoo supports tensors of rank <= ", max_block_rank,
                 " after shape interpretation, got ", t.rank, " for ", label);
  std::int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= shape[d];
  }
  t.table = Kokkos::View<std::int64_t**, Kokkos::LayoutRight, MemorySpace>(
      Kokkos::view_alloc(space, "Lather::Shampoo::block_table"), std::max(t.blocks, 1), 1 + 2 * t.rank);
  auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), t.table);
  for (int b = 0; b < t.blocks; ++b) {
    const auto& block = blocks[b];
    host(b, 0) = block.packed_offset;
    for (int d = 0; d < t.rank; ++d) {
      host(b, 1 + d) = block.offset[d];
      host(b, 1 + t.rank + d) = block.size[d];
    }
  }
  Kokkos::deep_copy(space, t.table, host);
  ::lather::Impl::fence(space, "Lather::Shampoo::make_block_table: uploaded");
  return t;
}

/// Tensor strides captured by value into repack_blocks' kernel. At namespace scope because nvcc
/// rejects a function-local type in the captures of an extended __host__ __device__ lambda.
struct BlockStrides {
  std::int64_t s[max_block_rank];
};

/// Moves elements between a tensor (row-major in its interpreted shape) and the packed buffer in
/// which every block is contiguous and row-major. to_packed: packed = Out(tensor); else the reverse.
template <class ExecutionSpace, class In, class Out, class MemorySpace>
void repack_blocks(const ExecutionSpace& space, const BlockTable<MemorySpace>& t, bool to_packed,
                   const Kokkos::View<const In*, MemorySpace>& from,
                   const Kokkos::View<Out*, MemorySpace>& to) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  const auto table = t.table;
  const int rank = t.rank;
  BlockStrides st;  // captured by value into the kernel
  for (int d = 0; d < max_block_rank; ++d) st.s[d] = t.strides[d];
  Kokkos::parallel_for(
      "Lather::Shampoo::repack_blocks", Kokkos::TeamPolicy<ExecutionSpace>(space, t.blocks, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const int b = member.league_rank();
        const std::int64_t packed = table(b, 0);
        const std::int64_t last = table(b, 2 * rank);  // size of the last dimension
        std::int64_t rows = 1;
        for (int d = 0; d < rank - 1; ++d) rows *= table(b, 1 + rank + d);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, rows), [&](std::int64_t row) {
          // Global offset of this row of the block: decompose row over dims 0..rank-2.
          std::int64_t rest = row, global = table(b, 1 + rank - 1) * st.s[rank - 1];
          for (int d = rank - 2; d >= 0; --d) {
            const std::int64_t extent = table(b, 1 + rank + d);
            global += (table(b, 1 + d) + rest % extent) * st.s[d];
            rest /= extent;
          }
          const std::int64_t base = packed + row * last;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, last), [&](std::int64_t j) {
            if (to_packed)
              to(base + j) = Out(from(global + j));
            else
              to(global + j) = Out(from(base + j));
          });
        });
      });
}

/// Sum of squares, accumulated in double (so that squares of any finite float stay finite: the
/// result is finite exactly when every entry is). On the host the loop runs in eight independent
/// lanes per chunk, which the compiler vectorizes; a plain reduction would not be.
template <class ExecutionSpace, class T, class MemorySpace>
double squared_norm(const ExecutionSpace& space, const Kokkos::View<const T*, MemorySpace>& x) {
  const std::int64_t n = std::int64_t(x.extent(0));
  double sum = 0;
  if constexpr (::lather::Impl::host_accessible<MemorySpace>) {
    constexpr std::int64_t chunk = 1024;
    const T* data = x.data();
    Kokkos::parallel_reduce(
        "Lather::Shampoo::squared_norm", Kokkos::RangePolicy<ExecutionSpace>(space, 0, (n + chunk - 1) / chunk),
        KOKKOS_LAMBDA(std::int64_t c, double& acc) {
          const std::int64_t begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
          double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          std::int64_t k = begin;
          for (; k + 8 <= end; k += 8)
            for (int j = 0; j < 8; ++j) lanes[j] += double(data[k + j]) * double(data[k + j]);
          double rest = 0;
          for (; k < end; ++k) rest += double(data[k]) * double(data[k]);
          acc += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + rest;
        },
        sum);
  } else {
    Kokkos::parallel_reduce(
        "Lather::Shampoo::squared_norm", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n),
        KOKKOS_LAMBDA(std::int64_t k, double& acc) { acc += double(x(k)) * double(x(k)); }, sum);
  }
  return sum;
}

/// The scalars of one parameter's update, as the reference computes them.
template <class T>
struct UpdateScalars {
  int graft = 0;  // GraftType as int
  T beta1 = 0, w1 = 0, w2 = 0, diagonal_epsilon = 0;
  T graft_multiplier = 1;    // lr unless decoupled_learning_rate; times 1/clipping denominator
  T gradient_scale = 1;      // 1 / (|g| + 1e-16) for the normalized grafts
  T shampoo_multiplier = 1;  // |graft| / (|preconditioned| + 1e-16)
  T weight_decay = 0;
  bool decoupled_weight_decay = false;
  T momentum_weight = 1;  // 1 - beta1 with moving_average_for_momentum
  bool run_shampoo = false;
  bool nesterov = false;
  T lr = 0;
  T update_multiplier = 1;  // lr when decoupled_learning_rate
};

/// First pass: the graft direction (before multipliers) into `graft`, the new diagonal statistics
/// into `diagonal` (AdaGrad and RMSProp grafts).
template <class ExecutionSpace, class T, class MemorySpace>
void graft_direction(const ExecutionSpace& space, const UpdateScalars<T>& s,
                     const Kokkos::View<const T*, MemorySpace>& grad,
                     const Kokkos::View<T*, MemorySpace>& diagonal,
                     const Kokkos::View<T*, MemorySpace>& graft) {
  // GraftType: 0 sgd, 1 adagrad, 2 rmsprop, 3 rmsprop_normalized, 4 sqrt_n, 5 adagrad_normalized
  const int kind = s.graft;
  const T scale = s.gradient_scale, w1 = s.w1, w2 = s.w2, eps = s.diagonal_epsilon;
  Kokkos::parallel_for(
      "Lather::Shampoo::graft_direction", Kokkos::RangePolicy<ExecutionSpace>(space, 0, grad.extent(0)),
      KOKKOS_LAMBDA(std::int64_t k) {
        const T g = grad(k);
        if (kind == 1 || kind == 5) {
          const T sg = kind == 5 ? g * scale : g;
          const T d = diagonal(k) + sg * sg;
          diagonal(k) = d;
          graft(k) = sg / (kmath::sqrt(d) + eps);
        } else if (kind == 2 || kind == 3) {
          const T sg = kind == 3 ? g * scale : g;
          const T d = w1 * diagonal(k) + w2 * sg * sg;
          diagonal(k) = d;
          graft(k) = sg / (kmath::sqrt(d) + eps);
        } else if (kind == 4) {
          graft(k) = g > T(0) ? T(1) : (g < T(0) ? T(-1) : T(0));
        } else {
          graft(k) = g;
        }
      });
}

/// Final pass: momentum, Nesterov, weight decay and the parameter update, term by term as the
/// reference's _transform_grad; `direction` is the preconditioned gradient (or the graft again
/// for parameters Shampoo skips). momentum / diagonal_momentum are updated in place.
template <class ExecutionSpace, class T, class MemorySpace>
void apply_update(const ExecutionSpace& space, const UpdateScalars<T>& s,
                  const Kokkos::View<const T*, MemorySpace>& graft,
                  const Kokkos::View<const T*, MemorySpace>& direction,
                  const Kokkos::View<T*, MemorySpace>& momentum,
                  const Kokkos::View<T*, MemorySpace>& diagonal_momentum,
                  const Kokkos::View<T*, MemorySpace>& param) {
  const UpdateScalars<T> c = s;
  Kokkos::parallel_for(
      "Lather::Shampoo::apply_update", Kokkos::RangePolicy<ExecutionSpace>(space, 0, param.extent(0)),
      KOKKOS_LAMBDA(std::int64_t k) {
        const T p = param(k);
        const T grafting_update = graft(k) * c.graft_multiplier;
        const T shampoo_update = direction(k) * c.shampoo_multiplier;
        T shampoo_with_wd = shampoo_update, grafting_with_wd = grafting_update;
        if (c.weight_decay != T(0) && !c.decoupled_weight_decay) {
          shampoo_with_wd = shampoo_update + c.weight_decay * p;
          grafting_with_wd = grafting_update + c.weight_decay * p;
        }
        const T shampoo_momentum = momentum(k) * c.beta1 + c.momentum_weight * shampoo_with_wd;
        const T grafting_momentum = diagonal_momentum(k) * c.beta1 + c.momentum_weight * grafting_with_wd;
        const T momentum_update = c.run_shampoo ? shampoo_momentum : grafting_momentum;
        const T wd_update = c.run_shampoo ? shampoo_with_wd : grafting_with_wd;
        T nesterov_update = momentum_update;
        if (c.nesterov) nesterov_update = c.momentum_weight * wd_update + c.beta1 * momentum_update;
        if (c.weight_decay != T(0) && c.decoupled_weight_decay)
          nesterov_update = nesterov_update + c.lr * c.weight_decay * p;
        param(k) = p + T(-1) * c.update_multiplier * nesterov_update;
        momentum(k) = shampoo_momentum;
        diagonal_momentum(k) = grafting_momentum;
      });
}

}  // namespace lather::optim::Impl
