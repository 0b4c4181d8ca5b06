#pragma once
// The element-wise passes of a Shampoo step, each one kernel over all the units a rank updates
// (whatever the parameters they belong to): gather the gradient into the packed buffer (with its
// squared norms), the graft direction (with the squared norms grafting needs), the momentum and
// parameter update following the reference's `_transform_grad` term by term, and the scatter of
// packed values back into the parameters. Units are described on the device by a UnitTable; the
// parameters are reached through a table of their pointers.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/host_threads.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace lather::optim::Impl {

namespace kmath = ::lather::Impl::kmath;

constexpr int max_block_rank = 8;

/// The two squared norms grafting needs, in double, reduced together inside a team: `plain` of
/// the vector before preconditioning (the gradient after packing, the graft after the graft
/// pass), `preconditioned` of Shampoo's direction.
struct SquaredNorms {
  double plain = 0, preconditioned = 0;
  SquaredNorms() = default;
  KOKKOS_INLINE_FUNCTION SquaredNorms(double x, double y) : plain(x), preconditioned(y) {}
  KOKKOS_INLINE_FUNCTION SquaredNorms& operator+=(const SquaredNorms& other) {
    plain += other.plain;
    preconditioned += other.preconditioned;
    return *this;
  }
#if KOKKOS_VERSION < 40000
  // Kokkos 3 reduces custom types through volatile references on some backends.
  KOKKOS_INLINE_FUNCTION void operator+=(const volatile SquaredNorms& other) volatile {
    plain += other.plain;
    preconditioned += other.preconditioned;
  }
#endif
};

}  // namespace lather::optim::Impl

namespace Kokkos {
template <>
struct reduction_identity<lather::optim::Impl::SquaredNorms> {
  KOKKOS_FORCEINLINE_FUNCTION static lather::optim::Impl::SquaredNorms sum() {
    return lather::optim::Impl::SquaredNorms(0, 0);
  }
};
}  // namespace Kokkos

namespace lather::optim::Impl {

/// A list of units on the device. Row k: the parameter, where the unit starts in the packed
/// buffer the kernel works on, the rank of its box (0: a range [begin, begin + elements) of the
/// flat tensor), begin, elements, where its per-element state starts (its kind's buffer), where
/// its new values go in the exchange segment, then the box's offsets and sizes in the
/// parameter's interpreted local shape.
template <class MemorySpace>
struct UnitTable {
  enum Column : int {
    parameter,
    packed,
    rank,
    begin,
    elements,
    state,
    exchange,
    offsets,
    sizes = offsets + max_block_rank
  };
  static constexpr int columns = sizes + max_block_rank;
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, MemorySpace> units;
  /// Per parameter: the strides of its interpreted local shape.
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, MemorySpace> strides;
  int count = 0;
};

/// The table of `units` (indices into step.units, in this order) with unit u starting at packed
/// offset `packed[k]`, its state at `state[k]` and its place in the exchange segment at
/// `exchange[k]` (empty: the packed offsets); uploaded on `space`.
template <class ExecutionSpace, class MemorySpace = typename ExecutionSpace::memory_space>
UnitTable<MemorySpace> make_unit_table(const ExecutionSpace& space, const ShampooPlan& plan, const StepPlan& step,
                                       const std::vector<int>& units, const std::vector<std::int64_t>& packed,
                                       const std::vector<std::int64_t>& state,
                                       const std::vector<std::int64_t>& exchange = {}) {
  using Table = UnitTable<MemorySpace>;
  Table t;
  t.count = int(units.size());
  t.units = decltype(t.units)(Kokkos::view_alloc(space, "Lather::Shampoo::units"), std::max(t.count, 1),
                              std::size_t(Table::columns));
  t.strides = decltype(t.strides)(Kokkos::view_alloc(space, "Lather::Shampoo::strides"),
                                  std::max<std::size_t>(plan.parameters.size(), 1), std::size_t(max_block_rank));
  auto units_host = Kokkos::create_mirror_view(Kokkos::HostSpace(), t.units);
  auto strides_host = Kokkos::create_mirror_view(Kokkos::HostSpace(), t.strides);
  Kokkos::deep_copy(units_host, 0);
  Kokkos::deep_copy(strides_host, 0);
  for (std::size_t p = 0; p < plan.parameters.size(); ++p) {
    const auto& shape = plan.parameters[p].local_shape;
    LATHER_REQUIRE(shape.size() <= std::size_t(max_block_rank), "Shampoo supports tensors of rank <= ", max_block_rank,
                   " after shape interpretation, got ", shape.size(), " for ", plan.parameters[p].spec.name);
    std::int64_t stride = 1;
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      strides_host(p, d) = stride;
      stride *= shape[d];
    }
  }
  for (int k = 0; k < t.count; ++k) {
    const auto& unit = step.units[units[k]];
    units_host(k, Table::parameter) = unit.parameter;
    units_host(k, Table::packed) = packed[k];
    units_host(k, Table::state) = state[k];
    units_host(k, Table::exchange) = exchange.empty() ? packed[k] : exchange[k];
    units_host(k, Table::elements) = unit.elements;
    if (unit.block < 0) {
      units_host(k, Table::rank) = 0;
      units_host(k, Table::begin) = unit.begin;
      continue;
    }
    const auto& block = plan.parameters[unit.parameter].local_blocks[std::size_t(unit.block)];
    units_host(k, Table::rank) = std::int64_t(block.size.size());
    for (std::size_t d = 0; d < block.size.size(); ++d) {
      units_host(k, Table::offsets + d) = block.offset[d];
      units_host(k, Table::sizes + d) = block.size[d];
    }
  }
  Kokkos::deep_copy(space, t.units, units_host);
  Kokkos::deep_copy(space, t.strides, strides_host);
  ::lather::Impl::fence(space, "Lather::Shampoo::make_unit_table: uploaded");
  return t;
}

/// The flat index (in parameter p's tensor) of the first element of row `row` of unit k's box
/// of rank `rank`: the row decomposed over dimensions 0 .. rank-2.
template <class MemorySpace>
KOKKOS_INLINE_FUNCTION std::int64_t row_start(const UnitTable<MemorySpace>& t, int k, int p, int rank,
                                              std::int64_t row) {
  using Table = UnitTable<MemorySpace>;
  std::int64_t rest = row, flat = t.units(k, Table::offsets + rank - 1) * t.strides(p, rank - 1);
  for (int d = rank - 2; d >= 0; --d) {
    const std::int64_t extent = t.units(k, Table::sizes + d);
    flat += (t.units(k, Table::offsets + d) + rest % extent) * t.strides(p, d);
    rest /= extent;
  }
  return flat;
}

/// A unit taken whole by a host thread, making no Kokkos call: where a host backend shares a
/// pass's units out among host threads (run_units), each pass body is called with one of these
/// instead of a team member. Its runs are walked, and summed, in the order a host team of one
/// walks them, so a unit's results do not depend on who took it.
struct HostUnit {
  int k;
  KOKKOS_INLINE_FUNCTION int league_rank() const { return k; }
};

/// What the run loops below read of unit k of a table, read once: where the unit starts in the
/// packed buffer and its elements; a range of a flat tensor (rank 0) starts at flat index `begin`,
/// a box (rank >= 1) is walked by rows of `last` elements.
template <class MemorySpace>
struct UnitRuns {
  using Table = UnitTable<MemorySpace>;
  const Table* table;
  int k, rank, parameter = 0;
  std::int64_t packed, elements, begin = 0, last = 1;

  KOKKOS_INLINE_FUNCTION UnitRuns(const Table& t, int unit)
      : table(&t),
        k(unit),
        rank(int(t.units(unit, Table::rank))),
        packed(t.units(unit, Table::packed)),
        elements(t.units(unit, Table::elements)) {
    if (rank == 0) {
      begin = t.units(unit, Table::begin);
    } else {
      parameter = int(t.units(unit, Table::parameter));
      last = t.units(unit, Table::sizes + rank - 1);
    }
  }
  KOKKOS_INLINE_FUNCTION std::int64_t rows() const { return elements / last; }
  /// The flat index of the first element of row `row` of a box.
  KOKKOS_INLINE_FUNCTION std::int64_t row_flat(std::int64_t row) const {
    return row_start(*table, k, parameter, rank, row);
  }
  /// A range's runs of `run` elements: how many, and the length of the one starting at element e.
  KOKKOS_INLINE_FUNCTION std::int64_t runs(std::int64_t run) const { return (elements + run - 1) / run; }
  KOKKOS_INLINE_FUNCTION std::int64_t run_length(std::int64_t e, std::int64_t run) const {
    return e + run < elements ? run : elements - e;
  }
};

/// Calls f(packed, flat, count) over the elements of unit k of the table in runs: packed indices
/// packed .. packed + count - 1 and flat indices flat .. flat + count - 1 are one run. A body per
/// backend family (kokkos_compat.hpp's BodyFor): on the host a run is a row of the box (or a piece
/// of a range), a loop the pass writes with restrict pointers so that it vectorises; on a device
/// every vector lane gets one element (count 1).
template <class ExecutionSpace, class MemorySpace, class Member, class F>
KOKKOS_INLINE_FUNCTION void for_unit_runs(::lather::Impl::HostBody, const Member& member,
                                          const UnitTable<MemorySpace>& t, int k, const F& f) {
  const UnitRuns<MemorySpace> u(t, k);
  if (u.rank == 0) {
    constexpr std::int64_t run = ::lather::Impl::run_elements<ExecutionSpace>;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, u.runs(run)), [&](std::int64_t r) {
      const std::int64_t e = r * run;
      f(u.packed + e, u.begin + e, u.run_length(e, run));
    });
    return;
  }
  Kokkos::parallel_for(Kokkos::TeamThreadRange(member, u.rows()),
                       [&](std::int64_t row) { f(u.packed + row * u.last, u.row_flat(row), u.last); });
}
template <class ExecutionSpace, class MemorySpace, class Member, class F>
KOKKOS_INLINE_FUNCTION void for_unit_runs(::lather::Impl::DeviceBody, const Member& member,
                                          const UnitTable<MemorySpace>& t, int k, const F& f) {
  const UnitRuns<MemorySpace> u(t, k);
  if (u.rank == 0) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, u.elements),
                         [&](std::int64_t e) { f(u.packed + e, u.begin + e, std::int64_t(1)); });
    return;
  }
  Kokkos::parallel_for(Kokkos::TeamThreadRange(member, u.rows()), [&](std::int64_t row) {
    const std::int64_t flat = u.row_flat(row);
    const std::int64_t base = u.packed + row * u.last;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, u.last),
                         [&](std::int64_t j) { f(base + j, flat + j, std::int64_t(1)); });
  });
}
template <class ExecutionSpace, class MemorySpace, class Member, class F>
KOKKOS_INLINE_FUNCTION void for_unit_runs(const Member& member, const UnitTable<MemorySpace>& t, int k, const F& f) {
  for_unit_runs<ExecutionSpace>(::lather::Impl::BodyFor<ExecutionSpace>{}, member, t, k, f);
}

/// for_unit_runs with f(packed, flat, count, SquaredNorms& sums) accumulating; returns the team's total.
template <class ExecutionSpace, class MemorySpace, class Member, class F>
KOKKOS_INLINE_FUNCTION SquaredNorms reduce_unit_runs(::lather::Impl::HostBody, const Member& member,
                                                     const UnitTable<MemorySpace>& t, int k, const F& f) {
  const UnitRuns<MemorySpace> u(t, k);
  SquaredNorms total;
  if (u.rank == 0) {
    constexpr std::int64_t run = ::lather::Impl::run_elements<ExecutionSpace>;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(member, u.runs(run)),
        [&](std::int64_t r, SquaredNorms& sums) {
          const std::int64_t e = r * run;
          f(u.packed + e, u.begin + e, u.run_length(e, run), sums);
        },
        Kokkos::Sum<SquaredNorms>(total));
    return total;
  }
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(member, u.rows()),
      [&](std::int64_t row, SquaredNorms& sums) { f(u.packed + row * u.last, u.row_flat(row), u.last, sums); },
      Kokkos::Sum<SquaredNorms>(total));
  return total;
}
template <class ExecutionSpace, class MemorySpace, class Member, class F>
KOKKOS_INLINE_FUNCTION SquaredNorms reduce_unit_runs(::lather::Impl::DeviceBody, const Member& member,
                                                     const UnitTable<MemorySpace>& t, int k, const F& f) {
  const UnitRuns<MemorySpace> u(t, k);
  SquaredNorms total;
  if (u.rank == 0) {
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(member, u.elements),
        [&](std::int64_t e, SquaredNorms& sums) { f(u.packed + e, u.begin + e, std::int64_t(1), sums); },
        Kokkos::Sum<SquaredNorms>(total));
    return total;
  }
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(member, u.rows()),
      [&](std::int64_t row, SquaredNorms& sums) {
        const std::int64_t flat = u.row_flat(row);
        const std::int64_t base = u.packed + row * u.last;
        SquaredNorms row_sums;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(member, u.last),
            [&](std::int64_t j, SquaredNorms& s) { f(base + j, flat + j, std::int64_t(1), s); },
            Kokkos::Sum<SquaredNorms>(row_sums));
        sums += row_sums;
      },
      Kokkos::Sum<SquaredNorms>(total));
  return total;
}
template <class ExecutionSpace, class MemorySpace, class Member, class F>
KOKKOS_INLINE_FUNCTION SquaredNorms reduce_unit_runs(const Member& member, const UnitTable<MemorySpace>& t, int k,
                                                     const F& f) {
  return reduce_unit_runs<ExecutionSpace>(::lather::Impl::BodyFor<ExecutionSpace>{}, member, t, k, f);
}

/// for_unit_runs for a unit a host thread took (run_units): the host team's runs above, one after
/// another.
template <class ExecutionSpace, class MemorySpace, class F>
void for_unit_runs(const HostUnit&, const UnitTable<MemorySpace>& t, int k, const F& f) {
  static_assert(::lather::Impl::runs_on_host<ExecutionSpace>, "a HostUnit is taken on the host only");
  const UnitRuns<MemorySpace> u(t, k);
  if (u.rank == 0) {
    constexpr std::int64_t run = ::lather::Impl::run_elements<ExecutionSpace>;
    for (std::int64_t e = 0; e < u.elements; e += run) f(u.packed + e, u.begin + e, u.run_length(e, run));
    return;
  }
  for (std::int64_t row = 0; row < u.rows(); ++row) f(u.packed + row * u.last, u.row_flat(row), u.last);
}

/// reduce_unit_runs for a unit a host thread took: a host team of one sums its runs into one
/// value from zero, in order, and so does this.
template <class ExecutionSpace, class MemorySpace, class F>
SquaredNorms reduce_unit_runs(const HostUnit& unit, const UnitTable<MemorySpace>& t, int k, const F& f) {
  SquaredNorms total(0, 0);
  for_unit_runs<ExecutionSpace>(unit, t, k,
                                [&](std::int64_t i, std::int64_t flat, std::int64_t n) { f(i, flat, n, total); });
  return total;
}

/// f() once for the unit: by one member of a team, or by the host thread that took it.
template <class Member, class F>
KOKKOS_INLINE_FUNCTION void once_per_unit(const Member& member, const F& f) {
  if constexpr (std::is_same<Member, HostUnit>::value)
    f();
  else
    Kokkos::single(Kokkos::PerTeam(member), f);
}

/// pass(member) for every unit of a table of `count`: one team per unit, or on a host backend,
/// where `host_threads` is above 1, pass(HostUnit{k}) with the units shared out among that many
/// host threads, each taking the next unit (for_each_on_host_threads: a threaded backend's own
/// threads, else the kept threads). The host threads beat one team per unit under Kokkos OpenMP
/// too (units of unequal size, a static schedule), and a unit's results are then those of a team
/// of one whatever the backend's team size. `pass` must write nothing another unit writes and,
/// on host threads, make no Kokkos call (so no atomics: Kokkos's may be plain operations in a
/// build without a threaded backend).
template <class ExecutionSpace, class Pass>
void run_units_in_teams(const ExecutionSpace& space, const char* name, int count, const Pass& pass) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      name, Kokkos::TeamPolicy<ExecutionSpace>(space, count, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) { pass(member); });
}
template <class ExecutionSpace, class Pass>
void run_units(::lather::Impl::HostBody, const ExecutionSpace& space, const char* name, int count, int host_threads,
               const Pass& pass) {
  if (host_threads > 1 && count > 1) {
    ::lather::Impl::fence(space, name);
    ::lather::Impl::for_each_on_host_threads(space, host_threads, std::size_t(count),
                                             [&](int, std::size_t k) { pass(HostUnit{int(k)}); });
    return;
  }
  run_units_in_teams(space, name, count, pass);
}
template <class ExecutionSpace, class Pass>
void run_units(::lather::Impl::DeviceBody, const ExecutionSpace& space, const char* name, int count, int,
               const Pass& pass) {
  run_units_in_teams(space, name, count, pass);
}
template <class ExecutionSpace, class Pass>
void run_units(const ExecutionSpace& space, const char* name, int count, int host_threads, const Pass& pass) {
  if (count <= 0) return;
  run_units(::lather::Impl::BodyFor<ExecutionSpace>{}, space, name, count, host_threads, pass);
}

/// The sum of x[k]^2 for k < n in double, in eight interleaved partial sums (a fixed order, so the
/// result depends on the run only): the host compiler vectorises it without reassociating.
template <class V>
KOKKOS_INLINE_FUNCTION double sum_of_squares(const V* KOKKOS_RESTRICT x, std::int64_t n) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += double(x[k + l]) * double(x[k + l]);
  double sum = 0;
  for (; k < n; ++k) sum += double(x[k]) * double(x[k]);
  for (int l = 0; l < 8; ++l) sum += lanes[l];
  return sum;
}

/// Pointers to the tensors of a list, on the device: kernels reach every parameter through them.
template <class Scalar, class MemorySpace>
class PointerTable {
 public:
  /// Uploads the list's pointers when they differ from the last ones (on `space`).
  template <class ExecutionSpace, class Tensors>
  void update(const ExecutionSpace& space, const Tensors& tensors) {
    std::vector<std::uintptr_t> pointers;
    for (const auto& t : tensors) pointers.push_back(reinterpret_cast<std::uintptr_t>(t.data()));
    if (pointers == m_host) return;
    m_host = pointers;
    if (m_device.extent(0) < pointers.size())
      m_device = Kokkos::View<std::uintptr_t*, MemorySpace>("Lather::Shampoo::pointers", pointers.size());
    Kokkos::deep_copy(space, Kokkos::subview(m_device, std::make_pair(std::size_t(0), pointers.size())),
                      Kokkos::View<const std::uintptr_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                          m_host.data(), m_host.size()));
    ::lather::Impl::fence(space, "Lather::Shampoo::PointerTable: uploaded");
  }
  Kokkos::View<const std::uintptr_t*, MemorySpace> device() const { return m_device; }

 private:
  std::vector<std::uintptr_t> m_host;
  Kokkos::View<std::uintptr_t*, MemorySpace> m_device;
};

template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar* tensor(const std::uintptr_t pointer) {
  return reinterpret_cast<Scalar*>(pointer);
}

/// What differs between parameters in a step, per parameter on the device.
template <class Scalar>
struct ParameterScalars {
  Scalar gradient_scale = 1;      // 1 / (|g| + 1e-16) for the normalized grafts
  Scalar graft_multiplier = 1;    // lr unless decoupled_learning_rate; times 1/clipping denominator
  Scalar shampoo_multiplier = 1;  // |graft| / (|preconditioned| + 1e-16)
  int preconditioned = 0;         // 0: the graft is the direction (the reference's skip rules)
  int quantized = 0;              // int8 momentum with per-column scales
  std::int64_t columns = 1;       // quantized: columns of the [rows, columns] view of the tensor
  std::int64_t column_base = 0;   // quantized: where its scales start in the scale buffers
};

/// The scalars every parameter shares.
template <class Scalar>
struct StepScalars {
  int graft = 0;  // GraftType as int
  Scalar w1 = 0, w2 = 0, diagonal_epsilon = 0;
  Scalar beta1 = 0, weight_decay = 0, momentum_weight = 1, lr = 0, update_multiplier = 1;
  bool decoupled_weight_decay = false, run_shampoo = false, nesterov = false;
};

}  // namespace lather::optim::Impl
