"""Training on a bucketed dataset (``meta.json`` version 2): several latent shapes, each
global batch from one of them.

A bucket is one latent shape ``[C, F, Y, X]`` (one size and frame count) with its own
records. The global stream is a function of the seed only, never of the process count:

- **which bucket** global batch ``k`` comes from is a draw from the bucket weights
  (``data.bucket_weights``, by default the buckets' sample counts), made in blocks of
  :data:`BLOCK` batches by a generator seeded with ``(seed, k // BLOCK)``
  (:class:`BucketDraws`);
- **which records**: batch ``k`` is bucket ``b``'s ``j``-th batch (``j``: how many earlier
  batches came from ``b``) and takes records ``j·B … (j+1)·B-1`` of ``b``'s own endless
  stream: its records shuffled per epoch (grain, a seed of the run's seed and the bucket's
  name), repeated, decoded, text dropout applied with the same seed. Process ``p`` of ``P``
  reads the chunk ``j·B + p·B/P …`` of it, so the processes' batches together are the
  one-process batch.

A bucket smaller than ``batch_size`` repeats records within a batch (its stream runs through
its epochs: a batch may hold one record twice, from two reshuffled epochs); the data is never
padded or mixed across shapes. The iterator state is ``{"next_index": k}`` on every process:
a resume recomputes the per-bucket positions by replaying the draws (cheap: one generator a
block), so it continues bit for bit mid-epoch, across a bucket change.
"""

from __future__ import annotations

import json
import pathlib
import threading
import zlib
from dataclasses import dataclass, field

import grain
import numpy as np

from ditax.config import Config, ConfigError
from ditax.config.training import parse_bucket_weights
from ditax.models.base import model_family
from ditax.train.data import (TextDropout, _decode, _stack, check_condition,
                              check_sample_shapes, dataset_buckets, null_text, read_meta)

#: batches drawn per generator: a resume at step k replays k / BLOCK small draws
BLOCK = 1024
_DRAW_TAG = 0xB0C4E7


@dataclass(frozen=True)
class Bucket:
    """One shape of a bucketed dataset (the meta's entry, checked)."""

    name: str
    latent_shape: tuple[int, ...]
    num_samples: int
    files: tuple[str, ...]
    condition: dict = field(default_factory=dict, compare=False)


# ----------------------------------------------------------------------------------------------
# meta.json version 2


def meta_version(source) -> int | None:
    """The ``version`` of ``source``'s ``meta.json``, or None where there is none to read
    (the single-shape reader then says what is wrong)."""
    try:
        meta = json.loads((pathlib.Path(source) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    v = meta.get("version") if isinstance(meta, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_buckets(source) -> tuple[dict, list[Bucket]]:
    """``(meta, buckets)`` of the dataset at ``source``, validated by
    :func:`~ditax.train.data.read_meta` (names unique, shapes, counts, files present)."""
    meta = read_meta(source)
    return meta, [Bucket(b["name"], tuple(b["latent_shape"]), b["num_samples"],
                         tuple(b["files"]), {k: tuple(v) for k, v in b["condition"].items()})
                  for b in dataset_buckets(meta)]


def check_bucket(bucket: Bucket, text_shape, family, source) -> None:
    """The bucket's samples fit the model: latent channels, text width and condition
    entries (the single-shape dataset's checks, naming the bucket)."""
    where = f"{source} (bucket {bucket.name})"
    check_sample_shapes(bucket.latent_shape, text_shape, family, where)
    check_condition({"latent_shape": list(bucket.latent_shape),
                     "condition": {k: list(v) for k, v in bucket.condition.items()}},
                    family, where)


def bucket_weights(cfg: Config, buckets: list[Bucket], source) -> np.ndarray:
    """The draw weight of each bucket: ``data.bucket_weights`` (buckets it leaves out: 0),
    else the buckets' sample counts. A name the dataset lacks is a :class:`ConfigError` that
    lists the dataset's buckets."""
    given = parse_bucket_weights(cfg.data.bucket_weights)
    if not given:
        return np.asarray([b.num_samples for b in buckets], np.float64)
    names = [b.name for b in buckets]
    unknown = [n for n in given if n not in names]
    if unknown:
        raise ConfigError(f"data.bucket_weights={cfg.data.bucket_weights!r} names "
                          f"{', '.join(unknown)}, which dataset {source} does not hold; its "
                          f"buckets are {', '.join(names)} (NAME:WEIGHT pairs of those)")
    return np.asarray([given.get(n, 0.0) for n in names], np.float64)


# ----------------------------------------------------------------------------------------------
# which bucket, which records


class BucketDraws:
    """Global batch ``k`` → ``(bucket, j)``: the bucket drawn for it and how many earlier
    batches came from that bucket. A pure function of ``(weights, seed, k)``; thread-safe."""

    def __init__(self, weights, seed: int):
        w = np.asarray(weights, np.float64)
        cum = np.cumsum(w / w.sum())
        cum[-1] = 1.0
        self._cum = cum
        self.n = len(w)
        self.seed = int(seed)
        self._prefix = [np.zeros(self.n, np.int64)]   # batches of each bucket before block i
        self._lock = threading.Lock()

    def block(self, i: int) -> np.ndarray:
        """The buckets of global batches ``i·BLOCK … (i+1)·BLOCK-1``."""
        u = np.random.default_rng((self.seed, _DRAW_TAG, int(i))).random(BLOCK)
        return np.searchsorted(self._cum, u, side="right").astype(np.int64)

    def _before(self, i: int) -> np.ndarray:
        with self._lock:
            while len(self._prefix) <= i:
                m = len(self._prefix) - 1
                self._prefix.append(self._prefix[m] + np.bincount(self.block(m),
                                                                  minlength=self.n))
            return self._prefix[i]

    def __call__(self, k: int) -> tuple[int, int]:
        i, r = divmod(int(k), BLOCK)
        d = self.block(i)
        b = int(d[r])
        return b, int(self._before(i)[b] + np.count_nonzero(d[:r] == b))


def _bucket_seed(seed: int, name: str) -> int:
    """The seed of a bucket's shuffle and text dropout: the run's seed and the bucket's name
    (not its position in the list, so adding a bucket leaves the others' streams alone)."""
    return int(np.random.SeedSequence([int(seed), zlib.crc32(name.encode())])
               .generate_state(1)[0] >> 1)


class BucketedData:
    """The buckets of a v2 dataset checked against the model, their weights and record
    streams; :meth:`batches` is the process's batch dataset."""

    def __init__(self, cfg: Config, meta: dict, buckets: list[Bucket]):
        source = cfg.data.source
        family = model_family(cfg.model)
        self.text_shape = tuple(meta["text_shape"])
        for b in buckets:
            check_bucket(b, self.text_shape, family, source)
        self.buckets = buckets
        self.names = tuple(b.name for b in buckets)
        self.weights = bucket_weights(cfg, buckets, source)
        self.draws = BucketDraws(self.weights, cfg.seed)
        # the shape a single-shape consumer assumes (previews, a student's sample settings):
        # the most drawn bucket (the first of equals)
        self.main = int(np.argmax(self.weights))
        dropout = (TextDropout(null_text(cfg, self.text_shape), cfg.data.text_dropout)
                if cfg.data.text_dropout > 0 else None)
        p = pathlib.Path(source)
        self.streams = []
        for b in buckets:
            seed = _bucket_seed(cfg.seed, b.name)
            ds = grain.MapDataset.source(
                grain.sources.ArrayRecordDataSource([str(p / f) for f in b.files]))
            if cfg.data.shuffle:
                ds = ds.shuffle(seed=seed)
            ds = ds.repeat(None).map(_decode)
            if dropout is not None:
                ds = ds.random_map(dropout, seed=seed)
            self.streams.append(ds)

    @property
    def latent_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(b.latent_shape for b in self.buckets)

    def drawn(self) -> list[str]:
        """The names of the buckets that are drawn (weight > 0)."""
        return [n for n, w in zip(self.names, self.weights) if w > 0]

    def batch(self, k: int, process_index: int, process_count: int, local_batch: int):
        """``(bucket index, batch)``: process ``process_index``'s chunk of global batch
        ``k``, records ``j·B + p·b … j·B + (p+1)·b - 1`` of its bucket's stream."""
        b, j = self.draws(k)
        start = (j * process_count + process_index) * local_batch
        stream = self.streams[b]
        return b, _stack([stream[start + i] for i in range(local_batch)])

    def batches(self, process_index: int, process_count: int, local_batch: int):
        """The endless ``MapDataset`` of ``(bucket index, local batch)``, element ``k`` the
        process's part of global batch ``k``."""
        import sys

        return grain.MapDataset.range(sys.maxsize).map(
            lambda k: self.batch(k, process_index, process_count, local_batch))


def open_buckets(cfg: Config) -> BucketedData | None:
    """The bucketed data of ``cfg.data.source`` (meta.json version 2), or None for a
    single-shape source (synthetic, version 1), which ``data.bucket_weights`` must not weigh."""
    bucketed = cfg.data.source != "synthetic" and meta_version(cfg.data.source) == 2
    if not bucketed:
        if cfg.data.bucket_weights.strip():
            what = ("the synthetic source" if cfg.data.source == "synthetic"
                    else f"dataset {cfg.data.source} (meta.json version 1)")
            raise ConfigError(f"data.bucket_weights={cfg.data.bucket_weights!r} weighs the "
                              f"buckets of a bucketed dataset (meta.json version 2), but "
                              f"{what} holds one shape; remove data.bucket_weights")
        return None
    meta, buckets = read_buckets(cfg.data.source)
    return BucketedData(cfg, meta, buckets)


__all__ = ["Bucket", "BucketDraws", "BucketedData", "BLOCK", "open_buckets", "read_buckets",
           "meta_version", "bucket_weights", "check_bucket"]
