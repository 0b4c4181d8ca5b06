// The tutorial's complete program (docs/tutorial.md): an existing Kokkos training loop -- a linear
// model fitted by least squares on data each rank generates -- that adopts Lather's gradient mean,
// Shampoo and checkpoints. Built and run by the test suite (label docs), so it cannot rot.
//
//   mpiexec -n 2 ./lather-tutorial <checkpoint-directory> [steps]
#include <lather/lather.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <string>

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// --- The application's own model: y = x W + b, loss = mean of |y - target|^2 / 2 ---------------
constexpr int inputs = 16, outputs = 4, samples = 64;

struct Data {
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x{"x", samples, inputs}, target{"target", samples, outputs};
};

/// Each rank draws its own samples; the targets come from a fixed "true" model plus noise.
Data make_data(int rank) {
  Data d;
  auto x = Kokkos::create_mirror_view(d.x);
  auto t = Kokkos::create_mirror_view(d.target);
  for (int i = 0; i < samples; ++i) {
    for (int k = 0; k < inputs; ++k) x(i, k) = float(std::sin(0.7 * (i + samples * rank) + 1.3 * k));
    for (int j = 0; j < outputs; ++j) {
      double y = 0.1 * j;
      for (int k = 0; k < inputs; ++k) y += x(i, k) * std::cos(0.5 * k + j) * (k % 3 == 0 ? 3.0 : 0.3);
      t(i, j) = float(y + 0.01 * std::sin(17.0 * i + j));
    }
  }
  Kokkos::deep_copy(d.x, x);
  Kokkos::deep_copy(d.target, t);
  return d;
}

/// Loss and gradients (dW = x^T r / n, db = sum r / n with r = x W + b - target), with Kokkos.
double loss_and_gradient(const Data& d, const lather::FlatTensor<float, Mem>& w, const lather::FlatTensor<float, Mem>& b,
                         const lather::FlatTensor<float, Mem>& dw, const lather::FlatTensor<float, Mem>& db) {
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> residual("residual", samples, outputs);
  const auto x = d.x, target = d.target;
  double loss = 0;
  Kokkos::parallel_reduce(
      "tutorial::residual", Kokkos::MDRangePolicy<Space, Kokkos::Rank<2>>({0, 0}, {samples, outputs}),
      KOKKOS_LAMBDA(int i, int j, double& sum) {
        float y = b(j);
        for (int k = 0; k < inputs; ++k) y += x(i, k) * w(k * outputs + j);
        residual(i, j) = y - target(i, j);
        sum += 0.5 * double(residual(i, j)) * residual(i, j) / samples;
      },
      loss);
  Kokkos::parallel_for(
      "tutorial::gradient", Kokkos::MDRangePolicy<Space, Kokkos::Rank<2>>({0, 0}, {inputs, outputs}),
      KOKKOS_LAMBDA(int k, int j) {
        float sum = 0;
        for (int i = 0; i < samples; ++i) sum += x(i, k) * residual(i, j);
        dw(k * outputs + j) = sum / samples;
      });
  Kokkos::parallel_for(
      "tutorial::bias_gradient", Kokkos::RangePolicy<Space>(0, outputs), KOKKOS_LAMBDA(int j) {
        float sum = 0;
        for (int i = 0; i < samples; ++i) sum += residual(i, j);
        db(j) = sum / samples;
      });
  return loss;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const std::string directory = argc > 1 ? argv[1] : "tutorial-checkpoints";
    const long steps = argc > 2 ? std::stol(argv[2]) : 60;

    // [mesh] The ranks: here every rank is a replica of the whole model (no weight shards).
    lather::comm::Mesh mesh(MPI_COMM_WORLD, /*weight_shards=*/1);
    const Data data = make_data(mesh.world_rank());

    // [parameters] The application's parameters and gradients, as Lather sees them: flat Views.
    lather::FlatTensor<float, Mem> w("w", inputs * outputs), b("b", outputs), dw("dw", inputs * outputs),
        db("db", outputs);
    const lather::TensorList<float, Mem> params = {w, b}, grads = {dw, db};
    const std::vector<lather::optim::ParameterSpec> specs = {{"dense/kernel", {inputs, outputs}},
                                                             {"dense/bias", {outputs}}};

    // [optimizer] Shampoo, its root work shared by the data-parallel group.
    lather::optim::ShampooOptions options;
    options.learning_rate = lather::optim::LearningRateSchedule::constant(0.05);
    options.graft_type = lather::optim::GraftType::adagrad;
    options.start_preconditioning_step = 2;
    options.preconditioning_compute_steps = 5;
    lather::optim::Shampoo<Space, float> shampoo(Space(), specs, options,
                                                 lather::comm::make_work_group(mesh.data_parallel()));

    // [reducer] The gradient mean over the replicas, fused into one MPI_Allreduce.
    lather::comm::GradientReducer<Space, float> reducer(mesh.data_parallel());

    // [checkpoint] Resume from the newest complete checkpoint, if there is one.
    lather::checkpoint::CheckpointOptions checkpoint_options;
    checkpoint_options.directory = directory;
    lather::checkpoint::Checkpointer checkpointer(mesh.world(), checkpoint_options);
    const lather::checkpoint::WriterRoles roles{mesh.world_rank() == 0, mesh.replica() == 0, mesh.shard()};
    if (const std::string latest = checkpointer.latest(); !latest.empty()) {
      lather::checkpoint::load_training_state(checkpointer, latest, shampoo, params);
      if (mesh.world_rank() == 0) std::printf("resumed from %s at step %ld\n", latest.c_str(), shampoo.step_count());
    }

    // [loop] The training loop: compute gradients, reduce, step, checkpoint now and then.
    double loss = 0;
    for (long step = shampoo.step_count(); step < steps; ++step) {
      loss = loss_and_gradient(data, w, b, dw, db);
      reducer.mean(Space(), grads);
      shampoo.step(params, grads);
      if ((step + 1) % 20 == 0) {
        lather::checkpoint::TrainingState state;
        lather::checkpoint::save_training_state(checkpointer, shampoo, params, state, roles);
      }
    }
    double global = 0;
    MPI_Allreduce(&loss, &global, 1, MPI_DOUBLE, MPI_SUM, mesh.world());
    global /= mesh.world_size();
    if (mesh.world_rank() == 0)
      std::printf("step %ld: mean loss %.6f (%s)\n", shampoo.step_count(), global,
                  shampoo.memory_report().to_string().c_str());
    // The fit must have converged far below the initial loss (about 20).
    status = global < 0.05 ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
