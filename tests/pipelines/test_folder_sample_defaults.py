"""A folder's ``ditax_sample.json`` is read for every family by one reader
(:mod:`ditax.pipelines.sample_defaults`), with the keys the family declares: the shipped small
Flux (64x64, 20 steps, guidance 3.5, 8 text tokens) samples its own defaults from
``load_pipeline(folder)(prompt)`` and from the request defaults the CLI builds, as the Wan demo
does."""

import json
import shutil

import numpy as np
import pytest

import ditax
from ditax.config.sample import SampleConfig
from ditax.demo import flux_model_path, model_path
from ditax.errors import PipelineLoadError
from ditax.pipelines.family import pipelines_of
from ditax.synthetic.images import score_image

FLUX_FILE = {"height": 64, "width": 64, "num_inference_steps": 20, "guidance_scale": 3.5,
             "max_sequence_length": 8}


@pytest.fixture()
def flux_copy(tmp_path):
    """A copy of the small Flux whose ditax_sample.json is ``values``."""
    def make(values) -> object:
        root = tmp_path / "flux"
        shutil.copytree(flux_model_path(), root)
        (root / "ditax_sample.json").write_text(json.dumps(values))
        return root
    return make


def test_the_flux_folder_file_sets_the_request_defaults():
    flux = pipelines_of("flux")
    d = flux.request_defaults(flux_model_path(), SampleConfig(), set())
    assert {k: d[k] for k in FLUX_FILE} == FLUX_FILE
    # a sample.KEY= the user chose still wins over the folder's file
    chosen = flux.request_defaults(flux_model_path(), SampleConfig(height=32), {"height"})
    assert chosen["height"] == 32 and chosen["width"] == 64
    # no folder: the family's own
    assert flux.request_defaults(None, SampleConfig(), set())["height"] == 1024


def test_each_family_declares_its_file_keys(flux_copy):
    assert pipelines_of("flux").folder_defaults(flux_model_path()) == FLUX_FILE
    assert "num_frames" in pipelines_of("wan").sample_file_rules()
    root = flux_copy({"height": 64, "num_frames": 17})
    with pytest.raises(PipelineLoadError, match=r"ditax_sample.json: unknown key 'num_frames'; "
                       r"the sampling defaults are height, width, num_inference_steps, "
                       r"guidance_scale, max_sequence_length, sigmas$"):
        pipelines_of("flux").folder_defaults(root)
    with pytest.raises(PipelineLoadError, match="unknown key 'num_frames'"):
        ditax.load_pipeline(root)
    # the Wan demo's file as before
    assert pipelines_of("wan").folder_defaults(model_path())["num_frames"] == 17


def test_a_flux_file_off_the_folders_grid_is_refused_before_weights(flux_copy):
    root = flux_copy({"height": 36})
    with pytest.raises(PipelineLoadError, match=r"ditax_sample.json: height=36 must be a "
                       r"positive multiple of 8"):
        ditax.load_pipeline(root)


def test_a_plain_flux_call_samples_the_folders_own_defaults():
    pipe = ditax.load_pipeline(flux_model_path())
    assert pipe.sample_defaults == FLUX_FILE
    image = pipe("a red circle on the left", progress=False)
    explicit = pipe("a red circle on the left", height=64, width=64, num_inference_steps=20,
                    guidance_scale=3.5, max_sequence_length=8, progress=False)
    assert image.shape == (64, 64, 3)
    np.testing.assert_array_equal(image, explicit)
    # not the near-black image of 512 text tokens (max ~0.24): a red shape on the left
    sc = score_image(image, "a red circle on the left")
    assert image.max() > 0.9 and sc["colour"] == "red" and sc["position"] == "left", sc
    # an explicit argument wins over the file
    assert pipe("a red circle on the left", height=32, num_inference_steps=1,
                progress=False).shape == (32, 64, 3)
