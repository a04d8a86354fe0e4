"""The model interface of training and preprocessing, and the registry of model families.

A *model family* (Wan, Flux) is a :class:`ModelFamily` subclass bound to one model config
(and an attention config). ``ditax.train`` reaches a model only through it: build the module
(randomly, or abstractly under a mesh), the parameter shardings, the denoiser call inside the
loss, the latent shape of a video, FLOPs and tokens per sample for the metrics. Those are
abstract: every family supplies them. The rest are optional, each needing a capability the
family declares in its one :class:`~ditax.models.registry.FamilySpec` (weights for
``init_from``, the encoders ``ditax preprocess`` runs, LoRA, single files, bench...): the
commands ask :func:`ditax.models.registry.require` before calling them. A family plugs in by
subclassing and naming the subclass in its spec (``family="module:Name"``); nothing in
``train/`` changes.

Shapes: latents ``[B, C, F, Y, X]``, timestep ``[B]`` (0…1000), text ``[B, T, Dt]``, text mask
``[B, T]`` bool (True = token).
"""

from __future__ import annotations

import abc
import pathlib
from typing import Any, ClassVar

import jax.numpy as jnp
from flax import nnx

from ditax.errors import ConfigError
from ditax.models import registry
from ditax.models.denoiser import Denoiser, Embedded, ModelInputs, num_blocks  # re-exported
from ditax.models.encoding import Encoders, SkipClip, TextEncoding  # re-exported
from ditax.models.registry import DEFAULT_FAMILY
from ditax.models.size_rule import SizeRule


class ModelFamily(abc.ABC):
    """One model family bound to ``model`` (its config), ``attention`` and, for training,
    ``flow`` (the run's flow objective config; each may be None)."""

    name: ClassVar[str]
    default_frames: ClassVar[int] = 81   # pixel frames `ditax preprocess` reads by default

    def __init__(self, model, attention=None, flow=None):
        self.model = model
        self.attention = attention
        self.flow = flow

    # -- config and shapes ---------------------------------------------------------------------

    def check(self, mesh_sizes: dict[str, int] | None = None) -> None:
        """Raise :class:`ConfigError` for a model / attention config that cannot be built
        (``mesh_sizes``: the resolved mesh axis sizes, for divisibility rules)."""

    @property
    @abc.abstractmethod
    def latent_channels(self) -> int:
        """``C`` of the latents the denoiser takes."""

    @property
    @abc.abstractmethod
    def text_dim(self) -> int:
        """``Dt``, the width of the text embeddings the denoiser takes."""

    @classmethod
    @abc.abstractmethod
    def latent_grid(cls, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Latent ``(F, Y, X)`` of a ``num_frames × height × width`` video; :class:`ConfigError`
        (naming the sizes and the rule) when the family's video encoder cannot take it."""

    @classmethod
    def folder_latent_grid(cls, root, num_frames: int, height: int, width: int):
        """:meth:`latent_grid` for the VAE of pipeline folder ``root`` (what ``ditax
        preprocess`` encodes with), its sides first checked against the folder's
        :meth:`size_rule` (frames: by the grid, on the same rule); by default the family's
        own grid, whatever the folder."""
        cls.size_rule(root).check(height, width, None, error=ConfigError)
        return cls.latent_grid(num_frames, height, width)

    @classmethod
    def folder_config(cls, root) -> dict:
        """The fields of the family's model config that pipeline folder ``root`` fixes (its
        transformer's architecture, read from ``transformer/config.json``: heads, head dim,
        layers...), so a sampling command's config is validated against the folder's own model
        rather than the family's defaults; reads no weights. ``{}`` (the default): nothing
        read from the folder (a family's own checks then see its config defaults)."""
        return {}

    @staticmethod
    def transformer_json(root, classes) -> dict | None:
        """Pipeline folder ``root``'s ``transformer/config.json`` as a dict when it exists and
        its ``_class_name`` (if any) is one of ``classes``; None otherwise (a missing or
        foreign file is the family's preflight's to report, with its own words)."""
        from ditax.io.files import read_model_json

        f = pathlib.Path(root) / "transformer" / "config.json"
        if not f.is_file():
            return None
        raw = read_model_json(f, "transformer config")
        if not isinstance(raw, dict) or raw.get("_class_name", classes[0]) not in classes:
            return None
        return raw

    @classmethod
    def size_rule(cls, root=None, model=None) -> SizeRule:
        """The family's one rule for the sizes its models take (:mod:`ditax.models.size_rule`:
        VAE factors x the transformer's patch, the frame rule) for pipeline folder ``root``
        (None: none) under model config ``model`` (None: the folder's, else the defaults);
        every entry checks sizes with it first. Default: any size (:meth:`latent_grid`'s)."""
        return SizeRule(cls.name, 1, 1, "no size rule declared")

    def check_size(self, num_frames, height, width, names: str = "request") -> None:
        """:class:`ConfigError` for sizes off the bound model's :meth:`size_rule`."""
        self.size_rule(model=self.model).check(height, width, num_frames, names, ConfigError)

    def check_latents(self, latent_shape, where: str, **fix) -> None:
        """:class:`ConfigError` for latents ``[C, F, Y, X]`` (``where``'s) off the grid."""
        self.size_rule(model=self.model).check_latents(latent_shape, where, ConfigError, **fix)

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, ...]:
        """Latent ``[C, F, Y, X]`` of one video (its sizes on :meth:`size_rule`)."""
        self.check_size(None, height, width)     # frames: the grid's, on the same rule
        return (self.latent_channels,) + tuple(self.latent_grid(num_frames, height, width))

    @abc.abstractmethod
    def tokens_per_sample(self, latent_shape) -> int:
        """Sequence length the denoiser sees for latents ``[C, F, Y, X]``."""

    @abc.abstractmethod
    def flops_per_sample(self, latent_shape, text_len: int) -> float:
        """Model FLOPs of one training sample (forward + backward, no remat recompute)."""

    # -- the module -----------------------------------------------------------------------------

    @abc.abstractmethod
    def create(self, mesh, rngs: nnx.Rngs) -> nnx.Module:
        """The denoiser, randomly initialised (traced under ``jit`` / ``eval_shape`` by callers)."""

    def abstract(self, mesh) -> nnx.Module:
        """The denoiser with ``ShapeDtypeStruct`` parameters (nothing allocated)."""
        return nnx.eval_shape(lambda: self.create(mesh, nnx.Rngs(0)))

    @abc.abstractmethod
    def param_shardings(self, params, mesh) -> Any:
        """``NamedSharding`` tree matching ``params`` (a pure dict or an ``nnx.State``)."""

    def apply(self, module: nnx.Module, latents, timestep, text, text_mask, condition=None):
        """The prediction the flow loss compares with ``noise - latents`` (same shape);
        ``condition``: the sample's :meth:`condition_shapes` entries (batched; the
        :meth:`noised_entries` noisy, and then the return is ``(prediction, {entry: its
        prediction})``)."""
        return module(latents, timestep, text, text_mask)

    def condition_shapes(self, latent_shape) -> dict[str, tuple[int, ...]]:
        """Extra per-sample batch entries (name → shape) the denoiser is conditioned on,
        for latents ``[C, F, Y, X]`` (image-to-video); none by default."""
        return {}

    def check_flow(self) -> None:
        """Raise :class:`ConfigError` for a flow objective (``self.flow``) this family cannot
        train with; by default the family-defined knobs ``dynamic_shift`` and ``guidance``
        are refused."""
        f = self.flow
        if f is not None and getattr(f, "dynamic_shift", False):
            raise ConfigError(f"flow.dynamic_shift=true: model family {self.name!r} has no "
                              f"size-dependent shift; set flow.dynamic_shift=false (and "
                              f"flow.shift=S for a fixed shift)")
        if f is not None and getattr(f, "guidance", None) is not None:
            raise ConfigError(f"flow.guidance={f.guidance}: model family {self.name!r} embeds "
                              f"no guidance scale; remove flow.guidance")

    def training_flow(self, latent_shape):
        """The flow objective for a batch of latents ``[C, F, Y, X]``: ``self.flow``, or the
        family's size-dependent form of it (Flux: the shift of the image's token count)."""
        return self.flow

    def few_step_sample(self, steps: int, sigmas: list, shift: float | None) -> dict:
        """The pipeline settings (generate's names) that sample a few-step student trained
        on Euler with these unshifted ``sigmas`` and ``shift`` (None: the pipeline's own
        resolution-dependent shift) and no classifier-free guidance."""
        out = {"num_inference_steps": steps, "sigmas": list(sigmas), "guidance_scale": 1.0,
               "scheduler": "euler"}
        if shift is not None:
            out["flow_shift"] = float(shift)
        return out

    def apply_with_features(self, module, latents, timestep, text, text_mask, condition=None):
        """``(prediction, features [B, D])``: :meth:`apply` with the mean of the tokens the
        blocks hand the head (float32), for a discriminator on the denoiser's features
        (distillation's GAN term). By default through the :class:`Denoiser` protocol: the
        module's call is ``head(run_blocks(embed(...)))``; a family whose module calls more
        refuses (:class:`ConfigError`)."""
        capture = _FeatureCapture(module)
        out = self.apply(capture, latents, timestep, text, text_mask, condition)
        return out, capture.features

    def trained_params(self, train):
        """An ``nnx`` filter of the parameters a full (non-LoRA) run trains, the rest frozen
        (no gradient, no optimiser state), for the run's ``train`` section; None (default):
        every parameter."""
        return None

    def training_inputs(self, x_t, x0, timestep, condition):
        """``(x_t, timestep, loss mask or None)`` the loss feeds the denoiser for noisy
        latents ``x_t`` of clean ``x0`` at ``timestep [B]``; unchanged by default."""
        return x_t, timestep, None

    def noised_entries(self) -> tuple[str, ...]:
        """Condition entries (of :meth:`condition_shapes`) that are further latents the
        denoiser denoises together with the main ones (LTX-2: ``audio_latents``), none by
        default. For each, the flow loss draws its own noise, mixes it in at the sample's
        ``σ`` (the same as the main latents'), hands :meth:`apply` the noisy entry in place
        of the clean one, and adds the entry's velocity error to the main one
        (:func:`ditax.train.loss.joint_flow_loss`); :meth:`apply` then returns
        ``(prediction, {entry: its prediction})``."""
        return ()

    #: whether the family trains first-frame conditioning (``train.first_frame_p`` > 0;
    #: :meth:`first_frame_inputs`); the trainer refuses the key for a family without it
    first_frame_training = False

    def check_first_frame(self, p: float) -> None:
        """:class:`ConfigError` for ``train.first_frame_p`` > 0 on a family without
        :attr:`first_frame_training` (the config check and the trainer ask it)."""
        if p and not self.first_frame_training:
            raise ConfigError(f"train.first_frame_p={p:g}: model family {self.name!r} does "
                              f"not train first-frame conditioning; set train.first_frame_p=0")

    def first_frame_inputs(self, x_t, x0, timestep, mask, key, p: float):
        """``(x_t, timestep, mask)`` after :meth:`training_inputs` with each sample's first
        latent frame kept clean with probability ``p`` (drawn from ``key``): those tokens at
        timestep 0 and out of the loss ``mask``. Only where :attr:`first_frame_training`."""
        self.check_first_frame(p)
        raise NotImplementedError(f"{type(self).__name__} declares first_frame_training "
                                  f"without first_frame_inputs")

    # -- optional: each needs a capability the family declares in its FamilySpec -------------
    # (ditax.models.registry.CAPABILITIES; commands ask registry.require before calling them)

    def weights_folder(self, path) -> pathlib.Path:
        """Needs capability ``init_from``. The folder at ``path`` holding weights of this
        architecture (for ``init_from``); :class:`ConfigError` listing what differs."""
        _lacks(self, "init_from", "weights_folder")

    def load_params(self, folder, mesh) -> dict:
        """Needs capability ``init_from``. Parameters (pure dict, sharded) read from ``folder``."""
        _lacks(self, "init_from", "load_params")

    def kv_cache(self):
        """Needs capability ``causal``: a causal student's KV-cache module (CausalSampler's)."""
        _lacks(self, "causal", "kv_cache")

    @classmethod
    def load_encoders(cls, folder, dtype: str = "float32") -> Encoders:
        """Needs capability ``preprocess``. The video and text encoders of a pipeline folder."""
        _lacks(cls, "preprocess", "load_encoders")

    def lora_table(self):
        """Needs capability ``lora``. The table LoRA adapters are placed and named by."""
        _lacks(self, "lora", "lora_table")

    def weight_table(self):
        """Needs capability ``quantize``. The transformer's full conversion table (diffusers
        names; what ``ditax convert --quantize`` writes through); by default the LoRA table."""
        return self.lora_table()

    @classmethod
    def lora_names(cls):
        """The family's names for the LoRA machinery: its spec's ``lora_names`` (a
        :class:`ditax.lora.names.LoraNames`; None: the family reads no LoRA files)."""
        return registry.spec(cls.name).lora_names_object()

    @classmethod
    def load_transformer(cls, path, **kwargs):
        """Needs capability ``transformer``. The family's inference transformer from ``path``
        (a folder whose ``config.json`` ``_class_name`` is one of the family's
        ``transformer_classes``, or a pipeline folder); what :func:`ditax.load_transformer`
        returns for it."""
        _lacks(cls, "transformer", "load_transformer")

    def random_transformer(self, mesh, seed: int = 0):
        """Needs capability ``bench``. The inference transformer of :meth:`load_transformer`,
        randomly initialised from ``seed`` (sharded over ``mesh``)."""
        _lacks(self, "bench", "random_transformer")

    def random_inputs(self, batch: int, latent=None, text_len: int = 512, rng=None):
        """Needs capability ``bench``. ``(args, kwargs)`` of one call of
        :meth:`random_transformer`'s transformer on random inputs (numpy ``rng``): ``batch``
        samples of latent grid ``latent = (F, Y, X)`` (None: the family's bench default) and
        ``text_len`` text tokens; :class:`ConfigError` naming a grid the family cannot take."""
        _lacks(self, "bench", "random_inputs")

    @classmethod
    def check_folder(cls, path, subfolder: str | None = "transformer") -> str:
        """Needs capability ``folder_check``. Check a transformer folder (or pipeline folder /
        hub id) from its ``config.json`` and the safetensors headers (no tensor data); returns
        a one-line summary, raises :class:`~ditax.errors.WeightError` naming what does not fit."""
        _lacks(cls, "folder_check", "check_folder")

    def check_single_file(self, path) -> str:
        """Needs capability ``single_file``. Check the single-file checkpoint ``path`` against
        this family's ``model`` config (headers only); returns a one-line summary."""
        _lacks(self, "single_file", "check_single_file")

    def convert_single_file(self, path, out, *, dtype: str | None = None, loras=None):
        """Needs capability ``single_file``. Write the single-file checkpoint ``path`` as a
        diffusers transformer folder ``out`` (``loras``: resolved LoRAs fused in)."""
        _lacks(self, "single_file", "convert_single_file")

    # -- family trainers (named by the spec's ``trainers``) ------------------------------------

    @classmethod
    def trainers(cls) -> dict[str, str]:
        """The family's own trainers beside ``ditax.train`` (kind → ``"module:Name"`` of a
        :class:`FamilyTrainer`, as its spec names them), e.g. ``{"vae": ...}``."""
        return dict(registry.spec(cls.name).trainers)

    @classmethod
    def trainer(cls, kind: str) -> FamilyTrainer:
        """The family's :class:`FamilyTrainer` of ``kind`` (see :meth:`trainers`);
        :class:`ConfigError` naming the kinds it has."""
        found = registry.spec(cls.name).trainer_class(kind)
        if found is None:
            have = ", ".join(sorted(cls.trainers())) or "none"
            raise ConfigError(f"model family {cls.name!r} has no {kind} trainer (it has: "
                              f"{have})")
        return found()


def _lacks(family, capability: str, method: str):
    """The default body of an optional method of ``family`` (a ModelFamily or its class): the
    one-line refusal when ``capability`` is undeclared (:func:`ditax.models.registry.require`);
    a family that declares it but does not override ``method`` is a bug in the family."""
    cls = family if isinstance(family, type) else type(family)
    registry.require(cls.name, capability, f"{cls.__name__}.{method}")
    raise NotImplementedError(f"model family {cls.name!r} declares capability {capability!r} "
                              f"but {cls.__name__} does not override {method}")


class FamilyTrainer(abc.ABC):
    """A trainer a family provides for one of its parts (its VAE): config, checks, training.
    Named by :meth:`ModelFamily.trainers`; ``ditax train-vae`` finds it there."""

    config_class: ClassVar[type]     # the trainer's config dataclass (``ditax config --vae``)

    @abc.abstractmethod
    def load_config(self, config, overrides: list[str], listing: bool = False):
        """The trainer's checked config from a YAML path (or None) and ``key=value``
        overrides (``listing``: skip the rules only a run needs, such as a data folder)."""

    def check_devices(self, cfg, devices: int) -> None:
        """Raise :class:`ConfigError` when ``devices`` cannot run ``cfg``."""

    @abc.abstractmethod
    def train(self, cfg, *, devices, progress: bool = True):
        """Train; returns a result with ``step``, ``losses``, ``folder``, ``interrupted``,
        ``signal`` (and what the trainer adds)."""


def register_family(cls: type[ModelFamily]) -> type[ModelFamily]:
    """Thin wrapper kept for tests and families outside ditax (a class decorator): fill the
    ``family`` part of the one declaration of the family named ``cls.name``
    (:func:`ditax.models.registry.update`; its other parts stay, a name not registered yet
    gets a spec with only ``cls``). A family's own ``FamilySpec(family=...)`` is the usual way."""
    registry.update(cls.name, family=cls)
    return cls


def family_class(name: str) -> type[ModelFamily]:
    """The runtime interface of the family called ``name`` (:func:`ditax.models.registry.spec`:
    built-in ones are imported on first use); :class:`ConfigError` listing the known ones."""
    return registry.spec(name).family_class()


def model_family(model, attention=None, flow=None) -> ModelFamily:
    """The family of model config ``model`` (its ``family`` field, default Wan), bound to it
    (and to ``attention`` and the flow objective ``flow``)."""
    return family_class(getattr(model, "family", DEFAULT_FAMILY))(model, attention, flow)


class _FeatureCapture:
    """A denoiser module whose call also keeps the mean of the blocks' output tokens."""

    def __init__(self, module):
        self.module = module
        self.features = None

    def __call__(self, *args, **kwargs):
        m = self.module
        h, ctx = m.embed(*args, **kwargs)
        h = m.run_blocks(h, ctx)
        self.features = jnp.mean(h[:, :ctx.seq].astype(jnp.float32), axis=1)
        return m.head(h, ctx)

    def __getattr__(self, name):
        return getattr(self.module, name)


__all__ = ["ModelFamily", "Encoders", "SkipClip", "Denoiser", "Embedded", "ModelInputs",
           "num_blocks", "SizeRule", "TextEncoding", "FamilyTrainer", "register_family",
           "family_class", "model_family", "DEFAULT_FAMILY"]
