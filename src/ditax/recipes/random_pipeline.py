"""A full-size Wan text-to-video pipeline folder with random weights, for machines that cannot
download a real one (benchmarks of speed and memory, not of pictures).

    python -m ditax.recipes.random_pipeline --preset wan2.1-t2v-1.3b --out Wan-1.3B-random
    python -m ditax.recipes.random_pipeline --preset tiny --out tiny-random     # seconds, tests

The folder is what diffusers' ``WanPipeline.save_pretrained`` writes and what ``ditax generate
--model DIR``, ``ditax.load_pipeline(DIR)`` and ``ditax serve --model DIR`` load:
``model_index.json``; ``scheduler/`` (Wan 2.1's UniPC flow-matching config, shift 3);
``transformer/`` (the preset's architecture at its real size under diffusers' keys: the 1.3B
preset is 1,418,996,800 parameters, 2.8 GB in bfloat16); ``vae/`` (the Wan 2.1 VAE's config
and size, or ``--vae small``); ``text_encoder/`` (a UMT5 of the transformer's text width —
umT5-XXL's 4096 for the Wan presets, with its block shape — cut to ``--text-layers`` blocks
and to the tokenizer's vocabulary); ``tokenizer/`` (the shipped demo model's word tokenizer:
offline, every other word is ``<unk>``); ``ditax_sample.json`` (a 4-step student-like call
without classifier-free guidance: ``guidance_scale`` 1, Wan's 512 text tokens) and
``ditax_random.json`` (what is random and what was cut).

The names and layouts come from ditax's own conversion tables (:mod:`ditax.io.convert`, the
table each model's loader reads), applied to the abstract model (``nnx.eval_shape``: no
weights are made by JAX). Each tensor is drawn by numpy (its own generator, seeded from
``--seed`` and its key: the folder does not depend on the thread count), uniform with the
standard deviation ``1/sqrt(fan_in)`` (biases 0, norm gains 1), so activations stay finite
through every block and the VAE; tensors are drawn on every core and written one at a time
into safetensors files (a file per ``SHARD_BYTES``, an index past one), so host memory stays
near a few tensors. The folder is written hidden beside ``--out`` and renamed when complete.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import shutil
import sys
import zlib

import numpy as np

#: presets this recipe builds (text-to-video, one transformer, the Wan 2.1 VAE)
PRESETS = ("tiny", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b")
SHARD_BYTES = 2 * 2**30
SAMPLE = dict(num_inference_steps=4, guidance_scale=1.0, negative_prompt="")
#: Wan 2.1's scheduler/scheduler_config.json (diffusers' UniPC on flow sigmas, shift 3)
SCHEDULER = {"_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.33.0.dev0",
             "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
             "disable_corrector": [], "dynamic_thresholding_ratio": 0.995,
             "final_sigmas_type": "zero", "flow_shift": 3.0, "lower_order_final": True,
             "num_train_timesteps": 1000, "predict_x0": True,
             "prediction_type": "flow_prediction", "rescale_betas_zero_snr": False,
             "sample_max_value": 1.0, "solver_order": 2, "solver_p": None,
             "solver_type": "bh2", "steps_offset": 0, "thresholding": False,
             "timestep_spacing": "linspace", "trained_betas": None, "use_beta_sigmas": False,
             "use_exponential_sigmas": False, "use_flow_sigmas": True,
             "use_karras_sigmas": False}
#: Wan 2.1's vae/config.json (AutoencoderKLWan; its latent statistics are the real ones)
VAE_FULL = {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
            "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
            "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517,
                             1.5508, 0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497,
                             0.2503, -0.2921],
            "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                            3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]}
#: the same factors (8x spatial, 4x temporal) at a fraction of the cost: CPU tests
VAE_SMALL = {**VAE_FULL, "base_dim": 16, "num_res_blocks": 1}
#: umT5-XXL's block shape (Wan's text encoder), without its depth and vocabulary
UMT5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_heads=64,
                relative_attention_num_buckets=32, relative_attention_max_distance=128,
                layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu")
MODEL_INDEX = {"_class_name": "WanPipeline", "_diffusers_version": "0.35.0",
               "boundary_ratio": None, "expand_timesteps": False,
               "scheduler": ["diffusers", "UniPCMultistepScheduler"],
               "text_encoder": ["transformers", "UMT5EncoderModel"],
               "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
               "transformer": ["diffusers", "WanTransformer3DModel"],
               "transformer_2": [None, None], "vae": ["diffusers", "AutoencoderKLWan"]}
_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


@dataclasses.dataclass(frozen=True)
class Part:
    """One weight folder: its subfolder, file stem, ``config.json``, ``(key, shape)`` of every
    tensor in upstream layout, and the dtype they are written in."""

    name: str
    stem: str
    config: dict
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: str

    @property
    def params(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) for _, s in self.tensors)

    @property
    def nbytes(self) -> int:
        return self.params * np.dtype(_numpy_dtype(self.dtype)).itemsize


def _numpy_dtype(name: str):
    import ml_dtypes

    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def upstream_tensors(table, abstract) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``(upstream key, upstream shape)`` of every row of ``table`` (a stacked row: one per
    layer), from the abstract module ``abstract``'s parameter shapes."""
    from flax import nnx

    from ditax.io.convert import param_shapes

    shapes = param_shapes(nnx.state(abstract, nnx.Param))
    out = []
    for row in table.rows:
        ours = shapes[row.path][1:] if row.stacked else shapes[row.path]
        theirs = tuple(int(n) for n in row.transform.theirs_shape(tuple(ours)))
        out += [(key, theirs) for key in table.names(row)]
    return tuple(out)


def transformer_part(preset: str, dtype: str) -> Part:
    from ditax.config import load_config
    from ditax.models.wan.build import abstract_model
    from ditax.models.wan.convert import config_weight_table

    cfg = load_config(preset).model
    return Part("transformer", "diffusion_pytorch_model", cfg.to_diffusers(),
                upstream_tensors(config_weight_table(cfg), abstract_model(cfg)), dtype)


def vae_part(kind: str, dtype: str) -> Part:
    from flax import nnx

    from ditax.models.vae.wan import WanVAE, WanVAEConfig
    from ditax.models.vae.wan.convert import weight_table

    config = {"_class_name": "AutoencoderKLWan", **(VAE_FULL if kind == "full" else VAE_SMALL)}
    cfg = WanVAEConfig.from_diffusers(config)
    abstract = nnx.eval_shape(lambda: WanVAE(cfg, rngs=nnx.Rngs(0)))
    return Part("vae", "diffusion_pytorch_model", config,
                upstream_tensors(weight_table(abstract), abstract), dtype)


def text_config(text_dim: int, layers: int, vocab: int) -> dict:
    """A transformers ``UMT5EncoderModel`` config: umT5-XXL's block shape when the transformer
    reads 4096-wide text (Wan), else a small one of ``text_dim`` (the tiny preset)."""
    shape = UMT5_XXL if text_dim == UMT5_XXL["d_model"] else dict(
        UMT5_XXL, d_model=text_dim, d_kv=16, d_ff=2 * text_dim, num_heads=max(1, text_dim // 16))
    return {"architectures": ["UMT5EncoderModel"], "model_type": "umt5", **shape,
            "num_layers": layers, "vocab_size": vocab, "dense_act_fn": "gelu_new",
            "is_gated_act": True, "tie_word_embeddings": False}


def text_part(text_dim: int, layers: int, vocab: int, dtype: str) -> Part:
    from flax import nnx

    from ditax.models.encoders.t5 import weight_table
    from ditax.models.encoders.umt5 import UMT5Config, UMT5Encoder

    config = text_config(text_dim, layers, vocab)
    cfg = UMT5Config.from_hf(config)
    abstract = nnx.eval_shape(lambda: UMT5Encoder(cfg, rngs=nnx.Rngs(0)))
    return Part("text_encoder", "model", config,
                upstream_tensors(weight_table(cfg), abstract), dtype)


def tokenizer_folder() -> pathlib.Path:
    """The shipped demo model's tokenizer (a word-level T5-style tokenizer, offline)."""
    from ditax.demo import model_path

    return model_path() / "tokenizer"


def tokenizer_vocab(folder) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(pathlib.Path(folder) / "tokenizer.json")).get_vocab_size()


def plan(preset: str, *, text_layers: int = 2, dtype: str = "bfloat16", vae: str | None = None
         ) -> list[Part]:
    """The weight folders of ``preset`` (nothing written, no weights made)."""
    from ditax.config import load_config
    from ditax.errors import ConfigError

    if preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r}: this recipe builds {', '.join(PRESETS)} "
                          f"(text-to-video, one transformer, the Wan 2.1 VAE)")
    if text_layers < 1:
        raise ConfigError(f"--text-layers {text_layers} must be >= 1")
    if dtype not in _DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    vae = vae or ("small" if preset == "tiny" else "full")
    text_dim = load_config(preset).model.text_dim
    return [transformer_part(preset, dtype), vae_part(vae, "float32"),
            text_part(text_dim, text_layers, tokenizer_vocab(tokenizer_folder()), dtype)]


def init_std(key: str, shape: tuple[int, ...]) -> float | None:
    """How a tensor is drawn: None for a constant (biases 0; norm gains — 1-D weights, the
    VAE's ``gamma`` — 1), else the standard deviation ``1/sqrt(fan_in)`` (torch layout:
    every axis after the first is an input: Linear ``[out, in]``, Conv ``[O, I, k...]``,
    embedding tables ``[rows, width]``)."""
    if key.endswith(".bias") or key.endswith(".gamma") or len(shape) == 1:
        return None
    return 1.0 / float(np.sqrt(np.prod(shape[1:], dtype=np.float64)))


def draw(key: str, shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Tensor ``key``: constant or uniform of :func:`init_std`'s deviation, from a generator
    seeded by ``seed`` and the key (the same folder whatever the order or thread)."""
    std = init_std(key, shape)
    if std is None:
        fill = 0.0 if key.endswith(".bias") else 1.0
        return np.full(shape, fill, _numpy_dtype(dtype))
    rng = np.random.Generator(np.random.SFC64([seed, zlib.crc32(key.encode())]))
    x = rng.random(shape, dtype=np.float32)
    a = np.float32(std * np.sqrt(3.0))          # U(-a, a) has deviation a / sqrt(3)
    x *= 2 * a
    x -= a
    return x.astype(_numpy_dtype(dtype))


def _header(tensors, dtype: str) -> bytes:
    """A safetensors header for ``tensors`` (written in this order, back to back), padded
    with spaces to 8 bytes."""
    head, offset = {"__metadata__": {"format": "pt"}}, 0
    item = np.dtype(_numpy_dtype(dtype)).itemsize
    for key, shape in tensors:
        n = item * int(np.prod(shape, dtype=np.int64))
        head[key] = {"dtype": _DTYPES[dtype], "shape": list(shape),
                     "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def shards(part: Part, limit: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """``part``'s tensors in order, cut into files of at most ``limit`` bytes."""
    item = np.dtype(_numpy_dtype(part.dtype)).itemsize
    out, run, used = [], [], 0
    for key, shape in part.tensors:
        n = item * int(np.prod(shape, dtype=np.int64))
        if run and used + n > limit:
            out.append(run)
            run, used = [], 0
        run.append((key, shape))
        used += n
    return out + ([run] if run else [])


def write_part(folder: pathlib.Path, part: Part, seed: int, pool, ahead: int,
               limit: int = SHARD_BYTES):
    """``folder/part.name``: ``config.json`` and the random tensors (drawn on ``pool``, at
    most ``ahead`` tensors ahead of the writer; written in order)."""
    sub = folder / part.name
    sub.mkdir(parents=True)
    runs = shards(part, limit)
    names = ([f"{part.stem}.safetensors"] if len(runs) == 1 else
             [f"{part.stem}-{i + 1:05d}-of-{len(runs):05d}.safetensors"
              for i in range(len(runs))])
    for name, run in zip(names, runs):
        with open(sub / name, "wb") as f:
            f.write(_header(run, part.dtype))
            pending = {}
            for i in range(len(run)):
                for j in range(i, min(i + ahead, len(run))):
                    if j not in pending:
                        pending[j] = pool.submit(draw, *run[j], part.dtype, seed)
                f.write(np.ascontiguousarray(pending.pop(i).result()).reshape(-1)
                        .view(np.uint8))
    if len(runs) > 1:
        (sub / f"{part.stem}.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": part.nbytes},
             "weight_map": {k: n for n, run in zip(names, runs) for k, _ in run}}, indent=2))
    (sub / "config.json").write_text(json.dumps(part.config, indent=2))


def sample_defaults(preset: str, size: tuple[int, int, int] | None) -> dict:
    """``ditax_sample.json``: ``size`` (height, width, frames; default 480x832x81, the tiny
    preset 64x64x5), 4 steps, guidance 1 (off), Wan's 512 text tokens (tiny: 16)."""
    h, w, f = size or ((64, 64, 5) if preset == "tiny" else (480, 832, 81))
    return dict(height=h, width=w, num_frames=f, **SAMPLE,
                max_sequence_length=16 if preset == "tiny" else 512)


def build(out, preset: str, *, text_layers: int = 2, dtype: str = "bfloat16", seed: int = 0,
          vae: str | None = None, size=None, threads: int | None = None, say=print
          ) -> pathlib.Path:
    """Write the random pipeline folder ``out`` (new or empty); returns it."""
    import time

    from ditax.io.outputs import atomic_folder
    from ditax.pipelines.sample_defaults import write_sample_defaults
    from ditax.models.common.single_files import check_out

    out = check_out(out, None)
    parts = plan(preset, text_layers=text_layers, dtype=dtype, vae=vae)
    sample = sample_defaults(preset, size)
    t0 = time.perf_counter()
    threads = threads or os.cpu_count() or 1
    with atomic_folder(out) as tmp, concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for part in parts:
            write_part(tmp, part, seed, pool, ahead=2 * threads)
            say(f"{part.name}: {part.params:,} parameters, {part.nbytes / 1e9:.2f} GB "
                f"({part.dtype}) in {time.perf_counter() - t0:.1f} s")
        shutil.copytree(tokenizer_folder(), tmp / "tokenizer")
        (tmp / "scheduler").mkdir()
        (tmp / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER, indent=2))
        (tmp / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
        write_sample_defaults(tmp, sample)
        (tmp / "ditax_random.json").write_text(json.dumps(note(preset, parts, seed), indent=2))
    say(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    return out


def note(preset: str, parts: list[Part], seed: int) -> dict:
    """``ditax_random.json``: what the folder is, and where it differs from the real model."""
    text = next(p for p in parts if p.name == "text_encoder").config
    return {"what": f"random weights in the shape of {preset} (python -m "
                    f"ditax.recipes.random_pipeline): for speed and memory measurements; the "
                    f"videos are noise",
            "preset": preset, "seed": seed,
            "init": "uniform, deviation 1/sqrt(fan_in); biases 0, norm gains 1",
            "parameters": {p.name: p.params for p in parts},
            "text_encoder": f"UMT5 cut to {text['num_layers']} of umT5-XXL's 24 blocks and to "
                            f"the tokenizer's {text['vocab_size']} tokens (of 256,384); width "
                            f"{text['d_model']} as the transformer reads",
            "tokenizer": "the ditax demo model's word tokenizer (other words are <unk>); "
                         "prompts are padded to max_sequence_length as Wan's",
            "vae": "the Wan 2.1 VAE's config" if parts[1].config["base_dim"] == 96 else
                   "a small VAE with Wan 2.1's factors (not its size)"}


def parse_size(text: str) -> tuple[int, int, int]:
    try:
        h, w, f = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HEIGHTxWIDTHxFRAMES, e.g. "
                                         f"480x832x81") from None
    return h, w, f


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ditax.recipes.random_pipeline",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="wan2.1-t2v-1.3b", choices=PRESETS)
    p.add_argument("--out", required=True, help="the pipeline folder to write (new or empty)")
    p.add_argument("--text-layers", type=int, default=2, help="UMT5 blocks (umT5-XXL: 24)")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(_DTYPES),
                   help="transformer and text encoder weights (the VAE: float32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vae", choices=("full", "small"), default=None,
                   help="full: Wan 2.1's VAE (default); small: its factors, base_dim 16 "
                        "(default for --preset tiny)")
    p.add_argument("--size", type=parse_size, default=None, metavar="HxWxF",
                   help="ditax_sample.json's height, width, frames (480x832x81; tiny 64x64x5)")
    p.add_argument("--threads", type=int, default=None, help="drawing threads (all cores)")
    p.add_argument("--dry-run", action="store_true",
                   help="print each part's tensors, parameters and bytes; write nothing")
    a = p.parse_args(argv)
    from ditax.errors import DitaxError

    try:
        if a.dry_run:
            for part in plan(a.preset, text_layers=a.text_layers, dtype=a.dtype, vae=a.vae):
                print(json.dumps({"part": part.name, "tensors": len(part.tensors),
                                  "parameters": part.params, "bytes": part.nbytes,
                                  "dtype": part.dtype}))
            return 0
        build(a.out, a.preset, text_layers=a.text_layers, dtype=a.dtype, seed=a.seed,
              vae=a.vae, size=a.size, threads=a.threads)
    except DitaxError as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
