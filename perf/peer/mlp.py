#!/usr/bin/env python3
"""A PyTorch twin of `lather-train --model mlp` (the default model: 784-512-256-10 on
Fashion-MNIST): the same model, data, batches, initial weights, schedule and Adam/AdamW, so that
the two can be compared step by step; and Meta's DistributedShampoo as a second optimizer, so that
Lather's Shampoo can be compared with the reference PyTorch one on the same problem.

Run it with the peer environment (Meta's DistributedShampoo is linked from a checkout):

    .venv-peer/bin/python perf/peer/mlp.py --optimizer adamw --max-steps 20 --log-every 1
    .venv-peer/bin/python perf/peer/mlp.py --optimizer shampoo --epochs 5 --eval-every 50

Output, one JSON object per line on stdout:
  * at each evaluation (every --eval-every steps, at each epoch end, and at the end of a run
    stopped between epoch ends, as lather-train evaluates):
    {"step", "epoch", "seconds", "train_loss", "test_accuracy", "test_loss"};
  * with --log-every N, every N steps (and at epoch ends): {"step", "epoch", "loss", "seconds",
    "learning_rate"}, "loss" the mean training loss over the steps since the last such line
    (lather-train's --metrics "loss"; with --log-every 1 the step's own batch loss);
  * last: {"final": true, "optimizer", "steps", "seconds", "seconds_per_step", "test_accuracy",
    "target_accuracy", "reached", "steps_to_target", "seconds_to_target", "threads"}.
"seconds" counts from the first step without the evaluations (lather-train's "training_seconds");
"train_loss" is the mean training loss of the steps since the previous evaluation. The run stops
at the first evaluation at or above --target-accuracy (0: never). Its default is 0.88, the target
of `lather-bench tta` (lather-train's own --target-accuracy defaults to 0: pass
--target-accuracy 0.88 to it, or 0 here, for the same stopping rule).

What is the same as `lather-train` (model mlp) on one rank (drivers/train/trainer.cpp,
dataset.cpp, training_options.cpp, src/nn/mlp.cpp, src/data/idx.cpp, src/optim/schedule.cpp,
include/lather/optim/impl/first_order_impl.hpp):

  * Data: the four IDX files of --data (default /usr/share/datasets/fashion-mnist, the Debian
    package dataset-fashion-mnist; .gz or plain). Pixels byte / 255 in float32, then standardised
    by the mean and deviation of the first --train-samples training images (0: all 60000),
    computed as Lather does: one sequential double sum of the values and of their squares
    (reproduced exactly: float squares are exact in double, and the sums are taken in the same
    order), deviation sqrt(max(E[x^2] - mean^2, 1e-12)), x' = float((x - mean) / deviation) for
    train and test. Test set: the first --test-samples (0: all 10000), evaluated in pieces of 1000.
  * Batches: epoch e uses train::epoch_order: iota, then std::shuffle with
    std::mt19937_64(seed * 1000003 + e + 1), reproduced bit for bit: MT19937-64 (twist vectorised
    with NumPy, checked against the C++ standard's 10000th output), libstdc++'s (GCC 12) shuffle
    that draws two swap positions from one uniform_int_distribution call when range^2 fits in 64
    bits, and that distribution's Lemire nearly-divisionless downscaling with a 128-bit product.
    Step b of an epoch takes samples order[b*B : (b+1)*B] (B = --batch-size = 128; the last batch
    of an epoch is short: 60000 = 468 x 128 + 96), 469 steps per epoch.
  * Model (nn::Mlp): layers 784 -> --hidden (512, 256) -> 10, y = x W + b with W stored [in, out]
    as Lather stores its kernels, ReLU between layers, none after the last; loss the mean softmax
    cross-entropy over the batch (Lather sums the per-sample losses and its gradient reduction
    divides by the sample count: the same gradient).
  * Initial weights: Lather's draw reimplemented: one std::mt19937_64(--seed) over the layers in
    order, each kernel row-major [in, out] from std::uniform_real_distribution<float>(-a, a),
    a = sqrtf(6 / in) (He-uniform): libstdc++'s generate_canonical<float, 24> takes one 64-bit
    word x and returns float(x) / 2^64 (round to nearest, nextafter(1, 0) if that rounds to 1),
    then u * (2a) + (-a) in float32 (Lather is built with -ffp-contract=off: no fused multiply-add);
    biases zero. --check-initial CHECKPOINT compares them bit for bit with a Lather checkpoint
    written after one Adam step (the learning rate is 0 at step 0 under the warm-up, so those are
    the initial parameters), read with Debian's h5dump (h5py is not in the environment).
  * Schedule (optim::LearningRateSchedule via TrainOptions): --schedule cosine, --warmup-steps 100
    (peak * t / 100 at step t = 0, 1, ...: the first update has learning rate 0), then cosine to 0
    over max(1, planned - warmup) steps, planned = --schedule-steps, or else
    min(--max-steps, --epochs x ceil(n / B)) with n = --train-samples or 60000 (lather-train's
    planned_steps, which counts 60000 whatever the data directory holds).
  * Adam / AdamW (optim::FirstOrder, AdamOptions): betas 0.9 / 0.999, eps 1e-8 outside the square
    root, bias correction with the count after the update, no clipping; peak lr 2e-3 (lather-train's
    adam/adamw default); adamw: decoupled weight decay 1e-4 unless --weight-decay is given,
    on every parameter (biases too), times the learning rate; adam: --weight-decay (default 0) as
    L2 added to the gradient. torch.optim.AdamW computes p (1 - lr wd) - lr m_hat / (sqrt(v) /
    sqrt(c2) + eps), Lather p - lr (m_hat / (sqrt(v / c2) + eps) + wd p): the same in exact
    arithmetic, not in float rounding.

What is not the same: float32 rounding in the products and reductions (OpenBLAS's GEMMs in Lather,
PyTorch's here; Lather's loss per sample in double, here in float32), so the trajectories agree
to rounding, which grows slowly with the steps. One rank only (Lather's runs on R ranks compute
the same steps up to rounding). No accumulation, weight shards, Adasum, checkpoints or resume.

How it was checked (2-core development VM, seed 0, default sizes, float32 both sides, one rank):
  * epoch_order (seeds 0 and 7, epochs 0-2, 60000 samples; and 1001, the odd-count path) and the
    initial kernels (seeds 0 and 5) are identical, every element and every bit, to what a
    15-line C++ program calling std::shuffle and std::uniform_real_distribution<float> as
    dataset.cpp and mlp.cpp do prints (g++ 12, -ffp-contract=off);
  * the initial parameters are bit-identical to those of a lather-train checkpoint:
      build/drivers/lather-train --optimizer adamw --max-steps 1 --checkpoint-dir ck
      python perf/peer/mlp.py ... --check-initial ck/checkpoint-000000000001.h5
  * the per-step training loss:
      build/drivers/lather-train --optimizer adamw --max-steps 20 --log-every 1 --eval-every 10
          --quiet --metrics lather.jsonl
      python perf/peer/mlp.py --optimizer adamw --max-steps 20 --log-every 1 --eval-every 10
          --lather-metrics lather.jsonl
    agreed to 3.4e-6 relative or better on each of the 20 steps (6e-8 at step 1), with the same
    test accuracy at steps 10 and 20 (48.00%, 69.00%; test loss to 3e-6); --optimizer adam the
    same (3.5e-6). Over a whole epoch (--epochs 1, 469 steps) the losses stay within 3e-6 to
    step 50 (test accuracy 79.27% both at step 50), then part from step ~56 (1e-4 at step 60,
    1e-2 at step 80) as the peak learning rate nears: float32 rounding alone does the same,
    --dtype float64 against this script's float32 parts at the same steps (1e-4 at step 60, 1e-2
    at step 80), and Lather stays nearer to that float64 run (1e-5 to step 60) than PyTorch's
    float32 does. After the epoch: 86.72% here, 86.66% in Lather (86.91% in float64).
--lather-metrics prints the largest relative difference of the per-step losses and the test
accuracies at the common evaluations ({"compare": ...}); --check-initial the count of differing
values per parameter.

Threads: --threads (default: the CPUs of this process) sets torch.set_num_threads. PyTorch's
OpenMP threads spin while they wait; on a machine shared with other busy processes two spinning
threads made steps 10x slower (0.26-0.40 s against 0.03 s): there run with --threads 1 or with
OMP_WAIT_POLICY=PASSIVE in the environment.

Meta's DistributedShampoo (--optimizer shampoo). Its defaults here follow lather-train's MLP
Shampoo wherever Meta has the same knob, and Meta's own recommendations where Lather has none,
so that the two Shampoos are compared on the same problem with the same choices:
  * max_preconditioner_dim 128 (--shampoo-block-size; Lather's block_size; Meta suggests 8192 for
    large models), precondition_frequency 100 (--shampoo-precondition-frequency; Lather's MLP
    preconditioning_compute_steps, also Meta's README's), start_preconditioning_step -1
    (--shampoo-start-step; Meta's default: = precondition_frequency, so the first 100 steps take
    the graft's update; Meta refuses a start before the first root, so Lather's 25 needs
    --shampoo-precondition-frequency 25 or less),
    epsilon 1e-12 (--shampoo-epsilon; Meta's default and recommendation; Lather adds a ridge of
    1e-6 relative to the largest eigenvalue instead), beta2 0.999 (--shampoo-beta2: the moving
    average of the factor matrices, Lather's beta2), Meta's bias correction, root by its
    DefaultEigenConfig (eigendecomposition, as lather-train's eigh), single device.
  * Grafting: AdaGradPreconditionerConfig(epsilon = 1e-10) (--shampoo-graft adagrad,
    --shampoo-graft-epsilon; lather-train's MLP graft ADAGRAD with its diagonal_epsilon); adam
    gives AdamPreconditionerConfig(beta2 = --shampoo-beta2, epsilon), Meta's recommendation;
    rmsprop, sgd and none the others. Meta grafts per block, Lather per tensor.
  * Momentum: --shampoo-momentum nesterov (default) is Lather's: a sum M = beta1 M + P with the
    Nesterov look-ahead P + beta1 M on the grafted direction, beta1 0.85 (--shampoo-beta1, the
    MLP's), through Meta's ClassicMomentumConfig(momentum = beta1, dampening 0, use_nesterov)
    with betas (0, beta2); ema gives Meta's recommended form, betas (beta1, beta2): a
    bias-corrected moving average of the gradients before preconditioning.
  * One side: --shampoo-side input (default; lather-train's MLP precondtioner_type INPUT)
    preconditions only the input dimension (rows) of each [in, out] kernel block, with Lather's
    one-sided exponent L^(-1/2): inverse_exponent_override {2: {0: 0.5, 1: 0.0}}; all takes
    Meta's default (both sides, L^(-1/4) and R^(-1/4)).
  * Biases: --shampoo-biases graft (default) puts the 1-D parameters in a parameter group that
    never leaves the grafting method (start_preconditioning_step past the run, nothing
    preconditioned), i.e. the AdaGrad update itself, as lather-train does
    (skip_preconditioning_rank_lt 2); precondition gives them Meta's default treatment.
  * Learning rate 6e-3 (lather-train's MLP Shampoo default) on the same warm-up + cosine
    schedule; weight decay --weight-decay (0; decoupled, Meta's default type).
This is a peer run, not a step-by-step twin of Lather's Shampoo: the roots' regularisation,
Meta's bias correction of the factors, per-block grafting, the graft's own momentum (the
reference's diagonal_momentum) and the first preconditioned step (100 here, 25 in Lather) differ.
Seed 0, one rank, --epochs 5 --eval-every 50: 88% test accuracy at step 650 here, at step 600 in
`lather-train --epochs 5 --eval-every 50 --target-accuracy 0.88`.
"""

import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lather_twins import MASK64, MT19937_64, check_mt19937_64, h5dump_dataset, learning_rate  # noqa: E402

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
EVAL_ROWS = 1000  # trainer.cpp: eval_rows
LATHER_TRAIN_SAMPLES = 60000  # training_options.cpp planned_steps: the count when --train-samples is 0


# --- std::mt19937_64 and libstdc++'s distributions ----------------------------------------------

class WordStream:
    """Words of an engine as Python ints, fetched in blocks (the shuffle draws one at a time)."""

    def __init__(self, engine, block=4096):
        self.engine, self.size, self.buffer, self.at = engine, block, [], 0

    def __call__(self):
        if self.at == len(self.buffer):
            self.buffer, self.at = self.engine.words(self.size).tolist(), 0
        self.at += 1
        return self.buffer[self.at - 1]


def uniform_int_0_to(draw, urange):
    """libstdc++ 12 uniform_int_distribution<unsigned long>{0, urange}(g) for a 64-bit engine:
    Lemire's nearly-divisionless downscaling (_S_nd) with a 128-bit product."""
    erange = urange + 1
    if erange > MASK64:  # the whole 64-bit range: the word itself
        return draw()
    product = draw() * erange
    low = product & MASK64
    if low < erange:
        threshold = ((1 << 64) - erange) % erange  # -range % range in 64 bits
        while low < threshold:
            product = draw() * erange
            low = product & MASK64
    return product >> 64


def libstdcxx_shuffle(values, engine):
    """std::shuffle as libstdc++ 12 (bits/stl_algo.h) writes it for a 64-bit engine, in place."""
    n = len(values)
    if n == 0:
        return
    if n >= (1 << 32):  # the one-at-a-time path of libstdc++ is not needed for any data set here
        raise ValueError(f"shuffle of {n} elements: only the paired path is reproduced")
    draw = WordStream(engine)
    i = 1
    if n % 2 == 0:
        j = uniform_int_0_to(draw, 1)
        values[i], values[j] = values[j], values[i]
        i += 1
    while i != n:
        swap_range = i + 1
        x = uniform_int_0_to(draw, swap_range * (swap_range + 1) - 1)
        first, second = divmod(x, swap_range + 1)
        values[i], values[first] = values[first], values[i]
        i += 1
        values[i], values[second] = values[second], values[i]
        i += 1


def epoch_order(samples, seed, epoch):
    """train::epoch_order (drivers/train/dataset.cpp)."""
    order = list(range(samples))
    libstdcxx_shuffle(order, MT19937_64((seed * 1000003 + epoch + 1) & MASK64))
    return np.array(order, dtype=np.int64)


def canonical_floats(words):
    """generate_canonical<float, 24>(mt19937_64) per word: float(x) / 2^64, x rounded to 24
    significant bits to nearest, ties to even (the C++ conversion), 1 replaced by nextafter(1, 0)."""
    x = words.astype(np.uint64)
    bits = np.zeros(x.shape, dtype=np.int64)  # bit length of each word
    for k in range(64):
        bits += (x >> np.uint64(k)) != 0
    shift = np.maximum(bits - 24, 0).astype(np.uint64)
    kept = x >> shift
    dropped = x - (kept << shift)
    half = np.where(shift > 0, np.uint64(1) << (shift - np.uint64(1)), np.uint64(0))
    odd = (kept & np.uint64(1)) == 1
    up = (shift > 0) & ((dropped > half) | ((dropped == half) & odd))
    kept = kept + up.astype(np.uint64)  # may reach 2^24: still exact
    value = np.ldexp(kept.astype(np.float64), shift.astype(np.int64) - 64).astype(np.float32)
    return np.where(value >= np.float32(1), np.nextafter(np.float32(1), np.float32(0)), value)


def initial_kernels(sizes, seed):
    """nn::Mlp's kernels ([in, out] float32, row-major draws) from one std::mt19937_64(seed)."""
    engine = MT19937_64(seed)
    kernels = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = np.sqrt(np.float32(6.0) / np.float32(fan_in), dtype=np.float32)
        u = canonical_floats(engine.words(fan_in * fan_out))
        w = u * (bound - (-bound)) + (-bound)  # float32 throughout, two roundings
        kernels.append(w.astype(np.float32).reshape(fan_in, fan_out))
    return kernels


# --- data ---------------------------------------------------------------------------------------

def read_idx(path):
    for name in (path + ".gz", path):
        if os.path.exists(name):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(name, "rb") as handle:
                data = handle.read()
            break
    else:
        raise FileNotFoundError(f"no {path}[.gz]")
    if data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise ValueError(f"{name}: not an IDX file of unsigned bytes")
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * d:8 + 4 * d], "big") for d in range(rank)]
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank)
    if values.size != math.prod(dims):
        raise ValueError(f"{name}: {values.size} values for dimensions {dims}")
    return values.reshape(dims)


def sequential_sums(values, piece=1 << 20):
    """(sum of v, sum of v * v) over float32 values, each added in order in double as Lather's
    loop does (no -ffast-math: no reordering); the squares of floats are exact in double."""
    totals = [0.0, 0.0]
    chunk = np.empty(piece + 1, dtype=np.float64)
    for start in range(0, values.size, piece):
        part = values[start:start + piece]
        for which in (0, 1):
            chunk[0] = totals[which]
            wide = chunk[1:1 + part.size]
            wide[:] = part
            if which == 1:
                np.multiply(wide, wide, out=wide)
            totals[which] = float(np.add.accumulate(chunk[:1 + part.size])[-1])  # one add after the other
    return totals


def load_data(directory, train_samples, test_samples):
    """train::load_data_sets: (train x, train y, test x, test y), x float32 [n, 784] standardised."""
    sets = []
    for split in ("train", "t10k"):
        images = read_idx(os.path.join(directory, f"{split}-images-idx3-ubyte"))
        labels = read_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte"))
        x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
        sets.append((x, labels.astype(np.int64)))
    (train_x, train_y), (test_x, test_y) = sets
    if train_samples > len(train_y) or test_samples > len(test_y):
        raise ValueError("--train-samples / --test-samples beyond the data set")
    if train_samples > 0:
        train_x, train_y = train_x[:train_samples], train_y[:train_samples]
    if test_samples > 0:
        test_x, test_y = test_x[:test_samples], test_y[:test_samples]
    flat = train_x.reshape(-1)
    n = flat.size
    total, squares = sequential_sums(flat)
    mean = total / n
    deviation = math.sqrt(max(squares / n - mean * mean, 1e-12))
    standardise = lambda x: ((x.astype(np.float64) - mean) / deviation).astype(np.float32)  # noqa: E731
    return (torch.from_numpy(standardise(train_x)), torch.from_numpy(train_y),
            torch.from_numpy(standardise(test_x)), torch.from_numpy(test_y))


# --- model, schedule, optimizers ----------------------------------------------------------------

class Mlp(torch.nn.Module):
    def __init__(self, sizes, seed):
        super().__init__()
        self.names, tensors = [], []
        for layer, kernel in enumerate(initial_kernels(sizes, seed)):
            self.names += [f"layer{layer + 1}/kernel", f"layer{layer + 1}/bias"]
            tensors += [torch.from_numpy(kernel.copy()), torch.zeros(kernel.shape[1])]
        self.params = torch.nn.ParameterList([torch.nn.Parameter(t) for t in tensors])

    def forward(self, x):
        layers = len(self.params) // 2
        for layer in range(layers):
            x = torch.addmm(self.params[2 * layer + 1], x, self.params[2 * layer])  # x W + b
            if layer + 1 < layers:
                x = torch.relu(x)
        return x


DEFAULT_LR = {"adam": 2e-3, "adamw": 2e-3, "shampoo": 6e-3}  # training_options.cpp default_learning_rate


def make_optimizer(args, model):
    params = list(model.params)
    if args.optimizer == "adamw":
        wd = 1e-4 if args.weight_decay is None else args.weight_decay
        return torch.optim.AdamW(params, lr=0.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd, foreach=True)
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=0.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay or 0.0,
                                foreach=True)
    # pylint: disable=import-outside-toplevel
    import dataclasses
    from distributed_shampoo import (AdaGradPreconditionerConfig, AdamPreconditionerConfig, DefaultShampooConfig,
                                     DistributedShampoo, RMSpropPreconditionerConfig, SGDPreconditionerConfig)
    from distributed_shampoo.shampoo_types import ClassicMomentumConfig
    eps = args.shampoo_graft_epsilon
    graft = {
        "adagrad": lambda: AdaGradPreconditionerConfig(epsilon=eps),
        "adam": lambda: AdamPreconditionerConfig(beta2=args.shampoo_beta2, epsilon=eps),
        "rmsprop": lambda: RMSpropPreconditionerConfig(beta2=args.shampoo_beta2, epsilon=eps),
        "sgd": SGDPreconditionerConfig,
        "none": lambda: None,
    }[args.shampoo_graft]()
    override = {1: 0.0} if args.shampoo_biases == "graft" else {}
    if args.shampoo_side == "input":
        override[2] = {0: 0.5, 1: 0.0}
    preconditioner = dataclasses.replace(DefaultShampooConfig, inverse_exponent_override=override)
    if args.shampoo_momentum == "nesterov":
        betas = (0.0, args.shampoo_beta2)
        momentum = ClassicMomentumConfig(momentum=args.shampoo_beta1, dampening=0.0, use_nesterov=True)
    else:
        betas, momentum = (args.shampoo_beta1, args.shampoo_beta2), None
    matrices = [p for p in params if p.dim() >= 2]
    vectors = [p for p in params if p.dim() < 2]
    groups = [{"params": matrices}]
    if args.shampoo_biases == "graft":
        # Never past the grafting method: the graft's own update, as Lather's rank < 2 tensors.
        groups.append({"params": vectors, "start_preconditioning_step": 1 << 62})
    else:
        groups[0]["params"] = params
    return DistributedShampoo(
        groups, lr=0.0, betas=betas, epsilon=args.shampoo_epsilon, weight_decay=args.weight_decay or 0.0,
        max_preconditioner_dim=args.shampoo_block_size, precondition_frequency=args.shampoo_precondition_frequency,
        start_preconditioning_step=args.shampoo_start_step, grafting_config=graft,
        iterate_averaging_config=momentum, preconditioner_config=preconditioner)


# --- checks -------------------------------------------------------------------------------------

def check_initial(model, checkpoint):
    """Bit-for-bit comparison of the initial parameters with a Lather checkpoint's."""
    report = {"check_initial": checkpoint, "parameters": {}}
    for name, p in zip(model.names, model.params):
        ours = p.detach().float().numpy().reshape(-1)
        theirs = h5dump_dataset(checkpoint, "/parameters/" + name, ours.size)
        report["parameters"][name] = int(np.count_nonzero(ours.view(np.uint32) != theirs.view(np.uint32)))
    report["identical"] = all(v == 0 for v in report["parameters"].values())
    return report


def compare_metrics(path, step_losses, evaluations):
    """Largest relative differences from a lather-train --metrics file (taken with --log-every 1)."""
    theirs_loss, theirs_accuracy = {}, {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if "train_accuracy" in record:  # a progress line
                theirs_loss[record["step"]] = record["loss"]
            elif "test_accuracy" in record and not record.get("final"):
                theirs_accuracy[record["step"]] = record["test_accuracy"]
    common = sorted(set(theirs_loss) & set(step_losses))
    relative = [abs(step_losses[s] - theirs_loss[s]) / abs(theirs_loss[s]) for s in common]
    accuracy = {s: [evaluations[s], theirs_accuracy[s]] for s in sorted(set(evaluations) & set(theirs_accuracy))}
    worst = int(np.argmax(relative)) if relative else -1
    return {"compare": path, "steps_compared": len(common),
            "max_relative_loss_difference": max(relative) if relative else None,
            "at_step": common[worst] if relative else None,
            "relative_loss_difference_by_step": {s: r for s, r in zip(common, relative)},
            "test_accuracy_twin_lather": accuracy}


# --- training -----------------------------------------------------------------------------------

def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--data", default=DEFAULT_DATA, help="Fashion-MNIST directory (lather-train --data)")
    add("--optimizer", default="adamw", choices=["adamw", "adam", "shampoo"])
    add("--lr", type=float, default=None, help="peak learning rate (default: lather-train's: adam/adamw 2e-3, "
        "shampoo 6e-3)")
    add("--schedule", default="cosine", choices=["constant", "warmup", "cosine", "linear", "rsqrt"])
    add("--warmup-steps", type=int, default=100)
    add("--schedule-steps", type=int, default=0, help="steps the schedule spans (0: the planned steps)")
    add("--weight-decay", type=float, default=None, help="adamw: decoupled, 1e-4 if not given; adam: L2; "
        "shampoo: decoupled (default 0)")
    add("--seed", type=int, default=0, help="initial weights and data order")
    add("--hidden", default="512,256", help="hidden layer sizes")
    add("--batch-size", type=int, default=128)
    add("--epochs", type=int, default=3)
    add("--max-steps", type=int, default=0, help="stop after N steps (0: the epochs)")
    add("--train-samples", type=int, default=0)
    add("--test-samples", type=int, default=0)
    add("--eval-every", type=int, default=0, help="also evaluate every N steps (0: epoch ends only)")
    add("--log-every", type=int, default=0, help="a loss line every N steps (0: none)")
    add("--target-accuracy", type=float, default=0.88, help="stop at the first evaluation at or above it (0: never)")
    add("--dtype", default="float32", choices=["float32", "float64"], help="float64: a reference for how far "
        "float32 rounding alone moves the trajectory (Lather trains in float32)")
    add("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch.set_num_threads")
    add("--check-initial", metavar="CHECKPOINT", help="compare the initial weights with a Lather checkpoint "
        "written after one adam/adamw step, then go on")
    add("--lather-metrics", metavar="FILE", help="at the end, compare per-step losses and test accuracies with a "
        "lather-train --metrics file of the same run (--log-every 1)")
    add("--shampoo-block-size", type=int, default=128, help="max_preconditioner_dim")
    add("--shampoo-precondition-frequency", type=int, default=100)
    add("--shampoo-start-step", type=int, default=-1, help="start_preconditioning_step (-1: Meta's default, "
        "= the precondition frequency; Meta requires it >= the frequency)")
    add("--shampoo-epsilon", type=float, default=1e-12)
    add("--shampoo-beta1", type=float, default=0.85)
    add("--shampoo-beta2", type=float, default=0.999)
    add("--shampoo-graft", default="adagrad", choices=["adagrad", "adam", "rmsprop", "sgd", "none"])
    add("--shampoo-graft-epsilon", type=float, default=1e-10)
    add("--shampoo-momentum", default="nesterov", choices=["nesterov", "ema"])
    add("--shampoo-side", default="input", choices=["input", "all"])
    add("--shampoo-biases", default="graft", choices=["graft", "precondition"])
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    args.hidden = [int(h) for h in args.hidden.split(",")]
    return args


def emit(record):
    print(json.dumps(record), flush=True)


def main(argv=None):
    args = parse_arguments(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # nothing here draws from torch; kept for any library that does
    check_mt19937_64()
    train_x, train_y, test_x, test_y = load_data(args.data, args.train_samples, args.test_samples)
    dtype = getattr(torch, args.dtype)
    train_x, test_x = train_x.to(dtype), test_x.to(dtype)
    classes = int(max(train_y.max(), test_y.max())) + 1
    sizes = [train_x.shape[1]] + args.hidden + [classes]
    model = Mlp(sizes, args.seed).to(dtype)
    if args.check_initial:
        emit(check_initial(model, args.check_initial))
    optimizer = make_optimizer(args, model)

    count, batch = len(train_y), args.batch_size
    steps_per_epoch = (count + batch - 1) // batch
    planned = args.epochs * steps_per_epoch
    if args.max_steps > 0:
        planned = min(planned, args.max_steps)
    samples_for_schedule = args.train_samples if args.train_samples > 0 else LATHER_TRAIN_SAMPLES
    schedule_planned = args.schedule_steps
    if schedule_planned <= 0:
        schedule_planned = args.epochs * ((samples_for_schedule + batch - 1) // batch)
        if args.max_steps > 0:
            schedule_planned = min(schedule_planned, args.max_steps)
    decay_steps = max(1, schedule_planned - args.warmup_steps)

    def evaluate():
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for begin in range(0, len(test_y), EVAL_ROWS):
                logits = model(test_x[begin:begin + EVAL_ROWS])
                y = test_y[begin:begin + EVAL_ROWS]
                loss_sum += float(F.cross_entropy(logits.double(), y, reduction="sum"))
                correct += int((logits.argmax(dim=1) == y).sum())
        return loss_sum / len(test_y), correct / len(test_y)

    step, seconds, evaluation_seconds = 0, 0.0, 0.0
    started = time.perf_counter()
    window = [0.0, 0]  # loss sum, steps since the last log line
    since_eval = [0.0, 0]
    step_losses, evaluations = {}, {}
    reached, target_step, target_seconds, test_accuracy = False, None, None, None
    stop = False

    def run_evaluation(epoch):
        nonlocal evaluation_seconds, reached, target_step, target_seconds, test_accuracy, stop
        began = time.perf_counter()
        test_loss, test_accuracy = evaluate()
        evaluation_seconds += time.perf_counter() - began
        training_seconds = time.perf_counter() - started - evaluation_seconds
        evaluations[step] = test_accuracy
        emit({"step": step, "epoch": epoch + 1, "seconds": training_seconds,
              "train_loss": since_eval[0] / max(since_eval[1], 1), "test_accuracy": test_accuracy,
              "test_loss": test_loss})
        since_eval[0], since_eval[1] = 0.0, 0
        if args.target_accuracy > 0 and test_accuracy >= args.target_accuracy and not reached:
            reached, target_step, target_seconds = True, step, training_seconds
            stop = True

    current_epoch, last_epoch_done = 0, False
    for epoch in range(args.epochs):
        if stop:
            break
        current_epoch = epoch
        order = torch.from_numpy(epoch_order(count, args.seed, epoch))
        for b in range(steps_per_epoch):
            index = order[b * batch:min(count, (b + 1) * batch)]
            x, y = train_x[index], train_y[index]
            rate = learning_rate(args.schedule, args.lr, args.warmup_steps, decay_steps, step)
            for group in optimizer.param_groups:
                group["lr"] = rate
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            value = loss.detach().item()
            step_losses[step] = value
            window[0] += value
            window[1] += 1
            since_eval[0] += value
            since_eval[1] += 1
            epoch_done = b + 1 == steps_per_epoch
            at_limit = args.max_steps > 0 and step >= args.max_steps
            if args.log_every > 0 and (step % args.log_every == 0 or epoch_done or at_limit):
                emit({"step": step, "epoch": epoch + 1, "loss": window[0] / window[1],
                      "seconds": time.perf_counter() - started - evaluation_seconds, "learning_rate": rate})
                window = [0.0, 0]
            if args.eval_every > 0 and step % args.eval_every == 0 and not epoch_done:
                run_evaluation(epoch)
            last_epoch_done = epoch_done
            if at_limit:
                stop = True
            if epoch_done:
                run_evaluation(epoch)
            if stop:
                break
    if step > 0 and not last_epoch_done and step not in evaluations:
        run_evaluation(current_epoch)  # stopped between epoch ends: the final numbers from the test set
    seconds = time.perf_counter() - started - evaluation_seconds
    emit({"final": True, "optimizer": args.optimizer, "steps": step, "seconds": seconds,
          "seconds_per_step": seconds / max(step, 1), "test_accuracy": test_accuracy,
          "target_accuracy": args.target_accuracy, "reached": reached, "steps_to_target": target_step,
          "seconds_to_target": target_seconds, "threads": args.threads})
    if args.lather_metrics:
        emit(compare_metrics(args.lather_metrics, step_losses, evaluations))
    return 0


if __name__ == "__main__":
    sys.exit(main())
