#!/usr/bin/env python3
"""A PyTorch twin of `lather-train --model transformer`: the same model, data, initial weights,
schedule and AdamW, so that the two can be compared step by step; and Meta's DistributedShampoo
as a second optimizer, so that Lather's Shampoo can be compared with the reference PyTorch one on
the same problem.

Run it with the peer environment (scripts/peer-venv builds it; Meta's DistributedShampoo is linked
from a checkout, not installed):

    .venv-peer/bin/python perf/peer/transformer.py --optimizer adamw --max-steps 20 --log-every 1
    .venv-peer/bin/python perf/peer/transformer.py --optimizer shampoo --eval-every 50

Output, one JSON object per line: {"step", "seconds", "train_loss", "validation_loss",
"validation_accuracy"} at each evaluation (every --eval-every steps and at the end, as lather-train
evaluates), {"step", "loss", "seconds", "learning_rate"} every --log-every steps (0: none), and a
last line {"final": true, "steps", "seconds", "target_loss", "reached", "steps_to_target",
"seconds_to_target"}. The run stops at the first evaluation at or below --target-loss (0: never).
--compare METRICS adds, before the last line, the step-by-step comparison with a lather-train
--metrics file of the same run ({"compare": "loss" | "validation_loss", "step", "lather", "twin",
"relative_difference"}, then {"compare": "largest", ...}). perf/peer-bench --model transformer runs
this script beside lather-bench tta for steps and seconds to the target.
"seconds" counts training steps only, from the first step, without evaluations (lather-train's
"training_seconds"); "train_loss" is the mean training loss of the steps since the last
evaluation; "loss" the mean over the steps since the last --log-every line (lather-train's "loss").

What is the same as lather-train --model transformer on one rank (drivers/train/
language_model_trainer.cpp, src/nn/, src/data/text.cpp, drivers/train/training_options.cpp):

  * Data: --text is a directory with train.txt and validation.txt (scripts/fetch-shakespeare's
    /usr/share/datasets/shakespeare, the default) or one UTF-8 file whose last round(n / 10)
    characters (half up) validate. The vocabulary is the training text's code points, sorted;
    its size padded up to a multiple of 128 is the model's vocabulary (no text token maps to a
    padding id; the padding logits are in the softmax, as in Lather).
  * Windows: data::window_offsets(seed, step, batch, len(train), block) reimplemented exactly
    (splitmix64 twice, std::mt19937_64 -- reimplemented here with NumPy and checked against the
    C++ standard's 10000th output --, rejection below 2^64 mod r, x mod r); step s of the run
    trains on window_offsets(--seed, s, ...), evaluation on the fixed
    window_offsets(--seed ^ 0x5EED, -1, --eval-windows, len(validation), block), in pieces of
    --batch-size windows (lather-train's micro-batch on one rank).
  * Model (nn::Transformer): token embedding [V, D] + learned positions [block, D]; n_layer
    pre-LayerNorm blocks x1 = x + Wo(attention(LN1(x))), x' = x1 + Wout(GELU(Win LN2(x1))); causal
    self-attention scaled by 1/sqrt(head_dim), heads = contiguous column groups of the query, key
    and value projections; separate query, key and value kernels [D, D] with biases; MLP D -> 4D ->
    D with biases; GELU in its tanh form (src/nn/gelu.cpp); LayerNorm with scale and offset, biased
    variance, epsilon 1e-5; a final LayerNorm; an untied head [D, V] with a bias. Kernels are stored
    [in, out] as in Lather (y = x W + b). Loss: the mean cross-entropy over every token of the
    batch (Lather sums, and its gradient reduction divides by the tokens; z-loss 0).
  * Initial weights: Lather's own draw (src/nn/transformer.cpp), reimplemented: one
    std::mt19937_64(--seed), N(0, 1) by Box-Muller (u1 = ((x >> 11) + 1) 2^-53, u2 = (x >> 11)
    2^-53, r cos(2 pi u2) first, r sin(2 pi u2) kept for the next draw), drawn in the parameter
    list's order over the global tensors, row-major: matrices N(0, 0.02), the attention output and
    MLP out kernels N(0, 0.02 / sqrt(2 n_layer)), biases and offsets 0, scales 1, each value
    computed in double (Python's math, the same glibc libm) and rounded to float32.
    --check-initial CHECKPOINT compares them, bit for bit, with a Lather checkpoint written after
    one AdamW step (its learning rate is 0 at step 0 under the warm-up, so the parameters are the
    initial ones), read with Debian's h5dump.
  * Schedule (optim::LearningRateSchedule): --schedule cosine with --warmup-steps 100 (linear from
    0 at step 0, so the first update has learning rate 0), decaying to 0 over
    max(1, planned - warmup) steps, planned = min(--max-steps, --epochs x steps per epoch).
  * AdamW (optim::FirstOrder with AdamOptions, lather-train's adamw): lr 3e-3 (the transformer's
    default), betas 0.9 / 0.999, eps 1e-8, decoupled weight decay 1e-4 (lather-train's AdamW
    default when --weight-decay is not given) on every parameter (biases, LayerNorms and
    embeddings included), no gradient clipping. torch.optim.AdamW computes
    p (1 - lr wd) - lr m_hat / (sqrt(v) / sqrt(c2) + eps); Lather p - lr (m_hat / (sqrt(v / c2) +
    eps) + wd p): the same in exact arithmetic, different in float rounding.

What is not the same: float32 rounding everywhere (different GEMM, softmax, GELU and reduction
orders; Lather's GELU uses its own exp), so the trajectories agree to rounding, growing slowly
with the steps. Only one rank (Lather's data-parallel and tensor-parallel runs compute the same
steps up to rounding). No z-loss, accumulation, checkpoints or sampling.
Torch runs its operations on --threads OpenMP threads (default: the CPUs of this process's
affinity mask, as lather-train's BLAS on one rank). On cores that other jobs keep busy they wait
for each other: there a step took 7x longer on 2 threads than on 1; time runs on an idle machine.

How it was checked (2-core development VM, seed 0, default sizes, float32 on both sides, Lather
with Kokkos Serial and OpenBLAS):
  * --check-initial on `lather-train --model transformer --optimizer adamw --max-steps 1
    --checkpoint-dir D`: all 834,432 initial values bit-identical; the first step's loss
    4.8555098 against 4.8555099, and its gradient (the checkpoint's mu / 0.1) within 1.5e-6
    relative (2-norm) on every tensor but the key biases, whose gradient is 0 in exact arithmetic
    and ~1e-11 rounding on both sides.
  * lather-train --model transformer --optimizer adamw --max-steps 20 --log-every 1
    --eval-every 10 --metrics m.jsonl, then this script with --optimizer adamw --max-steps 20
    --log-every 1 --eval-every 10 --compare m.jsonl: the training loss of every one of the 20 steps
    within 1.2e-6 relative, the validation loss at steps 10 and 20 within 2.1e-7 and 9.8e-7. Over
    100 steps (--log-every 10 --eval-every 50) the 10-step mean losses stay within 1.2e-6, the
    validation losses at 50 and 100 within 5.1e-7 and 2.3e-7 (2.7380076 and 2.5817002).

Meta's DistributedShampoo (--optimizer shampoo), configured with Meta's AlgoPerf-style
settings: max_preconditioner_dim 128 (--shampoo-block-size), precondition_frequency 50
(--shampoo-precondition-frequency), start_preconditioning_step 50 (--shampoo-start-step),
epsilon 1e-12 (--shampoo-epsilon), betas (0.9, 0.999) (--shampoo-beta1, --shampoo-beta2: the
momentum and the statistics' moving average of lather-train's transformer Shampoo), weight decay
0 (lather-train's Shampoo default; --weight-decay, decoupled), Meta's default bias correction,
roots (DefaultShampooConfig: inverse roots by eigendecomposition of float32 factors) and
single-device distribution. The graft is
AdamPreconditionerConfig(beta2 = --shampoo-beta2 = 0.999, epsilon = --shampoo-graft-epsilon =
1e-10, Lather's diagonal_epsilon); --shampoo-graft adagrad gives AdaGradPreconditionerConfig
(epsilon), the counterpart of lather-train's transformer graft (ADAGRAD), and rmsprop, sgd, none
the others. 1-D parameters are preconditioned as Meta does by default; --shampoo-skip-1d leaves
them to the graft (inverse_exponent_override {1: 0.0}), as lather-train does
(skip_preconditioning_rank_lt 2). The learning rate follows the same schedule as AdamW's, peak 3e-3
(lather-train's transformer Shampoo default). This is a peer run, not a step-by-step twin of
Lather's Shampoo: Lather applies Nesterov momentum, a relative ridge 1e-6, per-tensor grafting and
roots from step 25, which Meta's options do not all express.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lather_twins import MASK64, MT19937_64, check_mt19937_64, h5dump_dataset, learning_rate  # noqa: E402

PADDED_VOCABULARY_MULTIPLE = 128  # language_model_trainer.cpp: padded_vocabulary_multiple
DEFAULT_TEXT = "/usr/share/datasets/shakespeare"


# --- Lather's random numbers --------------------------------------------------------------------

def splitmix64(x):
    """Steele, Lea & Flood's splitmix64, as src/data/text.cpp writes it."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def window_offsets(seed, step, count, tokens, block_size):
    """data::window_offsets, exactly (src/data/text.cpp)."""
    if tokens < block_size + 1:
        raise ValueError(f"a text of {tokens} tokens is shorter than one window of {block_size + 1}")
    r = tokens - block_size
    threshold = (1 << 64) % r  # (uint64(0) - r) % r
    engine = MT19937_64(splitmix64(splitmix64(seed & MASK64) ^ (step & MASK64)))
    offsets = []
    for _ in range(count):
        x = engine()
        while x < threshold:
            x = engine()
        offsets.append(x % r)
    return np.array(offsets, dtype=np.int64)


class Normal:
    """The N(0, 1) draws of src/nn/transformer.cpp: Box-Muller on a 64-bit Mersenne twister."""

    def __init__(self, seed):
        self.bits = MT19937_64(seed)

    def draw(self, count):
        """`count` draws in order, as doubles. Pairs are drawn whole: the caller takes all draws of
        a run from one call (the spare of an odd count would be lost otherwise)."""
        pairs = (count + 1) // 2
        words = self.bits.take(2 * pairs)
        out = np.empty(2 * pairs, dtype=np.float64)
        log, sqrt, cos, sin = math.log, math.sqrt, math.cos, math.sin
        two_pi = 2 * 3.14159265358979323846
        scale = 2.0 ** -53
        for i in range(pairs):
            u1 = float((words[2 * i] >> 11) + 1) * scale
            u2 = float(words[2 * i + 1] >> 11) * scale
            radius = sqrt(-2.0 * log(u1))
            angle = two_pi * u2
            out[2 * i] = radius * cos(angle)
            out[2 * i + 1] = radius * sin(angle)
        return out[:count]


# --- data ---------------------------------------------------------------------------------------

def load_corpus(path, validation_fraction=0.1):
    """data::load_text_corpus: (vocabulary, train ids, validation ids)."""
    def read(file):
        with open(file, "rb") as handle:
            return handle.read().decode("utf-8", errors="strict")

    if os.path.isdir(path):
        train_text = read(os.path.join(path, "train.txt"))
        validation_text = read(os.path.join(path, "validation.txt"))
    else:
        text = read(path)
        validation_characters = int(math.floor(len(text) * validation_fraction + 0.5))
        train_text, validation_text = text[:len(text) - validation_characters], text[len(text) - validation_characters:]
    vocabulary = sorted(set(train_text))
    index = {c: i for i, c in enumerate(vocabulary)}
    missing = sorted(set(validation_text) - set(vocabulary))
    if missing:
        raise ValueError(f"validation characters not in the training text's vocabulary: {missing[:5]!r}")

    def encode(text):
        table = np.full(max(ord(c) for c in vocabulary) + 1, -1, dtype=np.int64)
        for c, i in index.items():
            table[ord(c)] = i
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        return table[codes]

    return vocabulary, encode(train_text), encode(validation_text)


def batch_of(tokens, offsets, block):
    positions = offsets[:, None] + np.arange(block, dtype=np.int64)[None, :]
    return torch.from_numpy(tokens[positions]), torch.from_numpy(tokens[positions + 1])


# --- the model ----------------------------------------------------------------------------------

def parameter_layout(vocab, n_layer, d_model, block_size):
    """(name, shape) in nn::Transformer's list order: the order of the initial draws."""
    d = d_model
    specs = [("embedding/tokens", (vocab, d)), ("embedding/positions", (block_size, d))]
    for layer in range(n_layer):
        p = f"block{layer}/"
        specs += [(p + "ln1/scale", (d,)), (p + "ln1/offset", (d,)),
                  (p + "attention/query/kernel", (d, d)), (p + "attention/query/bias", (d,)),
                  (p + "attention/key/kernel", (d, d)), (p + "attention/key/bias", (d,)),
                  (p + "attention/value/kernel", (d, d)), (p + "attention/value/bias", (d,)),
                  (p + "attention/output/kernel", (d, d)), (p + "attention/output/bias", (d,)),
                  (p + "ln2/scale", (d,)), (p + "ln2/offset", (d,)),
                  (p + "mlp/in/kernel", (d, 4 * d)), (p + "mlp/in/bias", (4 * d,)),
                  (p + "mlp/out/kernel", (4 * d, d)), (p + "mlp/out/bias", (d,))]
    specs += [("final_ln/scale", (d,)), ("final_ln/offset", (d,)), ("head/kernel", (d, vocab)), ("head/bias", (vocab,))]
    return specs


def initial_values(specs, n_layer, seed):
    """Lather's GPT-2 initialisation (src/nn/transformer.cpp), as float32 arrays."""
    residual_scale = 1.0 / math.sqrt(2.0 * n_layer)
    normal_count = sum(math.prod(shape) for _, shape in specs if len(shape) == 2)
    draws = Normal(seed).draw(normal_count)
    values, used = {}, 0
    for name, shape in specs:
        if name.endswith("/scale"):
            values[name] = np.ones(shape, dtype=np.float32)
        elif len(shape) == 2:
            size = math.prod(shape)
            deviation = 0.02 * (residual_scale if name.endswith(("attention/output/kernel", "mlp/out/kernel")) else 1.0)
            values[name] = (deviation * draws[used:used + size]).astype(np.float32).reshape(shape)
            used += size
        else:
            values[name] = np.zeros(shape, dtype=np.float32)
    return values


class Transformer(torch.nn.Module):
    def __init__(self, vocab, n_layer, n_head, d_model, block_size, seed, eps=1e-5):
        super().__init__()
        self.n_layer, self.n_head, self.d_model, self.eps = n_layer, n_head, d_model, eps
        self.specs = parameter_layout(vocab, n_layer, d_model, block_size)
        values = initial_values(self.specs, n_layer, seed)
        self.names = [name for name, _ in self.specs]
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.from_numpy(values[name].copy())) for name in self.names])
        self.by_name = dict(zip(self.names, self.params))

    def forward(self, inputs):
        p = self.by_name
        batch, time_ = inputs.shape
        d, heads = self.d_model, self.n_head
        rows = batch * time_

        def linear(x, prefix):  # Lather's kernels are [in, out]: y = x W + b
            return torch.addmm(p[prefix + "/bias"], x, p[prefix + "/kernel"])

        def heads_of(x):
            return x.view(batch, time_, heads, d // heads).transpose(1, 2)

        x = (p["embedding/tokens"][inputs] + p["embedding/positions"][:time_]).view(rows, d)
        for layer in range(self.n_layer):
            b = f"block{layer}/"
            a = F.layer_norm(x, (d,), p[b + "ln1/scale"], p[b + "ln1/offset"], self.eps)
            q = heads_of(linear(a, b + "attention/query"))
            k = heads_of(linear(a, b + "attention/key"))
            v = heads_of(linear(a, b + "attention/value"))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(head_dim)
            y = y.transpose(1, 2).reshape(rows, d)
            x1 = linear(y, b + "attention/output") + x
            h = linear(F.layer_norm(x1, (d,), p[b + "ln2/scale"], p[b + "ln2/offset"], self.eps), b + "mlp/in")
            x = linear(F.gelu(h, approximate="tanh"), b + "mlp/out") + x1
        f = F.layer_norm(x, (d,), p["final_ln/scale"], p["final_ln/offset"], self.eps)
        return linear(f, "head")  # [rows, vocab]


# --- schedule and optimizers --------------------------------------------------------------------

def make_optimizer(args, parameters):
    if args.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=0.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay,
                                 foreach=True)
    from distributed_shampoo import (  # pylint: disable=import-outside-toplevel
        AdaGradPreconditionerConfig, AdamPreconditionerConfig, DefaultShampooConfig, DistributedShampoo,
        RMSpropPreconditionerConfig, SGDPreconditionerConfig)
    graft = {
        "adam": lambda: AdamPreconditionerConfig(beta2=args.shampoo_beta2, epsilon=args.shampoo_graft_epsilon),
        "adagrad": lambda: AdaGradPreconditionerConfig(epsilon=args.shampoo_graft_epsilon),
        "rmsprop": lambda: RMSpropPreconditionerConfig(beta2=args.shampoo_beta2, epsilon=args.shampoo_graft_epsilon),
        "sgd": SGDPreconditionerConfig,
        "none": lambda: None,
    }[args.shampoo_graft]()
    preconditioner = DefaultShampooConfig
    if args.shampoo_skip_1d:
        import dataclasses  # pylint: disable=import-outside-toplevel
        preconditioner = dataclasses.replace(DefaultShampooConfig, inverse_exponent_override={1: 0.0})
    return DistributedShampoo(
        parameters, lr=0.0, betas=(args.shampoo_beta1, args.shampoo_beta2), epsilon=args.shampoo_epsilon,
        weight_decay=args.weight_decay, max_preconditioner_dim=args.shampoo_block_size,
        precondition_frequency=args.shampoo_precondition_frequency,
        start_preconditioning_step=args.shampoo_start_step, grafting_config=graft,
        preconditioner_config=preconditioner)


# --- checks -------------------------------------------------------------------------------------

def check_initial(model, checkpoint, dataset_format, first_batch):
    """Bit-for-bit comparison of the initial weights with a Lather checkpoint's parameters, and of
    the first step's gradient with the checkpoint's AdamW first moment (mu = 0.1 g after one step)
    where the checkpoint has one."""
    mismatched = 0
    for name, param in zip(model.names, model.params):
        ours = param.detach().numpy().ravel()
        theirs = h5dump_dataset(checkpoint, dataset_format.format(name=name), ours.size)
        differ = int(np.count_nonzero(ours.view(np.uint32) != theirs.view(np.uint32)))
        mismatched += differ
        if differ:
            print(f"{name}: {differ} of {ours.size} values differ (largest {np.max(np.abs(ours - theirs)):.3g})",
                  file=sys.stderr)
    report = {"check_initial": checkpoint, "parameters": len(model.names),
              "values": int(sum(p.numel() for p in model.params)), "values_differing": mismatched}
    inputs, targets = first_batch
    loss = F.cross_entropy(model(inputs), targets.reshape(-1))
    loss.backward()
    worst = 0.0
    try:
        for name, param in zip(model.names, model.params):
            if name.endswith("attention/key/bias"):
                continue  # its gradient is 0 in exact arithmetic (softmax ignores a shift common to all keys)
            ours = param.grad.numpy().ravel().astype(np.float64)
            theirs = h5dump_dataset(checkpoint, f"/optimizer/local/{name}/mu", ours.size).astype(np.float64) / 0.1
            worst = max(worst, float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30)))
        report["first_loss"] = float(loss.detach())
        report["first_gradient_largest_relative_difference"] = worst  # per tensor, in the 2-norm
    except subprocess.CalledProcessError:
        report["first_gradient"] = "no /optimizer/local/<name>/mu in the checkpoint (not AdamW)"
    print(json.dumps(report))
    return mismatched == 0


def compare(metrics, logged, evaluated):
    """Prints, against a lather-train --metrics file of the same run (the same --seed, --max-steps,
    --log-every and --eval-every), each logged step's training losses and each evaluation's
    validation losses with their relative difference, then the largest of each."""
    records = [json.loads(line) for line in open(metrics, encoding="utf-8") if line.strip()]
    theirs_logged = {r["step"]: r["loss"] for r in records if "bits_per_char" in r}
    theirs_evaluated = {r["step"]: r["validation_loss"] for r in records if "validation_accuracy" in r}
    worst = {"loss": 0.0, "validation_loss": 0.0}
    for what, ours, theirs in (("loss", logged, theirs_logged), ("validation_loss", evaluated, theirs_evaluated)):
        for step in sorted(set(ours) & set(theirs)):
            difference = abs(ours[step] - theirs[step]) / abs(theirs[step])
            worst[what] = max(worst[what], difference)
            print(json.dumps({"compare": what, "step": step, "lather": theirs[step], "twin": ours[step],
                              "relative_difference": difference}))
    print(json.dumps({"compare": "largest", "steps_compared": len(set(logged) & set(theirs_logged)),
                      "evaluations_compared": len(set(evaluated) & set(theirs_evaluated)),
                      "loss_relative_difference": worst["loss"],
                      "validation_loss_relative_difference": worst["validation_loss"]}), flush=True)


# --- the run ------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", default=os.environ.get("LATHER_SHAKESPEARE_DIR", DEFAULT_TEXT))
    parser.add_argument("--optimizer", choices=("adamw", "shampoo"), default="adamw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3,
                        help="as lather-train: planned steps = min(max-steps, epochs x steps per epoch)")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-windows", type=int, default=128)
    parser.add_argument("--log-every", type=int, default=0, help="a training-loss line every N steps (0: none)")
    parser.add_argument("--target-loss", type=float, default=1.8, help="stop at a validation loss <= this (0: never)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--schedule", choices=("constant", "warmup", "cosine", "linear", "rsqrt"), default="cosine")
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=None,
                        help="decoupled; default 1e-4 for adamw (lather-train's), 0 for shampoo")
    parser.add_argument("--shampoo-block-size", type=int, default=128, help="max_preconditioner_dim")
    parser.add_argument("--shampoo-precondition-frequency", type=int, default=50)
    parser.add_argument("--shampoo-start-step", type=int, default=50, help="start_preconditioning_step")
    parser.add_argument("--shampoo-epsilon", type=float, default=1e-12)
    parser.add_argument("--shampoo-beta1", type=float, default=0.9)
    parser.add_argument("--shampoo-beta2", type=float, default=0.999)
    parser.add_argument("--shampoo-graft", choices=("adam", "adagrad", "rmsprop", "sgd", "none"), default="adam")
    parser.add_argument("--shampoo-graft-epsilon", type=float, default=1e-10)
    parser.add_argument("--shampoo-skip-1d", action="store_true",
                        help="leave 1-D parameters to the graft, as lather-train's skip_preconditioning_rank_lt 2")
    parser.add_argument("--compare", metavar="METRICS",
                        help="compare the logged and validation losses with a lather-train --metrics file")
    parser.add_argument("--check-initial", metavar="CHECKPOINT",
                        help="compare the initial weights with a Lather checkpoint written after one AdamW step, "
                             "then exit (status 1 if any bit differs)")
    parser.add_argument("--checkpoint-dataset", default="/parameters/{name}",
                        help="the dataset of parameter {name} in --check-initial's file")
    args = parser.parse_args(argv)
    if args.weight_decay is None:
        args.weight_decay = 1e-4 if args.optimizer == "adamw" else 0.0
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    check_mt19937_64()
    vocabulary, train, validation = load_corpus(args.text)
    vocab = -(-len(vocabulary) // PADDED_VOCABULARY_MULTIPLE) * PADDED_VOCABULARY_MULTIPLE
    model = Transformer(vocab, args.n_layer, args.n_head, args.d_model, args.block_size, args.seed)
    if args.check_initial:
        first = batch_of(train, window_offsets(args.seed, 0, args.batch_size, len(train), args.block_size),
                         args.block_size)
        return 0 if check_initial(model, args.check_initial, args.checkpoint_dataset, first) else 1

    block, batch = args.block_size, args.batch_size
    steps_per_epoch = max(1, len(train) // (batch * block))
    planned = args.epochs * steps_per_epoch
    if args.max_steps > 0:
        planned = min(args.max_steps, planned)
    decay_steps = max(1, max(1, planned) - args.warmup_steps)
    optimizer = make_optimizer(args, list(model.params))
    validation_offsets = window_offsets(args.seed ^ 0x5EED, -1, args.eval_windows, len(validation), block)
    print(json.dumps({"model": "transformer", "optimizer": args.optimizer, "vocabulary": len(vocabulary),
                      "padded_vocabulary": vocab, "parameters": int(sum(p.numel() for p in model.params)),
                      "train_characters": int(len(train)), "validation_characters": int(len(validation)),
                      "planned_steps": planned, "threads": args.threads, "torch": torch.__version__}), flush=True)

    def evaluate():
        loss_sum, correct, tokens = 0.0, 0, 0
        with torch.no_grad():
            for start in range(0, len(validation_offsets), batch):
                inputs, targets = batch_of(validation, validation_offsets[start:start + batch], block)
                logits = model(inputs)
                targets = targets.reshape(-1)
                loss_sum += float(F.cross_entropy(logits, targets, reduction="none").double().sum())
                target_logits = logits.gather(1, targets[:, None])[:, 0]
                correct += int((target_logits >= logits.max(dim=1).values).sum())  # ties count, as in Lather
                tokens += targets.numel()
        return loss_sum / tokens, correct / tokens

    training_seconds = 0.0
    since_eval, since_log = [], []
    logged, evaluated = {}, {}  # step -> loss, step -> validation loss: what --compare reads
    reached = None
    step = 0
    for step in range(planned):
        began = time.perf_counter()
        offsets = window_offsets(args.seed, step, batch, len(train), block)
        inputs, targets = batch_of(train, offsets, block)
        rate = learning_rate(args.schedule, args.lr, args.warmup_steps, decay_steps, step)
        for group in optimizer.param_groups:
            group["lr"] = rate
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        training_seconds += time.perf_counter() - began
        since_eval.append(value)
        since_log.append(value)
        done = step + 1
        if args.log_every > 0 and (done % args.log_every == 0 or done == planned):
            logged[done] = sum(since_log) / len(since_log)
            print(json.dumps({"step": done, "loss": logged[done], "seconds": training_seconds,
                              "learning_rate": rate}), flush=True)
            since_log = []
        if (args.eval_every > 0 and done % args.eval_every == 0) or done == planned:
            validation_loss, accuracy = evaluate()
            evaluated[done] = validation_loss
            print(json.dumps({"step": done, "seconds": training_seconds,
                              "train_loss": sum(since_eval) / len(since_eval), "validation_loss": validation_loss,
                              "validation_accuracy": accuracy}), flush=True)
            since_eval = []
            if args.target_loss > 0 and validation_loss <= args.target_loss:
                reached = (done, training_seconds)
                break
    if args.compare:
        compare(args.compare, logged, evaluated)
    print(json.dumps({"final": True, "steps": step + 1 if planned > 0 else 0, "seconds": training_seconds,
                      "seconds_per_step": training_seconds / max(1, step + 1), "target_loss": args.target_loss,
                      "reached": reached is not None, "steps_to_target": reached[0] if reached else None,
                      "seconds_to_target": reached[1] if reached else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
