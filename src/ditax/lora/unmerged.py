"""Unmerged LoRA: the low-rank updates run beside the unchanged weights, strengths are data.

:func:`attach` replaces each targeted :class:`~ditax.nn.Linear` of a loaded model by a
:class:`LoraLinear` that shares its kernel and bias and adds, for LoRAs ``j = 1..J``,

    y = x @ kernel + bias + ((x @ downᵀ) · scale · s[owner]) @ up + Σ_j s_j · bias_j

with ``down [R, in]`` / ``up [R, out]`` the LoRAs' factors concatenated along the rank
(``R = Σ_j r_j``; a layer a LoRA does not touch holds zeros), ``scale [R]`` each component's
``alpha / r``, ``owner`` (static) the LoRA of each component and ``s [J]`` the strengths. In
the stacked blocks every one of these carries the leading layer axis, so the layer scan slices
them like any parameter. On an 8-bit base (``quantize=``) the base term is its quantized
dot (:class:`ditax.nn.quant.QuantSpec`) and the LoRA term runs in the compute dtype, so a
strength change needs no re-quantization. Strengths are variables: :func:`set_strengths` changes them without
changing any shape, so nothing recompiles. The same rows and checks as the merged path
(:func:`~ditax.lora.merge.plan_patches`) decide what goes where; full weight deltas (``diff``)
exist only merged.

Per-row strengths (rows of one batch with different LoRAs / strengths): inside a traced
step, :func:`row_strengths` sets every layer's strength to ``[(L,) Bf, J]``, one vector per
row of the forward's batch ``Bf`` (the request rows ``[B, J]`` tiled ``Bf / B`` times: the
classifier-free-guidance batch is ``[cond_1..cond_B, uncond_1..uncond_B]``). Then each
row's LoRA terms use its own vector, broadcast over the token axes. A layer whose input
folds an inner axis into the batch, batch-major (``[Bf·M, ...]``: Wan's per-token
timestep embedding ``[Bf·L, ...]``, Animate's face encoder ``[Bf·heads, ...]``), gives each
of its ``M`` rows its sample's vector; a leading axis that is not a multiple of ``Bf`` is an
error at trace time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import WeightError
from ditax.io.convert import Table, linear_weight, param_shapes
from ditax.lora.merge import plan_patches, upstream_shapes
from ditax.lora.table import Lora
from ditax.nn import Linear
from ditax.nn.quant_dot import join_parts


class LoraWeight(nnx.Variable):
    """LoRA factors, scales and bias deltas (not ``nnx.Param``: base-weight filters skip them)."""


class LoraFactor(LoraWeight):
    """Trainable LoRA factors (``down`` / ``up`` of adapters being fine-tuned)."""


class LoraStrength(nnx.Variable):
    """The strength of each LoRA, ``[(L,) J]``; per row of the batch ``[(L,) Bf, J]``
    (:func:`row_strengths`, inside a traced step)."""


class LoraLinear(Linear):
    """A :class:`Linear` with unmerged LoRA updates (module docstring for the formula)."""

    def __init__(self, base: Linear, down, up, scale, owner: tuple[int, ...], bias, strength,
                 factor=LoraWeight):
        self.kernel, self.bias, self.dtype = base.kernel, base.bias, base.dtype
        self.out_heads = base.out_heads
        if base.quant is not None:     # 8-bit base (ditax.nn.quant): its dot, its scales
            self.quant, self.kernel_scale = base.quant, base.kernel_scale
        self.lora_down = factor(down)              # [(L,) R, in]
        self.lora_up = factor(up)                  # [(L,) R, out]
        self.lora_scale = LoraWeight(scale)        # [(L,) R]
        self.lora_bias = None if bias is None else LoraWeight(bias)   # [(L,) J, out]
        self.lora_strength = LoraStrength(strength)                    # [(L,) J]
        self.lora_owner = owner

    def __call__(self, x):
        return super().__call__(x) + self._delta(x)

    def _delta(self, x):
        """The LoRA terms on ``x [..., in]`` → ``[..., out]`` (0 when none). Strengths ``[J]``
        (the layer scan has sliced the layer axis): shared by every row; ``[Bf, J]``: one
        vector per row of the forward's batch (:func:`row_strengths`), ``x [Bf·M, ..., in]``."""
        dt = self.dtype
        s = self.lora_strength[...].astype(dt)
        per_row = s.ndim == 2
        if per_row:
            s, lead = _rows_of(s, x), (x.shape[0],) + (1,) * (x.ndim - 2)
        y = jnp.zeros((), dt)
        if self.lora_owner:
            g = self.lora_scale[...].astype(dt) * jnp.take(s, jnp.asarray(self.lora_owner), -1)
            if per_row:                                    # [N, R] → [N, 1.., R]
                g = g.reshape(lead + g.shape[-1:])
            h = jnp.einsum("...i,ri->...r", x.astype(dt), self.lora_down[...].astype(dt))
            y = y + jnp.einsum("...r,ro->...o", h * g, self.lora_up[...].astype(dt))
        if self.lora_bias is not None:
            if per_row:
                b = jnp.einsum("nj,jo->no", s, self.lora_bias[...].astype(dt))
                y = y + b.reshape(lead + b.shape[-1:])
            else:
                y = y + jnp.einsum("j,jo->o", s, self.lora_bias[...].astype(dt))
        return y

    def out_columns(self, x, start, size: int, place=None):
        """Output columns ``[start, start + size)`` of :meth:`__call__` (base and LoRA terms),
        for a layer computed in column chunks; the base's own slice (``place`` as for
        :meth:`Linear.out_columns`) plus the LoRA terms'."""
        y = super().out_columns(x, start, size, place)
        d = jnp.broadcast_to(self._delta(x), y.shape[:-1] + (self.dims()[2],))
        return y + jax.lax.dynamic_slice_in_dim(d, start, size, axis=d.ndim - 1)

    def column_input(self, x):
        """``x`` as is: the LoRA terms read the full-precision input."""
        return x

    def joined_input(self, parts, lead: int | None = None):
        """The concatenation as is: the LoRA terms read the full-precision input."""
        return join_parts(parts, lead)

    def from_heads(self, x):
        """``x [..., N, K]`` flattened to ``[..., N·K]`` through :meth:`__call__` (base and
        LoRA terms; the base layer's relayout-free contraction is for the merged case)."""
        return self(x.reshape(x.shape[:-2] + (-1,)))

    def to_head_major(self, x, num_heads: int):
        """:meth:`__call__` viewed head-major ``[B, N, L, K]`` (base and LoRA terms)."""
        y = self(x)
        return jnp.swapaxes(y.reshape(y.shape[:-1] + (num_heads, -1)), 1, 2)

    def from_head_major(self, x):
        """Head-major ``x [B, N, L, K]`` through :meth:`__call__` (base and LoRA terms)."""
        return self(jnp.swapaxes(x, 1, 2).reshape(x.shape[0], x.shape[2], -1))


def _rows_of(s, x):
    """Per-row strengths ``s [Bf, J]`` for each row of ``x [N, ..., in]``: ``N = Bf·M``
    (an inner axis folded into the batch, batch-major) repeats each row ``M`` times."""
    rows = s.shape[0]
    if x.ndim < 2 or x.shape[0] % rows:
        raise ValueError(
            f"per-row LoRA strengths [{rows}, {s.shape[1]}] (row_strengths: one vector per row "
            f"of a batch of {rows}) on a layer input of shape {tuple(x.shape)}: its leading "
            f"axis must be the batch, or the batch with an inner axis folded in after it "
            f"([{rows}·M, ...]); pass row_strengths the forward's batch size")
    m = x.shape[0] // rows
    return s if m == 1 else jnp.repeat(s, m, axis=0)


def _by_module(table: Table) -> dict[str, tuple]:
    """Upstream key of a Linear's weight / bias → (our module path, layer or None, part, the
    depth of its stack: :meth:`Table.depth`, Flux's double and single stacks differ)."""
    linears = {r.path[:-1] for r in table.rows if r.path[-1] == "kernel"
               and linear_weight(r.transform)}
    out = {}
    for row in table.rows:
        if row.path[:-1] not in linears:
            continue
        for i, key in enumerate(table.names(row)):
            out[key] = (row.path[:-1], i if row.stacked else None, row.path[-1],
                        table.depth(row) if row.stacked else None)
    return out


def _collect(loras, table: Table, shapes: dict, names=None) -> dict:
    """module path → {"layers": L or None, "rank": {(j, layer): (down, up, scale)},
    "bias": {(j, layer): delta}}; every LoRA checked as in the merged path."""
    targets, where = upstream_shapes(table, shapes), _by_module(table)
    found: dict = {}
    for j, (lora, _) in enumerate(loras):
        for key, patches in plan_patches([(lora, 1.0)], targets, names=names).items():
            part = where.get(key, (None, None, None, None))[2]
            if part is None or (part == "kernel" and any(p.delta is not None for p in patches)):
                raise WeightError(f"{lora.source}: {key} is a full delta or not a Linear layer; "
                                  f"unmerged LoRAs update Linear layers only — load it merged")
            path, layer, part, depth = where[key]
            slot = found.setdefault(path, {"layers": depth,
                                           "rank": {}, "bias": {}})
            for p in patches:
                if part == "kernel":
                    slot["rank"][(j, layer)] = (p.down, p.up, p.factor)
                else:
                    slot["bias"][(j, layer)] = p.delta
    return found


def _arrays(slot: dict, j_count: int, din: int, dout: int, dtype):
    """The stacked / concatenated factors of one module (module docstring)."""
    layers = slot["layers"]
    idx = [None] if layers is None else list(range(layers))
    ranks = [max((slot["rank"][(j, i)][0].shape[0] for i in idx if (j, i) in slot["rank"]),
                 default=0) for j in range(j_count)]
    total = sum(ranks)
    down = np.zeros((len(idx), total, din), np.float32)
    up = np.zeros((len(idx), total, dout), np.float32)
    scale = np.zeros((len(idx), total), np.float32)
    owner = tuple(j for j, r in enumerate(ranks) for _ in range(r))
    for (j, i), (d, u, f) in slot["rank"].items():
        at, r = sum(ranks[:j]), d.shape[0]
        li = 0 if i is None else i
        down[li, at:at + r], up[li, at:at + r], scale[li, at:at + r] = d, u.T, f
    bias = None
    if slot["bias"]:
        bias = np.zeros((len(idx), j_count, dout), np.float32)
        for (j, i), b in slot["bias"].items():
            bias[0 if i is None else i, j] = b
    arrays = [down, up, scale, bias]
    if layers is None:
        arrays = [None if a is None else a[0] for a in arrays]
    cast = [None if a is None else jnp.asarray(a, dtype) for a in arrays]
    return cast, owner


def _place(x, mesh):
    if mesh is None or x is None:
        return x
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax.device_put(x, NamedSharding(mesh, P()))


def attach(module, loras: list[tuple[Lora, float]], table: Table, mesh=None, *,
           names=None) -> int:
    """Replace the Linear layers ``loras`` target by :class:`LoraLinear` s (in place);
    returns how many. ``table``: the model's diffusers table; ``names``: the family's
    :class:`~ditax.lora.names.LoraNames` (its block names and hint in messages)."""
    shapes = param_shapes(nnx.state(module, nnx.Param))
    found = _collect(loras, table, shapes, names)
    strengths = np.asarray([s for _, s in loras], np.float32)
    for path, slot in found.items():
        parent = module
        for name in path[:-1]:
            parent = getattr(parent, name)
        base = getattr(parent, path[-1])
        _, din, dout = base.dims()
        # factors in the weights' float dtype (an 8-bit kernel's: the compute dtype)
        dtype = base.dtype if base.quant is not None else base.kernel[...].dtype
        (down, up, scale, bias), owner = _arrays(slot, len(loras), din, dout, dtype)
        strength = strengths if slot["layers"] is None else np.tile(strengths, (slot["layers"], 1))
        new = LoraLinear(base, *(_place(a, mesh) for a in (down, up, scale)), owner,
                         _place(bias, mesh), _place(jnp.asarray(strength), mesh))
        setattr(parent, path[-1], new)
    return len(found)


def _lora_layers(module):
    """Every :class:`LoraLinear` of ``module`` with its stack depth (None: not stacked)."""
    for _, m in nnx.iter_graph(module):
        if isinstance(m, LoraLinear):
            down = m.lora_down[...]             # [(L,) R, in]
            yield m, (down.shape[0] if down.ndim == 3 else None)


def lora_count(module) -> int:
    """How many LoRAs are attached (``J``; 0 without any :class:`LoraLinear`)."""
    for m, _ in _lora_layers(module):
        return int(m.lora_strength[...].shape[-1])
    return 0


def _check_count(m: LoraLinear, j: int) -> None:
    have = m.lora_strength[...].shape[-1]
    if have != j:
        raise ValueError(f"{j} strength(s) given; the model has {have} LoRA(s)")


def set_strengths(module, strengths, mesh=None) -> None:
    """New strengths (one per attached LoRA, in order) for every :class:`LoraLinear`, shared
    by every row (``[(L,) J]``; undoes an eager :func:`row_strengths`)."""
    s = np.asarray(strengths, np.float32).reshape(-1)
    for m, layers in _lora_layers(module):
        _check_count(m, s.shape[0])
        shape = s.shape if layers is None else (layers,) + s.shape
        new = np.ascontiguousarray(np.broadcast_to(s, shape))
        m.lora_strength.set_value(_place(jnp.asarray(new), mesh))


def row_strengths(module, s_rows, batch: int) -> None:
    """Per-row strengths for one forward, set in place: ``s_rows [B, J]`` (float32, may be
    traced) gives row ``i`` of the batch strength vector ``s_rows[i]``; ``batch`` (static) is
    the batch of the forward that follows, ``Bf``: ``B``, or ``k·B`` for ``k`` stacked copies
    of the rows (classifier-free guidance batched: ``[cond_1..cond_B, uncond_1..uncond_B]``,
    ``Bf = 2B``), so row ``r`` takes ``s_rows[r mod B]``.

    Called inside the traced / jitted step on the module ``nnx.merge`` built there, before
    the forward; every :class:`LoraLinear` gets ``[Bf, J]`` (stacked layers ``[L, Bf, J]``,
    sliced by the layer scan). The strengths are kept replicated on the module's mesh (they
    are tiny; the activations' batch may be split over data / fsdp). Shapes change, so called
    outside a trace the next call recompiles; :func:`set_strengths` restores shared ones."""
    s = jnp.asarray(s_rows, jnp.float32)
    if s.ndim != 2:
        raise ValueError(f"row_strengths takes [B, J] strengths (one vector per row); got "
                         f"shape {tuple(s.shape)}")
    b, j = s.shape
    if not isinstance(batch, (int, np.integer)) or batch < b or batch % b:
        raise ValueError(f"row_strengths: batch={batch!r} must be the forward's batch size, "
                         f"a multiple of the {b} rows given (2·{b} for a CFG-batched forward)")
    s = jnp.tile(s, (int(batch) // b, 1))
    mesh = getattr(module, "mesh", None)
    if mesh is not None:
        from jax.sharding import NamedSharding, PartitionSpec as P

        s = jax.lax.with_sharding_constraint(s, NamedSharding(mesh, P()))
    for m, layers in _lora_layers(module):
        _check_count(m, j)
        m.lora_strength.set_value(s if layers is None
                                  else jnp.broadcast_to(s, (layers,) + s.shape))
