"""The model interface of training and preprocessing, and the registry of model families.

A *model family* (Wan today) is a :class:`ModelFamily` subclass bound to one model config
(and an attention config). ``ditax.train`` reaches a model only through it: build the module
(randomly, or abstractly under a mesh), the parameter shardings, the denoiser call inside the
loss, the latent shape of a video, FLOPs and tokens per sample for the metrics, weights for
``init_from``, and the encoders ``ditax preprocess`` runs. A second family plugs in by
subclassing, registering with :func:`register_family`, and carrying ``family = "<name>"`` in
its model config; nothing in ``train/`` changes.

Shapes: latents ``[B, C, F, Y, X]``, timestep ``[B]`` (0…1000), text ``[B, T, Dt]``, text mask
``[B, T]`` bool (True = token).
"""

from __future__ import annotations

import abc
import dataclasses
import pathlib
from typing import Any, ClassVar, Protocol

from flax import nnx

from ditax.errors import ConfigError
from ditax.models import registry
from ditax.models.registry import DEFAULT_FAMILY


@dataclasses.dataclass
class TextEncoding:
    """A text encoder's output for ``B`` captions: ``embeddings [B, T, Dt]``, ``mask [B, T]``
    (1 = token), and ``extra``: further per-caption outputs by name (Flux: a pooled vector
    ``"pooled" [B, Dp]``), stored with each sample beside its condition entries, so the family
    declares them in :meth:`ModelFamily.condition_shapes` and reads them in ``condition``."""

    embeddings: Any
    mask: Any
    extra: dict = dataclasses.field(default_factory=dict)


class Encoders(abc.ABC):
    """What preprocessing needs from a family: its latent encoder, its text encoder and the
    per-clip condition (image-to-video); a family's :meth:`ModelFamily.load_encoders` returns
    a subclass."""

    @abc.abstractmethod
    def encode_video(self, video) -> Any:
        """``[B, 3, F, H, W]`` in ``[-1, 1]`` → latents ``[B, C, F', Y, X]`` in the space the
        denoiser is trained in (an image family takes ``F = 1``)."""

    @abc.abstractmethod
    def encode_text(self, captions: list[str], text_len: int) -> TextEncoding:
        """Captions → :class:`TextEncoding` (embeddings ``[B, T, Dt]``, ``T = text_len``)."""

    # the per-clip sidecar files ``ditax preprocess`` reads for :meth:`encode_condition`
    # (``NAME.control.mp4``, ``NAME.mask.mp4``: ``control`` / ``mask`` videos; ``NAME.ref.png``,
    # ``NAME.ref2.png``...: ``references`` images); none by default
    sidecars: tuple[str, ...] = ()

    def encode_condition(self, video, **sidecars) -> dict:
        """Per-clip condition entries (name → array) for one clip ``[3, F, H, W]`` in [-1, 1],
        as :meth:`ModelFamily.condition_shapes` declares them, from the clip and its
        :attr:`sidecars` (videos ``[3, F, H, W]`` in [-1, 1], images as PIL); none by default."""
        return {}

    def sample_latents(self, latents, condition: dict):
        """The latents ``[C, F', Y, X]`` stored for a clip with its ``condition`` entries (a
        family whose condition adds latent frames prepends them here); unchanged by default."""
        return latents


# -- the denoiser protocol: what a sampler and the step cache may call -------------------------


class Embedded(Protocol):
    """What a denoiser's :meth:`Denoiser.embed` hands its blocks and head (any object; a
    ``NamedTuple`` in Wan). The step cache reads these three fields and nothing else."""

    seq: int    # static: the tokens h[:, :seq] that are real (the rest padding), compared
    mod: Any    # the timestep modulation the blocks read (TeaCache input "modulation")
    temb: Any   # the time embedding (TeaCache input "time_embedding")


class Denoiser(Protocol):
    """A family's denoiser module as the generic sampling loop (:mod:`ditax.pipelines.sampling`)
    and the step cache (:mod:`ditax.pipelines.cache`) use it: an ``nnx.Module`` whose forward is
    ``head(run_blocks(*embed(...)))``.

    ``x``: the denoiser input ``[B, C_in, ...]`` (what :class:`ModelInputs` returns), timestep
    ``[B]`` (or per token ``[B, L]``), text ``[B, T, Dt]``; ``extras``: the family's further
    inputs as keyword arguments (Wan: ``encoder_hidden_states_image``). Tokens ``h`` are one
    array ``[B, L', D]`` (``L'`` may include padding past ``ctx.seq``), so a cached residual
    is ``h_after - h_before``. Blocks are numbered across :attr:`block_stacks` in order.
    """

    mesh: Any   # the device mesh the module is sharded over (None: one device)

    @property
    def block_stacks(self) -> tuple[tuple[str, int], ...]:
        """The stacks of blocks, in the order they run: ``((attribute name, depth), ...)``
        (Wan: ``(("blocks", num_layers),)``; a model with two kinds of block lists both)."""

    def __call__(self, x, timestep, text, **extras):
        """The prediction ``[B, C_out, ...]``; equals ``head(run_blocks(h, ctx), ctx)``."""

    def embed(self, x, timestep, text, **extras) -> tuple[Any, Embedded]:
        """Tokens ``h [B, L', D]`` and the context (:class:`Embedded`) blocks and head read."""

    def run_blocks(self, h, ctx: Embedded, start: int = 0, stop: int | None = None):
        """Blocks ``start .. stop-1`` (default all, numbered across the stacks) on ``h``."""

    def head(self, h, ctx: Embedded):
        """Tokens → the prediction ``[B, C_out, ...]`` in the input's dtype."""


class ModelInputs(Protocol):
    """A family's rule for the denoiser's inputs at one sampling step: ``inputs(model,
    condition, latents [B, C, ...] float32, t float32 []) → (x, timestep, extras)`` —
    ``condition`` is the family's per-request pytree (None: text only), ``extras`` a dict of
    keyword arguments for :meth:`Denoiser.embed` whose arrays have the condition's batch
    (doubled, like ``x``, for a batched CFG forward). A module-level function: it is a static
    argument of the compiled step (hashed by identity)."""

    def __call__(self, model, condition, latents, t) -> tuple[Any, Any, dict]:
        ...


def num_blocks(model: Denoiser) -> int:
    """All blocks of ``model``: the sum of its :attr:`~Denoiser.block_stacks` depths."""
    return sum(depth for _, depth in model.block_stacks)


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
        preprocess`` encodes with); by default the family's own rule, whatever the folder."""
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

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, ...]:
        """Latent ``[C, F, Y, X]`` of one video."""
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
        ``condition``: the sample's :meth:`condition_shapes` entries (batched)."""
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

    def trained_params(self, train):
        """An ``nnx`` filter of the parameters a full (non-LoRA) run trains, the rest frozen
        (no gradient, no optimiser state), for the run's ``train`` section; None (default):
        every parameter."""
        return None

    def training_inputs(self, x_t, x0, timestep, condition):
        """``(x_t, timestep, loss mask or None)`` the loss feeds the denoiser for noisy
        latents ``x_t`` of clean ``x0`` at ``timestep [B]``; unchanged by default."""
        return x_t, timestep, None

    # -- weights and preprocessing ------------------------------------------------------------

    def weights_folder(self, path) -> pathlib.Path:
        """The folder at ``path`` holding weights of this architecture (for ``init_from``);
        :class:`ConfigError` listing what differs."""
        raise ConfigError(f"init_from={str(path)!r}: model family {self.name!r} has no weights "
                          f"loader; remove init_from to start from random weights")

    def load_params(self, folder, mesh) -> dict:
        """Parameters (pure dict, sharded like :meth:`param_shardings`) read from ``folder``."""
        raise ConfigError(f"model family {self.name!r} cannot load weights from {folder}")

    @classmethod
    def load_encoders(cls, folder, dtype: str = "float32") -> Encoders:
        """The video and text encoders of a pipeline folder (for ``ditax preprocess``)."""
        raise ConfigError(f"model family {cls.name!r} has no encoders for preprocessing")

    def lora_table(self):
        """The weight table LoRA adapters are placed and named by (diffusers names, a
        :mod:`ditax.lora.table` table); None: the family has no LoRA support."""
        return None

    def weight_table(self):
        """The transformer's full conversion table (diffusers names; what ``ditax convert
        --quantize`` writes through); by default :meth:`lora_table`."""
        return self.lora_table()

    @classmethod
    def lora_names(cls):
        """The family's names for the LoRA machinery (a :class:`ditax.lora.names.LoraNames`:
        name maps, key prefixes, target groups); None: the family reads no LoRA files."""
        return None

    # -- inference and family trainers ----------------------------------------------------------

    @classmethod
    def load_transformer(cls, path, **kwargs):
        """The family's inference transformer from ``path`` (a folder whose ``config.json``
        ``_class_name`` is one of the family's ``transformer_classes``, or a pipeline folder);
        what :func:`ditax.load_transformer` returns for it."""
        raise ConfigError(f"model family {cls.name!r} has no transformer loader")

    def random_transformer(self, mesh, seed: int = 0):
        """The inference transformer of :meth:`load_transformer`, randomly initialised from
        ``seed`` (sharded over ``mesh``), for ``ditax bench``."""
        raise ConfigError(f"model family {self.name!r} has no random transformer for bench")

    def random_inputs(self, batch: int, latent=None, text_len: int = 512, rng=None):
        """``(args, kwargs)`` of one call of :meth:`random_transformer`'s transformer on random
        inputs (numpy ``rng``): ``batch`` samples of latent grid ``latent = (F, Y, X)`` (None:
        the family's bench default) and ``text_len`` text tokens, for ``ditax bench``;
        :class:`ConfigError` naming a grid the family cannot take."""
        raise ConfigError(f"model family {self.name!r} has no random inputs for bench")

    @classmethod
    def check_folder(cls, path, subfolder: str | None = "transformer") -> str:
        """Check a transformer folder (or pipeline folder / hub id) from its ``config.json`` and
        the safetensors headers (no tensor data) for ``ditax convert FOLDER``; returns a
        one-line summary, raises :class:`~ditax.errors.WeightError` naming what does not fit."""
        raise ConfigError(f"model family {cls.name!r} has no folder check")

    def check_single_file(self, path) -> str:
        """Check the single-file checkpoint ``path`` against this family's ``model`` config
        (headers only); returns a one-line summary."""
        raise ConfigError(f"model family {self.name!r} reads no single-file checkpoints")

    def convert_single_file(self, path, out, *, dtype: str | None = None, loras=None):
        """Write the single-file checkpoint ``path`` as a diffusers transformer folder ``out``
        (``loras``: resolved LoRAs fused in); returns ``out``."""
        raise ConfigError(f"model family {self.name!r} reads no single-file checkpoints")

    @classmethod
    def trainers(cls) -> dict[str, str]:
        """The family's own trainers beside ``ditax.train`` (kind → ``"module:Name"`` of a
        :class:`FamilyTrainer`; a string, since a model never imports ``ditax.train``), e.g.
        ``{"vae": ...}`` for ``ditax train-vae``; none by default."""
        return {}

    @classmethod
    def trainer(cls, kind: str) -> FamilyTrainer:
        """The family's :class:`FamilyTrainer` of ``kind`` (see :meth:`trainers`);
        :class:`ConfigError` naming the kinds it has."""
        found = cls.trainers().get(kind)
        if found is None:
            have = ", ".join(sorted(cls.trainers())) or "none"
            raise ConfigError(f"model family {cls.name!r} has no {kind} trainer (it has: "
                              f"{have})")
        return registry.resolve(found)()


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
    """Class decorator: make ``cls`` the runtime interface of the family named ``cls.name`` in
    :mod:`ditax.models.registry` (its :class:`~ditax.models.registry.FamilySpec` keeps its
    config and folder classes; a name not registered yet gets a spec with only ``cls``)."""
    current = registry.lookup(cls.name) or registry.FamilySpec(cls.name)
    registry.register(dataclasses.replace(current, family=cls))
    return cls


def family_class(name: str) -> type[ModelFamily]:
    """The runtime interface of the family called ``name`` (:func:`ditax.models.registry.spec`:
    built-in ones are imported on first use); :class:`ConfigError` listing the known ones."""
    return registry.spec(name).family_class()


def model_family(model, attention=None, flow=None) -> ModelFamily:
    """The family of model config ``model`` (its ``family`` field, default Wan), bound to it
    (and to ``attention`` and the flow objective ``flow``)."""
    return family_class(getattr(model, "family", DEFAULT_FAMILY))(model, attention, flow)


__all__ = ["ModelFamily", "Encoders", "Denoiser", "Embedded", "ModelInputs", "num_blocks",
           "TextEncoding", "FamilyTrainer", "register_family",
           "family_class", "model_family",
           "DEFAULT_FAMILY"]
