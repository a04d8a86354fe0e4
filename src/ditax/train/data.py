"""Training data: precomputed latents + text embeddings, read with grain, per host, resumable.

Dataset format (written by ``ditax preprocess`` or
:class:`~ditax.train.data_writer.DatasetWriter`): a folder with

- ``meta.json``: ``{"format": "ditax-latents", "version": 1, "num_samples": N,
  "latent_shape": [C, F, Y, X], "text_shape": [T, Dt], "files": [...]}``
- ArrayRecord files; a record is a safetensors-serialised dict ``{"latents": [C, F, Y, X],
  "text": [T, Dt], "text_mask": uint8 [T]}`` (one video) plus the family's condition entries
  (``meta.json`` ``"condition"`` lists them and their shapes; Wan I2V: ``condition`` ``[tf + z,
  F, Y, X]`` mask and latents, Wan 2.1 also ``image`` ``[S, Di]`` CLIP features). All samples
  share one latent shape (one resolution bucket), so batches stack.

A bucketed dataset (``ditax preprocess --buckets`` / ``--bucket-area``) is ``meta.json``
version 2: several shapes, one subfolder of ArrayRecord files per bucket, the same record
format; ``"buckets": [{"name": "832x480x81", "width", "height", "frames", "latent_shape",
"num_samples", "files", "condition"?}, ...]`` plus ``text_shape``, ``files`` (all), ``null_text``,
``resize``, ``bucket_policy``, ``skipped``, ``model``, ``num_processes``. :func:`read_meta` reads
both versions; :func:`dataset_buckets` gives the buckets of either (v1: one).

Iteration order does not depend on the number of processes: the global stream is a
per-epoch shuffle of the records (grain ``MapDataset``), cut into per-process chunks of
``batch_size / process_count`` samples; global batch ``k`` is chunks ``k·P … k·P+P-1`` and
process ``p`` reads only chunk ``k·P+p``. So 2 processes × 4 devices see exactly the batches of
1 process × 8 devices, and the iterator state (``{"next_index": k}``) is the same number on
every process, which makes it safe to save once in the checkpoint.

A bucketed dataset's stream (:mod:`ditax.train.bucket_data`) keeps those properties with one
bucket a batch: global batch ``k``'s bucket is a draw from the bucket weights
(``data.bucket_weights``, by default the buckets' sample counts) seeded by ``(seed, k //
1024)``; if it is bucket ``b``'s ``j``-th batch it holds records ``j·B … (j+1)·B-1`` of ``b``'s
own per-epoch shuffled stream (its shuffle and text dropout seeded by the seed and the bucket's
name), process ``p`` reading ``j·B + p·B/P …``; the state is still ``{"next_index": k}`` (the
per-bucket positions are replayed from the draws). A bucket smaller than the batch repeats
records within a batch (from two reshuffled epochs of its stream). A version-1 dataset and the
synthetic source keep the single-shape stream above, unchanged.
"""

from __future__ import annotations

import pathlib

import grain
import numpy as np

from ditax.config import Config, ConfigError
from ditax.models.base import model_family

FORMAT = "ditax-latents"
VERSION = 1           # one shape (what DatasetWriter writes)
BUCKETED_VERSION = 2  # several shapes, one folder a bucket (BucketWriter, ditax preprocess --buckets)
NULL_TEXT = "null_text.safetensors"


class DataError(ValueError):
    """The dataset is missing, malformed or does not fit the model; the message says why."""


class DataSourceError(DataError, ConfigError):
    """``data.source`` names no usable dataset (missing, a file, no or unreadable
    ``meta.json``, another format, samples that do not fit the model): a config mistake, so
    a :class:`~ditax.errors.DitaxError` (exit 2), found before anything compiles."""


def latent_shape_for(cfg: Config) -> tuple[int, ...]:
    """Latent ``[C, F, Y, X]`` of a ``data.num_frames × height × width`` video (the model
    family's video encoder decides; Wan: 4k+1 frames, multiples of 8)."""
    d = cfg.data
    try:
        return model_family(cfg.model).latent_shape(d.num_frames, d.height, d.width)
    except ConfigError as e:
        raise ConfigError(f"data.num_frames / height / width = {d.num_frames} / {d.height} / "
                          f"{d.width}: {e}") from None


# ----------------------------------------------------------------------------------------------
# sources


class SyntheticSource:
    """Random latents / text, a pure function of ``(seed, index)`` (grain random-access source).
    ``condition_shapes``: extra random entries (an image-to-video model's condition)."""

    def __init__(self, latent_shape, text_shape, seed: int = 0, size: int = 1 << 16,
                 condition_shapes=None):
        self.latent_shape = tuple(latent_shape)
        self.text_shape = tuple(text_shape)
        self.seed = seed
        self.size = size
        self.condition_shapes = dict(condition_shapes or {})

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng((self.seed, int(i)))
        n_text = int(r.integers(1, self.text_shape[0] + 1))
        mask = (np.arange(self.text_shape[0]) < n_text).astype(np.uint8)
        text = r.standard_normal(self.text_shape, np.float32) * mask[:, None]
        out = {"latents": r.standard_normal(self.latent_shape, np.float32),
               "text": text.astype(np.float32), "text_mask": mask}
        for k, shape in self.condition_shapes.items():
            out[k] = r.standard_normal(shape, np.float32)
        return out

    def __repr__(self):
        return f"SyntheticSource(latents={self.latent_shape}, text={self.text_shape})"


def _decode(record: bytes) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    d = load(record)
    out = {k: v.astype(np.float32) for k, v in d.items()}   # latents, text, condition entries
    out["text_mask"] = d["text_mask"].astype(np.uint8)
    return out


def read_meta(path) -> dict:
    """``meta.json`` of a dataset folder, with errors that say what to do."""
    from ditax.io.files import path_arg, read_json_object

    p = path_arg(path, "data.source", DataSourceError, "a dataset folder written by `ditax "
                 "preprocess`, or data.source=synthetic for a smoke run")
    if not p.exists():
        raise DataSourceError(f"data.source={str(path)!r} does not exist; give a dataset folder "
                              f"written by `ditax preprocess`, or data.source=synthetic for a "
                              f"smoke run")
    if not p.is_dir():
        raise DataSourceError(f"data.source={str(path)!r} is a file, not a dataset folder; give "
                              f"the folder `ditax preprocess` wrote (the one holding meta.json)")
    if not (p / "meta.json").is_file():
        raise DataSourceError(f"data.source={str(path)!r} has no meta.json, so it is not a ditax "
                              f"latent dataset; create one with `ditax preprocess VIDEOS_DIR "
                              f"{path}`")
    meta = read_json_object(p / "meta.json", what="dataset meta.json", error=DataSourceError,
                            fix="re-run `ditax preprocess`")
    version = meta.get("version")
    if (meta.get("format") != FORMAT or isinstance(version, bool)
            or version not in (VERSION, BUCKETED_VERSION)):
        raise DataSourceError(f"{p}/meta.json: format {meta.get('format')!r} "
                              f"v{meta.get('version')} is not {FORMAT!r} v{VERSION} or "
                              f"v{BUCKETED_VERSION}; re-run `ditax preprocess`")
    damaged = "(damaged or hand-edited); re-run `ditax preprocess`"
    files, n = meta.get("files"), meta.get("num_samples")
    shapes = [meta.get("text_shape")]
    if meta["version"] == VERSION:
        shapes.append(meta.get("latent_shape"))
    if not (_str_list(files) and _count(n) and all(map(_shape, shapes))):
        raise DataSourceError(f"{p}/meta.json lacks a valid files / num_samples / latent_shape "
                              f"/ text_shape entry {damaged}")
    if meta["version"] == BUCKETED_VERSION:
        _check_buckets(meta, p, damaged)
    missing = [f for f in files if not (p / f).is_file()]
    if missing:
        raise DataSourceError(f"dataset {p}: files listed in meta.json are missing: {missing}; "
                              f"re-run `ditax preprocess`")
    if n < 1:
        raise DataSourceError(f"dataset {p} is empty (num_samples={n}); re-run `ditax "
                              f"preprocess` on a folder of captioned videos")
    return meta


def _str_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(f, str) for f in v)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shape(v) -> bool:
    return isinstance(v, list) and bool(v) and all(_count(d) and d > 0 for d in v)


def _check_buckets(meta: dict, p: pathlib.Path, damaged: str) -> None:
    """A version-2 ``meta.json``'s buckets: a non-empty list; names unique; width, height,
    frames, num_samples (>= 1) positive integers; latent_shape ``[C, F, Y, X]``; files that
    exist; counts that sum to ``num_samples``; ``files`` every bucket's files."""
    buckets = meta.get("buckets")
    if not isinstance(buckets, list) or not buckets:
        raise DataSourceError(f"{p}/meta.json (version 2) has no buckets list {damaged}")
    names = set()
    for i, b in enumerate(buckets):
        ok = (isinstance(b, dict) and isinstance(b.get("name"), str)
              and all(_count(b.get(k)) and b[k] > 0
                      for k in ("width", "height", "frames", "num_samples"))
              and _shape(b.get("latent_shape")) and len(b["latent_shape"]) == 4
              and _str_list(b.get("files")) and b["files"]
              and isinstance(b.get("condition", {}), dict))
        if not ok:
            raise DataSourceError(f"{p}/meta.json: bucket {i} lacks a valid name / width / "
                                  f"height / frames / latent_shape [C, F, Y, X] / num_samples "
                                  f"(>= 1) / files entry {damaged}")
        if b["name"] in names:
            raise DataSourceError(f"{p}/meta.json: bucket {b['name']!r} is listed twice "
                                  f"{damaged}")
        names.add(b["name"])
        missing = [f for f in b["files"] if not (p / f).is_file()]
        if missing:
            raise DataSourceError(f"dataset {p}: files of bucket {b['name']} listed in "
                                  f"meta.json are missing: {missing}; re-run `ditax preprocess`")
    total = sum(b["num_samples"] for b in buckets)
    every = [f for b in buckets for f in b["files"]]
    if total != meta["num_samples"] or every != meta["files"]:
        raise DataSourceError(f"{p}/meta.json: the buckets hold {total} samples in "
                              f"{len(every)} files, the top level says {meta['num_samples']} in "
                              f"{len(meta['files'])} {damaged}")


def dataset_buckets(meta: dict) -> list[dict]:
    """The shape buckets of a dataset's ``meta`` (as :func:`read_meta` returns it), each
    ``{"name", "width", "height", "frames", "latent_shape": [C, F, Y, X], "num_samples",
    "files", "condition": {name: shape}}``, ``files`` relative to the dataset folder, in record
    order. Version 2: its buckets in their order; version 1: one bucket, named
    ``WIDTHxHEIGHTxFRAMES`` from the meta's ``width`` / ``height`` / ``frames`` when present (what
    ``ditax preprocess`` writes), else ``"default"`` (then those three are None)."""
    if meta.get("version") == BUCKETED_VERSION:
        return [{**b, "condition": dict(b.get("condition", {})), "files": list(b["files"])}
                for b in meta["buckets"]]
    size = [meta.get(k) for k in ("width", "height", "frames")]
    known = all(_count(v) and v > 0 for v in size)
    w, h, f = size if known else (None, None, None)
    return [{"name": f"{w}x{h}x{f}" if known else "default", "width": w, "height": h,
             "frames": f, "latent_shape": list(meta["latent_shape"]),
             "num_samples": meta["num_samples"], "files": list(meta["files"]),
             "condition": dict(meta.get("condition", {}))}]


def open_source(cfg: Config):
    """The grain random-access source for ``cfg.data.source`` and its sample shapes."""
    family = model_family(cfg.model)
    text_shape = (cfg.data.text_len, family.text_dim)
    if cfg.data.source == "synthetic":
        lat = latent_shape_for(cfg)
        return SyntheticSource(lat, text_shape, seed=cfg.seed,
                               condition_shapes=family.condition_shapes(lat)), lat, text_shape
    meta = read_meta(cfg.data.source)
    lat, txt = tuple(meta["latent_shape"]), tuple(meta["text_shape"])
    check_condition(meta, family, cfg.data.source)
    check_sample_shapes(lat, txt, family, cfg.data.source)
    p = pathlib.Path(cfg.data.source)
    src = grain.sources.ArrayRecordDataSource([str(p / f) for f in meta["files"]])
    return src, lat, txt


def check_sample_shapes(latent_shape, text_shape, family, where) -> None:
    """The samples' latent channels and text width are the model's, their latent grid on its
    size rule (its patch); ``where`` names the dataset (and a bucketed dataset's bucket) in
    the :class:`DataSourceError`."""
    if latent_shape[0] != family.latent_channels:
        raise DataSourceError(f"dataset {where}: latents have {latent_shape[0]} channels but "
                              f"the {family.name} model takes {family.latent_channels}; "
                              f"preprocess with the model's VAE")
    if text_shape[1] != family.text_dim:
        raise DataSourceError(f"dataset {where}: text embeddings are {text_shape[1]} wide but "
                              f"the {family.name} model takes {family.text_dim}; preprocess "
                              f"with the model's text encoder")
    try:
        family.check_latents(latent_shape, f"dataset {where}", dataset=True)
    except ConfigError as e:
        raise DataSourceError(str(e)) from None


def _preprocess_hint(family) -> str:
    """The fix of a dataset made for another model (the family's folder classes named)."""
    from ditax.models.registry import lookup

    classes = ", ".join(getattr(lookup(family.name), "pipeline_classes", ()))
    return (f"preprocess the videos with a {family.name} pipeline folder of this model's kind"
            f"{f' ({classes})' if classes else ''}: `ditax preprocess VIDEOS OUT --model FOLDER`")


def check_condition(meta: dict, family, source) -> None:
    """The dataset stores the image condition the model trains with (and no other)."""
    want = family.condition_shapes(tuple(meta["latent_shape"]))
    have = {k: tuple(v) for k, v in meta.get("condition", {}).items()}
    missing = [k for k in want if k not in have]
    if "control" in missing:
        raise DataSourceError(f"dataset {source} has no control entries (the control context), "
                              f"which this VACE model (model.vace_layers) trains with; "
                              f"preprocess the videos with a VACE pipeline folder (`ditax "
                              f"preprocess ... --model VACE_FOLDER`)")
    if "control" in have and "control" not in want:
        raise DataSourceError(f"dataset {source} stores VACE control entries, which this model "
                              f"does not take (model.vace_layers is empty); train a VACE model "
                              f"config or use a dataset preprocessed without a VACE folder")
    if missing:
        raise DataSourceError(f"dataset {source} has no {', '.join(missing)} entries, which "
                              f"this {family.name} model trains with; {_preprocess_hint(family)}")
    if extra := [k for k in have if k not in want]:
        raise DataSourceError(f"dataset {source} stores {', '.join(extra)} entries, which this "
                              f"{family.name} model does not take (made for another model); "
                              f"{_preprocess_hint(family)}")
    for k, shape in want.items():
        if k == "condition" and have[k] != shape:
            raise DataSourceError(f"dataset {source}: condition shape {list(have[k])} != the "
                                  f"model's {list(shape)} (mask + latent channels, latent grid)")
        if k == "image" and have[k][-1] != shape[-1]:
            raise DataSourceError(f"dataset {source}: image features {have[k][-1]} wide, "
                                  f"the model's image_dim is {shape[-1]}; preprocess with its "
                                  f"CLIP encoder")
        if k == "control" and have[k] != shape:
            raise DataSourceError(f"dataset {source}: control shape {list(have[k])} != the "
                                  f"model's {list(shape)} (vace_in_channels, the latents' "
                                  f"grid); preprocess with the model's VACE pipeline folder")
        if k not in ("condition", "image", "control") and have[k] != shape:   # e.g. pooled
            raise DataSourceError(f"dataset {source}: {k} shape {list(have[k])} != the "
                                  f"model's {list(shape)}; preprocess with its pipeline folder")


# ----------------------------------------------------------------------------------------------
# iteration


def null_text(cfg: Config, text_shape, needed_by: str | None = None
              ) -> tuple[np.ndarray, np.ndarray, dict]:
    """The empty prompt's ``(text, mask, extra)`` for ``data.text_dropout``: stored by ``ditax
    preprocess`` with the dataset, ``extra`` its further text outputs (Flux: ``pooled``);
    zeros (and no extra) for the synthetic source."""
    if cfg.data.source == "synthetic":
        return np.zeros(text_shape, np.float32), np.zeros(text_shape[:1], np.uint8), {}
    p = pathlib.Path(cfg.data.source) / NULL_TEXT
    if not p.is_file():
        need = needed_by or f"data.text_dropout={cfg.data.text_dropout}"
        off = "distill.guidance=1" if needed_by else "data.text_dropout=0"
        raise DataSourceError(f"{need} needs the empty prompt's embedding, {p}, which this "
                              f"dataset lacks (written by an older `ditax preprocess`); re-run "
                              f"`ditax preprocess` or set {off}")
    from safetensors.numpy import load_file

    d = load_file(str(p))
    extra = {k: v.astype(np.float32) for k, v in d.items() if k not in ("text", "text_mask")}
    return d["text"].astype(np.float32), d["text_mask"].astype(np.uint8), extra


class TextDropout:
    """With probability ``p`` a sample's text becomes the empty prompt's (classifier-free
    guidance training); the draw is grain's per-record generator, so it is a function of the
    seed and the record's position in the stream and a resumed run repeats it."""

    def __init__(self, null, p: float):
        text, mask, extra = null
        self.null = {"text": text, "text_mask": mask, **extra}   # extra: e.g. a pooled vector
        self.p = p

    def __call__(self, sample: dict, rng: np.random.Generator) -> dict:
        if rng.random() < self.p:
            sample = {**sample, **{k: v.copy() for k, v in self.null.items()}}
        return sample


def _stack(samples) -> dict[str, np.ndarray]:
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def _single(sample) -> dict[str, np.ndarray]:
    """A batch of one sample."""
    return _stack([sample])
