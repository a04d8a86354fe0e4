"""FLUX.2 as a :class:`~ditax.models.base.ModelFamily`: the transformer, its loader and
shardings, and training (:mod:`ditax.models.flux2.training`: the packed denoiser call with the
4-axis position ids and, for FLUX.2-dev, the guidance input).

Latents are the transformer's own grid: the VAE's latents patchified 2 x 2 and normalised
(``C = in_channels = 128``, one token per latent pixel), so one image of ``H x W`` pixels is
``[C, 1, H/16, W/16]`` (the FLUX.2 VAE's 8x, times the 2x2 patchify). What FLUX.1 shares
(the still-image grid, the forwarding methods, the guidance of training) is
:class:`~ditax.models.common.bfl.family.BflFamily`.
"""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.models.common.bfl.family import PACK as PATCH, VAE_FACTOR, BflFamily, bfl_parts


class Flux2Family(BflFamily):
    """``model``: :class:`ditax.models.flux2.config.Flux2Config`; ``attention``: an
    :class:`~ditax.attention.config.AttentionConfig` (None: ``xla``)."""

    name = "flux2"
    label, packing, token_grid = "FLUX.2", "patchify", True
    guided, unguided = "FLUX.2-dev", "FLUX.2-klein"
    default_guidance = "ditax.models.flux2.training:DEFAULT_GUIDANCE"
    parts = bfl_parts("ditax.models.flux2", "Flux2Transformer",
                      "training_encoders:Flux2Encoders",
                      load="single_file:load_transformer")   # folders, and single files

    @property
    def latent_channels(self) -> int:
        """The patchified latent channels the transformer reads per token (``in_channels``)."""
        return self.model.in_channels

    def _forward_flops(self, latent_shape, text_len: int) -> dict:
        """Forward matmul FLOPs of one sample by part: with L image and T text tokens,
        S = L + T, width D, SwiGLU width M, per double block q / k / v of both streams
        6·S·D², attention 4·S²·D, the MLP inputs 2·S·D·2M, the output projections
        2·S·D² + 2·S·M·D; per single block the fused input 2·S·D·(3D + 2M), attention
        4·S²·D, the fused output 2·S·(D + M)·D; the shared modulations (17·D per D),
        embedders and the output head besides."""
        m = self.model
        L, T = self.tokens_per_sample(latent_shape), text_len
        S, D, M = L + T, m.inner_dim, m.mlp_dim
        double = dict(qkv=6 * S * D * D, attn=4 * S * S * D, mlp_in=4 * S * D * M,
                      proj_out=2 * S * D * D + 2 * S * M * D)
        single = dict(qkv=2 * S * D * (3 * D + 2 * M), attn=4 * S * S * D,
                      proj_out=2 * S * (D + M) * D)
        embeds = 2 if m.guidance_embeds else 1
        rest = (2 * L * m.in_channels * D + 2 * T * m.joint_attention_dim * D
                + embeds * (2 * m.timestep_guidance_channels * D + 2 * D * D)
                + 2 * 17 * D * D + 2 * L * D * m.output_channels)
        return {"double": {k: m.num_layers * v for k, v in double.items()},
                "single": {k: m.num_single_layers * v for k, v in single.items()},
                "rest": rest}

    def recompute_flops_per_sample(self, latent_shape, text_len: int) -> float:
        """The forward FLOPs ``model.remat`` runs again in the backward, per sample (``full``:
        all the blocks'; ``save_proj``: the single blocks' fused input and attention, the
        double blocks' attention; ``save_proj_out``: all but the output projections;
        ``save_attn_out``: all but the attention; ``save_dots*``: the attention kernels)."""
        f = self._forward_flops(latent_shape, text_len)
        remat = self.model.remat
        if remat == "save_proj":
            return float(f["double"]["attn"] + f["single"]["qkv"] + f["single"]["attn"])
        parts = {"none": (), "save_dots": ("attn",), "save_dots_no_batch": ("attn",),
                 "save_attn_out": ("qkv", "mlp_in", "proj_out"),
                 "save_proj_out": ("qkv", "attn", "mlp_in"),
                 "full": ("qkv", "attn", "mlp_in", "proj_out")}[remat]
        return float(sum(v for s in ("double", "single") for k, v in f[s].items()
                         if k in parts))

    # -- training -------------------------------------------------------------------------------

    def check_shift(self, flow) -> None:
        """``flow.dynamic_shift`` (a size-dependent shift) is not FLUX.2's: refused."""
        if flow.dynamic_shift:
            raise ConfigError("flow.dynamic_shift=true: ditax has no FLUX.2 size-dependent "
                              "shift for training; set flow.dynamic_shift=false (and "
                              "flow.shift=S for a fixed shift)")

    def apply(self, module, latents, timestep, text, text_mask, condition=None):
        """:func:`ditax.models.flux2.training.denoise` (every text token attended, as the
        pipelines sample: ``text_mask`` is not used)."""
        from ditax.models.flux2.training import denoise

        return denoise(module, latents, timestep, text, self.guidance)

    # -- inference ------------------------------------------------------------------------------

    def random_inputs(self, batch: int, latent=None, text_len: int = 512, rng=None):
        """diffusers' ``Flux2Transformer2DModel`` call: tokens ``[B, Y·X, C]`` of one latent
        frame (default grid 1x64x64: 1024² pixels), text ``[B, T, Dt]``, timestep 0.5, the
        position ids, guidance 4.0 where embedded."""
        import jax.numpy as jnp
        import numpy as np

        from ditax.models.flux2.training import image_ids, text_ids

        rng = np.random.default_rng(0) if rng is None else rng
        f, y, x = (1, 64, 64) if latent is None else latent
        if f != 1 or y < 1 or x < 1:
            raise ConfigError(f"--latent {f},{y},{x}: a FLUX.2 latent is one frame of "
                              f"positive height and width (tokens); e.g. --latent 1,64,64")
        m = self.model
        dt = jnp.dtype(m.dtype)
        rand = lambda *shape: jnp.asarray(rng.standard_normal(shape), dt)  # noqa: E731
        hidden, text = rand(batch, y * x, m.in_channels), rand(batch, text_len,
                                                                m.joint_attention_dim)
        guidance = jnp.full((batch,), 4.0) if m.guidance_embeds else None
        return (hidden, text, jnp.full((batch,), 0.5), image_ids(y, x), text_ids(text_len),
                guidance), {}


__all__ = ["Flux2Family", "PATCH", "VAE_FACTOR"]
