"""LoRAs on the Wan 2.1 image-to-video transformer: the original keys ``cross_attn.k_img`` /
``v_img`` (+ ``norm_k_img``) and ``img_emb.proj.*`` reach the added K/V projections and the image
embedder; transformer output equal to diffusers' ``load_lora_weights`` within 1e-5, merged and
unmerged."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import ditax  # noqa: E402
from ditax.errors import WeightError  # noqa: E402
from ditax.lora import read_lora  # noqa: E402
from ditax.models.wan.lora_names import LORA_NAMES  # noqa: E402
from lora_reference import (block_modules, load_into_diffusers, random_lora,  # noqa: E402
                            write_musubi, write_original, write_peft)
from wan_image_model import image_inputs, make_i2v, run_diffusers_image  # noqa: E402
from wan_reference import rel_err  # noqa: E402

LAYERS = 2
ADDED_KV = tuple(f"blocks.{i}.attn2.{p}" for i in range(LAYERS)
                 for p in ("add_k_proj", "add_v_proj"))
IMAGE_EMBEDDER = ("condition_embedder.image_embedder.ff.net.0.proj",
                  "condition_embedder.image_embedder.ff.net.2")


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    """(folder, fresh diffusers model factory, inputs, base output) of one tiny I2V model."""
    from diffusers import WanTransformer3DModel

    _, folder = make_i2v(tmp_path_factory.mktemp("i2v"), layers=LAYERS)
    inputs = image_inputs(np.random.default_rng(0), b=1, f=2, y=4, x=4)

    def fresh():
        return WanTransformer3DModel.from_pretrained(folder).eval()

    return folder, fresh, inputs, run_diffusers_image(fresh(), *inputs)


def _original(tmp, m):
    """ComfyUI keys: k_img / v_img with alpha and diff_b beside the usual block layers,
    img_emb.proj.1 / .3 with diff_b, and the (zero) norm_k_img diffs LightX2V files carry."""
    lora = random_lora(m, block_modules(LAYERS) + list(ADDED_KV), rank=4, alpha=8.0, bias=True,
                       seed=1)
    lora.update(random_lora(m, IMAGE_EMBEDDER, rank=2, bias=True, seed=2))
    d = m.config.num_attention_heads * m.config.attention_head_dim
    norms = {f"diffusion_model.blocks.{i}.cross_attn.norm_k_img.diff": np.zeros(d, np.float32)
             for i in range(LAYERS)}
    return write_original(tmp / "i2v_orig.safetensors", lora, extra=norms)


def _musubi(tmp, m):
    return write_musubi(tmp / "i2v_musubi.safetensors",
                        random_lora(m, block_modules(LAYERS) + list(ADDED_KV), rank=4, alpha=2.0,
                                    seed=3))


def _peft(tmp, m):
    return write_peft(tmp / "i2v_peft.safetensors",
                      random_lora(m, list(ADDED_KV + IMAGE_EMBEDDER) + block_modules(LAYERS)[:4],
                                  rank=3, bias=True, seed=4))


def _t2v(tmp, m):
    """A text-to-video LoRA (no image keys) on the I2V model: diffusers pads it with zero
    added-K/V updates; ditax leaves those layers alone — the same numbers."""
    return write_original(tmp / "t2v.safetensors",
                          random_lora(m, block_modules(LAYERS), rank=4, alpha=4.0, seed=5,
                                      size=1.0))


def _ours(folder, inputs, **kw):
    tr = ditax.load_transformer(folder, **kw)
    return np.asarray(tr(*inputs[:3], encoder_hidden_states_image=inputs[3]))


@pytest.mark.parametrize("make", [_original, _musubi, _peft, _t2v])
def test_i2v_lora_matches_diffusers(tmp_path, i2v, make):
    folder, fresh, inputs, plain = i2v
    m = fresh()
    path = make(tmp_path, m)
    load_into_diffusers(m, path, "a", 0.8)
    want = run_diffusers_image(m, *inputs)
    assert rel_err(want, plain) > 1e-2  # the LoRA changes the output
    got = _ours(folder, inputs, loras=[(path, 0.8)])
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)


def test_i2v_rows_reach_the_image_layers_and_unmerged_agrees(tmp_path, i2v):
    """The image keys land on the added K/V and image-embedder modules (not skipped), the
    image-only part of a LoRA changes the output only through the image, and unmerged = merged."""
    folder, fresh, inputs, _ = i2v
    path = _peft(tmp_path, fresh())
    keys = {r.key for r in read_lora(path, names=LORA_NAMES).rows}
    assert set(ADDED_KV + IMAGE_EMBEDDER) <= keys
    orig = read_lora(_original(tmp_path, fresh()), names=LORA_NAMES)
    assert {f"blocks.{i}.attn2.norm_added_k" for i in range(LAYERS)} <= {r.key for r in orig.rows}
    merged = _ours(folder, inputs, loras=[(path, 0.5)])
    unmerged = _ours(folder, inputs, loras=[(path, 0.5)], lora_mode="unmerged")
    assert rel_err(unmerged, merged) <= 1e-6
    # a LoRA on the image layers only is an I2V LoRA: a text-to-video model refuses it by name
    from wan_reference import make_diffusers_wan

    _, t2v = make_diffusers_wan(tmp_path, layers=LAYERS)
    only_image = write_peft(tmp_path / "img.safetensors",
                            random_lora(fresh(), ADDED_KV, rank=2, seed=6))
    with pytest.raises(WeightError, match=r"blocks\.0\.attn2\.add_k_proj: no such weight.*"
                                          r"text- vs image-to-video"):
        ditax.load_transformer(t2v, loras=[only_image])
