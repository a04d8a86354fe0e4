"""References for the FLUX.2 pipelines: diffusers' own preparation of a reference image (the
lines of ``Flux2Pipeline.__call__`` / ``Flux2KleinPipeline.__call__`` step 4, through its
``Flux2ImageProcessor``), and the tiny random pipeline folders (see below)."""

from __future__ import annotations

import numpy as np


def diffusers_reference_image(image, vae_scale_factor: int) -> np.ndarray:
    """diffusers' tensor ``[1, 3, H, W]`` (numpy) of one reference PIL ``image`` for a VAE of
    spatial factor ``vae_scale_factor`` (the pipeline's inline step 4)."""
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor

    proc = Flux2ImageProcessor(vae_scale_factor=vae_scale_factor * 2)
    proc.check_image_input(image)
    w, h = image.size
    if w * h > 1024 * 1024:
        image = proc._resize_to_target_area(image, 1024 * 1024)
        w, h = image.size
    m = vae_scale_factor * 2
    w, h = w // m * m, h // m * m
    return proc.preprocess(image, height=h, width=w, resize_mode="crop").numpy()




#: FLUX.2's scheduler config (the hub folders': dynamic shift, mu from the pipeline)
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                 base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096,
                 time_shift_type="exponential")
#: the text encoders' hidden states the tiny pipelines read (the shared tiny models have 4
#: layers; 3 x their width 32 = the transformer's joint_attention_dim)
TEXT_LAYERS = (1, 2, 4)
#: a klein text encoder deep enough for klein's own layers (9, 18, 27): what a folder needs to
#: run on its defaults (ditax generate, ditax serve)
KLEIN_DEPTH = 27


def write_flux2_pipeline(root, kind: str, seed: int = 0, deep_text: bool = False):
    """Write a tiny diffusers FLUX.2 pipeline folder at ``root``: ``kind`` ``"dev"``
    (``Flux2Pipeline``: tiny Mistral-3, guidance embedding) or ``"klein"`` / ``"klein-base"``
    (``Flux2KleinPipeline`` distilled / base: tiny Qwen3); every component random (the
    transformer, VAE and text builders of the FLUX.2 engineers' references), saved with
    ``save_pretrained``. ``deep_text`` (klein): a Qwen3 of :data:`KLEIN_DEPTH` layers, read at
    klein's default layers, instead of the shared 4-layer one read at :data:`TEXT_LAYERS`.
    Returns the diffusers pipeline."""
    import shutil

    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Pipeline

    from decoder_lm_flux2_reference import TEXT, tiny_flux2_text_folders
    from flux2_reference import TINY, make_diffusers_flux2
    from flux2_vae_reference import TINY as VAE, make_flux2_vae

    if deep_text and kind != "dev":
        from decoder_lm_flux2_reference import make_qwen3, save_qwen3_tokenizer

        tokenizer = save_qwen3_tokenizer(root.parent / f"{root.name}_tok")
        encoder = make_qwen3(len(tokenizer), seed, num_hidden_layers=KLEIN_DEPTH)
    else:
        _, encoder, tokenizer = tiny_flux2_text_folders()["dev" if kind == "dev" else "klein"]
    root.mkdir(parents=True, exist_ok=True)
    transformer, tfolder = make_diffusers_flux2(
        root.parent, seed, name=f"{root.name}_tr",
        **dict(TINY, in_channels=4 * VAE["latent_channels"],
               joint_attention_dim=len(TEXT_LAYERS) * TEXT["hidden_size"],
               guidance_embeds=kind == "dev"))
    parts = dict(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
                 vae=make_flux2_vae(VAE, seed), text_encoder=encoder, tokenizer=tokenizer,
                 transformer=transformer)
    pipe = (Flux2Pipeline(**parts) if kind == "dev" else
            Flux2KleinPipeline(**parts, is_distilled=kind == "klein"))
    pipe.save_pretrained(root)
    shutil.rmtree(tfolder)
    shutil.rmtree(root.parent / f"{root.name}_tok", ignore_errors=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


_SHARED: dict = {}


def shared_klein_folder():
    """One tiny klein base folder per test process that runs on its defaults (a Qwen3 of
    :data:`KLEIN_DEPTH` layers; a ``ditax_sample.json`` of 24 text tokens, so a plain
    ``ditax generate`` / server request stays small), in a temporary folder removed at exit:
    for the tests that only read a FLUX.2 folder (the conformance table's row)."""
    if "klein" not in _SHARED:
        import atexit
        import json
        import pathlib
        import shutil
        import tempfile

        tmp = pathlib.Path(tempfile.mkdtemp(prefix="ditax_flux2_"))
        atexit.register(shutil.rmtree, tmp, True)
        write_flux2_pipeline(tmp / "klein", "klein-base", deep_text=True)
        (tmp / "klein" / "ditax_sample.json").write_text(json.dumps({"max_sequence_length": 24}))
        _SHARED["klein"] = tmp / "klein"
    return _SHARED["klein"]


def random_latents(pipe, height: int, width: int, seed: int = 0) -> np.ndarray:
    """diffusers' ``latents`` ``[1, 4C, H/g, W/g]`` (float32 standard normal from ``seed``) of
    a request of that size to the ditax pipeline ``pipe`` (``g``: its size grid)."""
    c, g = pipe.transformer.config.in_channels, pipe.grid
    shape = (1, c, height // g, width // g)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run_diffusers(pipe, prompt, latents, layers=TEXT_LAYERS, **call) -> np.ndarray:
    """diffusers' image ``[H, W, 3]`` (numpy, in [0, 1]) from the given latents
    (``[1, 4C, h, w]``, the layout its ``prepare_latents`` takes), reading the text
    encoder's ``layers`` (None: the pipeline's default)."""
    import torch

    if layers is not None:
        call["text_encoder_out_layers"] = layers
    with torch.no_grad():
        out = pipe(prompt=prompt, latents=torch.from_numpy(latents), output_type="np",
                   return_dict=False, **call)
    return np.asarray(out[0][0], np.float32)


__all__ = ["KLEIN_DEPTH", "SCHEDULER", "TEXT_LAYERS", "diffusers_reference_image", "random_latents",
           "run_diffusers", "shared_klein_folder", "write_flux2_pipeline"]
