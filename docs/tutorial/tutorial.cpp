// The tutorial's complete program (docs/tutorial.md): an existing Kokkos training loop -- a linear
// model fitted by least squares on data each rank generates -- that adopts Lather's gradient mean,
// Shampoo and checkpoints. Built and run by the test suite (label docs), so it cannot rot; the
// suite also checks that at most 12 of its lines name Lather.
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
using Vector = Kokkos::View<float*, Mem>;
double loss_and_gradient(const Data& d, const Vector& w, const Vector& b, const Vector& dw, const Vector& db) {
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
    const Space space;

    // [mesh] The ranks: here every rank is a replica of the whole model (no weight shards).
    const lather::comm::Mesh mesh(MPI_COMM_WORLD);
    const Data data = make_data(mesh.world_rank());

    // [parameters] The model's parameters, each with its gradient; all gradients in one buffer.
    const lather::ParameterList<float> params(space, {{"dense/kernel", {inputs, outputs}}, {"dense/bias", {outputs}}});

    // [optimizer] Shampoo, its root work shared by the replicas.
    lather::optim::ShampooOptions options;
    options.learning_rate = 0.05;
    options.graft_type = lather::optim::GraftType::adagrad;
    options.start_preconditioning_step = 2;
    options.preconditioning_compute_steps = 5;
    lather::optim::Shampoo<Space, float> shampoo(space, params, options, mesh);

    // [reducer] The gradient mean over the replicas, fused into one MPI_Allreduce.
    lather::comm::GradientReducer<Space, float> reducer(mesh);

    // [checkpoint] Resume from the newest complete checkpoint, if there is one.
    lather::checkpoint::Checkpointer checkpointer(mesh, {directory});
    if (const auto resumed = checkpointer.restore_latest(space, shampoo, params); resumed && mesh.world_rank() == 0)
      std::printf("resumed from %s at step %ld\n", resumed->file.c_str(), shampoo.step_count());

    // [loop] The training loop: compute gradients, reduce, step, checkpoint now and then.
    double loss = 0;
    for (long step = shampoo.step_count(); step < steps; ++step) {
      loss = loss_and_gradient(data, params.value(0), params.value(1), params.gradient(0), params.gradient(1));
      reducer.mean(space, params.gradients());
      shampoo.step(space, params);
      if ((step + 1) % 20 == 0) checkpointer.save(space, shampoo, params);
    }
    double global = 0;
    MPI_Allreduce(&loss, &global, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
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
