"""``make demo-model``: train the demo model from nothing with ditax's own tools.

Stages (each timed; the run's record is ``{out}/recipe.json``):

1. **data** — synthetic clips (:mod:`ditax.synthetic`): one bright object moving on a dark
   background, captions canonical or paraphrased, the held-out combinations left out;
   written as lossless mp4 + ``captions.jsonl``, the layout ``ditax preprocess`` reads.
2. **vae** — ``ditax train-vae`` (:mod:`ditax.train.wan.vae`) on those clips; PSNR on held-out
   clips; a diffusers ``AutoencoderKLWan`` folder with measured latent statistics.
3. **text** — a T5-style Unigram tokenizer trained on the vocabulary's prompts and a small
   random UMT5 encoder (frozen: never trained, so it is just a fixed embedding of the words).
4. **latents** — ``ditax preprocess`` of the clips with that VAE and UMT5 (the empty prompt's
   embedding stored for classifier-free guidance training).
5. **transformer** — ``ditax train`` (flow matching, ``data.text_dropout`` for guidance).
6. **folder** — the diffusers ``WanPipeline`` folder (``model_index.json``, tokenizer,
   text_encoder, vae, transformer, UniPC scheduler, ``ditax_sample.json``: how to sample it),
   ``manifest.json`` with every file's sha256, loss-curve PNGs per stage.

Everything is a function of the seed (two runs write the same folder). ``FULL`` is the shipped
model (``python -m ditax.recipes.demo_model``); ``SMOKE`` the same recipe at toy sizes (tests).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass

from ditax.recipes.common import (MANIFEST, StagedRecipe, check_manifest,  # noqa: F401
                                  recipe_main, sha256, write_manifest)

SCHEDULER = {"_class_name": "UniPCMultistepScheduler", "num_train_timesteps": 1000,
             "prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0,
             "solver_order": 2, "solver_type": "bh2", "lower_order_final": True}


@dataclass(frozen=True)
class Sizes:
    """Everything that sets the cost of the recipe."""

    clips: int                   # training clips (seen combinations only)
    vae_eval_clips: int          # of them held out of VAE training, for its PSNR
    height: int
    width: int
    frames: int
    vae: dict                    # AutoencoderKLWan config (architecture part)
    vae_steps: int
    vae_batch: int
    vae_crop: int                # square crop of both VAE stages (0 = whole frames)
    vae_focus: float             # data.crop_focus of both VAE stages: the share of crops that
                                 # are the busiest of 4 (the object fills ~6% of a frame, so
                                 # most random 32x32 crops hold only background)
    vae_frames: int              # frames per window of the first VAE stage (4k+1)
    vae_lr: float
    vae_clips: int               # clips the VAE reads (the first ones; 0 = all)
    vae_evals: int               # held-out PSNR evaluations during VAE training (+ the last)
    vae_long_steps: int          # then whole clips (all frames: every cache hand-over trained)
    vae_long_batch: int
    vae_long_lr: float
    transformer: dict            # WanTransformer3DModel config
    transformer_steps: int
    transformer_batch: int
    transformer_lr: float
    timestep_sampler: str        # training noise levels: uniform | logit_normal, then shifted
    flow_shift: float            # by this (SCHEDULER's flow_shift is the sampler's)
    transformer_dtype: str       # dtype of the shipped transformer weights
    transformer_remat: str       # model.remat of the training step (save_dots: 15% faster
                                 # on 2 CPU cores than none, less residual traffic in the scan)
    text_dropout: float
    umt5: dict                   # UMT5EncoderModel config (vocab_size set from the tokenizer)
    tokenizer_vocab: int
    text_len: int
    checkpoint_every: int

    @property
    def z_dim(self) -> int:
        return self.vae["z_dim"]


# 4x spatial / 4x temporal compression (two levels, both halving time): 8x spatial (Wan's
# own 1-2-4-4) plateaued near 19 dB in 600 steps here; 16 channels per 4x4x4 pixels reach
# 30 dB in the recipe's budget. The transformer's 4x4 patches keep 16x16-pixel tokens.
_VAE = dict(base_dim=16, z_dim=16, dim_mult=[1, 2, 4], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[True, True], dropout=0.0, scale_factor_spatial=4,
            scale_factor_temporal=4)
_UMT5 = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
             relative_attention_num_buckets=32, relative_attention_max_distance=128,
             layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu")


# Where the layout (start, direction) is decided — the first sampler steps, sigma > 0.95 —
# the model must have been trained: a logit-normal sampler puts < 1% of its noise levels there,
# and such models took the layout from the noise seed and ignored the direction word (the same
# seed gave the same motion for "left" and "right"). So noise levels are uniform, shifted as
# the sampler's (3). And the width must exceed a patch's latent values (4x4 x 16 channels =
# 256): near pure noise the velocity ``noise - x0`` is mostly the input noise, which a narrower
# model cannot pass through (width 128 plateaued at loss 0.66); width 320 keeps the 4x4
# patches (80 tokens, cheap).
# Stage lengths and batch: the runs that chose them, with their PSNR and prompt-following
# numbers, are in docs/demo_model/choices.md.
def _transformer(heads: int, head_dim: int, ffn: int, layers: int) -> dict:
    return dict(patch_size=[1, 4, 4], num_attention_heads=heads, attention_head_dim=head_dim,
                in_channels=16, out_channels=16, text_dim=64, freq_dim=64, ffn_dim=ffn,
                num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                eps=1e-6, rope_max_seq_len=1024, image_dim=None, added_kv_proj_dim=None,
                pos_embed_seq_len=None)


FULL = Sizes(clips=1600, vae_eval_clips=32, height=64, width=64, frames=17, vae=_VAE,
             vae_steps=1300, vae_batch=8, vae_crop=32, vae_focus=0.67, vae_frames=9,
             vae_lr=1e-3, vae_clips=480, vae_evals=4, vae_long_steps=700, vae_long_batch=4,
             vae_long_lr=3e-4, transformer=_transformer(5, 64, 1024, 4), transformer_steps=6000,
             transformer_batch=12, transformer_lr=5e-4,
             timestep_sampler="uniform", flow_shift=3.0,
             transformer_dtype="bfloat16", transformer_remat="save_dots", text_dropout=0.1,
             umt5=_UMT5,
             tokenizer_vocab=64, text_len=16, checkpoint_every=500)
SMOKE = dataclasses.replace(
    FULL, clips=24, vae_eval_clips=4, height=32, width=32, frames=5,
    vae=dict(_VAE, base_dim=8), vae_steps=12, vae_batch=2, vae_crop=0, vae_focus=0.0,
    vae_lr=2e-3, vae_evals=0,
    vae_long_steps=4, vae_long_batch=2,
    transformer=_transformer(2, 16, 64, 1), transformer_steps=12, transformer_batch=8,
    transformer_lr=2e-3, transformer_dtype="float32", checkpoint_every=6)
SIZES = {"full": FULL, "smoke": SMOKE}


STAGES = ("data", "vae", "vae_long", "text", "latents", "transformer", "assemble")


def tokenizer_corpus() -> list[str]:
    """Every canonical prompt and every paraphrase of every combination (held-out ones too:
    the words are the vocabulary's, only their combinations are held out of training)."""
    from ditax.synthetic.vocab import PARAPHRASE_TEMPLATES, all_combinations, paraphrase

    out = []
    for combo in all_combinations():
        out.append(combo.prompt)
        out += [paraphrase(combo, k) for k in range(len(PARAPHRASE_TEMPLATES))]
    return out


def _model_index() -> dict:
    return {"_class_name": "WanPipeline", "_diffusers_version": "0.35.0",
            "boundary_ratio": None, "expand_timesteps": False,
            "scheduler": ["diffusers", "UniPCMultistepScheduler"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
            "transformer": ["diffusers", "WanTransformer3DModel"],
            "transformer_2": [None, None], "vae": ["diffusers", "AutoencoderKLWan"]}


class Recipe(StagedRecipe):
    """One run of the recipe into ``out`` (work files) and ``folder`` (the pipeline)."""

    NAME = "demo-model"
    STAGES = STAGES
    MARKERS = {"data": "clips/captions.jsonl", "vae": "vae/vae/config.json",
               "vae_long": "vae_long/vae/config.json",
               "text": "encoders/text_encoder/config.json", "latents": "latents/meta.json"}

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        #: each VAE stage's trainer (its compiled train step, encode and decode), for runs of
        #: its config at another length or output (``train_vae(..., trainer=)``: the tests)
        self.vae_trainers: dict = {}
        #: each VAE stage's clips in memory (both stages read the same clips: read once)
        self.vae_banks: dict = {}

    # --- stages
    def data(self):
        from ditax.synthetic.clips import write_dataset

        s = self.sizes
        write_dataset(self.out / "clips", s.clips, self.seed, height=s.height, width=s.width,
                      num_frames=s.frames, paraphrase_fraction=0.3)
        return {"clips": s.clips}

    def _vae_config(self, long: bool):
        from ditax.train.wan.vae_config import load_vae_config

        s = self.sizes
        steps = s.vae_long_steps if long else s.vae_steps
        return load_vae_config(None, **{f"vae.{k}": v for k, v in s.vae.items()}, **{
            "data.source": str(self.out / "clips"), "data.num_frames": s.frames,
            "data.height": s.height, "data.width": s.width, "data.crop": s.vae_crop,
            "data.crop_frames": s.frames if long else min(s.vae_frames, s.frames),
            "data.crop_focus": s.vae_focus,
            "data.eval_clips": s.vae_eval_clips, "data.max_clips": s.vae_clips,
            "steps": steps, "batch_size": s.vae_long_batch if long else s.vae_batch,
            "seed": self.seed + long,
            "optim.learning_rate": s.vae_long_lr if long else s.vae_lr,
            "optim.warmup_steps": 0 if long else min(20, steps // 4),
            # explicit (the default is ``steps``: the same schedule), so that a run of another
            # length may reuse the stage's trainer (``vae_trainers``) and resume
            "optim.decay_steps": steps, "optim.schedule": "cosine",
            "checkpoint.every": s.checkpoint_every,
            "log_every": 5,
            "eval_every": steps // s.vae_evals if s.vae_evals and not long else 0,
            "init_from": str(self.out / "vae" / "vae") if long else "",
            "output_dir": str(self.out / ("vae_long" if long else "vae"))})

    def _bank(self, data):
        """The clips of VAE data config ``data``: those an earlier stage read when it read the
        same clips (folder, sizes, how many, held out), with ``data``'s crops."""
        import copy

        from ditax.train.wan.vae import ClipBank

        same = ("source", "num_frames", "height", "width", "max_clips", "eval_clips")
        for bank in self.vae_banks.values():
            if all(getattr(bank.data, k) == getattr(data, k) for k in same):
                bank = copy.copy(bank)
                bank.data = data
                return bank
        return ClipBank(data, say=self.say)

    def _train_vae(self, long: bool):
        import jax

        from ditax.train.wan.vae import VAETrainer, train_vae

        cfg = self._vae_config(long)
        name = "vae_long" if long else "vae"
        # the long stage runs the first stage's compiled step, encode and decode (the same VAE,
        # loss and devices; the learning rate is an argument of the step)
        trainer = VAETrainer(cfg, jax.devices()[:self.devices],
                             programs_from=self.vae_trainers.get("vae") if long else None)
        self.vae_trainers[name] = trainer
        bank = self.vae_banks[name] = self._bank(cfg.data)
        res = train_vae(cfg, trainer=trainer, bank=bank, progress=self.progress, say=self.say)
        return {"eval_psnr_db": round(res.eval_psnr, 2), "first_loss": res.losses[0] if
                res.losses else None, "last_loss": res.losses[-1] if res.losses else None}

    def vae(self):
        """Short windows (``temporal_factor * 2 + 1`` frames, cheap) from random weights."""
        return self._train_vae(long=False)

    def vae_long(self):
        """Then whole clips, so that every chunk hand-over of the causal cache is trained."""
        return self._train_vae(long=True)

    def text(self):
        from ditax.demo.folders import write_text_encoder, write_tokenizer

        s = self.sizes
        work = self.out / "encoders"
        vocab = write_tokenizer(work / "tokenizer", corpus=tokenizer_corpus(),
                                vocab_size=s.tokenizer_vocab, kind="words")
        umt5 = dict(s.umt5, vocab_size=vocab)
        write_text_encoder(work / "text_encoder", config=umt5, seed=self.seed + 2)
        shutil.copytree(self.out / "vae_long" / "vae", work / "vae", dirs_exist_ok=True)
        return {"tokenizer_vocab": vocab}

    def latents(self):
        from ditax.train.preprocess import preprocess

        s = self.sizes
        lines = []
        preprocess(self.out / "clips", self.out / "latents", self.out / "encoders",
                   height=s.height, width=s.width, frames=s.frames, text_len=s.text_len,
                   batch=8, say=lines.append)
        return {"samples": len(lines)}

    def transformer(self):
        from ditax.config import load_config

        s = self.sizes
        t = s.transformer
        over = {f"model.{k}": v for k, v in t.items()
                if k not in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len")}
        over["model.patch_size"] = tuple(t["patch_size"])
        cfg = load_config("tiny", [f"{k}={json.dumps(list(v)) if isinstance(v, tuple) else v}"
                                   for k, v in over.items()]
                          + self.transformer_args(s.frames, s.height, s.width, 10) + [
            f"flow.timestep_sampler={s.timestep_sampler}", f"model.remat={s.transformer_remat}"])
        return self.train_transformer(cfg, "transformer training (flow matching)")

    def assemble(self):
        from ditax.demo import sample_defaults, write_sample_defaults
        from ditax.io.export import save_folder
        from ditax.models.wan.config import ModelConfig
        from ditax.models.wan.convert import weight_table

        f = self.folder
        if f.exists():
            shutil.rmtree(f)
        enc = self.out / "encoders"
        for name in ("tokenizer", "text_encoder", "vae"):
            shutil.copytree(enc / name, f / name)
        t = self.sizes.transformer
        cfg = ModelConfig.from_diffusers(t)
        import jax
        import numpy as np

        params = jax.tree.map(np.asarray, self._transformer_params)
        save_folder(f / "transformer", "diffusion_pytorch_model.safetensors",
                    weight_table(cfg.num_layers, cfg.cross_attn_norm,
                                 head_dim=cfg.attention_head_dim), params,
                    {"_class_name": "WanTransformer3DModel", **t},
                    dtype=self.sizes.transformer_dtype)
        (f / "scheduler").mkdir(parents=True)
        (f / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER, indent=2))
        (f / "model_index.json").write_text(json.dumps(_model_index(), indent=2))
        z = self.sizes   # ditax_sample.json: sampled at its training size
        write_sample_defaults(f, sample_defaults(z.height, z.width, z.frames, z.text_len))
        return self.finish_folder(f, ("vae", "vae_long", "transformer"))


def main(argv=None) -> int:
    return recipe_main(argv, Recipe, SIZES, prog="python -m ditax.recipes.demo_model",
                       description=__doc__.split("\n\n")[0], default_out="demo_model")


if __name__ == "__main__":
    raise SystemExit(main())
