"""Resolved attention: :class:`AttentionCall` (one backend, its options, the sharding context
and target platform) and :class:`AttentionPlan` (a model's self- and cross-attention, built once
from an :class:`~ditax.attention.config.AttentionConfig` and the model's
:class:`~ditax.parallel.sharding.ShardingContext`, which both calls share).

Resolution happens once, before tracing: ``backend="auto"`` becomes a name, option names are
checked against the backends' options classes (one rule for ``attend`` and the config,
:func:`~ditax.attention.registry.check_options`), and ``interpret=None`` becomes the target
platform's choice. A model holds its plan and calls ``plan.self_attn(q, k, v, kv_mask=...)``.
:func:`entry_context` is what an entry point wraps a run in for the configured backends.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import ContextManager, Optional

import jax.numpy as jnp
from jax.sharding import Mesh

from ditax.attention import registry
from ditax.attention.blocks import default_block
from ditax.attention.config import PARALLEL_BACKENDS, AttentionConfig, given_options
from ditax.attention.options import Options, pick
from ditax.attention.local import LocalRun
from ditax.attention.sharded import sharded_local_attention
from ditax.errors import RequestError
from ditax.parallel.platform import Platform, platform_of, target_platform
from ditax.parallel.sharding import ShardingContext, sharding_context

@dataclass(frozen=True)
class AttentionCall:
    """One attention site, resolved: ``call(q, k, v, kv_mask=None, scale=None)``.

    Shapes: q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` bool (True =
    attend) → ``[B, Lq, N, K]`` in q's dtype. A local backend given a mesh runs under
    ``shard_map`` (:func:`~ditax.attention.sharded.sharded_local_attention`); a sequence
    backend plans and runs :mod:`ditax.attention.sequence`.
    """

    backend: str
    options: Options
    sharding: ShardingContext = ShardingContext()   # the mesh (None: one device)
    platform: Optional[Platform] = None      # None: platform_of(mesh) when called

    @property
    def mesh(self) -> Optional[Mesh]:
        return self.sharding.mesh

    @property
    def entry(self) -> registry.Backend:
        return registry.BACKENDS[self.backend]

    def local(self) -> tuple[str, Options]:
        """The local kernel that does the arithmetic, and its options (for a sequence
        backend: its ``local`` with the blocks / interpret it passes on)."""
        if self.entry.kind == "local":
            return self.backend, self.options
        entry = registry.get(self.options.local)
        return entry.name, pick(entry.options, dict(self.options.local_options,
                                                    **self.options.kwargs()))

    def __call__(self, q, k, v, *, kv_mask=None, scale=None, head_major: bool = False):
        """``head_major``: q ``[B, N, Lq, K]``, k/v ``[B, N, Lk, K]`` and the output
        head-major (the layout :attr:`reads_head_major` says this call reads without copies);
        the same values as the ``[B, L, N, K]`` call."""
        check_shapes(q, k, v, kv_mask, head_major=head_major)
        platform = self.platform or platform_of(self.mesh)
        # Kernels decide interpret / refusal from platform_of(); inside the call that is this
        # call's platform (the mesh's devices), not the process's jax.devices().
        with target_platform(platform.name, platform.compute_capability, platform.device_kind):
            return self._run(platform, q, k, v, kv_mask, scale, head_major)

    @property
    def reads_head_major(self) -> bool:
        """Whether q/k/v should reach this call head-major ``[B, N, L, K]`` — written so by
        the projections — rather than ``[B, L, N, K]``: on TPU a ``[L, D] → [L, N, K]`` view
        is itself a relayout (the (8, 128) tiles cover the two minor dims), and the kernels
        that read head-major (:attr:`~ditax.attention.registry.Backend.head_major`: flash,
        splash; for a sequence backend its local kernel) take their tiles in place. Also for
        flash with ``K = 128``, whose packed ``[L, N·K]`` path reads the projections as they
        are but leaves ``to_out`` a relayout of its output (measured at Wan 14B 720p on
        v6e-8: ``docs/architecture.md``). A function of the plan only, so static: part of
        the compiled program's identity."""
        return registry.BACKENDS[self.local()[0]].head_major

    def key_block(self, Lq: int, Lk: int) -> Optional[int]:
        """The key block this call's local kernel takes for ``Lq`` queries against ``Lk`` keys
        on its platform (it pads the keys to a multiple of it), from the same table and
        options as the call (:mod:`ditax.attention.tuning`); None where it pads to no block of
        the table: interpret mode, kernels other than splash and flash."""
        name, opts = self.local()
        platform = self.platform or platform_of(self.mesh)
        entry = registry.BACKENDS[name]
        kw = opts.kwargs()
        interpret = kw.get("interpret")
        if name not in ("splash", "flash") or (
                interpret if interpret is not None else entry.default_interpret(platform)):
            return None
        from ditax.attention import tuning

        if name == "splash":
            from ditax.attention.splash import TILES

            return tuning.splash_blocks(Lq, Lk, platform.device_kind,
                                        {t: kw.get(t) for t in TILES})["block_kv"]
        return tuning.flash_blocks(Lq, Lk, platform.device_kind, kw.get("block_q"),
                                   kw.get("block_kv"), kw.get("block_kv_compute"))[1]

    def token_copies(self, L: int) -> int:
        """Copies of its first tokens a model may append once per forward to its ``L``
        tokens for this self-attention (:func:`ditax.attention.splash.token_copies`: splash
        run locally, whose keys would be padded as copies anyway); 0 for other calls. The
        model then runs :meth:`with_copies`."""
        if self.backend != "splash":
            return 0
        from ditax.attention.splash import token_copies

        return token_copies(L, self.options, self.platform or platform_of(self.mesh))

    def with_copies(self, n: int) -> "AttentionCall":
        """This call for keys whose last ``n`` copy the first ``n`` (:meth:`token_copies`)."""
        return replace(self, options=replace(self.options, copied_keys=n)) if n else self

    def _run(self, platform: Platform, q, k, v, kv_mask, scale, head_major=False):
        entry = self.entry
        if entry.kind == "sequence":
            return entry.load()(self.backend, q, k, v, mesh=self.mesh, kv_mask=kv_mask,
                                scale=scale, options=self.options, platform=platform,
                                head_major=head_major)
        entry.require(platform, dtype=q.dtype, head_dim=q.shape[-1],
                      interpret=getattr(self.options, "interpret", None))
        kernel = LocalRun(entry, self.options, head_major=head_major)
        if self.mesh is not None:
            return sharded_local_attention(kernel, q, k, v, mesh=self.mesh, kv_mask=kv_mask,
                                           scale=scale, head_major=head_major)
        return kernel(q, k, v, kv_mask, scale)


def resolve(backend: str, options: dict, *, mesh=None, platform: Optional[Platform] = None,
            dtype=None, head_dim: Optional[int] = None) -> AttentionCall:
    """The :class:`AttentionCall` for ``attend(..., backend=backend, **options)``.

    ``backend="auto"`` becomes :func:`~ditax.attention.registry.auto_backend` of the platform
    for ``dtype`` / ``head_dim`` (the q that will be passed). Unknown backend → ValueError
    with a suggestion; an option the backend (for a sequence backend: nor its local kernel)
    does not take → :class:`~ditax.attention.options.OptionError` (a TypeError) naming the
    ones it takes.
    """
    platform = platform or platform_of(mesh)
    name = (registry.auto_backend(platform, dtype=dtype, head_dim=head_dim)
            if backend == "auto" else backend)
    entry = registry.get(name)
    # unset blocks stay unset: on a TPU the kernels take the table's for each call's lengths
    # (ditax.attention.tuning); elsewhere the options' defaults
    opts = registry.backend_options(name, options)
    return AttentionCall(name, entry.resolve(opts, platform), ShardingContext(mesh), platform)


@dataclass(frozen=True)
class AttentionPlan:
    """A model's attention, resolved once: ``self_attn`` and ``cross_attn`` calls sharing one
    ``sharding`` context (the model's) for the target ``platform`` (and the model's head dim /
    compute dtype when given)."""

    self_attn: AttentionCall
    cross_attn: AttentionCall
    sharding: ShardingContext
    platform: Platform
    num_heads: Optional[int] = None
    head_dim: Optional[int] = None
    dtype: Optional[str] = None

    @property
    def mesh(self) -> Optional[Mesh]:
        return self.sharding.mesh


def cross_backend(acfg: AttentionConfig) -> tuple[str, str]:
    """``(name, config key it comes from)`` of cross-attention: ``cross_backend`` when set,
    else the local kernel of a sequence backend (text K/V need no exchange), else
    ``backend``."""
    if acfg.cross_backend is not None:
        return acfg.cross_backend, "cross_backend"
    if acfg.backend in PARALLEL_BACKENDS:
        return acfg.local, "local"
    return acfg.backend, "backend"


def _config_call(name: str, values: dict, sharding: ShardingContext,
                 platform: Platform) -> AttentionCall:
    """One site's call: each kernel gets the options of ``values`` its class has (a sequence
    backend also those of its local kernel, in ``local_options``)."""
    entry = registry.get(name)
    opts = pick(entry.options, values)
    if entry.kind == "sequence":
        local = registry.get(opts.local).options.names()
        rest = sorted((k, v) for k, v in values.items()
                      if k in local and k not in entry.options.names() and v is not None)
        opts = replace(opts, local_options=tuple(rest))
    return AttentionCall(name, entry.resolve(opts, platform), sharding, platform)


def sites(acfg: AttentionConfig) -> tuple[str, ...]:
    """Every backend name a config runs (``auto`` as written): self-attention, its local
    kernel for a sequence backend, and cross-attention."""
    names = [acfg.backend, cross_backend(acfg)[0]]
    if acfg.backend in PARALLEL_BACKENDS:
        names.insert(1, acfg.local)
    return tuple(dict.fromkeys(names))


def _entries(acfg: AttentionConfig) -> list[registry.Backend]:
    names = [c for n in sites(acfg) for c in (registry.AUTO_CHOICES if n == "auto" else (n,))]
    return [registry.get(n) for n in dict.fromkeys(names)]


def needs_entry_context(acfg: AttentionConfig) -> bool:
    """Whether a backend the config runs declares an entry context (TE does)."""
    return any(e.entry_context is not None for e in _entries(acfg))


def entry_context(acfg: AttentionConfig, mesh=None, say=print) -> ContextManager:
    """The entry contexts (:attr:`~ditax.attention.registry.Backend.entry_context`) of every
    backend the config runs, entered together (a no-op context when none declares one);
    ``say`` announces each. For entry points (``ditax.front.run.run_context``), not layers."""
    stack = contextlib.ExitStack()
    for entry in _entries(acfg):
        if entry.entry_context is not None:
            stack.enter_context(entry.enter(mesh, say))
    return stack


def plan_attention(acfg: Optional[AttentionConfig] = None, mesh=None, *,
                   num_heads: Optional[int] = None, head_dim: Optional[int] = None,
                   dtype=None) -> AttentionPlan:
    """Build the :class:`AttentionPlan` for ``acfg`` (default: xla everywhere) on ``mesh`` (a
    mesh or None, or a model's :class:`~ditax.parallel.sharding.ShardingContext`: the plan's
    calls then hold that same object).

    The target platform is :func:`~ditax.parallel.platform.platform_of` (``mesh``) at this
    moment (so build it inside ``ditax.target_platform(...)`` to target another platform);
    ``auto`` is decided for it and for ``dtype`` / ``head_dim`` (the model's compute dtype
    and head dim).

    ``acfg`` is the entry point's config, checked there once
    (:func:`~ditax.attention.config.check_attention`); what is new here is what ``auto``
    decides, so only then are the options checked again against the kernel it chose.
    """
    acfg = AttentionConfig() if acfg is None else acfg
    sharding = sharding_context(mesh)
    platform = platform_of(sharding.mesh)
    configured = (acfg.backend, cross_backend(acfg)[0])
    names = [registry.auto_backend(platform, dtype=dtype, head_dim=head_dim) if n == "auto"
             else n for n in configured]
    given = given_options(acfg)
    if "auto" in configured:    # the config's rule with `auto` decided: no kernel may ignore one
        registry.check_options(names[0], given, cross=names[1] if acfg.cross_backend else None,
                               local=acfg.local if acfg.backend in PARALLEL_BACKENDS else None)
    values = {**given, "local": acfg.local, "out_a2a": acfg.out_a2a,
              "ulysses_shards": acfg.ulysses_shards}
    if platform.name != "tpu":      # a TPU's kernels fit the table's blocks to each call
        for k in ("block_q", "block_kv"):
            values[k] = default_block(platform.name) if values.get(k) is None else values[k]
    calls = [_config_call(name, values, sharding, platform) for name in names]
    return AttentionPlan(*calls, sharding, platform,
                         num_heads, head_dim, None if dtype is None else jnp.dtype(dtype).name)


def check_shapes(q, k, v, kv_mask=None, *, head_major: bool = False):
    """Raise :class:`~ditax.errors.RequestError` (a ``ValueError``) unless q/k/v/kv_mask have
    the BSHD shapes ``attend`` takes (``head_major``: ``[B, N, L, K]``)."""
    form = "[B, N, L, K]" if head_major else "[B, L, N, K]"
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise RequestError(f"attention expects q/k/v of rank 4 {form}; got q{q.shape} "
                           f"k{k.shape} v{v.shape}")
    if k.shape != v.shape:
        raise RequestError(f"k{k.shape} and v{v.shape} must have the same shape")
    t, n = (2, 1) if head_major else (1, 2)
    if (q.shape[0], q.shape[n], q.shape[3]) != (k.shape[0], k.shape[n], k.shape[3]):
        raise RequestError(f"q{q.shape} and k{k.shape} must agree on batch, heads and head dim")
    if kv_mask is not None and tuple(kv_mask.shape) != (k.shape[0], k.shape[t]):
        raise RequestError(f"kv_mask{tuple(kv_mask.shape)} must be [B, Lk] = "
                           f"{(k.shape[0], k.shape[t])}")


__all__ = ["AttentionCall", "AttentionPlan", "plan_attention", "resolve", "cross_backend",
           "check_shapes", "sites", "entry_context", "needs_entry_context"]
