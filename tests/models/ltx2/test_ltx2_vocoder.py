"""LTX-2 vocoders (diffusers LTX2Vocoder, LTX2VocoderWithBWE): tiny random models saved with
save_pretrained and loaded with ditax — waveforms equal to diffusers for LTX-2.0's kind (leaky
ReLU, tanh), LTX-2.3's (anti-aliased SnakeBeta; with bandwidth extension) and the remaining
switches (Snake, clamp); the public layouts key for key; the low-pass filters; clear errors."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from flax import nnx  # noqa: E402

from ditax.errors import ConfigError, RequestError, WeightError  # noqa: E402
from ditax.io import convert  # noqa: E402
from ditax.models.ltx2.audio.layers import Buffer  # noqa: E402
from ditax.models.ltx2.vocoder.config import LTX2VocoderBWEConfig, LTX2VocoderConfig  # noqa: E402
from ditax.models.ltx2.vocoder.convert import load_vocoder, weight_table  # noqa: E402
from ditax.models.ltx2.vocoder.layers import hann_sinc_filter, kaiser_sinc_filter  # noqa: E402
from ditax.models.ltx2.vocoder.model import LTX2Vocoder  # noqa: E402
from ltx2_audio_reference import BWE, VOCODER, make_vocoder, rel_err  # noqa: E402

TOL = 1e-5
_BUILT: dict = {}


def _pair(name, tmp_path_factory):
    if name not in _BUILT:
        ref = make_vocoder(name, seed=len(name))
        folder = tmp_path_factory.mktemp(f"ltx2_vocoder_{name}")
        ref.save_pretrained(folder)
        _BUILT[name] = ref, load_vocoder(folder), folder
    return _BUILT[name]


@pytest.fixture(scope="module", params=[*VOCODER, "bwe"])
def pair(request, tmp_path_factory):
    return request.param, *_pair(request.param, tmp_path_factory)


def test_waveform_matches_diffusers(pair, rng):
    name, ref, voc, _ = pair
    cfg = BWE if name == "bwe" else VOCODER[name]
    channels = cfg["out_channels"]
    # the audio VAE's decoded mel [B, C, T, M]; 7 frames: the BWE pads to whole hops
    mel = rng.standard_normal((2, channels, 7, cfg["in_channels"] // channels)).astype(np.float32)
    time_last = name == "snake"      # diffusers' other layout [B, C, M, T]
    x = np.swapaxes(mel, 2, 3) if time_last else mel
    with torch.no_grad():
        expect = ref(torch.from_numpy(x), **({"time_last": True} if time_last else {})).numpy()
    got = np.asarray(voc(x, time_last=time_last))
    ratio = 3 if name == "bwe" else 1            # 16 kHz -> 48 kHz
    samples = 7 * math.prod(cfg["upsample_factors"]) * ratio
    assert got.shape == expect.shape == (2, channels, samples)
    assert voc.sample_rate == ref.config.output_sampling_rate
    assert rel_err(got, expect) < TOL


def test_public_layouts_match_diffusers():
    """The defaults are LTX-2.0's vocoder and LTX-2.3's (diffusers' conversion script's
    configs); LTX-2.0's has the same keys and shapes as diffusers' model built on the meta
    device (the BWE vocoder's layout is checked key for key by the tiny model's load)."""
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder as Ref

    resnets = {"resnet_kernel_sizes": [3, 7, 11], "resnet_dilations": [[1, 3, 5]] * 3,
               "leaky_relu_negative_slope": 0.1}
    v20 = {"in_channels": 128, "hidden_channels": 1024, "out_channels": 2,
           "upsample_kernel_sizes": [16, 15, 8, 4, 4], "upsample_factors": [6, 5, 2, 2, 2],
           "act_fn": "leaky_relu", "antialias": False, "final_act_fn": "tanh", "final_bias": True,
           "output_sampling_rate": 24000, **resnets}
    v23 = {"in_channels": 128, "hidden_channels": 1536, "out_channels": 2,
           "upsample_kernel_sizes": [11, 4, 4, 4, 4, 4], "upsample_factors": [5, 2, 2, 2, 2, 2],
           "act_fn": "snakebeta", "antialias": True, "antialias_ratio": 2,
           "antialias_kernel_size": 12, "final_act_fn": None, "final_bias": False, **resnets,
           **{"bwe_" + k: v for k, v in resnets.items()},
           "bwe_in_channels": 128, "bwe_hidden_channels": 512, "bwe_out_channels": 2,
           "bwe_upsample_kernel_sizes": [12, 11, 4, 4, 4], "bwe_upsample_factors": [6, 5, 2, 2, 2],
           "bwe_act_fn": "snakebeta", "bwe_antialias": True, "bwe_antialias_ratio": 2,
           "bwe_antialias_kernel_size": 12, "bwe_final_act_fn": None, "bwe_final_bias": False,
           "filter_length": 512, "hop_length": 80, "window_length": 512, "num_mel_channels": 64,
           "input_sampling_rate": 16000, "output_sampling_rate": 48000}
    assert LTX2VocoderConfig.from_diffusers(v20) == LTX2VocoderConfig()
    assert LTX2VocoderBWEConfig.from_diffusers(v23) == LTX2VocoderBWEConfig()
    assert LTX2VocoderConfig().upsample_factor == 240
    cfg23 = LTX2VocoderBWEConfig()
    assert (cfg23.sample_rate, cfg23.ratio, cfg23.upsample_factor) == (48000, 3, 480)
    assert cfg23.stage(False).output_sampling_rate == 16000
    with torch.device("meta"):
        ref = Ref(**v20)
    theirs = {k: tuple(t.shape) for k, t in ref.state_dict().items()}
    abstract = nnx.eval_shape(lambda: LTX2Vocoder(LTX2VocoderConfig(), rngs=nnx.Rngs(0)))
    table = weight_table(abstract)
    shapes = convert.param_shapes(nnx.state(abstract, nnx.Any(nnx.Param, Buffer)))
    assert {r.key: r.transform.theirs_shape(shapes[r.path]) for r in table.rows} == theirs


def test_filters_match_diffusers():
    from diffusers.pipelines.ltx2.vocoder import UpSample1d, kaiser_sinc_filter1d

    for cutoff, half_width, k in [(0.25, 0.3, 12), (0.25, 0.3, 13), (1 / 6, 0.2, 18)]:
        np.testing.assert_allclose(kaiser_sinc_filter(cutoff, half_width, k),
                                   kaiser_sinc_filter1d(cutoff, half_width, k).numpy(),
                                   rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(hann_sinc_filter(3),
                               UpSample1d(3, window_type="hann").filter.reshape(-1).numpy(),
                               rtol=1e-5, atol=1e-7)


def test_bad_inputs_and_configs(tmp_path_factory, tmp_path):
    _, voc, folder = _pair("v20", tmp_path_factory)
    for mel, match in [(np.zeros((2, 7, 16), np.float32), "got shape"),
                       (np.zeros((1, 2, 7, 15), np.float32), "C x M = 32"),
                       (np.zeros((1, 2, 0, 16), np.float32), "no empty axis")]:
        with pytest.raises(RequestError, match=match):
            voc(mel)
    for make, match in [
            (lambda: LTX2VocoderConfig(antialias=True), "nests"),
            (lambda: LTX2VocoderConfig(upsample_factors=(6, 5)), "one length"),
            (lambda: LTX2VocoderConfig(act_fn="gelu"), "act_fn='gelu'"),
            (lambda: LTX2VocoderConfig(upsample_kernel_sizes=(4, 15, 8, 4, 4)),
             "kernel 4 and factor 6"),
            (lambda: LTX2VocoderBWEConfig(hop_length=100), "multiply to 240"),
            (lambda: LTX2VocoderBWEConfig(bwe_in_channels=64), "bwe_in_channels=64")]:
        with pytest.raises(ConfigError, match=match):
            make().validate()
    (tmp_path / "config.json").write_text(
        (folder / "config.json").read_text().replace('"LTX2Vocoder"', '"HifiGan"'))
    with pytest.raises(WeightError, match="not one of LTX2Vocoder, LTX2VocoderWithBWE"):
        load_vocoder(tmp_path)
