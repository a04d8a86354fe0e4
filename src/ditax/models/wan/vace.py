"""Wan VACE transformer (diffusers ``WanVACETransformer3DModel``): the Wan DiT plus a control
branch whose blocks turn a control context into hints added to the main blocks' output.

The control context ``[B, C_v, F, Y, X]`` (``C_v = vace_in_channels``: inactive and reactive
latents of the control video and the 8x8-folded mask, see
:mod:`ditax.pipelines.wan.vace_inputs`) is patch-embedded by ``vace_patch_embedding`` into
tokens ``c [B, L, D]`` (zero tokens past its frames, as the reference pads), then

    c = proj_in(c) + h0                       (h0: the patch-embedded latents; block 0 only)
    for k in VACE blocks:  c = block_k(c);  hint_k = proj_out_k(c)

where each VACE block is a :class:`~ditax.models.wan.transformer.WanBlock` (same modulation,
self- and cross-attention through the model's attention plan, so every backend and mesh
works) with its ``proj_out``. The main blocks run as Wan's; after block ``vace_layers[k]``
(sorted) the tokens get ``hint_k * scale_k`` (``control_hidden_states_scale``, diffusers'
``conditioning_scale`` per VACE layer). Both stacks run scanned; the hints are stacked
``[n, B, L', D]`` and the main scan picks its hint by layer index.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import ConfigError
from ditax.models.wan.config import DIFFUSERS_FIELDS, WanConfig
from ditax.models.wan.extra_inputs import checked_embed
from ditax.models.wan.transformer import WanBlock, WanTransformer, patch_embedding
from ditax.nn import Linear
from ditax.nn.stack import REMAT, make_stack, run_stack

VACE_CLASS = "WanVACETransformer3DModel"


@dataclass(frozen=True)
class WanVaceConfig(WanConfig):
    """:class:`WanConfig` plus the VACE branch: ``vace_layers`` (main blocks after which a hint
    is added; the reference requires layer 0) and ``vace_in_channels`` (control context
    channels: ``2 z + 64`` for a VAE of ``z`` latent channels and 8x spatial factor)."""

    vace_layers: tuple[int, ...] = (0, 5, 10, 15, 20, 25, 30, 35)
    vace_in_channels: int = 96

    def to_diffusers(self) -> dict:
        out = super().to_diffusers()
        out["_class_name"] = VACE_CLASS
        out.update(vace_layers=list(self.vace_layers), vace_in_channels=self.vace_in_channels)
        return out

    @property
    def hint_layers(self) -> tuple[int, ...]:
        """``vace_layers`` sorted: hint ``k`` is added after main block ``hint_layers[k]``."""
        return tuple(sorted(self.vace_layers))


VACE_FIELDS = DIFFUSERS_FIELDS + ("vace_layers", "vace_in_channels")


def vace_config(m: WanConfig) -> WanVaceConfig:
    """``m`` as a :class:`WanVaceConfig` (a run config's ``model:`` section is a
    :class:`WanConfig`; its non-empty ``vace_layers`` make it a VACE model)."""
    if isinstance(m, WanVaceConfig):
        return m
    return WanVaceConfig(**{f.name: getattr(m, f.name) for f in dataclasses.fields(WanConfig)})


def check_vace(m: WanVaceConfig) -> None:
    """The VACE fields' rules (after :func:`~ditax.models.wan.config.check_transformer`)."""
    layers = m.vace_layers
    if not layers or len(set(layers)) != len(layers):
        raise ConfigError(f"model.vace_layers={list(layers)} must be a non-empty list of "
                          f"distinct block indices")
    if min(layers) < 0 or max(layers) >= m.num_layers:
        raise ConfigError(f"model.vace_layers={list(layers)} must lie in 0..{m.num_layers - 1} "
                          f"(num_layers={m.num_layers})")
    if 0 not in layers:
        raise ConfigError(f"model.vace_layers={list(layers)} must include layer 0 (the first "
                          f"VACE block reads the latents' tokens)")
    if m.vace_in_channels < 1:
        raise ConfigError(f"model.vace_in_channels={m.vace_in_channels} must be >= 1")
    if m.image_dim is not None:
        raise ConfigError(f"model.image_dim={m.image_dim}: VACE with image cross-attention is "
                          f"not wired in ditax (no public VACE model has it); use image_dim=None")
    if m.quantize != "none":
        raise ConfigError(f"model.quantize={m.quantize!r} is not wired for VACE transformers "
                          f"(the VACE blocks would stay unquantized); use model.quantize=none")


class VaceBlock(WanBlock):
    """A Wan block with the hint projection ``proj_out`` (diffusers ``vace_blocks.{k}``)."""

    def __init__(self, cfg: WanConfig, *, rngs):
        super().__init__(cfg, rngs=rngs)
        d = cfg.inner_dim
        self.proj_out = Linear(d, d, dtype=cfg.dtype, param_dtype=jnp.dtype(cfg.param_dtype),
                               rngs=rngs)


class WanVaceTransformer(WanTransformer):
    """``model(latents, t, text, control_hidden_states=c [B, C_v, F_c, Y, X],
    control_hidden_states_scale=s [n] or [B, n]) → [B, C, F, Y, X]`` (module docstring)."""

    TOKEN_COPIES = False   # its hints change the tokens after embed: no copies

    def __init__(self, cfg: WanVaceConfig, attention=None, mesh=None, *, rngs: nnx.Rngs):
        super().__init__(cfg, attention, mesh, rngs=rngs)
        d = cfg.inner_dim
        pd = jnp.dtype(cfg.param_dtype)
        self.vace_patch_embedding_kernel, self.vace_patch_embedding_bias = patch_embedding(
            cfg, cfg.vace_in_channels, rngs)
        self.vace_proj_in = Linear(d, d, dtype=cfg.dtype, param_dtype=pd, rngs=rngs)
        self.vace_blocks = make_stack(lambda r: VaceBlock(cfg, rngs=r), len(cfg.vace_layers),
                                      rngs)

    def check_control(self, latents, control, scale) -> None:
        """Raise ValueError naming the shapes of a control context the model cannot take."""
        cfg = self.cfg
        b, _, f, y, x = latents.shape
        n = len(cfg.vace_layers)
        if control is None:
            raise ValueError("a VACE transformer needs control_hidden_states [B, "
                             f"{cfg.vace_in_channels}, F, Y, X] (the control context)")
        if (control.ndim != 5 or control.shape[0] != b or control.shape[1] != cfg.vace_in_channels
                or tuple(control.shape[3:]) != (y, x) or control.shape[2] > f
                or control.shape[2] % cfg.patch_size[0]):
            raise ValueError(f"control_hidden_states must be [B={b}, vace_in_channels="
                             f"{cfg.vace_in_channels}, F<={f}, {y}, {x}] (the latents' grid); "
                             f"got {tuple(control.shape)}")
        if scale is not None and tuple(scale.shape) not in ((n,), (b, n)):
            raise ValueError(f"control_hidden_states_scale must be [{n}] or [B={b}, {n}] (one "
                             f"scale per VACE layer); got {tuple(scale.shape)}")

    def __call__(self, latents, timestep, encoder_hidden_states, text_mask=None,
                 encoder_hidden_states_image=None, control_hidden_states=None,
                 control_hidden_states_scale=None):
        h, ctx = self.embed(latents, timestep, encoder_hidden_states, text_mask,
                            encoder_hidden_states_image, control_hidden_states,
                            control_hidden_states_scale)
        return self.head(self.run_blocks(h, ctx), ctx)

    def embed(self, latents, timestep, encoder_hidden_states, text_mask=None,
              encoder_hidden_states_image=None, control_hidden_states=None,
              control_hidden_states_scale=None):
        """Wan's embedding, then the hints ``[n, B, L', D]`` of the control context
        (:attr:`Embedded.hints`, with the per-sample scales ``[B, n]``)."""
        h, ctx, (control, scale) = checked_embed(
            super().embed, self.check_control,
            (control_hidden_states, control_hidden_states_scale), latents, timestep,
            encoder_hidden_states, text_mask, encoder_hidden_states_image)
        cfg, sharding = self.cfg, self.sharding
        dt = jnp.dtype(cfg.dtype)
        b = h.shape[0]
        n = len(cfg.vace_layers)
        scale = jnp.ones((b, n), dt) if scale is None else jnp.broadcast_to(scale, (b, n))
        c = self._control_tokens(control.astype(dt), ctx.seq + ctx.pad)
        c = c if ctx.tiles is None else ctx.tiles.to_tiles(c)   # h's order (tile-major)
        c = self.vace_proj_in(c) + h
        plan = ctx.plan(self.attention_plan)

        def body(c, block):
            c = block(c, ctx.text, ctx.mod, ctx.rope, ctx.token_mask, ctx.text_mask,
                      plan, sharding, ctx.image)
            hint = sharding.constrain(block.proj_out(c), ("act_batch", "act_seq", "act_embed"))
            return c, hint

        if cfg.remat != "none":
            body = nnx.remat(body, policy=REMAT[cfg.remat], prevent_cse=not cfg.scan_layers)
        if cfg.scan_layers:
            hints = nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))(
                c, self.vace_blocks)[1]
        else:
            gdef, stacked = nnx.split(self.vace_blocks)
            hints = []
            for k in range(n):
                c, hint = body(c, nnx.merge(gdef, jax.tree.map(lambda p, k=k: p[k], stacked)))
                hints.append(hint)
            hints = jnp.stack(hints)
        return h, ctx._replace(hints=hints, hint_scale=scale.astype(dt))

    def _control_tokens(self, control, length: int):
        """Patch-embedded control context ``[B, L_c, D]``, zero tokens up to ``length``."""
        cfg, sharding = self.cfg, self.sharding
        b, c, fr, hh, ww = control.shape
        pt, ph, pw = cfg.patch_size
        f, y, x = fr // pt, hh // ph, ww // pw
        xp = control.reshape(b, c, f, pt, y, ph, x, pw)
        xp = xp.transpose(0, 2, 4, 6, 3, 5, 7, 1).reshape(b, f * y * x, pt * ph * pw * c)
        xp = sharding.constrain(xp, ("act_batch", "act_seq", None))
        kern = self.vace_patch_embedding_kernel[...].astype(control.dtype)
        tok = (jnp.einsum("blc,cd->bld", xp, kern.reshape(pt * ph * pw * c, -1))
               + self.vace_patch_embedding_bias[...].astype(control.dtype))
        tok = jnp.pad(tok, ((0, 0), (0, length - f * y * x), (0, 0)))
        return sharding.constrain(tok, ("act_batch", "act_seq", "act_embed"))

    def run_blocks(self, h, ctx, start: int = 0, stop: int | None = None):
        """Main blocks ``start .. stop-1``; after block ``hint_layers[k]`` the tokens get
        ``hints[k] * scale[:, k]`` (the layer index rides in the scan's carry)."""
        cfg = self.cfg
        depth = cfg.num_layers
        plan, sharding = ctx.plan(self.attention_plan), self.sharding
        which = np.zeros(depth, np.int32)
        has = np.zeros(depth, bool)
        for k, layer in enumerate(cfg.hint_layers):
            which[layer], has[layer] = k, True
        which, has = jnp.asarray(which), jnp.asarray(has)
        hints, scale = ctx.hints, ctx.hint_scale

        def body(carry, block):
            hs, i = carry
            hs = block(hs, ctx.text, ctx.mod, ctx.rope, ctx.token_mask, ctx.text_mask, plan,
                       sharding, ctx.image)
            k = which[i]
            hint = jax.lax.dynamic_index_in_dim(hints, k, 0, keepdims=False)
            s = jax.lax.dynamic_index_in_dim(scale, k, 1, keepdims=False)[:, None, None]
            hs = jnp.where(has[i], hs + hint * s, hs)
            return hs, i + 1

        return run_stack(self.blocks, body, (h, jnp.int32(start)), depth=depth, start=start,
                         stop=stop, remat=cfg.remat, scan=cfg.scan_layers,
                         prefetch=cfg.offload_prefetch)[0]


__all__ = ["VACE_CLASS", "VACE_FIELDS", "VaceBlock", "WanVaceConfig", "WanVaceTransformer",
           "check_vace", "vace_config"]
