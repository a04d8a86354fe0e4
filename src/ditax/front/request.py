"""The one request every entry makes: a frozen :class:`Request` = what to load
(:class:`LoadRequest`), the checked pipeline call, and where its result goes (:class:`Output`).

:func:`ditax.front.resolve` builds it from a plain mapping (the CLI's parsed flags, the server's
JSON, a library call's keywords); :func:`ditax.front.open` loads what :class:`LoadRequest`
names. Nothing here reads a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping


def frozen(mapping) -> Mapping:
    """A read-only copy of ``mapping``."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class LoadRequest:
    """What to load and how: ``path`` (the model folder, ``demo`` resolved), ``makes`` (the
    output kind), ``dtype``, ``attention`` (an :class:`~ditax.attention.config.AttentionConfig`),
    ``mesh`` (a :class:`~ditax.config.MeshConfig` the user gave; None: the devices' default),
    ``compile_cache`` (the config value), ``cfg_mode``, ``vae_tiling`` (None: not given),
    ``vae_parallel``, the LoRAs (``loras``: ``((Lora, strength), ...)`` read and checked;
    ``lora_mode``, ``lora_strict``), the text encoders' ``text_quantize`` /
    ``text_offload``, ``precision`` (what the dots and convolutions run at:
    ``model.precision`` resolved), ``model`` (the ``model.*`` overrides given: quantize,
    offload, a transformer field...) and ``family`` (the family's own loader options: a flow
    shift, a sampler, a second expert's LoRAs)."""

    path: str
    makes: str
    dtype: str
    attention: Any
    mesh: Any = None
    compile_cache: Any = "auto"
    cfg_mode: str = "batched"
    vae_tiling: Any = None
    vae_parallel: bool = False
    loras: tuple = ()
    lora_mode: str = "merged"
    lora_strict: bool = True
    text_quantize: str = "none"
    text_offload: str | None = None
    precision: str = "default"
    model: Mapping = field(default_factory=lambda: frozen({}))
    family: Mapping = field(default_factory=lambda: frozen({}))

    def kwargs(self) -> dict:
        """The loader's keyword arguments (:func:`ditax.load_pipeline`'s, beside the path and
        the mesh); also what a family's preflight reads."""
        out = dict(dtype=self.dtype, attention=self.attention, cfg_mode=self.cfg_mode,
                   loras=list(self.loras), lora_mode=self.lora_mode,
                   lora_strict=self.lora_strict, **self.model)
        if self.vae_tiling is not None:   # None: not given, the loader's default
            out["vae_tiling"] = self.vae_tiling
        if self.vae_parallel:
            out["vae_parallel"] = True
        if self.text_quantize != "none":
            out["text_quantize"] = self.text_quantize
        if self.text_offload is not None:
            out["text_offload"] = self.text_offload
        out.update(self.family)
        return out

    def make_mesh(self):
        """The device mesh the request names (None: the loader's default on every device)."""
        if self.mesh is None:
            return None
        from ditax.parallel.mesh import make_mesh

        return make_mesh(self.mesh)


@dataclass(frozen=True)
class Output:
    """Where a result goes: ``path`` (the checked mp4 / PNG path), ``frames_dir`` (PNG frames
    too; None: none), ``fps`` (a video's frame rate; None for an image)."""

    path: str
    frames_dir: str | None = None
    fps: float | None = None


@dataclass(frozen=True)
class Request:
    """A checked request: ``load`` (:class:`LoadRequest`), ``call`` (the pipeline call's keyword
    arguments, every default resolved), ``output`` (:class:`Output`), ``pipelines`` (the
    folder's :class:`~ditax.pipelines.family.PipelineFamily`) and ``lora_sample`` (the
    sampling settings the LoRA files carry; None: none)."""

    load: LoadRequest
    call: Mapping
    output: Output
    pipelines: Any
    lora_sample: Any = None

    @property
    def makes(self) -> str:
        return self.load.makes

    def kwargs(self) -> dict:
        """The pipeline call's keyword arguments (a fresh dict)."""
        return dict(self.call)


__all__ = ["LoadRequest", "Output", "Request", "frozen"]
