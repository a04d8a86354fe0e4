"""Wan 2.1 / 2.2 text-to-video as a :class:`~ditax.models.base.ModelFamily`: what training and
preprocessing need, on top of the transformer, its loader and the Wan VAE / UMT5 encoders."""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
from flax import nnx

from ditax.attention.sparse.layout import attention_density
from ditax.errors import ConfigError
from ditax.models.base import Encoders, ModelFamily, TextEncoding


class WanFamily(ModelFamily):
    """``model``: :class:`ditax.models.wan.config.ModelConfig`; ``attention``: an
    :class:`~ditax.attention.config.AttentionConfig` (None: ``xla`` everywhere)."""

    name = "wan"

    def check(self, mesh_sizes=None) -> None:
        from ditax.models.wan.config import check_transformer

        check_transformer(self.model, self.attention, mesh_sizes)
        if self.vace:
            self.vace.check(self.model)
        if self.animate:
            self.animate.check(self.model)

    @classmethod
    def folder_config(cls, root) -> dict:
        """The architecture fields of the folder's ``transformer/config.json`` (Wan, VACE or
        Animate; the loader's own reading of it, so the values are those a load would build),
        as :class:`~ditax.models.wan.config.WanConfig` / ``WanAnimateConfig`` fields."""
        from dataclasses import fields

        from ditax.models.registry import spec
        from ditax.models.wan.animate import ANIMATE_CLASS, WanAnimateConfig
        from ditax.models.wan.config import WanConfig

        raw = cls.transformer_json(root, spec(cls.name).transformer_classes)
        if raw is None:
            return {}
        config = WanAnimateConfig if raw.get("_class_name") == ANIMATE_CLASS else WanConfig
        m = config.from_diffusers(raw)
        names = {f.name for f in fields(config)}
        # the diffusers fields (derived ones included) and those the file itself names (VACE's)
        keys = (set(m.to_diffusers()) | set(raw)) & names
        return {k: getattr(m, k) for k in sorted(keys)}

    @property
    def vace(self):
        """The VACE hooks (:mod:`ditax.models.wan.vace_family`) of a VACE config (non-empty
        ``model.vace_layers``), else None."""
        from ditax.models.wan import vace_family

        return vace_family if vace_family.is_vace(self.model) else None

    @property
    def animate(self):
        """The Animate hooks (:mod:`ditax.models.wan.animate_family`) of a Wan 2.2 Animate
        config (the ``wan2.2-animate-14b`` preset), else None."""
        from ditax.models.wan import animate_family

        return animate_family if animate_family.is_animate(self.model) else None

    @property
    def variant(self):
        """The hooks of the architecture variant (Animate, else VACE) that builds, shards and
        names this model's transformer, else None (plain Wan)."""
        return self.animate or self.vace

    latent_channels = property(lambda self: self.model.out_channels)    # C of the latents
    text_dim = property(lambda self: self.model.text_dim)               # Dt of the text

    @classmethod
    def latent_grid(cls, num_frames, height, width, vae: str = "wan2.1"):
        """Latent ``(F, Y, X)``; ``vae``: ``model.vae`` (the class-level default is the Wan
        2.1 VAE; a bound family uses its model's, see :meth:`latent_shape`)."""
        from ditax.models.vae.wan.config import vae_preset

        return cls._grid(vae_preset(vae), vae, num_frames, height, width)

    @classmethod
    def size_rule(cls, root=None, model=None):
        """Wan's (:func:`ditax.models.wan.sizes.size_rule`): the VAE's factors x the patch."""
        from ditax.models.wan.sizes import size_rule

        return size_rule(cls.name, root, model)

    @classmethod
    def folder_latent_grid(cls, root, num_frames, height, width):
        """:meth:`latent_grid` with the factors of the folder's VAE (Wan 2.2 TI2V's: 16x),
        the sizes on the folder's :meth:`size_rule`."""
        from ditax.models.wan.sizes import folder_vae

        cls.size_rule(root).check(height, width, None, error=ConfigError)
        cfg = folder_vae(root)
        if cfg is not None:
            return cls._grid(cfg, f"the folder's {cfg.spatial_factor}x", num_frames, height,
                             width)
        return cls.latent_grid(num_frames, height, width)

    @staticmethod
    def _grid(cfg, vae: str, num_frames, height, width):
        """The latent grid of VAE config ``cfg`` (named ``vae`` in the messages), checked."""
        tf, sf = cfg.temporal_factor, cfg.spatial_factor
        if num_frames < 1 or (num_frames - 1) % tf:
            raise ConfigError(f"{num_frames} frames: the Wan VAE takes {tf}k+1 frames; e.g. "
                              f"{max(1, num_frames - (num_frames - 1) % tf)}")
        if height % sf or width % sf:
            raise ConfigError(f"height x width = {height}x{width} must be multiples of {sf} "
                              f"({vae} VAE)")
        return cfg.latent_grid(num_frames, height, width)

    def latent_shape(self, num_frames, height, width):
        self.check_size(None, height, width)     # frames: the grid's, on the same rule
        return (self.latent_channels,
                *self.latent_grid(num_frames, height, width, self.model.vae))

    # -- image conditioning (Wan I2V / TI2V) -----------------------------------------------------

    def condition_shapes(self, latent_shape) -> dict:
        """Per-sample batch entries of an image condition: ``condition`` ``[tf + z, F, Y, X]``
        (mask and condition latents, Wan I2V) and ``image`` ``[S, image_dim]`` (CLIP features,
        Wan 2.1 I2V: S = 257, first-last-frame 514); none for T2V and TI2V (whose condition is
        the clip's own first latent frame). A VACE model: ``control`` ``[vace_in_channels, F,
        Y, X]``, the control context (:mod:`ditax.models.wan.vace_family`)."""
        from ditax.models.wan.conditioning import condition_shapes

        out = condition_shapes(self.model, latent_shape)
        if self.animate:    # pose latents and face crops
            out.update(self.animate.condition_shapes(self.model, latent_shape))
        if self.vace:       # the control context
            out.update(self.vace.condition_shapes(self.model, latent_shape))
        return out

    def training_inputs(self, x_t, x0, timestep, condition):
        from ditax.models.wan.conditioning import training_inputs

        return training_inputs(self.model, x_t, x0, timestep)

    def apply(self, module, latents, timestep, text, text_mask, condition=None):
        from ditax.models.wan.conditioning import model_input

        x, image = model_input(self.model, latents, condition)
        extra = {} if image is None else {"encoder_hidden_states_image": image}
        if self.vace:
            extra.update(self.vace.call_inputs(condition, x.dtype))
        if self.animate:
            extra.update(self.animate.call_inputs(condition, x.dtype))
        return module(x, timestep, text, text_mask, **extra)

    def apply_with_features(self, module, latents, timestep, text, text_mask, condition=None):
        """Plain Wan, I2V and TI2V (the protocol's call); a VACE or Animate model's call runs
        more than the blocks and is refused."""
        if self.variant is not None:
            raise ConfigError("distill.gan_weight > 0 reads the denoiser's block features, "
                              "which a VACE / Animate model's call extends; set "
                              "distill.gan_weight=0 for this model")
        return super().apply_with_features(module, latents, timestep, text, text_mask,
                                           condition)

    def trained_params(self, train):
        """A VACE model: its VACE branch by default (:func:`~ditax.models.wan.vace_family.
        trained`); every other model: everything (None)."""
        return self.vace.trained(self.model, train) if self.vace else None

    def tokens_per_sample(self, latent_shape) -> int:
        _, f, y, x = latent_shape
        pt, ph, pw = self.model.patch_size
        return (f // pt) * (y // ph) * (x // pw)

    def flops_per_sample(self, latent_shape, text_len: int) -> float:
        """Forward + backward = 3 × forward matmul FLOPs.

        Per block, with L video tokens, T text tokens, width D, MLP width M:
        self-attention 8·L·D² (q, k, v, o; vsa: + 2·L·D², its gate) + 4·L²·D·ρ (scores and
        values; ρ the density of ``attention.sparsity``'s block table, 1 dense; vsa: the
        top-k tiles' share plus its pooled pass); cross-attention
        4·L·D² + 4·T·D² + 4·L·T·D; MLP 4·L·D·M. Plus the patch embedding, text embedder
        (2·T·Dt·D + 2·T·D²) and output projection. Remat recomputation is not counted (MFU
        convention: useful FLOPs only).
        """
        m = self.model
        c = m.in_channels   # what the patch embedding reads (I2V: noise + mask + condition)
        pt, ph, pw = m.patch_size
        L = self.tokens_per_sample(latent_shape)
        T = text_len
        D, M = m.inner_dim, m.ffn_dim
        patch = c * pt * ph * pw
        _, f, y, x = latent_shape
        rho = attention_density(self.attention, (f // pt, y // ph, x // pw))
        gate = 2 * (getattr(self.attention, "sparsity", "") == "vsa")
        block = ((8 + gate) * L * D * D + 4 * L * L * D * rho + 4 * L * D * D + 4 * T * D * D
                 + 4 * L * T * D + 4 * L * D * M)
        fwd = (m.num_layers * block + 2 * L * patch * D + 2 * T * m.text_dim * D + 2 * T * D * D
               + 2 * L * D * m.out_channels * pt * ph * pw)
        if self.vace:
            fwd += self.vace.forward_flops(m, L, block)
        if self.animate:
            fwd += self.animate.forward_flops(m, latent_shape, L)
        return 3.0 * fwd

    # -- module ---------------------------------------------------------------------------------

    def create(self, mesh, rngs: nnx.Rngs):
        if self.variant:
            return self.variant.create(self.model, self.attention, mesh, rngs)
        from ditax.models.wan.transformer import WanTransformer

        return WanTransformer(self.model, self.attention, mesh, rngs=rngs)

    def param_shardings(self, params, mesh):
        if self.variant:
            return self.variant.param_shardings(params, self.model, mesh)
        from ditax.models.wan.build import param_shardings

        return param_shardings(params, self.model, mesh)

    def lora_table(self):
        """The weight table LoRA adapters are placed and named by (diffusers names)."""
        from ditax.models.wan.convert import weight_table

        return weight_table(self.model.num_layers, self.model.cross_attn_norm,
                            head_dim=self.model.attention_head_dim)

    def weight_table(self):
        """Every row of the architecture (image / position-embedding / VACE / Animate rows
        included)."""
        if self.variant:
            return self.variant.weight_table(self.model)
        from ditax.models.wan.convert import config_weight_table

        return config_weight_table(self.model, getattr(self.attention, "sparsity", "") == "vsa")

    # -- weights and encoders -------------------------------------------------------------------

    def weights_folder(self, path) -> pathlib.Path:
        from ditax.models.wan.loading import check_architecture

        return check_architecture(self.model, path)

    def load_params(self, folder, mesh) -> dict:
        from ditax.models.wan.loading import load_weights_into
        from ditax.models.wan.vace import vace_config

        cfg = vace_config(self.model) if self.vace else self.model   # its tables
        model = load_weights_into(self.abstract(mesh), folder, cfg, mesh)
        return nnx.to_pure_dict(nnx.split(model)[1])

    def kv_cache(self):
        from ditax.models.wan import kv_cache

        return kv_cache

    @classmethod
    def load_encoders(cls, folder, dtype: str = "float32") -> "WanEncoders":
        return WanEncoders(folder, dtype)

    # -- inference and trainers -----------------------------------------------------------------

    @classmethod
    def load_transformer(cls, path, **kwargs):
        """:func:`ditax.models.wan.loading.load_transformer` (folders and single files)."""
        from ditax.models.wan.loading import load_transformer

        return load_transformer(path, **kwargs)

    def random_transformer(self, mesh, seed: int = 0):
        if self.vace:
            from ditax.models.wan.vace_loaded import VaceTransformer

            return VaceTransformer(self.vace.init_model(self.model, self.attention, mesh, seed))
        from ditax.models.wan.build import init_model
        from ditax.models.wan.loading import Transformer

        return Transformer(init_model(self.model, self.attention, mesh, seed=seed))

    def random_inputs(self, batch: int, latent=None, text_len: int = 512, rng=None):
        """``ditax.Transformer``'s call: latents ``[B, C, F, Y, X]`` (default grid 5x32x32),
        timestep 500, text ``[B, T, text_dim]``."""
        import jax.numpy as jnp
        import numpy as np

        rng = np.random.default_rng(0) if rng is None else rng
        f, y, x = (5, 32, 32) if latent is None else latent
        dt = jnp.dtype(self.model.dtype)
        lat = jnp.asarray(rng.standard_normal((batch, self.model.in_channels, f, y, x)), dt)
        text = jnp.asarray(rng.standard_normal((batch, text_len, self.model.text_dim)), dt)
        return (lat, jnp.full((batch,), 500.0), text), {}

    @classmethod
    def check_folder(cls, path, subfolder="transformer") -> str:
        from ditax.models.wan.folder_check import check_folder

        s = check_folder(path, subfolder)
        return (f"{s.folder}: OK — {s.num_layers} layers, D={s.inner_dim}, {s.num_heads} heads "
                f"x {s.head_dim}, {s.num_params / 1e9:.3f} B params, {s.num_tensors} tensors")

    def check_single_file(self, path) -> str:
        from ditax.models.wan.single_file import check_single_file

        c, weights = check_single_file(path, self.model)[:2]
        return (f"{path}: OK — {c.num_layers} layers, D={c.inner_dim}, "
                f"{c.num_attention_heads} heads x {c.attention_head_dim}, {len(weights)} "
                f"tensors")

    def convert_single_file(self, path, out, *, dtype=None, loras=None):
        from ditax.models.wan.single_file import write_diffusers_folder

        return write_diffusers_folder(path, self.model, out, dtype=dtype, loras=loras)


class WanEncoders(Encoders):
    """A Wan pipeline folder's VAE (``vae/``), UMT5 (``text_encoder/``) and ``tokenizer/``;
    for a Wan I2V folder (``WanImageToVideoPipeline`` without ``expand_timesteps``) also its
    image condition (:meth:`encode_condition`; CLIP from ``image_encoder/`` for Wan 2.1); for
    a VACE folder (``WanVACEPipeline``) each clip's control context from its sidecars."""

    def __init__(self, folder, dtype: str = "float32"):
        from ditax.io.files import read_model_json
        from ditax.models.encoders.tokenizer import load_tokenizer
        from ditax.models.encoders.umt5 import load_text_encoder
        from ditax.models.vae.wan.convert import load_vae

        folder = pathlib.Path(folder)
        self.dtype = dtype
        self.vae = load_vae(folder / "vae" if (folder / "vae").is_dir() else folder, dtype=dtype)
        self.text_encoder = load_text_encoder(folder, dtype=dtype)
        self.tokenizer = load_tokenizer(folder)
        index = folder / "model_index.json"
        index = read_model_json(index, "model_index.json") if index.is_file() else {}
        from ditax.models.wan.conditioning import folder_kind

        from ditax.models.wan.vace_context import VACE_PIPELINE

        self.image_condition = folder_kind(index) == "i2v"
        self.vace = index.get("_class_name") == VACE_PIPELINE   # per clip: its control context
        self.sidecars = ("control", "mask", "references") if self.vace else ()
        self.image_encoder = self.image_processor = None
        if self.image_condition and (folder / "image_encoder").is_dir():
            from ditax.models.encoders.clip import load_image_encoder, load_image_processor

            self.image_encoder = load_image_encoder(folder / "image_encoder", dtype=dtype)
            self.image_processor = load_image_processor(folder / "image_processor")

    def encode_condition(self, video, **sidecars) -> dict:
        """The first-frame condition of one clip ``[3, F, H, W]`` in [-1, 1] (module
        :mod:`ditax.models.wan.conditioning`): ``condition`` ``[tf + z, F', Y, X]`` and, with a
        CLIP encoder, ``image`` ``[S, Di]`` — CLIP sees the first frame as the 8-bit RGB image
        a user would pass at inference. A VACE folder: ``control`` ``[2z + 64, n + F', Y, X]``
        from the ``sidecars`` (:func:`~ditax.models.wan.vace_context.clip_context`). Empty
        for folders without a condition."""
        import numpy as np
        import PIL.Image

        from ditax.models.wan.conditioning import channel_condition, clip_features

        if self.vace:   # the control context (sidecars: control / mask videos, references)
            from ditax.models.wan.vace_context import clip_context

            return {"control": clip_context(self.vae, np.asarray(video, np.float32),
                                            **sidecars)}
        if not self.image_condition:
            return {}
        video = np.asarray(video, np.float32)
        out = {"condition": channel_condition(self.vae, video[:, 0], None, video.shape[1])[0]}
        if self.image_encoder is not None:
            rgb = np.clip(np.round((video[:, 0].transpose(1, 2, 0) + 1.0) * 127.5), 0, 255)
            image = PIL.Image.fromarray(rgb.astype(np.uint8))
            out["image"] = clip_features(self.image_encoder, self.image_processor, [image])[0]
        return out

    def sample_latents(self, latents, condition: dict):
        """VACE: the reference images' latent frames first (:func:`~ditax.models.wan.
        vace_context.with_references`)."""
        if "control" not in condition:
            return latents
        from ditax.models.wan.vace_context import with_references

        return with_references(latents, condition["control"])

    def encode_video(self, video):
        """Posterior mean, normalised with the VAE's latents mean / std."""
        return self.vae.normalize_latents(self.vae.encode(jnp.asarray(video).astype(self.dtype)))

    def encode_text(self, captions, text_len: int) -> TextEncoding:
        """UMT5 embeddings padded to ``text_len`` (zeros past each prompt) and the token mask."""
        from ditax.models.encoders.umt5 import encode_prompt

        _, mask = self.tokenizer.encode(captions, text_len)
        return TextEncoding(encode_prompt(self.tokenizer, self.text_encoder, captions, text_len),
                            mask)
