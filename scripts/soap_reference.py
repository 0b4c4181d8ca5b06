#!/usr/bin/env python3
"""Runs the reference SOAP (pytorch-optimizer 4.1.0, `from pytorch_optimizer import SOAP`, the
authors' algorithm of arXiv 2409.11321) on a fixed problem and writes the trajectories that
Lather's C++ SOAP test replays: tests/data/soap_reference/<set>.json.

Run it with the pinned environment:  $(scripts/soap-reference-venv) scripts/soap_reference.py

The problem is defined on Lather's parameters so that C++ can reproduce its inputs bit for bit:
initial values and gradients are computed in IEEE double with the C library's sin/cos (Python's
math module), evaluated left to right exactly as written below, and rounded once to float32.

Lather's SOAP partitions a (merged) parameter into blocks of at most block_size per dimension
and treats each block as the authors' SOAP treats a parameter. The reference has no blocking, so
a blocked Lather parameter is given to the reference as its blocks, each a separate parameter
("reference_tensors" in the JSON says which slice of which Lather parameter each one is); the
records hold the Lather parameters reassembled from them.

Numerical design (why the trajectories are reproducible by an independent implementation):
every factor that is preconditioned is full rank from its first statistic (2-D blocks are
square, 3-D blocks have every dimension <= the product of the others, a larger side is skipped
by max_precondition_dim), and the gradients carry a quadratic phase in the element index so
that they are of full rank (a plain sin(a k + b) is rank 2 as a matrix). A rank-deficient factor
has an arbitrary eigenbasis in its null space, and two correct implementations then diverge.
The signs of eigenvectors and QR columns do not matter: the reference keeps exp_avg in the
original space and projects it with the current basis on every step, and exp_avg_sq holds
squares. What does matter is the eigenvalue order; the diagnostics report the smallest relative
gap between consecutive (estimated) eigenvalues that decided an order, and how far one float32
ulp in every gradient moves the parameters (the floor any reimplementation can reach).
"""

import argparse
import importlib.metadata
import json
import math
import os
import re
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "soap_reference")
NUM_STEPS = 30
RECORDED_STEPS = [0, 1, 2, 3, 5, 10, 15, 20, 25, 30]

# Lather's option names; "reference" holds the same options under pytorch-optimizer's names.
OPTION_SETS = [
    {
        "name": "defaults_normalize",
        "description": (
            "The reference's defaults (betas 0.95/0.95, shampoo_beta None -> beta2, eps 1e-8, "
            "weight_decay 0.01, correct_bias) with precondition_frequency 1 (a QR refresh on "
            "every step after the first eigh) and normalize_gradient; no merging, no blocking. "
            "'square' [10,10] has two 10x10 factors, 'cube' [4,6,5] three factors, 'bias' [7] "
            "and 'scalar' [] none (Adam in the original basis)."),
        "parameters": [("scalar", []), ("bias", [7]), ("square", [10, 10]), ("cube", [4, 6, 5])],
        "options": {
            "learning_rate": 0.01, "beta1": 0.95, "beta2": 0.95, "shampoo_beta": -1.0,
            "epsilon": 1e-8, "weight_decay": 0.01, "precondition_frequency": 1,
            "max_precond_dim": 10000, "block_size": 0, "merge_small_dims_block_size": 0,
            "precondition_1d": False, "normalize_grads": True, "correct_bias": True,
        },
    },
    {
        "name": "blocked_frequency3",
        "description": (
            "block_size 8: 'square16' [16,16] is four 8x8 blocks, 'slab' [12,6,6] the blocks "
            "[8,6,6] and [4,6,6] (a remainder block last); precondition_frequency 3 (eigh after "
            "step 1, QR refreshes at reference steps 3, 6, ...), betas 0.9/0.99, shampoo_beta "
            "0.8, no weight decay, bias correction, no normalization. The reference runs every "
            "block as a parameter of its own."),
        "parameters": [("scalar", []), ("square16", [16, 16]), ("slab", [12, 6, 6]), ("bias", [5])],
        "options": {
            "learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99, "shampoo_beta": 0.8,
            "epsilon": 1e-8, "weight_decay": 0.0, "precondition_frequency": 3,
            "max_precond_dim": 10000, "block_size": 8, "merge_small_dims_block_size": 0,
            "precondition_1d": False, "normalize_grads": False, "correct_bias": True,
        },
    },
    {
        "name": "merged_skipped_nobias",
        "description": (
            "merge_dims with max_precond_dim 8 (Lather: merge_small_dims_block_size 8, "
            "max_precond_dim 8): 'wide' [6,40] keeps a 6x6 left factor, its 40 side is skipped; "
            "'tall' [40,6] the other way round; 'conv' [2,3,6,2,2] merges to [6,6,4]; 'square8' "
            "[8,8] stays. precondition_frequency 2, betas 0.9/0.95, weight_decay 0.05, no bias "
            "correction, no normalization."),
        "parameters": [("wide", [6, 40]), ("tall", [40, 6]), ("conv", [2, 3, 6, 2, 2]),
                       ("square8", [8, 8])],
        "options": {
            "learning_rate": 0.005, "beta1": 0.9, "beta2": 0.95, "shampoo_beta": -1.0,
            "epsilon": 1e-8, "weight_decay": 0.05, "precondition_frequency": 2,
            "max_precond_dim": 8, "block_size": 0, "merge_small_dims_block_size": 8,
            "precondition_1d": False, "normalize_grads": False, "correct_bias": False,
        },
    },
]


def initial_value(k, pidx):
    """p0[k] = float32(cos(0.23*(k+1) + 0.7*pidx))."""
    return math.cos(0.23 * (k + 1) + 0.7 * pidx)


def gradient_value(p, k, pidx, t):
    """g[k] = float32(0.1*p + sin(0.37*(k+1) + 1.3*(t+1) + 0.61*pidx)
                      + 0.5*cos(0.011*(k+1)*(k+1) + 0.7*(t+1) + 0.3*pidx)), p the float32 value.
    The quadratic phase makes the gradient of full rank as a matrix along every dimension."""
    return (0.1 * p + math.sin(0.37 * (k + 1) + 1.3 * (t + 1) + 0.61 * pidx)
            + 0.5 * math.cos(0.173 * (k + 1) * (k + 1) + 0.7 * (t + 1) + 0.3 * pidx))


def block_slices(shape, block_size):
    """Lather's BlockPartition: per dimension splits of block_size (remainder last), blocks in
    row-major order over block indices. block_size <= 0: one block."""
    splits = []
    for d in shape:
        if 0 < block_size < d:
            splits.append([(s, min(block_size, d - s)) for s in range(0, d, block_size)])
        else:
            splits.append([(0, d)])
    blocks = [[]]
    for dim_splits in splits:
        blocks = [b + [s] for b in blocks for s in dim_splits]
    return blocks


def reference_kwargs(options):
    return {
        "lr": options["learning_rate"],
        "betas": (options["beta1"], options["beta2"]),
        "shampoo_beta": None if options["shampoo_beta"] < 0 else options["shampoo_beta"],
        "weight_decay": options["weight_decay"],
        "precondition_frequency": options["precondition_frequency"],
        "max_precondition_dim": options["max_precond_dim"],
        "merge_dims": options["merge_small_dims_block_size"] > 0,
        "precondition_1d": options["precondition_1d"],
        "correct_bias": options["correct_bias"],
        "normalize_gradient": options["normalize_grads"],
        "eps": options["epsilon"],
    }


class GapLog:
    """Smallest relative gap between neighbouring eigenvalues that decided a column order, over
    the run (eigh: exact eigenvalues of GG in double; QR refresh: the estimates diag(Q^T GG Q))."""

    def __init__(self):
        self.eigh = math.inf
        self.qr = math.inf
        self.calls = {"eigh": 0, "qr": 0}

    @staticmethod
    def gap(values):
        values = sorted((float(v) for v in values), reverse=True)
        if len(values) < 2:
            return math.inf
        scale = max(abs(values[0]), 1e-300)
        return min((values[i] - values[i + 1]) / scale for i in range(len(values) - 1))

    def install(self, torch, soap_class):
        log = self
        original_eigh = soap_class.get_orthogonal_matrix
        original_qr = soap_class.get_orthogonal_matrix_qr

        def eigh(mat):
            for m in mat:
                if len(m) > 0:
                    log.calls["eigh"] += 1
                    log.eigh = min(log.eigh, log.gap(torch.linalg.eigvalsh(m.double())))
            return original_eigh(mat)

        def qr(self_, state, *args, **kwargs):
            for m, o in zip(state["GG"], state["Q"]):
                if len(m) > 0:
                    log.calls["qr"] += 1
                    log.qr = min(log.qr, log.gap((o.double() * (m.double() @ o.double())).sum(0)))
            return original_qr(self_, state, *args, **kwargs)

        soap_class.get_orthogonal_matrix = staticmethod(eigh)
        soap_class.get_orthogonal_matrix_qr = qr
        return original_eigh, original_qr


def run_option_set(torch, np, option_set, perturb=False, gaps=None):
    from pytorch_optimizer import SOAP  # pylint: disable=import-outside-toplevel

    options = option_set["options"]
    parameters = option_set["parameters"]
    # Lather's view of each parameter: merged shape, then blocks of it (reference tensors).
    tensors = []  # (lather parameter index, merged shape, block offsets/sizes, torch parameter)
    values = {}
    for pidx, (name, shape) in enumerate(parameters):
        size = math.prod(shape)
        values[name] = np.asarray([initial_value(k, pidx) for k in range(size)],
                                  dtype=np.float64).astype(np.float32)
        blocks = block_slices(shape, options["block_size"])
        if options["block_size"] > 0 and options["merge_small_dims_block_size"] > 0:
            raise RuntimeError("blocking is tested without merging (shapes are then unambiguous)")
        for block in blocks:
            tensors.append((pidx, shape, block))

    def block_of(array, shape, block):
        view = array.reshape(shape) if shape else array.reshape(())
        index = tuple(slice(o, o + s) for o, s in block)
        return np.ascontiguousarray(view[index]) if shape else view.copy()

    torch_params = []
    for pidx, shape, block in tensors:
        name = parameters[pidx][0]
        torch_params.append(torch.nn.Parameter(torch.from_numpy(block_of(values[name], shape, block))))
    optimizer = SOAP(torch_params, **reference_kwargs(options))

    def gather():
        result = {}
        for pidx, (name, shape) in enumerate(parameters):
            full = np.zeros(math.prod(shape), np.float32)
            view = full.reshape(shape) if shape else full.reshape(())
            for (q, _, block), param in zip(tensors, torch_params):
                if q == pidx:
                    index = tuple(slice(o, o + s) for o, s in block)
                    view[index] = param.detach().numpy()
            result[name] = full
        return result

    records = [{"step": 0, "params": {n: [float(v) for v in values[n]] for n, _ in parameters}}]
    for t in range(NUM_STEPS):
        current = gather()
        grads = {}
        for pidx, (name, _) in enumerate(parameters):
            g = np.asarray([gradient_value(float(p), k, pidx, t) for k, p in enumerate(current[name])],
                           dtype=np.float64).astype(np.float32)
            if perturb:
                up = (np.arange(g.size) + t) % 2 == 0
                g = np.where(up, np.nextafter(g, np.float32(np.inf)),
                             np.nextafter(g, np.float32(-np.inf))).astype(np.float32)
            grads[name] = g
        for (pidx, shape, block), param in zip(tensors, torch_params):
            param.grad = torch.from_numpy(block_of(grads[parameters[pidx][0]], shape, block))
        optimizer.step()
        if t + 1 in RECORDED_STEPS:
            current = gather()
            records.append({"step": t + 1,
                            "params": {n: [float(v) for v in current[n]] for n, _ in parameters}})
    for record in records:
        for name, vals in record["params"].items():
            if not all(math.isfinite(v) for v in vals):
                raise RuntimeError(f"{option_set['name']}: non-finite '{name}' at {record['step']}")

    reference_tensors = [{"parameter": parameters[pidx][0],
                          "offset": [o for o, _ in block], "size": [s for _, s in block]}
                         for pidx, _, block in tensors]
    return {
        "generator": "scripts/soap_reference.py",
        "versions": {name: importlib.metadata.version(name)
                     for name in ("pytorch_optimizer", "torch", "numpy")},
        "name": option_set["name"],
        "description": option_set["description"],
        "options": options,
        "reference_options": {k: (list(v) if isinstance(v, tuple) else v)
                              for k, v in reference_kwargs(options).items()},
        "parameters": [{"name": n, "shape": s} for n, s in parameters],
        "reference_tensors": reference_tensors,
        "steps": NUM_STEPS,
        "records": records,
    }


def to_json(result):
    """Indented JSON with each list of numbers on one line (small files, readable diffs)."""
    number_lists = []

    def collapse(value):
        if isinstance(value, dict):
            return {k: collapse(v) for k, v in value.items()}
        if isinstance(value, list):
            if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                number_lists.append(json.dumps(value, allow_nan=False))
                return f"@@number_list_{len(number_lists) - 1}@@"
            return [collapse(v) for v in value]
        return value

    text = json.dumps(collapse(result), indent=1, allow_nan=False)
    text = re.sub(r'"@@number_list_(\d+)@@"', lambda m: number_lists[int(m.group(1))], text)
    return text + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--only", action="append", default=[], help="option set name (repeatable)")
    args = parser.parse_args()

    import numpy as np  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    from pytorch_optimizer import SOAP  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)  # one summation order, run to run
    torch.manual_seed(0)

    os.makedirs(args.out, exist_ok=True)
    for option_set in OPTION_SETS:
        if args.only and option_set["name"] not in args.only:
            continue
        started = time.perf_counter()
        gaps = GapLog()
        saved = gaps.install(torch, SOAP)
        result = run_option_set(torch, np, option_set)
        SOAP.get_orthogonal_matrix, SOAP.get_orthogonal_matrix_qr = staticmethod(saved[0]), saved[1]
        shaken = run_option_set(torch, np, option_set, perturb=True)
        sensitivity = {}
        for record, other in zip(result["records"], shaken["records"]):
            sensitivity[str(record["step"])] = max(
                float(np.max(np.abs(np.asarray(v) - np.asarray(other["params"][n]))))
                for n, v in record["params"].items())
        result["diagnostics"] = {
            "eigh_calls": gaps.calls["eigh"], "qr_calls": gaps.calls["qr"],
            "min_relative_eigenvalue_gap_eigh": gaps.eigh,
            "min_relative_estimated_eigenvalue_gap_qr": gaps.qr,
            "sensitivity": {"perturbation": "every gradient value moved by one float32 ulp (up "
                                            "where k+t is even, down where odd)",
                            "max_abs_param_difference": sensitivity},
            "max_abs_change": max(float(np.max(np.abs(np.asarray(v) - np.asarray(
                result["records"][0]["params"][n])))) for n, v in
                result["records"][-1]["params"].items()),
        }
        path = os.path.join(args.out, option_set["name"] + ".json")
        with open(path, "w", encoding="utf-8") as out_file:
            out_file.write(to_json(result))
        d = result["diagnostics"]
        print(f"{option_set['name']}: eigh {d['eigh_calls']} (min gap "
              f"{d['min_relative_eigenvalue_gap_eigh']:.3g}), qr {d['qr_calls']} (min gap "
              f"{d['min_relative_estimated_eigenvalue_gap_qr']:.3g}), max|p30-p0| "
              f"{d['max_abs_change']:.3g}; 1-ulp sensitivity: "
              + ", ".join(f"{k}:{v:.2g}" for k, v in sensitivity.items()))
        print(f"  wrote {os.path.relpath(path, REPO_ROOT)} in {time.perf_counter() - started:.1f} s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
