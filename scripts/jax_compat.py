"""Loads the JAX reference Shampoo (PyPI optax-shampoo 0.0.6) on the JAX pinned by
scripts/reference-venv, and sets JAX up the way our C++ optimizer computes.

Shared by scripts/shampoo_reference.py and perf/jax_reference_step.py. Import this module
before jax: `configure_jax` has to set environment variables that XLA reads once at start-up.

What is changed in the reference, and only this (see REFERENCE_PATCHES):
  matrix_inverse_pth_root seeds its lax.while_loop carry for the Newton error ratio with the
  bool `True`, while the loop body yields `new_error / error`, a float. Every JAX rejects the
  mismatch ("body_fun output and input must have identical types"), so the released package
  cannot compute any inverse root larger than 1x1. We seed it with 1.0 instead, as upstream
  google-research later did. The loop condition (`error_ratio < 1.2`) and the converged test
  read True and 1.0 alike, and the reported final_error_ratio of a loop that runs no iteration
  is 1.0 either way, so no number the optimizer produces depends on the choice.
  One-sided Shampoo: 0.0.6 defines PreconditionerType ALL and INPUT only; upstream
  google-research later added OUTPUT (the last dimension only). Four small patches port
  upstream's definition; for ALL and INPUT they compute exactly what 0.0.6 computes.
The patches are applied to the source text at import time; the installed package is untouched,
and the loader fails loudly if the text it expects is not there exactly once.
"""

import importlib.util
import os
import sys
import types
import warnings

REFERENCE_PACKAGE = "optax_shampoo"
REFERENCE_MODULE = "optax_shampoo.distributed_shampoo"

REFERENCE_PATCHES = [
    {
        "module": REFERENCE_MODULE,
        "function": "matrix_inverse_pth_root",
        "old": "[0, new_mat_m_0, new_mat_h_0, new_mat_h_0, new_error, True])",
        "new": "[0, new_mat_m_0, new_mat_h_0, new_mat_h_0, new_error, 1.0])",
        "why": "while_loop carry for the Newton error ratio was seeded with a bool but the body "
               "yields a float, which JAX rejects; 1.0 behaves identically (1.0 < 1.2 like True)",
    },
    # One-sided Shampoo: 0.0.6 knows ALL and INPUT only. Upstream google-research later added
    # OUTPUT (precondition the last dimension only); these four patches port its definition
    # (scalable_shampoo/optax/distributed_shampoo.py: should_precondition_dims,
    # shapes_for_preconditioners, updated_statistics_from_grad over the preconditioned axes,
    # and the contraction that skips the others). For ALL and INPUT they compute exactly what
    # 0.0.6 computes: the preconditioned axes are then 0 .. k-1, as 0.0.6's range(k) assumed.
    {
        "module": REFERENCE_MODULE,
        "function": "PreconditionerType",
        "old": "  INPUT = 2\n",
        "new": "  INPUT = 2\n  OUTPUT = 3\n",
        "why": "upstream's OUTPUT member (the last dimension only)",
    },
    {
        "module": REFERENCE_MODULE,
        "function": "Preconditioner.should_precondition_dims",
        "old": "      return [True] * (rank - 1) + [False]\n",
        "new": ("      if self._preconditioner_type == PreconditionerType.OUTPUT:\n"
                "        return [False] * (rank - 1) + [True]\n"
                "      return [True] * (rank - 1) + [False]\n"),
        "why": "upstream's OUTPUT: only the last dimension is preconditioned",
    },
    {
        "module": REFERENCE_MODULE,
        "function": "Preconditioner.shapes_for_preconditioners",
        "old": "        preconditioner_shapes.extend([[d, d] for d in t[:-1]])\n",
        "new": ("        preconditioner_shapes.extend([[d, d] for d, keep in\n"
                "                                      zip(t, self.should_precondition_dims()) if keep])\n"),
        "why": "statistics for the preconditioned dimensions, whichever they are",
    },
    {
        "module": REFERENCE_MODULE,
        "function": "Preconditioner.updated_statistics_from_grad",
        "old": "      for axis in range(num_preconditioners):\n",
        "new": ("      for axis in [i for i, keep in enumerate(should_preconditioned_dims) if keep]:\n"),
        "why": "the Gram matrices along the preconditioned axes (0.0.6 assumed axes 0 .. k-1)",
    },
    {
        "module": REFERENCE_MODULE,
        "function": "Preconditioner.preconditioned_grad",
        "old": ("          precond_g = jnp.tensordot(\n"
                "              precond_g, preconditioners_for_grad[j], axes=[[0], [0]])\n"),
        "new": ("          precond_g = jnp.tensordot(\n"
                "              precond_g, preconditioners_for_grad[\n"
                "                  sum(should_preconditioned_dims[:j])], axes=[[0], [0]])\n"),
        "why": "the j-th dimension's preconditioner is the k-th of the block, k counting only "
               "preconditioned dimensions (0.0.6 indexed by j, right for ALL and INPUT only)",
    },
]


def configure_jax(x64=True, single_thread=False):
    """Sets XLA/JAX options; must run before the first `import jax` of the process.

    x64: enables jax_enable_x64 so that the reference's _MAT_INV_PTH_ROOT_DTYPE (float64) is
      really float64 (without it JAX silently computes the inverse roots in float32).
      Parameters, gradients and statistics stay float32 because we create them as float32.
    single_thread: one XLA CPU thread and one OpenMP thread, pinned to CPU 0 where allowed.
    """
    if single_thread:
        flags = os.environ.get("XLA_FLAGS", "")
        for flag in ("--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1"):
            if flag not in flags:
                flags = (flags + " " + flag).strip()
        os.environ["XLA_FLAGS"] = flags
        os.environ["OMP_NUM_THREADS"] = "1"
        if hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, {0})
            except OSError:
                pass
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if "jax" in sys.modules and single_thread:
        warnings.warn("jax was imported before configure_jax; XLA_FLAGS may not take effect")
    import jax  # pylint: disable=import-outside-toplevel

    jax.config.update("jax_enable_x64", bool(x64))
    if not x64:
        # Without x64 the reference's float64 requests silently become float32, as intended.
        warnings.filterwarnings("ignore", category=UserWarning,
                                message=r"Explicitly requested dtype .*float64")
    return jax


def _restore_removed_aliases(jax):
    """Aliases that optax-shampoo 0.0.6 names but JAX 0.4.13 no longer has.

    Only jax.experimental.pjit.PartitionSpec is missing in 0.4.13; the reference uses it in its
    pjit (shard_optimizer_states=True) mode alone, which we never run, but the alias keeps an
    accidental call from failing with an AttributeError instead of doing what the reference did.
    """
    from jax.experimental import pjit  # pylint: disable=import-outside-toplevel

    if not hasattr(pjit, "PartitionSpec"):
        pjit.PartitionSpec = jax.sharding.PartitionSpec
    for name, replacement in (("tree_map", jax.tree_util.tree_map),
                              ("tree_flatten", jax.tree_util.tree_flatten),
                              ("tree_unflatten", jax.tree_util.tree_unflatten)):
        if not hasattr(jax, name):
            setattr(jax, name, replacement)


def load_distributed_shampoo():
    """Returns the reference module optax_shampoo.distributed_shampoo with REFERENCE_PATCHES."""
    if REFERENCE_MODULE in sys.modules and getattr(sys.modules[REFERENCE_MODULE],
                                                   "_lather_patched", False):
        return sys.modules[REFERENCE_MODULE]
    import jax  # pylint: disable=import-outside-toplevel

    _restore_removed_aliases(jax)
    # jax 0.4.13 warns on jax.tree_flatten/tree_unflatten; the reference calls them every trace.
    warnings.filterwarnings("ignore", category=FutureWarning, message=r"jax\.tree_")
    package = importlib.import_module(REFERENCE_PACKAGE)
    spec = importlib.util.find_spec(REFERENCE_MODULE)
    if spec is None or spec.origin is None:
        raise ImportError(f"{REFERENCE_MODULE} not found; run scripts/reference-venv")
    with open(spec.origin, encoding="utf-8") as source_file:
        source = source_file.read()
    for patch in REFERENCE_PATCHES:
        count = source.count(patch["old"])
        if count != 1:
            raise RuntimeError(f"{spec.origin}: expected the text {patch['old']!r} once in "
                               f"{patch['function']}, found it {count} times; is this "
                               "optax-shampoo 0.0.6?")
        source = source.replace(patch["old"], patch["new"])
    module = types.ModuleType(REFERENCE_MODULE)
    module.__file__ = spec.origin
    module.__package__ = REFERENCE_PACKAGE
    module._lather_patched = True  # pylint: disable=protected-access
    sys.modules[REFERENCE_MODULE] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)  # pylint: disable=exec-used
    setattr(package, "distributed_shampoo", module)
    return module


def package_versions():
    """Versions of the interpreter and of the packages the reference runs on."""
    import importlib.metadata as metadata  # pylint: disable=import-outside-toplevel
    import platform  # pylint: disable=import-outside-toplevel

    versions = {"python": platform.python_version()}
    for key, dist in (("jax", "jax"), ("jaxlib", "jaxlib"), ("optax", "optax"),
                      ("flax", "flax"), ("chex", "chex"), ("numpy", "numpy"),
                      ("optax_shampoo", "optax-shampoo")):
        try:
            versions[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[key] = None
    return versions
