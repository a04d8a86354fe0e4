"""Writing a bucketed dataset (``meta.json`` version 2, :mod:`ditax.train.data`): samples of
several shapes, one subfolder of ArrayRecord files per bucket (``OUT/832x480x81/data-*.array_record``),
the record format of version 1; ``meta.json`` lists the buckets in a fixed order, each with its
size, latent shape ``[C, F, Y, X]``, count and files (relative to the dataset folder, in record
order). ``ditax preprocess --buckets`` / ``--bucket-area`` writes it with :class:`BucketWriter`
(one process) or merges the parts of several processes with :func:`bucketed_meta`."""

from __future__ import annotations

import json
import pathlib

from ditax.train.data import BUCKETED_VERSION, FORMAT, DataError
from ditax.train.data_writer import DatasetWriter, save_null_text


class BucketWriter:
    """Append samples of several shapes to a new dataset folder: bucket ``name``'s samples go
    to ``path/name/data-*.array_record`` (a :class:`DatasetWriter` each, same record format).
    ``order``: the bucket names in the order ``meta.json`` lists them (buckets without samples
    are left out). :meth:`summary` gives the buckets as written (files relative to ``path``);
    :meth:`close` writes ``meta.json`` version 2 (:func:`bucketed_meta`)."""

    def __init__(self, path, order, samples_per_file: int = 1024):
        self.path = pathlib.Path(path)
        if (self.path / "meta.json").exists():
            raise DataError(f"{self.path} already holds a dataset (meta.json); choose a new "
                            f"output folder or delete it")
        self.order = list(order)
        self.samples_per_file = samples_per_file
        self.writers: dict[str, DatasetWriter] = {}
        self.sizes: dict[str, tuple[int, int, int]] = {}

    def add(self, bucket, latents, text, text_mask=None, **condition):
        """One sample of ``bucket`` (an object with ``name``, ``width``, ``height``,
        ``frames``): as :meth:`DatasetWriter.add`; every sample of a bucket has one shape."""
        if bucket.name not in self.order:
            raise DataError(f"bucket {bucket.name!r} is not one of {self.order}")
        w = self.writers.get(bucket.name)
        if w is None:
            w = self.writers[bucket.name] = DatasetWriter(self.path / bucket.name,
                                                          self.samples_per_file)
            self.sizes[bucket.name] = (bucket.width, bucket.height, bucket.frames)
        w.add(latents, text, text_mask, **condition)

    @property
    def count(self) -> int:
        return sum(w.count for w in self.writers.values())

    @property
    def text_shape(self):
        return next((list(w.text_shape) for w in self.writers.values()), None)

    def summary(self) -> list[dict]:
        """The buckets written so far, in ``order``: name, width, height, frames,
        latent_shape, num_samples, files (relative to the folder), condition (when any)."""
        out = []
        for name in self.order:
            w = self.writers.get(name)
            if w is None:
                continue
            width, height, frames = self.sizes[name]
            b = {"name": name, "width": width, "height": height, "frames": frames,
                 "latent_shape": list(w.latent_shape), "num_samples": w.count,
                 "files": [f"{name}/{f}" for f in w.files]}
            if w.condition_shapes:
                b["condition"] = w.condition_shapes
            out.append(b)
        return out

    def finish(self) -> list[dict]:
        """Close every bucket's file; :meth:`summary`."""
        for w in self.writers.values():
            w.finish()
        return self.summary()

    def close(self, extra: dict | None = None, null_text=None,
              null_extra: dict | None = None) -> pathlib.Path:
        """Finish and write ``meta.json`` version 2 (``extra``: further entries, e.g.
        ``resize``, ``bucket_policy``, ``skipped``, ``model``); ``null_text`` / ``null_extra``
        as :meth:`DatasetWriter.close`."""
        buckets = self.finish()
        if not buckets:
            raise DataError(f"no samples were written to {self.path}")
        extra = dict(extra or {})
        if null_text is not None:
            extra = {"null_text": save_null_text(self.path, null_text, null_extra), **extra}
        write_meta(self.path, bucketed_meta(buckets, self.text_shape, extra))
        return self.path


def bucketed_meta(buckets: list[dict], text_shape, extra: dict | None = None) -> dict:
    """``meta.json`` version 2 of ``buckets`` (as :meth:`BucketWriter.summary` gives them):
    format, version, num_samples (all buckets), text_shape, buckets, files (every bucket's,
    in order), then ``extra`` (null_text, resize, bucket_policy, skipped, model,
    num_processes)."""
    return {"format": FORMAT, "version": BUCKETED_VERSION,
            "num_samples": sum(b["num_samples"] for b in buckets),
            "text_shape": list(text_shape), "buckets": buckets,
            "files": [f for b in buckets for f in b["files"]], **(extra or {})}


def write_meta(folder, meta: dict) -> pathlib.Path:
    """Write ``folder/meta.json`` atomically (a temporary file renamed over it), so a reader
    never sees half of one and two writers of the same content cannot interleave."""
    from ditax.io.outputs import atomic_file

    path = pathlib.Path(folder) / "meta.json"
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(meta, indent=1))
    return path
