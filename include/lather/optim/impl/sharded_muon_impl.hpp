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

/// A rectangle of a matrix's 2-D view [rows, columns] (Muon's reading: shape[0] by the product of
/// the rest): what one rank holds of the matrix. A band of rows is [first, first + rows) x all
/// columns; a weight shard's slice along axis 1 is all rows (or a band of them) x a run of columns.
struct MatrixPiece {
  std::int64_t row = 0, rows = 0, column = 0, columns = 0;
  std::int64_t elements() const { return rows * columns; }
  bool operator==(const MatrixPiece& o) const {
    return row == o.row && rows == o.rows && column == o.column && columns == o.columns;
  }
  bool overlaps(const MatrixPiece& o) const {
    return elements() > 0 && o.elements() > 0 && row < o.row + o.rows && o.row < row + rows &&
           column < o.column + o.columns && o.column < column + columns;
  }
};

/// What one rank keeps: its piece of every matrix's momentum and of every other parameter's AdamW
/// moments; the Newton-Schulz scratch of the matrices it orthogonalizes (whose pieces it gathers
/// into it); one piece in flight, and at an owner the pieces of a matrix on their way in and out.
template <class ExecutionSpace, class Scalar>
struct ShardedMuonState {
  using memory_space = typename ExecutionSpace::memory_space;
  using Flat = Kokkos::View<Scalar*, memory_space>;
  std::vector<Flat> momentum;                    // [parameter]: matrices, this rank's piece
  std::vector<Flat> adam_mu, adam_nu;            // [parameter]: AdamW parameters, this rank's piece
  std::vector<std::vector<MatrixPiece>> pieces;  // [parameter][rank]: each rank's piece of a matrix
  std::vector<std::vector<std::size_t>> sent;    // [parameter][rank]: elements it sends the owner
  std::vector<char> whole_everywhere;            // [parameter]: every rank holds the matrix whole
  std::vector<char> row_bands;                   // [parameter]: whole rows, once, in rank order
  NewtonSchulzWorkspace<ExecutionSpace, Scalar> ws;
  Flat band;     // this rank's piece of one matrix: its momentum estimate out, its orthogonalized piece in
  Flat staging;  // at an owner: the pieces of a matrix not held in row bands, in rank order
};

/// Runs of `unit` values from every rank to every rank (Group::alltoallv of the Views, in rank
/// order on both sides): rows of a matrix (unit: a row's elements), or whole pieces (unit 1).
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

/// A piece (row-major, piece.rows x piece.columns) into the whole matrix [rows, columns] at
/// `whole`, row-major, or transposed ([columns, rows]) as the iteration takes a tall matrix.
template <class ExecutionSpace, class Scalar>
void place_piece(const ExecutionSpace& space, const Scalar* piece_values, const MatrixPiece& piece, Scalar* whole,
                 std::int64_t rows, std::int64_t columns, bool transposed) {
  const std::int64_t first_row = piece.row, first_column = piece.column, width = piece.columns;
  Kokkos::parallel_for(
      "Lather::ShardedMuon::place_piece", Kokkos::RangePolicy<ExecutionSpace>(space, 0, piece.elements()),
      KOKKOS_LAMBDA(std::int64_t k) {
        const std::int64_t i = first_row + k / width, j = first_column + k % width;
        whole[transposed ? j * rows + i : i * columns + j] = piece_values[k];
      });
}

/// A piece of the orthogonalized matrix (`result`: [rows, columns], or [columns, rows] when
/// `transposed`) to `piece_values`, row-major.
template <class ExecutionSpace, class Scalar, class Result>
void take_piece(const ExecutionSpace& space, const Result& result, const MatrixPiece& piece, Scalar* piece_values,
                bool transposed) {
  const std::int64_t first_row = piece.row, first_column = piece.column, width = piece.columns;
  Kokkos::parallel_for(
      "Lather::ShardedMuon::take_piece", Kokkos::RangePolicy<ExecutionSpace>(space, 0, piece.elements()),
      KOKKOS_LAMBDA(std::int64_t k) {
        const std::int64_t i = first_row + k / width, j = first_column + k % width;
        piece_values[k] = transposed ? result(j, i) : result(i, j);
      });
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
  constexpr std::size_t fields = 4;  // a piece: first row, rows, first column, columns
  std::vector<std::int64_t> mine(fields * count, 0);
  // The plan and the state's allocation may fail on one rank only: agreed, with the check that the
  // ranks hold the same whole parameters and options, before any collective of a step.
  const std::string local_error = ::lather::Impl::local_failure("muon.construct", [&] {
    this->validate_parameters();
    m_options.validate();
    Impl::require_newton_schulz_precision<Scalar>(m_options);
    for (std::size_t p = 0; p < count; ++p) {
      const auto& piece = this->m_parameters[p];
      whole[p].name = piece.name;
      whole[p].shape = piece.global();
      const auto& g = piece.global();
      const std::int64_t rows = g.empty() ? 1 : g[0];
      const std::int64_t columns = g.empty() ? 1 : element_count(g) / std::max<std::int64_t>(rows, 1);
      std::int64_t* at = &mine[fields * p];
      if (piece.shape == g) {
        at[0] = 0, at[1] = rows, at[2] = 0, at[3] = columns;
      } else if (piece.split_axis == 0) {
        at[0] = piece.split_offset, at[1] = piece.shape[0], at[2] = 0, at[3] = columns;
      } else {
        // A slice along axis 1 is a run of the 2-D view's columns: each of its indices spans the
        // product of the later dimensions.
        LATHER_REQUIRE(piece.split_axis == 1, "Muon on sharded parameters: parameter '", piece.name,
                       "' is a slice along axis ", piece.split_axis,
                       "; a piece must be rows (axis 0) or columns (axis 1) of the whole");
        const std::int64_t inner = g.size() > 2 ? element_count(TensorShape(g.begin() + 2, g.end())) : 1;
        at[0] = piece.row_offset, at[1] = piece.shape[0];
        at[2] = piece.split_offset * inner, at[3] = piece.shape[1] * inner;
      }
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

  // Every rank's piece of every matrix. The distinct pieces must tile the matrix once; a piece
  // several ranks hold (weight shards' slices held by every replica, or parameters every shard
  // holds) is sent to the owner by the first of them, and returned to each.
  std::vector<std::int64_t> all(mine.size() * std::size_t(ranks));
  m_group.allgather(mine.data(), mine.size(), all.data());
  st.pieces.assign(count, std::vector<Impl::MatrixPiece>(std::size_t(ranks)));
  st.sent.assign(count, std::vector<std::size_t>(std::size_t(ranks), 0));
  st.whole_everywhere.assign(count, 0);
  st.row_bands.assign(count, 0);
  std::int64_t wide = 0, gram = 0, band = 0, staging = 0;
  for (std::size_t p = 0; p < count; ++p) {
    const auto& plan = m_plan[p];
    if (!plan.matrix) continue;
    auto& pieces = st.pieces[p];
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t* at = &all[std::size_t(r) * mine.size() + fields * p];
      pieces[std::size_t(r)] = Impl::MatrixPiece{at[0], at[1], at[2], at[3]};
    }
    bool everywhere = true, in_rows = true, inside = true, disjoint = true;
    std::int64_t next_row = 0, covered = 0, to_owner = 0;
    for (int r = 0; r < ranks; ++r) {
      const auto& piece = pieces[std::size_t(r)];
      everywhere = everywhere && piece == Impl::MatrixPiece{0, plan.rows, 0, plan.columns};
      in_rows = in_rows && piece.row == next_row && piece.column == 0 && piece.columns == plan.columns;
      next_row += piece.rows;
      inside = inside && piece.row >= 0 && piece.rows >= 0 && piece.row + piece.rows <= plan.rows &&
               piece.column >= 0 && piece.columns >= 0 && piece.column + piece.columns <= plan.columns;
      bool first_holder = piece.elements() > 0;
      for (int q = 0; q < r && first_holder; ++q) first_holder = !(pieces[std::size_t(q)] == piece);
      if (!first_holder) continue;
      for (int q = 0; q < r; ++q) disjoint = disjoint && !piece.overlaps(pieces[std::size_t(q)]);
      st.sent[p][std::size_t(r)] = std::size_t(piece.elements());
      covered += piece.elements();
      to_owner += piece.elements();
    }
    in_rows = in_rows && next_row == plan.rows;
    LATHER_REQUIRE(everywhere || (inside && disjoint && covered == plan.rows * plan.columns),
                   "Muon on sharded parameters: the ranks' pieces of '", whole[p].name, "' do not cover its ",
                   plan.rows, " x ", plan.columns, " once");
    st.whole_everywhere[p] = everywhere;
    st.row_bands[p] = !everywhere && in_rows;
    if (everywhere || plan.owner == rank) {
      wide = std::max(wide, plan.rows * plan.columns);
      gram = std::max(gram, std::min(plan.rows, plan.columns) * std::min(plan.rows, plan.columns));
    }
    if (!everywhere) band = std::max(band, pieces[std::size_t(rank)].elements());
    if (!everywhere && !in_rows && plan.owner == rank) {
      std::int64_t returned = 0;  // every rank's piece, duplicates included
      for (const auto& piece : pieces) returned += piece.elements();
      staging = std::max({staging, to_owner, returned});
    }
  }
  m_group.run_agreed("Muon", [&] {
    ::lather::Impl::fault_point("muon.construct");
    st.ws.reserve(space, wide, gram, m_options.newton_schulz_precision);
    st.band = Flat(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Muon::band"), std::size_t(band));
    if (staging > 0)
      st.staging =
          Flat(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Muon::staging"), std::size_t(staging));
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
    const auto& piece = st.pieces[p][std::size_t(m_group.rank())];
    const std::int64_t rows = piece.rows, width = piece.columns;
    Impl::muon_momentum(space, grads[p].data(), st.momentum[p].data(), st.band.data(), rows, width, beta, one_beta, c,
                        c_next, o.nesterov, false);
    orthogonalize_pieces(space, p, t);
    Impl::muon_update(space, values[p].data(), static_cast<Scalar*>(nullptr),
                      Impl::MuonMatrix<Scalar, memory_space>(st.band.data(), std::size_t(rows), std::size_t(width)),
                      rows, width, lr, Impl::muon_scale<Scalar>(plan.rows, cols), Scalar(o.weight_decay), false);
  }
  ++m_step;
}

template <class ExecutionSpace, class Scalar>
void ShardedMuon<ExecutionSpace, Scalar>::orthogonalize_pieces(const ExecutionSpace& space, std::size_t p, long t) {
  auto& st = *m_state;
  const auto& o = m_options;
  const auto& plan = m_plan[p];
  const int ranks = m_group.size(), rank = m_group.rank(), owner = plan.owner;
  const bool owns = rank == owner;
  const std::int64_t rows = plan.rows, cols = plan.columns;
  const bool transposed = rows > cols;
  const bool in_rows = st.row_bands[p] != 0;
  const auto& pieces = st.pieces[p];
  const std::vector<std::size_t> none(std::size_t(ranks), 0);
  // Row bands travel in rows and meet at the owner as the whole row-major matrix: in the iterate
  // itself when the iteration takes it as it lies, else in the other buffer, from which it is
  // transposed. Other pieces travel whole (in elements) to the staging buffer, from which each is
  // placed in the iterate, transposed or not.
  const auto counts = [&](bool only_senders) {
    std::vector<std::size_t> c(std::size_t(ranks), 0);
    for (int r = 0; r < ranks; ++r) {
      const auto& piece = pieces[std::size_t(r)];
      c[std::size_t(r)] = in_rows        ? std::size_t(piece.rows)
                          : only_senders ? st.sent[p][std::size_t(r)]
                                         : std::size_t(piece.elements());
    }
    return c;
  };
  const std::int64_t unit = in_rows ? cols : 1;
  const auto into_owner = counts(true);
  std::vector<std::size_t> to_owner = none;
  to_owner[std::size_t(owner)] = into_owner[std::size_t(rank)];
  Scalar* arriving = !owns ? nullptr : !in_rows ? st.staging.data() : transposed ? st.ws.y.data() : st.ws.x.data();
  Impl::exchange_rows(space, m_group, st.band.data(), to_owner, arriving, owns ? into_owner : none, unit);
  const Scalar* leaving = nullptr;
  const auto returned = counts(false);
  const std::string error =
      owns
          ? ::lather::Impl::local_failure(
                "muon.distributed_step",
                [&] {
                  if (!in_rows) {
                    std::int64_t at = 0;
                    for (int r = 0; r < ranks; ++r) {
                      if (into_owner[std::size_t(r)] == 0) continue;
                      Impl::place_piece(space, st.staging.data() + at, pieces[std::size_t(r)], st.ws.x.data(), rows,
                                        cols, transposed);
                      at += std::int64_t(into_owner[std::size_t(r)]);
                    }
                  } else if (transposed) {
                    const Scalar* from = st.ws.y.data();
                    Scalar* to = st.ws.x.data();
                    Kokkos::parallel_for(
                        "Lather::ShardedMuon::transpose_in", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows * cols),
                        KOKKOS_LAMBDA(std::int64_t k) { to[(k % cols) * rows + k / cols] = from[k]; });
                  }
                  const auto result =
                      Impl::orthogonalize_wide(space, st.ws, std::min(rows, cols), std::max(rows, cols),
                                               o.ns_coefficients, o.ns_steps, o.epsilon, o.newton_schulz_precision);
                  if (!in_rows) {
                    // Every rank's piece, in rank order, duplicates included.
                    std::int64_t at = 0;
                    for (int r = 0; r < ranks; ++r) {
                      Impl::take_piece(space, result, pieces[std::size_t(r)], st.staging.data() + at, transposed);
                      at += pieces[std::size_t(r)].elements();
                    }
                    leaving = st.staging.data();
                    return;
                  }
                  leaving = result.data();
                  if (!transposed) return;
                  // Back to rows, in the buffer the result is not in.
                  Scalar* to = result.data() == st.ws.x.data() ? st.ws.y.data() : st.ws.x.data();
                  Kokkos::parallel_for(
                      "Lather::ShardedMuon::transpose_out", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows * cols),
                      KOKKOS_LAMBDA(std::int64_t k) { to[k] = result(k % cols, k / cols); });
                  leaving = to;
                })
          : std::string();
  // A failure at the owner is an error on every rank before any rank's piece changes.
  m_group.agree_on_failure("Muon::step " + std::to_string(t), error);
  std::vector<std::size_t> from_owner = none;
  from_owner[std::size_t(owner)] = returned[std::size_t(rank)];
  Impl::exchange_rows(space, m_group, owns ? leaving : st.band.data(), owns ? returned : none, st.band.data(),
                      from_owner, unit);
}

template <class ExecutionSpace, class Scalar>
StateMemoryReport ShardedMuon<ExecutionSpace, Scalar>::memory_report() const {
  const auto& st = *m_state;
  StateMemoryReport r;
  for (std::size_t p = 0; p < m_plan.size(); ++p)
    r.local_bytes +=
        std::int64_t((st.momentum[p].size() + st.adam_mu[p].size() + st.adam_nu[p].size()) * sizeof(Scalar));
  r.workspace_bytes = st.ws.bytes() + std::int64_t((st.band.size() + st.staging.size()) * sizeof(Scalar));
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
