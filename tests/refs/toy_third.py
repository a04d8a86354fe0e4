"""A third model family, defined entirely here: what a new family (LTX-2, FLUX.2) writes and
nothing else. Importing this module registers it (family ``toythird``): a fresh process finds
it through ``DITAX_FAMILIES=toy_third`` (with ``tests/refs`` on ``PYTHONPATH``).

It declares, through ditax's public mechanisms only:

- its config class (:class:`ToyThirdConfig`) and runtime interface (:class:`ToyThirdFamily`:
  build, shardings, FLOPs, the flow loss's call; its denoiser is the toy denoiser the test
  families share, ``toy_family.ToyDenoiser``) — ``ditax train`` trains it;
- its folders' ``_class_name`` s (``ToyThirdPipeline``, ``ToyThirdTransformer``);
- its pipelines (:class:`ToyThirdPipelines`): sample defaults, one request field of its own
  (``toy_sharpness``: the ``--toy-sharpness`` flag, the ``toy_sharpness`` JSON field, a float
  in [0, 10]), a request check, a second output (``aux``: an array per frame, written beside
  the video as LTX-2 will write its audio) and loading;
- its pipeline (:class:`ToyThirdVideo`), which hands the generic loop its parts
  (``prepare(**call)``) so CFG, step caching, the compiled programs and server batching are the
  loop's.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import RequestError
from ditax.models import registry
from ditax.pipelines.family import PipelineFamily
from ditax.pipelines.programs import Programs, in_compile_cache
from ditax.pipelines.request import Field
from ditax.pipelines.sampling import Expert, Prepared, Timings, record
from toy_family import ToyDenoiser, ToyFamilyBase, toy_inputs
from toy_family import toy_text as shared_toy_text

FAMILY = "toythird"
TEXT_LEN = 3


@dataclasses.dataclass(frozen=True)
class ToyThirdConfig:
    family: str = FAMILY
    channels: int = 4
    text_dim: int = 8
    width: int = 16
    freq_dim: int = 16
    num_layers: int = 2
    dtype: str = "float32"
    param_dtype: str = "float32"


class ToyThirdFamily(ToyFamilyBase):
    name = FAMILY

    def flops_per_sample(self, latent_shape, text_len):
        return 6.0 * self.tokens_per_sample(latent_shape) * self.model.width ** 2

    def create(self, mesh, rngs):
        return ToyDenoiser(self.model, rngs)


def toy_text(prompt: str) -> np.ndarray:
    return shared_toy_text(prompt, TEXT_LEN, ToyThirdConfig.text_dim)


def decode(latents, sharpness: float) -> dict:
    """Latents ``[1, C, F, Y, X]`` → ``{"video": [F, 4Y, 4X, 3] in [0, 1], "aux": [F, C]}``
    (the video: the first three channels, 4x nearest upsampled, scaled by the sharpness; aux:
    each frame's channel means)."""
    x = np.asarray(latents, np.float32)[0]                        # [C, F, Y, X]
    video = np.clip(x[:3].transpose(1, 2, 3, 0) * 0.5 * sharpness + 0.5, 0.0, 1.0)
    video = video.repeat(4, axis=1).repeat(4, axis=2)
    return {"video": np.ascontiguousarray(video, np.float32),
            "aux": x.mean(axis=(2, 3)).T.astype(np.float32)}


class ToyThirdVideo:
    """The family's pipeline: prompt → ``{"video", "aux"}`` through the generic loop."""

    batches = True

    def __init__(self, module: ToyDenoiser, scheduler, defaults: dict):
        self.module, self.scheduler, self.defaults = module, scheduler, defaults
        self._expert = Expert(*nnx.split(module), module.cfg)
        self.programs, self.compile_cache = Programs(), "auto"
        self.mesh, self.cfg_mode, self.load_time = None, "batched", 0.0
        self.last_stats, self.timings = {}, Timings()

    def prepare(self, prompt, negative_prompt=None, height=None, width=None, num_frames=None,
                num_inference_steps=None, guidance_scale=None, seed=0, latents=None,
                toy_sharpness=None, cache=None, cache_threshold=None, cfg_cache=False,
                cache_coefficients=None, sigmas=None, guidance_scale_2=None,
                output="video") -> Prepared:
        d = self.defaults
        height, width = height or d["height"], width or d["width"]
        frames = num_frames or d["num_frames"]
        steps = num_inference_steps or d["num_inference_steps"]
        g = d["guidance_scale"] if guidance_scale is None else guidance_scale
        sharp = d["toy_sharpness"] if toy_sharpness is None else toy_sharpness
        ToyThirdPipelines().check_request(prompt, height, width, frames, steps, g,
                                          toy_sharpness=sharp)
        grid = ToyThirdFamily.latent_grid(frames, height, width)

        def text(use_cfg):
            rows = [prompt, negative_prompt or ""] if use_cfg else [prompt]
            return jnp.asarray(np.stack([toy_text(p) for p in rows]))

        return Prepared(
            programs=self.programs, experts=[self._expert], inputs=toy_inputs,
            scheduler=self.scheduler, latent_shape=(1, self.module.cfg.channels, *grid),
            text=text, num_inference_steps=steps, guidance_scale=g, latents=latents,
            seed=seed, cache=cache, cache_threshold=cache_threshold, cfg_cache=cfg_cache,
            size=f"at {height}x{width}",
            decode=None if output == "latent" else (lambda x, _: decode(x, sharp)))

    @in_compile_cache
    def __call__(self, prompt, progress=True, **call):
        return record(self, self.prepare(prompt, **call).run(progress))


class ToyThirdPipelines(PipelineFamily):
    name = FAMILY
    makes = "video"
    outputs = ("aux",)
    fields = (Field("toy_sharpness", "float", "the toy's contrast of the decoded video",
                    minimum=0.0, maximum=10.0, example=1.0),)
    sample_defaults = dict(height=16, width=16, num_frames=1, num_inference_steps=3,
                           guidance_scale=3.0, guidance_scale_2=None, negative_prompt=None,
                           max_sequence_length=TEXT_LEN, fps=4, toy_sharpness=1.0)

    def check_request(self, prompt, height, width, num_frames=None, num_inference_steps=None,
                      guidance_scale=None, guidance_scale_2=None, negative_prompt=None, seed=0,
                      toy_sharpness=None, **fields) -> None:
        for name, v in (("height", height), ("width", width)):
            if v % 4:
                raise RequestError(f"{name}={v} must be a multiple of 4 (the toy's patch)")
        if toy_sharpness is not None and toy_sharpness == 0 and guidance_scale > 5:
            raise RequestError("toy_sharpness=0 with guidance above 5 makes a grey video; "
                               "raise toy_sharpness")

    def load(self, path, dtype="float32", mesh=None, **kwargs):
        from ditax.io.files import read_model_json
        from ditax.schedulers import load_scheduler

        path = pathlib.Path(path)
        raw = read_model_json(path / "transformer" / "config.json")
        cfg = ToyThirdConfig(**{k: v for k, v in raw.items() if not k.startswith("_")})
        module = ToyDenoiser(cfg, nnx.Rngs(0))
        state = nnx.state(module, nnx.Param)
        weights = np.load(path / "transformer" / "weights.npz")
        flat = flat_params(state)
        assert set(weights.files) == set(flat), (sorted(weights.files), sorted(flat))
        _, tree = jax.tree_util.tree_flatten(nnx.to_pure_dict(state))
        nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(
            tree, [jnp.asarray(weights[k]) for k in flat]))
        nnx.update(module, state)
        defaults = {**self.sample_defaults}
        return ToyThirdVideo(module, load_scheduler(path / "scheduler"), defaults)


def flat_params(state) -> dict:
    return {"/".join(str(getattr(k, "key", k)) for k in p): np.asarray(v)
            for p, v in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]}


def write_folder(root, seed: int = 7) -> pathlib.Path:
    """A toy-third pipeline folder: model_index.json, transformer/ (config + weights),
    scheduler/."""
    root = pathlib.Path(root)
    cfg = ToyThirdConfig()
    module = ToyDenoiser(cfg, nnx.Rngs(seed))
    (root / "transformer").mkdir(parents=True)
    (root / "scheduler").mkdir()
    (root / "model_index.json").write_text(json.dumps({
        "_class_name": "ToyThirdPipeline", "transformer": ["toy", "ToyThirdTransformer"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}))
    (root / "transformer" / "config.json").write_text(json.dumps(
        {"_class_name": "ToyThirdTransformer",
         **{k: v for k, v in dataclasses.asdict(cfg).items() if k != "family"}}))
    np.savez(root / "transformer" / "weights.npz", **flat_params(nnx.state(module, nnx.Param)))
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(
        {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
         "shift": 3.0}))
    return root


def _apply(self, module, latents, timestep, text, text_mask, condition=None):
    return module(latents, timestep, text)


ToyThirdFamily.apply = _apply

# the family's one declaration (no capability declared: it has no LoRA names, no 8-bit path,
# no single files, ...; each is refused in one line where a command needs it)
registry.register(registry.FamilySpec(
    FAMILY, config=ToyThirdConfig, family=ToyThirdFamily, pipelines=ToyThirdPipelines,
    transformer_classes=("ToyThirdTransformer",), pipeline_classes=("ToyThirdPipeline",)))
