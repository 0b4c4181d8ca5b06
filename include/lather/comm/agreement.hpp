#pragma once
// Agreement before a collective: every rank contributes a few integers (sizes, counts, option
// values, a hash of its tensor sizes), a few numbers to sum (token weights) and whether its own
// arguments were valid. One MPI_Allreduce with a custom operation returns, on every rank, the
// minimum and maximum of every integer, the sums and the lowest rank that found its arguments
// invalid. Every rank then knows the same thing and throws the same lather::Error where ranks
// disagree, so a mismatch is an error everywhere and never a hang or a truncated message.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lather::comm {

struct AgreementField {
  std::string name;    ///< what the value is, for messages ("tensor count")
  std::int64_t value;  ///< this rank's value
  bool has_required = false;
  std::int64_t required = 0;  ///< when has_required: the value every rank must hold
};

class Agreement {
 public:
  /// Collective over `group`: one MPI_Allreduce, plus one MPI_Bcast of the message when some rank
  /// passed a non-empty `local_error` (then every rank throws that message, naming its rank).
  Agreement(const Group& group, std::string context, std::vector<AgreementField> fields, std::vector<double> sums = {},
            const std::string& local_error = std::string());

  std::int64_t min(std::size_t field) const { return m_min[field]; }
  std::int64_t max(std::size_t field) const { return m_max[field]; }
  bool same(std::size_t field) const { return m_min[field] == m_max[field]; }
  double sum(std::size_t index) const { return m_sums[index]; }
  int group_size() const { return m_size; }

  /// Throws, identically on every rank, for the first field that differs across ranks or misses
  /// its required value.
  void require_agreement() const;
  /// The message require_agreement() throws for `field`.
  std::string disagreement(std::size_t field) const;
  const std::string& context() const { return m_context; }

 private:
  std::string m_context;
  std::vector<AgreementField> m_fields;
  std::vector<std::int64_t> m_min, m_max;
  std::vector<double> m_sums;
  int m_size = 1;
};

/// The agreement of a call whose ranks must pass the same batch size (and `extra` fields): one
/// Agreement, unless `verify` is off, in which case a non-empty `local_error` throws on its rank
/// alone. Collective over `group` when `verify`.
void agree_on_call(const Group& group, bool verify, const std::string& context, std::int64_t batch,
                   const std::string& local_error, std::vector<AgreementField> extra = {});

}  // namespace lather::comm
