#pragma once
// The implementation of ShardedMuon, for explicit instantiation: src/optim/sharded_muon.cpp
// instantiates it for lather::DefaultExecutionSpace (and the host space on device builds); a
// program that needs another execution space includes this header.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/impl/finite_gradients.hpp>
#include <lather/optim/impl/group_agreement.hpp>
#include <lather/optim/impl/muon_impl.hpp>
#include <lather/optim/sharded_muon.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace lather::optim::Impl {

/// What one rank keeps: its rows of every matrix's momentum and of every other parameter's AdamW
/// moments; the Newton-Schulz scratch of the matrices it orthogonalizes (whose rows it gathers
/// into it); one band of rows in flight.
template <class ExecutionSpace, class Scalar>
struct ShardedMuonState {
  using memory_space = typename ExecutionSpace::memory_space;
  using Flat = Kokkos::View<Scalar*, memory_space>;
  std::vector<Flat> momentum;                     // [parameter]: matrices, this rank's rows
  std::vector<Flat> adam_mu, adam_nu;             // [parameter]: AdamW parameters, this rank's rows
  std::vector<std::vector<std::size_t>> rows_of;  // [parameter][rank]: matrices held in bands
  std::vector<char> whole_everywhere;             // [parameter]: every rank holds the matrix whole
  NewtonSchulzWorkspace<ExecutionSpace, Scalar> ws;
  Flat band;  // this rank's rows of one matrix: its momentum estimate out, its orthogonalized rows in
};

/// Rows of `row_elements` values from every rank to every rank (Group::alltoallv of the Views,
/// rows in rank order on both sides).
template <class ExecutionSpace, class Scalar>
void exchange_rows(const ExecutionSpace& space, const comm::Group& group, const Scalar* send,
                   const std::vector<std::size_t>& send_rows, Scalar* receive,
                   const std::vector<std::size_t>& receive_rows, std::int64_t row_elements) {
  using memory_space = typename ExecutionSpace::memory_space;
  std::size_t out = 0, in = 0;
  for (auto r : send_rows) out += r;
  for (auto r : receive_rows) in += r;
  const auto unit = std::size_t(row_elements);
  group.alltoallv(space, Kokkos::View<const Scalar*, memory_space>(send, out * unit), send_rows,
                  Kokkos::View<Scalar*, memory_space>(receive, in * unit), receive_rows, unit);
}

}  // namespace lather::optim::Impl

namespace lather::optim {

template <class ExecutionSpace, class Scalar>
ShardedMuon<ExecutionSpace, Scalar>::ShardedMuon(const ExecutionSpace& space, std::vector<ParameterSpec> bands,
                                                 MuonOptions options, const comm::Group& group)
    : Optimizer<ExecutionSpace, Scalar>(std::move(bands), typename Optimizer<ExecutionSpace, Scalar>::ValidateLater()),
      m_options(std::move(options)),
      m_group(group),
      m_state(std::make_unique<Impl::ShardedMuonState<ExecutionSpace, Scalar>>()) {
  using Flat = typename Impl::ShardedMuonState<ExecutionSpace, Scalar>::Flat;
  auto& st = *m_state;
  const std::size_t count = this->m_parameters.size();
  const int ranks = m_group.size(), rank = m_group.rank();
  std::vector<ParameterSpec> whole(count);
  std::vector<std::int64_t> mine(2 * count, 0);  // per parameter: this rank's first row and row count
  // The plan and the state's allocation may fail on one rank only: agreed, with the check that the
  // ranks hold the same whole parameters and options, before any collective of a step.
  const std::string local_error = ::lather::Impl::local_failure("muon.construct", [&] {
    this->validate_parameters();
    m_options.validate();
    for (std::size_t p = 0; p < count; ++p) {
      const auto& band = this->m_parameters[p];
      whole[p].name = band.name;
      whole[p].shape = band.global();
      const bool held_whole = band.shape == band.global();
      LATHER_REQUIRE(held_whole || band.split_axis == 0, "Muon on sharded parameters: parameter '", band.name,
                     "' is a slice along axis ", band.split_axis, "; a band must be rows (axis 0) of the whole");
      mine[2 * p] = held_whole ? 0 : band.split_offset;
      mine[2 * p + 1] = band.shape.empty() ? 1 : band.shape[0];
    }
    m_plan = plan_muon(whole, m_options, ranks);
    st.momentum.resize(count);
    st.adam_mu.resize(count);
    st.adam_nu.resize(count);
    for (std::size_t p = 0; p < count; ++p) {
      const auto& name = this->m_parameters[p].name;
      const std::size_t n = std::size_t(element_count(this->m_parameters[p].shape));
      if (m_plan[p].matrix) {
        st.momentum[p] = Flat(Kokkos::view_alloc(space, "Lather::Muon::momentum::" + name), n);
      } else {
        st.adam_mu[p] = Flat(Kokkos::view_alloc(space, "Lather::Muon::adam_mu::" + name), n);
        st.adam_nu[p] = Flat(Kokkos::view_alloc(space, "Lather::Muon::adam_nu::" + name), n);
      }
    }
  });
  Impl::agree_on_construction(m_group, "Muon", whole, describe(), local_error);

  // Every rank's rows of every matrix: they tile it in rank order, or every rank holds it whole.
  std::vector<std::int64_t> all(mine.size() * std::size_t(ranks));
  m_group.allgather(mine.data(), mine.size(), all.data());
  st.rows_of.assign(count, std::vector<std::size_t>(std::size_t(ranks), 0));
  st.whole_everywhere.assign(count, 0);
  std::int64_t wide = 0, gram = 0, band = 0;
  for (std::size_t p = 0; p < count; ++p) {
    const auto& plan = m_plan[p];
    if (!plan.matrix) continue;
    bool everywhere = true, tiled = true;
    std::int64_t next = 0;
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t first = all[std::size_t(r) * mine.size() + 2 * p];
      const std::int64_t rows = all[std::size_t(r) * mine.size() + 2 * p + 1];
      everywhere = everywhere && first == 0 && rows == plan.rows;
      tiled = tiled && first == next;
      next += rows;
      st.rows_of[p][std::size_t(r)] = std::size_t(rows);
    }
    tiled = tiled && next == plan.rows;
    LATHER_REQUIRE(everywhere || tiled, "Muon on sharded parameters: the ranks' rows of '", whole[p].name,
                   "' do not cover its ", plan.rows, " rows once in rank order");
    st.whole_everywhere[p] = everywhere;
    if (everywhere || plan.owner == rank) {
      wide = std::max(wide, plan.rows * plan.columns);
      gram = std::max(gram, std::min(plan.rows, plan.columns) * std::min(plan.rows, plan.columns));
    }
    if (!everywhere) band = std::max(band, mine[2 * p + 1] * plan.columns);
  }
  m_group.run_agreed("Muon", [&] {
    ::lather::Impl::fault_point("muon.construct");
    st.ws.reserve(space, wide, gram);
    st.band = Flat(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Muon::band"), std::size_t(band));
  });
}

template <class ExecutionSpace, class Scalar>
ShardedMuon<ExecutionSpace, Scalar>::~ShardedMuon() = default;

template <class ExecutionSpace, class Scalar>
void ShardedMuon<ExecutionSpace, Scalar>::do_step(const ExecutionSpace& space, const Tensors& values,
                                                  const Tensors& grads) {
  ::lather::Impl::ScopedRegion region("Lather::ShardedMuon::step");
  auto& st = *m_state;
  const auto& o = m_options;
  const long t = m_step;  // updates done so far; this is update t + 1
  const Scalar lr = Scalar(o.learning_rate(t));
  const std::string what = "Muon::step " + std::to_string(t);

  // A NaN or Inf in any rank's rows, before any state moves: one agreement over the group.
  const int bad = Impl::first_non_finite(space, grads);
  m_group.agree_on_failure(
      what, bad < 0 ? std::string() : Impl::non_finite_gradient_message(this->m_parameters[std::size_t(bad)].name));

  const auto adamw = Impl::muon_adamw_step<ExecutionSpace, Scalar>(o, lr, t);
  for (std::size_t p = 0; p < values.size(); ++p)
    if (!m_plan[p].matrix)
      adamw(space, values[p].data(), grads[p].data(), st.adam_mu[p].data(), st.adam_nu[p].data(),
            std::int64_t(values[p].extent(0)));

  const Scalar beta = Scalar(o.beta), one_beta = Scalar(1 - o.beta);
  const Scalar c = Impl::bias_correction<Scalar>(o.beta, t + 1), c_next = Impl::bias_correction<Scalar>(o.beta, t + 2);
  for (std::size_t p = 0; p < values.size(); ++p) {
    const auto& plan = m_plan[p];
    if (!plan.matrix || plan.rows * plan.columns == 0) continue;
    const std::int64_t cols = plan.columns;
    if (st.whole_everywhere[p]) {
      // Every rank holds it whole: Muon's own step, on every rank alike.
      const std::string error = ::lather::Impl::local_failure("muon.distributed_step", [&] {
        Impl::muon_matrix_step(space, o, st.ws, grads[p].data(), st.momentum[p].data(), values[p].data(),
                               static_cast<Scalar*>(nullptr), plan.rows, cols, t, lr);
      });
      m_group.agree_on_failure(what, error);
      continue;
    }
    const std::int64_t rows = std::int64_t(st.rows_of[p][std::size_t(m_group.rank())]);
    Impl::muon_momentum(space, grads[p].data(), st.momentum[p].data(), st.band.data(), rows, cols, beta, one_beta, c,
                        c_next, o.nesterov, false);
    orthogonalize_rows(space, p, t);
    Impl::muon_update(space, values[p].data(), static_cast<Scalar*>(nullptr),
                      Impl::MuonMatrix<Scalar, memory_space>(st.band.data(), std::size_t(rows), std::size_t(cols)),
                      rows, cols, lr, Impl::muon_scale<Scalar>(plan.rows, cols), Scalar(o.weight_decay), false);
  }
  ++m_step;
}

template <class ExecutionSpace, class Scalar>
void ShardedMuon<ExecutionSpace, Scalar>::orthogonalize_rows(const ExecutionSpace& space, std::size_t p, long t) {
  auto& st = *m_state;
  const auto& o = m_options;
  const auto& plan = m_plan[p];
  const int ranks = m_group.size(), rank = m_group.rank(), owner = plan.owner;
  const bool owns = rank == owner;
  const std::int64_t rows = plan.rows, cols = plan.columns;
  const bool transposed = rows > cols;
  const std::vector<std::size_t> none(std::size_t(ranks), 0);
  std::vector<std::size_t> to_owner = none;
  to_owner[std::size_t(owner)] = st.rows_of[p][std::size_t(rank)];

  // The rows meet at the owner as the whole row-major matrix: in the iterate itself when the
  // iteration takes it as it lies, else in the other buffer, from which it is transposed.
  Scalar* whole = owns ? (transposed ? st.ws.y.data() : st.ws.x.data()) : nullptr;
  Impl::exchange_rows(space, m_group, st.band.data(), to_owner, whole, owns ? st.rows_of[p] : none, cols);
  const Scalar* result_rows = nullptr;
  const std::string error =
      owns
          ? ::lather::Impl::local_failure(
                "muon.distributed_step",
                [&] {
                  if (transposed) {
                    const Scalar* from = st.ws.y.data();
                    Scalar* to = st.ws.x.data();
                    Kokkos::parallel_for(
                        "Lather::ShardedMuon::transpose_in", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows * cols),
                        KOKKOS_LAMBDA(std::int64_t k) { to[(k % cols) * rows + k / cols] = from[k]; });
                  }
                  const auto result = Impl::orthogonalize_wide(space, st.ws, std::min(rows, cols), std::max(rows, cols),
                                                               o.ns_coefficients, o.ns_steps, o.epsilon);
                  result_rows = result.data();
                  if (!transposed) return;
                  // Back to rows, in the buffer the result is not in.
                  Scalar* to = result.data() == st.ws.x.data() ? st.ws.y.data() : st.ws.x.data();
                  Kokkos::parallel_for(
                      "Lather::ShardedMuon::transpose_out", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows * cols),
                      KOKKOS_LAMBDA(std::int64_t k) { to[k] = result(k % cols, k / cols); });
                  result_rows = to;
                })
          : std::string();
  // A failure at the owner is an error on every rank before any rank's rows change.
  m_group.agree_on_failure("Muon::step " + std::to_string(t), error);
  std::vector<std::size_t> from_owner = none;
  from_owner[std::size_t(owner)] = st.rows_of[p][std::size_t(rank)];
  Impl::exchange_rows(space, m_group, owns ? result_rows : st.band.data(), owns ? st.rows_of[p] : none, st.band.data(),
                      from_owner, cols);
}

template <class ExecutionSpace, class Scalar>
StateMemoryReport ShardedMuon<ExecutionSpace, Scalar>::memory_report() const {
  const auto& st = *m_state;
  StateMemoryReport r;
  for (std::size_t p = 0; p < m_plan.size(); ++p)
    r.local_bytes +=
        std::int64_t((st.momentum[p].size() + st.adam_mu[p].size() + st.adam_nu[p].size()) * sizeof(Scalar));
  r.workspace_bytes = st.ws.bytes() + std::int64_t(st.band.size() * sizeof(Scalar));
  return r;
}

template <class ExecutionSpace, class Scalar>
auto ShardedMuon<ExecutionSpace, Scalar>::state_arrays(const ExecutionSpace&) -> std::vector<StateArray<memory_space>> {
  auto& st = *m_state;
  std::vector<StateArray<memory_space>> arrays;
  m_step_host = m_step;
  arrays.push_back(step_array<memory_space>(m_step_host, m_group.rank() == 0));
  for (std::size_t p = 0; p < m_plan.size(); ++p) {
    const auto& spec = this->m_parameters[p];
    const auto add = [&](const std::string& slot, const Kokkos::View<Scalar*, memory_space>& view) {
      StateArray<memory_space> a;
      a.name = "local/" + spec.name + "/" + slot;  // Muon's names
      a.dtype = dtype_of<Scalar>();
      a.shape = spec.shape;  // this rank's rows
      a.parameter = int(p);
      a.writer = true;
      a.device_bytes = as_bytes<memory_space>(view, view.size());
      arrays.push_back(a);
    };
    if (!m_plan[p].matrix) {
      add("adam_mu", st.adam_mu[p]);
      add("adam_nu", st.adam_nu[p]);
    } else {
      add("momentum", st.momentum[p]);
    }
  }
  return arrays;
}

template <class ExecutionSpace, class Scalar>
void ShardedMuon<ExecutionSpace, Scalar>::state_restored(const ExecutionSpace&, long step_count) {
  m_step = step_count;
}

}  // namespace lather::optim
