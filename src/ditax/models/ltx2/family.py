"""LTX-2 as a :class:`~ditax.models.base.ModelFamily`: the transformer, its loader and
shardings, and the video stream's shapes and FLOPs (the latent grid of LTX-2's VAE: 8 frames
and 32 x 32 pixels per latent, the first frame alone).

What training would need beyond these (the audio stream's inputs in ``apply``, encoders for
``ditax preprocess``) is not declared: the family's spec lists what it has.
"""

from __future__ import annotations

import math

from flax import nnx

from ditax.errors import ConfigError
from ditax.models.base import ModelFamily

TIME_FACTOR = 8      # LTX-2's video VAE: pixel frames per latent frame (the first alone)
SPACE_FACTOR = 32    # and pixels per latent pixel
FPS = 24.0           # the frame rate the audio length is taken at (diffusers' default)


class LTX2Family(ModelFamily):
    """``model``: :class:`ditax.models.ltx2.config.LTX2Config`; ``attention``: an
    :class:`~ditax.attention.config.AttentionConfig` (None: ``xla``)."""

    name = "ltx2"
    default_frames = 121    # diffusers' LTX-2 pipeline default (5 s at 24 fps)

    def check(self, mesh_sizes=None) -> None:
        from ditax.models.ltx2.config import check_transformer

        check_transformer(self.model, self.attention, mesh_sizes)

    @classmethod
    def folder_config(cls, root) -> dict:
        """The architecture fields of the folder's ``transformer/config.json``."""
        from ditax.models.ltx2.config import LTX2Config
        from ditax.models.registry import spec

        raw = cls.transformer_json(root, spec(cls.name).transformer_classes)
        if raw is None:
            return {}
        m = LTX2Config.from_diffusers(raw)
        return {k: getattr(m, k) for k in m.to_diffusers() if k != "_class_name"}

    @property
    def patch(self) -> tuple[int, int, int]:
        m = self.model
        return m.patch_size_t, m.patch_size, m.patch_size

    @property
    def latent_channels(self) -> int:
        """The video VAE's latent channels: one token packs ``pt x p x p`` latent pixels."""
        return self.model.in_channels // math.prod(self.patch)

    text_dim = property(lambda self: self.model.text_dim)   # Dt of encoder_hidden_states

    @classmethod
    def latent_grid(cls, num_frames, height, width):
        """Latent ``(F, Y, X)`` of a video: ``F = (num_frames - 1) / 8 + 1`` (the first frame
        is its own latent frame), ``Y, X = height / 32, width / 32``."""
        if num_frames < 1 or (num_frames - 1) % TIME_FACTOR:
            raise ConfigError(f"{num_frames} frames: LTX-2's VAE takes 8·k + 1 frames (e.g. "
                              f"{max(1, (num_frames - 1) // TIME_FACTOR * TIME_FACTOR + 1)} or "
                              f"{((num_frames - 1) // TIME_FACTOR + 1) * TIME_FACTOR + 1})")
        if height < SPACE_FACTOR or width < SPACE_FACTOR or height % SPACE_FACTOR or (
                width % SPACE_FACTOR):
            raise ConfigError(f"height x width = {height}x{width} must be multiples of "
                              f"{SPACE_FACTOR} (LTX-2's VAE)")
        return (num_frames - 1) // TIME_FACTOR + 1, height // SPACE_FACTOR, width // SPACE_FACTOR

    def tokens_per_sample(self, latent_shape) -> int:
        _, f, y, x = latent_shape
        pt, p, _ = self.patch
        return math.ceil(f / pt) * math.ceil(y / p) * math.ceil(x / p)

    def audio_tokens(self, latent_shape) -> int:
        """Audio tokens of the video's duration at :data:`FPS` (diffusers' pipeline:
        ``round(frames / fps · sampling_rate / hop / audio_scale_factor)``)."""
        m = self.model
        frames = (latent_shape[1] - 1) * TIME_FACTOR + 1
        return math.ceil(round(frames / FPS * m.audio_latents_per_second)
                         / m.audio_patch_size_t)

    def _forward_flops(self, latent_shape, text_len: int) -> float:
        """Forward matmul FLOPs of one sample: with L video and La audio tokens, T text tokens
        per stream, widths D and Da, per block: the streams' q / k / v / out projections
        (self: 8·L·D² + 8·La·Da²; text: 4·L·D² + 4·T·Dt_v·D and likewise for audio), the
        a↔v projections (q and out on their side, k / v on the other: 4·L·D·Da + 4·La·Da² +
        4·La·Da² + 4·L·D·Da), attention (4·L²·D + 4·La²·Da + 4·L·T·D + 4·La·T·Da +
        8·L·La·Da), the feed-forwards (16·L·D² + 16·La·Da²); besides the blocks the input and
        output projections and the per-sample timestep MLPs."""
        m = self.model
        L, La, T = self.tokens_per_sample(latent_shape), self.audio_tokens(latent_shape), text_len
        D, Da = m.inner_dim, m.audio_inner_dim
        kv_v, kv_a = m.cross_attention_dim, m.audio_cross_attention_dim
        block = (8 * L * D * D + 8 * La * Da * Da
                 + 4 * L * D * D + 4 * T * kv_v * D + 4 * La * Da * Da + 4 * T * kv_a * Da
                 + 8 * L * D * Da + 8 * La * Da * Da
                 + 4 * L * L * D + 4 * La * La * Da + 4 * L * T * D + 4 * La * T * Da
                 + 8 * L * La * Da
                 + 16 * L * D * D + 16 * La * Da * Da)
        rest = (2 * L * m.in_channels * D + 2 * La * m.audio_in_channels * Da
                + 2 * L * D * m.video_out_channels + 2 * La * Da * m.audio_output_channels
                + 2 * (256 * D + D * D) * 4 + 2 * D * D * (m.video_mod_params + 5)
                + 2 * (256 * Da + Da * Da) * 4 + 2 * Da * Da * (m.audio_mod_params + 5))
        if m.use_prompt_embeddings:
            rest += 2 * T * m.caption_channels * (D + Da) + 2 * T * (D * D + Da * Da)
        return float(m.num_layers * block + rest)

    def flops_per_sample(self, latent_shape, text_len: int) -> float:
        """Forward + backward = 3 x forward matmul FLOPs (:meth:`_forward_flops`)."""
        return 3.0 * self._forward_flops(latent_shape, text_len)

    # -- module ---------------------------------------------------------------------------------

    def create(self, mesh, rngs: nnx.Rngs):
        from ditax.models.ltx2.transformer import LTX2Transformer

        return LTX2Transformer(self.model, self.attention, mesh, rngs=rngs)

    def param_shardings(self, params, mesh):
        from ditax.models.ltx2.build import param_shardings

        return param_shardings(params, self.model, mesh)

    def apply(self, module, latents, timestep, text, text_mask, condition=None):
        """Not yet: the denoiser call of training needs the audio stream's latents and text,
        which no training input carries so far; refused in one line."""
        raise ConfigError("model.family=ltx2: ditax does not train LTX-2 yet (its training "
                          "inputs would need the audio latents and text); use the "
                          "transformer for inference (ditax.load_transformer)")

    # -- inference ------------------------------------------------------------------------------

    @classmethod
    def load_transformer(cls, path, **kwargs):
        """:func:`ditax.models.ltx2.loading.load_transformer` (diffusers folders)."""
        from ditax.models.ltx2.loading import load_transformer

        return load_transformer(path, **kwargs)

    @classmethod
    def check_folder(cls, path, subfolder="transformer") -> str:
        from ditax.models.ltx2.loading import check_folder

        return check_folder(path, subfolder)
