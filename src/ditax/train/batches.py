"""The training loop's batches (:class:`BatchIterator`): a single-shape source's stream
(synthetic, a version-1 dataset; :mod:`ditax.train.data`) or a bucketed dataset's
(:mod:`ditax.train.bucket_data`), per process, resumable. The module docstring of
:mod:`ditax.train.data` describes both streams and why they do not depend on the process count.
It sits above both modules, so neither imports the other's iteration."""

from __future__ import annotations

from typing import Any, Iterator

import grain
import numpy as np

from ditax.config import Config, ConfigError
from ditax.train.bucket_data import open_buckets
from ditax.train.data import (SyntheticSource, TextDropout, _decode, _single, _stack,
                              null_text, open_source)


class BatchIterator:
    """Per-process batches ``{"latents" [b, C, F, Y, X], "text" [b, T, Dt], "text_mask" [b, T]}``.

    ``b = batch_size / process_count``. ``get_state`` / ``set_state`` round-trip the position.
    A bucketed dataset (meta.json version 2, :mod:`ditax.train.bucket_data`) gives batches of
    its buckets' shapes, each batch from one bucket: ``bucket`` names the bucket of the batch
    last returned (None for a single-shape source), ``buckets`` its
    :class:`~ditax.train.bucket_data.BucketedData` (None likewise). ``latent_shapes``: every
    shape the batches can have; ``latent_shape``: the one a single-shape consumer (previews, a
    student's sample settings) assumes, the most drawn bucket's.
    """

    def __init__(self, cfg: Config, process_index: int = 0, process_count: int = 1):
        if cfg.batch_size % process_count:
            raise ConfigError(f"batch_size={cfg.batch_size} is not divisible by the "
                              f"{process_count} processes; use a multiple of {process_count}")
        self.local_batch = cfg.batch_size // process_count
        self.bucket = None
        self.buckets = open_buckets(cfg)       # None: one shape, today's stream unchanged
        if self.buckets is not None:
            self.source = None
            self.latent_shapes = self.buckets.latent_shapes
            self.latent_shape = self.latent_shapes[self.buckets.main]
            self.text_shape = self.buckets.text_shape
            ds = self.buckets.batches(process_index, process_count, self.local_batch)
        else:
            ds = self._single_shape(cfg, process_index, process_count)
            self.latent_shapes = (self.latent_shape,)
        self._iter: Iterator = iter(ds.to_iter_dataset(
            grain.ReadOptions(num_threads=max(1, cfg.data.num_workers), prefetch_buffer_size=2)))

    def _single_shape(self, cfg: Config, process_index: int, process_count: int):
        """The stream of one shape (synthetic, version 1): the records shuffled per epoch,
        batched, every process taking its chunk of each batch."""
        self.source, self.latent_shape, self.text_shape = open_source(cfg)
        ds = grain.MapDataset.source(self.source)
        if cfg.data.shuffle:
            ds = ds.shuffle(seed=cfg.seed)
        ds = ds.repeat(None)
        if not isinstance(self.source, SyntheticSource):
            ds = ds.map(_decode)
        if cfg.data.text_dropout > 0:
            ds = ds.random_map(TextDropout(null_text(cfg, self.text_shape),
                                           cfg.data.text_dropout), seed=cfg.seed)
        if self.local_batch == 1:       # grain's batch(1) of an endless dataset overflows len()
            ds = ds.map(_single)
        else:
            ds = ds.batch(self.local_batch, batch_fn=_stack)
        return ds[process_index::process_count]

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.buckets is None:
            return next(self._iter)
        b, batch = next(self._iter)
        self.bucket = self.buckets.names[b]
        return batch

    def get_state(self) -> dict[str, Any]:
        return self._iter.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self._iter.set_state(state)


__all__ = ["BatchIterator"]
