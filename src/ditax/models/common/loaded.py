"""What every family's transformer loader stands on: parameter shardings from a weights
table's logical axes, and the pytree callable ``ditax.load_transformer`` returns.

A family's conversion table names each parameter's logical axes (:mod:`ditax.io.convert`
rows); :func:`param_shardings` turns them into ``NamedSharding`` s for a whole state and
:func:`param_sharding` into the per-parameter rule :func:`ditax.io.convert.load_params` reads
each device's slice with; :func:`init_module` creates a random module straight into them
(:class:`Builder`: a family's abstract / random / sharding builders in one; under
``model.quantize`` the random model's block linears are drawn in 8 bits).
:class:`LoadedTransformer` is the wrapper's shared half (a pytree whose leaves are the
parameters); each family subclasses it with its own call. :func:`check_architecture` is the
one ``init_from`` message for a folder of another architecture.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.errors import ConfigError
from ditax.parallel.rules import param_spec

Axes = dict   # parameter path (strings) -> logical axis names

log = logging.getLogger(__name__)


def _path_str(path) -> tuple[str, ...]:
    return tuple(str(getattr(p, "key", getattr(p, "name", p))) for p in path)


def param_shardings(state, axes: Axes, mesh, offload: str = "none") -> Any:
    """NamedShardings (same tree as ``state``, an ``nnx.State`` or its pure dict) from the
    logical ``axes`` of each parameter path; a variable without axes is replicated.
    ``offload="host"``: the stacked blocks' in host memory (:func:`ditax.nn.offload.on_host`)."""
    from ditax.nn.offload import on_host

    def one(path, leaf):
        key = _path_str(path)
        if key and key[-1] == "value":
            key = key[:-1]
        names = axes.get(key)
        if names is None:
            return NamedSharding(mesh, P())
        return on_host(NamedSharding(mesh, param_spec(names, mesh, leaf.shape)), names,
                       leaf.shape, offload)

    return jax.tree_util.tree_map_with_path(one, state)


def param_sharding(axes: Axes, mesh, offload: str = "none") -> Optional[Callable]:
    """``sharding(path, shape)`` for :func:`ditax.io.convert.load_params` (None without a
    mesh and offload: plain arrays). ``offload="host"``: the stacked blocks' in host memory
    (:func:`ditax.nn.offload.on_host`; without a mesh, the first device's host memory)."""
    from ditax.nn.offload import on_host

    if mesh is None:
        if offload == "none":
            return None
        return lambda path, shape: on_host(None, axes[path], shape, offload)

    def sharding(path, shape):
        return on_host(NamedSharding(mesh, param_spec(axes[path], mesh, shape)), axes[path],
                       shape, offload)

    return sharding


def init_module(build: Callable, mesh, seed: int, shardings: Callable,
                quantize: Optional[Callable] = None, group_bytes: Optional[int] = None):
    """``build(mesh, rngs)`` randomly initialised from ``seed``; with a mesh, its parameters
    are created straight into ``shardings(abstract_state)`` (no full copy on any device).
    ``quantize``: see :func:`init_program`. The state is drawn in groups of parameters of at
    most ``group_bytes`` each (:func:`init_groups`; None: a quarter of the first device's
    memory where it reports one), one program a group, so a device holds the temporaries of
    one group at a time, never the whole model's (a single program drawing Wan 2.1 14B with
    ``model.offload=host`` asked a 16 GB v5e for 18.8 GB of temporaries); every grouping
    draws the same values."""
    if quantize is None and mesh is None:
        return build(None, nnx.Rngs(seed))
    gdef, init, out = _init_parts(build, mesh, seed, shardings, quantize)
    if group_bytes is None:
        group_bytes = default_group_bytes(mesh)
    return nnx.merge(gdef, run_grouped(init, out, group_bytes))


def default_group_bytes(mesh) -> Optional[int]:
    """A quarter of the first device's memory (``memory_stats()["bytes_limit"]``); None (one
    program) where the device reports none (CPU)."""
    if mesh is None:
        return None
    stats = getattr(mesh.devices.flat[0], "memory_stats", lambda: None)() or {}
    limit = stats.get("bytes_limit")
    return int(limit) // 4 if limit else None


def init_groups(sizes, group_bytes: Optional[int]) -> list[list[int]]:
    """Consecutive runs of the leaf indices of ``sizes`` (bytes) whose sum stays within
    ``group_bytes`` (a larger leaf is a group of its own); None: one group of all."""
    if group_bytes is None:
        return [list(range(len(sizes)))]
    groups, total = [], 0
    for i, n in enumerate(sizes):
        if not groups or total + n > group_bytes:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += n
    return groups


DRAW_CHUNK = 1 << 20   # elements one fusion of a random init draws at most (group_programs)


def group_programs(init: Callable, out, group_bytes: Optional[int]):
    """``(treedef, [(leaf indices, program)])``: the jitted programs (no arguments) that
    :func:`run_grouped` runs, one a group of ``init()``'s leaves (:func:`init_groups`), each
    returning its group's leaves in ``out``'s shardings (None: the default). ``init`` is
    traced once; each program evaluates that trace and keeps its group's leaves, the other
    draws dead code that ``jit`` drops before lowering (so a group compiles only its draws),
    its large draws in chunks of at most :data:`DRAW_CHUNK` elements, the same values
    (:func:`ditax.nn.draws.eval_chunked`: a TPU compile's time grows with the elements a
    fusion draws)."""
    from ditax.nn.draws import eval_chunked

    closed, shapes = jax.make_jaxpr(init, return_shape=True)()
    leaves, tree = jax.tree_util.tree_flatten(shapes)
    places = [None] * len(leaves) if out is None else jax.tree_util.tree_leaves(
        out, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    def draw():
        return eval_chunked(closed.jaxpr, closed.consts, [], DRAW_CHUNK)

    programs = []
    for group in init_groups([a.size * a.dtype.itemsize for a in leaves], group_bytes):
        def part(group=group):
            drawn = draw()
            return [drawn[i] for i in group]

        shard = None if out is None else [places[i] for i in group]
        programs.append((group, jax.jit(part, out_shardings=shard)))
    return tree, programs


def run_grouped(init: Callable, out, group_bytes: Optional[int]):
    """``init()``'s state drawn one group of leaves at a time (:func:`group_programs`),
    placed in ``out``'s shardings (None: the default)."""
    tree, programs = group_programs(init, out, group_bytes)
    values = [None] * tree.num_leaves
    for group, program in programs:
        for i, v in zip(group, program()):
            values[i] = v
    if len(programs) > 1:
        log.info("random init: %d parameters in %d programs of at most %.2f GB",
                 len(values), len(programs), group_bytes / 1e9)
    return jax.tree_util.tree_unflatten(tree, values)


def init_program(build: Callable, mesh, seed: int, shardings: Callable,
                 quantize: Optional[Callable] = None):
    """``(graphdef, init)``: the jitted program (no arguments) that draws
    :func:`init_module`'s whole state in one (:func:`init_module` runs it in groups where
    the device is small), created in ``shardings(abstract_state)`` with a mesh.

    ``quantize(model)`` (optional; :func:`ditax.nn.quant.quantize_module`) makes linears of
    the abstract model 8-bit in place: their kernels and scales are drawn in 8 bits inside
    this program (:func:`ditax.nn.quant_random.random_quantized`), where the float kernels
    the build draws go unused and are dropped, so no full-precision copy of a quantized
    kernel is ever written; 8-bit host arrays (``model.offload=host``) are created in the
    layout their per-layer copies need (:func:`ditax.nn.offload.placement`)."""
    gdef, init, out = _init_parts(build, mesh, seed, shardings, quantize)
    return gdef, jax.jit(init, out_shardings=out)


def _init_parts(build, mesh, seed, shardings, quantize):
    """``(graphdef, init, out shardings)`` of :func:`init_program` (``init`` not jitted)."""
    from ditax.nn.offload import placement
    from ditax.nn.quant_random import random_quantized

    model = nnx.eval_shape(lambda: build(mesh, nnx.Rngs(0)))
    gdef, abstract = nnx.split(model if quantize is None else quantize(model))

    def init():
        state = nnx.split(build(mesh, nnx.Rngs(seed)))[1]
        if quantize is None:
            return state
        values = random_quantized(abstract, nnx.to_pure_dict(state), seed)
        state = jax.tree.map(lambda x: x, abstract)      # the quantized tree, filled here
        nnx.replace_by_pure_dict(state, values)
        return state

    out = None if mesh is None else shardings(abstract)
    if out is not None and quantize is not None:
        out = jax.tree.map(lambda sh, a: placement(sh, a.dtype, a.ndim), out, abstract)
    return gdef, init, out


class Builder:
    """A family's three builders from its module class and its table's logical axes:
    ``module(cfg, attention, mesh, rngs=...)``, ``axes(cfg)`` -> :data:`Axes`. The configs
    are the caller's, checked once at its entry point, not here."""

    def __init__(self, module: Callable, axes: Callable):
        self.module, self.axes = module, axes

    def param_shardings(self, state, cfg, mesh) -> Any:
        """NamedShardings (same tree as ``state``) from the table's logical axes
        (:func:`param_shardings`; other variables replicated)."""
        from ditax.nn.quant import with_scale_axes   # 8-bit kernels' scales shard with them

        return param_shardings(state, with_scale_axes(self.axes(cfg)), mesh,
                               getattr(cfg, "offload", "none"))

    def abstract_model(self, cfg, attention=None, mesh=None):
        """The model with ``ShapeDtypeStruct`` parameters (nothing allocated)."""
        return nnx.eval_shape(lambda: self.module(cfg, attention, mesh, rngs=nnx.Rngs(0)))

    def init_model(self, cfg, attention=None, mesh=None, seed: int = 0):
        """Randomly initialised model; with a mesh, parameters are created already sharded.
        ``cfg.quantize``: its block linears in 8 bits as the loader stores them (with
        ``cfg.quantize_activations``' dots), drawn in 8 bits (:func:`init_program`)."""
        return init_module(*self._init(cfg, attention, mesh, seed))

    def init_program(self, cfg, attention=None, mesh=None, seed: int = 0):
        """:meth:`init_model`'s ``(graphdef, jitted init program)`` (:func:`init_program`;
        e.g. to read its compiled memory)."""
        return init_program(*self._init(cfg, attention, mesh, seed))

    def _init(self, cfg, attention, mesh, seed):
        mode = getattr(cfg, "quantize", "none")
        quantize = None
        if mode != "none":
            from ditax.nn.quant import check_dots, describe, quantize_module

            devices = None if mesh is None else list(mesh.devices.flat)
            check_dots(mode, cfg.quantize_activations, devices)     # before any work
            log.info("random init: block linears in %s", describe(
                mode, cfg.quantize_activations, devices))
            quantize = lambda model: quantize_module(  # noqa: E731
                model, mode, cfg.quantize_activations, devices)
        return (lambda mesh, rngs: self.module(cfg, attention, mesh, rngs=rngs), mesh, seed,
                lambda state: self.param_shardings(state, cfg, mesh), quantize)


def check_architecture(path, diff) -> None:
    """Raise :class:`~ditax.errors.ConfigError` for ``init_from=path`` when its folder's
    architecture differs from the configured one: ``diff`` lists ``(field, configured,
    folder's)``; the message names each and the ``model.X=...`` overrides that would match."""
    if not diff:
        return
    listing = ", ".join(f"{f}: config {a} vs folder {b}" for f, a, b in diff)
    fix = " ".join(f"model.{f}={','.join(map(str, b)) if isinstance(b, tuple) else b}"
                   for f, _, b in diff)
    raise ConfigError(f"init_from={str(path)!r}: the folder's transformer differs from the "
                      f"configured model ({listing}); pass {fix} or use the matching preset")


class LoadedTransformer:
    """A loaded module as a pytree (leaves: its parameters; static: the graph, which holds the
    mesh), so a user's own ``jax.jit`` / ``jax.grad`` of a function of it takes the
    parameters as arguments. Subclasses add ``__call__`` and are registered with
    ``jax.tree_util.register_pytree_node_class``.

    ``.module`` is the NNX module, ``.config`` its model config, ``.mesh`` its mesh.
    """

    def __init__(self, module):
        self._module = module
        self._gdef, self._state = nnx.split(module)
        self.config = module.cfg

    @property
    def module(self):
        if self._module is None:
            self._module = nnx.merge(self._gdef, self._state)
        return self._module

    @property
    def mesh(self):
        """The module's mesh (None: one device); the module is its one holder."""
        return self.module.mesh

    def tree_flatten(self):
        return (self._state,), (self._gdef, self.config)

    @classmethod
    def tree_unflatten(cls, aux, children):
        tr = object.__new__(cls)
        tr._gdef, tr.config = aux
        tr._state, tr._module = children[0], None
        return tr

    def set_lora_strengths(self, strengths) -> None:
        """New strengths for LoRAs loaded with ``lora_mode="unmerged"`` (one per LoRA, in
        order). Only values change, so nothing recompiles."""
        from ditax.lora.unmerged import set_strengths

        set_strengths(self.module, strengths, self.mesh)
        self._gdef, self._state = nnx.split(self.module)

    def _place(self, x, batch_axis=0):
        """``x`` split over the module's batch shards (unchanged without a mesh / for None)."""
        return self.module.sharding.put_batch(x, batch_axis)


__all__ = ["param_shardings", "param_sharding", "init_module", "init_program",
           "check_architecture", "LoadedTransformer"]
