"""What ``ditax preprocess`` stores for LTX-2: the video latents, the sound track's latents and
the caption's two texts, each in the space the pipeline samples in.

Per clip ``[3, F, H, W]`` in [-1, 1] (its first ``F`` frames, read at the file's own rate):

- **video**: the video VAE's posterior mean, normalised ``(z - mean) · scaling_factor / std``
  per channel (what diffusers' ``LTX2Pipeline`` does to given latents), ``[C, F', Y, X]``;
- **audio** (``audio_latents``): the clip's sound track over the frames' span
  (``F / fps`` seconds from the start; a shorter track padded with silence, as the LTX-2
  trainer pads it), resampled by ffmpeg to the audio VAE's rate, mono doubled to the VAE's
  two channels (the trainer's rule; stereo averaged for a one-channel VAE), its log-mel
  (:func:`~ditax.models.ltx2.audio.mel.log_mel_for_vae`, the trainer's transform), the audio
  VAE's posterior mean, packed into tokens ``[A, C·M']`` and normalised as the pipeline does
  (:func:`~ditax.models.ltx2.audio.latents.pack_audio_latents`, the VAE's
  ``normalize_latents``), cut to the pipeline's count for the clip,
  ``A = round(F / 24 · rate / hop / 4)`` (the encoder's causal frames run a little past it);
- **text**: the caption through Gemma-3 and the connectors
  (:func:`~ditax.models.ltx2.text.encoder.encode_ltx2_prompt`): video text ``[T, Dv]`` and
  audio text ``[T, Da]`` stored side by side ``[T, Dv + Da]`` with their one mask ``[T]``.

A clip without a sound track (a still image included) is left out with one line
(:class:`~ditax.models.base.SkipClip`) rather than trained on silence: a clip whose sound was
stripped would teach the model silence for its caption. So is a clip whose frame rate gives
its frames another audio length than 24 fps does (LTX-2's training and sampling rate; 23.976
fps passes for the usual lengths): its positions would not match its sound.
"""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np

from ditax.errors import ConfigError
from ditax.models.base import Encoders, SkipClip, TextEncoding
from ditax.models.ltx2.training import AUDIO, FPS


def clip_fps(path) -> float | None:
    """The frame rate ffmpeg reports for the video file ``path`` (None: none reported)."""
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(str(path))
    try:
        fps = next(gen).get("fps")
    finally:
        gen.close()
    return float(fps) if fps else None


class LTX2Encoders(Encoders):
    """An ``LTX2Pipeline`` folder's video VAE (``vae/``), audio VAE (``audio_vae/``) and text
    path (``tokenizer/``, ``text_encoder/``, ``connectors/``), as the pipeline loads them
    (module docstring)."""

    reads_clip = True

    def __init__(self, folder, dtype: str = "float32"):
        from ditax.models.ltx2.audio.convert import load_audio_vae
        from ditax.models.ltx2.text.encoder import load_ltx2_text
        from ditax.models.vae.ltx2 import load_ltx2_video_vae

        folder = pathlib.Path(folder)
        self.dtype = dtype
        self.vae = load_ltx2_video_vae(folder, dtype)
        self.audio_vae = load_audio_vae(folder, dtype)
        self.text = load_ltx2_text(folder, dtype)
        _check_fit(folder, self.vae, self.audio_vae)

    def encode_video(self, video):
        """``[B, 3, F, H, W]`` in [-1, 1] → normalised posterior mean ``[B, C, F', Y, X]``
        float32."""
        z = self.vae.encode(jnp.asarray(video, self.vae.dtype))
        return self.vae.normalize_latents(jnp.asarray(z, jnp.float32))

    def encode_text(self, captions, text_len: int) -> TextEncoding:
        """Video and audio text side by side ``[B, text_len, Dv + Da]`` and their mask."""
        from ditax.models.ltx2.text.encoder import encode_ltx2_prompt

        video, audio, mask = encode_ltx2_prompt(self.text, list(captions), text_len)
        both = jnp.concatenate([jnp.asarray(video, jnp.float32),
                                jnp.asarray(audio, jnp.float32)], axis=-1)
        return TextEncoding(both, np.asarray(mask))

    def audio_frames(self, frames: int, fps: float = FPS) -> int:
        """The pipeline's audio latent frames of ``frames`` video frames at ``fps``."""
        from ditax.models.ltx2.audio.latents import audio_latent_frames

        a = self.audio_vae
        return audio_latent_frames(frames, fps, a.sample_rate, a.hop_length,
                                   a.config.temporal_factor)

    def encode_condition(self, video, clip=None, **sidecars) -> dict:
        """``{"audio_latents": [A, C·M']}`` of the clip's sound track (module docstring);
        :class:`SkipClip` for a clip without one or at another frame rate."""
        from ditax.io.audio import read_audio

        frames = int(video.shape[1])
        name = pathlib.Path(clip).name
        fps = clip_fps(clip) if frames > 1 else None
        if fps is None:
            raise SkipClip("no frame rate (a still image): LTX-2 trains video with its "
                           "sound track")
        want = self.audio_frames(frames)
        if self.audio_frames(frames, fps) != want:
            raise SkipClip(f"{fps:g} fps: its {frames} frames last {frames / fps:.3f} s, "
                           f"{frames / FPS:.3f} s at the {FPS:g} fps LTX-2 trains at; "
                           f"re-encode it at 24 fps (ffmpeg -i {name} -r 24 OUT.mp4)")
        track = read_audio(clip, sample_rate=self.audio_vae.sample_rate)
        if track is None:
            raise SkipClip("no sound track (LTX-2 trains the video and its sound together; "
                           "a clip without one is left out, not trained as silence)")
        return {AUDIO: np.asarray(self.encode_sound(track.samples, frames / fps, want)[0])}

    def encode_sound(self, waveform, seconds: float, frames: int):
        """Waveform ``[c, N]`` at the audio VAE's rate → normalised audio tokens
        ``[1, frames, C·M']`` of its first ``seconds`` (padded with silence)."""
        from ditax.models.ltx2.audio.latents import pack_audio_latents
        from ditax.models.ltx2.audio.mel import log_mel_for_vae

        a = self.audio_vae
        wave = np.asarray(waveform, np.float32)
        channels = a.config.in_channels
        if wave.shape[0] != channels:
            wave = (np.repeat(wave[:1], channels, 0) if wave.shape[0] == 1
                    else wave.mean(0, keepdims=True) if channels == 1 else wave[:channels])
        n = int(seconds * a.sample_rate)
        wave = np.pad(wave[:, :n], ((0, 0), (0, max(0, n - wave.shape[1]))))
        mel = log_mel_for_vae(wave[None], a.config)
        z = a.encode(mel.astype(a.dtype)).astype(jnp.float32)          # [1, C, A', M']
        if z.shape[2] < frames:
            raise ValueError(f"the audio VAE gave {z.shape[2]} latent frames for "
                             f"{seconds:.3f} s, fewer than the pipeline's {frames}")
        return a.normalize_latents(pack_audio_latents(z[:, :, :frames]))


def _check_fit(folder, vae, audio_vae) -> None:
    """The folder's transformer takes what its VAEs give: latent widths, the audio latent
    rate (:class:`ConfigError` naming both numbers); nothing to check without a
    ``transformer/config.json``."""
    from ditax.io.files import read_model_json
    from ditax.models.ltx2.config import LTX2Config

    f = folder / "transformer" / "config.json"
    if not f.is_file():
        return
    tc = LTX2Config.from_diffusers(read_model_json(f, "transformer config"))
    a = audio_vae
    checks = (("vae latent_channels", vae.latent_channels,
               "in_channels / patch", tc.in_channels // (tc.patch_size_t * tc.patch_size ** 2)),
              ("audio_vae latent_channels x latent mel bins",
               a.latent_channels * a.config.latent_mel_bins, "audio_in_channels",
               tc.audio_in_channels),
              ("audio_vae sample_rate / mel_hop_length / 4",
               a.sample_rate / a.hop_length / a.config.temporal_factor,
               "audio_sampling_rate / audio_hop_length / audio_scale_factor",
               tc.audio_latents_per_second))
    for what, got, field, want in checks:
        if got != want:
            raise ConfigError(f"{folder}: {what} = {got} but the transformer's {field} = "
                              f"{want}; the folder mixes components of different models")


__all__ = ["LTX2Encoders", "clip_fps"]
