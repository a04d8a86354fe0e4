"""The commands beside ``generate`` on a Flux model, tried as a new user would on the shipped
small Flux (and the Wan demo where a default is the folder's): ``ditax bench flux-tiny`` runs the
family's own random transformer on its own inputs; ``ditax calibrate-cache`` on a Flux folder is
refused in one line before anything loads; ``ditax train`` of a Flux model on a Wan dataset
names Flux in its fix; ``ditax preprocess`` takes its sizes, frames and text length from the
folder's ``ditax_sample.json``."""

import json

import numpy as np
import PIL.Image
import pytest

from ditax.cli import main
from ditax.demo import flux_model_path, model_path
from ditax.train.data import read_meta


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bench_runs_a_flux_config(capsys):
    assert main(["bench", "flux-tiny", "--repeats", "1", "--no-progress"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["case"] == "flux-tiny" and row["metric"] == "forward" and row["value"] > 0
    assert row["latent"][1:] == [256, 64]        # packed tokens of one 32x32 latent frame
    # a video grid is named with the fix, before anything is built
    assert main(["bench", "flux-tiny", "--latent", "5,32,32", "--no-progress"]) == 2
    line = one_line(capsys)
    assert "--latent 5,32,32" in line and "--latent 1,32,32" in line


def test_calibrate_cache_refuses_a_flux_folder_before_loading(capsys, tmp_path):
    out = tmp_path / "numbers.json"
    assert main(["calibrate-cache", "--model", str(flux_model_path()), "--prompts", "a red circle",
                 "a blue square", "--output", str(out), "--no-progress"]) == 2
    line = one_line(capsys)
    assert "flux folder" in line and "no step cache" in line and "calibrate-cache --model demo" in line
    assert not out.exists()


def test_train_of_a_flux_model_on_a_wan_dataset_names_flux(capsys, tmp_path):
    from tests.refs.latent_datasets import write_dataset

    ds = write_dataset(tmp_path / "wan_ds", n=2)
    assert main(["train", "flux-tiny", f"data.source={ds}", f"output_dir={tmp_path / 'run'}",
                 "--no-progress"]) == 2
    line = one_line(capsys)
    assert "flux model" in line and "FluxPipeline" in line, line
    assert "image-to-video" not in line and "I2V" not in line


def test_preprocess_defaults_to_the_wan_demo_folder_file(capsys, tmp_path):
    from ditax.io.video import write_mp4

    (tmp_path / "v").mkdir()
    write_mp4(tmp_path / "v" / "a.mp4",
              np.random.default_rng(0).uniform(0, 1, (20, 64, 64, 3)), fps=8)
    (tmp_path / "v" / "a.txt").write_text("a red circle moves right")
    assert main(["preprocess", str(tmp_path / "v"), str(tmp_path / "ds"), "--model", "demo",
                 "--no-progress"]) == 0
    sample = json.loads((model_path() / "ditax_sample.json").read_text())
    meta = read_meta(tmp_path / "ds")
    # 17 frames -> 5 latent frames (4x in time), 64x64 pixels, 16 text tokens
    assert meta["latent_shape"][1] == (sample["num_frames"] - 1) // 4 + 1 == 5
    assert meta["text_shape"][0] == sample["max_sequence_length"] == 16
    # an explicit flag still wins
    assert main(["preprocess", str(tmp_path / "v"), str(tmp_path / "ds2"), "--model", "demo",
                 "--frames", "5", "--text-len", "4", "--no-progress"]) == 0
    meta2 = read_meta(tmp_path / "ds2")
    assert meta2["latent_shape"][1] == 2 and meta2["text_shape"][0] == 4
    assert meta2["latent_shape"][2:] == meta["latent_shape"][2:]


def test_preprocess_defaults_to_the_small_flux_folder_file(capsys, tmp_path):
    (tmp_path / "img").mkdir()
    rgb = np.random.default_rng(0).uniform(0, 255, (64, 64, 3)).astype(np.uint8)
    PIL.Image.fromarray(rgb).save(tmp_path / "img" / "a.png")
    (tmp_path / "img" / "a.txt").write_text("a red circle on the left")
    assert main(["preprocess", str(tmp_path / "img"), str(tmp_path / "ds"), "--model",
                 str(flux_model_path()), "--no-progress"]) == 0
    meta = read_meta(tmp_path / "ds")
    # 64x64 pixels through the small Flux's 4x VAE, one frame, 8 text tokens (not 1024 / 512)
    assert meta["latent_shape"][1:] == [1, 16, 16]
    assert meta["text_shape"][0] == 8


@pytest.mark.parametrize("flag", ["--height", "--width", "--frames", "--text-len"])
def test_preprocess_help_names_the_folder_file(capsys, flag):
    try:
        assert main(["preprocess", "--help"]) == 0
    except SystemExit as e:       # argparse's exit, where main lets it through
        assert e.code == 0
    out = " ".join(capsys.readouterr().out.split())
    entry = f"{flag} {flag[2:].upper().replace('-', '_')} "      # the option's help entry
    assert "ditax_sample.json" in out.split(entry, 1)[1].split(" --", 1)[0]
