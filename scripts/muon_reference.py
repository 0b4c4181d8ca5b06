#!/usr/bin/env python3
"""Runs the reference Muon (optax.contrib.muon, optax 0.2.8) on a fixed problem and writes the
trajectories that Lather's C++ Muon test replays: tests/data/muon_reference/<set>.json.

    python="$(scripts/muon-reference-venv | tail -n 1)"
    "$python" scripts/muon_reference.py            # all sets, into tests/data/muon_reference/

The problem is the one of scripts/shampoo_reference.py, defined so that C++ reproduces its inputs
bit for bit: initial values and gradients are computed in IEEE double with the C library's
sin/cos (Python's math module, not numpy), evaluated left to right exactly as written below, and
rounded once to float32. One parameter is added to it: "embedding" [10, 6], a matrix that one
option set forces onto AdamW (Lather's MuonOptions::adamw_parameters).

Which parameters Muon takes: optax 0.2.8's muon treats exactly the parameters that
`muon_weight_dimension_numbers` gives a MuonDimensionNumbers as Muon matrices, the others (None)
go to its AdamW. We give every parameter of rank >= 2 that is not forced onto AdamW
MuonDimensionNumbers(reduction_axis=0, output_axis=(1, ..., ndim-1)): optax then orthogonalizes
the matrix [shape[0], product of the rest] (no batch axes) and scales it by
sqrt(max(1, fan_out / fan_in)) with fan_in = shape[0], which is Lather's choice for every rank.
"""

import argparse
import json
import math
import os
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "data", "muon_reference")

PARAMETERS = [
    ("scalar", []),
    ("bias", [7]),
    ("dense", [12, 9]),
    ("blocked", [20, 11]),
    ("conv3", [4, 6, 5]),
    ("conv4", [3, 3, 4, 5]),
    ("wide", [40, 3]),
    ("embedding", [10, 6]),
]
NUM_STEPS = 30
RECORDED_STEPS = [0, 1, 2, 3, 5, 10, 15, 20, 25, 30]

# Every option of Lather's MuonOptions, as the C++ test reads them; optax's muon takes one eps for
# both the Newton-Schulz normalisation and its AdamW, so adam_epsilon always equals epsilon here.
COMMON_OPTIONS = {
    "learning_rate": {"kind": "constant", "peak": 0.02},
    "beta": 0.95,
    "nesterov": True,
    "ns_steps": 5,
    "ns_coefficients": [3.4445, -4.7750, 2.0315],
    "epsilon": 1e-8,
    "weight_decay": 0.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon_root": 0.0,
    "adam_weight_decay": 0.0,
    "adamw_parameters": [],
}

OPTION_SETS = [
    {
        "name": "nesterov_constant",
        "description": "optax.contrib.muon's defaults (beta 0.95, Nesterov, 5 quintic steps, eps 1e-8, no weight "
                       "decay), constant learning rate 0.02; 'embedding' is a Muon matrix.",
        "options": {},
    },
    {
        "name": "momentum_weight_decay",
        "description": "No Nesterov (for Muon and AdamW), beta 0.9, decoupled weight_decay 0.1 on Muon matrices and "
                       "adam_weight_decay 0.05 on AdamW parameters, adam_beta2 0.99, learning rate 0.01; "
                       "'embedding' forced onto AdamW.",
        "options": {
            "learning_rate": {"kind": "constant", "peak": 0.01},
            "beta": 0.9,
            "nesterov": False,
            "weight_decay": 0.1,
            "adam_beta2": 0.99,
            "adam_weight_decay": 0.05,
            "adamw_parameters": ["embedding"],
        },
    },
    {
        "name": "cosine_schedule_ns4",
        "description": "Warm-up (5 steps) and cosine decay (25 steps) from peak 0.03 to 0.001, Nesterov, 4 "
                       "Newton-Schulz steps with the coefficients (3.0, -3.2, 1.2), eps 1e-7, adam_beta1 0.8, "
                       "adam_epsilon_root 1e-9; 'embedding' and 'wide' forced onto AdamW.",
        "options": {
            "learning_rate": {"kind": "cosine", "peak": 0.03, "warmup_steps": 5, "decay_steps": 25,
                              "end_value": 0.001},
            "ns_steps": 4,
            "ns_coefficients": [3.0, -3.2, 1.2],
            "epsilon": 1e-7,
            "adam_beta1": 0.8,
            "adam_epsilon_root": 1e-9,
            "adamw_parameters": ["embedding", "wide"],
        },
    },
]


def initial_parameters(np, dtype):
    """p0[k] = float32(cos(0.23*(k+1) + 0.7*pidx)), in double, rounded once."""
    params = {}
    for pidx, (name, shape) in enumerate(PARAMETERS):
        size = int(np.prod(shape)) if shape else 1
        values = [math.cos(0.23 * (k + 1) + 0.7 * pidx) for k in range(size)]
        params[name] = np.asarray(values, dtype=np.float64).astype(np.float32).astype(dtype).reshape(shape)
    return params


def gradients(np, params, step, dtype):
    """g[k] = float32(0.1*double(p[k]) + sin(0.37*(k+1) + 1.3*(t+1) + 0.61*pidx)), t = step."""
    grads = {}
    for pidx, (name, shape) in enumerate(PARAMETERS):
        flat = np.asarray(params[name], dtype=dtype).reshape(-1)
        values = [0.1 * float(flat[k]) + math.sin(0.37 * (k + 1) + 1.3 * (step + 1) + 0.61 * pidx)
                  for k in range(flat.size)]
        grads[name] = np.asarray(values, dtype=np.float64).astype(dtype).reshape(shape)
    return grads


def schedule(optax, spec):
    if spec["kind"] == "constant":
        return spec["peak"]
    if spec["kind"] == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=spec["peak"], warmup_steps=spec["warmup_steps"],
            decay_steps=spec["warmup_steps"] + spec["decay_steps"], end_value=spec["end_value"])
    raise ValueError(spec["kind"])


def build_optimizer(optax, options):
    from optax.contrib import MuonDimensionNumbers, muon  # pylint: disable=import-outside-toplevel

    forced = set(options["adamw_parameters"])
    dimension_numbers = {
        name: (MuonDimensionNumbers(reduction_axis=0, output_axis=tuple(range(1, len(shape))))
               if len(shape) >= 2 and name not in forced else None)
        for name, shape in PARAMETERS}
    return muon(
        learning_rate=schedule(optax, options["learning_rate"]),
        ns_coeffs=tuple(options["ns_coefficients"]),
        ns_steps=options["ns_steps"],
        beta=options["beta"],
        eps=options["epsilon"],
        weight_decay=options["weight_decay"],
        nesterov=options["nesterov"],
        adam_b1=options["adam_beta1"],
        adam_b2=options["adam_beta2"],
        adam_eps_root=options["adam_epsilon_root"],
        adam_weight_decay=options["adam_weight_decay"],
        muon_weight_dimension_numbers=dimension_numbers,
    )


def run(jax, optax, np, options, dtype):
    optimizer = build_optimizer(optax, options)
    params = {name: jax.numpy.asarray(value) for name, value in initial_parameters(np, dtype).items()}
    state = optimizer.init(params)
    update = jax.jit(optimizer.update)
    records = [{"step": 0, "params": {n: np.asarray(params[n]).reshape(-1) for n, _ in PARAMETERS}}]
    for step in range(NUM_STEPS):
        grads = gradients(np, {n: np.asarray(p) for n, p in params.items()}, step, dtype)
        updates, state = update(grads, state, params)
        # Eager add, outside jit, so that nothing can fuse it with the update.
        params = optax.apply_updates(params, updates)
        if step + 1 in RECORDED_STEPS:
            records.append({"step": step + 1, "params": {n: np.asarray(params[n]).reshape(-1) for n, _ in PARAMETERS}})
    return records


def relative(np, got, want):
    return float(np.linalg.norm(np.asarray(got, np.float64) - np.asarray(want, np.float64))
                 / max(np.linalg.norm(np.asarray(want, np.float64)), 1e-300))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--sets", nargs="*", default=[s["name"] for s in OPTION_SETS])
    args = parser.parse_args()

    import jax  # pylint: disable=import-outside-toplevel
    jax.config.update("jax_platforms", "cpu")
    import numpy as np  # pylint: disable=import-outside-toplevel
    import optax  # pylint: disable=import-outside-toplevel

    os.makedirs(args.out, exist_ok=True)
    for option_set in OPTION_SETS:
        if option_set["name"] not in args.sets:
            continue
        options = dict(COMMON_OPTIONS)
        options.update(option_set["options"])
        start = time.time()
        records = run(jax, optax, np, options, np.float32)
        # The same run in float64: how far float32 rounding alone moves the trajectory, the floor
        # that any float32 reimplementation is compared against.
        # (x64 only here: enabled globally it would compute the schedule and bias corrections of
        # the float32 run in float64 too.)
        from jax.experimental import enable_x64  # pylint: disable=import-outside-toplevel
        with enable_x64():
            exact = run(jax, optax, np, options, np.float64)
        floor = {str(r["step"]): max(relative(np, r["params"][n], e["params"][n]) for n, _ in PARAMETERS)
                 for r, e in zip(records, exact)}
        for record in records:
            for name in record["params"]:
                record["params"][name] = [float(v) for v in np.asarray(record["params"][name], np.float32)]
        document = {
            "name": option_set["name"],
            "description": option_set["description"],
            "reference": f"optax.contrib.muon (optax {optax.__version__}, jax {jax.__version__}), float32",
            "options": options,
            "parameters": [{"name": n, "shape": s} for n, s in PARAMETERS],
            "muon_parameters": [n for n, s in PARAMETERS if len(s) >= 2 and n not in options["adamw_parameters"]],
            "steps": NUM_STEPS,
            "records": records,
            "diagnostics": {"float32_vs_float64_max_relative_error": floor},
        }
        path = os.path.join(args.out, option_set["name"] + ".json")
        with open(path, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=1)
            out.write("\n")
        print(f"{path}: {time.time() - start:.1f} s, float32 vs float64 at step {NUM_STEPS}: "
              f"{floor[str(NUM_STEPS)]:.3g}")


if __name__ == "__main__":
    main()
