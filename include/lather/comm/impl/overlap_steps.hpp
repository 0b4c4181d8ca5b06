#pragma once
// The bodies of GradientReducer::State's overlapped steps (declared in reducer_state.hpp): the
// work of sum_like() on one bucket as the nonblocking steps of impl/overlap.hpp's queue. Each
// push_* mirrors the blocking body its declaration names, piece for piece and chunk for chunk, so
// that the results are the same bits. Included at the end of reducer_state.hpp.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/comm/impl/reducer_state.hpp>

namespace lather::comm {

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_local(std::function<void()> work) {
  overlap.queue.push({std::move(work), {}});
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_start(std::function<std::vector<Request>()> start) {
  overlap.queue.push({{}, std::move(start)});
}

template <class ExecutionSpace, class Scalar>
std::vector<Request> GradientReducer<ExecutionSpace, Scalar>::State::one(Request request) {
  std::vector<Request> requests;
  requests.push_back(std::move(request));
  return requests;
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_allreduce(const ExecutionSpace& space,
                                                                    const Impl::Vector<S, M>& data) {
  const std::int64_t n = std::int64_t(data.extent(0)), chunk = std::int64_t(transport.chunk());
  for (std::int64_t begin = 0; begin < n; begin += chunk) {
    const Impl::Vector<S, M> part = Kokkos::subview(data, range(begin, std::min(chunk, n - begin)));
    push_start([this, space, part] { return one(transport.start_allreduce(space, part)); });
    push_local([this, space, part] { transport.finish_allreduce(space, part); });
  }
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_exchange(const ExecutionSpace& space,
                                                                   const Impl::Vector<S, M>& outgoing,
                                                                   const Impl::Vector<S, M>& incoming, int partner,
                                                                   int tag) {
  const std::int64_t n_out = std::int64_t(outgoing.extent(0)), n_in = std::int64_t(incoming.extent(0));
  const std::int64_t chunk = std::int64_t(transport.chunk());
  const std::int64_t chunks = std::max((n_out + chunk - 1) / chunk, (n_in + chunk - 1) / chunk);
  for (std::int64_t k = 0; k < chunks; ++k) {
    const std::int64_t out_begin = std::min(n_out, k * chunk), in_begin = std::min(n_in, k * chunk);
    const Impl::Vector<S, M> out = Kokkos::subview(outgoing, range(out_begin, std::min(chunk, n_out - out_begin)));
    const Impl::Vector<S, M> in = Kokkos::subview(incoming, range(in_begin, std::min(chunk, n_in - in_begin)));
    push_start([this, space, out, in, partner, tag] { return transport.start_exchange(space, out, in, partner, tag); });
    push_local([this, space, in] { transport.finish_exchange(space, in); });
  }
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_sum_pair(const ExecutionSpace& space,
                                                                   const Impl::Vector<S, M>& data, double factor) {
  constexpr int halves_tag = 0x1b00, results_tag = 0x1b01;
  const std::int64_t length = std::int64_t(data.extent(0));
  const std::int64_t piece = pair_piece();
  for (std::int64_t begin = 0; begin < length; begin += piece) {
    const std::int64_t count = std::min(piece, length - begin), half = count / 2;
    const auto first = range(begin, half), second = range(begin + half, count - half);
    const Impl::Vector<S, M> keep = Kokkos::subview(data, rank == 0 ? first : second);
    const Impl::Vector<S, M> give = Kokkos::subview(data, rank == 0 ? second : first);
    const Impl::Vector<S, M> incoming = Kokkos::subview(partner, range(0, std::int64_t(keep.extent(0))));
    push_exchange(space, give, incoming, 1 - rank, halves_tag);
    push_local(
        [space, keep, incoming, factor] { Impl::add_scaled(space, keep, Impl::Vector<const S, M>(incoming), factor); });
    push_exchange(space, keep, give, 1 - rank, results_tag);
  }
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_sum_wire16(const ExecutionSpace& space,
                                                                     const Impl::Vector<S, M>& data, double factor) {
  const bool bfloat16 = options.wire_precision == WirePrecision::bfloat16;
  const std::int64_t length = std::int64_t(data.extent(0));
  for (std::int64_t begin = 0; begin < length; begin += fusion_elements) {
    const std::int64_t count = std::min(fusion_elements, length - begin);
    const std::int64_t segment = (count + size - 1) / size, padded = segment * size;
    const Impl::Vector<std::uint16_t, M> out = Kokkos::subview(wire_out, range(0, padded));
    const Impl::Vector<std::uint16_t, M> in = Kokkos::subview(wire_in, range(0, padded));
    const Impl::Vector<std::uint16_t, M> own = Kokkos::subview(wire_own, range(0, segment));
    const Impl::Vector<S, M> chunk = Kokkos::subview(data, range(begin, count));
    const int ranks = size;
    push_local(
        [space, chunk, out, bfloat16] { Impl::encode16(space, Impl::Vector<const S, M>(chunk), out, bfloat16); });
    push_start([this, space, out, in, segment] {
      return one(wire_transport.start_alltoall(space, out, in, std::size_t(segment)));
    });
    push_local([this, space, in] { wire_transport.finish_alltoall(space, in); });
    push_local([space, in, own, ranks, segment, factor, bfloat16] {
      Impl::reduce_segments16(space, Impl::Vector<const std::uint16_t, M>(in), ranks, std::size_t(segment),
                              float(factor), own, bfloat16);
    });
    push_start([this, space, own, out, segment, ranks] {
      return one(
          wire_transport.start_allgatherv(space, own, out, std::vector<std::size_t>(ranks, std::size_t(segment))));
    });
    push_local([this, space, out] { wire_transport.finish_allgatherv(space, out); });
    push_local([space, out, chunk, count, bfloat16] {
      Impl::decode16(space, Impl::Vector<const std::uint16_t, M>(Kokkos::subview(out, range(0, count))), chunk,
                     bfloat16);
    });
  }
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_sum_in_place(const ExecutionSpace& space,
                                                                       const Impl::Vector<S, M>& data, double factor) {
  if (options.wire_precision == WirePrecision::native && size == 2) {
    push_sum_pair(space, data, factor);
  } else if (options.wire_precision == WirePrecision::native) {
    const std::int64_t length = std::int64_t(data.extent(0));
    const std::int64_t piece = native_piece(length, factor);
    for (std::int64_t begin = 0; begin < length; begin += piece) {
      const Impl::Vector<S, M> part = Kokkos::subview(data, range(begin, std::min(piece, length - begin)));
      push_local([space, part, factor] { Impl::scale(space, part, factor); });
      push_allreduce(space, part);
    }
  } else {
    push_sum_wire16(space, data, factor);
  }
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_window_sum(const ExecutionSpace& space, std::size_t b,
                                                                     std::int64_t first, double factor) {
  if constexpr (Impl::WindowSums<ExecutionSpace, S>::capable) {
    const Impl::Bucket bucket = layout.buckets[b];
    const NodeWindow* window = &shared.window();
    const auto move = [this, space, window, bucket, first](bool in) {
      Impl::move_bucket_through_slot(space, *window, rank, overlap_tensors, layout.sizes, bucket, first, in);
    };
    push_local([space, window, move] {
      move(true);
      ::lather::Impl::fence(space, "Lather::GradientReducer: bucket in the shared window");
      window->sync_memory();
    });
    push_start([window] { return one(window->start_barrier()); });
    push_local([this, space, window, bucket, first, factor] {
      window->sync_memory();
      Impl::sum_share_of_bucket<ExecutionSpace, S>(space, *window, rank, size, bucket, first, factor);
      ::lather::Impl::fence(space, "Lather::GradientReducer: share summed");
      window->sync_memory();
    });
    push_start([window] { return one(window->start_barrier()); });
    push_local([window, move] {
      window->sync_memory();
      move(false);
    });
  } else {
    (void)space, (void)b, (void)first, (void)factor;
  }
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::push_bucket(const ExecutionSpace& space, std::size_t b) {
  const Impl::Bucket bucket = layout.buckets[b];
  if (bucket.elements == 0) return;
  const double factor = overlap.factor;
  push_local([this, space, bucket] {
    lather::Impl::fault_point("reduce.overlapped");
    if (options.check_finite) {
      const std::string bad = first_non_finite(space, overlap_tensors, bucket.first, bucket.last,
                                               "the reduction went on and its result is discarded");
      LATHER_REQUIRE(bad.empty(), bad);
    }
  });
  const tensor_list& tensors = overlap_tensors;
  const bool native = options.wire_precision == WirePrecision::native;
  if (overlap.windowed && shared.takes(bucket, placed_agreed)) {
    push_window_sum(space, b, placed_agreed ? overlap.bucket_first[b] : 0, factor);
  } else if (size == 1) {
    push_local([this, space, bucket, factor] {
      for (std::size_t t = bucket.first; t < bucket.last; ++t) Impl::scale(space, overlap_tensors[t], factor);
    });
  } else {
    const bool contiguous = in_place(tensors, bucket);
    const Impl::Vector<S, M> data = contiguous
                                        ? Impl::Vector<S, M>(tensors[bucket.first].data(), std::size_t(bucket.elements))
                                        : Impl::Vector<S, M>(Kokkos::subview(fusion, range(0, bucket.elements)));
    if (!contiguous) push_local([this, space, bucket] { pack(space, overlap_tensors, bucket); });
    if (contiguous || !native || size == 2) {
      push_sum_in_place(space, data, factor);
      if (!contiguous) push_local([this, space, bucket] { unpack(space, overlap_tensors, bucket); });
    } else {
      push_allreduce(space, data);
      push_local([this, space, bucket, factor] { unpack(space, overlap_tensors, bucket, factor); });
    }
  }
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::State::launch_ready_buckets(const ExecutionSpace& space) {
  while (overlap.next >= 0 && overlap.missing[std::size_t(overlap.next)] == 0)
    push_bucket(space, std::size_t(overlap.next--));
}

}  // namespace lather::comm
