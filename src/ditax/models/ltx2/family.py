"""LTX-2 as a :class:`~ditax.models.base.ModelFamily`: the transformer, its loader and
shardings, the shapes and FLOPs of both streams (the latent grid of LTX-2's VAE: 8 frames and
32 x 32 pixels per latent, the first frame alone; the audio tokens of the video's length at
24 fps), and training (:mod:`ditax.models.ltx2.training`): flow matching on the video and
audio latents at one noise level — the audio latents a condition entry the loss noises too
(``noised_entries``), the video and audio text one text entry side by side — with the
encoders ``ditax preprocess`` runs (:mod:`ditax.models.ltx2.training_encoders`) and LoRA
(:mod:`ditax.models.ltx2.lora_names`).
"""

from __future__ import annotations

import math

from ditax.errors import ConfigError
from ditax.models.common.family import FamilyParts, PartsFamily
from ditax.models.ltx2.training import FPS   # the frame rate of the audio length (24)

TIME_FACTOR = 8      # LTX-2's video VAE: pixel frames per latent frame (the first alone)
SPACE_FACTOR = 32    # and pixels per latent pixel


_M, _T = "ditax.models.ltx2", "ditax.models.ltx2.transformer"


class LTX2Family(PartsFamily):
    """``model``: :class:`ditax.models.ltx2.config.LTX2Config`; ``attention``: an
    :class:`~ditax.attention.config.AttentionConfig` (None: ``xla``)."""

    name = "ltx2"
    default_frames = 121    # diffusers' LTX-2 pipeline default (5 s at 24 fps)
    parts = FamilyParts(
        check=f"{_M}.config:check_transformer", module=f"{_T}.model:LTX2Transformer",
        build=f"{_T}.build", loader=f"{_T}.loading:LOADER", load=f"{_T}.loading:load_transformer",
        folder_summary=f"{_T}.loading:folder_summary",
        single_file_check=f"{_T}.single_file:summary",          # Lightricks' original files
        single_file_write=f"{_T}.single_file:write_diffusers_folder",
        weight_table=f"{_T}.convert:weight_table",
        encoders=f"{_M}.training_encoders:LTX2Encoders")

    @property
    def patch(self) -> tuple[int, int, int]:
        m = self.model
        return m.patch_size_t, m.patch_size, m.patch_size

    @property
    def latent_channels(self) -> int:
        """The video VAE's latent channels: one token packs ``pt x p x p`` latent pixels."""
        return self.model.in_channels // math.prod(self.patch)

    @property
    def text_dim(self) -> int:
        """``Dt`` of a training sample's text: the video text and the audio text side by side
        (``Dv + Da``; :mod:`ditax.models.ltx2.training`)."""
        return self.model.text_dim + self.model.audio_text_dim

    @classmethod
    def latent_grid(cls, num_frames, height, width):
        """Latent ``(F, Y, X)`` of a video: ``F = (num_frames - 1) / 8 + 1`` (the first frame
        is its own latent frame), ``Y, X = height / 32, width / 32``."""
        return _grid(num_frames, height, width, TIME_FACTOR, SPACE_FACTOR)

    @classmethod
    def _folder_factors(cls, root):
        """``(temporal, spatial)`` of ``root/vae/config.json`` (None: no such file)."""
        import pathlib

        f = pathlib.Path(root) / "vae" / "config.json" if root is not None else None
        if f is None or not f.is_file():
            return None
        from ditax.io.files import read_model_json
        from ditax.models.vae.ltx2.config import LTX2VideoVAEConfig

        vae = LTX2VideoVAEConfig.from_diffusers(read_model_json(f, "VAE config"))
        return vae.temporal_factor, vae.spatial_factor

    @classmethod
    def size_rule(cls, root=None, model=None):
        """Sides: multiples of the video VAE's spatial factor (the folder's, else
        ``model.vae_scale_factors``, else 32) x the patch (1); frames: ``8k+1`` (its temporal
        factor x the time patch, the first frame alone)."""
        from ditax.models.size_rule import SizeRule

        t, s = cls._folder_factors(root) or (
            tuple(model.vae_scale_factors[:2]) if model is not None else
            (TIME_FACTOR, SPACE_FACTOR))
        pt, p = (getattr(model, "patch_size_t", 1), getattr(model, "patch_size", 1))
        return SizeRule(cls.name, s * p, t * pt, f"the VAE's {s}x and the {p}x{p} patch",
                        f"the VAE's {t}x in time, the first frame alone", latent=(pt, p, p))

    @classmethod
    def folder_latent_grid(cls, root, num_frames, height, width):
        """:meth:`latent_grid` with the factors of ``root/vae/config.json`` (LTX-2's when the
        folder has none, e.g. a hub id), the sizes on the folder's :meth:`size_rule`."""
        cls.size_rule(root).check(height, width, None, error=ConfigError)
        t, s = cls._folder_factors(root) or (TIME_FACTOR, SPACE_FACTOR)
        return _grid(num_frames, height, width, t, s)

    def latent_shape(self, num_frames, height, width):
        """Latent ``[C, F, Y, X]`` of one video on the grid of the model's
        ``vae_scale_factors`` (LTX-2's 8 / 32 / 32)."""
        self.check_size(None, height, width)     # frames: the grid's, on the same rule
        t, y, _ = self.model.vae_scale_factors
        return (self.latent_channels,) + _grid(num_frames, height, width, t, y)

    def video_tokens(self, latent_shape) -> int:
        """Video tokens ``L`` of latents ``[C, F, Y, X]``."""
        _, f, y, x = latent_shape
        pt, p, _ = self.patch
        return math.ceil(f / pt) * math.ceil(y / p) * math.ceil(x / p)

    def tokens_per_sample(self, latent_shape) -> int:
        """Both streams' tokens: video ``L`` and audio ``La``."""
        return self.video_tokens(latent_shape) + self.audio_tokens(latent_shape)

    def audio_tokens(self, latent_shape) -> int:
        """Audio tokens of the video's duration at :data:`FPS` (diffusers' pipeline:
        ``round(frames / fps · sampling_rate / hop / audio_scale_factor)``, the pixel frames
        from the latent frames by the model's ``vae_scale_factors``)."""
        m = self.model
        frames = (latent_shape[1] - 1) * m.vae_scale_factors[0] + 1
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
        L, La, T = (self.video_tokens(latent_shape), self.audio_tokens(latent_shape),
                    text_len)
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

    # -- training -------------------------------------------------------------------------------

    def check_flow(self) -> None:
        """Each stream's output must be its input's width and the audio unpatched
        (:func:`~ditax.models.ltx2.training.check_training`); ``flow.dynamic_shift`` (the
        LTX-2 trainer's shift of the video token count) replaces ``flow.shift``, so not both;
        no guidance is embedded."""
        from ditax.models.ltx2.training import check_training

        check_training(self.model)
        f = self.flow
        if f is None:
            return
        if f.guidance is not None:
            raise ConfigError(f"flow.guidance={f.guidance}: LTX-2 embeds no guidance scale; "
                              f"remove flow.guidance")
        self.check_dynamic_shift(f, "the video token count")

    def training_flow(self, latent_shape):
        """``flow.dynamic_shift``: the flow with ``shift = e^mu`` of the video token count
        (:func:`ditax.models.ltx2.training.resolution_shift`)."""
        return self.dynamic_flow(self.video_tokens(latent_shape),
                                 "ditax.models.ltx2.training:resolution_shift")

    def condition_shapes(self, latent_shape) -> dict:
        """Each sample's packed, normalised audio latents ``audio_latents [La, Ca]`` (the
        video's length at :data:`FPS`), stored by ``ditax preprocess``."""
        from ditax.models.ltx2.training import AUDIO

        return {AUDIO: (self.audio_tokens(latent_shape), self.model.audio_in_channels)}

    def noised_entries(self) -> tuple[str, ...]:
        """The audio latents: denoised with the video at the same noise level."""
        from ditax.models.ltx2.training import AUDIO

        return (AUDIO,)

    def few_step_sample(self, steps: int, sigmas: list, shift: float | None) -> dict:
        """LTX-2's pipeline (Euler already, its shift the video token count's): the student's
        steps and sigmas, and every guidance of the pipeline off — CFG on both streams,
        spatio-temporal and modality guidance (each an extra forward the student was not
        trained with); a fixed ``shift`` as ``flow_shift``."""
        out = {"num_inference_steps": steps, "sigmas": list(sigmas), "guidance_scale": 1.0,
               "audio_guidance_scale": 1.0, "stg_scale": 0.0, "audio_stg_scale": 0.0,
               "modality_scale": 1.0, "audio_modality_scale": 1.0}
        if shift is not None:
            out["flow_shift"] = float(shift)
        return out

    first_frame_training = True

    def first_frame_inputs(self, x_t, x0, timestep, mask, key, p: float):
        """The LTX-2 trainer's first-frame conditioning
        (:func:`ditax.models.ltx2.training.first_frame_inputs`)."""
        from ditax.models.ltx2.training import first_frame_inputs

        _, _, y, x = x0.shape[1:]
        pt, ps, _ = self.patch
        return first_frame_inputs(x_t, x0, timestep, mask, key, p, pt,
                                  (y // ps) * (x // ps))

    def apply(self, module, latents, timestep, text, text_mask, condition=None):
        """``(video prediction, {"audio_latents": audio prediction})`` of the noisy video
        latents and the noisy audio latents of ``condition``
        (:func:`ditax.models.ltx2.training.denoise`)."""
        from ditax.models.ltx2.training import AUDIO, denoise

        if not condition or AUDIO not in condition:
            raise ConfigError(f"LTX-2 denoises its video and audio latents together; the batch "
                              f"has no {AUDIO} entry (preprocess the clips with an LTX-2 "
                              f"pipeline folder)")
        video, audio = denoise(module, latents, timestep, text, text_mask, condition[AUDIO])
        return video, {AUDIO: audio}

    # -- bench ----------------------------------------------------------------------------------

    def random_inputs(self, batch: int, latent=None, text_len: int = 512, rng=None):
        """diffusers' ``LTX2VideoTransformer3DModel`` call: packed video tokens ``[B, L, C]``
        of latent grid ``latent = (F, Y, X)`` (default 4 x 16 x 16: 25 frames at 512 x 512),
        the audio tokens of the same duration ``[B, La, Ca]``, the video and audio text
        ``[B, T, Dt]`` / ``[B, T, Dta]``, timestep 500, and the latent sizes (24 fps)."""
        import jax.numpy as jnp
        import numpy as np

        rng = np.random.default_rng(0) if rng is None else rng
        f, y, x = (4, 16, 16) if latent is None else latent
        if min(f, y, x) < 1:
            raise ConfigError(f"--latent {f},{y},{x}: an LTX-2 latent grid has at least one "
                              f"frame, row and column; e.g. --latent 4,16,16")
        m = self.model
        shape = (self.latent_channels, f, y, x)
        la = self.audio_tokens(shape)
        dt = jnp.dtype(m.dtype)
        rand = lambda *s: jnp.asarray(rng.standard_normal(s), dt)  # noqa: E731
        args = (rand(batch, self.video_tokens(shape), m.in_channels),
                rand(batch, la, m.audio_in_channels), rand(batch, text_len, m.text_dim),
                rand(batch, text_len, m.audio_text_dim), jnp.full((batch,), 500.0))
        return args, dict(num_frames=f, height=y, width=x, fps=float(FPS),
                          audio_num_frames=la * m.audio_patch_size_t)


def _grid(num_frames: int, height: int, width: int, t: int, s: int) -> tuple[int, int, int]:
    """Latent ``(F, Y, X)`` of a video on a VAE grid of ``t`` frames and ``s`` pixels per latent
    (the first frame alone); :class:`ConfigError` naming sizes off the grid."""
    if num_frames < 1 or (num_frames - 1) % t:
        raise ConfigError(f"{num_frames} frames: LTX-2's VAE takes {t}·k + 1 frames (e.g. "
                          f"{max(1, (num_frames - 1) // t * t + 1)} or "
                          f"{((num_frames - 1) // t + 1) * t + 1})")
    if height < s or width < s or height % s or width % s:
        raise ConfigError(f"height x width = {height}x{width} must be multiples of {s} "
                          f"(LTX-2's VAE)")
    return (num_frames - 1) // t + 1, height // s, width // s
