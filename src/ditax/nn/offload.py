"""Block weights in host memory (``model.offload=host``): where they live and how each block's
weights reach the device.

Every matrix of a block stack (a leading ``layers`` logical axis: Wan's and VACE's blocks,
FLUX.1's double and single blocks, LTX-2's blocks) is placed in the host memory of its devices
(JAX memory kind ``pinned_host``), with the sharding it has on the device (under ``fsdp`` each
device keeps its own shard on its host): nearly all of a model's bytes. Everything else — the
blocks' vectors (:func:`offloaded` says why), embeddings, the output head, LoRA adapters being
trained — stays in device memory.

:func:`ditax.nn.stack.run_stack` scans over layer indices and puts each block's host-resident
weights in device memory: in forward programs ahead of the block (:func:`scan_prefetched`:
``model.offload_prefetch`` blocks carried, layer ``i + k``'s copy made in iteration ``i``),
in training inside the block's own step (:func:`to_device`). On TPU, XLA's host-offload pass
makes each per-layer slice of a host array an asynchronous copy (``dynamic-slice-start`` /
``-done`` from memory space ``S(5)``); the plan tests check in the compiled program that each
copy leaves the loop body through its carry, brought for the next block. Where XLA's
scheduler starts that copy is its choice: in the v6e programs compiled here, after the
current block's compute, so on paper the copy is not hidden behind it. On CPU the host and
device memories are the same RAM: the program moves nothing and the results equal the
resident model's bit for bit.

8-bit kernels (``model.quantize=int8|fp8``) on the host of a TPU get an explicit layout
(:func:`placement`): XLA's default for a host ``s8`` / ``f8`` array tiles its two minor
dimensions by ``(32, 128)`` while one layer's device copy is tiled ``(8, 128)``, and with the
two differing the compiled program brought the whole stacked array across in every layer
(590 GB a step for Wan 14B, 42x its weights). Laid out ``(8, 128)(4, 1)`` on the host, each
layer's slice is copied as it lies: once per layer, as bf16 weights are.

Gradients: LoRA training keeps the frozen base on the host and the adapters on the device
(the copies run again in the backward pass under remat). Full training with offloaded weights
is refused: the update of a host array would need the optimizer on the host too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental.layout import Format, Layout
from jax.sharding import SingleDeviceSharding

HOST = "pinned_host"
# the TPU tiling of an 8-bit host array whose per-layer slices a device copies as they lie
# (the tiling XLA gives one layer's 8-bit copy on the device; its default for the host array
# is (32, 128), which made every layer's copy move the whole stack)
TPU_8BIT_TILING = ((8, 128), (4, 1))


def offloaded(names, shard_shape) -> bool:
    """Whether a parameter of logical axes ``names`` and per-device shape ``shard_shape``
    lives on the host under offload: a stacked block's (a leading ``layers`` axis) matrix or
    larger whose every other dimension is more than 1 — every kernel, nearly all the bytes.
    A block's vectors (biases, norm gains, 8-bit scales: ``[layers, n]``) and tables with a
    unit dimension (``[layers, 1, 6, D]``) stay on the device: a TPU tiles the two minor
    dimensions of an array's layout, and XLA may lay a unit dimension out anywhere, so one
    layer's slice of such a host array is not a copy the TPU can start on its own."""
    return (bool(names) and names[0] == "layers" and len(shard_shape) >= 3
            and min(shard_shape[1:]) > 1)


def on_host(sharding, names, shape, offload: str):
    """``sharding`` with memory kind ``pinned_host`` where ``offload == "host"`` and the
    parameter is one :func:`offloaded` puts there; else ``sharding`` unchanged. A ``None``
    sharding (no mesh) becomes the first device's host memory."""
    if offload != "host":
        return sharding
    if not offloaded(names, shape if sharding is None else sharding.shard_shape(shape)):
        return sharding
    if sharding is None:
        return SingleDeviceSharding(jax.devices()[0], memory_kind=HOST)
    return sharding.with_memory_kind(HOST)


def placement(sharding, dtype, ndim: int):
    """Where an array of ``dtype`` and ``ndim`` dimensions placed by ``sharding`` is put:
    ``sharding`` itself, or for an 8-bit array in the host memory of TPUs a
    :class:`jax.experimental.layout.Format` with :data:`TPU_8BIT_TILING` (the module
    docstring says why). Takes and gives what ``jax.device_put``, ``ShapeDtypeStruct(...,
    sharding=)`` and ``jit``'s ``out_shardings`` take."""
    if (getattr(sharding, "memory_kind", None) != HOST or jnp.dtype(dtype).itemsize != 1
            or ndim < 2 or next(iter(sharding.device_set)).platform != "tpu"):
        return sharding
    return Format(Layout(tuple(range(ndim)), tiling=TPU_8BIT_TILING), sharding)


def streamable(state):
    """``state`` (any pytree of arrays) with its 8-bit host arrays re-laid out for per-layer
    copies (:func:`placement`); the same arrays where none needs it (off TPU: always)."""
    def one(x):
        if not isinstance(x, jax.Array):
            return x
        where = placement(x.sharding, x.dtype, x.ndim)
        return x if where is x.sharding else jax.device_put(x, where)

    return jax.tree.map(one, state)


def is_host(x) -> bool:
    """Whether ``x`` (an array or a traced value) is in host memory."""
    return getattr(jax.typeof(x), "memory_space", None) == jax.memory.Space.Host


def to_device(block: nnx.Module) -> nnx.Module:
    """``block`` with its host-memory weights put in device memory (the same module when none
    is on the host)."""
    gdef, state = nnx.split(block)
    if not any(is_host(x) for x in jax.tree.leaves(state)):
        return block
    state = jax.tree.map(lambda x: jax.device_put(x, jax.memory.Space.Device)
                         if is_host(x) else x, state)
    return nnx.merge(gdef, state)


def on_device(method):
    """Decorate a module method (an encoder's call) so it runs on the module with its
    host-kept weights (:func:`keep_on_host`) put in device memory for that call only
    (:func:`to_device`; the module itself when none is on the host)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return method(to_device(self), *args, **kwargs)

    return call


def fetch(stacked, i):
    """Layer ``i`` of the stacked state ``stacked`` (leaves ``[layers, ...]``), its
    host-memory leaves put in device memory."""
    def one(p):
        x = jax.lax.dynamic_index_in_dim(p, i, 0, False)
        return jax.device_put(x, jax.memory.Space.Device) if is_host(p) else x

    return jax.tree.map(one, stacked)


def scan_prefetched(step, stacked, carry, start: int, stop: int, depth: int):
    """``carry = step(carry, layer i)`` for ``i`` in ``start .. stop-1`` under a scan whose
    carry holds the device copies of the next ``depth`` layers: iteration ``i`` issues layer
    ``i + depth``'s host-to-device copy (the last layer's again past the end), then runs layer
    ``i`` from the copy made ``depth`` iterations before — so each copy has ``depth`` blocks'
    compute to hide behind, at the cost of ``depth + 1`` layers' weights in device memory.
    Forward programs only: a backward pass would keep every iteration's carried copies."""
    last = stop - 1
    ring = tuple(fetch(stacked, min(start + j, last)) for j in range(depth))

    def one(c, i):
        c, ring = c
        nxt = fetch(stacked, jnp.minimum(i + depth, last))
        return (step(c, ring[0]), ring[1:] + (nxt,)), None

    return jax.lax.scan(one, (carry, ring), jnp.arange(start, stop))[0][0]


def keep_on_host(module: nnx.Module) -> nnx.Module:
    """Put every array of ``module`` (an encoder: its weights are read whole by one program)
    in the host memory of the devices it is on, in place; returns ``module``. The programs
    that run it put it in device memory first (:func:`to_device`): device memory only while
    they run."""
    gdef, state = nnx.split(module)
    state = jax.tree.map(lambda x: jax.device_put(x, x.sharding.with_memory_kind(HOST))
                         if isinstance(x, jax.Array) else x, state)
    nnx.update(module, state)
    return module


def host_bytes(state) -> int:
    """Bytes of the arrays of ``state`` (any pytree of arrays) held in host memory, summed over
    every shard (a replicated array counted once per device)."""
    total = 0
    for x in jax.tree.leaves(state):
        sh = getattr(x, "sharding", None)
        if sh is not None and sh.memory_kind == HOST:
            total += sum(s.data.nbytes for s in x.addressable_shards)
    return total


__all__ = ["HOST", "TPU_8BIT_TILING", "fetch", "host_bytes", "is_host", "keep_on_host",
           "offloaded", "on_device", "on_host", "placement", "scan_prefetched", "streamable",
           "to_device"]
