"""LTX-2 training references: a tiny ``LTX2Pipeline`` folder whose transformer's
``vae_scale_factors`` are its VAE's (so the audio length of a latent grid is the clip's), short
captioned clips with and without a sound track, and the LTX-2 trainer's flow loss on both
streams written out with diffusers' ``LTX2VideoTransformer3DModel``."""

from __future__ import annotations

import json

import numpy as np

#: the tiny video VAE of ltx2_pipeline_reference: 4 frames and 8 x 8 pixels per latent
VAE_FACTORS = [4, 8, 8]
FPS = 24


def write_ltx2_train_folder(root):
    """The tiny ``LTX2Pipeline`` folder of :func:`ltx2_pipeline_reference.write_ltx2_pipeline`
    with ``transformer/config.json``'s ``vae_scale_factors`` set to the VAE's; returns
    ``(pipe, transformer)``: the diffusers pipeline and its transformer read back from the
    folder (float32, the folder's config)."""
    from diffusers import LTX2VideoTransformer3DModel

    from ltx2_pipeline_reference import write_ltx2_pipeline

    pipe = write_ltx2_pipeline(root)
    f = root / "transformer" / "config.json"
    cfg = json.loads(f.read_text())
    cfg["vae_scale_factors"] = VAE_FACTORS
    f.write_text(json.dumps(cfg, indent=2))
    transformer = LTX2VideoTransformer3DModel.from_pretrained(root / "transformer").eval()
    return pipe, transformer


def write_clips(folder, captions, sound, frames: int = 5, height: int = 16, width: int = 24,
                seed: int = 0):
    """``clip{i}.mp4`` (H.264 at :data:`FPS`, random frames; with ``sound[i]`` an AAC track
    of random tones at 16 kHz, a little longer than the frames) and ``clip{i}.txt``."""
    from ditax.io.audio import AudioTrack
    from ditax.io.video import write_mp4

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i, (caption, has_sound) in enumerate(zip(captions, sound)):
        video = rng.uniform(0, 1, (frames, height, width, 3)).astype(np.float32)
        track = None
        if has_sound:
            t = np.arange(int(16000 * (frames / FPS + 0.1))) / 16000
            wave = 0.3 * np.sin(2 * np.pi * rng.uniform(200, 2000, (2, 1)) * t)
            track = AudioTrack(wave.astype(np.float32), 16000)
        write_mp4(folder / f"clip{i}.mp4", video, fps=FPS, audio=track)
        (folder / f"clip{i}.txt").write_text(caption)


def flow_loss(transformer, x0, a0, noise, audio_noise, sigma, text, mask, text_dim: int,
              grid, fps: float = FPS, first_frame: bool = False):
    """The LTX-2 trainer's loss with diffusers' model, forward and backward (zeroing the grads
    first): packed video tokens ``x0 [B, L, C]`` and audio tokens ``a0 [B, La, Ca]`` noised at
    ``sigma [B]`` with the given noises, the model fed ``1000 σ`` as timestep and sigma for
    both streams, the video / audio text split off ``text`` at ``text_dim``, one mask for
    both; per sample mean squared velocity error of the video plus the audio's, averaged.
    ``first_frame``: every sample conditioned on its first latent frame as
    ``LTX2ImageToVideoPipeline`` feeds it (those tokens clean, at timestep 0; the audio
    timestep and sigma the sample's) and the LTX-2 trainer masks it (the video error
    averaged over the other tokens).
    Returns ``(loss, video term, audio term, grad norm)`` as floats."""
    import torch

    t = torch.from_numpy
    s = sigma[:, None, None]
    x_t, a_t = (1 - s) * x0 + s * noise, (1 - s) * a0 + s * audio_noise
    ts = t((sigma * 1000).astype(np.float32))
    keep = np.ones(x0.shape[:2], np.float32)                   # [B, L]: 1 = noised, in the loss
    if first_frame:
        keep[:, :grid[1] * grid[2]] = 0
        x_t = np.where(keep[..., None] > 0, x_t, x0)
    video_ts = ts[:, None] * t(keep)
    transformer.zero_grad()
    v, a = transformer(hidden_states=t(x_t), audio_hidden_states=t(a_t),
                       encoder_hidden_states=t(text[..., :text_dim]),
                       audio_encoder_hidden_states=t(text[..., text_dim:]), timestep=video_ts,
                       audio_timestep=ts, sigma=ts,
                       encoder_attention_mask=t(mask.astype(np.float32)),
                       audio_encoder_attention_mask=t(mask.astype(np.float32)),
                       num_frames=grid[0], height=grid[1], width=grid[2], fps=fps,
                       audio_num_frames=a0.shape[1], use_cross_timestep=True,
                       return_dict=False)
    w = t(keep)[..., None].expand_as(v)
    video = (((v - t(noise - x0)) ** 2) * w).sum(dim=(1, 2)) / w.sum(dim=(1, 2))
    audio = ((a - t(audio_noise - a0)) ** 2).mean(dim=(1, 2))
    loss = (video + audio).mean()
    loss.backward()
    norm = float(torch.sqrt(sum(torch.sum(p.grad ** 2) for p in transformer.parameters()
                                if p.grad is not None)))
    return (float(loss.detach()), float(video.mean().detach()), float(audio.mean().detach()),
            norm)


__all__ = ["FPS", "VAE_FACTORS", "flow_loss", "write_clips", "write_ltx2_train_folder"]
