"""LTX-2 / LTX-2.3 audio+video transformer in Flax NNX (diffusers
``LTX2VideoTransformer3DModel``).

``model(hidden_states [B, L, C], audio_hidden_states [B, La, Ca], encoder_hidden_states
[B, T, Dt], audio_encoder_hidden_states [B, Ta, Dta], timestep, audio_timestep=None,
sigma=None, audio_sigma=None, encoder_attention_mask=None, audio_encoder_attention_mask=None,
num_frames=, height=, width=, fps=24.0, audio_num_frames=, video_coords=None,
audio_coords=None, isolate_modalities=False, use_cross_timestep=False, video_keyframes_mask=
None) → (video [B, L, C_out], audio [B, La, Ca_out])`` — diffusers' keyword names and
meanings: packed latent tokens in and out, timesteps already scaled by
``timestep_scale_multiplier`` (0…1000), ``timestep`` ``[B]`` or one per video token
``[B, L]`` (then ``audio_timestep`` is needed), the text masks ``[B, T]`` (1 = attend; a
row with no key attends to all, as diffusers' additive −10000 bias does), the latent sizes
(or coordinates) for the RoPE, spatio-temporal guidance (``spatio_temporal_guidance_blocks``:
block indices, or one bool flag per block; ``perturbation_mask [B]``) as diffusers'
perturbed processors do it. Arguments ditax does not take yet (``video_self_attention_mask``,
``attention_kwargs``) are refused in one line (:mod:`ditax.models.ltx2.transformer.inputs`).
``positions=`` (a :class:`~ditax.models.ltx2.transformer.rope.Positions`) replaces the
coordinates with the positions computed from them on the host (what
:class:`~ditax.models.ltx2.transformer.loading.LTX2TransformerModel` passes). ``embed`` /
``run_blocks`` / ``head`` split the call as every family's denoiser does, but the tokens ``h``
are the pair ``(video, audio)``, not one array. The keywords after ``timestep`` are
:class:`~ditax.models.ltx2.transformer.inputs.CallInputs`.

**Parallel layout.** Video tokens are the long sequence: padded to a multiple of the
context shards (padded keys masked, padded queries dropped) and split over ``context``;
video self-attention runs the configured backend — a local kernel, or ``ulysses`` /
``ring`` / ``ulysses_ring`` over the context axis. The audio tokens (25 a second, a few
hundred) and both texts are replicated over ``context``: their per-token work (projections,
feed-forward) is repeated on each context shard, which is cheap beside the video stream,
and it spares the audio stream its own padding and exchanges. Every audio-headed attention
— audio self-attention, audio→text, audio→video (video queries, audio keys) and
video→audio (audio queries, video keys) — and video→text runs the local kernel under a
``shard_map`` whose queries are split over the context axis and whose keys are whole:
video queries see all audio keys with no exchange; audio queries see the video keys
all-gathered at the ``shard_map`` boundary (``L x Da`` keys and values per layer; a
distributed log-sum-exp merge over the video shards would move only ``La x Da`` and is
left for later). ``fsdp`` / ``tensor`` shard the parameters by the table's logical axes
(:mod:`ditax.models.ltx2.transformer.convert`): heads and MLP columns over ``tensor``, audio heads
included.

Blocks are one stack with a leading layer axis, run scanned (or unrolled) under the
configured remat policy (:mod:`ditax.nn.stack`); attention goes through two
:class:`~ditax.attention.AttentionPlan` s sharing the model's one
:class:`~ditax.parallel.sharding.ShardingContext`: the video heads' and the audio heads'.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention import plan_attention
from ditax.attention.config import AttentionConfig
from ditax.models.common.dit import DiT
from ditax.models.ltx2.transformer import rope as R
from ditax.models.ltx2.transformer.attention import local_call
from ditax.models.ltx2.transformer.blocks import AUDIO, VIDEO, Block, BlockContext, Calls
from ditax.models.ltx2.config import OUT_EPS, LTX2Config
from ditax.models.ltx2.transformer.embeddings import AdaLNSingle
from ditax.models.ltx2.transformer.inputs import (CallInputs, check_inputs, key_mask, pad_tokens,
                                                  stg_flags, timesteps)
from ditax.nn import FP32LayerNorm, Linear, TextProjection
from ditax.nn.stack import make_stack, run_stack


class Embedded(NamedTuple):
    """What :meth:`LTX2Transformer.embed` hands the blocks and the head: the blocks'
    :class:`~ditax.models.ltx2.transformer.blocks.BlockContext`, the timestep embeddings the output
    layers modulate with (``temb [B, Tv, D]``, ``audio_temb [B, Ta, Da]``), ``mod`` (the
    blocks' video terms), the real video tokens ``seq`` and the padding ``pad`` (static), and
    the inputs' dtypes."""

    block: BlockContext
    temb: jax.Array
    audio_temb: jax.Array
    mod: jax.Array
    seq: int
    pad: int
    dtype: Any
    audio_dtype: Any


class LTX2Transformer(DiT):
    """LTX-2 DiT (see the module docstring for the call and the parallel layout).

    Args:
      cfg: model shape and numerics; checked by the entry points
        (:func:`ditax.models.ltx2.config.check_transformer`), not here.
      attention: attention backend / options (an :class:`AttentionConfig` or a name).
      mesh: optional device mesh; activations are constrained by the logical rules.
    """

    def __init__(self, cfg: LTX2Config, attention: AttentionConfig | str | None = None,
                 mesh=None, *, rngs: nnx.Rngs):
        self.setup(cfg, attention, mesh)
        self.audio_attention_plan = plan_attention(
            self.attention, self.sharding, num_heads=cfg.audio_num_attention_heads,
            head_dim=cfg.audio_attention_head_dim, dtype=cfg.dtype)
        d, da = cfg.inner_dim, cfg.audio_inner_dim
        pd = jnp.dtype(cfg.param_dtype)
        kw = dict(dtype=cfg.dtype, param_dtype=pd, rngs=rngs)
        self.proj_in = Linear(cfg.in_channels, d, **kw)
        self.audio_proj_in = Linear(cfg.audio_in_channels, da, **kw)
        self.keyframes_abs_pos_embedding = (nnx.Param(jnp.zeros((1, d), pd))
                                            if cfg.use_keyframes_abs_pos_embedding else None)
        if cfg.use_prompt_embeddings:
            self.caption_projection = TextProjection(cfg.caption_channels, d, **kw)
            self.audio_caption_projection = TextProjection(cfg.caption_channels, da, **kw)
        else:
            self.caption_projection = self.audio_caption_projection = None
        self.time_embed = AdaLNSingle(d, cfg.video_mod_params, **kw)
        self.audio_time_embed = AdaLNSingle(da, cfg.audio_mod_params, **kw)
        self.av_cross_attn_video_scale_shift = AdaLNSingle(d, 4, **kw)
        self.av_cross_attn_audio_scale_shift = AdaLNSingle(da, 4, **kw)
        self.av_cross_attn_video_a2v_gate = AdaLNSingle(d, 1, **kw)
        self.av_cross_attn_audio_v2a_gate = AdaLNSingle(da, 1, **kw)
        self.scale_shift_table = nnx.Param(jax.random.normal(rngs.params(), (2, d), pd) / d ** .5)
        self.audio_scale_shift_table = nnx.Param(
            jax.random.normal(rngs.params(), (2, da), pd) / da ** .5)
        if cfg.prompt_adaln:
            self.prompt_adaln = AdaLNSingle(d, 2, **kw)
            self.audio_prompt_adaln = AdaLNSingle(da, 2, **kw)
        else:
            self.prompt_adaln = self.audio_prompt_adaln = None
        self.transformer_blocks = make_stack(lambda r: Block(cfg, rngs=r), cfg.num_layers, rngs)
        self.norm_out = FP32LayerNorm(d, OUT_EPS, affine=False, param_dtype=pd)
        self.proj_out = Linear(d, cfg.video_out_channels, **kw)
        self.audio_norm_out = FP32LayerNorm(da, OUT_EPS, affine=False, param_dtype=pd)
        self.audio_proj_out = Linear(da, cfg.audio_output_channels, **kw)

    @property
    def block_stacks(self) -> tuple[tuple[str, int], ...]:
        """The one stack of blocks."""
        return (("transformer_blocks", self.cfg.num_layers),)

    @property
    def calls(self) -> Calls:
        """The attention sites of every block
        (:class:`~ditax.models.ltx2.transformer.blocks.Calls`)."""
        video, audio = self.attention_plan, self.audio_attention_plan
        return Calls(video.self_attn, video.cross_attn, local_call(audio.self_attn),
                     audio.cross_attn)

    # ------------------------------------------------------------------------------------------

    def check_inputs(self, hidden_states, audio_hidden_states, encoder_hidden_states,
                     audio_encoder_hidden_states, timestep, positions=None, **inputs) -> None:
        """Raise :class:`~ditax.errors.RequestError` naming the shapes for a call the model
        cannot take (:func:`ditax.models.ltx2.transformer.inputs.check_inputs`; ``inputs``:
        :class:`~ditax.models.ltx2.transformer.inputs.CallInputs` fields), and
        :class:`~ditax.errors.ConfigError` for a batch / heads the mesh cannot split."""
        check_inputs(self.cfg, hidden_states, audio_hidden_states, encoder_hidden_states,
                     audio_encoder_hidden_states, timestep, CallInputs(**inputs), positions)
        self.sharding.check_batch(hidden_states.shape[0])
        self.sharding.check_heads(self.cfg.num_attention_heads)
        self.sharding.check_heads(self.cfg.audio_num_attention_heads,
                                  "model.audio_num_attention_heads")

    def __call__(self, hidden_states, audio_hidden_states, encoder_hidden_states,
                 audio_encoder_hidden_states, timestep, **kwargs):
        """``(video [B, L, C_out], audio [B, La, Ca_out])`` (module docstring)."""
        h, ctx = self.embed(hidden_states, audio_hidden_states, encoder_hidden_states,
                            audio_encoder_hidden_states, timestep, **kwargs)
        return self.head(self.run_blocks(h, ctx), ctx)

    def positions(self, num_frames=None, height=None, width=None, fps: float = 24.0,
                  audio_num_frames=None, video_coords=None, audio_coords=None) -> R.Positions:
        """The call's four position grids (:func:`ditax.models.ltx2.transformer.rope.positions`)
        from its coordinates, or from the latent sizes as diffusers computes them."""
        cfg = self.cfg
        if video_coords is None:
            video_coords = R.video_coords(
                num_frames, height, width, patch_size=cfg.patch_size,
                patch_size_t=cfg.patch_size_t, scale_factors=cfg.vae_scale_factors,
                causal_offset=cfg.causal_offset, fps=fps)
        if audio_coords is None:
            audio_coords = R.audio_coords(
                audio_num_frames, patch_size_t=cfg.audio_patch_size_t,
                scale_factor=cfg.audio_scale_factor, causal_offset=cfg.causal_offset,
                hop_length=cfg.audio_hop_length, sampling_rate=cfg.audio_sampling_rate)
        cross = (cfg.cross_pos_max,)
        return R.Positions(
            video=R.positions(video_coords, (cfg.pos_embed_max_pos, cfg.base_height,
                                             cfg.base_width)),
            video_cross=R.positions(video_coords, cross),
            audio=R.positions(audio_coords, (cfg.audio_pos_embed_max_pos,)),
            audio_cross=R.positions(audio_coords, cross))

    def embed(self, hidden_states, audio_hidden_states, encoder_hidden_states,
              audio_encoder_hidden_states, timestep, positions: R.Positions | None = None,
              **inputs):
        """Tokens ``(video [B, L', D], audio [B, La, Da])`` and the blocks' and head's
        context (:class:`Embedded`); ``inputs``: the call's other keywords
        (:class:`~ditax.models.ltx2.transformer.inputs.CallInputs`), ``positions``: the
        RoPE's positions computed on the host (None: from the sizes or coordinates)."""
        self.check_inputs(hidden_states, audio_hidden_states, encoder_hidden_states,
                          audio_encoder_hidden_states, timestep, positions, **inputs)
        i = CallInputs(**inputs)
        cfg, sharding = self.cfg, self.sharding
        dt = jnp.dtype(cfg.dtype)
        b, seq = hidden_states.shape[:2]
        pad = (-seq) % sharding.seq_shards
        if positions is None:
            positions = self.positions(i.num_frames, i.height, i.width, i.fps,
                                       i.audio_num_frames, i.video_coords, i.audio_coords)

        # tokens
        x = pad_tokens(self._entry(jnp.asarray(hidden_states).astype(dt)), pad)
        x = self.proj_in(sharding.constrain(x, ("act_batch", "act_seq", None)))
        if i.video_keyframes_mask is not None:
            marker = jnp.asarray(i.video_keyframes_mask).reshape(b, seq, 1) > 0
            x = x + pad_tokens(marker.astype(dt), pad) * self.keyframes_abs_pos_embedding[
                ...].astype(dt)
        x = sharding.constrain(x, VIDEO)
        a = self._entry(jnp.asarray(audio_hidden_states).astype(dt))
        a = sharding.constrain(self.audio_proj_in(a), AUDIO)

        terms = self._timestep_terms(timestep, i.audio_timestep, i.sigma, i.audio_sigma, b,
                                     i.use_cross_timestep)

        # text
        text = self._entry(jnp.asarray(encoder_hidden_states).astype(dt))
        audio_text = self._entry(jnp.asarray(audio_encoder_hidden_states).astype(dt))
        if self.caption_projection is not None:
            text = self.caption_projection(text)
            audio_text = self.audio_caption_projection(audio_text)
        text_mask, audio_text_mask = (self._entry(key_mask(m)) for m in (
            i.encoder_attention_mask, i.audio_encoder_attention_mask))
        video_rope, cross_rope, audio_rope, audio_cross_rope = self._ropes(positions, pad)

        stg = None
        flags = stg_flags(i.spatio_temporal_guidance_blocks, cfg.num_layers)
        if flags is not None:       # diffusers: no mask given = every sample perturbed
            weights = (jnp.zeros((b,), jnp.float32) if i.perturbation_mask is None
                       else jnp.asarray(i.perturbation_mask, jnp.float32).reshape(b))
            stg = (sharding.constrain(jnp.asarray(flags), (None,)), self._entry(weights))
        token_mask = None
        if pad:
            token_mask = jnp.broadcast_to(jnp.arange(seq + pad) < seq, (b, seq + pad))

        def video_terms(v):      # per-token terms follow their (padded, split) tokens
            if v.shape[1] == 1:
                return v
            return sharding.constrain(pad_tokens(v, pad), ("act_batch", "act_seq", None))

        block = BlockContext(
            temb=video_terms(terms["temb"]), temb_audio=terms["temb_audio"],
            ca_video=video_terms(terms["ca_video"]), ca_audio=terms["ca_audio"],
            gate_video=video_terms(terms["gate_video"]), gate_audio=terms["gate_audio"],
            prompt=terms["prompt"], prompt_audio=terms["prompt_audio"],
            text=sharding.constrain(text, AUDIO),
            audio_text=sharding.constrain(audio_text, AUDIO), text_mask=text_mask,
            audio_text_mask=audio_text_mask, rope=video_rope, audio_rope=audio_rope,
            cross_rope=cross_rope, audio_cross_rope=audio_cross_rope, token_mask=token_mask,
            stg=stg, isolate=bool(i.isolate_modalities))
        ctx = Embedded(block=block, temb=video_terms(terms["embedded"]),
                       audio_temb=terms["audio_embedded"], mod=block.temb, seq=seq, pad=pad,
                       dtype=jnp.asarray(hidden_states).dtype,
                       audio_dtype=jnp.asarray(audio_hidden_states).dtype)
        return (x, a), ctx

    def _timestep_terms(self, timestep, audio_timestep, sigma, audio_sigma, b: int,
                        cross: bool) -> dict:
        """Every timestep-derived term of one call (diffusers' step 3): each stream's block
        terms and output embedding, the a↔v scale / shift and gate terms (from the other
        stream's sigma with ``cross``, diffusers' ``use_cross_timestep``), and sigma's prompt
        terms (None without ``prompt_adaln``); each ``[B, T, ·]``, ``T`` 1 or per token."""
        cfg = self.cfg
        t = self._entry(timesteps(timestep, b))
        ta = t if audio_timestep is None else self._entry(timesteps(audio_timestep, b))
        sig = None if sigma is None else self._entry(timesteps(sigma, b))
        asig = sig if audio_sigma is None else self._entry(timesteps(audio_sigma, b))
        out = {}
        out["temb"], out["embedded"] = self.time_embed(t)
        out["temb_audio"], out["audio_embedded"] = self.audio_time_embed(ta)
        ca_t, ca_ta = (asig, sig) if cross else (t, ta)
        gate = cfg.cross_attn_timestep_scale_multiplier / cfg.timestep_scale_multiplier
        out["ca_video"] = self.av_cross_attn_video_scale_shift(ca_t)[0]
        out["gate_video"] = self.av_cross_attn_video_a2v_gate(ca_t * gate)[0]
        out["ca_audio"] = self.av_cross_attn_audio_scale_shift(ca_ta)[0]
        out["gate_audio"] = self.av_cross_attn_audio_v2a_gate(ca_ta * gate)[0]
        out["prompt"] = out["prompt_audio"] = None
        if self.prompt_adaln is not None:
            out["prompt"] = self.prompt_adaln(sig)[0]
            out["prompt_audio"] = self.audio_prompt_adaln(asig)[0]
        return out

    def _ropes(self, positions: R.Positions, pad: int) -> tuple[R.Rope, ...]:
        """The four RoPE tables (video, its a↔v side, audio, its a↔v side); the video ones
        padded and split like the video tokens."""
        cfg = self.cfg
        split = cfg.rope_type == "split"
        kw = dict(theta=cfg.rope_theta, double=cfg.rope_double_precision, split=split)
        n, na = cfg.num_attention_heads, cfg.audio_num_attention_heads
        pos = R.Positions(*(self._entry(jnp.asarray(p, jnp.float32)) for p in positions))
        video = pad_tokens(pos.video, pad)
        video_cross = pad_tokens(pos.video_cross, pad)
        # diffusers' split tables group the a<->v video side by the video heads
        return (self._constrain_rope(R.rope_tables(video, cfg.inner_dim, n, **kw)),
                self._constrain_rope(R.rope_tables(video_cross, cfg.audio_cross_attention_dim,
                                                   n if split else na, **kw)),
                R.rope_tables(pos.audio, cfg.audio_inner_dim,
                              na, **kw),
                R.rope_tables(pos.audio_cross,
                              cfg.audio_cross_attention_dim, na, **kw))

    def _entry(self, x):
        """An input as it enters: split over the batch shards only (``None`` as is). Said for
        every input, so that no argument's layout is left to the partitioner, which can
        derive it from a ring x Ulysses view of the context axis that no mesh sharding names
        (an error when the compiled program's argument layouts are read back)."""
        if x is None:
            return None
        batch = "act_batch" if x.shape[0] > 1 else None
        return self.sharding.constrain(x, (batch,) + (None,) * (x.ndim - 1))

    def _constrain_rope(self, rope: R.Rope) -> R.Rope:
        batch = "act_batch" if rope.cos.shape[0] > 1 else None
        return R.Rope(*(self.sharding.constrain(t, (batch, "act_seq", None, None))
                        for t in rope))

    def run_blocks(self, h, ctx: Embedded, start: int = 0, stop: int | None = None):
        """Blocks ``start .. stop-1`` (default all) on ``h = (video [B, L', D], audio [B, La,
        Da])``."""
        cfg, sharding, calls = self.cfg, self.sharding, self.calls

        run = dict(depth=cfg.num_layers, start=start, stop=stop, remat=cfg.remat,
                   scan=cfg.scan_layers, prefetch=cfg.offload_prefetch)
        if ctx.block.stg is None:
            def body(streams, block):
                return block(streams, ctx.block, calls, sharding)

            return run_stack(self.transformer_blocks, body, tuple(h), **run)

        flags, weights = ctx.block.stg

        def perturbed(carry, block):     # the carry counts the layers: block i's STG flag
            x, a, i = carry
            x, a = block((x, a), ctx.block, calls, sharding,
                         jnp.where(flags[i], weights, jnp.float32(1.0)))
            return x, a, i + 1

        x, a, _ = run_stack(self.transformer_blocks, perturbed,
                            (*h, jnp.asarray(start, jnp.int32)), **run)
        return x, a

    def head(self, h, ctx: Embedded):
        """Output norms and projections: ``(video [B, L, C_out], audio [B, La, Ca_out])`` in
        the inputs' dtypes."""
        sharding = self.sharding
        x, a = h
        if ctx.pad:
            x = sharding.constrain(x[:, :ctx.seq], ("act_batch", None, "act_embed"))
        temb = ctx.temb[:, :ctx.seq] if ctx.temb.shape[1] > 1 else ctx.temb
        out = self._out(x, temb, self.scale_shift_table, self.norm_out, self.proj_out)
        audio = self._out(a, ctx.audio_temb, self.audio_scale_shift_table, self.audio_norm_out,
                          self.audio_proj_out)
        # (split over the context axis only when the tokens split evenly: an uneven split of an
        # output, or of an input, let the partitioner lay it out over the ring x Ulysses view
        # of that axis, which no sharding of the mesh names)
        out = sharding.constrain(out, ("act_batch", None if ctx.pad else "act_seq",
                                       "act_channels"))
        # the audio output's layout said too: left to the partitioner, it can come out split
        # over a ring x Ulysses view of the context axis that no mesh sharding names
        audio = sharding.constrain(audio, ("act_batch", None, "act_channels"))
        return out.astype(ctx.dtype), audio.astype(ctx.audio_dtype)

    @staticmethod
    def _out(x, temb, table, norm, proj):
        """``proj(norm(x) · (1 + scale) + shift)`` with (shift, scale) = table + the
        timestep embedding ``temb [B, T, D]``."""
        terms = table[...].astype(jnp.float32)[None, None] + temb.astype(jnp.float32)[:, :, None]
        shift, scale = terms[:, :, 0], terms[:, :, 1]
        return proj((norm(x) * (1 + scale) + shift).astype(x.dtype))


__all__ = ["LTX2Transformer", "Embedded"]
