"""Sound tracks: an mp4 with its AAC track (the video stream copied), read back; WAV; bad
tracks refused."""

import numpy as np
import pytest

from ditax.io.audio import AudioTrack, mux_into_mp4, read_audio, write_wav
from ditax.io.video import read_video, write_mp4


def _tones(sr, seconds, freqs):
    t = np.arange(int(sr * seconds)) / sr
    return np.stack([0.4 * np.sin(2 * np.pi * f * t) for f in freqs]).astype(np.float32)


def _peak_hz(x, sr):
    return np.argmax(np.abs(np.fft.rfft(x))) * sr / len(x)


def test_mp4_gets_its_sound_track_and_keeps_its_frames(tmp_path):
    rng = np.random.default_rng(0)
    video = rng.uniform(size=(9, 32, 48, 3)).astype(np.float32)
    path = write_mp4(tmp_path / "v.mp4", video, fps=24)
    frames = read_video(path)
    assert read_audio(path) is None                      # silent before the mux
    track = AudioTrack(_tones(16000, 9 / 24, (440.0, 1000.0)), 16000)
    mux_into_mp4(path, track)
    np.testing.assert_array_equal(read_video(path), frames)   # video copied, not re-encoded
    back = read_audio(path)
    assert back.sample_rate == 16000 and back.channels == 2
    assert abs(back.seconds - track.seconds) < 0.07      # AAC frames of 1024 samples
    for c, f in enumerate((440.0, 1000.0)):               # each channel its own tone
        assert abs(_peak_hz(back.samples[c], 16000) - f) < 10.0
    assert not list(tmp_path.glob(".*partial*"))
    both = write_mp4(tmp_path / "w.mp4", video, fps=24, audio=track)   # in one write
    np.testing.assert_array_equal(read_video(both), frames)
    assert read_audio(both).channels == 2 and sorted(p.name for p in tmp_path.iterdir()) == [
        "v.mp4", "w.mp4"]


def test_wav_round_trip(tmp_path):
    track = AudioTrack(_tones(24000, 0.25, (300.0,))[0], 24000)      # mono from 1-D
    back = read_audio(write_wav(tmp_path / "a.wav", track))
    assert back.channels == 1 and back.sample_rate == 24000
    np.testing.assert_allclose(back.samples, track.samples, atol=1.0 / 32767 + 1e-6)


@pytest.mark.parametrize("samples,rate,match", [
    (np.zeros((2, 3, 4)), 16000, r"\[channels \(1..8\), samples\]"),
    (np.zeros((9, 10)), 16000, r"\[channels \(1..8\), samples\]"),
    (np.zeros((1, 10)), 0, "sample_rate=0"),
])
def test_bad_tracks_are_one_line(samples, rate, match):
    with pytest.raises(ValueError, match=match):
        AudioTrack(samples, rate)
