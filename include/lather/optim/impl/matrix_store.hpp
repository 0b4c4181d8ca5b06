#pragma once
// Shampoo's statistics and preconditioners: a stack of symmetric n x n matrices in padded slots
// [slots, max, max], stored densely in T or quantized (int16 off-diagonal codes with per-column
// scales and the diagonal kept apart in T, the reference's QuantizedValue), behind one
// interface. Every operation works on a list of matrices at once (one kernel per call), so the
// Shampoo step is written once for both storage formats.
//
// Matrices outside the store live in flat buffers: entry k of a list is the matrix whose element
// (i, j) sits at offset[k] + i * stride[k] + j -- a contiguous n x n matrix (stride n) or the
// leading block of a padded stack slot (stride max).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/optimizer.hpp>
#include <lather/optim/quantization.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lather::optim::Impl {

/// Matrices of a store to work on, on the host and on the device: entry k is store slot
/// `slot[k]` of true size `size[k]`; outside the store it is at element `offset[k]` of a flat
/// buffer with rows `stride[k]` apart (for pack/unpack: at byte `offset[k]`, stride unused).
template <class MemorySpace>
class SlotList {
 public:
  std::vector<int> slot, size, stride;
  std::vector<std::int64_t> offset;

  int count() const { return int(slot.size()); }
  void clear() { slot.clear(), size.clear(), stride.clear(), offset.clear(); }
  void add(int s, int n, std::int64_t at, int row_stride) {
    slot.push_back(s), size.push_back(n), offset.push_back(at), stride.push_back(row_stride);
  }
  /// Copies the lists to the device (on `space`); call after the last add() and before use.
  template <class ExecutionSpace>
  void upload(const ExecutionSpace& space) {
    const std::size_t n = slot.size();
    if (m_slot.extent(0) < n) {
      const std::size_t capacity = std::max<std::size_t>(n, 2 * m_slot.extent(0));
      m_slot = Ints(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::Shampoo::list::slot"), capacity);
      m_size = Ints(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::Shampoo::list::size"), capacity);
      m_stride = Ints(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::Shampoo::list::stride"), capacity);
      m_offset = Offsets(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::Shampoo::list::offset"), capacity);
    }
    copy(space, slot, m_slot), copy(space, size, m_size), copy(space, stride, m_stride), copy(space, offset, m_offset);
    // The host vectors may change as soon as this returns.
    ::lather::Impl::fence(space, "Lather::Shampoo::SlotList: uploaded");
  }
  Kokkos::View<const int*, MemorySpace> slots() const { return head(m_slot); }
  Kokkos::View<const int*, MemorySpace> sizes() const { return head(m_size); }
  Kokkos::View<const int*, MemorySpace> strides() const { return head(m_stride); }
  Kokkos::View<const std::int64_t*, MemorySpace> offsets() const { return head(m_offset); }

 private:
  using Ints = Kokkos::View<int*, MemorySpace>;
  using Offsets = Kokkos::View<std::int64_t*, MemorySpace>;
  template <class ExecutionSpace, class X>
  static void copy(const ExecutionSpace& space, const std::vector<X>& from, const Kokkos::View<X*, MemorySpace>& to) {
    if (from.empty()) return;
    Kokkos::deep_copy(
        space, Kokkos::subview(to, std::make_pair(std::size_t(0), from.size())),
        Kokkos::View<const X*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(from.data(), from.size()));
  }
  template <class X>
  Kokkos::View<const X*, MemorySpace> head(const Kokkos::View<X*, MemorySpace>& view) const {
    return Kokkos::subview(view, std::make_pair(std::size_t(0), slot.size()));
  }
  Ints m_slot, m_size, m_stride;
  Offsets m_offset;
};

/// Rounds a byte count up to a multiple of 8, so that every packed section is aligned for T.
KOKKOS_INLINE_FUNCTION constexpr std::size_t align8(std::size_t bytes) { return (bytes + 7) / 8 * 8; }

/// Runs op(i, j, k) over the leading size[k] square of every listed matrix: one team per entry,
/// a row's columns on the vector lanes (coalesced on a device), each (i, j) by one lane.
/// A free function, so that its lambda is device-safe under nvcc.
template <class ExecutionSpace, class MemorySpace, class Op>
void for_each_listed(const ExecutionSpace& space, const char* label, const SlotList<MemorySpace>& list, Op op) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  if (list.count() == 0) return;
  const auto sizes = list.sizes();
  Kokkos::parallel_for(
      label, ::lather::Impl::row_team_policy(space, list.count()), KOKKOS_LAMBDA(const member_type& member) {
        const int k = member.league_rank(), n = sizes(k);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int i) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, n), [&](int j) { op(i, j, k); });
        });
      });
}

template <class MemorySpace, class T>
struct ReadListed {  // flat matrix k := stack slot(k)
  StridedMatrices<T, MemorySpace> flat;
  Kokkos::View<const T***, Kokkos::LayoutRight, MemorySpace> stack;
  Kokkos::View<const int*, MemorySpace> slot;
  KOKKOS_INLINE_FUNCTION void operator()(int i, int j, int k) const { flat(k, i, j) = stack(slot(k), i, j); }
};

template <class MemorySpace, class T>
struct WriteListed {  // stack slot(k) := flat matrix k
  Kokkos::View<T***, Kokkos::LayoutRight, MemorySpace> stack;
  Kokkos::View<const int*, MemorySpace> slot;
  StridedMatrices<const T, MemorySpace> flat;
  KOKKOS_INLINE_FUNCTION void operator()(int i, int j, int k) const { stack(slot(k), i, j) = flat(k, i, j); }
};

template <class MemorySpace, class T>
struct BlendListed {  // matrices(k) = w1 matrices(k) + w2 grams(k), each product rounded first
  StridedMatrices<const T, MemorySpace> grams;
  Kokkos::View<T***, Kokkos::LayoutRight, MemorySpace> stack;  // dense store: the slots themselves
  Kokkos::View<const int*, MemorySpace> slot;
  StridedMatrices<T, MemorySpace> scratch;  // quantized store: the dequantized matrices
  bool in_stack;
  T w1, w2;
  KOKKOS_INLINE_FUNCTION void operator()(int i, int j, int k) const {
    T& target = in_stack ? stack(slot(k), i, j) : scratch(k, i, j);
    const T old_part = w1 * target, new_part = w2 * grams(k, i, j);
    target = old_part + new_part;
  }
};

template <class MemorySpace, class T>
struct PackDense {  // bytes at offset(k): the row-major n x n matrix
  Kokkos::View<T***, Kokkos::LayoutRight, MemorySpace> stack;
  Kokkos::View<char*, MemorySpace> bytes;
  Kokkos::View<const int*, MemorySpace> slot, size;
  Kokkos::View<const std::int64_t*, MemorySpace> offset;
  bool to_bytes;
  KOKKOS_INLINE_FUNCTION void operator()(int i, int j, int k) const {
    T* packed = reinterpret_cast<T*>(bytes.data() + offset(k));
    if (to_bytes)
      packed[i * size(k) + j] = stack(slot(k), i, j);
    else
      stack(slot(k), i, j) = packed[i * size(k) + j];
  }
};

template <class MemorySpace, class T>
struct PackQuantized {  // bytes at offset(k): codes n x n, then the diagonal, then the scales
  Kokkos::View<std::int16_t***, Kokkos::LayoutRight, MemorySpace> codes;
  Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace> diagonal, scales;
  Kokkos::View<char*, MemorySpace> bytes;
  Kokkos::View<const int*, MemorySpace> slot, size;
  Kokkos::View<const std::int64_t*, MemorySpace> offset;
  bool to_bytes;

  KOKKOS_INLINE_FUNCTION static std::size_t diagonal_at(int n) {
    return align8(std::size_t(n) * n * sizeof(std::int16_t));
  }
  KOKKOS_INLINE_FUNCTION static std::size_t scales_at(int n) {
    return diagonal_at(n) + align8(std::size_t(n) * sizeof(T));
  }
  KOKKOS_INLINE_FUNCTION static std::size_t bytes_of(int n) {
    return scales_at(n) + align8(std::size_t(n) * sizeof(T));
  }

  KOKKOS_INLINE_FUNCTION void operator()(int i, int j, int k) const {
    const int n = size(k), b = slot(k);
    char* base = bytes.data() + offset(k);
    auto* packed_codes = reinterpret_cast<std::int16_t*>(base);
    auto* packed_diagonal = reinterpret_cast<T*>(base + diagonal_at(n));
    auto* packed_scales = reinterpret_cast<T*>(base + scales_at(n));
    if (to_bytes) {
      packed_codes[i * n + j] = codes(b, i, j);
      if (j == 0) packed_diagonal[i] = diagonal(b, i), packed_scales[i] = scales(b, i);
    } else {
      codes(b, i, j) = packed_codes[i * n + j];
      if (j == 0) diagonal(b, i) = packed_diagonal[i], scales(b, i) = packed_scales[i];
    }
  }
};

// -----------------------------------------------------------------------------------------------

template <class ExecutionSpace, class T>
class MatrixStore {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using List = SlotList<memory_space>;
  using Flat = Kokkos::View<T*, memory_space>;
  using Bytes = Kokkos::View<char*, memory_space>;
  /// One array holding (part of) the store, for checkpoints: per slot, `slot_shape` elements.
  struct Array {
    using Bytes = Kokkos::View<char*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    std::string suffix;
    DType dtype;
    TensorShape slot_shape;
    Bytes bytes;
  };
  /// The bytes of a View as an Array's bytes.
  template <class View>
  static typename Array::Bytes bytes_of(const View& view) {
    return typename Array::Bytes(reinterpret_cast<char*>(view.data()), view.span() * sizeof(typename View::value_type));
  }

  virtual ~MatrixStore() = default;
  int slots() const { return m_slots; }
  int max_size() const { return m_max; }

  virtual bool quantized() const = 0;
  /// Bytes the store holds.
  virtual std::int64_t bytes() const = 0;
  /// Slots [first, end) := value * I (padding rows and columns included).
  virtual void fill_identity(const ExecutionSpace& space, T value, int first, int end) = 0;
  /// Listed matrix k of `flat` := matrix slot[k] of the store (leading size[k] square).
  virtual void read(const ExecutionSpace& space, const List& list, const Flat& flat) const = 0;
  /// Matrix slot[k] of the store := listed matrix k of `flat`.
  virtual void write(const ExecutionSpace& space, const List& list, const Flat& flat) = 0;
  /// Matrix slot[k] := w1 * matrix + w2 * (listed matrix k of `grams`), with the reference's
  /// rounding (each product rounded, then the sum). `scratch` is laid out like `grams`.
  virtual void blend(const ExecutionSpace& space, const List& list, const Flat& grams, T w1, T w2,
                     const Flat& scratch) = 0;
  /// Every slot: the lower triangle := the upper one (after products that wrote the upper
  /// triangles only). Dense stores only: quantized stores are always written whole.
  virtual void symmetrize(const ExecutionSpace& space) = 0;
  /// The slot's matrix as a contiguous row-major n x n array where it is stored so (dense, n equal
  /// to the padded size); nullptr otherwise (read() it instead).
  virtual const T* contiguous(int slot, int n) const = 0;
  /// The same, writable: products may land in the slots directly.
  T* contiguous(int slot, int n) { return const_cast<T*>(static_cast<const MatrixStore&>(*this).contiguous(slot, n)); }
  /// The slot's leading block where the store is dense, whatever its size: element (i, j) at
  /// leading(slot)[i * max_size() + j]; nullptr for a quantized store.
  virtual const T* leading(int slot) const = 0;
  T* leading(int slot) { return const_cast<T*>(static_cast<const MatrixStore&>(*this).leading(slot)); }
  /// Bytes one n x n matrix takes when packed (8-byte aligned sections).
  virtual std::size_t packed_bytes(int n) const = 0;
  /// bytes[offset[k], + packed_bytes(size[k])) := matrix slot[k], and back.
  virtual void pack(const ExecutionSpace& space, const List& list, const Bytes& bytes) const = 0;
  virtual void unpack(const ExecutionSpace& space, const List& list, const Bytes& bytes) = 0;
  virtual std::vector<Array> arrays() = 0;

  /// Host copy in double of slot `slot`'s leading n x n block (row-major), made on `space`.
  std::vector<double> host_matrix(const ExecutionSpace& space, int slot, int n) const {
    Flat one(Kokkos::view_alloc(space, "Lather::Shampoo::host_matrix"), std::size_t(n) * n);
    List list;
    list.add(slot, n, 0, n);
    list.upload(space);
    read(space, list, one);
    auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), one);
    Kokkos::deep_copy(space, host, one);
    ::lather::Impl::fence(space, "Lather::Shampoo::host_matrix: copied");
    return std::vector<double>(host.data(), host.data() + host.extent(0));
  }

 protected:
  MatrixStore(int slots, int max_size) : m_slots(slots), m_max(max_size) {}
  static StridedMatrices<T, memory_space> strided(const Flat& flat, const List& list) {
    return {flat, list.offsets(), list.strides()};
  }
  int m_slots = 0, m_max = 1;
};

template <class ExecutionSpace, class T>
class DenseStore final : public MatrixStore<ExecutionSpace, T> {
  using Base = MatrixStore<ExecutionSpace, T>;

 public:
  using typename Base::Array;
  using typename Base::Bytes;
  using typename Base::Flat;
  using typename Base::List;
  using typename Base::memory_space;
  using Stack = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;

  DenseStore(const ExecutionSpace& space, const std::string& label, int slots, int max_size)
      : Base(slots, max_size), m_values(Kokkos::view_alloc(space, label), slots, max_size, max_size) {}

  bool quantized() const override { return false; }
  std::int64_t bytes() const override { return std::int64_t(m_values.span() * sizeof(T)); }

  void fill_identity(const ExecutionSpace& space, T value, int first, int end) override {
    const auto values = m_values;
    const int m = this->m_max;
    Kokkos::parallel_for(
        "Lather::Shampoo::fill_identity",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<3>>(space, {first, 0, 0}, {end, m, m}),
        KOKKOS_LAMBDA(int b, int i, int j) { values(b, i, j) = i == j ? value : T(0); });
  }
  void read(const ExecutionSpace& space, const List& list, const Flat& flat) const override {
    for_each_listed(space, "Lather::Shampoo::read_slots", list,
                    ReadListed<memory_space, T>{this->strided(flat, list), m_values, list.slots()});
  }
  void write(const ExecutionSpace& space, const List& list, const Flat& flat) override {
    for_each_listed(space, "Lather::Shampoo::write_slots", list,
                    WriteListed<memory_space, T>{m_values, list.slots(), {flat, list.offsets(), list.strides()}});
  }
  void blend(const ExecutionSpace& space, const List& list, const Flat& grams, T w1, T w2, const Flat&) override {
    BlendListed<memory_space, T> op{{grams, list.offsets(), list.strides()}, m_values, list.slots(), {}, true, w1, w2};
    for_each_listed(space, "Lather::Shampoo::blend_statistics", list, op);
  }
  const T* contiguous(int slot, int n) const override {
    return n == this->m_max ? m_values.data() + std::size_t(slot) * n * n : nullptr;
  }
  const T* leading(int slot) const override { return m_values.data() + std::size_t(slot) * this->m_max * this->m_max; }
  void symmetrize(const ExecutionSpace& space) override {
    const auto values = m_values;
    const int m = this->m_max;
    Kokkos::parallel_for(
        "Lather::Shampoo::symmetrize",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {0, 0}, {this->m_slots, m}),
        KOKKOS_LAMBDA(int s, int i) {
          for (int j = 0; j < i; ++j) values(s, i, j) = values(s, j, i);
        });
  }
  std::size_t packed_bytes(int n) const override { return align8(std::size_t(n) * n * sizeof(T)); }
  void pack(const ExecutionSpace& space, const List& list, const Bytes& bytes) const override {
    transfer(space, list, bytes, true);
  }
  void unpack(const ExecutionSpace& space, const List& list, const Bytes& bytes) override {
    transfer(space, list, bytes, false);
  }
  std::vector<Array> arrays() override {
    const int m = this->m_max;
    return {{"", dtype_of<T>(), {m, m}, this->bytes_of(m_values)}};
  }

 private:
  void transfer(const ExecutionSpace& space, const List& list, const Bytes& bytes, bool to_bytes) const {
    for_each_listed(space, to_bytes ? "Lather::Shampoo::pack_slots" : "Lather::Shampoo::unpack_slots", list,
                    PackDense<memory_space, T>{m_values, bytes, list.slots(), list.sizes(), list.offsets(), to_bytes});
  }
  Stack m_values;
};

template <class ExecutionSpace, class T>
class QuantizedStore final : public MatrixStore<ExecutionSpace, T> {
  using Base = MatrixStore<ExecutionSpace, T>;

 public:
  using typename Base::Array;
  using typename Base::Bytes;
  using typename Base::Flat;
  using typename Base::List;
  using typename Base::memory_space;
  using Codes = Kokkos::View<std::int16_t***, Kokkos::LayoutRight, memory_space>;
  using Rows = Kokkos::View<T**, Kokkos::LayoutRight, memory_space>;

  QuantizedStore(const ExecutionSpace& space, const std::string& label, int slots, int max_size)
      : Base(slots, max_size),
        m_codes(Kokkos::view_alloc(space, label + "::codes"), slots, max_size, max_size),
        m_diagonal(Kokkos::view_alloc(space, label + "::diagonal"), slots, max_size),
        m_scales(Kokkos::view_alloc(space, label + "::scales"), slots, max_size) {}

  bool quantized() const override { return true; }
  std::int64_t bytes() const override {
    return std::int64_t(m_codes.span() * sizeof(std::int16_t) + (m_diagonal.span() + m_scales.span()) * sizeof(T));
  }

  void fill_identity(const ExecutionSpace& space, T value, int first, int end) override {
    // Off-diagonal codes and scales zero: the diagonal carries everything.
    const auto codes = m_codes;
    const auto diagonal = m_diagonal, scales = m_scales;
    const int m = this->m_max;
    Kokkos::parallel_for(
        "Lather::Shampoo::fill_identity",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<3>>(space, {first, 0, 0}, {end, m, m}),
        KOKKOS_LAMBDA(int b, int i, int j) {
          codes(b, i, j) = 0;
          if (j == 0) diagonal(b, i) = value, scales(b, i) = T(0);
        });
  }
  void read(const ExecutionSpace& space, const List& list, const Flat& flat) const override {
    if (list.count() == 0) return;
    dequantize_symmetric_matrices<ExecutionSpace, StridedMatrices<T, memory_space>, T>(
        space, m_codes, m_diagonal, m_scales, list.slots(), list.sizes(), this->strided(flat, list));
  }
  void write(const ExecutionSpace& space, const List& list, const Flat& flat) override {
    if (list.count() == 0) return;
    quantize_symmetric_matrices<ExecutionSpace, StridedMatrices<const T, memory_space>, T>(
        space, StridedMatrices<const T, memory_space>{flat, list.offsets(), list.strides()}, list.slots(), list.sizes(),
        m_codes, m_diagonal, m_scales);
  }
  void blend(const ExecutionSpace& space, const List& list, const Flat& grams, T w1, T w2,
             const Flat& scratch) override {
    read(space, list, scratch);
    BlendListed<memory_space, T> op{
        {grams, list.offsets(), list.strides()}, {}, {}, this->strided(scratch, list), false, w1, w2};
    for_each_listed(space, "Lather::Shampoo::blend_statistics", list, op);
    write(space, list, scratch);
  }
  const T* contiguous(int, int) const override { return nullptr; }
  void symmetrize(const ExecutionSpace&) override {}
  const T* leading(int) const override { return nullptr; }
  std::size_t packed_bytes(int n) const override { return PackQuantized<memory_space, T>::bytes_of(n); }
  void pack(const ExecutionSpace& space, const List& list, const Bytes& bytes) const override {
    transfer(space, list, bytes, true);
  }
  void unpack(const ExecutionSpace& space, const List& list, const Bytes& bytes) override {
    transfer(space, list, bytes, false);
  }
  std::vector<Array> arrays() override {
    const int m = this->m_max;
    return {{"/codes", DType::int16, {m, m}, this->bytes_of(m_codes)},
            {"/diagonal", dtype_of<T>(), {m}, this->bytes_of(m_diagonal)},
            {"/scales", dtype_of<T>(), {m}, this->bytes_of(m_scales)}};
  }

 private:
  void transfer(const ExecutionSpace& space, const List& list, const Bytes& bytes, bool to_bytes) const {
    for_each_listed(space, to_bytes ? "Lather::Shampoo::pack_slots" : "Lather::Shampoo::unpack_slots", list,
                    PackQuantized<memory_space, T>{m_codes, m_diagonal, m_scales, bytes, list.slots(), list.sizes(),
                                                   list.offsets(), to_bytes});
  }

  Codes m_codes;
  Rows m_diagonal, m_scales;
};

/// The store of a Shampoo state: quantized with best_effort_memory_usage_reduction, else dense.
template <class ExecutionSpace, class T>
std::unique_ptr<MatrixStore<ExecutionSpace, T>> make_matrix_store(const ExecutionSpace& space, bool quantized,
                                                                  const std::string& label, int slots, int max_size) {
  if (quantized) return std::make_unique<QuantizedStore<ExecutionSpace, T>>(space, label, slots, max_size);
  return std::make_unique<DenseStore<ExecutionSpace, T>>(space, label, slots, max_size);
}

}  // namespace lather::optim::Impl
