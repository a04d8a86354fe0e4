"""Waveform → log-mel for LTX-2's audio VAE (the LTX-2 trainer's torchaudio MelSpectrogram, as
diffusers' Echo pipeline computes it): filterbank equal to transformers' slaney
``mel_filter_bank``, log-mel equal to torch.stft + that filterbank, sized by the VAE config;
clear errors."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from ditax.errors import RequestError  # noqa: E402
from ditax.models.ltx2.audio.config import LTX2AudioVAEConfig  # noqa: E402
from ditax.models.ltx2.audio.mel import (hz_to_mel, log_mel_for_vae,  # noqa: E402
                                         log_mel_spectrogram, mel_filterbank, mel_to_hz)
from ltx2_audio_reference import reference_log_mel, rel_err  # noqa: E402


def test_filterbank_matches_slaney_reference():
    from transformers.audio_utils import mel_filter_bank

    for n_fft, mels, rate in [(1024, 64, 16000), (512, 80, 22050)]:
        ours = mel_filterbank(n_fft // 2 + 1, mels, rate)
        ref = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=mels,
                              min_frequency=0.0, max_frequency=rate / 2.0, sampling_rate=rate,
                              norm="slaney", mel_scale="slaney")
        np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-14)
    f = np.array([0.0, 500.0, 1000.0, 4000.0, 8000.0])
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(f)), f, rtol=1e-12, atol=1e-9)
    assert hz_to_mel(1000.0) == pytest.approx(15.0)


def test_log_mel_matches_reference(rng):
    cfg = LTX2AudioVAEConfig()
    t = np.arange(4001) / cfg.sample_rate
    tone = 0.4 * np.sin(2 * np.pi * 440 * t) * np.linspace(0, 1, t.size)
    wave = (tone + 0.05 * rng.standard_normal((2, 2, t.size))).astype(np.float32)
    wave[1, 1, :800] = 0.0                         # silence: the 1e-5 floor
    got = np.asarray(log_mel_for_vae(wave, cfg))
    want = reference_log_mel(wave, cfg.sample_rate, 1024, cfg.mel_hop_length, cfg.mel_bins)
    assert got.shape == want.shape == (2, 2, 4001 // 160 + 1, 64)
    assert rel_err(got, want) < 1e-5
    assert got.min() == pytest.approx(np.log(1e-5), rel=1e-6)
    np.testing.assert_array_equal(np.asarray(log_mel_spectrogram(wave[0])), got[:1])


def test_bad_inputs():
    for wave, kw, match in [(np.zeros((4, 2, 2, 900)), {}, "got shape"),
                            (np.zeros((2, 300)), {}, "too few"),
                            (np.zeros((2, 900)), {"hop_length": 0}, "hop_length=0")]:
        with pytest.raises(RequestError, match=match):
            log_mel_spectrogram(wave, **kw)
    with pytest.raises(RequestError, match="mel_bins=null"):
        log_mel_for_vae(np.zeros((2, 900)), LTX2AudioVAEConfig(mel_bins=None))
