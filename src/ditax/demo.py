"""``make demo``: the demo model ditax trained itself, prompt → video on a fresh machine.

The model (``ditax.demo.model_path()``, a diffusers ``WanPipeline`` folder shipped in the
package) was trained from nothing by ``make demo-model`` (:mod:`ditax.recipes.demo_model`):
synthetic clips of one bright object (red / green / blue / yellow / white circle or square)
moving left / right / up / down on a dark background; prompts ``a {colour} {shape} moves
{direction}``; five combinations held out of training. :data:`SAMPLE` is how it is meant to
be sampled.

The model's 4-step student (``ditax.demo.student_lora_path()``, a LoRA distilled from it by
``make demo-student``: :mod:`ditax.recipes.demo_student`) samples in 4 Euler steps without
guidance (:data:`STUDENT_SAMPLE`; the loader's part, Euler and its shift, :data:`STUDENT_LOAD`,
is also carried by the LoRA file, so ``load_pipeline(model_path(), loras=[(student_lora_path(),
1.0)])`` applies it).

``python -m ditax.demo`` generates three prompts (one held out) with the model and with its
student, writes ``demo_out/*.mp4``, ``demo_out/student_*.mp4`` and
``demo_out/contact_sheet.png`` (each teacher row above its student row), prints per-phase
timings of both and their prompt-following scores (:mod:`ditax.synthetic.score`).
``ditax generate --model demo --prompt ...`` samples it too.

The random-weights folder builders below (:func:`build_pipeline_folder`) are what tests and
benchmarks use for a small Wan pipeline of any shape.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

OUT = pathlib.Path("demo_out")

# small but not trivial: D=128 transformer, 16-channel latents, 64-wide UMT5
TRANSFORMER = dict(patch_size=[1, 2, 2], num_attention_heads=4, attention_head_dim=32,
                   in_channels=16, out_channels=16, text_dim=64, freq_dim=64, ffn_dim=256,
                   num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                   eps=1e-6, rope_max_seq_len=1024, image_dim=None, added_kv_proj_dim=None)
VAE = dict(base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
           temperal_downsample=[False, True, True], dropout=0.0,
           latents_mean=[0.0] * 16, latents_std=[1.0] * 16)
UMT5 = dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
            relative_attention_num_buckets=32, relative_attention_max_distance=128,
            layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu")
SCHEDULER = dict(_class_name="UniPCMultistepScheduler", num_train_timesteps=1000,
                 prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                 solver_order=2, solver_type="bh2", lower_order_final=True)
CORPUS = [
    "a cat walks on the grass in the sun", "a dog runs along the beach at sunset",
    "two people dance in a neon lit street at night", "close up of a flower opening",
    "a red car drives through the rain", "waves crash on the rocks under a grey sky",
    "a bird flies over a green valley", "blurry, low quality, static, worst quality",
]


def write_transformer(folder: pathlib.Path, seed: int = 0):
    """Random Wan transformer → diffusers ``WanTransformer3DModel`` safetensors + config."""
    from ditax.config import ModelConfig
    from ditax.io.export import module_params, save_folder
    from ditax.models.wan.convert import weight_table
    from ditax.models.wan.build import init_model

    cfg = ModelConfig.from_diffusers(TRANSFORMER)
    save_folder(folder, "diffusion_pytorch_model.safetensors",
                weight_table(cfg.num_layers, cfg.cross_attn_norm, head_dim=cfg.attention_head_dim),
                module_params(init_model(cfg, seed=seed)),
                {"_class_name": "WanTransformer3DModel", **TRANSFORMER})


def write_vae(folder: pathlib.Path, seed: int = 1):
    """Random Wan VAE → diffusers ``AutoencoderKLWan`` safetensors + config."""
    from flax import nnx

    from ditax.io.export import module_params, save_folder
    from ditax.models.vae.wan import WanVAE, WanVAEConfig
    from ditax.models.vae.wan.convert import weight_table

    vae = WanVAE(WanVAEConfig.from_diffusers(VAE), rngs=nnx.Rngs(seed))
    save_folder(folder, "diffusion_pytorch_model.safetensors", weight_table(vae),
                module_params(vae), {"_class_name": "AutoencoderKLWan", **VAE})


def write_text_encoder(folder: pathlib.Path, seed: int = 2, config: dict | None = None):
    """Random UMT5 encoder (``config``: transformers ``UMT5Config`` fields, default
    :data:`UMT5`) → transformers ``UMT5EncoderModel`` safetensors + config."""
    from flax import nnx

    from ditax.io.export import module_params, save_folder
    from ditax.models.encoders.t5 import weight_table
    from ditax.models.encoders.umt5 import UMT5Config, UMT5Encoder

    config = config or UMT5
    cfg = UMT5Config.from_hf(config)
    save_folder(folder, "model.safetensors", weight_table(cfg),
                module_params(UMT5Encoder(cfg, rngs=nnx.Rngs(seed))),
                {"architectures": ["UMT5EncoderModel"], "model_type": "umt5", **config})


def write_tokenizer(folder: pathlib.Path, vocab_size: int = 200, corpus=None,
                    max_vocab: int | None = None, kind: str = "unigram") -> int:
    """A T5-style tokenizer ('</s>' appended, '<pad>' = 0) trained on ``corpus`` (default: a
    few generic lines); returns its vocabulary size. ``kind``: ``unigram`` (sub-words, like
    T5's) or ``words`` (one token per word and per punctuation mark: short sequences for a
    closed vocabulary). ``max_vocab``: the text encoder's vocabulary, not to be outgrown."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import Unigram, WordLevel

    special = ["<pad>", "</s>", "<unk>"]
    if kind == "words":
        tok = Tokenizer(WordLevel(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Punctuation()])
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=special)
    elif kind == "unigram":
        tok = Tokenizer(Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                          special_tokens=special)
    else:
        raise ValueError(f"kind={kind!r}: use 'unigram' or 'words'")
    tok.train_from_iterator(list(corpus or CORPUS) * 8, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    if max_vocab is not None and tok.get_vocab_size() > max_vocab:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, more than the text "
                           f"encoder's vocabulary of {max_vocab}")
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
         "padding_side": "right", "model_max_length": 512,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    return tok.get_vocab_size()


def build_pipeline_folder(root: pathlib.Path) -> pathlib.Path:
    """Write the whole random pipeline folder (diffusers ``WanPipeline`` layout) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    write_tokenizer(root / "tokenizer", max_vocab=UMT5["vocab_size"])
    write_text_encoder(root / "text_encoder")
    write_vae(root / "vae")
    write_transformer(root / "transformer")
    (root / "scheduler").mkdir(exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER, indent=2))
    (root / "model_index.json").write_text(json.dumps({
        "_class_name": "WanPipeline", "_diffusers_version": "0.35.0",
        "boundary_ratio": None, "expand_timesteps": False,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": [None, None],
        "vae": ["diffusers", "AutoencoderKLWan"]}, indent=2))
    return root


# --- the shipped demo model

DEMO_PROMPTS = ("a red circle moves right", "a blue square moves up",
                "a yellow circle moves right")       # the last one is a held-out combination

# how the demo recipe's models are meant to be sampled, besides their training size (written
# into the folder's ditax_sample.json by the recipe); guidance 8 measured best for direction on
# the previous (batch-16) model (benchmarks/demo_quality.py, seen combinations x 3 seeds:
# direction 95.2% at 4, 98.1% at 5, 99.0% at 6, 100% at 8; colour 100% at each); the shipped
# model at 8: colour 95.2%, direction 98.1%
SAMPLE_STEPS, SAMPLE_GUIDANCE = 25, 8.0


def sample_defaults(height: int, width: int, frames: int, text_len: int) -> dict:
    """The ``ditax_sample.json`` of a demo-recipe model trained at this size (the pipeline
    call's keyword arguments of those names)."""
    return dict(height=height, width=width, num_frames=frames,
                num_inference_steps=SAMPLE_STEPS, guidance_scale=SAMPLE_GUIDANCE,
                negative_prompt="", max_sequence_length=text_len)


def write_sample_defaults(folder, values: dict):
    """Write ``values`` as ``folder``'s ``ditax_sample.json`` (checked); returns the path."""
    from ditax.pipelines.sample_defaults import write_sample_defaults as write

    return write(folder, values)


def __getattr__(name: str):
    """``SAMPLE``: keyword arguments of the pipeline call the shipped demo model is meant to be
    sampled with, read from its folder's ``ditax_sample.json`` (one source: what
    ``load_pipeline(model_path())`` then ``pipe(prompt)`` uses too). ``FLUX_SAMPLE``: the
    same for the small Flux (:func:`flux_model_path`; the Flux pipeline call's keywords);
    ``FLUX_STUDENT_SAMPLE`` for its 4-step student LoRA (:func:`flux_student_lora_path`). A
    fresh dict each time."""
    if name == "SAMPLE":
        from ditax.pipelines.sample_defaults import CALL_KEYS, read_sample_defaults

        values = read_sample_defaults(model_path())
        return {k: v for k, v in values.items() if k in CALL_KEYS}
    if name in ("STUDENT_SAMPLE", "STUDENT_LOAD"):
        return student_settings(load=name == "STUDENT_LOAD")
    if name == "FLUX_SAMPLE":
        from ditax.io.files import read_model_json

        return dict(read_model_json(flux_model_path() / "ditax_sample.json", "ditax_sample.json"))
    if name == "FLUX_STUDENT_SAMPLE":
        return _flux_student_sample()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def model_path() -> pathlib.Path:
    """The shipped demo pipeline folder (inside the installed package)."""
    path = pathlib.Path(__file__).parent / "assets" / "demo_model"
    if not (path / "model_index.json").is_file():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the demo model is missing from {path}; reinstall ditax, or "
                            "train it with `make demo-model`")
    return path


STUDENT_DIR = "demo_student"
STUDENT_LORA = "lora.safetensors"


def student_lora_path() -> pathlib.Path:
    """The demo model's shipped 4-step student: a LoRA (diffusers / PEFT keys) on
    :func:`model_path`, distilled by ``make demo-student`` (:mod:`ditax.recipes.demo_student`).
    Its file carries its sampling settings (safetensors metadata ``ditax_sample``), also
    written beside it as ``ditax_sample.json``."""
    path = pathlib.Path(__file__).parent / "assets" / STUDENT_DIR / STUDENT_LORA
    if not path.is_file():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the demo model's student is missing from {path.parent}; "
                            "reinstall ditax, or distil it with `make demo-student`")
    return path


def student_settings(load: bool = False, lora=None) -> dict:
    """How the shipped student (or the student ``lora``, a LoRA file with its
    ``ditax_sample.json`` beside it) samples: the pipeline call's keywords
    (``num_inference_steps`` 4, ``guidance_scale`` 1: no classifier-free guidance, ``sigmas``:
    the Euler steps' noise levels before the shift), or with ``load`` the loader's
    (``scheduler="euler"``, ``flow_shift``). A fresh dict each time."""
    from ditax.io.files import read_model_json
    from ditax.pipelines.lora_sample import LOAD_KEYS

    lora = pathlib.Path(lora) if lora else student_lora_path()
    values = read_model_json(lora.parent / "ditax_sample.json", "ditax_sample.json")
    return {k: v for k, v in values.items() if (k in LOAD_KEYS) == load}


def load_student(path=None, lora=None, **kw):
    """The demo model (``path``: default :func:`model_path`) with its 4-step student
    (``lora``: default :func:`student_lora_path`) at strength 1, loaded with the student's
    sampler and shift (:data:`STUDENT_LOAD`, or those beside ``lora``); sample it with
    ``**STUDENT_SAMPLE``. ``kw``: more :func:`~ditax.pipelines.wan.loading.load_pipeline`
    arguments."""
    from ditax.pipelines.wan.loading import load_pipeline

    lora = lora or student_lora_path()
    return load_pipeline(path or model_path(), loras=[(str(lora), 1.0)],
                         **{**student_settings(load=True, lora=lora), **kw})


def flux_model_path() -> pathlib.Path:
    """The shipped small Flux (a diffusers ``FluxPipeline`` folder inside the installed
    package, trained by ``make flux-demo-model``: :mod:`ditax.recipes.flux_demo_model`)."""
    path = pathlib.Path(__file__).parent / "assets" / "flux_demo_model"
    if not (path / "model_index.json").is_file():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the small Flux demo model is missing from {path}; reinstall "
                            "ditax, or train it with `make flux-demo-model`")
    return path


def flux_student_lora_path() -> pathlib.Path:
    """The small Flux's shipped 4-step student: a LoRA on :func:`flux_model_path` distilled by
    DMD2 (``make flux-demo-student``: :mod:`ditax.recipes.flux_demo_student`), its sampling
    settings in its metadata and in ``ditax_sample.json`` beside it."""
    path = pathlib.Path(__file__).parent / "assets" / "flux_demo_student" / "lora.safetensors"
    if not path.is_file():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the small Flux's student LoRA is missing: {path}; reinstall "
                            "ditax, or distil it with `make flux-demo-student`")
    return path


def _flux_student_sample() -> dict:
    """``FLUX_STUDENT_SAMPLE``: the pipeline call that samples the small Flux with its student
    LoRA (``load_pipeline(flux_model_path(), loras=[(flux_student_lora_path(), 1.0)])``): the
    teacher's size and text length (:data:`FLUX_SAMPLE`), the student's steps, sigmas and
    guidance (the LoRA's ``ditax_sample.json``; its flow shift is the loader's, taken from the
    LoRA at load)."""
    from ditax.io.files import read_model_json
    from ditax.pipelines.lora_sample import LOAD_KEYS

    size = {k: v for k, v in __getattr__("FLUX_SAMPLE").items()
            if k in ("height", "width", "max_sequence_length")}
    own = read_model_json(flux_student_lora_path().parent / "ditax_sample.json",
                          "ditax_sample.json")
    return {**size, **{k: v for k, v in own.items() if k not in LOAD_KEYS}}


def _slug(prompt: str) -> str:
    return "_".join(prompt.split()[1:])


def _sample_prompts(pipe, prompts, seed, sample, out, prefix, say, tag=""):
    """``prompts`` through ``pipe(prompt, seed=seed + i, **sample)``: each written as
    ``out/{prefix}{slug}.mp4`` and scored; ``(rows, videos, phases)``."""
    import time

    from ditax.io.video import write_mp4
    from ditax.synthetic.score import score
    from ditax.synthetic.vocab import is_held_out, parse_prompt

    phases = {"load": pipe.load_time, "text": 0.0, "compile": 0.0, "denoise": 0.0,
              "decode": 0.0, "write": 0.0}
    videos, rows = [], []
    for i, prompt in enumerate(prompts):
        video = pipe(prompt, seed=seed + i, progress=False, **sample)
        for k in ("text", "compile", "denoise", "decode"):
            phases[k] += getattr(pipe.timings, k)
        t1 = time.perf_counter()
        mp4 = write_mp4(out / f"{prefix}{_slug(prompt)}.mp4", video)
        phases["write"] += time.perf_counter() - t1
        sc = score(video, prompt)
        held = is_held_out(parse_prompt(prompt))
        rows.append({"prompt": prompt, "held_out": held, "file": str(mp4),
                     "transformer_calls": pipe.last_stats.get("transformer_calls"), **{
                         k: sc[k] for k in ("colour_correct", "shape_correct",
                                            "direction_correct", "colour", "shape",
                                            "direction")}})
        videos.append(video)
        mark = lambda ok: "ok" if ok else "MISS"   # noqa: E731
        say(f"  {tag}{prompt!r}{' (held out of training)' if held else ''}: colour "
            f"{sc['colour'] or '-'} {mark(sc['colour_correct'])}, shape "
            f"{sc['shape'] or '-'} {mark(sc['shape_correct'])}, direction "
            f"{sc['direction'] or '-'} {mark(sc['direction_correct'])} -> {mp4}")
    return rows, videos, phases


def _summary(rows) -> dict:
    return {k: sum(r[f"{k}_correct"] for r in rows) / len(rows)
            for k in ("colour", "shape", "direction")}


def run_demo(out=OUT, prompts=DEMO_PROMPTS, seed: int = 0, path=None, say=print,
             student: bool = True) -> dict:
    """Generate ``prompts`` with the demo model (as :data:`SAMPLE` says) and, with
    ``student``, with its 4-step student (:func:`load_student`, :data:`STUDENT_SAMPLE`; the
    same seeds); write mp4s (the student's ``student_*.mp4``) + one contact sheet (each
    teacher row above its student row); return the record (per-phase seconds, scores; the
    student's under ``"student"``)."""
    import time

    t0 = time.perf_counter()
    from ditax.compile_cache import compile_cache
    from ditax.pipelines.wan.loading import load_pipeline
    from ditax.synthetic.sheet import contact_sheet

    t_import = time.perf_counter() - t0
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sample = __getattr__("SAMPLE")
    with compile_cache("auto") as cache_dir:
        pipe = load_pipeline(path or model_path())
        rows, videos, phases = _sample_prompts(pipe, prompts, seed, sample, out, "", say,
                                               "teacher " if student else "")
        phases = {"import": t_import, **phases}
        if student:
            spipe = load_student(path)
            s_sample = __getattr__("STUDENT_SAMPLE")
            s_rows, s_videos, s_phases = _sample_prompts(spipe, prompts, seed, s_sample, out,
                                                         "student_", say, "student ")
    t1 = time.perf_counter()
    sheet_videos, labels = [], []
    for i, (p, r) in enumerate(zip(prompts, rows)):
        held = "  [held out]" if r["held_out"] else ""
        sheet_videos.append(videos[i])
        if not student:
            labels.append(p + held)
            continue
        labels.append(f"teacher, {sample.get('num_inference_steps')} steps x CFG: {p}{held}")
        sheet_videos.append(s_videos[i])
        labels.append(f"student, {s_sample.get('num_inference_steps')} steps: {p}{held}")
    sheet = contact_sheet(sheet_videos, labels, out / "contact_sheet.png", frames=9, scale=2)
    phases["write"] += time.perf_counter() - t1
    rec = {"phases": phases, "videos": rows, "score": _summary(rows), "sheet": str(sheet),
           "compile_cache": str(cache_dir) if cache_dir else None,
           "total": time.perf_counter() - t0}
    if student:
        rec["student"] = {"phases": s_phases, "videos": s_rows, "score": _summary(s_rows),
                          "sample": s_sample, "lora": str(student_lora_path())}
    return rec


FLUX_PROMPTS = ("a red circle on the left", "a blue square on the top",
                "a yellow circle on the right")     # the last one is a held-out combination


def run_flux_demo(out=OUT, prompts=FLUX_PROMPTS, seed: int = 0, path=None, say=print,
                  student: bool = True) -> dict:
    """Generate ``prompts`` with the small Flux (and, with ``student``, its 4-step student, the
    shipped LoRA); write ``flux_*.png`` (``flux_student_*.png``) and ``flux_contact_sheet.png``
    (the student's rows after the teacher's) into ``out``; return the record (seconds per
    image, scores; the student's under ``"student"``)."""
    import time

    import numpy as np
    import PIL.Image

    from ditax.compile_cache import compile_cache
    from ditax.pipelines.flux.loading import load_pipeline
    from ditax.synthetic.images import HELD_OUT, parse_image_prompt, score_image
    from ditax.synthetic.sheet import contact_sheet

    t0 = time.perf_counter()
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [("", __getattr__("FLUX_SAMPLE"), [])]
    if student:
        runs.append(("student_", __getattr__("FLUX_STUDENT_SAMPLE"),
                     [(str(flux_student_lora_path()), 1.0)]))
    recs = []
    with compile_cache("auto"):
        for tag, sample, loras in runs:
            pipe = load_pipeline(path or flux_model_path(), loras=loras)
            images, rows, seconds = [], [], []
            for i, prompt in enumerate(prompts):
                t = time.perf_counter()
                image = pipe(prompt, seed=seed + i, progress=False, **sample)
                seconds.append(time.perf_counter() - t)
                png = out / f"flux_{tag}{_slug(prompt)}.png"
                PIL.Image.fromarray(np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)
                                    ).save(png)
                sc = score_image(image, prompt)
                held = parse_image_prompt(prompt) in HELD_OUT
                rows.append({"prompt": prompt, "held_out": held, "file": str(png),
                             **{k: sc[k] for k in ("colour_correct", "shape_correct",
                                                   "position_correct", "colour", "shape",
                                                   "position")}})
                images.append(image)
                mark = lambda ok: "ok" if ok else "MISS"   # noqa: E731
                say(f"  {tag or 'teacher_'}{prompt!r}{' (held out of training)' if held else ''}"
                    f": colour {sc['colour'] or '-'} {mark(sc['colour_correct'])}, shape "
                    f"{sc['shape'] or '-'} {mark(sc['shape_correct'])}, position "
                    f"{sc['position'] or '-'} {mark(sc['position_correct'])} -> {png}")
            score = {k: sum(r[f"{k}_correct"] for r in rows) / len(rows)
                     for k in ("colour", "shape", "position")}
            # the first call compiles: the median of the others (or the one) per image
            timed = seconds[1:] or seconds
            recs.append({"images": rows, "score": score, "pixels": images,
                         "seconds_per_image": float(np.median(timed))})
    labels = [p + ("  [held out]" if r["held_out"] else "")
              for p, r in zip(prompts, recs[0]["images"])]
    if student:
        labels += [f"{p}  [4-step student]" for p in prompts]
    sheet = contact_sheet([im[None] for r in recs for im in r.pop("pixels")], labels,
                          out / "flux_contact_sheet.png", frames=1, scale=4)
    rec = {**recs[0], "sheet": str(sheet), "total": time.perf_counter() - t0}
    if student:
        rec["student"] = recs[1]
    return rec


def main(argv=None) -> int:
    import time

    t0 = time.perf_counter()
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    print(f"ditax demo: the demo model trained by `make demo-model` ({model_path()})")
    print(f"sampling with {__getattr__('SAMPLE')}")
    print(f"its 4-step student ({student_lora_path()}) with {__getattr__('STUDENT_SAMPLE')}, "
          f"loaded with {__getattr__('STUDENT_LOAD')}")
    rec = run_demo()
    rows = [("teacher", rec)] + ([("student", rec["student"])] if "student" in rec else [])
    for who, r in rows:
        ph = r["phases"]
        sampling = sum(ph[k] for k in ("text", "compile", "denoise", "decode"))
        print(f"timing ({who}): " + " | ".join(f"{k} {v:.2f}s" for k, v in ph.items())
              + f" | sampling {sampling:.2f}s ({ph['denoise']:.2f}s denoising)")
    for who, r in rows:
        sc = r["score"]
        print(f"prompt following (ditax.synthetic.score), {who}, over {len(r['videos'])} "
              f"videos: colour {sc['colour']:.0%}, shape {sc['shape']:.0%}, direction "
              f"{sc['direction']:.0%}")
    print(f"wrote {', '.join(v['file'] for _, r in rows for v in r['videos'])} and "
          f"{rec['sheet']} ({time.perf_counter() - t0:.1f}s)")
    print(f"ditax demo: the small Flux trained by `make flux-demo-model` ({flux_model_path()})")
    print(f"sampling with {__getattr__('FLUX_SAMPLE')}")
    print(f"its 4-step student ({flux_student_lora_path()}) with "
          f"{__getattr__('FLUX_STUDENT_SAMPLE')}")
    rec = run_flux_demo()
    for who, r in [("teacher", rec)] + ([("student", rec["student"])] if "student" in rec
                                        else []):
        sc = r["score"]
        print(f"prompt following (ditax.synthetic.images.score_image), {who}, over "
              f"{len(r['images'])} images: colour {sc['colour']:.0%}, shape {sc['shape']:.0%}, "
              f"position {sc['position']:.0%}; {r['seconds_per_image']:.3f} s an image")
    files = [i["file"] for i in rec["images"] + rec.get("student", {}).get("images", [])]
    print(f"wrote {', '.join(files)} and {rec['sheet']} ({rec['total']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
