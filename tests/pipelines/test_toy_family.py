"""A second model family samples through ``ditax.load_pipeline`` and the generic loop with no
change outside this file: a toy denoiser family (its own config class, its own folder
``_class_name`` s "ToyPipeline" / "ToyTransformer2DModel") is defined and registered here, its
folder written here, and ``ditax.load_pipeline(folder)`` returns its pipeline, whose call is
one :func:`ditax.pipelines.sampling.sample` — CFG, step caching (first_block) and the compiled
programs included. The outputs are checked against loops written out by hand below."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ditax
from compiles import compiles
from family_scope import families_restored
from toy_family import ToyDenoiser, ToyFamilyBase, toy_inputs
from toy_family import toy_text as shared_toy_text
from ditax.models import registry
from ditax.pipelines.family import PipelineFamily, register_pipelines
from ditax.pipelines.programs import Programs, in_compile_cache
from ditax.pipelines.sampling import Expert, Prepared, sample
from ditax.schedulers import load_scheduler

pytestmark = pytest.mark.usefixtures("fast_compile")

FAMILY = "toysample"
TEXT_LEN = 3


@dataclasses.dataclass(frozen=True)
class ToySampleConfig:
    family: str = FAMILY
    channels: int = 4
    text_dim: int = 8
    width: int = 16
    freq_dim: int = 16
    num_layers: int = 3


class ToySampleFamily(ToyFamilyBase):
    name = FAMILY

    def flops_per_sample(self, latent_shape, text_len):
        return 6.0 * self.tokens_per_sample(latent_shape) * self.model.width ** 2

    def create(self, mesh, rngs):
        return ToyDenoiser(self.model, rngs)


def toy_text(prompt: str) -> np.ndarray:
    return shared_toy_text(prompt, TEXT_LEN, ToySampleConfig.text_dim)


class ToyTextToImage:
    """The toy family's pipeline: prompt → image ``[Y, X, C]``, through the generic loop."""

    def __init__(self, module: ToyDenoiser, scheduler):
        self.module, self.scheduler = module, scheduler
        self._gdef, self._state = nnx.split(module)
        self.programs = Programs()
        self.compile_cache = "auto"
        self.last_stats: dict = {}

    def encode_text(self, prompt, negative_prompt, use_cfg):
        prompts = [prompt, negative_prompt or ""] if use_cfg else [prompt]
        return jnp.asarray(np.stack([toy_text(p) for p in prompts]))

    @in_compile_cache
    def __call__(self, prompt, negative_prompt=None, *, height=16, width=16,
                 num_inference_steps=4, guidance_scale=3.0, seed=0, latents=None, cache=None,
                 cache_threshold=None, output="image"):
        grid = ToySampleFamily.latent_grid(1, height, width)
        out = sample(Prepared(
            programs=self.programs, experts=[Expert(self._gdef, self._state, self.module.cfg)],
            inputs=toy_inputs, scheduler=self.scheduler,
            latent_shape=(1, self.module.cfg.channels, *grid),
            text=lambda use_cfg: self.encode_text(prompt, negative_prompt, use_cfg),
            num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
            latents=latents, seed=seed, cache=cache, cache_threshold=cache_threshold,
            size=f"at {height}x{width}",
            decode=None if output == "latent" else lambda x, _: np.clip(
                np.asarray(x)[0, :, 0].transpose(1, 2, 0) * 0.5 + 0.5, 0.0, 1.0)),
            progress=False)
        self.last_stats = out.stats
        return out.output


def _flat(tree) -> dict:
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


class ToyPipelines(PipelineFamily):
    name = FAMILY

    def load(self, path, dtype="float32", mesh=None, attention="xla", **kwargs):
        from ditax.io.files import read_model_json

        cfg = read_model_json(path / "transformer" / "config.json")
        cfg = ToySampleConfig(**{k: v for k, v in cfg.items() if not k.startswith("_")})
        module = ToySampleFamily(cfg).create(mesh, nnx.Rngs(0))
        state = nnx.state(module, nnx.Param)
        weights = np.load(path / "transformer" / "weights.npz")
        want = _flat(nnx.to_pure_dict(state))
        assert set(weights.files) == set(want), (sorted(weights.files), sorted(want))
        leaves, tree = jax.tree_util.tree_flatten(nnx.to_pure_dict(state))
        loaded = jax.tree_util.tree_unflatten(tree, [jnp.asarray(weights[k]) for k in want])
        nnx.replace_by_pure_dict(state, loaded)
        nnx.update(module, state)
        return ToyTextToImage(module, load_scheduler(path / "scheduler"))


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    """The toy family, registered for this module's tests (and gone after them)."""
    with families_restored():
        registry.register(registry.FamilySpec(
            FAMILY, config=ToySampleConfig, family=ToySampleFamily,
            transformer_classes=("ToyTransformer2DModel",), pipeline_classes=("ToyPipeline",)))
        register_pipelines(FAMILY, ToyPipelines)
        yield


@pytest.fixture(scope="module")
def toy_folder(tmp_path_factory):
    """A toy pipeline folder: model_index.json, transformer/ (config + weights), scheduler/."""
    root = tmp_path_factory.mktemp("toy_pipeline")
    cfg = ToySampleConfig()
    module = ToyDenoiser(cfg, nnx.Rngs(7))
    (root / "transformer").mkdir()
    (root / "scheduler").mkdir()
    (root / "model_index.json").write_text(json.dumps({
        "_class_name": "ToyPipeline", "transformer": ["toy", "ToyTransformer2DModel"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}))
    (root / "transformer" / "config.json").write_text(json.dumps(
        {"_class_name": "ToyTransformer2DModel",
         **{k: v for k, v in dataclasses.asdict(cfg).items() if k != "family"}}))
    np.savez(root / "transformer" / "weights.npz",
             **_flat(nnx.to_pure_dict(nnx.state(module, nnx.Param))))
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(
        {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
         "shift": 3.0}))
    return root, module


def _noise(seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), (1, 4, 1, 4, 4), jnp.float32)


def reference(module, scheduler, prompt, steps, g, x, skip_after_first=False):
    """The CFG Euler loop written out: ``v = v_u + g (v_c - v_u)``, ``x += (s' - s) v``; with
    ``skip_after_first`` every step after the first runs block 0 and adds the residual of the
    other blocks kept from step 0, per branch (first-block caching that always skips)."""
    timesteps, sigmas = scheduler.schedule(steps)
    texts = [jnp.asarray(toy_text(prompt))[None], jnp.asarray(toy_text(""))[None]]
    kept = [None, None]
    x = jnp.asarray(x)
    for i, t in enumerate(timesteps):
        v = []
        for b, text in enumerate(texts):
            h, ctx = module.embed(x, jnp.full((1,), t), text)
            h1 = module.run_blocks(h, ctx, 0, 1)
            if skip_after_first and i > 0:
                v.append(module.head(h1 + kept[b], ctx))
                continue
            out = module.run_blocks(h1, ctx, 1)
            kept[b] = out - h1
            v.append(module.head(out, ctx))
        x = x + (sigmas[i + 1] - sigmas[i]) * (v[1] + g * (v[0] - v[1]))
    return np.asarray(x)


def test_load_pipeline_finds_the_toy_family_by_its_class_name(toy_folder):
    root, _ = toy_folder
    pipe = ditax.load_pipeline(root)
    assert isinstance(pipe, ToyTextToImage)
    assert registry.spec_for_class("ToyPipeline").name == FAMILY


def test_generic_loop_matches_the_loop_written_out(toy_folder):
    root, module = toy_folder
    pipe = ditax.load_pipeline(root)
    x0 = _noise()
    got = pipe("a red fox", latents=x0, num_inference_steps=4, guidance_scale=3.0,
               output="latent")
    want = reference(module, pipe.scheduler, "a red fox", 4, 3.0, x0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert pipe.last_stats["transformer_calls"] == 8 and pipe.last_stats["cache"] is None
    # the seed draws the noise; guidance makes a difference; the decode is the toy's
    img = pipe("a red fox", seed=0, num_inference_steps=4, guidance_scale=3.0)
    assert img.shape == (4, 4, 4) and 0.0 <= img.min() <= img.max() <= 1.0
    plain = pipe("a red fox", latents=x0, num_inference_steps=4, guidance_scale=1.0,
                 output="latent")
    assert pipe.last_stats["transformer_calls"] == 4
    assert np.abs(plain - got).max() > 1e-3


def test_first_block_cache_on_the_toy(toy_folder):
    root, module = toy_folder
    pipe = ditax.load_pipeline(root)
    x0 = _noise(1)
    kw = dict(latents=x0, num_inference_steps=5, guidance_scale=2.5, output="latent")
    plain = pipe("a boat", **kw)
    # threshold 0: nothing is close enough to skip; every block runs, as the plain step
    none_skipped = pipe("a boat", cache="first_block", cache_threshold=0.0, **kw)
    assert pipe.last_stats["transformer_calls"] == 10
    assert pipe.last_stats["skipped_steps"] == {"cond": [], "uncond": []}
    np.testing.assert_allclose(none_skipped, plain, rtol=1e-6, atol=1e-6)
    # a threshold nothing reaches: every step after the first reuses step 0's residual
    skipped = pipe("a boat", cache="first_block", cache_threshold=1e9, **kw)
    stats = pipe.last_stats
    assert stats["transformer_calls"] == 2 < 5 * 2
    assert stats["skipped_steps"] == {"cond": [1, 2, 3, 4], "uncond": [1, 2, 3, 4]}
    want = reference(module, pipe.scheduler, "a boat", 5, 2.5, x0, skip_after_first=True)
    np.testing.assert_allclose(skipped, want, rtol=1e-5, atol=1e-5)
    assert np.abs(skipped - plain).max() > 1e-4


def test_a_second_call_compiles_nothing(toy_folder):
    root, _ = toy_folder
    pipe = ditax.load_pipeline(root)
    for cache in (None, "first_block"):
        first = pipe("a cat", seed=3, num_inference_steps=3, cache=cache)
        with compiles() as log:
            again = pipe("a dog", seed=3, num_inference_steps=3, cache=cache)
        assert log.names == [], (cache, log.names)
        assert not np.array_equal(first, again)      # another prompt, the same programs


# ----------------------------------------------------------------------------------------------
# the same family trains through ``ditax train``


def _toy_apply(self, module, latents, timestep, text, text_mask, condition=None):
    """The toy's denoiser takes no text mask (its text is the mean of the rows)."""
    return module(latents, timestep, text)


ToySampleFamily.apply = _toy_apply


def test_the_toy_family_trains_through_ditax_train(tmp_path, capsys):
    """``ditax train CONFIG`` on a YAML naming ``model.family: toysample``: the command knows
    no toy, the registry finds it; the loss goes down, a checkpoint of the toy's own
    parameters is written, and the same command resumes from it."""
    import yaml

    from ditax.cli import main
    from ditax.train.data_writer import DatasetWriter

    r = np.random.default_rng(0)
    w = DatasetWriter(tmp_path / "latents", samples_per_file=8)
    for _ in range(16):
        w.add(r.standard_normal((4, 1, 4, 4)).astype(np.float32),
              r.standard_normal((TEXT_LEN, 8)).astype(np.float32), np.ones(TEXT_LEN, np.uint8))
    source = str(w.close())
    cfg = {"model": dataclasses.asdict(ToySampleConfig()),
           "mesh": {"data": 1, "fsdp": -1, "context": 1, "tensor": 1},
           "optim": {"learning_rate": 1.0e-2, "warmup_steps": 1},
           "data": {"source": source, "text_len": TEXT_LEN},
           "steps": 24, "batch_size": 8, "output_dir": str(tmp_path / "run"),
           "checkpoint": {"every": 12, "keep": 2}}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path), "--no-progress"]) == 0
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    losses = [row["loss"] for row in rows]
    assert len(losses) == 24 and np.mean(losses[-4:]) < 0.9 * np.mean(losses[:4]), losses
    saved = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()
                   if p.name.isdigit())
    assert saved == [12, 24]
    assert main(["train", str(path), "steps=26", "--no-progress"]) == 0
    assert "resum" in capsys.readouterr().out.lower()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [row["step"] for row in rows][-3:] == [24, 25, 26]
