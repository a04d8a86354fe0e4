"""``ditax.load_pipeline``: a pipeline folder loaded by the family that reads it.

The folder's ``model_index.json`` ``_class_name`` names the family (the ``pipeline_classes`` of
its :class:`~ditax.models.registry.FamilySpec`, :func:`~ditax.models.registry.spec_for_class`);
that family's pipelines (:class:`~ditax.pipelines.family.PipelineFamily`, registered by
``ditax.pipelines.<family>`` or with :func:`~ditax.pipelines.family.register_pipelines`) load
it, and every family's pipeline samples through the one loop of :mod:`.sampling`. A folder
without a class, a path that is no local folder (a hub id, a typo) or a class no family
claims goes to the default family's loader, which resolves hub ids and names what it takes.
"""

from __future__ import annotations

from types import SimpleNamespace

from ditax.errors import ConfigError
from ditax.models.common.fields import OFFLOAD_MODES, QUANTIZE_MODES, check_quantize
from ditax.models.registry import require
from ditax.pipelines.family import folder_pipelines


def load_pipeline(path, dtype: str = "float32", mesh=None, attention="xla", **options):
    """Load the pipeline folder (or hub id) ``path`` with its family's loader.

    ``dtype``, ``mesh`` (``ditax.make_mesh``) and ``attention`` (a backend name or an
    :class:`~ditax.attention.config.AttentionConfig`) are every family's; ``options`` are the
    family loader's own (Wan: :func:`ditax.pipelines.wan.loading.load_pipeline` — ``cfg_mode``,
    ``scheduler``, ``loras``, ...) and model config fields handed to the transformer's loader,
    e.g. ``quantize="int8" | "fp8"`` and ``quantize_activations=True`` (8-bit block linears,
    :mod:`ditax.nn.quant`; Wan 2.2's two experts both), ``offload="host"`` (the blocks'
    weights streamed from host memory, :mod:`ditax.nn.offload`). ``text_offload="host"`` (the
    default with ``offload="host"``): the text and image encoders' weights kept in host memory
    and put on the device only inside their encode programs, so between prompts the
    transformer has the device's memory to itself. ``vae_parallel=True``: the VAE decode with
    each frame's rows split over ``mesh`` (Wan, FLUX.1; :mod:`ditax.models.vae.parallel`)."""
    if "quantize" in options or "quantize_activations" in options:   # before any file is read
        check_quantize(SimpleNamespace(quantize=options.get("quantize", "none"),
                                       quantize_activations=options.get("quantize_activations",
                                                                        False)))
    _, pipelines = folder_pipelines(path)
    if options.get("quantize", "none") != "none" or options.get("quantize_activations"):
        require(pipelines.name, "quantize", f"quantize={options.get('quantize')!r}",
                "load it without quantize=")
    if options.get("loras") or options.get("loras_2"):
        require(pipelines.name, "lora", "loras=", "load it without loras=")
    if options.get("text_quantize", "none") not in QUANTIZE_MODES:
        raise ConfigError(f"text_quantize={options['text_quantize']!r} is not a quantization "
                          f"mode; use one of {', '.join(QUANTIZE_MODES)}")
    vae_parallel = bool(options.pop("vae_parallel", False))
    if vae_parallel:
        check_vae_parallel(pipelines, mesh, options)
    text_offload = options.pop("text_offload", options.get("offload", "none"))
    if text_offload not in OFFLOAD_MODES:
        raise ConfigError(f"text_offload={text_offload!r}; use one of "
                          f"{', '.join(OFFLOAD_MODES)} (host: the encoders' weights in host "
                          f"memory, on the device only while a prompt is encoded)")
    pipe = pipelines.load(path, dtype=dtype, mesh=mesh, attention=attention, **options)
    if text_offload == "host":
        from ditax.nn.offload import keep_on_host

        for encoder in pipelines.text_encoders(pipe):
            keep_on_host(encoder)
    if vae_parallel:
        pipe.vae_parallel = mesh
    return pipe


def check_vae_parallel(pipelines, mesh, options: dict) -> None:
    """``vae_parallel=True`` (the decode's rows split over the mesh,
    :mod:`ditax.models.vae.parallel`): the family's pipelines have a row-split decode
    (``PipelineFamily.parallel_vae``), there is a mesh of more than one device, and no tiled
    decode was asked too (:class:`ConfigError` naming the fix, before any weights)."""
    if not pipelines.parallel_vae:
        raise ConfigError(f"vae_parallel=True: {pipelines.name} pipelines have no row-split "
                          f"VAE decode; decode on one device or with vae_tiling=True")
    if mesh is None or mesh.size < 2:
        raise ConfigError("vae_parallel=True splits the decode's rows over a mesh's devices; "
                          "pass a mesh of several devices (mesh.fsdp=8, say) or drop it")
    if options.get("vae_tiling"):
        raise ConfigError("vae_parallel=True and vae_tiling=True: choose one (parallel splits "
                          "each frame over the devices; tiling decodes it in pieces on one)")


__all__ = ["load_pipeline"]
