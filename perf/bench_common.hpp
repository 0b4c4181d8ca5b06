#pragma once
// Shared pieces of lather-bench: every subcommand registers itself on the CLI11 app and prints
// one JSON object per line, each carrying its same-run baseline and the ratio to it.

#include <CLI/CLI.hpp>
#include <lather/comm/group.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/optimizer.hpp>

#include <nlohmann/json.hpp>

#include <iostream>
#include <string>
#include <vector>

namespace lather::bench {

/// Prints one JSON line and flushes, so partial runs still leave complete records. Every record
/// carries "blas_kernels": the kernels the BLAS runs (lather::host_blas_kernels(); the GEMM-bound
/// figures depend on them: on a Zen 4 the AVX-512 kernels run 128 x 128 GEMMs at nearly twice
/// the AVX2 ones' rate), and
/// "blas_threads": the threads of each of this rank's BLAS calls (comm::fit_host_blas_threads).
void emit(nlohmann::json record);

/// The world the benchmark runs on: MPI_COMM_WORLD when MPI is there, else one process.
comm::Group world_group();

/// Refuses, on every rank, a case that needs more than `bytes` per rank can have (the device's
/// free memory on a GPU backend, else this rank's share of the node's available memory), before
/// anything is allocated: "<case> needs an estimated <bytes> (<how>), more than ...". Collective.
void check_memory(std::int64_t bytes, const std::string& what, const std::string& how);

/// GFLOP/s of one n x n x n GEMM of `Scalar` through KokkosBlas::gemm on the default execution
/// space, repeated for at least `seconds`: the same-run GEMM baseline (float and double).
template <class Scalar>
double gemm_gflops(int n, double seconds);

/// GFLOP/s of `batch` n x n x n GEMMs of `Scalar` issued as Shampoo's products are, repeated for
/// at least `seconds`: one strided-batched call on a device (one cuBLAS call on CUDA), and on a
/// host backend a BLAS call per matrix, shared out among `host_threads` threads with one BLAS
/// thread each where that is more than 1. On a GPU one small GEMM at a time measures launches, not
/// the GEMM rate.
template <class Scalar>
double batched_gemm_gflops(int n, int batch, int host_threads, double seconds);

/// Parses "a,b,c" into numbers; CLI11 does the per-item conversion and reports bad items.
template <class T>
void add_list_option(CLI::App& app, const std::string& name, std::vector<T>& values, const std::string& help) {
  app.add_option(name, values, help)->delimiter(',')->capture_default_str();
}

/// perf/parameter_sets.json from the source tree, or the installed copy.
std::string default_parameter_sets_file();
nlohmann::json read_parameter_sets(const std::string& path);
/// The file's "shampoo_options" (the reference's names) as ShampooOptions.
optim::ShampooOptions shampoo_options_of(const nlohmann::json& doc);
/// The parameters of set `set`.
std::vector<optim::ParameterSpec> parameter_specs_of(const nlohmann::json& doc, const std::string& set,
                                                     const std::string& path);

void register_root(CLI::App& app);
void register_balance(CLI::App& app);
void register_checkpoint(CLI::App& app);  // LATHER_ENABLE_HDF5 builds only
void register_reduce(CLI::App& app);      // LATHER_ENABLE_MPI builds only
void register_overlap(CLI::App& app);     // LATHER_ENABLE_MPI builds only
void register_tta(CLI::App& app);         // builds with the driver only
void register_pipeline(CLI::App& app);    // builds with the driver only
void register_plan(CLI::App& app);        // builds with the driver only
void register_step(CLI::App& app);

}  // namespace lather::bench
