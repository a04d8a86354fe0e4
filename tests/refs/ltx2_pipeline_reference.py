"""A tiny random diffusers ``LTX2Pipeline`` folder (every component random, saved with
``save_pretrained``) and the pipeline object read back from it, for end-to-end parity."""

from __future__ import annotations

import numpy as np

from gemma_reference import CONNECTORS, tiny_ltx2_text_folder
from ltx2_audio_reference import AUDIO_VAE, VOCODER, _randomize, make_audio_vae
from ltx2_reference import LTX2
from ltx2_vae_reference import CONFIGS, make_ltx2_vae

#: LTX-2's scheduler config (dynamic shift of the video token count, terminal sigma 0.1)
SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True,
                 base_shift=0.95, max_shift=2.05, base_image_seq_len=1024,
                 max_image_seq_len=4096, shift_terminal=0.1)
#: the transformer fitted to the other parts: 8 video latent channels, 2 x 4 audio latent
#: channels x mel bins, the connectors' text width; perturbed attention (STG) on
TRANSFORMER = dict(LTX2, in_channels=CONFIGS["ltx2"]["latent_channels"], out_channels=None,
                   audio_in_channels=AUDIO_VAE["public"]["latent_channels"]
                   * AUDIO_VAE["public"]["mel_bins"] // 4, audio_out_channels=None,
                   caption_channels=CONNECTORS["caption_channels"],
                   audio_sampling_rate=16000, audio_hop_length=160, audio_scale_factor=4)
#: LTX-2.0's vocoder kind, its upsampling matched to its rate as the real one's is: 100 mel
#: frames a second (16 kHz, hop 160) x 80 = 8 kHz, so a track lasts as long as its video
VOCODER_8K = dict(VOCODER["v20"], upsample_factors=[5, 4, 4], upsample_kernel_sizes=[10, 8, 8],
                  output_sampling_rate=8000)


def write_ltx2_pipeline(root, seed: int = 0):
    """Write a tiny ``LTX2Pipeline`` folder at ``root``; returns the diffusers pipeline."""
    import shutil

    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline

    from ltx2_reference import make_diffusers_ltx2

    folder, encoder, tokenizer, connectors = tiny_ltx2_text_folder()
    root.mkdir(parents=True, exist_ok=True)
    transformer, tfolder = make_diffusers_ltx2(root.parent, seed, name=f"{root.name}_tr",
                                               **TRANSFORMER)
    vae = make_ltx2_vae(CONFIGS["ltx2"], seed)
    audio_vae = make_audio_vae("public", seed)
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    vocoder = _randomize(LTX2Vocoder(**VOCODER_8K), seed)
    pipe = LTX2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae,
                        audio_vae=audio_vae, text_encoder=encoder, tokenizer=tokenizer,
                        connectors=connectors, transformer=transformer, vocoder=vocoder)
    pipe.save_pretrained(root)
    shutil.rmtree(tfolder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


_SHARED: dict = {}


def shared_ltx2_pipeline():
    """``(folder, diffusers pipeline)``: one tiny ``LTX2Pipeline`` folder per test process
    (:func:`write_ltx2_pipeline` in a temporary folder removed at exit), for the tests that
    only read it."""
    if "pipe" not in _SHARED:
        import atexit
        import pathlib
        import shutil
        import tempfile

        tmp = pathlib.Path(tempfile.mkdtemp(prefix="ditax_ltx2_"))
        atexit.register(shutil.rmtree, tmp, True)
        _SHARED["pipe"] = (tmp / "pipe", write_ltx2_pipeline(tmp / "pipe"))
    return _SHARED["pipe"]


def random_latents(pipe, num_frames, height, width, frame_rate, seed=0):
    """Unpacked video ``[1, C, F', Y, X]`` and audio ``[1, c, La, M]`` latents (float32,
    standard normal from ``seed``) of a request of that size to the ditax pipeline ``pipe``."""
    rng = np.random.default_rng(seed)
    f, y, x = pipe.grid(num_frames, height, width)
    la = pipe.audio_frames(num_frames, frame_rate)
    a = pipe.audio_vae
    video = rng.standard_normal((1, pipe.vae.latent_channels, f, y, x)).astype(np.float32)
    audio = rng.standard_normal((1, a.latent_channels, la, a.config.latent_mel_bins))
    return video, audio.astype(np.float32)


def run_diffusers(pipe, prompt, latents, audio_latents, **call):
    """diffusers' video ``[F, H, W, 3]`` and waveform ``[channels, samples]`` (numpy) from
    the given unpacked latents."""
    import torch

    with torch.no_grad():
        video, audio = pipe(prompt=prompt, latents=torch.from_numpy(latents),
                            audio_latents=torch.from_numpy(audio_latents), output_type="np",
                            return_dict=False, **call)
    return np.asarray(video[0], np.float32), audio[0].float().numpy()


__all__ = ["SCHEDULER", "TRANSFORMER", "VOCODER_8K", "run_diffusers", "shared_ltx2_pipeline",
           "write_ltx2_pipeline"]
