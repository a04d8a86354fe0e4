"""The whole run configuration, composed of one section per concern, and :func:`validate`.

Each section's schema and rules live with their owner: ``model`` with its family
(:mod:`ditax.models.registry`, read through :mod:`ditax.config.families`), ``mesh`` in
:mod:`ditax.parallel.mesh`, ``attention`` in :mod:`ditax.attention.config`, the training
sections in :mod:`ditax.config.training`, ``sample`` in :mod:`ditax.config.sample`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ditax.attention.config import AttentionConfig
from ditax.compile_cache import check_compile_cache
from ditax.config.families import default_config_class
from ditax.numbers import check_numbers
from ditax.config.sample import SampleConfig, check_sample
from ditax.config.training import (
    CheckpointConfig,
    DataConfig,
    DistillConfig,
    FlowConfig,
    LoraConfig,
    OptimConfig,
    TrainConfig,
    check_checkpoint,
    check_data,
    check_distill,
    check_flow,
    check_flow_target,
    check_lora,
    check_optim,
    check_train,
)
from ditax.errors import ConfigError
from ditax.parallel.mesh import MeshConfig, check_batch, resolve_mesh_shape


@dataclass(frozen=True)
class Config:
    """One run: model, mesh, attention, training and sampling sections plus run-level values.

    ``model`` holds the config of the family named by its ``family`` field (by default the
    registry's default family, Wan).
    """

    model: Any = field(default_factory=lambda: default_config_class()())
    mesh: MeshConfig = field(default_factory=MeshConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    name: str = "custom"
    steps: int = 100
    batch_size: int = 1               # global batch
    output_dir: str = "out/run"
    seed: int = 0
    log_every: int = 1
    init_from: Optional[str] = None   # diffusers folder to initialise weights from
    compile_cache: str = "auto"       # compiled-program folder | auto | none (ditax.compile_cache)


def check_offload(cfg) -> None:
    """``model.offload=host`` trains LoRA adapters on a frozen base streamed from the host;
    a full run would update host arrays (:class:`ConfigError` naming the fix)."""
    if getattr(cfg.model, "offload", "none") == "host" and cfg.lora.rank == 0:
        raise ConfigError("model.offload=host keeps the blocks' weights in host memory, which "
                          "a full fine-tune would update there; train LoRA adapters on the "
                          "streamed base (lora.rank=16, say) or set model.offload=none")


def validate(cfg: Config, num_devices: int | None = None, *, training: bool = False) -> Config:
    """Check every value that can be checked before tracing; each section's owner holds its
    rules. ``num_devices`` adds the mesh rules, ``training`` the batch split. Returns ``cfg``."""
    check_numbers(cfg)                  # every float finite, every int in range
    sizes = None if num_devices is None else resolve_mesh_shape(cfg.mesh, num_devices)
    # model + attention rules, through the model family's interface (any registered family)
    from ditax.models.base import model_family

    family = model_family(cfg.model, cfg.attention, cfg.flow)
    family.check(sizes)
    family.check_flow()
    family.check_first_frame(cfg.train.first_frame_p)
    check_optim(cfg.optim)
    check_flow(cfg.flow)
    check_flow_target(cfg.flow, cfg.attention.sparsity, cfg.distill.method)
    check_data(cfg.data)
    check_checkpoint(cfg.checkpoint)
    check_lora(cfg.lora)
    check_train(cfg.train)
    check_distill(cfg.distill)
    check_sample(cfg.sample, cfg.model.family)   # the presets are the family's
    if cfg.sample.context_chunks is not None and getattr(cfg.model, "causal_chunk", None) is None:
        raise ConfigError(f"sample.context_chunks={cfg.sample.context_chunks} is for a causal "
                          f"model; set model.causal_chunk (latent frames per chunk) or "
                          f"sample.context_chunks=none")
    check_compile_cache(cfg.compile_cache)
    if cfg.steps < 0:
        raise ConfigError(f"steps={cfg.steps} must be >= 0")
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} must be >= 1")
    if cfg.log_every < 1:
        raise ConfigError(f"log_every={cfg.log_every} must be >= 1 (log every this many steps)")
    if training and sizes is not None:
        check_batch(cfg.batch_size, sizes)
    if training:
        check_offload(cfg)
    if training and getattr(cfg.model, "quantize", "none") != "none":
        raise ConfigError(f"model.quantize={cfg.model.quantize} is for inference (8-bit weights "
                          f"are not trained); train with model.quantize=none and quantize "
                          f"when loading the result")
    return cfg


__all__ = ["Config", "check_offload", "validate"]
