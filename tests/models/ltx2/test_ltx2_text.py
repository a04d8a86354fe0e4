"""LTX-2's text path — connectors and prompt → (video, audio, mask) — against diffusers'
``LTX2TextConnectors`` and ``LTX2Pipeline.encode_prompt`` on the same tiny components."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import gemma_reference as G  # noqa: E402
from ditax.errors import ConfigError, PipelineLoadError, RequestError  # noqa: E402
from ditax.models.ltx2.text.config import LTX2ConnectorsConfig  # noqa: E402
from ditax.models.ltx2.text.convert import load_connectors  # noqa: E402
from ditax.models.ltx2.text.encoder import (encode_ltx2_prompt, gemma_prompt_embeds,  # noqa: E402
                                            load_ltx2_text)
from flax import nnx  # noqa: E402

T = 24      # a multiple of the tiny connectors' 8 registers

# LTX-2.3's shape, tiny: per-stream projections with biases, gated attention, interleaved
# rope; the video stream masks its padding (no registers), the audio one has registers
LTX23 = dict(caption_channels=32, text_proj_in_factor=5, video_connector_num_attention_heads=2,
             video_connector_attention_head_dim=24, video_connector_num_layers=1,
             video_connector_num_learnable_registers=None, video_gated_attn=True,
             audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8,
             audio_connector_num_layers=1, audio_connector_num_learnable_registers=4,
             audio_gated_attn=True, per_modality_projections=True, video_hidden_dim=48,
             audio_hidden_dim=16, proj_bias=True, rope_type="interleaved",
             connector_rope_base_seq_len=16)


@nnx.jit
def _connect(connectors, hidden, mask):
    return connectors(hidden, mask, "left")


@pytest.mark.parametrize("variant", ["ltx2.0", "ltx2.3"])
def test_connectors_match_diffusers(tmp_path, rng, variant):
    ref = G.make_connectors(**(G.CONNECTORS if variant == "ltx2.0" else LTX23))
    ref.save_pretrained(tmp_path / "connectors")
    ours = load_connectors(tmp_path)
    lengths = np.array([T, 9, 1])
    mask = (np.arange(T)[None] >= T - lengths[:, None]).astype(np.int64)     # left padding
    hidden = rng.standard_normal((3, T, ours.cfg.text_dim)).astype(np.float32)
    with torch.no_grad():
        want = [t.numpy() for t in ref(torch.from_numpy(hidden), torch.from_numpy(mask),
                                       padding_side="left")]
    got = [np.asarray(t) for t in _connect(ours, jnp.asarray(hidden), jnp.asarray(mask))]
    errs = [G.rel_err(g, w) for g, w in zip(got[:2], want[:2])]
    print(f"connectors {variant} rel err video {errs[0]:.1e} audio {errs[1]:.1e}")
    assert max(errs) < 1e-5
    np.testing.assert_array_equal(got[2], want[2])


def test_prompt_to_embeddings_matches_pipeline():
    folder, encoder, tokenizer, connectors = G.tiny_ltx2_text_folder()
    pipe = G.ltx2_text_pipeline(encoder, tokenizer, connectors)
    prompts = G.PROMPTS[:3]
    negative = ["blurry, low quality", "", "  watermark  "]
    want = G.ltx2_reference_text(pipe, prompts, negative, T)
    text = load_ltx2_text(folder)
    # the pipeline's [negative, positive] batch, encoded at once
    got = [np.asarray(x) for x in encode_ltx2_prompt(text, negative + prompts, T)]
    assert [g.shape for g in got] == [w.shape for w in want]
    errs = [G.rel_err(g, w) for g, w in zip(got[:2], want[:2])]
    print(f"ltx2 text path rel err video {errs[0]:.1e} audio {errs[1]:.1e}")
    assert max(errs) < 1e-5
    np.testing.assert_array_equal(got[2], want[2])
    # step 1-2 alone: the pipeline's prompt_embeds and mask
    with torch.no_grad():
        pe, pm, _, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False,
                                          max_sequence_length=T)
    embeds, mask = gemma_prompt_embeds(text.tokenizer, text.text_encoder, prompts, T)
    np.testing.assert_array_equal(np.asarray(mask), pm.numpy())
    assert G.rel_err(np.asarray(embeds), pe.numpy()) < 1e-5


def test_bad_inputs_one_line(tmp_path):
    folder = G.tiny_ltx2_text_folder()[0]
    text = load_ltx2_text(folder)
    for call, err, match in [
        (lambda: encode_ltx2_prompt(text, "a cat", 20), RequestError, "multiple of the video"),
        (lambda: encode_ltx2_prompt(text, [1, 2], T), RequestError, "list of strings"),
        (lambda: encode_ltx2_prompt(text, "a cat", 0), RequestError, "max_sequence_length=0"),
        (lambda: LTX2ConnectorsConfig.from_diffusers({"caption_channels": 64}), ConfigError,
         "caption_channels=64"),
        (lambda: LTX2ConnectorsConfig.from_diffusers({"rope_type": "spilt"}), ConfigError,
         "did you mean 'split'"),
    ]:
        with pytest.raises(err, match=match) as e:
            call()
        assert "\n" not in str(e.value)
    # connectors from another model (wider Gemma): refused at load, naming both sizes
    for sub in ("tokenizer", "text_encoder"):
        shutil.copytree(folder / sub, tmp_path / sub)
    shutil.copytree(folder / "connectors", tmp_path / "connectors")
    cfg = json.loads((tmp_path / "connectors" / "config.json").read_text())
    cfg["text_proj_in_factor"] = 7
    (tmp_path / "connectors" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PipelineLoadError, match="text_proj_in_factor=7 but the text encoder "
                                                "gives hidden_size=32 × 5") as e:
        load_ltx2_text(tmp_path)
    assert "\n" not in str(e.value)
