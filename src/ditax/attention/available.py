"""``check_available``: will the configured attention run on the target platform? Asked before
anything heavy loads (``ditax generate`` calls it before reading weights), answered from the
registry's declared capabilities — nothing is traced or compiled.
"""

from __future__ import annotations

from ditax.attention.config import PARALLEL_BACKENDS, AttentionConfig
from ditax.attention import registry
from ditax.attention.plan import cross_backend, plan_attention
from ditax.attention.sequence.plan import ring_ulysses
from ditax.errors import AttentionUnavailable
from ditax.parallel.axes import seq_shards


def check_available(acfg: AttentionConfig, *, mesh=None, dtype, head_dim: int) -> None:
    """Raise :class:`~ditax.errors.AttentionUnavailable` when a configured attention backend
    (self, cross, or the local kernel of a sequence backend) cannot run on the target
    platform (:func:`~ditax.parallel.platform.platform_of` of ``mesh``) with ``dtype``
    q/k/v of head dim ``head_dim``. The message names the config key and value, the
    platform, the unmet condition and the fix. ``acfg`` is the entry point's config, already
    coerced and checked (:func:`~ditax.attention.config.check_attention`).
    """
    plan = plan_attention(acfg, mesh, head_dim=head_dim, dtype=dtype)
    cross, cross_key = cross_backend(acfg)
    sites = (("backend", acfg.backend, plan.self_attn), (cross_key, cross, plan.cross_attn))
    for key, configured, call in sites:
        local, opts = call.local()
        if call.entry.kind == "sequence":
            key, configured = "local", acfg.local
        entry = registry.get(local)
        why = entry.refusal(plan.platform, dtype=dtype, head_dim=head_dim,
                            interpret=getattr(opts, "interpret", None))
        if why is not None:
            shown = configured if configured == local else f"{configured} (-> {local})"
            raise AttentionUnavailable(f"attention.{key}={shown}: {why}")
    if acfg.backend in PARALLEL_BACKENDS:
        ring, _ = ring_ulysses(acfg.backend, seq_shards(mesh), plan.self_attn.options)
        if ring > 1:
            try:
                registry.ring_kernel(registry.get(acfg.local), acfg.backend)
            except ValueError:
                raise AttentionUnavailable(
                    f"attention.local={acfg.local}: backend={acfg.backend} merges ring steps by "
                    f"log-sum-exp, which {acfg.local!r} does not return; use "
                    f"attention.local=blockwise (or flash / xla / reference)") from None


__all__ = ["check_available"]
