"""Original Wan / ComfyUI single-file transformer checkpoints (original key names, no
config.json): same output as the diffusers folder they were renamed from, LoRAs on top, and the
same strict key / shape checks naming the file's own keys."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.config import ConfigError, load_config  # noqa: E402
from ditax.errors import WeightError  # noqa: E402
from ditax.models.wan.original_names import key_to_diffusers, key_to_original  # noqa: E402
from lora_reference import block_modules, random_lora, write_musubi  # noqa: E402
from wan_reference import make_diffusers_wan, rel_err, run_diffusers  # noqa: E402

TINY = dict(heads=4, head_dim=32, ffn=256, text_dim=64, freq_dim=32, in_ch=16, layers=2)


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    """(diffusers model, its folder, its state dict under original names, inputs)."""
    from safetensors.numpy import load_file

    m, folder = make_diffusers_wan(tmp_path_factory.mktemp("wan"), **TINY)
    theirs = load_file(str(next(folder.glob("*.safetensors"))))
    original = {key_to_original(k): v for k, v in theirs.items()}
    assert all(key_to_diffusers(k) == d for k, d in zip(original, theirs))
    rng = np.random.default_rng(0)
    inputs = (rng.standard_normal((1, 16, 2, 4, 4)).astype(np.float32),
              np.array([300.0], np.float32), rng.standard_normal((1, 6, 64)).astype(np.float32))
    return m, folder, original, inputs


def _save(path, tensors, prefix=""):
    from safetensors.numpy import save_file

    save_file({prefix + k: v for k, v in tensors.items()}, str(path))
    return path


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_single_file_matches_diffusers_and_takes_loras(tmp_path, wan, prefix):
    m, folder, original, inputs = wan
    path = _save(tmp_path / "wan_tiny.safetensors", original, prefix)
    tr = ditax.load_transformer(path, config="tiny")
    assert rel_err(np.asarray(tr(*inputs)), run_diffusers(m, *inputs)) <= 1e-5
    lora = write_musubi(tmp_path / "l.safetensors",
                        random_lora(m, block_modules(2), rank=4, alpha=4.0, seed=3))
    got = np.asarray(ditax.load_transformer(path, config="tiny", loras=[(lora, 0.8)])(*inputs))
    want = np.asarray(ditax.load_transformer(folder, loras=[(lora, 0.8)])(*inputs))
    np.testing.assert_array_equal(got, want)


def test_single_file_errors(tmp_path, wan):
    _, folder, original, _ = wan
    with pytest.raises(ConfigError, match=r"pass its architecture as config=.*tiny"):
        ditax.load_transformer(_save(tmp_path / "a.safetensors", original))
    with pytest.raises(ConfigError, match="config= is for single-file checkpoints"):
        ditax.load_transformer(folder, config="tiny")
    missing = {k: v for k, v in original.items() if k != "blocks.1.ffn.2.weight"}
    with pytest.raises(WeightError, match=r"missing 1 key\(s\): diffusion_model\.blocks\.1\.ffn"
                                          r"\.2\.weight"):
        ditax.load_transformer(_save(tmp_path / "b.safetensors", missing, "diffusion_model."),
                               config="tiny")
    wide = dict(original, **{"blocks.0.cross_attn.k.weight": np.zeros((128, 64), np.float32)})
    with pytest.raises(WeightError, match=r"blocks\.0\.cross_attn\.k\.weight: shape \(128, 64\) "
                                          r"but the model expects \(128, 128\)"):
        ditax.load_transformer(_save(tmp_path / "c.safetensors", wide), config="tiny")
    with pytest.raises(WeightError, match=r"the config \(num_layers=3"):
        ditax.load_transformer(_save(tmp_path / "d.safetensors", original), config="tiny",
                               num_layers=3)


def _from_pretrained(folder):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel.from_pretrained(str(folder)).eval()


def test_convert_writes_a_diffusers_folder(tmp_path, wan, capsys):
    """``ditax convert FILE --config tiny --out DIR``: diffusers reads DIR and gives ditax's
    output; ditax reads DIR too; the single file with a missing --config or a used --out is a
    one-line exit 2."""
    from ditax.cli import main

    m, _, original, inputs = wan
    path = _save(tmp_path / "wan_tiny.safetensors", original, "diffusion_model.")
    out = tmp_path / "converted"
    assert main(["convert", str(path), "--config", "tiny", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "OK" in printed
    assert sorted(p.name for p in out.iterdir()) == ["config.json",
                                                     "diffusion_pytorch_model.safetensors"]
    ours = np.asarray(ditax.load_transformer(path, config="tiny")(*inputs))
    theirs = run_diffusers(_from_pretrained(out), *inputs)
    assert rel_err(ours, theirs) <= 1e-5
    assert rel_err(ours, run_diffusers(m, *inputs)) <= 1e-5
    np.testing.assert_array_equal(np.asarray(ditax.load_transformer(out)(*inputs)), ours)
    for argv, words in ((["convert", str(path), "--out", str(tmp_path / "x")], "config="),
                        (["convert", str(path), "--config", "tiny", "--out", str(out)],
                         "not an empty folder"),
                        (["convert", str(out), "--config", "tiny"], "single-file")):
        assert main(argv) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("ditax convert: error: ") and words in err[0]


def test_convert_shards_and_fuses_loras(tmp_path, wan):
    """Small shards → an index diffusers follows; a LoRA fused while converting gives what
    loading the single file with the LoRA merged gives; a cast to bfloat16 is stored as such."""
    from safetensors import safe_open

    from ditax.models.wan.single_file import write_diffusers_folder

    m, _, original, inputs = wan
    path = _save(tmp_path / "wan_tiny.safetensors", original)
    lora = write_musubi(tmp_path / "l.safetensors",
                        random_lora(m, block_modules(2), rank=4, alpha=4.0, seed=5))
    tiny = load_config("tiny").model
    out = write_diffusers_folder(path, tiny, tmp_path / "sharded", loras=[(lora, 0.7)],
                                 shard_bytes=200_000)
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) > 2 and (out / "diffusion_pytorch_model.safetensors.index.json").is_file()
    want = np.asarray(ditax.load_transformer(path, config="tiny", loras=[(lora, 0.7)])(*inputs))
    np.testing.assert_array_equal(np.asarray(ditax.load_transformer(out)(*inputs)), want)
    assert rel_err(run_diffusers(_from_pretrained(out), *inputs), want) <= 1e-5
    half = write_diffusers_folder(path, tiny, tmp_path / "bf16", dtype="bfloat16")
    with safe_open(str(half / "diffusion_pytorch_model.safetensors"), "np") as f:
        assert f.get_slice("blocks.0.attn1.to_q.weight").get_dtype() == "BF16"
