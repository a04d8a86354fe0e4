"""The examples every ``ditax COMMAND --help`` ends with, kept in one place.

:data:`EXAMPLES` maps each command to two or three ``(what it does, command line)`` pairs;
:func:`epilog` renders them for the command's parser (``build_parser`` passes it with a
``RawDescriptionHelpFormatter`` so the lines stay as written). Each line is a real command:
``tests/cli/test_help.py`` parses every one with the command's own parser, and the
ones that need no download run as written from the repository root (files they name, like
``videos/``, are the user's).
"""

from __future__ import annotations

import re
import textwrap

EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "generate": [
        ("the shipped demo model, sampled at its own size and steps (no download)",
         'ditax generate --model demo --prompt "a red circle moves right" --output red.mp4'),
        ("Wan 2.1 1.3B from the hub (only its JSON + safetensors files are fetched), in bf16",
         'ditax generate --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --prompt "a cat walks on '
         'the grass" --height 480 --width 832 --frames 81 --steps 50 --output cat.mp4 '
         'model.dtype=bfloat16'),
        ("step caching, and the frames as PNGs too",
         'ditax generate --model demo --prompt "a blue square moves up" --frames-dir frames/ '
         'sample.cache=teacache --no-progress'),
    ],
    "train": [
        ("a smoke run: the tiny random model on synthetic data",
         "ditax train tiny steps=20 output_dir=out/tiny"),
        ("fine-tune Wan 2.1 1.3B on latents from `ditax preprocess`; a checkpoint every 500 "
         "steps, the last 3 kept (rerun the same command to resume)",
         "ditax train wan2.1-t2v-1.3b init_from=Wan-AI/Wan2.1-T2V-1.3B-Diffusers "
         "data.source=data/latents steps=2000 batch_size=8 mesh.fsdp=8 checkpoint.every=500 "
         "checkpoint.keep=3 output_dir=runs/a"),
        ("every config key with its default, and the presets",
         "ditax config wan2.1-t2v-1.3b"),
    ],
    "train-vae": [
        ("a small Wan VAE on a folder of clips",
         "ditax train-vae data.source=videos/ vae.base_dim=16 vae.dim_mult=[1,2,4,4] "
         "data.num_frames=17 data.height=64 data.width=64 data.crop=32 batch_size=8 "
         "steps=2000 output_dir=runs/vae"),
        ("a YAML config plus overrides, data-parallel over 8 devices",
         "ditax train-vae vae.yaml steps=4000 batch_size=16 --devices 8"),
        ("every train-vae key with its default", "ditax config --vae"),
    ],
    "preprocess": [
        ("videos/ holds clip.mp4 + clip.txt (or captions.jsonl): latents and text embeddings "
         "for `ditax train data.source=data/latents`",
         "ditax preprocess videos/ data/latents --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers "
         "--height 480 --width 832 --frames 81"),
        ("four clips per encoder call, in bf16",
         "ditax preprocess videos/ data/latents-bf16 --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers "
         "--height 480 --width 832 --frames 81 --batch 4 --dtype bfloat16"),
        ("landscape, portrait and square clips and stills in shape buckets, the clips split "
         "over 4 machines (this one: --process-id 0; the last to finish writes meta.json)",
         "ditax preprocess videos/ data/buckets --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers "
         "--buckets 832x480x81,480x832x81,624x624x81,832x480x1 --num-processes 4 "
         "--process-id 0"),
    ],
    "convert": [
        ("check a transformer folder: config.json against the safetensors headers",
         "ditax convert Wan-1.3B/transformer"),
        ("an original / ComfyUI single file → a diffusers transformer folder",
         "ditax convert wan2.1_t2v_1.3B_bf16.safetensors --config wan2.1-t2v-1.3b "
         "--out Wan-1.3B/transformer"),
        ("the same with a LoRA fused in, written in bf16",
         "ditax convert wan2.1_t2v_1.3B_bf16.safetensors --config wan2.1-t2v-1.3b "
         "--out Wan-1.3B-style/transformer --lora style.safetensors:0.8 --dtype bfloat16"),
    ],
    "export": [
        ("a fine-tune's newest checkpoint → a pipeline folder (the VAE, text encoder, tokenizer "
         "and scheduler copied from the run's init_from)",
         "ditax export runs/a --out Wan-1.3B-tuned"),
        ("checkpoint step 500 in bf16, the other components linked from a given pipeline",
         "ditax export runs/a --out Wan-1.3B-tuned-500 --step 500 --dtype bfloat16 "
         "--base Wan-AI/Wan2.1-T2V-1.3B-Diffusers --link"),
    ],
    "bench": [
        ("the tiny model's forward at a 5x32x32 latent", "ditax bench tiny --latent 5,32,32 "
         "--repeats 3"),
        ("the same with Ulysses sequence parallelism over 4 devices",
         "ditax bench tiny attention.backend=ulysses mesh.context=4"),
    ],
    "plan": [
        ("mesh, shardings and memory per device of the tiny model on 8 simulated CPU devices",
         "ditax plan tiny --target cpu:8"),
        ("Wan 2.1 14B's forward compiled for a TPU v6e-8 without a TPU: memory, copies, "
         "roofline per chip (needs the [tpu] extra; --train adds a training step)",
         "ditax plan wan2.1-t2v-14b --target tpu-v6e-8 mesh.fsdp=8 --compile"),
        ("as one JSON object", "ditax plan tiny --devices 8 mesh.context=2 --json"),
    ],
    "calibrate-cache": [
        ("the demo model, with prompts of its own vocabulary",
         "ditax calibrate-cache --model demo --output demo_cache.json"),
        ("a hub model with your prompts, put into an existing numbers file",
         'ditax calibrate-cache --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --prompts "a cat walks on '
         'the grass" "a red car drives through the rain" --steps 50 --into cache_numbers.json'),
    ],
    "init-random": [
        ("a small random LTX-2 folder (seconds, no download), then a video from it",
         "ditax init-random ltx2-tiny --out ltx2-random"),
        ("the small presets of every family", "ditax init-random --list"),
        ("Wan 2.1 1.3B at its real size with random weights (speed and memory measurements)",
         "ditax init-random wan2.1-t2v-1.3b --out wan-1.3b-random --text-layers 2"),
    ],
    "config": [
        ("every section and key with its default, and the presets", "ditax config"),
        ("a preset's values with overrides applied (what `ditax train` would run)",
         "ditax config tiny mesh.fsdp=8 checkpoint.every=5"),
        ("the keys of `ditax train-vae`", "ditax config --vae"),
    ],
    "serve": [
        ("the demo model on http://127.0.0.1:8000 (page at /, API at /v1/videos), jobs kept in "
         "serve/jobs.sqlite", "ditax serve --model demo --db serve/jobs.sqlite"),
        ("on every interface, with a key, batches of up to 8",
         "ditax serve --model demo --host 0.0.0.0 --api-key secret --max-batch 8"),
    ],
}


WIDTH = 92
_WORD = re.compile(r'(?:"[^"]*"|\'[^\']*\'|[^\s"\'])+')   # a shell word, quotes kept whole


def shell_lines(line: str, indent: str = "  ") -> list[str]:
    """``line`` folded at word boundaries into shell lines joined by `` \\`` (a copy-paste
    still runs); quoted arguments are never split."""
    words = _WORD.findall(line)
    units = []                  # a flag stays on the line of its value: `--height 480`
    for word in words:
        if units and units[-1].startswith("--") and " " not in units[-1] and \
                not word.startswith("-") and "=" not in word:
            units[-1] += " " + word
        else:
            units.append(word)
    out, current = [], indent
    for word in units:
        if current.strip() and len(current) + len(word) + 3 > WIDTH:
            out.append(current + " \\")
            current = indent + "    "
        current += ("" if not current.strip() else " ") + word
    return out + [current]


def epilog(command: str) -> str:
    """The ``examples:`` block at the end of ``ditax COMMAND --help``."""
    lines = ["examples:"]
    for what, line in EXAMPLES[command]:
        lines += textwrap.wrap(what, WIDTH, initial_indent="  # ", subsequent_indent="  # ")
        lines += shell_lines(line)
    return "\n".join(lines)


def top_epilog(commands: dict[str, str]) -> str:
    """The end of ``ditax --help``: the first example of each command."""
    lines = ["examples (ditax COMMAND --help shows more):"]
    for name in commands:
        lines += shell_lines(EXAMPLES[name][0][1])
    return "\n".join(lines)


__all__ = ["EXAMPLES", "epilog", "top_epilog"]
