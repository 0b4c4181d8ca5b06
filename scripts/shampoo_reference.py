#!/usr/bin/env python3
"""Runs the JAX reference Shampoo (optax-shampoo 0.0.6) on a fixed problem and writes the
trajectories that Lather's C++ Shampoo test replays: tests/data/shampoo_reference/<set>.json.

Run it through scripts/regenerate-reference-data (which builds the pinned environment first);
scripts/README-reference.md describes the problem, the option sets and the file format.

The problem is defined so that C++ can reproduce its inputs bit for bit: initial values and
gradients are computed on the host in IEEE double with the C library's sin/cos (Python's math
module, not numpy, whose vectorised sin may differ by an ulp), evaluated left to right exactly
as written below, and rounded once to float32.
"""

import argparse
import json
import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax_compat  # noqa: E402  (must configure XLA before jax is imported)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "shampoo_reference")

PARAMETERS = [
    ("scalar", []),
    ("bias", [7]),
    ("dense", [12, 9]),
    ("blocked", [20, 11]),
    ("conv3", [4, 6, 5]),
    ("conv4", [3, 3, 4, 5]),
    ("wide", [40, 3]),
]
NUM_STEPS = 30
RECORDED_STEPS = [0, 1, 2, 3, 5, 10, 15, 20, 25, 30]

# Keywords every set passes to distributed_shampoo; a set overrides some of them. Listing them
# all keeps each JSON file self-describing (defaults of the reference included).
COMMON_OPTIONS = {
    "beta1": 0.9,
    "beta2": 0.99,
    "diagonal_epsilon": 1e-10,
    # 1e-3, not the reference's 1e-6: the gradients below make every 2-D block's statistics
    # numerically rank ~2-4, and float32 rounding in G G^T then puts ~1e-7*max_ev of noise into
    # the null space. With a ridge of 1e-6*max_ev that noise changes the inverse roots by ~1e-3
    # and a one-ulp change of the gradients moves the parameters by up to 0.7 within 30 steps;
    # with 1e-3 the same change moves them by ~1e-6 (see diagnostics.sensitivity).
    "matrix_epsilon": 1e-3,
    "weight_decay": 0.0,
    "start_preconditioning_step": 1,
    "preconditioning_compute_steps": 1,
    "statistics_compute_steps": 1,
    "best_effort_shape_interpretation": True,
    "nesterov": True,
    "exponent_override": 0,
    "batch_axis_name": None,
    "shard_optimizer_states": False,
    "best_effort_memory_usage_reduction": False,
    "inverse_failure_threshold": 0.1,
    "moving_average_for_momentum": False,
    # "wide" [40, 3] has a dimension above 32, so it is never preconditioned (graft update only).
    "skip_preconditioning_dim_size_gt": 32,
    "clip_by_scaled_gradient_norm": None,
    "relative_matrix_epsilon": True,
    "skip_preconditioning_rank_lt": 1,
    "decoupled_learning_rate": True,
    "decoupled_weight_decay": False,
    "generate_training_metrics": True,
}

OPTION_SETS = [
    {
        "name": "rmsprop_normalized_blocked",
        "pmap": False,
        "description": (
            "RMSPROP_NORMALIZED grafting, Nesterov, exponential momentum, roots every step from "
            "step 1. block_size 8 with merge_small_dims_block_size 8: 'blocked' [20,11] splits "
            "into 3x2 blocks (8,8,4 x 8,3), 'dense' [12,9] into 2x2 blocks (8,4 x 8,1) including "
            "a 1-wide block, 'conv3' [4,6,5] stays 3-D (p=6), 'conv4' [3,3,4,5] stays 4-D (p=8), "
            "'bias' gets one 7x7 statistic (p=2), 'scalar' and 'wide' use the graft update."),
        "options": {
            "learning_rate": 0.05,
            "block_size": 8,
            "merge_small_dims_block_size": 8,
            "graft_type": "RMSPROP_NORMALIZED",
        },
    },
    {
        "name": "rmsprop_clip_wd_intervals",
        "pmap": False,
        "description": (
            "RMSPROP grafting with clip_by_scaled_gradient_norm 1.0 (active: early RMSProp "
            "updates have scaled norm >> 1), coupled weight_decay 0.01, no Nesterov, "
            "moving_average_for_momentum, statistics every 2nd step and inverse roots every 3rd "
            "step (statistics_compute_steps 2, preconditioning_compute_steps 3), Shampoo from "
            "step 2, beta2 0.95. block_size 8 / merge 8 as in rmsprop_normalized_blocked."),
        "options": {
            "learning_rate": 0.02,
            "block_size": 8,
            "merge_small_dims_block_size": 8,
            "graft_type": "RMSPROP",
            "beta2": 0.95,
            "clip_by_scaled_gradient_norm": 1.0,
            "weight_decay": 0.01,
            "nesterov": False,
            "moving_average_for_momentum": True,
            "statistics_compute_steps": 2,
            "preconditioning_compute_steps": 3,
            "start_preconditioning_step": 2,
        },
    },
    {
        "name": "adagrad_merged_decoupled_wd",
        "pmap": False,
        "description": (
            "ADAGRAD grafting, decoupled weight_decay 0.1 (added as lr*wd*param before the final "
            "-lr scaling), Nesterov with moving_average_for_momentum, Shampoo from step 3, "
            "beta2 0.999, the reference's default matrix_epsilon 1e-6. block_size 128 with "
            "merge_small_dims_block_size 4096: every "
            "preconditioned parameter is merged to rank 1 ('dense' -> [108], 'conv3' -> [120], "
            "'conv4' -> [180] split 128+52, 'blocked' -> [220] split 128+92), so p=2 throughout."),
        "options": {
            "learning_rate": 0.03,
            "block_size": 128,
            "merge_small_dims_block_size": 4096,
            "graft_type": "ADAGRAD",
            # rank-1 statistics here are well conditioned; keep the reference's default
            "matrix_epsilon": 1e-6,
            "beta2": 0.999,
            "weight_decay": 0.1,
            "decoupled_weight_decay": True,
            "moving_average_for_momentum": True,
            "start_preconditioning_step": 3,
        },
    },
    {
        "name": "adagrad_normalized_int16_pmap",
        "pmap": True,
        "description": (
            "ADAGRAD_NORMALIZED grafting with best_effort_memory_usage_reduction under jax.pmap "
            "(one CPU device, batch_axis_name 'batch'): statistics and preconditioners stored as "
            "int16 with the diagonal kept in float32 and per-column bucket sizes, momentum "
            "buffers of rank>1 parameters stored as int8 with per-column bucket sizes (rank<=1 "
            "stay float32), diagonal statistics float32. block_size 8 / merge 8, Nesterov, "
            "roots every step from step 1, matrix_epsilon 1e-2, learning rate 0.003."),
        "options": {
            # One int8 momentum code is 1/127 of its column's largest value: a code that rounds
            # the other way because an implementation differs by one ulp elsewhere moves the
            # parameter by about lr/127 times the momentum. At 0.003 that stays well below the
            # 1e-4 comparison bound; at 0.05 and 0.01 single flips reached it.
            "learning_rate": 0.003,
            "block_size": 8,
            "merge_small_dims_block_size": 8,
            "graft_type": "ADAGRAD_NORMALIZED",
            "batch_axis_name": "batch",
            "best_effort_memory_usage_reduction": True,
            # int16 rounding of the statistics (a step of max/32767 per column) needs a larger
            # ridge than float32 rounding to keep the trajectory insensitive to one-ulp changes
            "matrix_epsilon": 1e-2,
        },
    },
    {
        "name": "sgd_exponent_override",
        "pmap": False,
        "description": (
            "SGD grafting, exponent_override 4 for every statistic (instead of 2*rank), no "
            "Nesterov, exponential momentum, inverse roots every 2nd step, Shampoo from step 2. "
            "block_size 10 with merge_small_dims_block_size 16: 'conv4' [3,3,4,5] -> [9,4,5], "
            "'conv3' stays [4,6,5], 'dense' [12,9] splits 10+2 x 9, 'blocked' [20,11] splits "
            "10+10 x 10+1."),
        "options": {
            "learning_rate": 0.03,
            "block_size": 10,
            "merge_small_dims_block_size": 16,
            "graft_type": "SGD",
            "exponent_override": 4,
            "nesterov": False,
            "preconditioning_compute_steps": 2,
            "start_preconditioning_step": 2,
        },
    },
    {
        "name": "sqrt_n_merge64",
        "pmap": False,
        "description": (
            "SQRT_N grafting (sign of the gradient), Nesterov with moving_average_for_momentum, "
            "beta1 0.8, roots every step from step 1. block_size 16 with "
            "merge_small_dims_block_size 64: 'conv3' [4,6,5] -> [24,5] split 16+8 x 5, 'conv4' "
            "[3,3,4,5] -> [36,5] split 16+16+4 x 5, 'blocked' [20,11] split 16+4 x 11, 'dense' "
            "stays [12,9]."),
        "options": {
            "learning_rate": 0.01,
            "block_size": 16,
            "merge_small_dims_block_size": 64,
            "graft_type": "SQRT_N",
            "beta1": 0.8,
            "moving_average_for_momentum": True,
        },
    },
]


# One-sided Shampoo (the reference's `precondtioner_type`, spelled so).
OPTION_SETS += [
    {
        "name": "one_sided_input",
        "pmap": False,
        "description": (
            "precondtioner_type INPUT: every dimension of a block but the last gets a statistic, "
            "p = 2 x (rank - 1): 'dense'/'blocked' blocks are preconditioned on the left only "
            "(p=2), 'conv3' [4,6,5] along 4 and 6 (p=4), 'conv4' [3,3,4,5] -> merged by 8 to "
            "[3,3,4,5] along 3,3,4 (p=6); 'bias' (rank 1) keeps its one statistic. "
            "RMSPROP_NORMALIZED grafting, block_size 8 / merge 8, roots every step from step 1."),
        "options": {
            "learning_rate": 0.05,
            "block_size": 8,
            "merge_small_dims_block_size": 8,
            "graft_type": "RMSPROP_NORMALIZED",
            "precondtioner_type": "INPUT",
        },
    },
    {
        "name": "one_sided_output",
        "pmap": False,
        "description": (
            "precondtioner_type OUTPUT (upstream google-research's, ported onto 0.0.6 by "
            "scripts/jax_compat.py): only the last dimension of a block gets a statistic, p = 2. "
            "ADAGRAD grafting, no Nesterov, roots every 2nd step from step 2, block_size 10 / "
            "merge 16 as in sgd_exponent_override ('conv4' -> [9,4,5], 'dense' 10+2 x 9)."),
        "options": {
            "learning_rate": 0.03,
            "block_size": 10,
            "merge_small_dims_block_size": 16,
            "graft_type": "ADAGRAD",
            "nesterov": False,
            "preconditioning_compute_steps": 2,
            "start_preconditioning_step": 2,
            "precondtioner_type": "OUTPUT",
        },
    },
]


def initial_parameters(np):
    """p0[k] = float32(cos(0.23*(k+1) + 0.7*pidx)), in double, rounded once."""
    params = {}
    for pidx, (name, shape) in enumerate(PARAMETERS):
        size = int(np.prod(shape)) if shape else 1
        values = [math.cos(0.23 * (k + 1) + 0.7 * pidx) for k in range(size)]
        params[name] = np.asarray(values, dtype=np.float64).astype(np.float32).reshape(shape)
    return params


def gradients(np, params, step):
    """g[k] = float32(0.1*double(p[k]) + sin(0.37*(k+1) + 1.3*(t+1) + 0.61*pidx)), t = step."""
    grads = {}
    for pidx, (name, shape) in enumerate(PARAMETERS):
        flat = np.asarray(params[name], dtype=np.float32).reshape(-1)
        values = [0.1 * float(flat[k]) + math.sin(0.37 * (k + 1) + 1.3 * (step + 1) + 0.61 * pidx)
                  for k in range(flat.size)]
        grads[name] = np.asarray(values, dtype=np.float64).astype(np.float32).reshape(shape)
    return grads


def flat_floats(np, array):
    """Row-major float32 values as Python floats (repr round-trips the exact float32 value)."""
    return [float(v) for v in np.asarray(array, dtype=np.float32).reshape(-1)]


def build_options(ds, option_set):
    options = dict(COMMON_OPTIONS)
    options.update(option_set["options"])
    kwargs = dict(options)
    kwargs["graft_type"] = ds.GraftingType[options["graft_type"]]
    if "precondtioner_type" in options:
        kwargs["precondtioner_type"] = ds.PreconditionerType[options["precondtioner_type"]]
    ordered = {"learning_rate": options.pop("learning_rate"),
               "block_size": options.pop("block_size")}
    ordered.update(options)
    return ordered, kwargs


def leaf_dtypes(jax, np, state_stats):
    """Dtypes of the optimizer state leaves, grouped as 'field[.subfield]' over all parameters."""
    groups = {}
    for stats in state_stats.values():
        for field in stats._fields:
            value = getattr(stats, field)
            leaves, _ = jax.tree_util.tree_flatten_with_path(value)
            for path, leaf in leaves:
                names = [getattr(key, "name", None) for key in path]
                names = [n for n in names if n is not None]
                if field == "training_metrics":
                    names = []  # all float32 scalars per statistic; one entry is enough
                key = ".".join([field] + names)
                groups.setdefault(key, set()).add(str(np.asarray(leaf).dtype))
    return {key: ",".join(sorted(values)) for key, values in sorted(groups.items())}


def parameter_structure(ds, np, kwargs):
    """How the reference partitions each parameter: merged shape, statistic sizes, exponent."""
    structure = {}
    for name, shape in PARAMETERS:
        param = np.zeros(shape, np.float32)
        merged = list(shape)
        if kwargs["best_effort_shape_interpretation"]:
            merged = [int(d) for d in ds.merge_small_dims(list(shape),
                                                          kwargs["merge_small_dims_block_size"])]
        skipped = (len(shape) < kwargs["skip_preconditioning_rank_lt"]
                   or any(d > kwargs["skip_preconditioning_dim_size_gt"] for d in shape))
        entry = {"merged_shape": merged, "preconditioned": not skipped}
        if not skipped:
            preconditioner = ds.Preconditioner(param, kwargs["block_size"],
                                               kwargs["merge_small_dims_block_size"],
                                               kwargs["best_effort_shape_interpretation"],
                                               kwargs.get("precondtioner_type",
                                                          ds.PreconditionerType.ALL))
            entry["statistic_sizes"] = [int(s[0]) for s in
                                        preconditioner.shapes_for_preconditioners()]
            entry["exponent"] = int(kwargs["exponent_override"] or
                                    preconditioner.exponent_for_preconditioner())
        structure[name] = entry
    return structure


class RootLog:
    """Tallies the reference's inverse-root outcomes over a run.

    The reference makes two discrete choices per root: the coupled Newton iteration stops early
    when the entrywise error grows by a factor >= 1.2 (then it returns the previous iterate), and
    a root whose error is >= inverse_failure_threshold is rejected (the old preconditioner stays).
    The margins say how far from those cut-offs this run came, i.e. how much numerical
    difference a reimplementation can have before it takes the other branch.
    """

    MAX_ERROR_RATIO = 1.2  # hard-coded in matrix_inverse_pth_root

    def __init__(self, np, threshold):
        self.np = np
        self.threshold = threshold
        self.total = 0
        self.rejected = 0
        self.stopped_by_ratio = 0
        self.min_ratio_margin = math.inf
        self.min_threshold_margin = math.inf
        self.per_parameter = {}

    def add(self, step, stats):
        np = self.np
        for name, _ in PARAMETERS:
            param_stats = stats[name]
            if not param_stats.statistics:
                continue
            metrics = param_stats.training_metrics
            errors = np.asarray(metrics.inverse_pth_root_errors, np.float64).reshape(-1)
            ratios = np.asarray(metrics.final_error_ratio, np.float64).reshape(-1)
            rejected = np.logical_or(np.isnan(errors), errors >= self.threshold)
            self.total += errors.size
            self.rejected += int(rejected.sum())
            self.stopped_by_ratio += int((ratios >= self.MAX_ERROR_RATIO).sum())
            self.min_ratio_margin = min(self.min_ratio_margin,
                                        float(np.min(np.abs(ratios - self.MAX_ERROR_RATIO))))
            self.min_threshold_margin = min(self.min_threshold_margin,
                                            float(np.min(np.abs(errors - self.threshold))))
            entry = self.per_parameter.setdefault(
                name, {"roots_computed": 0, "roots_rejected": 0, "rejected_at_steps": {}})
            entry["roots_computed"] += errors.size
            entry["roots_rejected"] += int(rejected.sum())
            if rejected.any():
                entry["rejected_at_steps"][str(step)] = [int(i) for i in np.flatnonzero(rejected)]

    def summary(self):
        return {
            "computed": self.total,
            "rejected": self.rejected,
            "newton_stopped_by_error_ratio": self.stopped_by_ratio,
            "min_abs_error_ratio_minus_1.2": self.min_ratio_margin,
            "min_abs_error_minus_threshold": self.min_threshold_margin,
        }


def perturbed(np, grads, step):
    """Each gradient value moved by one float32 ulp, up or down in a fixed pattern."""
    result = {}
    for name, value in grads.items():
        flat = value.reshape(-1)
        up = (np.arange(flat.size) + step) % 2 == 0
        moved = np.where(up, np.nextafter(flat, np.float32(np.inf)),
                         np.nextafter(flat, np.float32(-np.inf)))
        result[name] = moved.astype(np.float32).reshape(value.shape)
    return result


def sensitivity(np, records, perturbed_records):
    """Per recorded step: max |difference| over all parameter values between the run and a run
    whose gradients differ by one ulp; the floor any reimplementation can hope to reach."""
    steps = {}
    for record, other in zip(records, perturbed_records):
        difference = 0.0
        for name, values in record["params"].items():
            difference = max(difference, float(np.max(np.abs(
                np.asarray(values) - np.asarray(other["params"][name])))))
        steps[str(record["step"])] = difference
    return {"perturbation": "every gradient value moved by one float32 ulp (up where k+t is "
                            "even, down where odd), all else equal",
            "max_abs_param_difference": steps}


def run_option_set(jax, ds, option_set, x64, perturb=False):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import optax  # pylint: disable=import-outside-toplevel

    options, kwargs = build_options(ds, option_set)
    optimizer = ds.distributed_shampoo(**kwargs)
    use_pmap = option_set["pmap"]
    if use_pmap and jax.local_device_count() != 1:
        raise RuntimeError("pmap sets assume exactly one local device")
    if use_pmap != (kwargs["batch_axis_name"] is not None):
        raise RuntimeError(f"{option_set['name']}: pmap needs batch_axis_name and vice versa")

    params = {name: jax.numpy.asarray(value) for name, value in initial_parameters(np).items()}

    def replicate(tree):
        return jax.tree_util.tree_map(lambda x: np.asarray(x)[None], tree)

    if use_pmap:
        axis = kwargs["batch_axis_name"]
        state = jax.pmap(optimizer.init, axis_name=axis)(replicate(params))
        pmapped_update = jax.pmap(optimizer.update, axis_name=axis)

        def update(grads, state, params):
            updates, state = pmapped_update(replicate(grads), state, replicate(params))
            return jax.tree_util.tree_map(lambda u: u[0], updates), state
    else:
        state = optimizer.init(params)
        update = jax.jit(optimizer.update)

    def unreplicated(tree):
        return jax.tree_util.tree_map(lambda x: np.asarray(x)[0], tree) if use_pmap else tree

    records = [{"step": 0, "params": {n: flat_floats(np, params[n]) for n, _ in PARAMETERS}}]
    first_gradients = None
    roots = RootLog(np, kwargs["inverse_failure_threshold"])
    for step in range(NUM_STEPS):
        grads = gradients(np, {n: np.asarray(p) for n, p in params.items()}, step)
        if perturb:
            grads = perturbed(np, grads, step)
        if first_gradients is None:
            first_gradients = {n: flat_floats(np, g) for n, g in grads.items()}
        updates, state = update(grads, state, params)
        update_dtypes = {n: str(np.asarray(u).dtype) for n, u in updates.items()}
        # Eager float32 add, outside jit, so that nothing can fuse it with the update.
        params = optax.apply_updates(params, updates)
        if step % kwargs["preconditioning_compute_steps"] == 0:
            roots.add(step, unreplicated(state.stats))
        if step + 1 in RECORDED_STEPS:
            records.append({"step": step + 1,
                            "params": {n: flat_floats(np, params[n]) for n, _ in PARAMETERS}})

    stats = unreplicated(state.stats)
    for record in records:
        for name, values in record["params"].items():
            if not all(math.isfinite(v) for v in values):
                raise RuntimeError(f"{option_set['name']}: non-finite value in '{name}' at step "
                                   f"{record['step']}")
    diagnostics = {}
    for name, _ in PARAMETERS:
        param_stats = stats[name]
        start = np.asarray(records[0]["params"][name])
        end = np.asarray(records[-1]["params"][name])
        entry = {"num_statistics": len(param_stats.statistics),
                 "max_abs_change": float(np.max(np.abs(end - start)))}
        if param_stats.statistics:
            errors = np.asarray(param_stats.training_metrics.inverse_pth_root_errors)
            entry["final_inverse_pth_root_errors"] = [float(e) for e in errors.reshape(-1)]
            deviation = 0.0
            for preconditioner in param_stats.preconditioners:
                matrix = np.asarray(preconditioner.to_float()
                                    if hasattr(preconditioner, "to_float") else preconditioner,
                                    dtype=np.float64)
                deviation = max(deviation,
                                float(np.max(np.abs(matrix - np.eye(matrix.shape[0])))))
            entry["max_abs_preconditioner_minus_identity"] = deviation
        entry.update(roots.per_parameter.get(name, {}))
        diagnostics[name] = entry
    diagnostics["root_computations"] = roots.summary()

    return {
        "generator": "scripts/shampoo_reference.py",
        "versions": jax_compat.package_versions(),
        "reference_patches": jax_compat.REFERENCE_PATCHES,
        "x64_roots": bool(x64),
        "pmap": use_pmap,
        "name": option_set["name"],
        "description": option_set["description"],
        "options": options,
        "state_dtypes": dict(leaf_dtypes(jax, np, stats),
                             count=str(np.asarray(unreplicated(state.count)).dtype)),
        "update_dtypes": update_dtypes,
        "parameters": [{"name": n, "shape": s} for n, s in PARAMETERS],
        "structure": parameter_structure(ds, np, kwargs),
        "steps": NUM_STEPS,
        "gradients_at_step_0": first_gradients,
        "diagnostics": diagnostics,
        # power_iteration (relative_matrix_epsilon) starts every matrix of size n, padded or
        # not, from the first n of these values (numpy RandomState(1729).uniform(-1, 1, ...),
        # i.e. MT19937 seeded with 1729; in float64 with x64, rounded to float32 without).
        "power_iteration_start_vector": [
            float(v) for v in np.random.RandomState(1729).uniform(-1.0, 1.0, 128)],
        "records": records,
    }


def to_json(result):
    """Indented JSON with each list of numbers on one line (small files, readable diffs)."""
    number_lists = []

    def collapse(value):
        if isinstance(value, dict):
            return {k: collapse(v) for k, v in value.items()}
        if isinstance(value, list):
            if value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                             for v in value):
                number_lists.append(json.dumps(value, allow_nan=False))
                return f"@@number_list_{len(number_lists) - 1}@@"
            return [collapse(v) for v in value]
        return value

    text = json.dumps(collapse(result), indent=1, allow_nan=False)
    text = re.sub(r'"@@number_list_(\d+)@@"', lambda m: number_lists[int(m.group(1))], text)
    return text + "\n"


def summarize(result):
    roots = result["diagnostics"]["root_computations"]
    lines = [f"{result['name']}: x64_roots={result['x64_roots']} pmap={result['pmap']}",
             "  state dtypes: " + ", ".join(f"{k}={v}" for k, v in result["state_dtypes"].items()),
             f"  inverse roots: {roots['computed']} computed, {roots['rejected']} rejected "
             f"(error >= threshold), {roots['newton_stopped_by_error_ratio']} Newton runs stopped "
             f"by the 1.2 error-ratio rule; closest error ratio to 1.2: "
             f"{roots['min_abs_error_ratio_minus_1.2']:.3g} away"]
    if "sensitivity" in result["diagnostics"]:
        lines.append("  1-ulp gradient perturbation moves params by: " + ", ".join(
            f"step {k}: {v:.2g}" for k, v in
            result["diagnostics"]["sensitivity"]["max_abs_param_difference"].items()))
    for name, _ in PARAMETERS:
        entry = result["diagnostics"][name]
        line = (f"  {name:8s} statistics={entry['num_statistics']:2d} "
                f"max|p30-p0|={entry['max_abs_change']:.4g}")
        if "final_inverse_pth_root_errors" in entry:
            errors = entry["final_inverse_pth_root_errors"]
            line += (f" final root errors={','.join(f'{e:.1g}' for e in errors)}"
                     f" max|P-I|={entry['max_abs_preconditioner_minus_identity']:.3g}"
                     f" rejected {entry['roots_rejected']}/{entry['roots_computed']}")
        lines.append(line)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--only", action="append", default=[],
                        help="option set name to run (repeatable; default all)")
    parser.add_argument("--x64", choices=["on", "off"], default="on",
                        help="float64 inverse roots (on, default) or float32 everywhere")
    parser.add_argument("--list", action="store_true", help="list option sets and exit")
    parser.add_argument("--no-sensitivity", dest="sensitivity", action="store_false",
                        help="skip the second, gradient-perturbed run of each set")
    args = parser.parse_args()

    if args.list:
        for option_set in OPTION_SETS:
            print(f"{option_set['name']}: {option_set['description']}")
        return 0
    x64 = args.x64 == "on"
    jax = jax_compat.configure_jax(x64=x64)
    ds = jax_compat.load_distributed_shampoo()
    if x64 and ds._MAT_INV_PTH_ROOT_DTYPE(0).dtype.itemsize != 8:  # pylint: disable=protected-access
        raise RuntimeError("jax_enable_x64 did not take: inverse roots would run in float32")

    selected = [s for s in OPTION_SETS if not args.only or s["name"] in args.only]
    unknown = set(args.only) - {s["name"] for s in OPTION_SETS}
    if unknown:
        parser.error(f"unknown option set(s): {', '.join(sorted(unknown))}")
    import numpy as np  # pylint: disable=import-outside-toplevel
    os.makedirs(args.out, exist_ok=True)
    for option_set in selected:
        started = time.perf_counter()
        result = run_option_set(jax, ds, option_set, x64)
        if args.sensitivity:
            shaken = run_option_set(jax, ds, option_set, x64, perturb=True)
            result["diagnostics"]["sensitivity"] = sensitivity(np, result["records"],
                                                               shaken["records"])
        path = os.path.join(args.out, option_set["name"] + ".json")
        with open(path, "w", encoding="utf-8") as out_file:
            out_file.write(to_json(result))
        print(summarize(result))
        print(f"  wrote {os.path.relpath(path, REPO_ROOT)} ({os.path.getsize(path) // 1024} KiB) "
              f"in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
