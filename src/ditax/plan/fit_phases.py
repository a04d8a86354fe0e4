"""The phases ``ditax plan --fit`` measures on one chip (:mod:`ditax.plan.fit` puts them
together): the text encoder's bytes (analytic, from its config), one denoising step's forward
(compiled for the target, optionally a few layers scaled to all) and the Wan VAE's decode
(compiled). Each returns a JSON-ready dict; nothing is allocated. The text encoders are every
family's published ones: UMT5-XXL (Wan), CLIP-L and T5-XXL (FLUX.1), Qwen3-4B / 8B or Mistral
Small 3.1 (FLUX.2), Gemma-3 12B (LTX-2).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ditax.plan.measure import HOST_LINK_BYTES_PER_S

#: :func:`ditax.plan.measure.device_peak`'s numbers, which each phase passes on
DEVICE_PEAK_KEYS = ("device_buffer_bytes", "device_temp_bytes", "device_peak_bytes")


# -- text ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TextLM:
    """A transformer text encoder by its published sizes, for its bytes without building it:
    ``vocab`` x ``width`` embeddings, ``layers`` blocks of ``heads`` query / ``kv_heads``
    key-value heads of ``head_dim``, an MLP of ``mlp`` (``gated``: gate, up and down; else
    in and out, with biases), ``positions`` learned positions (CLIP's 77: its token count
    too), ``all_hidden``: the call returns every layer's hidden states (a decoder LM read
    at several layers: FLUX.2, LTX-2)."""

    vocab: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    dtype: str = "bfloat16"
    gated: bool = True
    positions: int = 0
    all_hidden: bool = True

    @property
    def d_model(self) -> int:
        return self.width

    def linear_shapes(self) -> list[tuple[int, int]]:
        """``(in, out)`` of one block's linears (what 8-bit loading stores in 8 bits)."""
        d, q, kv = self.width, self.heads * self.head_dim, self.kv_heads * self.head_dim
        mlp = [(d, self.mlp)] * (2 if self.gated else 1) + [(self.mlp, d)]
        return [(d, q), (d, kv), (d, kv), (q, d)] + mlp


# the published text encoders of each family, by the text width its transformer reads
# (Qwen3-4B / 8B, Mistral Small 3.1's language model, Gemma-3 12B, CLIP ViT-L/14's text)
_QWEN3 = dict(vocab=151_936, layers=36, heads=32, kv_heads=8, head_dim=128)
PUBLISHED_TEXT = {
    "Qwen3-4B": TextLM(width=2560, mlp=9728, **_QWEN3),
    "Qwen3-8B": TextLM(width=4096, mlp=12_288, **_QWEN3),
    "Mistral-Small-3.1": TextLM(vocab=131_072, width=5120, layers=40, heads=32, kv_heads=8,
                                head_dim=128, mlp=32_768),
    "Gemma-3-12B": TextLM(vocab=262_208, width=3840, layers=48, heads=16, kv_heads=8,
                          head_dim=256, mlp=15_360),
    "CLIP-L": TextLM(vocab=49_408, width=768, layers=12, heads=12, kv_heads=12, head_dim=64,
                     mlp=3072, gated=False, positions=77, all_hidden=False),
}


def text_configs(family, dtype: str):
    """``[(name, encoder config)]`` of a family's prompt encoders (the published sizes: a
    T5 config, or a :class:`TextLM`), or None for a family whose encoders this report does
    not model, or a model whose text width is not a published encoder's (a small test
    model's encoder is its own)."""
    from ditax.models.encoders.t5 import T5Config
    from ditax.models.encoders.umt5 import UMT5Config

    lm = {k: dataclasses.replace(v, dtype=dtype) for k, v in PUBLISHED_TEXT.items()}
    d = family.text_dim
    if family.name == "wan":
        found = [("UMT5-XXL", UMT5Config(dtype=dtype))]
    elif family.name == "flux":
        found = [("CLIP-L", lm["CLIP-L"]), ("T5-XXL", T5Config(dtype=dtype))]
    elif family.name == "flux2":     # three hidden states stacked: 3 x the LM's width
        found = [(k, lm[k]) for k in ("Qwen3-4B", "Qwen3-8B", "Mistral-Small-3.1")
                 if 3 * lm[k].width == d][:1] or None
        return found
    elif family.name == "ltx2":      # Gemma-3's hidden states, through the connectors
        found = [("Gemma-3-12B", lm["Gemma-3-12B"])]
        return found if getattr(family.model, "caption_channels", None) == 3840 else None
    else:
        return None
    return found if found[-1][1].d_model == d else None


def _lm_bytes(c: TextLM, quantize: str) -> int:
    """A :class:`TextLM`'s weights: every tensor in ``c.dtype``, the block linears 8-bit plus
    a float32 scale per output channel under ``quantize`` (embeddings and norms as they are)."""
    item = jnp.dtype(c.dtype).itemsize
    lin = c.linear_shapes()
    per = sum(i * o for i, o in lin)
    rest = (c.vocab + c.positions) * c.width + c.width + c.layers * (
        4 * c.width + (0 if c.gated else sum(o for _, o in lin)))      # norms (+ biases)
    if quantize == "none":
        return (rest + c.layers * per) * item
    return rest * item + c.layers * (per + 4 * sum(o for _, o in lin))


def encoder_bytes(enc_cfg, quantize: str = "none") -> int:
    """Bytes of a text encoder's weights: a :class:`TextLM`'s from its sizes; a T5 / UMT5
    encoder's from the abstract module, with every block linear 8-bit plus its float32 scales
    under ``quantize`` (as :func:`~ditax.models.encoders.t5.load_encoder` loads it); nothing
    is allocated."""
    if isinstance(enc_cfg, TextLM):
        return _lm_bytes(enc_cfg, quantize)
    from flax import nnx

    from ditax.models.encoders.t5 import T5Encoder, _Dense

    enc = nnx.eval_shape(lambda: T5Encoder(enc_cfg, rngs=nnx.Rngs(0)))
    if quantize != "none":
        for _, module in nnx.iter_modules(enc):
            if isinstance(module, _Dense):
                module.make_8bit(quantize)
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(nnx.state(enc)))


def encoder_activation_bytes(enc_cfg, prompts: int, tokens: int) -> int:
    """Analytic activation bytes of one encoder layer on ``prompts`` x ``tokens``: the hidden
    state, q / k / v / output and the gated MLP's two inner tensors in the compute dtype, and
    the float32 attention scores with their softmax — what is live at a layer's widest point;
    a :class:`TextLM` that returns every layer's hidden states keeps them all besides."""
    act = jnp.dtype(enc_cfg.dtype).itemsize
    if isinstance(enc_cfg, TextLM):       # CLIP reads its own 77 tokens
        c = enc_cfg
        tokens = c.positions or tokens
        kept = (c.layers + 1) * prompts * tokens * c.width * act if c.all_hidden else 0
        widest = prompts * tokens * (2 * c.width + sum(o for _, o in c.linear_shapes())
                                     + c.mlp) * act
        return int(kept + widest + 2 * prompts * c.heads * tokens * tokens * 4)
    inner = enc_cfg.num_heads * enc_cfg.d_kv
    hidden = prompts * tokens * (2 * enc_cfg.d_model + 4 * inner + 2 * enc_cfg.d_ff) * act
    scores = 2 * prompts * enc_cfg.num_heads * tokens * tokens * 4
    return int(hidden + scores)


# -- denoise ---------------------------------------------------------------------------------

def with_model(cfg, **model_fields):
    """``cfg`` with ``model_fields`` replaced in its model config."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model_fields))


def param_split(cfg, mesh) -> tuple[int, int]:
    """``(device, host)`` bytes per device of the transformer's parameters under ``cfg`` (its
    ``model.offload`` and ``model.quantize``), from the abstract model: nothing compiles."""
    from flax import nnx

    from ditax.models.base import model_family
    from ditax.plan.core import _quantize

    family = model_family(cfg.model, cfg.attention)
    model = family.abstract(mesh)
    _quantize(cfg.model, model, list(mesh.devices.flat))
    state = nnx.state(model)
    dev = host = 0
    for leaf, s in zip(jax.tree.leaves(state), jax.tree.leaves(family.param_shardings(state,
                                                                                      mesh))):
        n = int(np.prod(s.shard_shape(leaf.shape))) * jnp.dtype(leaf.dtype).itemsize
        if s.memory_kind == "pinned_host":
            host += n
        else:
            dev += n
    return dev, host


def denoise(cfg, mesh, chip, *, latent=None, batch: int = 1, full_layers=None) -> dict:
    """One denoising step's forward compiled for ``mesh`` (see the module docstring), scaled
    from ``cfg.model.num_layers`` compiled layers to ``full_layers`` when given."""
    from ditax.plan.core import plan

    p = plan(cfg, mesh, latent, True, chip=chip, batch=batch)
    f = p["forward"]
    n = cfg.model.num_layers
    if "error" in f:       # XLA itself refused: more than the chip holds
        whole = with_model(cfg, num_layers=full_layers) if full_layers else cfg
        dev, host = param_split(whole, mesh)
        return {"fits": False, "compiled_layers": n, "layers": full_layers or n,
                "error": f["error"], "device_param_bytes": dev, "host_param_bytes": host}
    r = f["roofline"]
    out = {"compiled_layers": n, "latent": f["latent"], "peak_bytes": f["peak_bytes"],
           **{k: f[k] for k in DEVICE_PEAK_KEYS}, "temp_bytes": f["temp_bytes"],
           "device_argument_bytes": f["argument_bytes"],
           "host_argument_bytes": f["host_argument_bytes"],
           "host_to_device_bytes": f["host_to_device_bytes"], "compute_s": r["compute_s"],
           "hbm_s": r["hbm_s"], "compile_s": f["compile_s"]}
    dev_n, host_n = param_split(cfg, mesh)
    out["device_param_bytes"], out["host_param_bytes"] = dev_n, host_n
    # each offloaded layer copied in once, and the prefetch's k layers once more: what the
    # layer loop should stream; a program that copies more (a whole stacked array brought in
    # per layer) breaks the per-layer scaling below, which says so
    k = getattr(cfg.model, "offload_prefetch", 0)
    expected = host_n * (n + k) / n if n else 0
    out["streams_each_layer_once"] = f["host_to_device_bytes"] <= expected * 1.001 + 1
    if full_layers and full_layers != n:
        from ditax.models.base import model_family

        full = with_model(cfg, num_layers=full_layers)
        dev_f, host_f = param_split(full, mesh)
        shape = tuple(f["latent"][1:])
        T = cfg.sample.max_sequence_length
        ratio = (model_family(full.model).flops_per_sample(shape, T)
                 / model_family(cfg.model).flops_per_sample(shape, T))
        out.update(scaled_from_layers=n, compiled_layers=n, layers=full_layers,
                   peak_bytes=f["peak_bytes"] + dev_f - dev_n,
                   device_buffer_bytes=f["device_buffer_bytes"] + dev_f - dev_n,
                   device_peak_bytes=f["device_peak_bytes"] + dev_f - dev_n,
                   device_argument_bytes=f["argument_bytes"] + dev_f - dev_n,
                   host_argument_bytes=f["host_argument_bytes"] + host_f - host_n,
                   host_to_device_bytes=f["host_to_device_bytes"] + host_f - host_n,
                   compute_s=r["compute_s"] * ratio, hbm_s=r["hbm_s"] * ratio,
                   device_param_bytes=dev_f, host_param_bytes=host_f)
        if not out["streams_each_layer_once"]:
            out["scaling"] = (f"unreliable: the {n}-layer program copies "
                              f"{f['host_to_device_bytes'] / max(expected, 1):.2f}x the "
                              f"offloaded layers' bytes from the host; compile every layer")
    else:
        out["layers"] = n
    out["host_s"] = out["host_to_device_bytes"] / HOST_LINK_BYTES_PER_S
    out["host_over_compute"] = out["host_s"] / out["compute_s"] if out["compute_s"] else None
    # both bounds: the copies hidden behind compute (the prefetch's aim), or not at all (the
    # v6e programs compiled here issue the next block's copy after this block's compute)
    out["step_s_overlapped"] = max(out["host_s"], out["compute_s"], out["hbm_s"])
    out["step_s_serial"] = out["host_s"] + max(out["compute_s"], out["hbm_s"])
    return out


# -- decode ----------------------------------------------------------------------------------

def decode(cfg, mesh, vae_cfg=None) -> dict:
    """The Wan VAE's later-frame decode program (``[1, 1, Y, X, z]`` latents → its frames, the
    feature cache carried and donated) compiled on ``mesh``'s first device at the config's
    ``sample`` size; ``vae_cfg`` defaults to ``model.vae``'s (:func:`~ditax.models.vae.wan.
    config.vae_preset`)."""
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from ditax.models.vae.wan import WanVAE
    from ditax.models.vae.wan.chunks import decode_chunk
    from ditax.models.vae.wan.config import vae_preset
    from ditax.parallel.platform import target_platform
    from ditax.plan.measure import compile_timed, memory

    vae_cfg = vae_cfg or vae_preset(getattr(cfg.model, "vae", "wan2.1"))
    dt = jnp.dtype(cfg.model.dtype)
    s = cfg.sample
    sf = vae_cfg.spatial_factor
    y, x = s.height // sf, s.width // sf
    vae = nnx.eval_shape(lambda: WanVAE(vae_cfg, dtype=dt, rngs=nnx.Rngs(0)))
    gdef, state = nnx.split(vae)
    weights = sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize
                  for a in jax.tree.leaves(state))
    one = Mesh(np.array(list(mesh.devices.flat)[:1]), ("d",))
    rep = NamedSharding(one, P())
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), state)
    chunk = jax.ShapeDtypeStruct((1, 1, y, x, vae_cfg.z_dim), dt, sharding=rep)
    with target_platform(one.devices.flat[0].platform):
        first = decode_chunk.lower(gdef, state, chunk, None, first=True)
        lowered = decode_chunk.lower(gdef, state, chunk, first.out_info[1], first=False)
        try:
            compiled, secs = compile_timed(lowered)
        except Exception as e:  # XlaRuntimeError; its type is not public API
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            return {"method": "compiled", "latent_chunk": [1, 1, y, x, vae_cfg.z_dim],
                    "vae_weight_bytes": weights, "error": str(e).strip().splitlines()[0]}
    m = memory(compiled)
    return {"method": "compiled", "latent_chunk": [1, 1, y, x, vae_cfg.z_dim],
            "frames_per_clip": vae_cfg.temporal_factor, "vae_weight_bytes": weights,
            "peak_bytes": m["peak_bytes"], "temp_bytes": m["temp_bytes"],
            **{k: m[k] for k in DEVICE_PEAK_KEYS},
            "compile_s": round(secs, 2)}


def vae_weight_bytes(cfg, vae_cfg=None) -> int:
    """Bytes of the Wan VAE's weights in ``model.dtype`` (abstract; nothing compiles)."""
    from flax import nnx

    from ditax.models.vae.wan import WanVAE
    from ditax.models.vae.wan.config import vae_preset

    vae_cfg = vae_cfg or vae_preset(getattr(cfg.model, "vae", "wan2.1"))
    dt = jnp.dtype(cfg.model.dtype)
    vae = nnx.eval_shape(lambda: WanVAE(vae_cfg, dtype=dt, rngs=nnx.Rngs(0)))
    return sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize
               for a in jax.tree.leaves(nnx.state(vae)))


__all__ = ["PUBLISHED_TEXT", "TextLM", "decode", "denoise", "encoder_activation_bytes",
           "encoder_bytes", "param_split", "text_configs", "vae_weight_bytes", "with_model"]
