#pragma once
// The element-wise passes of a Shampoo step over a UnitTable, one kernel each:
//   pack     gradient -> packed buffer(s), and each unit's squared gradient norm;
//   graft    the graft direction (over the packed gradient) and new diagonal statistics, and
//            each unit's squared norms of the graft and of the preconditioned direction;
//   update   momentum, Nesterov, weight decay and the new parameter values, term by term as the
//            reference's _transform_grad; int8 momentum is dequantized and requantized inline
//            (its column scales from a preceding column_maxima pass of the same arithmetic);
//   scatter  packed values -> parameters.
// Each pass works on runs of elements (shampoo_kernels.hpp: a row of a block on the host, one
// element per lane on a device) with the scalars in locals and restrict pointers, so that the
// host loops vectorise. A pass is a functor over one unit, called with a team member, or on a
// host backend with a HostUnit by the host threads that share the units out (run_units):
// one body either way (nvcc rejects a generic __host__ __device__ lambda). column_maxima, whose
// atomics have to be Kokkos's, stays a lambda in teams.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/optim/impl/shampoo_kernels.hpp>
#include <lather/optim/quantization.hpp>

#include <Kokkos_Core.hpp>

#include <type_traits>

namespace lather::optim::Impl {

template <class MemorySpace>
using Norms = Kokkos::View<SquaredNorms*, MemorySpace>;

/// What a pass over the parameters' tensors reads: the units, the tensors (gradients or values)
/// through their pointers, and the per-parameter scalars.
template <class Scalar, class MemorySpace>
struct TensorUnits {
  using Table = UnitTable<MemorySpace>;
  Table table;
  Kokkos::View<const std::uintptr_t*, MemorySpace> tensors;
  Kokkos::View<const ParameterScalars<Scalar>*, MemorySpace> per_parameter;
};

/// packed(i) = gradient, and (when `packed_t` is not empty) packed_t(i) = T(gradient) for the
/// preconditioned units; norms(k).plain = squared norm of unit k's gradient. `host_threads`: see
/// run_units.
template <class ExecutionSpace, class Scalar, class T, class MemorySpace>
struct PackPass : TensorUnits<Scalar, MemorySpace> {
  using Table = UnitTable<MemorySpace>;
  Kokkos::View<Scalar*, MemorySpace> packed;
  Kokkos::View<T*, MemorySpace> packed_t;
  Norms<MemorySpace> norms;
  bool convert;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const auto& [table, gradients, per_parameter] = static_cast<const TensorUnits<Scalar, MemorySpace>&>(*this);
    const int k = member.league_rank();
    const int p = int(table.units(k, Table::parameter));
    const Scalar* g = tensor<Scalar>(gradients(p));
    const bool to_t = convert && per_parameter(p).preconditioned;
    const SquaredNorms total = reduce_unit_runs<ExecutionSpace>(
        member, table, k, [&](std::int64_t i, std::int64_t flat, std::int64_t n, SquaredNorms& s) {
          const Scalar* KOKKOS_RESTRICT from = g + flat;
          Scalar* KOKKOS_RESTRICT to = packed.data() + i;
          for (std::int64_t e = 0; e < n; ++e) to[e] = from[e];
          if (to_t) {
            T* KOKKOS_RESTRICT to_t_ = packed_t.data() + i;
            for (std::int64_t e = 0; e < n; ++e) to_t_[e] = T(from[e]);
          }
          s.plain += sum_of_squares(from, n);
        });
    once_per_unit(member, [&] { norms(k) = total; });
  }
};

template <class ExecutionSpace, class Scalar, class T, class MemorySpace>
void pack_gradients(const ExecutionSpace& space, const UnitTable<MemorySpace>& table,
                    const Kokkos::View<const std::uintptr_t*, MemorySpace>& gradients,
                    const Kokkos::View<const ParameterScalars<Scalar>*, MemorySpace>& per_parameter,
                    const Kokkos::View<Scalar*, MemorySpace>& packed, const Kokkos::View<T*, MemorySpace>& packed_t,
                    const Norms<MemorySpace>& norms, int host_threads = 1) {
  const PackPass<ExecutionSpace, Scalar, T, MemorySpace> pass{
      {table, gradients, per_parameter}, packed, packed_t, norms, packed_t.extent(0) > 0};
  run_units(space, "Lather::Shampoo::pack", table.count, host_threads, pass);
}

/// The graft direction (before multipliers) replaces the packed gradient in `graft` (nothing
/// reads the gradient after this pass, and one buffer fewer keeps a step's working set in cache),
/// and the graft's diagonal statistics are updated in place; norms(k) = {squared norm of the
/// graft, squared norm of the preconditioned direction (preconditioned units)}.
template <class ExecutionSpace, class Scalar, class T, class MemorySpace>
struct GraftPass {
  using Table = UnitTable<MemorySpace>;
  Table table;
  Kokkos::View<const ParameterScalars<Scalar>*, MemorySpace> per_parameter;
  Kokkos::View<const T*, MemorySpace> direction;
  Kokkos::View<Scalar*, MemorySpace> diagonal, graft;
  Norms<MemorySpace> norms;
  int kind;  // GraftType: 0 sgd, 1 adagrad, 2 rmsprop, 3 rmsprop_normalized, 4 sqrt_n, 5 adagrad_normalized
  Scalar w1, w2, eps;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const int k = member.league_rank();
    const auto& pp = per_parameter(int(table.units(k, Table::parameter)));
    const bool preconditioned = pp.preconditioned;
    // The normalized grafts scale the gradient by 1 / |g|; the others leave it.
    const Scalar scale = (kind == 3 || kind == 5) ? pp.gradient_scale : Scalar(1);
    // AdaGrad sums the squares (weights 1, 1); RMSProp blends them (w1, w2).
    const Scalar d1 = (kind == 1 || kind == 5) ? Scalar(1) : w1, d2 = (kind == 1 || kind == 5) ? Scalar(1) : w2;
    const Scalar epsilon = eps;
    const int graft_kind = kind;
    const SquaredNorms total = reduce_unit_runs<ExecutionSpace>(
        member, table, k, [&](std::int64_t i, std::int64_t, std::int64_t n, SquaredNorms& s) {
          Scalar* KOKKOS_RESTRICT x = graft.data() + i;  // the gradient in, the graft out
          if ((graft_kind >= 1 && graft_kind <= 3) || graft_kind == 5) {
            Scalar* KOKKOS_RESTRICT diag = diagonal.data() + i;
            if (scale == Scalar(1)) {
              for (std::int64_t e = 0; e < n; ++e) {
                const Scalar sg = x[e];
                const Scalar d = d1 * diag[e] + d2 * sg * sg;
                diag[e] = d;
                x[e] = sg / (kmath::sqrt(d) + epsilon);
              }
            } else {
              for (std::int64_t e = 0; e < n; ++e) {
                const Scalar sg = x[e] * scale;
                const Scalar d = d1 * diag[e] + d2 * sg * sg;
                diag[e] = d;
                x[e] = sg / (kmath::sqrt(d) + epsilon);
              }
            }
          } else if (graft_kind == 4) {
            for (std::int64_t e = 0; e < n; ++e)
              x[e] = x[e] > Scalar(0) ? Scalar(1) : (x[e] < Scalar(0) ? Scalar(-1) : Scalar(0));
          }
          s.plain += sum_of_squares(graft.data() + i, n);
          if (preconditioned) s.preconditioned += sum_of_squares(direction.data() + i, n);
        });
    once_per_unit(member, [&] { norms(k) = total; });
  }
};

template <class ExecutionSpace, class Scalar, class T, class MemorySpace>
void graft_and_norms(const ExecutionSpace& space, const UnitTable<MemorySpace>& table, const StepScalars<Scalar>& c,
                     const Kokkos::View<const ParameterScalars<Scalar>*, MemorySpace>& per_parameter,
                     const Kokkos::View<const T*, MemorySpace>& direction,
                     const Kokkos::View<Scalar*, MemorySpace>& diagonal,
                     const Kokkos::View<Scalar*, MemorySpace>& graft, const Norms<MemorySpace>& norms,
                     int host_threads = 1) {
  const GraftPass<ExecutionSpace, Scalar, T, MemorySpace> pass{
      table, per_parameter, direction, diagonal, graft, norms, c.graft, c.w1, c.w2, c.diagonal_epsilon};
  run_units(space, "Lather::Shampoo::graft", table.count, host_threads, pass);
}

/// direction[packed_k, packed_k + elements_k) *= scales(k) for each unit k of the table: per-block
/// grafting's rescaling of each block's preconditioned direction to its graft's norm (a unit's
/// packed values are contiguous). Units with a scale of 1 are left alone.
template <class ExecutionSpace, class T, class MemorySpace>
void scale_units(const ExecutionSpace& space, const UnitTable<MemorySpace>& table,
                 const Kokkos::View<const double*, MemorySpace>& scales,
                 const Kokkos::View<T*, MemorySpace>& direction) {
  using Table = UnitTable<MemorySpace>;
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  const auto units = table.units;
  Kokkos::parallel_for(
      "Lather::Shampoo::block_graft", Policy(space, table.count, Kokkos::AUTO),
      KOKKOS_LAMBDA(const typename Policy::member_type& member) {
        const int k = member.league_rank();
        const double scale = scales(k);
        if (scale == 1.0) return;
        const std::int64_t begin = units(k, Table::packed), n = units(k, Table::elements);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n),
                             [&](std::int64_t e) { direction(begin + e) = T(double(direction(begin + e)) * scale); });
      });
}

/// The per-element update. For parameters whose momentum is int8, the momentum values are read
/// from codes * old scale and their new codes are written with the new scale (max |m| of the
/// column / 127, from column_maxima); otherwise read and written in float.
template <class Scalar, class T, class MemorySpace>
struct UpdateElement {
  StepScalars<Scalar> c;
  Kokkos::View<const Scalar*, MemorySpace> graft;
  Kokkos::View<const T*, MemorySpace> direction;
  Kokkos::View<Scalar*, MemorySpace> momentum, diagonal_momentum;
  Kokkos::View<std::int8_t*, MemorySpace> momentum_codes, diagonal_momentum_codes;
  Kokkos::View<const Scalar*, MemorySpace> old_scales, old_diagonal_scales;
  Kokkos::View<Scalar*, MemorySpace> new_scales, new_diagonal_scales;

  /// The new momentum values and the update of one element: graft and preconditioned direction
  /// g, d, old momentum values old_m, old_dm, parameter value x. `c` is the caller's local copy.
  KOKKOS_FORCEINLINE_FUNCTION static void compute(const StepScalars<Scalar>& c, Scalar graft_multiplier,
                                                  Scalar shampoo_multiplier, Scalar g, Scalar d, Scalar old_m,
                                                  Scalar old_dm, Scalar x, Scalar& m, Scalar& dm, Scalar& update) {
    const Scalar grafting_update = g * graft_multiplier;
    const Scalar shampoo_update = d * shampoo_multiplier;
    Scalar shampoo_with_wd = shampoo_update, grafting_with_wd = grafting_update;
    if (c.weight_decay != Scalar(0) && !c.decoupled_weight_decay) {
      shampoo_with_wd = shampoo_update + c.weight_decay * x;
      grafting_with_wd = grafting_update + c.weight_decay * x;
    }
    m = old_m * c.beta1 + c.momentum_weight * shampoo_with_wd;
    dm = old_dm * c.beta1 + c.momentum_weight * grafting_with_wd;
    const Scalar momentum_update = c.run_shampoo ? m : dm;
    const Scalar wd_update = c.run_shampoo ? shampoo_with_wd : grafting_with_wd;
    Scalar nesterov_update = momentum_update;
    if (c.nesterov) nesterov_update = c.momentum_weight * wd_update + c.beta1 * momentum_update;
    if (c.weight_decay != Scalar(0) && c.decoupled_weight_decay)
      nesterov_update = nesterov_update + c.lr * c.weight_decay * x;
    update = Scalar(-1) * c.update_multiplier * nesterov_update;
  }

  /// The update of one element once Shampoo runs (c.run_shampoo), from the preconditioned
  /// direction d alone: compute()'s result for m and the update, term by term. The graft's own
  /// momentum (dm) feeds the update only before start_preconditioning_step, so from then on the
  /// float path stops updating it: neither the graft nor dm is read or written (6 streams per
  /// preconditioned value instead of 9; docs/reference/optimizer.md, differences).
  KOKKOS_FORCEINLINE_FUNCTION static void compute_shampoo(const StepScalars<Scalar>& c, Scalar shampoo_multiplier,
                                                          Scalar d, Scalar old_m, Scalar x, Scalar& m, Scalar& update) {
    const Scalar shampoo_update = d * shampoo_multiplier;
    Scalar shampoo_with_wd = shampoo_update;
    if (c.weight_decay != Scalar(0) && !c.decoupled_weight_decay) shampoo_with_wd = shampoo_update + c.weight_decay * x;
    m = old_m * c.beta1 + c.momentum_weight * shampoo_with_wd;
    Scalar nesterov_update = m;
    if (c.nesterov) nesterov_update = c.momentum_weight * shampoo_with_wd + c.beta1 * m;
    if (c.weight_decay != Scalar(0) && c.decoupled_weight_decay)
      nesterov_update = nesterov_update + c.lr * c.weight_decay * x;
    update = Scalar(-1) * c.update_multiplier * nesterov_update;
  }

  /// The update of a run of n elements whose momentum is float: graft g, direction d (g itself
  /// on the graft path), momentum m and dm and parameters x updated in place, the new values also
  /// written to out (AlsoOut). Restrict parameters: every array is reached through one pointer,
  /// so the loop vectorises. ShampooOnly: compute_shampoo, g and dm untouched.
  template <bool AlsoOut, bool ShampooOnly, class D>
  KOKKOS_FORCEINLINE_FUNCTION static void float_run(const StepScalars<Scalar>& c, Scalar gm, Scalar sm,
                                                    const Scalar* KOKKOS_RESTRICT g, const D* KOKKOS_RESTRICT d,
                                                    Scalar* KOKKOS_RESTRICT m, Scalar* KOKKOS_RESTRICT dm,
                                                    Scalar* KOKKOS_RESTRICT x, Scalar* KOKKOS_RESTRICT out,
                                                    std::int64_t n) {
    for (std::int64_t e = 0; e < n; ++e) {
      Scalar new_m, new_dm, u;
      if constexpr (ShampooOnly) {
        (void)g, (void)dm, (void)gm, (void)new_dm;
        compute_shampoo(c, sm, Scalar(d[e]), m[e], x[e], new_m, u);
      } else {
        compute(c, gm, sm, g[e], Scalar(d[e]), m[e], dm[e], x[e], new_m, new_dm, u);
        dm[e] = new_dm;
      }
      m[e] = new_m;
      const Scalar value = x[e] + u;
      x[e] = value;
      if constexpr (AlsoOut) out[e] = value;
    }
  }

  template <bool ShampooOnly, class D>
  KOKKOS_FORCEINLINE_FUNCTION static void float_run(const StepScalars<Scalar>& c, Scalar gm, Scalar sm, const Scalar* g,
                                                    const D* d, Scalar* m, Scalar* dm, Scalar* x, Scalar* out,
                                                    std::int64_t n) {
    if (out)
      float_run<true, ShampooOnly>(c, gm, sm, g, d, m, dm, x, out, n);
    else
      float_run<false, ShampooOnly>(c, gm, sm, g, d, m, dm, x, nullptr, n);
  }

  /// The float-momentum update of the run at packed index i, state index `at`, parameter values x
  /// (and a copy of the new values to `out` unless null).
  KOKKOS_INLINE_FUNCTION void update_float(const ParameterScalars<Scalar>& pp, std::int64_t i, std::int64_t at,
                                           std::int64_t n, Scalar* x, Scalar* out) const {
    const StepScalars<Scalar> local = c;
    const Scalar gm = pp.graft_multiplier, sm = pp.shampoo_multiplier;
    const Scalar* g = graft.data() + i;
    Scalar* m = momentum.data() + at;
    Scalar* dm = diagonal_momentum.data() + at;
    // The units that skip preconditioning take the graft as their direction (the reference's
    // precond_grad = grafting_update), so their graft is read either way.
    if (pp.preconditioned && local.run_shampoo)
      float_run<true>(local, gm, sm, g, direction.data() + i, m, dm, x, out, n);
    else if (pp.preconditioned)
      float_run<false>(local, gm, sm, g, direction.data() + i, m, dm, x, out, n);
    else if (local.run_shampoo)
      float_run<true>(local, gm, sm, g, g, m, dm, x, out, n);
    else
      float_run<false>(local, gm, sm, g, g, m, dm, x, out, n);
  }

  /// f(e, m, dm, update) for the n elements of a run whose momentum is int8: packed index i + e,
  /// state index at + e, flat index flat + e, parameter value x[e]; the momentum dequantized with
  /// the current column scales.
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_quantized_run(const ParameterScalars<Scalar>& pp, std::int64_t i, std::int64_t at,
                                                std::int64_t flat, std::int64_t n, const Scalar* x, const F& f) const {
    const StepScalars<Scalar> local = c;
    const Scalar gm = pp.graft_multiplier, sm = pp.shampoo_multiplier;
    for (std::int64_t e = 0; e < n; ++e) {
      const std::int64_t column = pp.column_base + (flat + e) % pp.columns;
      const Scalar g = graft(i + e);
      const Scalar d = pp.preconditioned ? Scalar(direction(i + e)) : g;
      Scalar m, dm, u;
      compute(local, gm, sm, g, d, Scalar(momentum_codes(at + e)) * old_scales(column),
              Scalar(diagonal_momentum_codes(at + e)) * old_diagonal_scales(column), x[e], m, dm, u);
      f(e, m, dm, u);
    }
  }

  /// quantize_columns' rounding: code = nearbyint(v / scale), scale = max |v| / 127 (1 for 0).
  KOKKOS_INLINE_FUNCTION static std::int8_t code(Scalar v, Scalar scale) {
    return std::int8_t(kmath::nearbyint(v / (scale > Scalar(0) ? scale : Scalar(1))));
  }
};

/// new_scales(column) = max over the column of |new momentum| / 127 for the quantized parameters
/// (the same arithmetic as update_parameters, which then uses them). The scale Views must be zero.
template <class ExecutionSpace, class Scalar, class T, class MemorySpace>
void column_maxima(const ExecutionSpace& space, const UnitTable<MemorySpace>& table,
                   const Kokkos::View<const std::uintptr_t*, MemorySpace>& values,
                   const Kokkos::View<const ParameterScalars<Scalar>*, MemorySpace>& per_parameter,
                   const UpdateElement<Scalar, T, MemorySpace>& element) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using Table = UnitTable<MemorySpace>;
  if (table.count == 0) return;
  Kokkos::parallel_for(
      "Lather::Shampoo::column_maxima", Kokkos::TeamPolicy<ExecutionSpace>(space, table.count, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const int k = member.league_rank();
        const int p = int(table.units(k, Table::parameter));
        const auto& pp = per_parameter(p);
        if (!pp.quantized) return;
        const Scalar* x = tensor<Scalar>(values(p));
        const std::int64_t state = table.units(k, Table::state) - table.units(k, Table::packed);
        for_unit_runs<ExecutionSpace>(member, table, k, [&](std::int64_t i, std::int64_t flat, std::int64_t n) {
          element.for_quantized_run(
              pp, i, state + i, flat, n, x + flat, [&](std::int64_t e, Scalar m, Scalar dm, Scalar) {
                const std::int64_t column = pp.column_base + (flat + e) % pp.columns;
                Kokkos::atomic_fetch_max(&element.new_scales(column), kmath::fabs(m) / Scalar(max_code<std::int8_t>()));
                Kokkos::atomic_fetch_max(&element.new_diagonal_scales(column),
                                         kmath::fabs(dm) / Scalar(max_code<std::int8_t>()));
              });
        });
      });
}

/// The update of every element of the table's units: new momentum stored, the parameters updated
/// in place and, when `out` is not empty, the new values also written to `out` at the unit's
/// place in the exchange segment.
template <class ExecutionSpace, class Scalar, class T, class MemorySpace>
struct UpdatePass : TensorUnits<Scalar, MemorySpace> {
  using Table = UnitTable<MemorySpace>;
  UpdateElement<Scalar, T, MemorySpace> element;
  Kokkos::View<Scalar*, MemorySpace> out;
  bool copy_out;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const auto& [table, values, per_parameter] = static_cast<const TensorUnits<Scalar, MemorySpace>&>(*this);
    const int k = member.league_rank();
    const int p = int(table.units(k, Table::parameter));
    const auto& pp = per_parameter(p);
    Scalar* x = tensor<Scalar>(values(p));
    const std::int64_t state = table.units(k, Table::state) - table.units(k, Table::packed);
    const std::int64_t exchange = table.units(k, Table::exchange) - table.units(k, Table::packed);
    for_unit_runs<ExecutionSpace>(member, table, k, [&](std::int64_t i, std::int64_t flat, std::int64_t n) {
      Scalar* target = copy_out ? out.data() + exchange + i : nullptr;
      if (!pp.quantized) {
        element.update_float(pp, i, state + i, n, x + flat, target);
        return;
      }
      std::int8_t* m1 = element.momentum_codes.data() + state + i;
      std::int8_t* dm1 = element.diagonal_momentum_codes.data() + state + i;
      element.for_quantized_run(pp, i, state + i, flat, n, x + flat,
                                [&](std::int64_t e, Scalar m, Scalar dm, Scalar u) {
                                  const std::int64_t column = pp.column_base + (flat + e) % pp.columns;
                                  m1[e] = element.code(m, element.new_scales(column));
                                  dm1[e] = element.code(dm, element.new_diagonal_scales(column));
                                  const Scalar value = x[flat + e] + u;
                                  x[flat + e] = value;
                                  if (target) target[e] = value;
                                });
    });
  }
};

template <class ExecutionSpace, class Scalar, class T, class MemorySpace>
void update_parameters(const ExecutionSpace& space, const UnitTable<MemorySpace>& table,
                       const Kokkos::View<const std::uintptr_t*, MemorySpace>& values,
                       const Kokkos::View<const ParameterScalars<Scalar>*, MemorySpace>& per_parameter,
                       const UpdateElement<Scalar, T, MemorySpace>& element,
                       const Kokkos::View<Scalar*, MemorySpace>& out, int host_threads = 1) {
  const UpdatePass<ExecutionSpace, Scalar, T, MemorySpace> pass{
      {table, values, per_parameter}, element, out, out.extent(0) > 0};
  run_units(space, "Lather::Shampoo::update", table.count, host_threads, pass);
}

/// values(flat) = packed(packed index) for every element of the table's units (Gather false), or
/// the inverse, packed(packed index) = values(flat) (Gather true: state arrays in and out of
/// checkpoints).
template <class ExecutionSpace, class Scalar, class Packed, class MemorySpace, bool Gather>
struct CopyPass {
  using Table = UnitTable<MemorySpace>;
  Table table;
  Kokkos::View<const std::uintptr_t*, MemorySpace> values;
  Kokkos::View<std::conditional_t<Gather, Packed, const Packed>*, MemorySpace> packed;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const int k = member.league_rank();
    Scalar* x = tensor<Scalar>(values(int(table.units(k, Table::parameter))));
    for_unit_runs<ExecutionSpace>(member, table, k, [&](std::int64_t i, std::int64_t flat, std::int64_t n) {
      Scalar* KOKKOS_RESTRICT v = x + flat;
      auto* KOKKOS_RESTRICT q = packed.data() + i;
      if constexpr (Gather)
        for (std::int64_t e = 0; e < n; ++e) q[e] = Packed(v[e]);
      else
        for (std::int64_t e = 0; e < n; ++e) v[e] = Scalar(q[e]);
    });
  }
};

/// values(flat) = packed(packed index) for every element of the table's units.
template <class ExecutionSpace, class Scalar, class Packed, class MemorySpace>
void scatter(const ExecutionSpace& space, const UnitTable<MemorySpace>& table,
             const Kokkos::View<const std::uintptr_t*, MemorySpace>& values,
             const Kokkos::View<const Packed*, MemorySpace>& packed, int host_threads = 1) {
  const CopyPass<ExecutionSpace, Scalar, Packed, MemorySpace, false> pass{table, values, packed};
  run_units(space, "Lather::Shampoo::scatter", table.count, host_threads, pass);
}

/// packed(packed index) = values(flat): the inverse of scatter (state arrays in and out of
/// checkpoints).
template <class ExecutionSpace, class Scalar, class Packed, class MemorySpace>
void gather(const ExecutionSpace& space, const UnitTable<MemorySpace>& table,
            const Kokkos::View<const std::uintptr_t*, MemorySpace>& values,
            const Kokkos::View<Packed*, MemorySpace>& packed) {
  const CopyPass<ExecutionSpace, Scalar, Packed, MemorySpace, true> pass{table, values, packed};
  run_units(space, "Lather::Shampoo::gather", table.count, 1, pass);
}

}  // namespace lather::optim::Impl
