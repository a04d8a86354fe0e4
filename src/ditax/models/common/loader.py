"""The one transformer loader: a family describes what it loads (:class:`TransformerLoader`,
one :class:`Architecture` per ``config.json`` ``_class_name``), and the steps are written once.

``load`` (what every family's ``load_transformer`` is):

1. the config — a diffusers folder's ``config.json`` (the architecture by its
   ``_class_name``) or, for one ``.safetensors`` file, ``config=``; ``dtype`` and the model
   overrides (``remat``, ``quantize`` …) become its fields;
2. the attention option coerced once to an :class:`~ditax.attention.config.AttentionConfig`
   and every rule of the run checked once (the family's ``check_transformer`` with the mesh's
   sizes, then the architecture's own), before anything is built;
3. the module built abstractly (no parameter allocated) with that attention and mesh;
4. its parameters read through the architecture's weight table
   (:func:`ditax.io.convert.load_params`): with a mesh each device reads its own slice
   straight into its ``NamedSharding``; merged LoRAs are folded into each slice as it is
   read, then ``model.quantize`` stores the block linears in 8 bits (:mod:`ditax.nn.quant`);
5. unmerged LoRAs attached as run-time updates (:mod:`ditax.lora.unmerged`);
6. the module wrapped in the architecture's callable (a
   :class:`~ditax.models.common.loaded.LoadedTransformer` with the family's call signature).
"""

from __future__ import annotations

import logging
import pathlib
import time
from dataclasses import dataclass
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention.config import as_attention_config
from ditax.errors import ConfigError, check_choice
from ditax.finite import finite_flags
from ditax.io.convert import load_params, param_shapes
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights, is_single_file
from ditax.models.common.loaded import check_architecture, param_sharding
from ditax.nn import quant
from ditax.nn.offload import streamable
from ditax.parallel.mesh import MESH_AXES, check_mesh_axes

log = logging.getLogger(__name__)

LORA_MODES = ("merged", "unmerged")


@dataclass(frozen=True)
class Architecture:
    """One transformer class a family loads, as data.

    - ``class_name``: its diffusers ``config.json`` ``_class_name``;
    - ``config_class``: its model config (``from_diffusers(raw, **overrides)``); a config of
      this class (or of a subclass no other architecture names) loads as this architecture;
    - ``abstract_model(cfg, attention, mesh)``: the module with shape-only parameters;
    - ``weight_table(cfg)``: the :class:`~ditax.io.convert.Table` its weights are read with;
    - ``param_axes(cfg)``: each parameter's logical axes (its sharding);
    - ``wrapper``: the :class:`~ditax.models.common.loaded.LoadedTransformer` subclass returned;
    - ``check(cfg)``: rules of its own, after the family's ``check_transformer`` (or None).
    """

    class_name: str
    config_class: type
    abstract_model: Callable
    weight_table: Callable
    param_axes: Callable
    wrapper: type
    check: Optional[Callable] = None


def plain_weights(source, cfg, table, shapes):
    """The default ``open_weights``: the source's tensors as stored, read with ``table``."""
    return Weights.open(source), table, None


def check_finite_params(state, source, merged_loras: bool = False) -> None:
    """Every float parameter read from ``source`` is finite (one reduction a tensor, on the
    devices that hold it; on CPU devices, numpy over the shards in place:
    :func:`ditax.finite.finite_flags`); else :class:`~ditax.errors.WeightError` naming the
    first non-finite one — a NaN weight is named at load, not found as a black video."""
    from ditax.errors import WeightError

    floats = [(path, leaf) for path, leaf in
              jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]
              if jnp.issubdtype(leaf.dtype, jnp.floating)]
    if not floats:
        return
    flags = finite_flags([leaf for _, leaf in floats])
    for (path, _), finite in zip(floats, flags):
        if not finite:
            name = ".".join(str(getattr(k, "key", k)) for k in path)
            cause = " (or a merged LoRA at too large a strength)" if merged_loras else ""
            raise WeightError(f"{source}: parameter {name} holds NaN / inf after loading"
                              f"{cause}; the weight file is damaged — re-download or re-save it")


@dataclass(frozen=True)
class TransformerLoader:
    """A family's transformer loader, from its data.

    - ``family``: the family's name in messages;
    - ``architectures``: what its folders may hold (the first names the family in messages);
    - ``check_transformer(cfg, attention, mesh_sizes)``: every rule of a run, checked once;
    - ``single_file_config(path, config, **overrides)``: a single file's config from
      ``config=``;
    - ``lora_names``: the family's LoRA key formats (:class:`~ditax.lora.LoraNames`);
    - ``default_class``: the ``_class_name`` of a ``config.json`` that has none (None: such
      a folder is refused);
    - ``open_weights(source, cfg, table, shapes)`` → ``(weights, table to read with, rename)``:
      how a source's tensors are opened (single files with upstream names: renamed tables or
      views; ``rename`` maps a diffusers key to the stored one for LoRA merging);
    - ``describe(cfg)``: the model's size for the load log (``"30 layers, D=1536"``).
    """

    family: str
    architectures: tuple[Architecture, ...]
    check_transformer: Callable
    single_file_config: Callable
    lora_names: object
    describe: Callable
    default_class: Optional[str] = None
    open_weights: Callable = plain_weights

    # -- what a folder or config is -----------------------------------------------------------

    def read_config(self, folder) -> dict:
        """``folder/config.json``, which must name one of the family's architectures."""
        raw = read_model_json(pathlib.Path(folder) / "config.json", "transformer config")
        cls = raw.get("_class_name", self.default_class)
        names = [a.class_name for a in self.architectures]
        if cls not in names:
            others = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
            raise ConfigError(f"{folder}/config.json is a {cls}, not a {names[0]}{others}")
        return raw

    def architecture_of_class(self, class_name: Optional[str]) -> Architecture:
        """The architecture a ``config.json`` ``_class_name`` names (checked by
        :meth:`read_config`)."""
        name = class_name or self.default_class
        return next(a for a in self.architectures if a.class_name == name)

    def architecture(self, cfg) -> Architecture:
        """The architecture of model config ``cfg``: the one whose config class is
        ``cfg``'s nearest (a subclass with no architecture of its own loads as its base's)."""
        by_config = {a.config_class: a for a in self.architectures}
        for cls in type(cfg).__mro__:
            if cls in by_config:
                return by_config[cls]
        raise ConfigError(f"model config {type(cfg).__name__} is no {self.family} transformer; "
                          f"pass a {self.architectures[0].config_class.__name__}")

    def folder_config(self, folder, **overrides):
        """The model config of a transformer folder (its ``config.json``), with
        ``overrides`` (dtypes, remat, quantize …) replacing fields."""
        raw = self.read_config(folder)
        arch = self.architecture_of_class(raw.get("_class_name"))
        return arch.config_class.from_diffusers(raw, **overrides)

    def check_architecture(self, cfg, path) -> pathlib.Path:
        """The transformer folder at ``path`` if its config.json has ``cfg``'s architecture
        (``cfg.same_architecture``: :class:`~ditax.models.common.fields.DiffusersArchitecture`);
        else a :class:`ConfigError` listing every differing field and the ``model.X=...``
        overrides that would match (``init_from``, before anything compiles)."""
        folder = resolve_folder(path, "transformer")
        check_architecture(path, cfg.same_architecture(self.folder_config(folder)))
        return folder

    def check_folder(self, path, subfolder: Optional[str], summary: Callable) -> str:
        """Check a transformer folder from config.json and the safetensors headers only (every
        key present, none unexpected, every shape right) for ``ditax convert``; returns a
        one-line summary (``summary(cfg)``: the model's shape), raises
        :class:`~ditax.errors.WeightError` naming what does not fit."""
        import math

        from ditax.io.convert import check_weights

        folder = resolve_folder(path, subfolder)
        cfg = self.folder_config(folder)
        self.check_transformer(cfg)
        arch = self.architecture(cfg)
        weights = Weights.open(folder)
        shapes = param_shapes(nnx.state(arch.abstract_model(cfg)))
        check_weights(arch.weight_table(cfg), weights, shapes)
        n = sum(math.prod(s) for s in shapes.values())
        return (f"{folder}: OK — {summary(cfg)}, {n / 1e9:.3f} B params, "
                f"{len(weights)} tensors")

    # -- weights ------------------------------------------------------------------------------

    def load_weights_into(self, model_abs, source, cfg, mesh=None, loras=None,
                          lora_strict: bool = True):
        """Fill the abstract module ``model_abs`` (``cfg``'s architecture) from ``source`` (a
        diffusers folder or one file); with a mesh each parameter is read slice by slice
        straight into its ``NamedSharding``. ``loras`` (see :func:`ditax.lora.resolve_loras`)
        are merged into each slice as it is read, then (``cfg.quantize``) the block linears
        are quantized to 8 bits. Returns the concrete module."""
        arch = self.architecture(cfg)
        table = arch.weight_table(cfg)
        weights, read_table, rename = self.open_weights(
            source, cfg, table, param_shapes(nnx.state(model_abs)))
        # parameters a config adds (attention.sparsity=vsa's gates): init where a checkpoint
        # has none (Row.init), read where it has them (diffusers names)
        read_table = read_table.extended(getattr(model_abs, "optional_rows", tuple)())
        quantizers = quant.prepare(model_abs, cfg, weights, source, mesh)   # {} unquantized
        gdef, state = nnx.split(model_abs)         # after prepare: its 8-bit kernels
        if loras:
            from ditax.lora import merged_weights

            weights = merged_weights(weights, loras, table, param_shapes(state),
                                     names=self.lora_names, strict=lora_strict, rename=rename)
        sharding = param_sharding(quant.with_scale_axes(arch.param_axes(cfg)), mesh,
                                  getattr(cfg, "offload", "none"))
        state = load_params(read_table, weights, state, jnp.dtype(cfg.param_dtype), sharding,
                            quantizers)
        check_finite_params(state, source, bool(loras))
        return nnx.merge(gdef, streamable(state))   # 8-bit host kernels' layout on TPU

    # -- the loader ---------------------------------------------------------------------------

    def load(self, path, dtype: str = "float32", mesh=None, attention="xla",
             subfolder: Optional[str] = "transformer", *, config=None, loras=None,
             lora_strict: bool = True, lora_mode: str = "merged", **model_overrides):
        """Load a transformer of this family (the module docstring's steps).

        Args:
          path: a ``transformer/`` folder (config.json + *.safetensors [+ index]), a pipeline
            folder that has ``transformer/`` (or ``subfolder``; None: ``path`` itself), a hub
            id when online, or one ``.safetensors`` file (the family's upstream key names or
            diffusers') with ``config=``.
          dtype: parameter and compute dtype ("float32" | "bfloat16" | "float16").
          mesh: optional ``jax.sharding.Mesh`` with axes (data, fsdp, context, tensor).
          attention: a backend name or an :class:`~ditax.attention.config.AttentionConfig`
            (coerced here, once; the layers take the object).
          config: the architecture of a single-file checkpoint, the family's model config (the
            public ``ditax.load_transformer`` also takes a preset name or a YAML path);
            folders have their own ``config.json``.
          loras: LoRAs merged into the weights as they load: ``[(file, strength), ...]`` (a
            bare file = strength 1.0; a parsed :class:`ditax.lora.Lora` instead of a file), in
            any of the family's key formats (its ``lora_names``).
          lora_strict: False = LoRA keys that match no layer are skipped with a warning
            instead of an error.
          lora_mode: "merged" (folded into the weights while they load: no run-time cost) or
            "unmerged" (low-rank updates at run time; ``tr.set_lora_strengths`` changes
            strengths without recompiling; Linear layers only).
          quantize / quantize_activations (model config fields, passed as keywords): "int8" |
            "fp8" stores the block attention / FFN linears in 8 bits with per-output-channel
            scales, quantized slice by slice as each device reads its slice (merged LoRAs
            first); ``quantize_activations=True`` makes their dots 8-bit x 8-bit
            (:mod:`ditax.nn.quant`; the load log says whether they are native here).
          model_overrides: other fields of the family's model config (e.g. ``remat="full"``).

        The model, attention and mesh are checked here, once (the family's
        ``check_transformer`` with the mesh's sizes), before anything is built.
        """
        t0 = time.perf_counter()
        check_choice("lora_mode", lora_mode, LORA_MODES)
        if is_single_file(path):
            source = pathlib.Path(path)
            cfg = self.single_file_config(path, config, param_dtype=dtype, dtype=dtype,
                                          **model_overrides)
        elif config is not None:
            raise ConfigError(f"config= is for single-file checkpoints; {path} is read with its "
                              f"own config.json (pass model overrides as keywords instead)")
        else:
            source = resolve_folder(path, subfolder)
            cfg = self.folder_config(source, param_dtype=dtype, dtype=dtype, **model_overrides)
        acfg = as_attention_config(attention)      # the one coercion; layers take the object
        quant.check_lora_mode(cfg, loras, lora_mode)
        check_mesh_axes(mesh)
        arch = self.architecture(cfg)
        self.check_transformer(cfg, acfg, None if mesh is None else
                               {a: int(mesh.shape[a]) for a in MESH_AXES})
        if arch.check is not None:
            arch.check(cfg)
        merged = loras if lora_mode == "merged" else None
        model = self.load_weights_into(arch.abstract_model(cfg, acfg, mesh), source, cfg, mesh,
                                       merged, lora_strict)
        if loras and lora_mode == "unmerged":
            from ditax.lora import resolve_loras
            from ditax.lora.unmerged import attach

            attach(model, resolve_loras(loras, lora_strict, names=self.lora_names),
                   arch.weight_table(cfg), mesh, names=self.lora_names)
        log.info("loaded %s (%s) in %.1fs", source, self.describe(cfg),
                 time.perf_counter() - t0)
        return arch.wrapper(model)


__all__ = ["Architecture", "TransformerLoader", "LORA_MODES", "plain_weights"]
