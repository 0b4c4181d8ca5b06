#include <lather/comm/agreement.hpp>

#if LATHER_ENABLE_MPI
#include "mpi_check.hpp"
#include "waiting.hpp"
#endif

#include <algorithm>
#include <cstring>
#include <limits>

namespace lather::comm {

#if LATHER_ENABLE_MPI
using Impl::check_mpi;
using Impl::complete;
#endif

namespace {

// One record of int64 words: [fields F, sums S, lowest failing rank, min x F, max x F, sums x S]
// (sums stored as the bits of doubles). The header makes the operation self-describing.
constexpr std::size_t header_words = 3;

#if LATHER_ENABLE_MPI

void agreement_op(void* in_raw, void* inout_raw, int* length, MPI_Datatype* type) {
  int words = 0;
  MPI_Type_size(*type, &words);
  words /= int(sizeof(std::int64_t));
  for (int record = 0; record < *length; ++record) {
    const auto* in = static_cast<const std::int64_t*>(in_raw) + std::size_t(record) * words;
    auto* inout = static_cast<std::int64_t*>(inout_raw) + std::size_t(record) * words;
    const std::int64_t fields = in[0], sums = in[1];
    inout[2] = std::min(inout[2], in[2]);
    for (std::int64_t f = 0; f < fields; ++f) {
      inout[header_words + f] = std::min(inout[header_words + f], in[header_words + f]);
      inout[header_words + fields + f] = std::max(inout[header_words + fields + f], in[header_words + fields + f]);
    }
    for (std::int64_t s = 0; s < sums; ++s) {
      double a = 0, b = 0;
      std::memcpy(&a, in + header_words + 2 * fields + s, sizeof(double));
      std::memcpy(&b, inout + header_words + 2 * fields + s, sizeof(double));
      // a + b == b + a in IEEE arithmetic, so every rank of a recursive-doubling exchange holds
      // the same bits.
      const double total = a + b;
      std::memcpy(inout + header_words + 2 * fields + s, &total, sizeof(double));
    }
  }
}

/// MPI datatype and operation, freed at scope exit.
struct AgreementMpiObjects {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  explicit AgreementMpiObjects(int words) {
    check_mpi(MPI_Type_contiguous(words, MPI_INT64_T, &type), "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(&type), "MPI_Type_commit");
    check_mpi(MPI_Op_create(&agreement_op, 1, &op), "MPI_Op_create");
  }
  ~AgreementMpiObjects() {
    if (op != MPI_OP_NULL) MPI_Op_free(&op);
    if (type != MPI_DATATYPE_NULL) MPI_Type_free(&type);
  }
  AgreementMpiObjects(const AgreementMpiObjects&) = delete;
  AgreementMpiObjects& operator=(const AgreementMpiObjects&) = delete;
};

#endif

}  // namespace

Agreement::Agreement(const Group& group, std::string context, std::vector<AgreementField> fields,
                     std::vector<double> sums, const std::string& local_error)
    : m_context(std::move(context)), m_fields(std::move(fields)), m_sums(std::move(sums)) {
  const int rank = group.rank();
  m_size = group.size();
  // A fixed record size (at least 16 fields, 2 sums, padded with zeros) keeps the MPI message
  // the same on every rank even when ranks are in different calls, which then disagree on the
  // operation field instead of mismatching the collective. Only the per-tensor size agreement,
  // which runs once the tensor counts agree, is longer.
  const std::size_t nf = std::max<std::size_t>(16, m_fields.size());
  const std::size_t ns = std::max<std::size_t>(2, m_sums.size());
  const std::size_t words = header_words + 2 * nf + ns;
  std::vector<std::int64_t> record(words), result(words);
  record[0] = std::int64_t(nf);
  record[1] = std::int64_t(ns);
  record[2] = local_error.empty() ? std::numeric_limits<std::int64_t>::max() : rank;
  for (std::size_t f = 0; f < m_fields.size(); ++f) {
    record[header_words + f] = m_fields[f].value;
    record[header_words + nf + f] = m_fields[f].value;
  }
  for (std::size_t s = 0; s < m_sums.size(); ++s)
    std::memcpy(&record[header_words + 2 * nf + s], &m_sums[s], sizeof(double));
  for (std::size_t s = m_sums.size(); s < ns; ++s) {
    const double zero = 0.0;
    std::memcpy(&record[header_words + 2 * nf + s], &zero, sizeof(double));
  }
  if (m_size == 1) {
    result = record;
  } else {
#if LATHER_ENABLE_MPI
    AgreementMpiObjects mpi{static_cast<int>(words)};
    complete(
        "MPI_Allreduce (agreement)",
        [&] { return MPI_Allreduce(record.data(), result.data(), 1, mpi.type, mpi.op, group.native()); },
        [&](MPI_Request* r) {
          return MPI_Iallreduce(record.data(), result.data(), 1, mpi.type, mpi.op, group.native(), r);
        });
#endif
  }
  m_min.assign(result.begin() + header_words, result.begin() + header_words + m_fields.size());
  m_max.assign(result.begin() + header_words + nf, result.begin() + header_words + nf + m_fields.size());
  for (std::size_t s = 0; s < m_sums.size(); ++s)
    std::memcpy(&m_sums[s], &result[header_words + 2 * nf + s], sizeof(double));

  if (result[2] != std::numeric_limits<std::int64_t>::max()) {
    // Some rank found its arguments invalid: everyone learns its message and throws it.
    const int failing = int(result[2]);
    std::string message = rank == failing ? local_error : std::string();
    group.broadcast(message, failing);
    LATHER_FAIL(m_context, ": ", message, " (on group rank ", failing, " of ", m_size,
                failing == rank ? ", this rank" : "", ")");
  }
}

std::string Agreement::disagreement(std::size_t f) const {
  const auto& field = m_fields[f];
  if (field.has_required && !(same(f) && m_min[f] == field.required))
    return ::lather::Impl::concat(m_context, ": ", field.name, " must be ", field.required,
                                  " on every rank of the group of ", m_size, ", got min ", m_min[f], ", max ", m_max[f],
                                  " (this rank: ", field.value, ")");
  return ::lather::Impl::concat(m_context, ": ", field.name, " differs across the ", m_size,
                                " ranks of the group: min ", m_min[f], ", max ", m_max[f], " (this rank: ", field.value,
                                ")");
}

void Agreement::require_agreement() const {
  for (std::size_t f = 0; f < m_fields.size(); ++f) {
    const bool ok = same(f) && (!m_fields[f].has_required || m_min[f] == m_fields[f].required);
    if (!ok) ::lather::Impl::throw_error(__FILE__, __LINE__, disagreement(f));
  }
}

void agree_on_call(const Group& group, bool verify, const std::string& context, std::int64_t batch,
                   const std::string& local_error, std::vector<AgreementField> extra) {
  if (!verify) {
    LATHER_REQUIRE(local_error.empty(), context, ": ", local_error);
    return;
  }
  std::vector<AgreementField> fields = {{"batch size", batch}};
  for (auto& f : extra) fields.push_back(std::move(f));
  Agreement(group, context, std::move(fields), {}, local_error).require_agreement();
}

}  // namespace lather::comm
