"""The size grid of a Flux request is its folder's: the VAE's factor (``vae/config.json``'s
``block_out_channels``) times the 2x2 token packing, checked by the folder's preflight before
any weights load. The shipped small Flux has a 3-level VAE (4x): 40 pixels are on its grid
(not on FLUX.1's 16) and sample; 36 are not, and the one error line names its 8, not 16."""

import imageio.v2 as imageio

from ditax.cli import main
from ditax.demo import flux_model_path


def test_the_folders_vae_sets_the_size_grid(tmp_path, capsys):
    base = ["generate", "--model", str(flux_model_path()), "--prompt",
            "a red circle on the left", "--width", "64", "--steps", "2", "--no-progress"]
    out = tmp_path / "x.png"
    assert main(base + ["--height", "36", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "height=36 must be a positive multiple of 8 (the VAE's 4x" in err[0]
    assert not out.exists()
    assert main(base + ["--height", "40", "--output", str(out)]) == 0
    assert imageio.imread(out).shape == (40, 64, 3)
