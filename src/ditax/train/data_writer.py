"""Writing a training dataset (the format :mod:`ditax.train.data` reads): :class:`DatasetWriter`
appends samples of one shape to ArrayRecord files and writes ``meta.json`` last, and the empty
prompt's embedding goes beside them (:func:`save_null_text`) for ``data.text_dropout``.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from ditax.train.data import FORMAT, NULL_TEXT, VERSION, DataError


class DatasetWriter:
    """Append samples to a new dataset folder; ``close()`` writes ``meta.json`` last.

    ``meta.json`` appears only when the dataset is complete, so a crashed preprocess leaves a
    folder that the reader refuses with a clear message instead of a silently short dataset.
    """

    def __init__(self, path, samples_per_file: int = 1024):
        from array_record.python.array_record_module import ArrayRecordWriter

        self._writer_cls = ArrayRecordWriter
        self.path = pathlib.Path(path)
        if (self.path / "meta.json").exists():
            raise DataError(f"{self.path} already holds a dataset (meta.json); choose a new "
                            f"output folder or delete it")
        self.path.mkdir(parents=True, exist_ok=True)
        self.samples_per_file = samples_per_file
        self.files: list[str] = []
        self.count = 0
        self._w = None
        self._in_file = 0
        self.latent_shape = self.text_shape = None
        self.condition_shapes: dict | None = None

    def add(self, latents: np.ndarray, text: np.ndarray, text_mask: np.ndarray | None = None,
            **condition):
        """One sample: latents ``[C, F, Y, X]``, text ``[T, Dt]``, mask ``[T]`` (1 = token);
        ``condition``: an image condition's entries (the same names and shapes every sample)."""
        from safetensors.numpy import save

        latents = np.asarray(latents)
        text = np.asarray(text)
        if text_mask is None:
            text_mask = np.ones(text.shape[0], np.uint8)
        if latents.ndim != 4 or text.ndim != 2:
            raise DataError(f"sample shapes latents{latents.shape} text{text.shape}: expected "
                            f"latents [C, F, Y, X] and text [T, Dt]")
        cond = {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in condition.items()}
        shapes = {k: list(v.shape) for k, v in cond.items()}
        if self.latent_shape is None:
            self.latent_shape, self.text_shape = latents.shape, text.shape
            self.condition_shapes = shapes
        elif shapes != self.condition_shapes:
            raise DataError(f"sample {self.count}: condition {shapes} differs from the first "
                            f"sample's {self.condition_shapes}")
        elif latents.shape != self.latent_shape or text.shape != self.text_shape:
            raise DataError(f"sample {self.count}: latents{latents.shape} text{text.shape} differ "
                            f"from the first sample's {self.latent_shape} {self.text_shape}; one "
                            f"dataset holds one resolution / frame count / text length")
        if self._w is None or self._in_file >= self.samples_per_file:
            self._close_file()
            name = f"data-{len(self.files):05d}.array_record"
            self._w = self._writer_cls(str(self.path / name), "group_size:1")
            self.files.append(name)
        self._w.write(save({"latents": np.ascontiguousarray(latents),
                            "text": np.ascontiguousarray(text),
                            "text_mask": np.asarray(text_mask, np.uint8), **cond}))
        self._in_file += 1
        self.count += 1

    def _close_file(self):
        if self._w is not None:
            self._w.close()
            self._w = None
            self._in_file = 0

    def finish(self) -> None:
        """Close the open ArrayRecord file; no ``meta.json`` (:class:`BucketWriter` writes one
        over all its buckets)."""
        self._close_file()

    def close(self, extra: dict | None = None, null_text=None,
              null_extra: dict | None = None) -> pathlib.Path:
        """Finish the dataset. ``null_text``: ``(text [T, Dt], mask [T])``, the embedding of
        the empty prompt (what the pipelines' unconditional branch sees), stored for
        ``data.text_dropout``; ``null_extra``: its further text outputs by name (Flux: the
        pooled vector), which the dropout replaces too."""
        self._close_file()
        if self.count == 0:
            raise DataError(f"no samples were written to {self.path}")
        extra = dict(extra or {})
        if null_text is not None:
            extra["null_text"] = save_null_text(self.path, null_text, null_extra)
        meta = {"format": FORMAT, "version": VERSION, "num_samples": self.count,
                "latent_shape": list(self.latent_shape), "text_shape": list(self.text_shape),
                "files": self.files, **extra}
        if self.condition_shapes:
            meta["condition"] = self.condition_shapes
        (self.path / "meta.json").write_text(json.dumps(meta, indent=1))
        return self.path


def save_null_text(folder, null_text, null_extra: dict | None = None) -> str:
    """Write the empty prompt's ``(text [T, Dt], mask [T])`` and its further text outputs
    (``null_extra``) as ``folder/null_text.safetensors``; returns the file name for meta.json."""
    from safetensors.numpy import save_file

    text, mask = null_text
    save_file({"text": np.asarray(text, np.float32), "text_mask": np.asarray(mask, np.uint8),
               **{k: np.ascontiguousarray(np.asarray(v, np.float32))
                  for k, v in (null_extra or {}).items()}},
              str(pathlib.Path(folder) / NULL_TEXT))
    return NULL_TEXT


__all__ = ["DatasetWriter", "save_null_text"]
