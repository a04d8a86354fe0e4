"""``ditax init-random PRESET --out DIR``: a small random-weight pipeline folder of every family,
written without torch, that ``ditax generate`` runs (two steps, a small size: exit 0, a finite
and non-constant output), ``ditax plan`` plans from its ``ditax_config.yaml``, and diffusers /
transformers read under their own names (where installed); the config presets planned at
their real size without a weight drawn; bad requests refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ditax.cli import main

# preset -> (model_index.json class, generate's extra flags, output file)
SMALL = {
    "tiny": ("WanPipeline", [], "o.mp4"),
    "i2v-tiny": ("WanImageToVideoPipeline", ["--image", "{clips}/img.png"], "o.mp4"),
    "ti2v-tiny": ("WanPipeline", [], "o.mp4"),
    "vace-tiny": ("WanVACEPipeline", ["--video", "{clips}/vid.mp4"], "o.mp4"),
    "animate-tiny": ("WanAnimatePipeline",
                     ["--image", "{clips}/img.png", "--pose-video", "{clips}/vid.mp4",
                      "--face-video", "{clips}/face.mp4", "--segment-frame-length", "5"],
                     "o.mp4"),
    "flux-tiny": ("FluxPipeline", [], "o.png"),
    "flux2-tiny": ("Flux2KleinPipeline", [], "o.png"),
    "flux2-dev-tiny": ("Flux2Pipeline", [], "o.png"),
    "ltx2-tiny": ("LTX2Pipeline", [], "o.mp4"),
}
SIZE = {"ti2v-tiny": ["--height", "32", "--width", "64", "--frames", "5"],
        "ltx2-tiny": ["--height", "32", "--width", "32", "--frames", "9"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``get(preset)``: the folder ``ditax init-random PRESET`` writes (each written once)."""
    root, made = tmp_path_factory.mktemp("init_random"), {}

    def get(preset):
        if preset not in made:
            out = root / preset
            assert main(["init-random", preset, "--out", str(out), "--threads", "2"]) == 0
            made[preset] = out
        return made[preset]
    return get


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A 32x32 image, a 5-frame 32x32 video and a 5-frame 16x16 face video."""
    import PIL.Image

    from ditax.io.video import write_mp4

    d = tmp_path_factory.mktemp("init_random_clips")
    rng = np.random.default_rng(0)
    PIL.Image.fromarray(rng.integers(0, 255, (32, 32, 3), np.uint8)).save(d / "img.png")
    write_mp4(d / "vid.mp4", rng.uniform(size=(5, 32, 32, 3)).astype(np.float32))
    write_mp4(d / "face.mp4", rng.uniform(size=(5, 16, 16, 3)).astype(np.float32))
    return d


def test_list_names_every_family_small_presets(capsys):
    assert main(["init-random", "--list"]) == 0
    out = capsys.readouterr().out
    for preset in SMALL:
        assert any(line.split()[0] == preset for line in out.splitlines()), (preset, out)
    families = {line.split()[1] for line in out.splitlines()}
    assert {"wan", "flux", "flux2", "ltx2"} <= families, out


@pytest.mark.parametrize("preset", list(SMALL))
def test_small_folder_generates(preset, folders, clips, tmp_path):
    from ditax.io.images import read_image
    from ditax.io.video import read_video

    cls, extra, name = SMALL[preset]
    folder = folders(preset)
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == cls
    note = json.loads((folder / "ditax_random.json").read_text())
    assert note["preset"] == preset and note["parameters"]["transformer"] > 0
    out = tmp_path / name
    size = SIZE.get(preset, ["--height", "32", "--width", "32"])
    flags = [f.format(clips=clips) for f in extra]
    assert main(["generate", "--model", str(folder), "--prompt", "a red circle moves right",
                 "--steps", "2", *size, *flags, "--output", str(out), "--no-progress"]) == 0
    pixels = (np.asarray(read_image(out)) if name.endswith(".png") else read_video(out))
    pixels = np.asarray(pixels, np.float32)
    assert np.isfinite(pixels).all() and pixels.std() > 0.5, (preset, pixels.std())


def test_plan_reads_the_folder_config(folders, capsys):
    """``ditax plan DIR/ditax_config.yaml`` and ``ditax plan DIR``: the folder's own model
    (LTX-2's tiny widths)."""
    from ditax.recipes.random_folders import CONFIG_FILE

    folder = folders("ltx2-tiny")
    capsys.readouterr()
    note = json.loads((folder / "ditax_random.json").read_text())
    for config in (folder / CONFIG_FILE, folder):      # the folder itself means its config
        assert main(["plan", str(config), "--json"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["params"] == note["parameters"]["transformer"]


# (class, folder, library) each read with its own library's from_pretrained
LOADS = {"tiny": [("WanTransformer3DModel", "transformer", "diffusers"),
                  ("AutoencoderKLWan", "vae", "diffusers"),
                  ("UMT5EncoderModel", "text_encoder", "transformers")],
         "vace-tiny": [("WanVACETransformer3DModel", "transformer", "diffusers")],
         "animate-tiny": [("WanAnimateTransformer3DModel", "transformer", "diffusers"),
                          ("CLIPVisionModel", "image_encoder", "transformers")],
         "flux-tiny": [("FluxTransformer2DModel", "transformer", "diffusers"),
                       ("AutoencoderKL", "vae", "diffusers"),
                       ("CLIPTextModel", "text_encoder", "transformers"),
                       ("T5EncoderModel", "text_encoder_2", "transformers")],
         "flux2-tiny": [("Flux2Transformer2DModel", "transformer", "diffusers"),
                        ("AutoencoderKLFlux2", "vae", "diffusers"),
                        ("Qwen3ForCausalLM", "text_encoder", "transformers")],
         "ltx2-tiny": [("LTX2VideoTransformer3DModel", "transformer", "diffusers"),
                       ("AutoencoderKLLTX2Video", "vae", "diffusers"),
                       ("AutoencoderKLLTX2Audio", "audio_vae", "diffusers")]}


@pytest.mark.parametrize("preset", list(LOADS))
def test_upstream_libraries_read_every_tensor(preset, folders):
    """The weights are under diffusers' / transformers' own names and shapes: each class
    loads its folder with no key missing, unexpected or misshapen (but the FLUX.2 VAE's
    BatchNorm step counter, a training count ditax neither reads nor writes)."""
    diffusers = pytest.importorskip("diffusers")
    transformers = pytest.importorskip("transformers")
    folder = folders(preset)
    for cls, sub, lib in LOADS[preset]:
        module = diffusers if lib == "diffusers" else transformers
        _, info = getattr(module, cls).from_pretrained(folder / sub, output_loading_info=True)
        bad = {k: [n for n in v if "num_batches_tracked" not in str(n)]
               for k, v in info.items()}
        assert not any(bad.values()), (preset, sub, bad)


@pytest.mark.parametrize("preset,part,params", [
    ("flux.1-dev", "transformer", 11_901_408_320),
    ("ltx-2", "transformer", 18_876_174_592),
    ("flux.2-klein-4b", "transformer", 3_875_544_576),
])
def test_config_presets_plan_at_their_real_size(preset, part, params, capsys):
    """``--dry-run``: every part's tensors, parameters and bytes, nothing drawn."""
    assert main(["init-random", preset, "--dry-run"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = {r["part"]: r for r in rows}
    assert got[part]["parameters"] == params and got[part]["dtype"] == "bfloat16"
    assert got[part]["bytes"] == 2 * params


@pytest.mark.parametrize("argv,says", [
    (["init-random", "nope", "--out", "x"], "neither a small preset"),
    (["init-random", "flux2-tiny", "--out", "x", "model.joint_attention_dim=50"],
     "must be a multiple of 3"),
    (["init-random", "flux2-tiny", "--out", "x", "--text-layers", "5"],
     r"reads the text encoder's hidden states \(9, 18, 27\); give at least 27"),
    (["init-random", "tiny"], "--out DIR is required"),
    (["init-random"], "give a PRESET"),
])
def test_bad_requests_exit_2_in_one_line(argv, says, capsys, tmp_path, monkeypatch):
    import re

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and re.search(says, err[0]), err
    assert not (tmp_path / "x").exists()
