"""FLUX.2 as a :class:`~ditax.models.base.ModelFamily`: the transformer, its loader and
shardings, and training (:mod:`ditax.models.flux2.training`: the packed denoiser call with the
4-axis position ids and, for FLUX.2-dev, the guidance input).

Latents are the transformer's own grid: the VAE's latents patchified 2 x 2 and normalised
(``C = in_channels = 128``, one token per latent pixel), so one image of ``H x W`` pixels is
``[C, 1, H/16, W/16]`` (the FLUX.2 VAE's 8x, times the 2x2 patchify).
"""

from __future__ import annotations

from flax import nnx

from ditax.errors import ConfigError
from ditax.models.base import ModelFamily

VAE_FACTOR = 8    # AutoencoderKLFlux2: spatial downsampling
PATCH = 2         # 2 x 2 latent pixels are one token (in_channels = 4 x the VAE's 32)


class Flux2Family(ModelFamily):
    """``model``: :class:`ditax.models.flux2.config.Flux2Config`; ``attention``: an
    :class:`~ditax.attention.config.AttentionConfig` (None: ``xla``)."""

    name = "flux2"
    default_frames = 1    # still images

    def check(self, mesh_sizes=None) -> None:
        from ditax.models.flux2.config import check_transformer

        check_transformer(self.model, self.attention, mesh_sizes)

    @classmethod
    def folder_config(cls, root) -> dict:
        """The architecture fields of the folder's ``transformer/config.json``, as
        :class:`~ditax.models.flux2.config.Flux2Config` fields."""
        from ditax.models.flux2.config import Flux2Config
        from ditax.models.registry import spec

        raw = cls.transformer_json(root, spec(cls.name).transformer_classes)
        if raw is None:
            return {}
        m = Flux2Config.from_diffusers(raw)
        return {k: getattr(m, k) for k in m.to_diffusers() if k != "_class_name"}

    @property
    def latent_channels(self) -> int:
        """The patchified latent channels the transformer reads per token (``in_channels``)."""
        return self.model.in_channels

    text_dim = property(lambda self: self.model.joint_attention_dim)

    @classmethod
    def latent_grid(cls, num_frames, height, width, vae=None):
        """Latent ``(1, Y, X)`` of one image: ``H/(2s) x W/(2s)`` for a VAE of factor ``s``
        (``vae``: its ``config.json`` dict, ``2 ** (len(block_out_channels) - 1)``; None:
        FLUX.2's 8) and the 2x2 patchify."""
        s = VAE_FACTOR
        if vae is not None:
            widths = vae.get("block_out_channels")
            if not widths:
                raise ConfigError(f"the VAE config has no block_out_channels ({vae!r}); give "
                                  f"the folder's vae/config.json")
            s = 2 ** (len(widths) - 1)
        f = s * PATCH
        if num_frames != 1:
            raise ConfigError(f"{num_frames} frames: FLUX.2 makes still images; use 1 frame")
        if height < f or width < f or height % f or width % f:
            raise ConfigError(f"height x width = {height}x{width} must be multiples of {f} "
                              f"(the VAE's {s}x and the 2x2 patchify)")
        return 1, height // f, width // f

    @classmethod
    def size_rule(cls, root=None, model=None):
        """Sides: multiples of the VAE's factor (``root/vae/config.json``'s, FLUX.2's 8 when
        the folder has none) x the 2x2 patchify; still images (one frame). The latents are
        patchified already: their grid takes any size."""
        from ditax.io.files import folder_vae_json
        from ditax.models.size_rule import SizeRule

        vae = folder_vae_json(root)
        s = 2 ** (len(vae["block_out_channels"]) - 1) if isinstance(vae, dict) and \
            vae.get("block_out_channels") else VAE_FACTOR
        return SizeRule(cls.name, s * PATCH, None,
                        f"the VAE's {s}x and the {PATCH}x{PATCH} patchify")

    @classmethod
    def folder_latent_grid(cls, root, num_frames, height, width):
        """:meth:`latent_grid` with the factor of ``root/vae/config.json`` (FLUX.2's 8 when the
        folder has none, e.g. a hub id), the sizes on the folder's :meth:`size_rule`."""
        from ditax.io.files import folder_vae_json

        cls.size_rule(root).check(height, width, None, error=ConfigError)
        return cls.latent_grid(num_frames, height, width, folder_vae_json(root))

    def tokens_per_sample(self, latent_shape) -> int:
        _, _, y, x = latent_shape
        return y * x

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

    def flops_per_sample(self, latent_shape, text_len: int) -> float:
        """Forward + backward = 3 × forward matmul FLOPs (:meth:`_forward_flops`)."""
        f = self._forward_flops(latent_shape, text_len)
        return 3.0 * (sum(f["double"].values()) + sum(f["single"].values()) + f["rest"])

    def recompute_flops_per_sample(self, latent_shape, text_len: int) -> float:
        """The forward FLOPs ``model.remat`` runs again in the backward, per sample (``full``:
        all the blocks'; ``save_proj``: the single blocks' fused input and attention, the
        double blocks' attention; ``save_attn_out``: all but the attention; ``save_dots*``:
        the attention kernels)."""
        f = self._forward_flops(latent_shape, text_len)
        remat = self.model.remat
        if remat == "save_proj":
            return float(f["double"]["attn"] + f["single"]["qkv"] + f["single"]["attn"])
        parts = {"none": (), "save_dots": ("attn",), "save_dots_no_batch": ("attn",),
                 "save_attn_out": ("qkv", "mlp_in", "proj_out"),
                 "full": ("qkv", "attn", "mlp_in", "proj_out")}[remat]
        return float(sum(v for s in ("double", "single") for k, v in f[s].items()
                         if k in parts))

    # -- module ---------------------------------------------------------------------------------

    def create(self, mesh, rngs: nnx.Rngs):
        from ditax.models.flux2.transformer import Flux2Transformer

        return Flux2Transformer(self.model, self.attention, mesh, rngs=rngs)

    def param_shardings(self, params, mesh):
        from ditax.models.flux2.build import param_shardings

        return param_shardings(params, self.model, mesh)

    # -- training -------------------------------------------------------------------------------

    def check_flow(self) -> None:
        """``flow.guidance`` needs a guidance embedding (FLUX.2-dev, not klein);
        ``flow.dynamic_shift`` (a size-dependent shift) is not FLUX.2's: refused."""
        f = self.flow
        if f is None:
            return
        if f.guidance is not None and not self.model.guidance_embeds:
            raise ConfigError(f"flow.guidance={f.guidance}: this FLUX.2 model has no guidance "
                              f"embedding (model.guidance_embeds=false, FLUX.2-klein); remove "
                              f"flow.guidance")
        if f.dynamic_shift:
            raise ConfigError("flow.dynamic_shift=true: ditax has no FLUX.2 size-dependent "
                              "shift for training; set flow.dynamic_shift=false (and "
                              "flow.shift=S for a fixed shift)")

    @property
    def guidance(self) -> float | None:
        """The guidance input while training: ``flow.guidance`` or 3.5 for a model with a
        guidance embedding (FLUX.2-dev), None without (klein)."""
        if not self.model.guidance_embeds:
            return None
        from ditax.models.flux2.training import DEFAULT_GUIDANCE

        given = None if self.flow is None else self.flow.guidance
        return DEFAULT_GUIDANCE if given is None else float(given)

    def apply(self, module, latents, timestep, text, text_mask, condition=None):
        """:func:`ditax.models.flux2.training.denoise` (every text token attended, as the
        pipelines sample: ``text_mask`` is not used)."""
        from ditax.models.flux2.training import denoise

        return denoise(module, latents, timestep, text, self.guidance)

    @classmethod
    def load_encoders(cls, folder, dtype: str = "float32"):
        """The VAE and text encoder of a FLUX.2 pipeline folder
        (:class:`ditax.models.flux2.training_encoders.Flux2Encoders`)."""
        from ditax.models.flux2.training_encoders import Flux2Encoders

        return Flux2Encoders(folder, dtype)

    # -- weights and inference ------------------------------------------------------------------

    def weights_folder(self, path):
        from ditax.models.flux2.loading import check_architecture

        return check_architecture(self.model, path)

    def load_params(self, folder, mesh) -> dict:
        from ditax.models.flux2.loading import load_weights_into

        model = load_weights_into(self.abstract(mesh), folder, self.model, mesh)
        return nnx.to_pure_dict(nnx.split(model)[1])

    @classmethod
    def load_transformer(cls, path, **kwargs):
        """:func:`ditax.models.flux2.loading.load_transformer` (diffusers folders); one
        ``.safetensors`` file with ``config=`` (BFL's names or diffusers'):
        :func:`ditax.models.flux2.single_file.load_transformer`."""
        from ditax.io.weights import is_single_file

        if is_single_file(path):
            from ditax.models.flux2.single_file import load_transformer
        else:
            from ditax.models.flux2.loading import load_transformer
        return load_transformer(path, **kwargs)

    def random_transformer(self, mesh, seed: int = 0):
        from ditax.models.flux2.build import init_model
        from ditax.models.flux2.loading import Flux2TransformerModel

        return Flux2TransformerModel(init_model(self.model, self.attention, mesh, seed=seed))

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

    @classmethod
    def check_folder(cls, path, subfolder="transformer") -> str:
        from ditax.models.flux2.loading import check_folder

        return check_folder(path, subfolder)

    # -- single files and LoRA names (models/flux2/single_file.py, lora_names.py) -----------

    def check_single_file(self, path) -> str:
        from ditax.models.flux2.single_file import check_single_file

        return check_single_file(path, self.model)

    def convert_single_file(self, path, out, *, dtype=None, loras=None):
        from ditax.models.flux2.single_file import write_diffusers_folder

        return write_diffusers_folder(path, self.model, out, dtype=dtype, loras=loras)

    def lora_table(self):
        from ditax.models.flux2.convert import weight_table

        return weight_table(self.model)
