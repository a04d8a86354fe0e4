"""A float32 program evaluated again op by op, on the CPU: in float64 (:func:`run_in_float64`,
its truth) or in float32 with every result moved within its rounding error
(:func:`run_jittered`, another equally valid float32 run).

``fn`` is traced as it runs (float32, 32-bit jax); its jaxpr is then evaluated eagerly.
:func:`run_in_float64` widens every float32 value, constant and result type to float64
(``jax_enable_x64`` on for that evaluation only): the same ops in the same order with the same
random bits (drawn as 32-bit integers, turned into float32 exactly, then widened), so what
remains of the difference to the float32 run is float32's own rounding. :func:`run_jittered`
keeps float32 and adds to each arithmetic result a uniform error of up to ``ulps`` float32
rounding units (2^-24, half an ulp) of its size (of ``|a|·|b|`` for a dot, ``Σ|x|`` for a sum: the bound of any
summation order): what another float32 implementation (another platform's ``exp``, another
summation order) may do. The chip tests (tests/tpu/test_chip_steps.py) bound a chip's step
with them (:mod:`update_bound`).

Sub-programs are inlined (``jit``, ``custom_jvp`` / ``custom_vjp`` calls, ``remat``,
one-device ``shard_map`` with its collectives the identity); loops and branches run in Python
on concrete values (``scan``, ``while``, ``cond``). Slow per op, fine for a tiny model.
"""

import jax
import jax.extend as jex
import numpy as np
from jax import numpy as jnp

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
_INLINED = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
            "core_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
            "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
            "checkpoint": "jaxpr", "remat": "jaxpr", "remat2": "jaxpr", "shard_map": "jaxpr"}
_DTYPE_PARAMS = ("new_dtype", "preferred_element_type", "dtype")
# results' shardings (a shard_map body's name its manual mesh): one device, so none
_SHARDINGS = ("sharding", "out_sharding")
# collectives over one device's axes, and sharding annotations: the identity
_IDENTITY = ("sharding_constraint", "reshard", "mesh_cast", "psum", "pmax", "pmin",
             "psum_invariant", "pbroadcast", "pvary", "ppermute", "all_to_all", "all_gather",
             "reduce_scatter", "psum_scatter")
# what moves or selects values without rounding them: not jittered
_EXACT = {"reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice",
          "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "gather", "select_n",
          "copy", "copy_p", "neg", "abs", "max", "min", "reduce_max", "reduce_min", "sign",
          "stop_gradient", "convert_element_type", "bitcast_convert_type", "iota", "rev",
          "sort", "argmax", "argmin", "clamp", "floor", "ceil", "round", "scatter",
          "scatter-add", "scatter_add", "split"}


class _Run:
    """One evaluation: ``wide`` (float64) or ``rng`` (float32 with jittered results)."""

    def __init__(self, wide: bool, rng=None, ulps: float = 1.0):
        self.wide, self.rng, self.ulps = wide, rng, ulps

    def value(self, x):
        """``x`` on the default device (not a mesh's), float32 widened in the float64 run."""
        x = jnp.asarray(np.asarray(x)) if not isinstance(x, jax.Array) else x
        if self.wide and x.dtype == F32:
            return x.astype(F64)
        return x

    def eval(self, j, args):
        jaxpr, consts = (j.jaxpr, j.consts) if isinstance(j, jex.core.ClosedJaxpr) else (j, ())
        env = {v: self.value(np.asarray(x)) for v, x in zip(jaxpr.constvars, consts)}
        env.update((v, self.value(x)) for v, x in zip(jaxpr.invars, args))

        def read(v):
            if isinstance(v, jex.core.Literal):    # as typed (a Python int is int32 here)
                return self.value(np.asarray(v.val, v.aval.dtype))
            return env[v]

        for eqn in jaxpr.eqns:
            outs = self.one(eqn, [read(v) for v in eqn.invars])
            env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
        return [read(v) for v in jaxpr.outvars]

    def one(self, eqn, ins):
        name, p = eqn.primitive.name, eqn.params
        if name in _INLINED:
            return self.eval(p[_INLINED[name]], ins)
        if name == "scan":
            return self.scan(p, ins)
        if name == "while":
            cn, bn = p["cond_nconsts"], p["body_nconsts"]
            carry = ins[cn + bn:]
            while bool(self.eval(p["cond_jaxpr"], [*ins[:cn], *carry])[0]):
                carry = self.eval(p["body_jaxpr"], [*ins[cn:cn + bn], *carry])
            return carry
        if name == "cond":
            return self.eval(p["branches"][int(ins[0])], ins[1:])
        if name in _IDENTITY:
            return ins if eqn.primitive.multiple_results else ins[0]
        if name == "axis_index":
            return jnp.zeros((), eqn.outvars[0].aval.dtype)
        if name == "reduce_precision":       # a rounding to a narrower type: the truth has none
            return ins[0] if self.wide else eqn.primitive.bind(*ins, **p)
        if name == "bitcast_convert_type":   # bits as they were: the original width
            ins = [x.astype(v.aval.dtype) for x, v in zip(ins, eqn.invars)]
            return self.value(eqn.primitive.bind(*ins, **p))
        p = {k: (F64 if self.wide and k in _DTYPE_PARAMS and v is not None and np.dtype(v) == F32
                 else None if k in _SHARDINGS else v) for k, v in p.items()}
        out = eqn.primitive.bind(*ins, **p)
        if self.rng is None or name in _EXACT or eqn.primitive.multiple_results \
                or out.dtype != F32:
            return out
        return self.jitter(out, self.size(eqn, ins, p, out))

    @staticmethod
    def size(eqn, ins, p, out):
        """What ``out``'s rounding error scales with: ``|a|·|b|`` (a dot), ``Σ|x|`` (a sum),
        else ``|out|``."""
        name = eqn.primitive.name
        if name in ("dot_general", "conv_general_dilated"):
            return jnp.abs(eqn.primitive.bind(*(jnp.abs(x) for x in ins), **p))
        if name in ("reduce_sum", "cumsum"):
            return eqn.primitive.bind(jnp.abs(ins[0]), **p)
        return jnp.abs(out)

    def jitter(self, out, size):
        u = self.rng.uniform(-1.0, 1.0, out.shape).astype(np.float32)
        return out + (self.ulps * np.finfo(np.float32).eps / 2) * u * size

    def scan(self, p, ins):
        nc, nk = p["num_consts"], p["num_carry"]
        consts, carry, xs = ins[:nc], ins[nc:nc + nk], ins[nc + nk:]
        ys = [None] * p["length"]
        order = range(p["length"] - 1, -1, -1) if p["reverse"] else range(p["length"])
        for i in order:
            out = self.eval(p["jaxpr"], [*consts, *carry, *(x[i] for x in xs)])
            carry, ys[i] = out[:nk], out[nk:]
        n_ys = len(p["jaxpr"].jaxpr.outvars) - nk
        return [*carry, *(jnp.stack([y[j] for y in ys]) for j in range(n_ys))]


def _evaluate(run: _Run, fn, args):
    closed = jax.make_jaxpr(fn)(*args)
    flat = [np.asarray(x) for x in jax.tree.leaves(args)]
    tree = jax.tree.structure(jax.eval_shape(fn, *args))
    with jax.enable_x64(run.wide), jax.default_device(jax.devices("cpu")[0]):
        return jax.tree.unflatten(tree, [np.asarray(x) for x in run.eval(closed, flat)])


def run_in_float64(fn, *args):
    """``fn(*args)`` (pytrees of arrays) with every float32 value and op in float64: its
    outputs as numpy (float32 ones as float64). ``fn`` is traced in the caller's (32-bit)
    mode, so its program is the float32 one."""
    return _evaluate(_Run(True), fn, args)


def run_jittered(fn, *args, ulps: float = 1.0, seed: int = 0):
    """``fn(*args)`` in float32 with each arithmetic result moved by a uniform error of up to
    ``ulps`` rounding units of its size (see the module's docstring): another valid float32
    evaluation (``seed`` draws the errors). Outputs as numpy."""
    return _evaluate(_Run(False, np.random.default_rng(seed), ulps), fn, args)
