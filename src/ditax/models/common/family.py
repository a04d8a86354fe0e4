"""The :class:`~ditax.models.base.ModelFamily` methods that only hand over to the family's
modules, written once: a family names its parts as data (:class:`FamilyParts`, ``"module:Name"``
references imported when first used, so reading a family stays light) and
:class:`PartsFamily` forwards to them. FLUX.1, FLUX.2 and LTX-2 are such families.

Every method here is one of the optional ones of a capability (``transformer``,
``single_file``, ``folder_check``, ``lora``, ``bench``, ``preprocess``, ``init_from``): a
family built on :class:`PartsFamily` declares them all (``random_inputs``, the rest of
``bench``, stays the family's own).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

from flax import nnx

from ditax.errors import ConfigError
from ditax.models.base import ModelFamily
from ditax.models.registry import resolve, spec


@dataclass(frozen=True)
class FamilyParts:
    """Where a family's parts are (``"module:Name"``; ``build``: a module):

    - ``check``: ``check_transformer(model, attention, mesh_sizes)``;
    - ``module``: the transformer's NNX class ``(model, attention, mesh, rngs=)``;
    - ``build``: the module with ``init_model`` and ``param_shardings``
      (:class:`~ditax.models.common.loaded.Builder`'s);
    - ``loader``: the :class:`~ditax.models.common.loader.TransformerLoader` (its first
      architecture's wrapper is the inference callable);
    - ``load``: ``load_transformer(path, **kwargs)``; ``folder_summary(cfg)``: the model's
      shape in ``ditax convert``'s folder check (the loader's ``check_folder``);
    - ``check_single_file(path, model)`` and ``convert_single_file(path, model, out, *,
      dtype, loras)`` (``single_file_check``, ``single_file_write``);
    - ``weight_table(model)``: the LoRA (and conversion) table;
    - ``encoders``: the ``ditax preprocess`` encoders' class ``(folder, dtype)``.
    """

    check: str
    module: str
    build: str
    loader: str
    load: str
    folder_summary: str
    single_file_check: str
    single_file_write: str
    weight_table: str
    encoders: str


class PartsFamily(ModelFamily):
    """A :class:`~ditax.models.base.ModelFamily` whose forwarding methods read
    :attr:`parts`."""

    parts: FamilyParts

    def check(self, mesh_sizes=None) -> None:
        resolve(self.parts.check)(self.model, self.attention, mesh_sizes)

    @classmethod
    def folder_config(cls, root) -> dict:
        """The architecture fields of the folder's ``transformer/config.json`` (the loader's
        own reading of it: the config class's ``from_diffusers``)."""
        s = spec(cls.name)
        raw = cls.transformer_json(root, s.transformer_classes)
        if raw is None:
            return {}
        m = s.config_class().from_diffusers(raw)
        return {k: getattr(m, k) for k in m.to_diffusers() if k != "_class_name"}

    # -- training (the shift of a size-dependent flow) ------------------------------------------

    @staticmethod
    def check_dynamic_shift(flow, source: str) -> None:
        """``flow.dynamic_shift`` (the shift of the ``source`` of the sample's size) replaces
        ``flow.shift``, so not both."""
        if flow.dynamic_shift and flow.shift != 1.0:
            raise ConfigError(f"flow.shift={flow.shift} with flow.dynamic_shift=true: the shift "
                              f"then comes from {source}; set flow.shift=1 or "
                              f"flow.dynamic_shift=false")

    def dynamic_flow(self, tokens: int, resolution_shift: str):
        """The training flow of a sample of ``tokens`` tokens: with ``flow.dynamic_shift``,
        the flow with the fixed shift ``resolution_shift(tokens)`` (``"module:Name"``: the
        family's ``shift = e^mu`` of the token count); else ``flow`` as it is."""
        f = self.flow
        if f is None or not f.dynamic_shift:
            return f
        return dataclasses.replace(f, dynamic_shift=False,
                                   shift=resolve(resolution_shift)(tokens))

    # -- module ---------------------------------------------------------------------------------

    def create(self, mesh, rngs: nnx.Rngs):
        return resolve(self.parts.module)(self.model, self.attention, mesh, rngs=rngs)

    def param_shardings(self, params, mesh):
        build = importlib.import_module(self.parts.build)
        return build.param_shardings(params, self.model, mesh)

    # -- weights, LoRA and encoders -------------------------------------------------------------

    def weights_folder(self, path):
        return resolve(self.parts.loader).check_architecture(self.model, path)

    def load_params(self, folder, mesh) -> dict:
        loader = resolve(self.parts.loader)
        model = loader.load_weights_into(self.abstract(mesh), folder, self.model, mesh)
        return nnx.to_pure_dict(nnx.split(model)[1])

    def lora_table(self):
        return resolve(self.parts.weight_table)(self.model)

    @classmethod
    def load_encoders(cls, folder, dtype: str = "float32"):
        """The encoders ``ditax preprocess`` runs on a pipeline folder (the family's
        ``parts.encoders``)."""
        return resolve(cls.parts.encoders)(folder, dtype)

    # -- inference ------------------------------------------------------------------------------

    @classmethod
    def load_transformer(cls, path, **kwargs):
        """The family's loader (``parts.load``: diffusers folders, and single files with
        ``config=``), reading ``loras=`` in the family's key formats."""
        return resolve(cls.parts.load)(path, **kwargs)

    def random_transformer(self, mesh, seed: int = 0):
        wrapper = resolve(self.parts.loader).architectures[0].wrapper
        build = importlib.import_module(self.parts.build)
        return wrapper(build.init_model(self.model, self.attention, mesh, seed=seed))

    @classmethod
    def check_folder(cls, path, subfolder="transformer") -> str:
        return resolve(cls.parts.loader).check_folder(path, subfolder,
                                                      resolve(cls.parts.folder_summary))

    def check_single_file(self, path) -> str:
        return resolve(self.parts.single_file_check)(path, self.model)

    def convert_single_file(self, path, out, *, dtype=None, loras=None):
        return resolve(self.parts.single_file_write)(path, self.model, out, dtype=dtype,
                                                     loras=loras)


__all__ = ["FamilyParts", "PartsFamily"]
