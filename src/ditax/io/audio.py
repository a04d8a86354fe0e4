"""Sound tracks: a generated waveform, muxed into its mp4 as AAC, and read back.

A family whose pipeline also makes sound (LTX-2) returns ``{"video": ..., "audio":
AudioTrack(...)}``; ``ditax generate`` and ``ditax serve`` put the track into the video's mp4
(:func:`ditax.io.video.write_mp4`'s ``audio=``, :func:`mux_audio`) unless asked for the video
alone. ffmpeg is the one imageio-ffmpeg
ships (its native ``aac`` encoder), so nothing new is installed; its exit status and error
lines are read (:mod:`ditax.io.ffmpeg`): a mux that failed is never a file reported written.

Waveforms are float ``[channels, samples]`` in [-1, 1] (what the vocoder returns); values
outside are clipped by the encoder's input conversion, as every player would.
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess

import numpy as np

from ditax.io.outputs import atomic_file


@dataclasses.dataclass(frozen=True)
class AudioTrack:
    """One sound track: ``samples`` float32 ``[channels, samples]``, ``sample_rate`` in Hz."""

    samples: np.ndarray
    sample_rate: int

    def __post_init__(self):
        s = np.asarray(self.samples, np.float32)
        if s.ndim == 1:
            s = s[None]
        if s.ndim != 2 or not 1 <= s.shape[0] <= 8 or s.shape[1] < 1:
            raise ValueError(f"an audio track is [channels (1..8), samples]; got shape "
                             f"{np.shape(self.samples)}")
        if int(self.sample_rate) <= 0:
            raise ValueError(f"sample_rate={self.sample_rate} must be a positive number of Hz")
        object.__setattr__(self, "samples", s)
        object.__setattr__(self, "sample_rate", int(self.sample_rate))

    @property
    def channels(self) -> int:
        return int(self.samples.shape[0])

    @property
    def seconds(self) -> float:
        return self.samples.shape[1] / self.sample_rate


def _ffmpeg() -> str:
    from ditax.io.ffmpeg import exe

    return exe()


def _run(cmd: list[str]) -> bytes:
    """ffmpeg reading (the sound track of a file): its output; a failure is an ``OSError``."""
    done = subprocess.run(cmd, capture_output=True, check=False)
    if done.returncode:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise OSError(f"ffmpeg failed ({done.returncode}): {tail[0]}")
    return done.stdout


def mux_audio(video_path, track: AudioTrack, out_path, bitrate: str = "192k") -> None:
    """Write ``out_path``: the mp4 at ``video_path`` (its video stream copied, not re-encoded)
    with ``track`` as its AAC sound track. ``out_path`` is written in place: callers write to
    a temporary name (:func:`ditax.io.video.write_mp4` does). ffmpeg's exit status and error
    lines are read (:func:`ditax.io.ffmpeg.write`): a failed mux is
    :class:`~ditax.io.outputs.WriteFailed` naming ``out_path``."""
    from ditax.io import ffmpeg

    raw = np.ascontiguousarray(np.clip(track.samples, -1.0, 1.0).T, "<f4")
    ffmpeg.write(["-i", str(video_path), "-f", "f32le", "-ar", str(track.sample_rate),
                  "-ac", str(track.channels), "-i", "pipe:0", "-map", "0:v:0", "-map",
                  "1:a:0", "-c:v", "copy", "-c:a", "aac", "-b:a", bitrate, "-f", "mp4",
                  str(out_path)], out_path, [raw])


def mux_into_mp4(path, track: AudioTrack) -> pathlib.Path:
    """Give the (silent) mp4 at ``path`` the sound track ``track``; the file is replaced whole
    at the end (a failed mux leaves it as it was)."""
    path = pathlib.Path(path)
    with atomic_file(path) as tmp:
        mux_audio(path, track, tmp)
    return path


def read_audio(path, sample_rate: int | None = None) -> AudioTrack | None:
    """The sound track of the media file at ``path`` decoded to float32 (resampled to
    ``sample_rate`` when given; None: the file's own rate); None when it has none."""
    probe = subprocess.run([_ffmpeg(), "-hide_banner", "-i", str(path)], capture_output=True,
                           check=False).stderr.decode(errors="replace")
    streams = [ln for ln in probe.splitlines() if "Audio:" in ln and "Stream #" in ln]
    if not streams:
        return None
    info = streams[0]
    rate = sample_rate or int(info.split(" Hz")[0].rsplit(" ", 1)[-1])
    channels = 1 if "mono" in info else 2
    raw = _run([_ffmpeg(), "-hide_banner", "-loglevel", "error", "-i", str(path), "-map",
                "0:a:0", "-f", "f32le", "-ar", str(rate), "-ac", str(channels), "pipe:1"])
    samples = np.frombuffer(raw, "<f4").reshape(-1, channels).T
    return AudioTrack(samples.copy(), rate)


def write_wav(path, track: AudioTrack, stage=None) -> pathlib.Path:
    """``track`` as a 16-bit PCM WAV file (the sound alone; written whole at the end, with
    the other outputs of ``stage``, a :class:`~ditax.io.outputs.Staging`, when given)."""
    import wave

    path = pathlib.Path(path)
    pcm = np.round(np.clip(track.samples, -1.0, 1.0).T * 32767.0).astype("<i2")
    with atomic_file(path, stage) as tmp, wave.open(str(tmp), "wb") as w:
        w.setnchannels(track.channels)
        w.setsampwidth(2)
        w.setframerate(track.sample_rate)
        w.writeframes(pcm.tobytes())
    return path


__all__ = ["AudioTrack", "mux_audio", "mux_into_mp4", "read_audio", "write_wav"]
