"""FLUX.1 as a :class:`~ditax.models.base.ModelFamily`: the transformer, its loader and
shardings, and training (:mod:`ditax.models.flux.training`: the packed denoiser call with the
pooled text, position ids and guidance; the resolution's timestep shift; the VAE, CLIP and T5
encoders of ``ditax preprocess``)."""

from __future__ import annotations

import dataclasses

from flax import nnx

from ditax.errors import ConfigError
from ditax.io.files import folder_vae_json
from ditax.models.base import ModelFamily

VAE_FACTOR = 8    # FLUX.1's VAE: spatial downsampling (four levels)
PACK = 2          # 2 x 2 latent patches are packed into one token (C_in = 4 x latent C)


def vae_factor(vae=None) -> int:
    """Pixels per latent pixel of a Flux VAE (diffusers ``AutoencoderKL``): 2 per level but
    the last, ``2 ** (len(block_out_channels) - 1)``. ``vae``: its ``config.json`` dict, or
    any object with ``block_out_channels`` (a :class:`~ditax.models.vae.kl.config.
    FluxVAEConfig`); None: FLUX.1's (8)."""
    if vae is None:
        return VAE_FACTOR
    widths = vae.get("block_out_channels") if isinstance(vae, dict) else getattr(
        vae, "block_out_channels", None)
    if not widths:
        raise ConfigError(f"the VAE config has no block_out_channels ({vae!r}); give the "
                          f"folder's vae/config.json")
    return 2 ** (len(widths) - 1)


class FluxFamily(ModelFamily):
    """``model``: :class:`ditax.models.flux.config.FluxConfig`; ``attention``: an
    :class:`~ditax.attention.config.AttentionConfig` (None: ``xla``)."""

    name = "flux"
    default_frames = 1    # still images

    def check(self, mesh_sizes=None) -> None:
        from ditax.models.flux.config import check_transformer

        check_transformer(self.model, self.attention, mesh_sizes)

    @classmethod
    def folder_config(cls, root) -> dict:
        """The architecture fields of the folder's ``transformer/config.json`` (the loader's own
        reading of it: :meth:`~ditax.models.flux.config.FluxConfig.from_diffusers`), as
        :class:`~ditax.models.flux.config.FluxConfig` fields."""
        from ditax.models.flux.config import FluxConfig
        from ditax.models.registry import spec

        raw = cls.transformer_json(root, spec(cls.name).transformer_classes)
        if raw is None:
            return {}
        m = FluxConfig.from_diffusers(raw)
        return {k: getattr(m, k) for k in m.to_diffusers() if k != "_class_name"}

    @property
    def latent_channels(self) -> int:
        """The VAE latent channels: one token packs ``2 x 2`` latent pixels."""
        return self.model.in_channels // PACK ** 2

    text_dim = property(lambda self: self.model.joint_attention_dim)   # Dt of the T5 text

    @classmethod
    def latent_grid(cls, num_frames, height, width, vae=None):
        """Latent ``(1, Y, X)`` of one image; ``vae``: the VAE's config (dict or object with
        ``block_out_channels``, :func:`vae_factor`; None: FLUX.1's 8x)."""
        s = vae_factor(vae)
        f = s * PACK
        if num_frames != 1:
            raise ConfigError(f"{num_frames} frames: Flux makes still images; use 1 frame")
        if height < f or width < f or height % f or width % f:
            raise ConfigError(f"height x width = {height}x{width} must be multiples of {f} "
                              f"(the VAE's {s}x and the 2x2 token packing)")
        return 1, height // s, width // s

    @classmethod
    def size_rule(cls, root=None, model=None):
        """Sides: multiples of the VAE's factor (``root/vae/config.json``'s, FLUX.1's 8 when
        the folder has none) x the 2x2 token packing; still images (one frame)."""
        from ditax.models.size_rule import SizeRule

        s = vae_factor(folder_vae_json(root))
        return SizeRule(cls.name, s * PACK, None,
                        f"the VAE's {s}x and the {PACK}x{PACK} token packing",
                        latent=(1, PACK, PACK))

    @classmethod
    def folder_latent_grid(cls, root, num_frames, height, width):
        """:meth:`latent_grid` with the factor of ``root/vae/config.json`` (FLUX.1's 8 when the
        folder has none, e.g. a hub id), the sizes on the folder's :meth:`size_rule`."""
        cls.size_rule(root).check(height, width, None, error=ConfigError)
        return cls.latent_grid(num_frames, height, width, folder_vae_json(root))

    def tokens_per_sample(self, latent_shape) -> int:
        _, _, y, x = latent_shape
        return (y // PACK) * (x // PACK)

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

    def flops_per_sample(self, latent_shape, text_len: int) -> float:
        """Forward + backward = 3 × forward matmul FLOPs (no remat recompute; the parts:
        :meth:`_forward_flops`)."""
        f = self._forward_flops(latent_shape, text_len)
        return 3.0 * (sum(f["double"].values()) + sum(f["single"].values()) + f["rest"])

    def recompute_flops_per_sample(self, latent_shape, text_len: int) -> float:
        """The forward FLOPs ``model.remat`` runs again in the backward, per sample: the
        parts of the blocks that its policy does not save (``full``: all of them; ``save_proj``:
        the single blocks' q / k / v, MLP inputs and attention, the double blocks' attention;
        ``save_attn_out``: all but the attention; ``save_dots*``: the attention kernels,
        which are no dots)."""
        recompute = {"none": (), "full": ("qkv", "attn", "mlp_in", "proj_out", "mod"),
                     "save_attn_out": ("qkv", "mlp_in", "proj_out", "mod"),
                     "save_dots": ("attn",), "save_dots_no_batch": ("attn",)}
        f = self._forward_flops(latent_shape, text_len)
        if self.model.remat == "save_proj":
            return float(f["double"]["attn"] + f["double"]["mod"]
                         + sum(f["single"][k] for k in ("qkv", "attn", "mlp_in", "mod")))
        parts = recompute[self.model.remat]
        return float(sum(f[s][k] for s in ("double", "single") for k in parts))

    # -- module ---------------------------------------------------------------------------------

    def create(self, mesh, rngs: nnx.Rngs):
        from ditax.models.flux.transformer import FluxTransformer

        return FluxTransformer(self.model, self.attention, mesh, rngs=rngs)

    def param_shardings(self, params, mesh):
        from ditax.models.flux.build import param_shardings

        return param_shardings(params, self.model, mesh)

    # -- training -------------------------------------------------------------------------------

    def check_flow(self) -> None:
        """``flow.guidance`` needs a guidance embedding (FLUX.1-dev, not schnell);
        ``flow.dynamic_shift`` replaces ``flow.shift``, so not both."""
        f = self.flow
        if f is None:
            return
        if f.guidance is not None and not self.model.guidance_embeds:
            raise ConfigError(f"flow.guidance={f.guidance}: this Flux model has no guidance "
                              f"embedding (model.guidance_embeds=false, FLUX.1-schnell); remove "
                              f"flow.guidance")
        if f.dynamic_shift and f.shift != 1.0:
            raise ConfigError(f"flow.shift={f.shift} with flow.dynamic_shift=true: the shift "
                              f"then comes from the image size; set flow.shift=1 or "
                              f"flow.dynamic_shift=false")

    @property
    def guidance(self) -> float | None:
        """The guidance input while training: ``flow.guidance`` or 3.5 for a model with a
        guidance embedding (FLUX.1-dev), None without (schnell)."""
        if not self.model.guidance_embeds:
            return None
        from ditax.models.flux.training import DEFAULT_GUIDANCE

        given = None if self.flow is None else self.flow.guidance
        return DEFAULT_GUIDANCE if given is None else float(given)

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
        f = self.flow
        if f is None or not f.dynamic_shift:
            return f
        from ditax.models.flux.training import resolution_shift

        return dataclasses.replace(f, dynamic_shift=False,
                                   shift=resolution_shift(self.tokens_per_sample(latent_shape)))

    def condition_shapes(self, latent_shape) -> dict:
        """Each sample's pooled CLIP vector ``pooled [Dp]`` (stored by ``ditax preprocess``)."""
        from ditax.models.flux.training import POOLED

        return {POOLED: (self.model.pooled_projection_dim,)}

    def apply(self, module, latents, timestep, text, text_mask, condition=None):
        """:func:`ditax.models.flux.training.denoise` (every text token attended, as the
        pipeline samples: ``text_mask`` is not used)."""
        from ditax.models.flux.training import POOLED, denoise

        return denoise(module, latents, timestep, text, condition[POOLED], self.guidance)

    @classmethod
    def load_encoders(cls, folder, dtype: str = "float32"):
        """The VAE, CLIP and T5 of a ``FluxPipeline`` folder
        (:class:`ditax.models.flux.training.FluxEncoders`)."""
        from ditax.models.flux.training import FluxEncoders

        return FluxEncoders(folder, dtype)

    # -- weights and inference ------------------------------------------------------------------

    def weights_folder(self, path):
        from ditax.models.flux.loading import check_architecture

        return check_architecture(self.model, path)

    def load_params(self, folder, mesh) -> dict:
        from ditax.models.flux.loading import load_weights_into

        model = load_weights_into(self.abstract(mesh), folder, self.model, mesh)
        return nnx.to_pure_dict(nnx.split(model)[1])

    @classmethod
    def load_transformer(cls, path, **kwargs):
        """:func:`ditax.models.flux.loading.load_transformer` (diffusers folders)."""
        from ditax.models.flux.loading import load_transformer

        return load_transformer(path, **kwargs)

    def random_transformer(self, mesh, seed: int = 0):
        from ditax.models.flux.build import init_model
        from ditax.models.flux.loading import FluxTransformerModel

        return FluxTransformerModel(init_model(self.model, self.attention, mesh, seed=seed))

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

    @classmethod
    def check_folder(cls, path, subfolder="transformer") -> str:
        from ditax.models.flux.loading import check_folder

        return check_folder(path, subfolder)

    # -- single files and LoRA names (models/flux/single_file.py, lora_names.py) -------------

    def check_single_file(self, path) -> str:
        from ditax.models.flux.single_file import check_single_file

        return check_single_file(path, self.model)

    def convert_single_file(self, path, out, *, dtype=None, loras=None):
        from ditax.models.flux.single_file import write_diffusers_folder

        return write_diffusers_folder(path, self.model, out, dtype=dtype, loras=loras)

    def lora_table(self):
        from ditax.models.flux.convert import weight_table

        return weight_table(self.model)
