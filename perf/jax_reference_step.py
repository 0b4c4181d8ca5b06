#!/usr/bin/env python3
"""Times one optimizer step of the JAX reference Shampoo (optax-shampoo 0.0.6, jitted update
plus apply) on the parameter sets of perf/parameter_sets.json, on one CPU thread, against
optax.adam(1e-3) timed the same way in the same run.

Run with the reference environment (scripts/reference-venv prints its python):
    "$(scripts/reference-venv | tail -n 1)" perf/jax_reference_step.py [--set transformer|cnn|all]
        [--steps N] [--x64 on|off]

Prints one JSON object per line and set, in the shape `lather-bench step` prints, e.g.
{"bench": "step", "set": "cnn", "optimizer": "jax-reference", "seconds_per_step": ...,
 "state_bytes": ..., "ratio_to_adam": ..., "adam_seconds_per_step": ...,
 "preconditioning_compute_steps": 10, "threads": 1, ...}

Timing: the first window of preconditioning_compute_steps steps compiles and warms up; then
whole windows are timed (at least 2, and at least --steps steps), so every timed window holds
exactly one inverse-root computation, as in training. Gradients are generated before timing
(two fixed random gradient sets, used alternately). With --x64 on (default) the inverse roots
run in float64 as in Lather's default; params, gradients and statistics stay float32.
"""

import argparse
import json
import math
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
import jax_compat  # noqa: E402  (sets XLA flags before jax is imported)

SEED = 20240607


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="all", help="transformer, cnn or all")
    parser.add_argument("--steps", type=int, default=0,
                        help="timed steps at least (rounded up to whole windows; >= 2 windows)")
    parser.add_argument("--x64", choices=["on", "off"], default="on",
                        help="float64 inverse roots (on, default) or float32 everywhere (off)")
    parser.add_argument("--parameter-sets", default=os.path.join(REPO_ROOT, "perf",
                                                                  "parameter_sets.json"))
    return parser.parse_args()


def time_steps(jax, step_fn, params, state, gradient_sets, warmup_steps, timed_steps):
    """Runs warmup_steps untimed (the first compiles), then times timed_steps one by one.

    Returns (seconds per step over all timed steps, the individual step times, final state).
    Blocking after each step costs nothing measurable: every step needs the previous result.
    """
    for i in range(warmup_steps):
        params, state = step_fn(params, state, gradient_sets[i % len(gradient_sets)])
    jax.block_until_ready((params, state))
    step_seconds = []
    started = time.perf_counter()
    for i in range(timed_steps):
        step_started = time.perf_counter()
        params, state = step_fn(params, state, gradient_sets[i % len(gradient_sets)])
        jax.block_until_ready((params, state))
        step_seconds.append(time.perf_counter() - step_started)
    return (time.perf_counter() - started) / timed_steps, step_seconds, state


def main():
    args = parse_args()
    jax = jax_compat.configure_jax(x64=args.x64 == "on", single_thread=True)
    ds = jax_compat.load_distributed_shampoo()
    import numpy as np  # pylint: disable=import-outside-toplevel
    import optax  # pylint: disable=import-outside-toplevel

    with open(args.parameter_sets, encoding="utf-8") as parameter_file:
        config = json.load(parameter_file)
    names = list(config["sets"]) if args.set == "all" else [args.set]
    for name in names:
        if name not in config["sets"]:
            sys.exit(f"unknown set '{name}'; known: {', '.join(config['sets'])}, all")

    options = dict(config["shampoo_options"])
    options["graft_type"] = ds.GraftingType[options["graft_type"]]
    window = int(options["preconditioning_compute_steps"])
    windows = max(2, math.ceil(args.steps / window)) if args.steps > 0 else 2
    timed_steps = windows * window
    threads = 1

    for name in names:
        set_started = time.perf_counter()
        rng = np.random.default_rng(SEED)
        shapes = {entry["name"]: tuple(entry["shape"]) for entry in config["sets"][name]}
        params = {k: jax.numpy.asarray((rng.standard_normal(s) * 0.02).astype(np.float32))
                  for k, s in shapes.items()}
        gradient_sets = [{k: jax.numpy.asarray((rng.standard_normal(s) * 0.01).astype(np.float32))
                          for k, s in shapes.items()} for _ in range(2)]

        def make_step(optimizer):
            def step(params, state, grads):
                updates, state = optimizer.update(grads, state, params)
                return optax.apply_updates(params, updates), state
            return jax.jit(step)

        shampoo = ds.distributed_shampoo(**options)
        shampoo_state = shampoo.init(params)
        state_bytes = sum(int(np.asarray(leaf).nbytes)
                          for leaf in jax.tree_util.tree_leaves(shampoo_state))
        compile_started = time.perf_counter()
        shampoo_seconds, shampoo_steps, shampoo_state = time_steps(jax, make_step(shampoo), params,
                                                    shampoo_state, gradient_sets, window,
                                                    timed_steps)
        shampoo_total = time.perf_counter() - compile_started

        adam = optax.adam(1e-3)
        adam_state = adam.init(params)
        adam_state_bytes = sum(int(np.asarray(leaf).nbytes)
                               for leaf in jax.tree_util.tree_leaves(adam_state))
        adam_seconds, _, _ = time_steps(jax, make_step(adam), params, adam_state, gradient_sets,
                                     window, timed_steps)

        errors = [np.asarray(s.training_metrics.inverse_pth_root_errors)
                  for s in shampoo_state.stats.values() if s.statistics]
        errors = np.concatenate([e.reshape(-1) for e in errors]) if errors else np.zeros(0)
        print(json.dumps({
            "bench": "step",
            "set": name,
            "optimizer": "jax-reference",
            "seconds_per_step": shampoo_seconds,
            "state_bytes": state_bytes,
            "ratio_to_adam": shampoo_seconds / adam_seconds,
            "adam_seconds_per_step": adam_seconds,
            "adam_state_bytes": adam_state_bytes,
            "preconditioning_compute_steps": window,
            # the first step of each window computes the inverse roots
            "root_step_seconds": float(np.mean(shampoo_steps[::window])),
            "other_step_seconds": float(np.median([t for i, t in enumerate(shampoo_steps)
                                                   if i % window])),
            "timed_steps": timed_steps,
            "threads": threads,
            "x64_roots": args.x64 == "on",
            "num_statistics": int(errors.size),
            "roots_rejected_last_window": int(np.sum(~(errors < options["inverse_failure_threshold"]))),
            "warmup_and_shampoo_seconds": round(shampoo_total, 1),
            "set_seconds": round(time.perf_counter() - set_started, 1),
            "jax": jax.__version__,
        }), flush=True)


if __name__ == "__main__":
    main()
