"""The weight folders of a random pipeline folder (``ditax init-random``,
``python -m ditax.recipes.random_pipeline``): what each holds and how it is drawn and written.

A :class:`Part` is one component folder (``transformer/``, ``vae/``, ``text_encoder/`` ...):
its ``config.json`` and the ``(key, shape)`` of every tensor in the upstream (diffusers /
transformers) layout. The keys and shapes come from ditax's own conversion table of the
component (:mod:`ditax.io.convert`, the table its loader reads) applied to the abstract module
(``nnx.eval_shape``: no weights are made by JAX) — :func:`module_part` — so what is written is
exactly what ditax's loader checks for, and what diffusers' names are.

Each tensor is drawn by numpy (its own generator, seeded from the seed and its key: the folder
does not depend on the thread count or the order), uniform with the standard deviation
``1/sqrt(fan_in)`` (biases 0, norm gains and other vectors 1), so activations stay finite
through every block; tensors are drawn on every core and written one at a time into
safetensors files (a file per ``SHARD_BYTES``, an index past one), so host memory stays near
a few tensors.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import zlib

import numpy as np

SHARD_BYTES = 2 * 2**30
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


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
        return self.params * np.dtype(numpy_dtype(self.dtype)).itemsize


def numpy_dtype(name: str):
    import ml_dtypes

    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def upstream_tensors(table, abstract) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``(upstream key, upstream shape)`` of every row of ``table`` (a stacked row: one per
    layer), from the abstract module ``abstract``'s variable shapes (parameters and the
    buffers a checkpoint holds)."""
    from flax import nnx

    from ditax.io.convert import param_shapes

    shapes = param_shapes(nnx.state(abstract))
    out = []
    for row in table.rows:
        ours = shapes[row.path][1:] if row.stacked else shapes[row.path]
        theirs = tuple(int(n) for n in row.transform.theirs_shape(tuple(ours)))
        out += [(key, theirs) for key in table.names(row)]
    return tuple(out)


def module_part(name: str, config: dict, make, table_of, dtype: str,
                stem: str = "diffusion_pytorch_model") -> Part:
    """The :class:`Part` ``name`` of the module ``make()`` builds (abstractly) and of its
    table ``table_of(abstract)``, with ``config`` as its ``config.json`` (``stem``: the
    weight files' name: diffusers' ``diffusion_pytorch_model``, transformers' ``model``)."""
    from flax import nnx

    abstract = nnx.eval_shape(make)
    return Part(name, stem, config, upstream_tensors(table_of(abstract), abstract), dtype)


def decoder_lm_part(config: dict, lm, prefix: str, dtype: str) -> Part:
    """The ``text_encoder`` part of a decoder-LM text encoder (Gemma-3, Qwen3, Mistral):
    ``config`` its transformers ``config.json``, ``lm`` the
    :class:`~ditax.models.encoders.decoder_lm.config.DecoderLMConfig` ditax reads from it,
    ``prefix`` the key prefix its checkpoint class writes (``model.``,
    ``language_model.model.``)."""
    from flax import nnx

    from ditax.models.encoders.decoder_lm.convert import weight_table
    from ditax.models.encoders.decoder_lm.model import DecoderLM

    return module_part("text_encoder", config, lambda: DecoderLM(lm, rngs=nnx.Rngs(0)),
                       lambda _: weight_table(lm, prefix), dtype, stem="model")


def init_std(key: str, shape: tuple[int, ...]) -> float | None:
    """How a tensor is drawn: None for a constant (biases 0; norm gains and other vectors,
    scalars, the VAE's ``gamma`` — 1), else the standard deviation ``1/sqrt(fan_in)`` (torch
    layout: every axis after the first is an input: Linear ``[out, in]``, Conv ``[O, I, k...]``,
    embedding tables ``[rows, width]``)."""
    if key.endswith(".bias") or key.endswith(".gamma") or len(shape) <= 1:
        return None
    return 1.0 / float(np.sqrt(np.prod(shape[1:], dtype=np.float64)))


def draw(key: str, shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Tensor ``key``: constant or uniform of :func:`init_std`'s deviation, from a generator
    seeded by ``seed`` and the key (the same folder whatever the order or thread)."""
    std = init_std(key, shape)
    if std is None:
        fill = 0.0 if key.endswith(".bias") else 1.0
        return np.full(shape, fill, numpy_dtype(dtype))
    rng = np.random.Generator(np.random.SFC64([seed, zlib.crc32(key.encode())]))
    x = rng.random(shape, dtype=np.float32)
    a = np.float32(std * np.sqrt(3.0))          # U(-a, a) has deviation a / sqrt(3)
    x *= 2 * a
    x -= a
    return x.astype(numpy_dtype(dtype))


def header(tensors, dtype: str) -> bytes:
    """A safetensors header for ``tensors`` (written in this order, back to back), padded
    with spaces to 8 bytes."""
    head, offset = {"__metadata__": {"format": "pt"}}, 0
    item = np.dtype(numpy_dtype(dtype)).itemsize
    for key, shape in tensors:
        n = item * int(np.prod(shape, dtype=np.int64))
        head[key] = {"dtype": DTYPES[dtype], "shape": list(shape),
                     "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def shards(part: Part, limit: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """``part``'s tensors in order, cut into files of at most ``limit`` bytes."""
    item = np.dtype(numpy_dtype(part.dtype)).itemsize
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
            f.write(header(run, part.dtype))
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


__all__ = ["DTYPES", "Part", "SHARD_BYTES", "decoder_lm_part", "draw", "header", "init_std",
           "module_part", "numpy_dtype", "shards", "upstream_tensors", "write_part"]
