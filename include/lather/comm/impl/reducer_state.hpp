#pragma once
// What a GradientReducer holds between calls (its group, options, layout and buffers) and the
// bodies of its reductions: packing into buckets, the sums (MPI, two-rank pairs, the 16-bit
// wire), exact and approximate Adasum, the broadcast, and the same sums as nonblocking steps for
// the overlapped reduction (impl/overlap.hpp). Included at the end of reduce_impl.hpp,
// which defines the public calls on top of them: the agreement before each call and the dispatch
// to these bodies.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/comm/agreement.hpp>
#include <lather/comm/impl/adasum.hpp>
#include <lather/comm/impl/reduce_impl.hpp>
#include <lather/comm/impl/kernels.hpp>
#include <lather/comm/impl/layout.hpp>
#include <lather/comm/impl/overlap.hpp>
#include <lather/comm/impl/support.hpp>
#include <lather/comm/impl/window_sum.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/comm/transport.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace lather::comm {

template <class ExecutionSpace, class Scalar>
struct GradientReducer<ExecutionSpace, Scalar>::State {
  using S = Scalar;
  using M = memory_space;

  Group group;
  int size = 1, rank = 0;
  ReduceOptions options;
  std::int64_t fusion_elements = 1;

  Impl::Layout layout;
  bool layout_known = false;

  Impl::Vector<S, M> fusion;    ///< packed tensors of a bucket
  Impl::Vector<S, M> partner;   ///< Adasum and two-rank sums: the partner's data; approximate Adasum: the sum
  Impl::Vector<S, M> gathered;  ///< Adasum of small buckets: every rank's bucket
  Impl::Vector<std::uint16_t, M> wire_out, wire_in, wire_own;
  Transport<ExecutionSpace, S> transport;
  Transport<ExecutionSpace, std::uint16_t> wire_transport;
  Impl::ItemPlan<M> items;
  std::vector<Group> adasum_levels;
  bool adasum_levels_ready = false;
  Impl::WindowSums<ExecutionSpace, S> shared;  ///< ReduceOptions::shared_memory
  bool placed_agreed = false;                  ///< this call's tensors lie in the window on every rank
  ReducerStatistics statistics;
  std::vector<std::string> tensor_names;

  Impl::OverlapState overlap;  ///< the reduction in flight between start() and finish()
  tensor_list overlap_tensors;

  /// "" or what is wrong with the first of tensors [first, last) holding a NaN or Inf
  /// (check_finite); `consequence` ends the message.
  std::string first_non_finite(const ExecutionSpace& space, const tensor_list& tensors, std::size_t first,
                               std::size_t last, const char* consequence = "nothing was reduced") const {
    for (std::size_t t = first; t < last; ++t) {
      const long bad = Impl::count_non_finite(space, Impl::Vector<const S, M>(tensors[t]));
      if (bad > 0)
        return lather::Impl::concat(
            t < tensor_names.size() ? "'" + tensor_names[t] + "'" : "tensor " + std::to_string(t), " (",
            tensors[t].extent(0), " elements) holds ", bad, " NaN or Inf values on this rank; ", consequence);
    }
    return {};
  }
  std::string first_non_finite(const ExecutionSpace& space, const tensor_list& tensors) const {
    return first_non_finite(space, tensors, 0, tensors.size());
  }

  template <class T>
  static void ensure(Impl::Vector<T, M>& buffer, std::int64_t elements, const char* what) {
    if (std::int64_t(buffer.extent(0)) >= elements) return;
    buffer = Impl::Vector<T, M>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("Lather::GradientReducer::") + what),
        std::size_t(elements));
  }

  static auto range(std::int64_t begin, std::int64_t count) {
    return std::make_pair(std::size_t(begin), std::size_t(begin + count));
  }

  // ---- before the data moves ---------------------------------------------------------------------

  /// What reduce() and start() do before any data moves: the layout (planned again when the sizes
  /// changed), this rank's preparation (the caller's verdict, the scan for non-finite values
  /// unless `overlapped`, the buffers), and the agreement on all of it. Returns the global weight
  /// (weighted mean) or the group size; throws on every rank what failed on any.
  double agree_before(const ExecutionSpace& space, const tensor_list& gradients, ReduceOp op, double local_weight,
                      const std::vector<AgreedValue>& agreed, const std::string& caller_error,
                      const std::string& context, bool overlapped) {
    std::vector<std::int64_t> sizes(gradients.size());
    for (std::size_t t = 0; t < gradients.size(); ++t) sizes[t] = std::int64_t(gradients[t].extent(0));
    const bool same_as_before = layout_known && layout.sizes == sizes;
    Impl::Layout planned = same_as_before ? layout : Impl::plan_layout(sizes, fusion_elements);

    const bool weighted = op == ReduceOp::weighted_mean;
    const bool weight_valid = std::isfinite(local_weight) && local_weight >= 0;
    double global_weight = double(size);
    // This rank's work before the reduction: the caller's, the scan for non-finite values and the
    // buffers. What fails here is agreed below, with the layout, so every rank throws it.
    std::string local_error = caller_error, non_finite;
    if (local_error.empty())
      local_error = lather::Impl::local_failure(overlapped ? "reduce.start" : Impl::reduce_fault_point(op), [&] {
        // Overlapped, each bucket is scanned as it starts: its gradients do not exist yet.
        if (options.check_finite && !overlapped) non_finite = first_non_finite(space, gradients);
        if (non_finite.empty()) prepare(op, planned);
        if (overlapped) prepare_overlap(planned);
      });
    if (local_error.empty()) local_error = non_finite;
    if (weighted && !weight_valid && local_error.empty())
      local_error = lather::Impl::concat("the local weight must be finite and >= 0, got ", local_weight);
    const bool placed = shared.placed(rank, gradients);
    if (options.verify_layout || !same_as_before) {
      std::vector<AgreementField> extra = {
          {"gradients placed in the reducer's shared window (shared_gradient_storage)", std::int64_t(placed)}};
      for (const auto& value : agreed) extra.push_back({value.name, value.value, value.has_required, value.required});
      const double sum = agree(context, int(op), options.wire_precision, planned, std::move(extra),
                               weighted ? std::vector<double>{local_weight} : std::vector<double>{}, local_error);
      if (weighted) global_weight = sum;
    } else if (options.check_finite) {
      // No layout agreement: the verdict on the gradients, and the weight, in one small collective.
      group.agree_on_failure(context, local_error);
      ++statistics.scalar_collectives;
      if (weighted) {
        global_weight = group.allreduce(local_weight, Combine::sum);
        ++statistics.scalar_collectives;
      }
    } else {
      // No agreement at all (verify_layout off, the layout unchanged, check_finite off): the caller
      // vouched for every rank, so a failure here can only be thrown on this rank.
      if (!(weighted && !weight_valid)) LATHER_REQUIRE(local_error.empty(), context, ": ", local_error);
      if (weighted) {
        // An invalid weight anywhere turns the sum into NaN, an error on every rank.
        const double mine = weight_valid ? local_weight : std::numeric_limits<double>::quiet_NaN();
        global_weight = group.allreduce(mine, Combine::sum);
        ++statistics.scalar_collectives;
      }
    }
    if (weighted)
      LATHER_REQUIRE(std::isfinite(global_weight) && global_weight > 0, context,
                     ": the global weight (sum of the local weights over the ", size, " ranks of the group) is ",
                     global_weight, "; it must be finite and > 0 (this rank's weight: ", local_weight, ")");
    layout = std::move(planned);
    layout_known = true;
    placed_agreed = placed;
    return global_weight;
  }

  /// Whether the transports move CUDA memory through NCCL (comm/device_collectives.hpp): decided
  /// with the group the first time, after the agreement, where every rank is; so that the
  /// nonblocking and pairwise transfers, which cannot decide it, take the path the blocking ones
  /// take. Nothing to decide on one rank, which moves no data.
  void decide_nccl(const ExecutionSpace& space) {
    if (size == 1) return;
    transport.through_nccl(space);
    wire_transport.through_nccl(space);
  }

  /// The buffers the overlapped steps capture, beyond prepare()'s: allocated before the first
  /// bucket starts, never reallocated while one is in flight.
  void prepare_overlap(const Impl::Layout& planned) {
    if (size == 1) return;
    const std::int64_t largest = std::min<std::int64_t>(fusion_elements, planned.largest_bucket);
    if (options.wire_precision == WirePrecision::native) {
      const std::int64_t piece = pair_piece();
      if (size == 2) ensure(partner, (std::min(piece, planned.largest_bucket) + 1) / 2, "partner");
    } else {
      const std::int64_t segment = (largest + size - 1) / size;
      ensure(wire_out, segment * size, "wire_out");
      ensure(wire_in, segment * size, "wire_in");
      ensure(wire_own, segment, "wire_own");
    }
  }

  // ---- agreement ------------------------------------------------------------------------------

  /// Agrees on the layout, the options and anything in `extra`; returns the first sum (if any).
  /// Throws on every rank when the ranks disagree, naming the first tensor whose size differs.
  double agree(const std::string& context, int operation, WirePrecision wire, const Impl::Layout& local,
               std::vector<AgreementField> extra, std::vector<double> sums, const std::string& local_error) {
    std::vector<AgreementField> fields = {
        {"operation (0 sum, 1 mean, 2 weighted_mean, 3 adasum, 4 adasum_approx, 5 broadcast)", operation},
        {"tensor element size in bytes", std::int64_t(sizeof(S))},
        {"tensor count", std::int64_t(local.sizes.size())},
        {"total element count", local.total},
        {"hash of the tensor sizes", std::int64_t(local.hash)},
        {"ReduceOptions::fusion_bytes / element size", fusion_elements},
        {"ReduceOptions::wire_precision (0 native, 1 bfloat16, 2 float16)", std::int64_t(wire)},
        {"ReduceOptions::adasum_gather_bytes", std::int64_t(options.adasum_gather_bytes)},
        {"ReduceOptions::shared_memory", std::int64_t(options.shared_memory)}};
    constexpr std::size_t count_field = 2, total_field = 3, hash_field = 4;
    for (auto& field : extra) fields.push_back(std::move(field));
    const bool has_sum = !sums.empty();
    Agreement agreement(group, context, fields, std::move(sums), local_error);
    ++statistics.agreements;
    // The operation, then the element type, then the count: the first difference is the cause.
    for (std::size_t f = 0; f <= count_field; ++f)
      if (!agreement.same(f)) lather::Impl::throw_error(__FILE__, __LINE__, agreement.disagreement(f));
    if (!agreement.same(hash_field) || !agreement.same(total_field)) {
      // Every rank knows the sizes differ while the counts agree: one more agreement, over the
      // sizes themselves, names the first tensor that differs.
      std::vector<AgreementField> per_tensor;
      for (std::size_t t = 0; t < local.sizes.size(); ++t)
        per_tensor.push_back({"element count of tensor " + std::to_string(t), local.sizes[t]});
      Agreement sizes(group, context, per_tensor);
      ++statistics.agreements;
      sizes.require_agreement();
      lather::Impl::throw_error(__FILE__, __LINE__, agreement.disagreement(hash_field));
    }
    agreement.require_agreement();
    return has_sum ? agreement.sum(0) : 0.0;
  }

  // ---- data movement ---------------------------------------------------------------------------

  void pack(const ExecutionSpace& space, const tensor_list& tensors, const Impl::Bucket& bucket) {
    std::int64_t offset = 0;
    for (std::size_t t = bucket.first; t < bucket.last; ++t) {
      const std::int64_t n = layout.sizes[t];
      if (n > 0) Kokkos::deep_copy(space, Kokkos::subview(fusion, range(offset, n)), tensors[t]);
      offset += n;
    }
  }

  /// Copies a bucket back into its tensors, multiplied by `factor` on the way.
  void unpack(const ExecutionSpace& space, const tensor_list& tensors, const Impl::Bucket& bucket,
              double factor = 1.0) {
    std::int64_t offset = 0;
    for (std::size_t t = bucket.first; t < bucket.last; ++t) {
      const std::int64_t n = layout.sizes[t];
      if (n > 0)
        Impl::copy_scaled(space, Impl::Vector<const S, M>(Kokkos::subview(fusion, range(offset, n))), tensors[t],
                          factor);
      offset += n;
    }
  }

  /// True when the bucket's tensors lie one after the other in memory (a ParameterList's
  /// gradient buffer, a single tensor): it is reduced where it is, with no packing.
  static bool in_place(const tensor_list& tensors, const Impl::Bucket& bucket) {
    for (std::size_t t = bucket.first + 1; t < bucket.last; ++t)
      if (tensors[t].data() != tensors[t - 1].data() + tensors[t - 1].extent(0)) return false;
    return true;
  }

  /// The data a bucket is reduced in: the tensors themselves when contiguous, else the packed
  /// fusion buffer.
  Impl::Vector<S, M> bucket_data(const ExecutionSpace& space, const tensor_list& tensors, const Impl::Bucket& bucket) {
    if (in_place(tensors, bucket))
      return Impl::Vector<S, M>(tensors[bucket.first].data(), std::size_t(bucket.elements));
    pack(space, tensors, bucket);
    return Kokkos::subview(fusion, range(0, bucket.elements));
  }

  /// Bytes per piece of a two-rank sum (sum_pair), and of an in-place reduction that is scaled
  /// (a mean) on a larger group: there each piece is scaled just before its allreduce, while the
  /// caller's freshly written gradient is still in this core's cache, and reduced while the
  /// scaled piece is. Scaling after the allreduce would read data that MPI's transport has just
  /// moved, no longer in cache: several times the cost of the scaling pass, a few per cent of a
  /// Shampoo step. The sum of the scaled values equals the scaled sum exactly when the rank count
  /// is a power of two, else to a rounding per addend.
  static constexpr std::int64_t scaled_piece_bytes = std::int64_t(1) << 20;
  /// Elements per piece of a native sum of `length` elements on more than two ranks: the scaled
  /// pieces of a mean on the host, else the whole.
  static std::int64_t native_piece(std::int64_t length, double factor) {
    return factor == 1.0 || !Impl::runs_on_host<ExecutionSpace>
               ? std::max<std::int64_t>(length, 1)
               : std::max<std::int64_t>(1, scaled_piece_bytes / std::int64_t(sizeof(S)));
  }
  /// Elements per piece of a two-rank sum.
  static std::int64_t pair_piece() { return std::max<std::int64_t>(2, scaled_piece_bytes / std::int64_t(sizeof(S))); }

  /// data := factor * (sum over the group of data), natively or through the 16-bit wire.
  void sum_in_place(const ExecutionSpace& space, const Impl::Vector<S, M>& data, double factor) {
    if (options.wire_precision == WirePrecision::native && size == 2) {
      sum_pair(space, data, factor);
    } else if (options.wire_precision == WirePrecision::native) {
      const std::int64_t length = std::int64_t(data.extent(0));
      const std::int64_t piece = native_piece(length, factor);
      for (std::int64_t begin = 0; begin < length; begin += piece) {
        const Impl::Vector<S, M> part = Kokkos::subview(data, range(begin, std::min(piece, length - begin)));
        Impl::scale(space, part, factor);
        transport.allreduce(space, part);
      }
    } else {
      sum_wire16(space, data, factor);
    }
  }

  /// Two ranks, piece by piece: the halves cross (one MPI_Sendrecv), each rank adds its
  /// partner's half to its own and scales it in one vectorised pass, and the two results cross
  /// back into place. MPI_Allreduce moves the same bytes but sums with MPICH's scalar loop and
  /// leaves the division to a second pass, which takes longer, the more so the smaller the piece
  /// (docs/reference/collectives.md). Each element is summed once, by one rank, so both ranks
  /// hold the same bits. Under oversubscription (more ranks than cores) a chain of point-to-point
  /// steps waits on the scheduler at every step, so larger groups keep MPI's collective.
  void sum_pair(const ExecutionSpace& space, const Impl::Vector<S, M>& data, double factor) {
    constexpr int halves_tag = 0x1b00, results_tag = 0x1b01;
    const std::int64_t length = std::int64_t(data.extent(0));
    const std::int64_t piece = pair_piece();
    ensure(partner, (std::min(piece, length) + 1) / 2, "partner");
    for (std::int64_t begin = 0; begin < length; begin += piece) {
      const std::int64_t count = std::min(piece, length - begin), half = count / 2;
      // Group rank 0 reduces the first half of the piece, rank 1 the second.
      const auto first = range(begin, half), second = range(begin + half, count - half);
      const Impl::Vector<S, M> keep = Kokkos::subview(data, rank == 0 ? first : second);
      const Impl::Vector<S, M> give = Kokkos::subview(data, rank == 0 ? second : first);
      const Impl::Vector<S, M> incoming = Kokkos::subview(partner, range(0, std::int64_t(keep.extent(0))));
      transport.exchange(space, give, incoming, 1 - rank, halves_tag);
      Impl::add_scaled(space, keep, Impl::Vector<const S, M>(incoming), factor);
      transport.exchange(space, keep, give, 1 - rank, results_tag);
    }
  }

  /// 16-bit reduce-scatter (MPI_Alltoall of encoded segments, float accumulation in rank order,
  /// one rounding) and all-gather of the encoded result, in chunks of the fusion buffer.
  void sum_wire16(const ExecutionSpace& space, const Impl::Vector<S, M>& data, double factor) {
    const bool bfloat16 = options.wire_precision == WirePrecision::bfloat16;
    const std::int64_t length = std::int64_t(data.extent(0));
    for (std::int64_t begin = 0; begin < length; begin += fusion_elements) {
      const std::int64_t count = std::min(fusion_elements, length - begin);
      const std::int64_t segment = (count + size - 1) / size, padded = segment * size;
      ensure(wire_out, padded, "wire_out");
      ensure(wire_in, padded, "wire_in");
      ensure(wire_own, segment, "wire_own");
      const Impl::Vector<std::uint16_t, M> out = Kokkos::subview(wire_out, range(0, padded));
      const Impl::Vector<std::uint16_t, M> in = Kokkos::subview(wire_in, range(0, padded));
      const Impl::Vector<std::uint16_t, M> own = Kokkos::subview(wire_own, range(0, segment));
      const Impl::Vector<S, M> chunk = Kokkos::subview(data, range(begin, count));
      Impl::encode16(space, Impl::Vector<const S, M>(chunk), out, bfloat16);
      wire_transport.alltoall(space, out, in, std::size_t(segment));
      Impl::reduce_segments16(space, Impl::Vector<const std::uint16_t, M>(in), size, std::size_t(segment),
                              float(factor), own, bfloat16);
      wire_transport.allgatherv(space, own, out, std::vector<std::size_t>(size, std::size_t(segment)));
      Impl::decode16(space, Impl::Vector<const std::uint16_t, M>(Kokkos::subview(out, range(0, count))), chunk,
                     bfloat16);
    }
  }

  // ---- operations ------------------------------------------------------------------------------

  void sum_like(const ExecutionSpace& space, const tensor_list& tensors, double factor) {
    const bool native = options.wire_precision == WirePrecision::native;
    const bool windowed = shared.active(group, options.shared_memory && native);
    if (windowed) shared.prepare(group, layout);
    std::int64_t first = 0;  // the bucket's first element in the list
    for (const auto& bucket : layout.buckets) {
      first += bucket.elements;
      if (bucket.elements == 0) continue;
      if (windowed && shared.takes(bucket, placed_agreed)) {
        // A placed list lies in the window at its offsets; a copied bucket goes to its start.
        shared.sum(space, group, tensors, layout.sizes, bucket, placed_agreed ? first - bucket.elements : 0, factor);
        ++statistics.shared_memory_sums;
        statistics.bytes += double(bucket.elements) * double(sizeof(S));
        continue;
      }
      if (size == 1) {
        for (std::size_t t = bucket.first; t < bucket.last; ++t) Impl::scale(space, tensors[t], factor);
        continue;
      }
      const bool contiguous = in_place(tensors, bucket);
      const auto data = bucket_data(space, tensors, bucket);
      // Two ranks reduce a packed bucket pairwise too, the division in the summing pass.
      if (contiguous || !native || size == 2) {
        sum_in_place(space, data, factor);
        if (!contiguous) unpack(space, tensors, bucket);
      } else {
        // The division of a mean rides on the unpacking: no extra pass over the bucket.
        transport.allreduce(space, data);
        unpack(space, tensors, bucket, factor);
      }
    }
  }

  Impl::AdasumWorkspace<ExecutionSpace, S> adasum_workspace() {
    Impl::AdasumWorkspace<ExecutionSpace, S> work;
    work.size = size;
    work.rank = rank;
    work.levels = &adasum_levels;
    work.transport = &transport;
    work.items = &items;
    work.partner = partner;
    work.gathered = gathered;
    work.scalar_collectives = &statistics.scalar_collectives;
    return work;
  }

  /// Exact Adasum gathers a bucket instead of halving it (ReduceOptions::adasum_gather_bytes).
  bool adasum_gathers(const Impl::Bucket& bucket) const {
    return std::size_t(bucket.elements) * sizeof(S) * std::size_t(size) <= options.adasum_gather_bytes;
  }

  /// The buffers `op` needs for `planned`, allocated before the agreement: a failed allocation on
  /// one rank is then an error on every rank, not a rank missing from the reduction.
  void prepare(ReduceOp op, const Impl::Layout& planned) {
    ensure(fusion, std::min<std::int64_t>(fusion_elements, planned.largest_bucket), "fusion");
    if (size == 1) return;
    if (op == ReduceOp::adasum) {
      ensure(partner, Impl::adasum_partner_elements(size, planned.largest_bucket), "adasum_partner");
      for (const auto& bucket : planned.buckets)
        if (adasum_gathers(bucket)) ensure(gathered, bucket.elements * size, "adasum_gathered");
    } else if (op == ReduceOp::adasum_approx) {
      ensure(partner, planned.largest_bucket, "adasum_sum");
    }
  }

  void adasum(const ExecutionSpace& space, const tensor_list& tensors) {
    if (size == 1) return;
    if (!adasum_levels_ready) {
      // The groups of each VHDD level, built once: collective over the group.
      const int p = Impl::power_of_two_floor(size);
      for (int level = 1; level < p; level <<= 1)
        adasum_levels.push_back(group.split(rank < p ? rank / (2 * level) : -1, rank));
      adasum_levels_ready = true;
    }
    auto work = adasum_workspace();
    for (const auto& bucket : layout.buckets) {
      if (bucket.elements == 0) continue;
      const auto data = bucket_data(space, tensors, bucket);
      const std::vector<std::int64_t> counts(layout.sizes.begin() + bucket.first, layout.sizes.begin() + bucket.last);
      if (adasum_gathers(bucket))
        Impl::adasum_tree_allgather(space, work, data, counts);
      else
        Impl::adasum_allreduce(space, work, data, counts);
      if (!in_place(tensors, bucket)) unpack(space, tensors, bucket);
    }
  }

  void adasum_approx(const ExecutionSpace& space, const tensor_list& tensors) {
    if (size == 1) return;
    for (const auto& bucket : layout.buckets) {
      if (bucket.elements == 0) continue;
      const auto gradient = bucket_data(space, tensors, bucket);
      const Impl::Vector<S, M> total = Kokkos::subview(partner, range(0, bucket.elements));
      if (options.wire_precision == WirePrecision::native) {
        transport.allreduce_sum(space, gradient, total);
      } else {
        Kokkos::deep_copy(space, total, gradient);
        sum_wire16(space, total, 1.0);
      }
      const std::vector<std::int64_t> counts(layout.sizes.begin() + bucket.first, layout.sizes.begin() + bucket.last);
      items.build(space, counts);
      Impl::dot_norm_partials(space, Impl::Vector<const S, M>(gradient), Impl::Vector<const S, M>(total),
                              items.ranges(), items.size(), items.partials());
      const auto sums = items.per_tensor(space);
      static const double sqrt_double_min = std::sqrt(std::numeric_limits<double>::min());
      std::vector<double> keep(counts.size()), unused(counts.size(), 0.0);
      for (std::size_t t = 0; t < counts.size(); ++t) {
        const double gg = sums[t].aa, gs = sums[t].dot;
        keep[t] = gg >= sqrt_double_min ? 1.0 - (gs - gg) / (double(size) * gg) : 1.0;
      }
      items.set_coefficients(space, keep, unused);
      Impl::scale_items(space, gradient, items.ranges(), items.coefficients(), items.size());
      sum_in_place(space, gradient, 1.0);
      if (!in_place(tensors, bucket)) unpack(space, tensors, bucket);
    }
  }

  // ---- the overlapped reduction: sum_like()'s work as nonblocking steps ------------------------
  // Each push_* mirrors the blocking body named in its comment, piece for piece and chunk for
  // chunk, so that the results are the same bits. Bodies: impl/overlap_steps.hpp.

  void push_local(std::function<void()> work);
  void push_start(std::function<std::vector<Request>()> start);
  static std::vector<Request> one(Request request);

  /// transport.allreduce(space, data).
  void push_allreduce(const ExecutionSpace& space, const Impl::Vector<S, M>& data);

  /// transport.exchange(space, outgoing, incoming, partner, tag).
  void push_exchange(const ExecutionSpace& space, const Impl::Vector<S, M>& outgoing,
                     const Impl::Vector<S, M>& incoming, int partner, int tag);

  /// sum_pair(space, data, factor).
  void push_sum_pair(const ExecutionSpace& space, const Impl::Vector<S, M>& data, double factor);

  /// sum_wire16(space, data, factor).
  void push_sum_wire16(const ExecutionSpace& space, const Impl::Vector<S, M>& data, double factor);

  /// sum_in_place(space, data, factor).
  void push_sum_in_place(const ExecutionSpace& space, const Impl::Vector<S, M>& data, double factor);

  /// sum_bucket_through_window(...) for bucket `b` at element `first` of the slots.
  void push_window_sum(const ExecutionSpace& space, std::size_t b, std::int64_t first, double factor);

  /// Bucket `b` of the overlapped reduction: sum_like()'s work on it, with the check for
  /// non-finite values (check_finite) and the fault-injection point first.
  void push_bucket(const ExecutionSpace& space, std::size_t b);

  /// Starts every bucket whose tensors are all ready, last first, stopping at the first that is
  /// not: every rank starts them in the same order whatever the order of ready().
  void launch_ready_buckets(const ExecutionSpace& space);

  void broadcast(const ExecutionSpace& space, const tensor_list& tensors, int root) {
    if (size == 1) return;
    for (const auto& bucket : layout.buckets) {
      if (bucket.elements == 0) continue;
      if (in_place(tensors, bucket)) {
        transport.broadcast(space, Impl::Vector<S, M>(tensors[bucket.first].data(), std::size_t(bucket.elements)),
                            root);
        continue;
      }
      if (rank == root) pack(space, tensors, bucket);
      transport.broadcast(space, Kokkos::subview(fusion, range(0, bucket.elements)), root);
      if (rank != root) unpack(space, tensors, bucket);
    }
  }
};

}  // namespace lather::comm

// The bodies of the overlapped steps declared above.
#include <lather/comm/impl/overlap_steps.hpp>
