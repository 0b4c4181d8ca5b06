#!/usr/bin/env python3
"""Runs the reference KL-Shampoo (Meta's DistributedShampoo from github.com/facebookresearch/optimizers
with `RootInvKLShampooPreconditionerConfig`) on a fixed problem and writes the trajectories that
Lather's C++ Shampoo test replays with kl_shampoo = true: tests/data/kl_shampoo_reference/<set>.json.

Run it with the peer environment (DistributedShampoo is not on PyPI; the environment links a
checkout of Meta's repository through a .pth file, see scripts/peer-venv):

    META_OPTIMIZERS=<checkout> scripts/peer-venv      # once; later calls only check
    .venv-peer/bin/python scripts/kl_shampoo_reference.py [--only SET] [--out DIR] [--meta-commit HASH]

The committed data come from commit f60660661194de26d3ee78bae6d15820ff8e583d of Meta's
repository. The commit is read with `git -C <checkout> rev-parse HEAD` when the checkout is a git
tree, else it is --meta-commit (default: that hash); each JSON file records it under
`meta_optimizers_commit`, and torch/numpy under `versions`.

The problem is the one of scripts/soap_reference.py, defined on Lather's parameters so that C++
reproduces its inputs bit for bit: initial values and gradients are computed in IEEE double with
the C library's sin/cos (Python's math module), evaluated left to right exactly as written in
`initial_value` and `gradient_value`, and rounded once to float32; `p` is the current float32
parameter. The quadratic phase in the element index makes every block's gradient of full rank
along every dimension. Parameters are recorded at steps 0, 1, 2, 3, 5, 10, 15, 20, 25, 30.

What Meta's KL-Shampoo computes (distributed_shampoo.py, preconditioner/shampoo_preconditioner_list.py
RootInvKLShampooPreconditionerList, preconditioner/matrix_functions.py at that commit), per block G
of a parameter, on Meta's step s = 1, 2, ... (Lather's t = s - 1):

  1. factors: for each preconditioned dimension k, with the inverse roots P_j cached from the
     previous root computation (identity before the first),
         L_k <- beta2 L_k + w [G x_{j != k} P_j]_(k) [G x_{j != k} P_j]_(k)^T,
     w = 1 - beta2, or 1 when beta2 == 1; L_k starts at zero.
  2. roots (every step here): P_k = (L_k + epsilon I)^(-1/r_k) by torch.linalg.eigh of
     L_k + epsilon I (EigenConfig, PerturbationConfig(perturb_before_computation=True): the
     eigenvalues are shifted only if the smallest is below epsilon, i.e. never here, see
     `min_factor_eigenvalue` below), r_k = 1 / inverse exponent, default 2 x order of the block.
  3. direction: D = G x_k P_k; grafted per block, D <- |A| / (|D| + 1e-16) D with A the graft's
     direction of the block (SGD: G; AdaGrad: G / (sqrt(V) + eps), V += G^2); no graft: D as is.
  4. update: p <- p + (-lr) D, in float32 (lr as a float32 tensor).

Precision on Meta's side: parameters, gradients, graft state and directions are float32; factors
and inverse roots float64. Meta contracts G (cast to float64) with the float64 roots and rounds
the result back to float32 (`_precondition_grad` ends in `.to(grad.dtype)`), both for the
direction of item 3 and for the contracted block of item 1, whose Gram matrix is then formed in
float32 (torch.tensordot) and added to the float64 factor. Factors and roots are stored packed (upper
triangle, Meta's default use_symmetric_packing), which is lossless up to that float32 Gram
matrix's asymmetry.

The mapping (Lather's names in "options", Meta's keyword arguments in "reference_options"):

  - Lather beta1 0 <-> Meta betas=(0.0, beta2), no iterate_averaging_config: no momentum on either
    side (Lather applies momentum after preconditioning, Meta filters the gradient before; with
    beta1 0 neither does anything). weight_decay 0; Meta use_bias_correction=False (Lather has no
    bias correction of the statistics).
  - Lather preconditioning_compute_steps 1, start_preconditioning_step 0 <-> Meta
    precondition_frequency 1, start_preconditioning_step 1: both compute roots on their first
    step (after the factor update) and use Shampoo's direction from it on.
  - Lather statistics_precision float64, root_method eigh, root_compute_precision float64 <->
    Meta factor_matrix_dtype / inv_factor_matrix_dtype torch.float64, EigenConfig().
  - Lather matrix_epsilon 1e-10, relative_matrix_epsilon false <-> Meta epsilon 1e-10.
  - Lather block_size <-> Meta max_preconditioner_dim: every dimension is split into pieces of
    that size, remainder last, blocks in row-major order of block indices (Meta's
    multi_dim_split); `reference_blocks` in the JSON lists Meta's blocks, checked against that
    rule. Lather graft_granularity block <-> Meta's per-block grafting.
  - No merging of dimensions: Meta SingleDeviceDistributedConfig(target_parameter_dimensionality
    = inf) (the default 1 merges dimensions up to max_preconditioner_dim); Lather
    merge_small_dims_block_size 1 (merge_small_dims joins neighbouring dimensions only while
    their product stays <= that size, so 1 only drops dimensions of size 1). No dimension has
    size 1.
  - 1-D parameters are not preconditioned: Lather skip_preconditioning_rank_lt 2 <-> Meta
    inverse_exponent_override {1: 0.0} (an exponent of 0.0 removes the dimension from the
    block's preconditioned dimensions: no factor, the "Shampoo" direction is G itself, which is
    then grafted). With the SGD graft Meta's update of such a block is G |G| / (|G| + 1e-16),
    Lather's graft update times |G| / (|G| + 1e-16): the same. With no graft both use G.
  - Lather exponent_override p <-> Meta inverse_exponent_override 1/p for the orders 2 and 3
    (Lather's default, 2 x the preconditioned dimensions of the block, is Meta's default
    1/(2 x order) when every dimension is preconditioned).
  - Lather graft_type SGD / ADAGRAD (diagonal_epsilon) / NONE <-> Meta grafting_config
    SGDPreconditionerConfig() / AdaGradPreconditionerConfig(epsilon) / None (at this commit the
    grafting configs are the *PreconditionerConfig classes; there are no *GraftingConfig names).

Not matched, hence not in the data: with the AdaGrad graft, Meta's update of an unpreconditioned
block is G rescaled to the norm of the AdaGrad direction, while Lather (like the JAX reference)
uses the AdaGrad direction itself; the AdaGrad set therefore has no 1-D parameter.

Numerical design (why an independent implementation can reproduce the trajectories):

  - Every factor is full rank from its first update: 2-D blocks are square and 3-D blocks have
    every dimension <= the product of the others, so the first Gram matrix G_(k) G_(k)^T of the
    full-rank gradient is positive definite, and later terms (G contracted with positive definite
    roots) keep it so. A rank-deficient factor leaves its null space to epsilon and rounding,
    where two correct implementations diverge. `diagnostics.min_factor_eigenvalue_per_step` gives
    the smallest eigenvalue (torch.linalg.eigvalsh in float64) of any factor handed to a root
    computation on each step, before epsilon; `min_relative_factor_eigenvalue` the smallest
    lambda_min / lambda_max.
  - Lather's statistics start at matrix_epsilon I, Meta's at zero. Lather's statistic is then
    Meta's plus beta2^(t+1) epsilon I <= 1e-10 I (plus what that moves through the roots), and the
    root (S + epsilon I)^(-1/r) changes by a relative amount of at most
    epsilon / (r lambda_min(S)): with lambda_min >= 2e-4 here, about 1e-7 along the
    weakest eigenvector and less elsewhere, i.e. float32 rounding of the direction.
    `diagnostics.epsilon_start` measures it: the same run with every factor set to epsilon I
    before the first step; its largest parameter difference per recorded step stays at one or
    two float32 ulps of the parameters, below the one-ulp sensitivity.
  - `diagnostics.sensitivity`: the run repeated with every gradient value moved by one float32
    ulp. Its largest parameter difference per recorded step is the floor that a
    reimplementation rounding in another order can reach; `max_relative_param_difference` gives
    it as the C++ Shampoo reference tests measure (per parameter |a - b|_2 / |a|_2, the largest
    over parameters), and `relative_to_max_abs_change` against the largest parameter change of
    the run (`max_abs_change`). Both stay far below the tests' 1e-4.
"""

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "kl_shampoo_reference")
DEFAULT_META_COMMIT = "f60660661194de26d3ee78bae6d15820ff8e583d"

# The problem, its recorded steps and the JSON layout are scripts/soap_reference.py's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soap_reference import (  # noqa: E402  pylint: disable=wrong-import-position
    NUM_STEPS, RECORDED_STEPS, block_slices, gradient_value, initial_value, to_json)

# Lather's ShampooOptions (set_option names and values) shared by every set; see the docstring
# for what each one corresponds to in Meta's DistributedShampoo.
COMMON_OPTIONS = {
    "beta1": 0.0,
    "weight_decay": 0.0,
    "nesterov": False,
    "moving_average_for_momentum": False,
    "decoupled_learning_rate": True,
    "decoupled_weight_decay": False,
    "start_preconditioning_step": 0,
    "preconditioning_compute_steps": 1,
    "statistics_compute_steps": 1,
    "matrix_epsilon": 1e-10,
    "relative_matrix_epsilon": False,
    "diagonal_epsilon": 1e-10,
    "statistics_precision": "float64",
    "root_method": "eigh",
    "root_compute_precision": "float64",
    "kl_shampoo": True,
    "graft_granularity": "block",
    "best_effort_shape_interpretation": True,
    "merge_small_dims_block_size": 1,
    "skip_preconditioning_rank_lt": 2,
    "skip_preconditioning_dim_size_gt": 4096,
    "precondtioner_type": "ALL",
    "clip_by_scaled_gradient_norm": 0.0,
    "best_effort_memory_usage_reduction": False,
    "shard_optimizer_states": False,
    "inverse_failure_threshold": 0.1,
}

OPTION_SETS = [
    {
        "name": "sgd_block_graft",
        "description": (
            "KL-Shampoo with SGD grafting per block, beta2 0.99 (moving average, weight 0.01), "
            "default exponents (2 x order: 4 for 'square', 6 for 'cube'), lr 0.01, no block "
            "splitting (block_size / max_preconditioner_dim 1024). 'square' [10,10] has two "
            "10x10 factors, 'cube' [4,6,5] three (4x4, 6x6, 5x5) whose KL statistics contract "
            "the block with the two other roots; 'bias' [7] is not preconditioned (Lather "
            "skip_preconditioning_rank_lt 2, Meta inverse_exponent_override {1: 0.0}) and moves "
            "by its SGD graft, i.e. the gradient."),
        "parameters": [("bias", [7]), ("square", [10, 10]), ("cube", [4, 6, 5])],
        "options": {"learning_rate": 0.01, "beta2": 0.99, "block_size": 1024,
                    "graft_type": "SGD", "exponent_override": 0},
    },
    {
        "name": "adagrad_graft_blocked",
        "description": (
            "KL-Shampoo with AdaGrad grafting per block (diagonal_epsilon 1e-10), beta2 1 (plain "
            "sums of the KL Gram matrices, weight 1), default exponents, lr 0.01, block_size / "
            "max_preconditioner_dim 5: 'square' [10,10] is four 5x5 blocks, 'slab' [4,10,10] four "
            "[4,5,5] blocks (row-major block order), each with its own factors and its own graft "
            "norm. No 1-D parameter: Meta grafts an unpreconditioned block as G rescaled to the "
            "AdaGrad norm, Lather uses the AdaGrad direction itself."),
        "parameters": [("square", [10, 10]), ("slab", [4, 10, 10])],
        "options": {"learning_rate": 0.01, "beta2": 1.0, "block_size": 5,
                    "graft_type": "ADAGRAD", "exponent_override": 0},
    },
    {
        "name": "no_graft_exponent2",
        "description": (
            "The paper's KL-Shampoo: no grafting (Lather graft_type NONE, Meta grafting_config "
            "None: the preconditioned direction as it is) and the root -1/2 of every factor "
            "(Lather exponent_override 2, Meta inverse_exponent_override 0.5 for orders 2 and "
            "3), so that a matrix's statistics are L += G R^-1 G^T, R += G^T L^-1 G; beta2 0.95, "
            "lr 0.003, no block splitting. 'bias' [7] is not preconditioned and moves by the "
            "gradient. The first step is the largest ('square' moves by up to 0.23, later steps "
            "by < 0.01): with identity roots in the first KL update the first statistics are "
            "0.05 G G^T and 0.05 G^T G, so the direction is U S^-1 V^T / 0.05 for G = U S V^T."),
        "parameters": [("bias", [7]), ("square", [10, 10]), ("cube", [4, 6, 5])],
        "options": {"learning_rate": 0.003, "beta2": 0.95, "block_size": 1024,
                    "graft_type": "NONE", "exponent_override": 2},
    },
]


def lather_options(option_set):
    options = dict(COMMON_OPTIONS)
    options.update(option_set["options"])
    return options


def reference_kwargs(options, parameters):
    """Meta's DistributedShampoo keyword arguments for Lather's options (see the docstring)."""
    import torch  # pylint: disable=import-outside-toplevel
    from distributed_shampoo import (  # pylint: disable=import-outside-toplevel
        AdaGradPreconditionerConfig, EigenConfig, RootInvKLShampooPreconditionerConfig,
        SGDPreconditionerConfig, SingleDeviceDistributedConfig)

    if options["preconditioning_compute_steps"] != 1 or options["statistics_compute_steps"] != 1:
        raise RuntimeError("the mapping of start_preconditioning_step assumes roots every step")
    if options["beta1"] != 0.0 or options["weight_decay"] != 0.0:
        raise RuntimeError("momentum and weight decay are applied in different places; keep them 0")
    if options["relative_matrix_epsilon"] or options["skip_preconditioning_rank_lt"] != 2:
        raise RuntimeError("the mapping assumes an absolute epsilon and unpreconditioned 1-D tensors")
    graft = options["graft_type"]
    if graft == "SGD":
        grafting_config = SGDPreconditionerConfig()
    elif graft == "ADAGRAD":
        grafting_config = AdaGradPreconditionerConfig(epsilon=options["diagonal_epsilon"])
    elif graft == "NONE":
        grafting_config = None
    else:
        raise RuntimeError(f"graft_type {graft} has no counterpart here")
    override = {1: 0.0}
    if options["exponent_override"] > 0:
        for order in range(2, max(len(shape) for _, shape in parameters) + 1):
            override[order] = 1.0 / options["exponent_override"]
    return {
        "lr": options["learning_rate"],
        "betas": (options["beta1"], options["beta2"]),
        "epsilon": options["matrix_epsilon"],
        "weight_decay": options["weight_decay"],
        "max_preconditioner_dim": options["block_size"],
        "precondition_frequency": options["preconditioning_compute_steps"],
        "start_preconditioning_step": options["start_preconditioning_step"] + 1,
        "use_bias_correction": False,
        "iterate_averaging_config": None,
        "grafting_config": grafting_config,
        "distributed_config": SingleDeviceDistributedConfig(target_parameter_dimensionality=math.inf),
        "preconditioner_config": RootInvKLShampooPreconditionerConfig(
            amortized_computation_config=EigenConfig(),
            factor_matrix_dtype=torch.float64,
            inv_factor_matrix_dtype=torch.float64,
            inverse_exponent_override=override,
        ),
    }


def describe(value):
    """JSON form of Meta's arguments: dataclasses as {"class": name, field: value, ...}."""
    import torch  # pylint: disable=import-outside-toplevel
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"class": type(value).__name__}
        for f in dataclasses.fields(value):
            out[f.name] = describe(getattr(value, f.name))
        return out
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return value


class FactorLog:
    """The eigenvalues of every factor handed to matrix_inverse_root (before epsilon)."""

    def __init__(self):
        self.step = None
        self.calls = 0
        self.min_per_step = {}
        self.min_relative = math.inf

    def record(self, torch, matrix):
        values = torch.linalg.eigvalsh(matrix.double())
        low, high = float(values[0]), float(values[-1])
        self.calls += 1
        self.min_per_step[self.step] = min(self.min_per_step.get(self.step, math.inf), low)
        self.min_relative = min(self.min_relative, low / high)


def install_factor_hook(torch, holder):
    """Wraps matrix_inverse_root where RootInvShampooKroneckerFactorsUnwrapped looks it up."""
    from distributed_shampoo.preconditioner import (  # pylint: disable=import-outside-toplevel
        shampoo_preconditioner_list as spl)
    original = spl.matrix_inverse_root

    def wrapped(*args, **kwargs):
        matrix = kwargs["A"] if "A" in kwargs else args[0]
        if holder["log"] is not None:
            holder["log"].record(torch, matrix)
        return original(*args, **kwargs)

    spl.matrix_inverse_root = wrapped


def run_option_set(torch, np, option_set, holder, perturb=False, epsilon_start=False):
    from distributed_shampoo import DistributedShampoo  # pylint: disable=import-outside-toplevel

    options = lather_options(option_set)
    parameters = option_set["parameters"]
    values = []
    for pidx, (_, shape) in enumerate(parameters):
        size = math.prod(shape)
        flat = np.asarray([initial_value(k, pidx) for k in range(size)], dtype=np.float64)
        values.append(flat.astype(np.float32))
    torch_params = [torch.nn.Parameter(torch.from_numpy(v.reshape(shape).copy()))
                    for v, (_, shape) in zip(values, parameters)]
    kwargs = reference_kwargs(options, parameters)
    optimizer = DistributedShampoo(torch_params, **kwargs)

    state_lists = optimizer._per_group_state_lists[0]  # pylint: disable=protected-access
    distributor = state_lists["distributor"]
    factors = state_lists["shampoo_preconditioner_list"]._local_kronecker_factors_unwrapped  # pylint: disable=protected-access

    # Meta's blocks, checked against Lather's partition rule.
    reference_blocks = []
    expected = [(pidx, block) for pidx, (_, shape) in enumerate(parameters)
                for block in block_slices(shape, options["block_size"])]
    blocks = distributor.local_blocked_params
    if len(blocks) != len(expected) or len(factors) != len(blocks):
        raise RuntimeError(f"{option_set['name']}: Meta has {len(blocks)} blocks, Lather {len(expected)}")
    for block, info, kf, (pidx, lather_block) in zip(blocks, distributor.local_block_info_list,
                                                     factors, expected):
        param = torch_params[pidx]
        if info.param is not param:
            raise RuntimeError(f"{option_set['name']}: block order differs from Lather's")
        linear = block.storage_offset() - param.storage_offset()
        offset = [int(i) for i in np.unravel_index(linear, param.shape)] if param.dim() else []
        if offset != [o for o, _ in lather_block] or list(block.shape) != [s for _, s in lather_block]:
            raise RuntimeError(f"{option_set['name']}: Meta's block {offset}+{list(block.shape)} is not "
                               f"Lather's {lather_block}")
        reference_blocks.append({
            "parameter": parameters[pidx][0], "offset": offset, "size": list(block.shape),
            "factor_sizes": [int(m.shape[0]) for m in kf.get_unpacked_factor_matrices()],
            "roots": [float(r) for r in kf.roots],
        })
    if epsilon_start:
        for kf in factors:
            for matrix in kf.factor_matrices:
                unpacked = kf._unpack_matrix(matrix)  # pylint: disable=protected-access
                eye = torch.eye(unpacked.shape[0], dtype=unpacked.dtype)
                matrix.copy_(kf._pack_matrix(unpacked + options["matrix_epsilon"] * eye))  # pylint: disable=protected-access

    def current():
        return [p.detach().numpy().reshape(-1).copy() for p in torch_params]

    records = [{"step": 0, "params": {n: [float(v) for v in x]
                                      for (n, _), x in zip(parameters, current())}}]
    for t in range(NUM_STEPS):
        now = current()
        for pidx, ((_, shape), x, param) in enumerate(zip(parameters, now, torch_params)):
            g = np.asarray([gradient_value(float(p), k, pidx, t) for k, p in enumerate(x)],
                           dtype=np.float64).astype(np.float32)
            if perturb:
                up = (np.arange(g.size) + t) % 2 == 0
                g = np.where(up, np.nextafter(g, np.float32(np.inf)),
                             np.nextafter(g, np.float32(-np.inf))).astype(np.float32)
            param.grad = torch.from_numpy(g.reshape(shape).copy())
        if holder["log"] is not None:
            holder["log"].step = t
        optimizer.step()
        if t + 1 in RECORDED_STEPS:
            records.append({"step": t + 1, "params": {n: [float(v) for v in x]
                                                      for (n, _), x in zip(parameters, current())}})
    for record in records:
        for name, vals in record["params"].items():
            if not all(math.isfinite(v) for v in vals):
                raise RuntimeError(f"{option_set['name']}: non-finite '{name}' at {record['step']}")

    return {
        "generator": "scripts/kl_shampoo_reference.py",
        "reference": "facebookresearch/optimizers DistributedShampoo, RootInvKLShampooPreconditionerConfig",
        "meta_optimizers_commit": None,  # filled in by main()
        "versions": {name: importlib.metadata.version(name) for name in ("torch", "numpy")},
        "name": option_set["name"],
        "description": option_set["description"],
        "options": options,
        "reference_options": describe(kwargs),
        "parameters": [{"name": n, "shape": s} for n, s in parameters],
        "reference_blocks": reference_blocks,
        "steps": NUM_STEPS,
        "records": records,
    }


def max_difference(a, b):
    """Largest |a - b| over all parameters, per recorded step."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    return {str(ra["step"]): max(float(np.max(np.abs(np.asarray(v) - np.asarray(rb["params"][n]))))
                                 for n, v in ra["params"].items())
            for ra, rb in zip(a["records"], b["records"])}


def max_relative_difference(a, b):
    """Largest |a - b|_2 / |a|_2 over the parameters (the C++ tests' measure), per recorded step."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    return {str(ra["step"]): max(float(np.linalg.norm(np.asarray(v) - np.asarray(rb["params"][n]))
                                       / np.linalg.norm(np.asarray(v)))
                                 for n, v in ra["params"].items())
            for ra, rb in zip(a["records"], b["records"])}


def meta_commit(requested):
    """The checkout's HEAD if it is a git tree (it must agree with --meta-commit if given), else
    --meta-commit or the commit the committed data come from."""
    import distributed_shampoo  # pylint: disable=import-outside-toplevel
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(distributed_shampoo.__file__)))
    try:
        head = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = None
    if head and requested and head != requested:
        raise RuntimeError(f"{checkout} is at {head}, not at --meta-commit {requested}")
    return checkout, head or requested or DEFAULT_META_COMMIT


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--only", action="append", default=[], help="option set name (repeatable)")
    parser.add_argument("--meta-commit", default=None,
                        help=f"commit of the Meta checkout when it is not a git tree (default "
                             f"{DEFAULT_META_COMMIT})")
    args = parser.parse_args()

    import numpy as np  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)  # one summation order, run to run
    torch.manual_seed(0)
    checkout, commit = meta_commit(args.meta_commit)
    print(f"Meta's optimizers: {checkout} at {commit}; torch {torch.__version__}, numpy {np.__version__}")

    unknown = set(args.only) - {s["name"] for s in OPTION_SETS}
    if unknown:
        parser.error(f"unknown option set(s): {', '.join(sorted(unknown))}")
    holder = {"log": None}
    install_factor_hook(torch, holder)
    os.makedirs(args.out, exist_ok=True)
    for option_set in OPTION_SETS:
        if args.only and option_set["name"] not in args.only:
            continue
        started = time.perf_counter()
        holder["log"] = log = FactorLog()
        result = run_option_set(torch, np, option_set, holder)
        holder["log"] = None
        shaken = run_option_set(torch, np, option_set, holder, perturb=True)
        eps_start = run_option_set(torch, np, option_set, holder, epsilon_start=True)
        result["meta_optimizers_commit"] = commit
        sensitivity = max_difference(result, shaken)
        first = result["records"][0]["params"]
        change = {n: float(np.max(np.abs(np.asarray(v) - np.asarray(first[n]))))
                  for n, v in result["records"][-1]["params"].items()}
        max_abs_change = max(change.values())
        per_step = [log.min_per_step[t] for t in range(NUM_STEPS)]
        result["diagnostics"] = {
            "root_computations": log.calls,
            "min_factor_eigenvalue": min(per_step),
            "min_factor_eigenvalue_per_step": per_step,
            "min_relative_factor_eigenvalue": log.min_relative,
            "sensitivity": {
                "perturbation": "every gradient value moved by one float32 ulp (up where k+t is "
                                "even, down where odd)",
                "max_abs_param_difference": sensitivity,
                "max_relative_param_difference": max_relative_difference(result, shaken),
                "relative_to_max_abs_change": max(sensitivity.values()) / max_abs_change,
            },
            "epsilon_start": {
                "perturbation": "every factor set to epsilon I before the first step (Lather's "
                                "start) instead of zero",
                "max_abs_param_difference": max_difference(result, eps_start),
                "max_relative_param_difference": max_relative_difference(result, eps_start),
            },
            "max_abs_change": max_abs_change,
            "max_abs_change_per_parameter": change,
        }
        path = os.path.join(args.out, option_set["name"] + ".json")
        with open(path, "w", encoding="utf-8") as out_file:
            out_file.write(to_json(result))
        d = result["diagnostics"]
        print(f"{option_set['name']}: {d['root_computations']} roots, min factor eigenvalue "
              f"{d['min_factor_eigenvalue']:.3g} (relative {d['min_relative_factor_eigenvalue']:.3g}), "
              f"max|p30-p0| {max_abs_change:.3g}; 1-ulp sensitivity: "
              + ", ".join(f"{k}:{v:.2g}" for k, v in sensitivity.items())
              + f" (relative: {max(d['sensitivity']['max_relative_param_difference'].values()):.2g} "
              f"per parameter, {d['sensitivity']['relative_to_max_abs_change']:.2g} of max|p30-p0|); "
              "epsilon start: "
              + ", ".join(f"{k}:{v:.2g}" for k, v in d["epsilon_start"]["max_abs_param_difference"].items()))
        print("  max|p30-p0| per parameter: "
              + ", ".join(f"{n} {v:.3g}" for n, v in d["max_abs_change_per_parameter"].items()))
        print(f"  wrote {os.path.relpath(path, REPO_ROOT)} in {time.perf_counter() - started:.1f} s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
