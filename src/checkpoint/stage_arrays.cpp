#include "stage_arrays.hpp"

#include <lather/core/error.hpp>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <list>
#include <map>
#include <numeric>

namespace lather::checkpoint::Impl {

namespace {

using Selection = ArraySlice::Selection;

// ---- the stages' lists on the wire: int64 fields and the path's bytes, array after array -------

void put(std::vector<char>& out, std::int64_t value) {
  const auto* bytes = reinterpret_cast<const char*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof value);
}

struct Reader {
  const char* at;
  const char* end;
  std::int64_t next() {
    LATHER_REQUIRE(end - at >= std::ptrdiff_t(sizeof(std::int64_t)),
                   "checkpoint: a stage's list of arrays is cut short");
    std::int64_t value;
    std::memcpy(&value, at, sizeof value);
    at += sizeof value;
    return value;
  }
  std::string text(std::int64_t length) {
    LATHER_REQUIRE(length >= 0 && end - at >= length, "checkpoint: a stage's list of arrays is cut short");
    std::string s(at, std::size_t(length));
    at += length;
    return s;
  }
};

std::string describe(const StageArray& a) { return ::lather::to_string(a.dtype) + " " + ::lather::to_string(a.shape); }

TensorShape trailing(const TensorShape& shape) { return TensorShape(shape.begin() + 1, shape.end()); }

}  // namespace

std::vector<std::vector<StageArray>> exchange_stage_arrays(const comm::Group& pipeline,
                                                           const std::vector<ArraySlice>& arrays) {
  std::vector<char> mine;
  put(mine, std::int64_t(arrays.size()));
  for (const auto& a : arrays) {
    put(mine, std::int64_t(a.path.size()));
    mine.insert(mine.end(), a.path.begin(), a.path.end());
    put(mine, std::int64_t(a.dtype));
    put(mine, std::int64_t(a.stacked));
    put(mine, std::int64_t(a.selection));
    put(mine, std::int64_t(a.shape.size()));
    for (auto d : a.shape) put(mine, d);
  }
  const std::size_t stages = std::size_t(pipeline.size());
  std::vector<std::uint64_t> lengths(stages);
  const std::uint64_t length = mine.size();
  pipeline.allgather(&length, 1, lengths.data());
  const std::vector<std::size_t> counts(lengths.begin(), lengths.end());
  std::vector<char> all(std::accumulate(counts.begin(), counts.end(), std::size_t(0)));
  pipeline.allgatherv(mine.data(), all.data(), counts);

  std::vector<std::vector<StageArray>> lists(stages);
  const char* at = all.data();
  for (std::size_t s = 0; s < stages; ++s) {
    Reader in{at, at + counts[s]};
    const std::int64_t n = in.next();
    for (std::int64_t k = 0; k < n; ++k) {
      StageArray a;
      a.path = in.text(in.next());
      a.dtype = DType(in.next());
      a.stacked = in.next() != 0;
      a.selection = Selection(in.next());
      const std::int64_t rank = in.next();
      LATHER_REQUIRE(rank >= 0 && rank <= 64, "checkpoint: a stage's list of arrays is malformed");
      for (std::int64_t d = 0; d < rank; ++d) a.shape.push_back(in.next());
      lists[s].push_back(std::move(a));
    }
    at += counts[s];
  }
  return lists;
}

StageArrays::StageArrays(const std::vector<std::vector<StageArray>>& stages, int stage,
                         const std::vector<ArraySlice>& arrays, bool saving) {
  const int count = int(stages.size());
  LATHER_REQUIRE(stage >= 0 && stage < count && stages[std::size_t(stage)].size() == arrays.size(),
                 "checkpoint: stage ", stage, "'s list of arrays does not match its slices");
  // Where each stage lists each array.
  std::vector<std::map<std::string, std::size_t>> index(static_cast<std::size_t>(count));
  for (int s = 0; s < count; ++s)
    for (std::size_t k = 0; k < stages[std::size_t(s)].size(); ++k)
      LATHER_REQUIRE(index[std::size_t(s)].emplace(stages[std::size_t(s)][k].path, k).second, "checkpoint: array '",
                     stages[std::size_t(s)][k].path, "' is listed twice by pipeline stage ", s);

  // The common order: stage 0's list, then each later stage's new arrays placed before the next
  // array of that stage already listed (its parameters before the step, its optimizer state
  // after the earlier stages'), which is the order one stage over all the parameters lists them.
  std::list<std::string> order;
  std::map<std::string, std::list<std::string>::iterator> placed;
  for (int s = 0; s < count; ++s) {
    std::vector<std::string> pending;
    auto place = [&](std::list<std::string>::iterator before) {
      for (auto& path : pending) placed[path] = order.insert(before, path);
      pending.clear();
    };
    for (const auto& a : stages[std::size_t(s)]) {
      const auto it = placed.find(a.path);
      if (it == placed.end())
        pending.push_back(a.path);
      else
        place(it->second);
    }
    place(order.end());
  }

  std::vector<std::size_t> need_scratch;
  for (const auto& path : order) {
    std::vector<int> holders;
    for (int s = 0; s < count; ++s)
      if (index[std::size_t(s)].count(path)) holders.push_back(s);
    auto of = [&](int s) -> const StageArray& { return stages[std::size_t(s)][index[std::size_t(s)].at(path)]; };
    const StageArray& first = of(holders.front());
    auto differ = [&](int s, const char* what) {
      LATHER_FAIL("checkpoint: array '", path, "' is ", describe(first), first.stacked ? " stacked" : "",
                  " on pipeline stage ", holders.front(), " but ", describe(of(s)), of(s).stacked ? " stacked" : "",
                  " on stage ", s, ": ", what);
    };
    // The global shape, this stage's first row in it, and the kind of selection every rank makes.
    TensorShape shape = first.shape;
    std::int64_t offset = 0;
    bool rows = first.selection == Selection::rows || (first.stacked && first.selection == Selection::whole);
    for (int s : holders) {
      const StageArray& a = of(s);
      if (a.dtype != first.dtype) differ(s, "the stages' types differ");
      if (a.stacked != first.stacked) differ(s, "stacked on one stage only");
      const bool a_rows = a.selection == Selection::rows || (a.stacked && a.selection == Selection::whole);
      if (a_rows != rows)
        differ(s, "selected by rows on one stage and as a block on another, which a checkpoint cannot combine");
      if (!first.stacked) {
        if (a.shape != first.shape) differ(s, "an array that is not stacked must have one shape on every stage");
        continue;
      }
      if (a.shape.empty()) differ(s, "a stacked array needs a leading dimension");
      if (trailing(a.shape) != trailing(first.shape))
        differ(s,
               "stacked arrays must agree on every dimension but the first (Shampoo: the stages' largest statistic "
               "sizes, the stack's padded matrix size, differ)");
      if (s != holders.front()) shape[0] += a.shape[0];
      if (s < stage) offset += a.shape[0];
    }

    ArraySlice slice;
    const auto mine = index[std::size_t(stage)].find(path);
    if (mine != index[std::size_t(stage)].end()) {
      slice = arrays[mine->second];
      slice.shape = shape;
      if (first.stacked) {
        if (slice.selection == Selection::whole) {  // this stage's items: a range of the rows
          slice.selection = Selection::rows;
          slice.rows.resize(std::size_t(arrays[mine->second].shape[0]));
          std::iota(slice.rows.begin(), slice.rows.end(), offset);
        } else if (slice.selection == Selection::rows) {
          for (auto& r : slice.rows) r += offset;
        } else if (!slice.offset.empty()) {
          slice.offset[0] += offset;
        }
      } else if (saving && stage != holders.front()) {
        // The same array on an earlier stage: that stage writes it.
        if (slice.selection == Selection::block)
          std::fill(slice.count.begin(), slice.count.end(), 0);
        else
          slice.writer = false;
      }
    } else {
      // Another stage's array: this rank selects none of it, in the kind the holders use.
      slice.path = path;
      slice.dtype = first.dtype;
      slice.shape = shape;
      slice.stacked = first.stacked;
      slice.writer = false;
      if (rows) {
        slice.selection = Selection::rows;
      } else if (shape.empty()) {  // a scalar has no empty block: selected whole, into a scratch value
        slice.selection = Selection::whole;
        need_scratch.push_back(m_arrays.size());
      } else {
        slice.selection = Selection::block;
        slice.offset.assign(shape.size(), 0);
        slice.count.assign(shape.size(), 0);
      }
    }
    m_arrays.push_back(std::move(slice));
  }
  m_scratch.assign(need_scratch.size(), 0);
  for (std::size_t k = 0; k < need_scratch.size(); ++k) m_arrays[need_scratch[k]].data = &m_scratch[k];
}

}  // namespace lather::checkpoint::Impl
