"""FLUX.1 as a :class:`~ditax.models.base.ModelFamily`: the transformer, its loader and
shardings, and training (:mod:`ditax.models.flux.training`: the packed denoiser call with the
pooled text, position ids and guidance; the resolution's timestep shift; the VAE, CLIP and T5
encoders of ``ditax preprocess``). What FLUX.2 shares (the still-image grid, the forwarding
methods, the guidance of training) is :class:`~ditax.models.common.bfl.family.BflFamily`."""

from __future__ import annotations


from ditax.errors import ConfigError
from ditax.models.common.bfl.family import PACK, VAE_FACTOR, BflFamily, bfl_parts, vae_factor


class FluxFamily(BflFamily):
    """``model``: :class:`ditax.models.flux.config.FluxConfig`; ``attention``: an
    :class:`~ditax.attention.config.AttentionConfig` (None: ``xla``)."""

    name = "flux"
    label, packing, token_grid = "Flux", "token packing", False
    guided, unguided = "FLUX.1-dev", "FLUX.1-schnell"
    default_guidance = "ditax.models.flux.training:DEFAULT_GUIDANCE"
    parts = bfl_parts("ditax.models.flux", "FluxTransformer", "training:FluxEncoders")

    @property
    def latent_channels(self) -> int:
        """The VAE latent channels: one token packs ``2 x 2`` latent pixels."""
        return self.model.in_channels // PACK ** 2

    def _forward_flops(self, latent_shape, text_len: int) -> dict:
        """Forward matmul FLOPs of one sample by part: with L image and T text tokens,
        S = L + T, width D, MLP width M, per double block q / k / v of both streams 6·S·D²,
        attention 4·S²·D, the MLP inputs 2·S·D·M, the output projections 2·S·D² + 2·S·M·D,
        the modulation 12·D² (two streams, 6·D each); per single block 6·S·D², 4·S²·D,
        2·S·D·M (``proj_mlp``), 2·S·(D + M)·D (``proj_out``), 6·D²; the embedders and the
        output head besides."""
        m = self.model
        L, T = self.tokens_per_sample(latent_shape), text_len
        S, D, M = L + T, m.inner_dim, m.mlp_dim
        double = dict(qkv=6 * S * D * D, attn=4 * S * S * D, mlp_in=2 * S * D * M,
                      proj_out=2 * S * D * D + 2 * S * M * D, mod=24 * D * D)
        single = dict(qkv=6 * S * D * D, attn=4 * S * S * D, mlp_in=2 * S * D * M,
                      proj_out=2 * S * (D + M) * D, mod=6 * D * D)
        embed = (2 * L * m.in_channels * D + 2 * T * m.joint_attention_dim * D
                 + 2 * m.pooled_projection_dim * D + 8 * D * D)
        head = 4 * D * D + 2 * L * D * m.output_channels
        return {"double": {k: m.num_layers * v for k, v in double.items()},
                "single": {k: m.num_single_layers * v for k, v in single.items()},
                "rest": embed + head}

    def recompute_flops_per_sample(self, latent_shape, text_len: int) -> float:
        """The forward FLOPs ``model.remat`` runs again in the backward, per sample: the
        parts of the blocks that its policy does not save (``full``: all of them; ``save_proj``:
        the single blocks' q / k / v, MLP inputs and attention, the double blocks' attention;
        ``save_proj_out``: all but the output projections; ``save_attn_out``: all but the
        attention; ``save_dots*``: the attention kernels, which are no dots)."""
        recompute = {"none": (), "full": ("qkv", "attn", "mlp_in", "proj_out", "mod"),
                     "save_proj_out": ("qkv", "attn", "mlp_in", "mod"),
                     "save_attn_out": ("qkv", "mlp_in", "proj_out", "mod"),
                     "save_dots": ("attn",), "save_dots_no_batch": ("attn",)}
        f = self._forward_flops(latent_shape, text_len)
        if self.model.remat == "save_proj":
            return float(f["double"]["attn"] + f["double"]["mod"]
                         + sum(f["single"][k] for k in ("qkv", "attn", "mlp_in", "mod")))
        parts = recompute[self.model.remat]
        return float(sum(f[s][k] for s in ("double", "single") for k in parts))

    # -- training -------------------------------------------------------------------------------

    def check_shift(self, flow) -> None:
        """``flow.dynamic_shift`` replaces ``flow.shift``, so not both."""
        self.check_dynamic_shift(flow, "the image size")

    def few_step_sample(self, steps: int, sigmas: list, shift: float | None) -> dict:
        """FLUX.1's pipeline: Euler already; the embedded guidance the student was trained
        with (none for schnell-like models), true CFG off."""
        out = {"num_inference_steps": steps, "sigmas": list(sigmas), "true_cfg_scale": 1.0}
        if self.guidance is not None:
            out["guidance_scale"] = float(self.guidance)
        if shift is not None:
            out["flow_shift"] = float(shift)
        return out

    def training_flow(self, latent_shape):
        """``flow.dynamic_shift``: the flow with ``shift = e^mu`` of the image's token count
        (:func:`ditax.models.flux.training.resolution_shift`)."""
        return self.dynamic_flow(self.tokens_per_sample(latent_shape),
                                 "ditax.models.flux.training:resolution_shift")

    def condition_shapes(self, latent_shape) -> dict:
        """Each sample's pooled CLIP vector ``pooled [Dp]`` (stored by ``ditax preprocess``)."""
        from ditax.models.flux.training import POOLED

        return {POOLED: (self.model.pooled_projection_dim,)}

    def apply(self, module, latents, timestep, text, text_mask, condition=None):
        """:func:`ditax.models.flux.training.denoise` (every text token attended, as the
        pipeline samples: ``text_mask`` is not used)."""
        from ditax.models.flux.training import POOLED, denoise

        return denoise(module, latents, timestep, text, condition[POOLED], self.guidance)

    # -- inference ------------------------------------------------------------------------------

    def random_inputs(self, batch: int, latent=None, text_len: int = 512, rng=None):
        """diffusers' ``FluxTransformer2DModel`` call: packed tokens ``[B, (Y/2)(X/2), 4C]`` of
        one latent frame (default grid 1x32x32), T5 text ``[B, T, Dt]``, pooled CLIP
        ``[B, Dp]``, timestep 0.5, the position ids, guidance 3.5 where embedded."""
        import jax.numpy as jnp
        import numpy as np

        from ditax.models.flux.packing import image_ids, text_ids

        rng = np.random.default_rng(0) if rng is None else rng
        f, y, x = (1, 32, 32) if latent is None else latent
        if f != 1 or y < PACK or x < PACK or y % PACK or x % PACK:
            raise ConfigError(f"--latent {f},{y},{x}: a Flux latent is one frame whose height "
                              f"and width are positive multiples of {PACK} (the token "
                              f"packing); e.g. --latent 1,32,32")
        m = self.model
        dt = jnp.dtype(m.dtype)
        rand = lambda *shape: jnp.asarray(rng.standard_normal(shape), dt)  # noqa: E731
        hidden = rand(batch, (y // PACK) * (x // PACK), m.in_channels)
        text, pooled = rand(batch, text_len, m.joint_attention_dim), rand(
            batch, m.pooled_projection_dim)
        guidance = jnp.full((batch,), 3.5) if m.guidance_embeds else None
        return (hidden, text, pooled, jnp.full((batch,), 0.5), image_ids(y, x),
                text_ids(text_len), guidance), {}


__all__ = ["FluxFamily", "PACK", "VAE_FACTOR", "vae_factor"]
