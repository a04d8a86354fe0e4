"""The checks of one LTX-2 call: every argument's shape and the arguments ditax does not take
yet, each refused in one :class:`~ditax.errors.RequestError` line naming the value and the
fix, before anything is traced; then the arrays the model builds from the arguments (timesteps
``[B, T]``, padded tokens, text key masks, STG flags). Shapes use the module's letters: ``B``
batch, ``L`` / ``La`` video / audio tokens, ``T`` / ``Ta`` text tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from ditax.errors import RequestError
from ditax.models.ltx2.config import LTX2Config


@dataclass(frozen=True)
class CallInputs:
    """The keyword inputs of one LTX-2 call beside the four token arrays and the timestep
    (diffusers' names and defaults; :mod:`ditax.models.ltx2.transformer.model` has their
    meanings): the audio timestep and the sigmas, the text masks, the latent sizes or
    coordinates of the RoPE, the modality isolation and spatio-temporal guidance, the
    keyframe marks, and what ditax refuses (``attention_kwargs``,
    ``video_self_attention_mask``). A keyword that is none of these is a ``TypeError``."""

    audio_timestep: Any = None
    sigma: Any = None
    audio_sigma: Any = None
    encoder_attention_mask: Any = None
    audio_encoder_attention_mask: Any = None
    num_frames: Any = None
    height: Any = None
    width: Any = None
    fps: float = 24.0
    audio_num_frames: Any = None
    video_coords: Any = None
    audio_coords: Any = None
    isolate_modalities: bool = False
    spatio_temporal_guidance_blocks: Any = None
    perturbation_mask: Any = None
    use_cross_timestep: bool = False
    attention_kwargs: Any = None
    video_self_attention_mask: Any = None
    video_keyframes_mask: Any = None


def _shape(x):
    return None if x is None else tuple(getattr(x, "shape", ()))


def timestep_tokens(name: str, t, b: int, n: int) -> int:
    """How many timesteps a sample has in ``t`` (1, or ``n``: one per token); ``t``: a
    scalar, ``[1]``, ``[B]``, ``[B, 1]`` or ``[B, n]``."""
    s = _shape(t)
    if len(s) == 0 or (len(s) == 1 and s[0] in (1, b)):
        return 1
    if len(s) == 2 and s[0] == b and s[1] in (1, n):
        return s[1]
    raise RequestError(f"{name} must be a scalar, [B={b}] or one per token [B={b}, {n}]; "
                       f"got shape {s}")


def _unsupported(name: str, value, what: str) -> None:
    raise RequestError(f"{name}={value!r}: ditax does not support {what} yet (diffusers' "
                       f"LTX2VideoTransformer3DModel does); pass {name}=None")


def check_inputs(cfg: LTX2Config, x, a, text, audio_text, timestep, inputs: CallInputs,
                 positions=None) -> None:
    """Raise :class:`RequestError` for a call the model cannot take (module docstring);
    ``positions`` given: the RoPE's sizes and coordinates are not needed."""
    i = inputs
    if i.attention_kwargs:
        _unsupported("attention_kwargs", i.attention_kwargs, "attention processor keywords "
                     "(LoRA scales)")
    if i.video_self_attention_mask is not None:
        _unsupported("video_self_attention_mask", _shape(i.video_self_attention_mask),
                     "soft [B, L, L] video self-attention masks (IC-LoRA)")
    xs = _shape(x)
    if len(xs) != 3 or xs[-1] != cfg.in_channels:
        raise RequestError(f"hidden_states must be packed video tokens [B, L, in_channels="
                           f"{cfg.in_channels}]; got shape {xs}")
    b, seq = xs[:2]
    as_ = _shape(a)
    if len(as_) != 3 or as_[0] != b or as_[-1] != cfg.audio_in_channels:
        raise RequestError(f"audio_hidden_states must be packed audio tokens [B={b}, La, "
                           f"audio_in_channels={cfg.audio_in_channels}]; got shape {as_}")
    la = as_[1]
    for name, t, dim in (("encoder_hidden_states", text, cfg.text_dim),
                         ("audio_encoder_hidden_states", audio_text, cfg.audio_text_dim)):
        s = _shape(t)
        if len(s) != 3 or s[0] != b or s[-1] != dim:
            raise RequestError(f"{name} must be [B={b}, T, {dim}]; got shape {s}")
    for name, m, t in (("encoder_attention_mask", i.encoder_attention_mask, text),
                       ("audio_encoder_attention_mask", i.audio_encoder_attention_mask,
                        audio_text)):
        if m is not None and _shape(m) != _shape(t)[:2]:
            raise RequestError(f"{name} must be [B, T] = {_shape(t)[:2]} (1 = attend; "
                               f"diffusers' additive [B, 1, T] biases are not taken); got "
                               f"shape {_shape(m)}")
    _check_times(cfg, b, seq, la, timestep, i)
    if i.video_keyframes_mask is not None:
        if not cfg.use_keyframes_abs_pos_embedding:
            raise RequestError("video_keyframes_mask is given, but this model has no keyframe "
                               "embedding (use_keyframes_abs_pos_embedding=False); pass "
                               "video_keyframes_mask=None")
        s = _shape(i.video_keyframes_mask)
        if s not in ((b, seq), (b, seq, 1)):
            raise RequestError(f"video_keyframes_mask must be [B, L, 1] = {(b, seq, 1)} (or "
                               f"[B, L]); got shape {s}")
    _check_stg(cfg, b, i.spatio_temporal_guidance_blocks, i.perturbation_mask)
    if positions is None:
        _check_video_positions(cfg, b, seq, (i.num_frames, i.height, i.width), i.video_coords)
        _check_coords("audio_coords", b, 1, la, i.audio_coords, "La", "seconds")
        if i.audio_coords is None:
            _check_audio_frames(cfg, la, i.audio_num_frames)


def _check_times(cfg: LTX2Config, b: int, seq: int, la: int, timestep, i: CallInputs) -> None:
    """The timesteps (one per sample or per token) and the sigmas the model's modulations
    need."""
    tv = timestep_tokens("timestep", timestep, b, seq)
    if i.audio_timestep is None and tv > 1:
        raise RequestError(f"timestep is one per video token [B, L={seq}], so audio_timestep "
                           f"must be given ([B] or [B, La={la}]): the audio stream cannot take "
                           f"the video tokens' timesteps")
    if i.audio_timestep is not None:
        timestep_tokens("audio_timestep", i.audio_timestep, b, la)
    for name, s in (("sigma", i.sigma), ("audio_sigma", i.audio_sigma)):
        if s is not None:
            sh = _shape(s)
            if len(sh) > 1 or (len(sh) == 1 and sh[0] not in (1, b)):
                raise RequestError(f"{name} must be a scalar or [B={b}]; got shape {sh}")
    if i.sigma is None and i.audio_sigma is None:
        if cfg.prompt_adaln:
            raise RequestError("sigma=None, but this model modulates its text keys by sigma "
                               "(cross_attn_mod with use_prompt_adaln_single, LTX-2.3): pass "
                               "sigma=[B] (diffusers' pipeline passes the timestep)")
        if i.use_cross_timestep:
            raise RequestError("use_cross_timestep=True takes each stream's a<->v modulation "
                               "from the other stream's sigma: pass sigma (and audio_sigma)")
    if cfg.prompt_adaln and i.sigma is None:
        raise RequestError("sigma=None with audio_sigma given: the video stream's text "
                           "modulation needs sigma=[B] too")


def stg_flags(blocks, num_layers: int):
    """``spatio_temporal_guidance_blocks`` as one flag per block ``[num_layers]`` (a list of
    block indices, or already the flags: a bool array); None when no block is perturbed."""
    if blocks is None:
        return None
    if getattr(blocks, "dtype", None) == bool:
        return blocks
    idx = [int(i) for i in blocks]
    if not idx:
        return None
    flags = np.zeros(num_layers, bool)
    flags[idx] = True
    return flags


def _check_stg(cfg: LTX2Config, b: int, blocks, mask) -> None:
    """Spatio-temporal guidance: block indices of this model, a per-sample weight."""
    n = cfg.num_layers
    if getattr(blocks, "dtype", None) == bool:
        if _shape(blocks) != (n,):
            raise RequestError(f"spatio_temporal_guidance_blocks as flags must be [num_layers="
                               f"{n}] bool; got shape {_shape(blocks)}")
        given = True
    else:
        idx = [] if blocks is None else list(blocks)
        bad = [i for i in idx if isinstance(i, bool) or not isinstance(i, (int, np.integer))
               or not 0 <= i < n]
        if bad:
            raise RequestError(f"spatio_temporal_guidance_blocks={idx}: {bad} are no block "
                               f"indices of this model (0..{n - 1})")
        given = bool(idx)
    if given and not cfg.perturbed_attn:
        raise RequestError("spatio_temporal_guidance_blocks is given, but this model's config "
                           "has perturbed_attn=false (diffusers then ignores it); pass None, "
                           "or use a model with perturbed attention (LTX-2.3)")
    if mask is not None:
        if not given:
            raise RequestError("perturbation_mask is given without spatio_temporal_guidance_"
                               "blocks: it weighs the perturbed blocks' self-attention; name "
                               "the blocks or pass perturbation_mask=None")
        if _shape(mask) not in ((b,), (b, 1, 1)):
            raise RequestError(f"perturbation_mask must be [B={b}] (or [B, 1, 1]); 0 = "
                               f"perturbed, 1 = not; got shape {_shape(mask)}")


def _check_coords(name: str, b: int, axes: int, n: int, coords, tokens: str,
                  units: str) -> None:
    """Coordinates ``[B, axes, n, 2]`` (each token's [start, end)) or ``[B, axes, n]``."""
    if coords is None:
        return
    s = _shape(coords)
    if len(s) not in (3, 4) or s[0] not in (1, b) or s[1] != axes or s[2] != n or (
            len(s) == 4 and s[3] != 2):
        raise RequestError(f"{name} must be [B={b}, {axes}, {tokens}={n}, 2] (each token's "
                           f"[start, end) in {units}) or [B, {axes}, {tokens}]; got {s}")


def _check_video_positions(cfg, b, seq, sizes, coords) -> None:
    """The video RoPE's coordinates, or its latent ``sizes`` (frames, height, width)."""
    _check_coords("video_coords", b, 3, seq, coords, "L", "seconds and pixels")
    if coords is not None:
        return
    sizes = dict(zip(("num_frames", "height", "width"), sizes))
    missing = [k for k, v in sizes.items() if v is None]
    if missing:
        raise RequestError(f"{', '.join(missing)} not given: the video RoPE needs the latent "
                           f"num_frames, height and width (or video_coords)")
    for k, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise RequestError(f"{k}={v!r} must be an integer >= 1 (latent {k})")
    num_frames, height, width = sizes.values()
    n = (math.ceil(num_frames / cfg.patch_size_t) * math.ceil(height / cfg.patch_size)
         * math.ceil(width / cfg.patch_size))
    if n != seq:
        raise RequestError(f"num_frames x height x width = {num_frames}x{height}x{width} "
                           f"latents make {n} tokens (patch {cfg.patch_size_t}x{cfg.patch_size}"
                           f"x{cfg.patch_size}), but hidden_states has L={seq}")


def _check_audio_frames(cfg, la, n) -> None:
    """The audio RoPE's latent frames, without coordinates."""
    if n is None or isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RequestError(f"audio_num_frames={n!r}: the audio RoPE needs the latent audio "
                           f"frames (an integer >= 1), or audio_coords")
    if math.ceil(n / cfg.audio_patch_size_t) != la:
        raise RequestError(f"audio_num_frames={n} makes {math.ceil(n / cfg.audio_patch_size_t)}"
                           f" audio tokens, but audio_hidden_states has La={la}")


# -- the arrays the model builds from them --------------------------------------------------

def timesteps(t, b: int):
    """A timestep argument as ``[B, T]`` float32 (``T``: 1 or one per token)."""
    t = jnp.asarray(t, jnp.float32)
    return t.reshape(b, -1) if t.ndim == 2 else jnp.broadcast_to(t.reshape(-1), (b,))[:, None]


def pad_tokens(x, pad: int, axis: int = 1):
    """``x`` with ``pad`` zero tokens appended on ``axis`` (the video tokens' context-shard
    padding)."""
    if not pad or x is None:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def key_mask(mask):
    """A ``[B, T]`` text mask as attention keys: True where ``mask > 0.5`` (diffusers' additive
    ``(1 - mask) · -10000`` bias hides a key; a sample whose mask hides every key attends to
    all of them, as that constant bias does); None: every key."""
    if mask is None:
        return None
    keep = jnp.asarray(mask).astype(jnp.float32) > 0.5
    return keep | ~jnp.any(keep, axis=1, keepdims=True)


__all__ = ["CallInputs", "check_inputs", "timestep_tokens", "stg_flags", "timesteps", "pad_tokens",
           "key_mask"]
