"""Tiny random diffusers LTX-2 audio models (``AutoencoderKLLTX2Audio``, ``LTX2Vocoder``,
``LTX2VocoderWithBWE``) for parity tests, and a torch reference of the LTX-2 trainer's log-mel
(torchaudio's ``MelSpectrogram`` is not installed: ``torch.stft`` + transformers'
``mel_filter_bank``, which implements torchaudio's / librosa's slaney filterbank).

Configurations: ``public`` uses the switches of every public LTX-2 audio VAE (pixel norms,
causal in time, no attention) with 3 levels as they have; ``group`` the other switches
(GroupNorm, not causal, attention in the levels and the mid block); ``width`` pixel norms,
causal along the bins, attention with pixel norms. Vocoders: ``v20`` is LTX-2.0's kind (leaky
ReLU, no anti-aliasing, tanh, final bias), ``v23`` LTX-2.3's (SnakeBeta, anti-aliased, no final
activation or bias), ``snake`` the rest (Snake without beta, no anti-aliasing, clamp); ``bwe``
the LTX-2.3 / 2.5 vocoder with bandwidth extension.
"""

from __future__ import annotations

import numpy as np

AUDIO_VAE = {
    # base_channels = latent_channels * mel_bins // 4: the pipeline normalises packed tokens
    "public": dict(base_channels=8, output_channels=2, ch_mult=(1, 2, 4), num_res_blocks=1,
                   in_channels=2, latent_channels=2, mel_bins=16, norm_type="pixel",
                   causality_axis="height", mid_block_add_attention=False, resolution=16),
    "group": dict(base_channels=32, output_channels=2, ch_mult=(1, 2), num_res_blocks=1,
                  in_channels=2, latent_channels=4, mel_bins=16, norm_type="group",
                  causality_axis="none", attn_resolutions=(16, 8), resolution=16,
                  mid_block_add_attention=True),
    "width": dict(base_channels=8, output_channels=1, ch_mult=(1, 2), num_res_blocks=1,
                  in_channels=1, latent_channels=2, mel_bins=None, norm_type="pixel",
                  causality_axis="width", attn_resolutions=(8,), resolution=16,
                  mid_block_add_attention=True),
}

_RESNETS = dict(resnet_kernel_sizes=[3, 7, 11], resnet_dilations=[[1, 3, 5]] * 3)  # public
_SMALL = dict(resnet_kernel_sizes=[3, 5], resnet_dilations=[[1, 3], [1, 2]])  # fewer compiles
VOCODER = {
    "v20": dict(in_channels=32, hidden_channels=32, out_channels=2,
                upsample_kernel_sizes=[16, 15, 4], upsample_factors=[6, 5, 2], act_fn="leaky_relu",
                antialias=False, final_act_fn="tanh", final_bias=True, output_sampling_rate=24000,
                **_RESNETS),
    "v23": dict(in_channels=32, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[11, 4],
                upsample_factors=[5, 2], act_fn="snakebeta", antialias=True, final_act_fn=None,
                final_bias=False, output_sampling_rate=16000, **_SMALL),
    "snake": dict(in_channels=16, hidden_channels=16, out_channels=1, upsample_kernel_sizes=[8],
                  upsample_factors=[4], act_fn="snake", antialias=False, final_act_fn="clamp",
                  final_bias=True, resnet_kernel_sizes=[3, 5], resnet_dilations=[[1, 2], [1, 3]]),
}
BWE = dict(in_channels=32, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[11, 4],
           upsample_factors=[5, 2], bwe_in_channels=16, bwe_hidden_channels=16,
           bwe_out_channels=2, bwe_upsample_kernel_sizes=[12, 11], bwe_upsample_factors=[6, 5],
           filter_length=32, hop_length=10, window_length=32, num_mel_channels=8,
           input_sampling_rate=16000, output_sampling_rate=48000, **_SMALL,
           bwe_resnet_kernel_sizes=[3], bwe_resnet_dilations=[[1, 3]])


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _randomize(model, seed: int):
    """Every parameter random (norm gains near 1, biases and log-scale Snake parameters
    non-zero) and every float buffer but the anti-alias filters perturbed, in eval mode."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def rand(t):
        return torch.randn(t.shape, generator=g, dtype=t.dtype)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * rand(p))
            elif p.ndim == 1:
                p.copy_(0.2 * rand(p))
            else:
                p.copy_(rand(p) / p[0].numel() ** 0.5)
        for name, b in model.named_buffers():
            if name in ("latents_mean",):
                b.copy_(0.5 * rand(b))
            elif name == "latents_std":
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif name.endswith("mel_basis"):
                b.copy_(torch.rand(b.shape, generator=g) / b.shape[1] ** 0.5)
            elif name.endswith("_basis"):
                b.copy_(rand(b) / b.shape[-1] ** 0.5)
    return model.eval()


def make_audio_vae(name: str, seed: int = 0):
    from diffusers import AutoencoderKLLTX2Audio

    return _randomize(AutoencoderKLLTX2Audio(**AUDIO_VAE[name]), seed)


def make_vocoder(name: str, seed: int = 0):
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE

    if name == "bwe":
        return _randomize(LTX2VocoderWithBWE(**BWE), seed)
    return _randomize(LTX2Vocoder(**VOCODER[name]), seed)


def reference_log_mel(waveform: np.ndarray, sample_rate: int, n_fft: int, hop_length: int,
                      n_mels: int) -> np.ndarray:
    """The LTX-2 trainer's log-mel of ``waveform`` ``[B, C, N]`` (torchaudio ``MelSpectrogram``:
    Hann window of ``n_fft``, centred with reflection, magnitude, slaney mel scale and norm,
    0 .. sample_rate / 2; then ``log(clamp(., 1e-5))``) as ``[B, C, T, n_mels]``, in float64."""
    import torch
    from transformers.audio_utils import mel_filter_bank

    x = torch.from_numpy(np.asarray(waveform, np.float64))
    b, c, n = x.shape
    spec = torch.stft(x.reshape(b * c, n), n_fft, hop_length, n_fft,
                      torch.hann_window(n_fft, dtype=torch.float64), center=True,
                      pad_mode="reflect", return_complex=True).abs()       # [BC, n_fft/2+1, T]
    fb = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=n_mels,
                         min_frequency=0.0, max_frequency=sample_rate / 2.0,
                         sampling_rate=sample_rate, norm="slaney", mel_scale="slaney")
    mel = torch.einsum("fm,kft->ktm", torch.from_numpy(fb), spec)
    return torch.log(torch.clamp(mel, min=1e-5)).reshape(b, c, -1, n_mels).numpy()


__all__ = ["AUDIO_VAE", "BWE", "VOCODER", "make_audio_vae", "make_vocoder", "reference_log_mel",
           "rel_err"]
