"""A ``POST /v1/videos`` body checked in process (:func:`ditax.serve.requests.check_body`, the
function the server runs): JSON types (a bool is not a number, a string is not a number, 17.0 is
not an int, NaN / Infinity are not finite), the server's limits, the fields of the served
family only, messages that name the JSON field and never a CLI flag, and the server's start-up
check of an image-to-video folder (which needs each request's image, not its own)."""

import json
import math

import pytest
from ditax.demo import flux_model_path, model_path
from ditax.serve.requests import BadRequest, Limits, check_body


def check(body, model=None, tmp=None, **kw):
    return check_body(body, str(model or model_path()), [], str(tmp / "x.mp4"),
                      **kw)


def refused(body, tmp, **kw) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        check(body, tmp=tmp, **kw)
    assert "--" not in str(e.value), str(e.value)       # the API's words, not the CLI's
    assert len(str(e.value).splitlines()) == 1
    return e.value


@pytest.mark.parametrize("field, value, words", [
    ("num_frames", True, "num_frames=true must be a number, not a boolean"),
    ("guidance_scale", True, "guidance_scale=true must be a number, not a boolean"),
    ("num_frames", "17", 'num_frames="17" must be an integer, not a string'),
    ("num_frames", 17.0, "num_frames=17.0 must be an integer; write 17"),
    ("num_inference_steps", 2.5, "num_inference_steps=2.5 must be an integer"),
    ("guidance_scale", math.nan, "guidance_scale=NaN must be a finite number"),
    ("guidance_scale", math.inf, "guidance_scale=Infinity must be a finite number"),
    ("seed", "3", 'seed="3" must be an integer, not a string'),
    ("seed", -1, "seed=-1"),
    ("negative_prompt", 5, "negative_prompt=5 must be a string"),
    ("prompt", ["a", "b"], "prompt=['a', 'b'] must be a string"),
])
def test_json_types_are_checked_naming_the_field(tmp_path, field, value, words):
    body = {"prompt": "a red circle moves right", field: value}
    e = refused(body, tmp_path)
    assert str(e).startswith(words) and e.param == field, (str(e), e.param)


def test_nan_never_reaches_the_store(tmp_path):
    # json.loads reads NaN; the check refuses it, so no job row holds a value JSON cannot show
    body = json.loads('{"prompt": "a cat", "guidance_scale": NaN}')
    assert refused(body, tmp_path).param == "guidance_scale"
    ok = check({"prompt": "a cat", "guidance_scale": 4}, tmp=tmp_path)
    assert ok.call["guidance_scale"] == 4.0 and isinstance(ok.call["guidance_scale"], float)
    json.dumps(ok.stored, allow_nan=False)


def test_limits_bound_the_work(tmp_path):
    limits = Limits(max_steps=30, max_pixels=64 * 64, max_frames=33)
    for body, param, words in (({"num_inference_steps": 10 ** 9}, "num_inference_steps",
                                "more than this server's --max-steps 30"),
                               ({"size": "4096x4096"}, "size", "--max-pixels 4096"),
                               ({"num_frames": 37}, "num_frames", "--max-frames 33")):
        with pytest.raises(BadRequest) as e:
            check({"prompt": "a cat", **body}, tmp=tmp_path, limits=limits)
        assert e.value.param == param and words in str(e.value), str(e.value)
    check({"prompt": "a cat", "num_inference_steps": 30}, tmp=tmp_path, limits=limits)


def test_another_familys_field_names_the_family(tmp_path):
    e = refused({"prompt": "a cat", "true_cfg_scale": 3}, tmp_path)
    assert e.param == "true_cfg_scale" and "it is for flux models" in str(e)
    with pytest.raises(BadRequest) as e:
        check({"prompt": "a cat", "num_frames": 5}, model=flux_model_path(), tmp=tmp_path)
    assert e.value.param == "num_frames" and "it is for ltx2, wan models" in str(e.value)
    with pytest.raises(BadRequest) as e:
        check({"prompt": "a cat", "colour": "red"}, tmp=tmp_path)
    assert e.value.param == "colour" and "unknown field" in str(e.value)


def test_flux_true_cfg_in_the_apis_words(tmp_path):
    flux = flux_model_path()
    for body in ({"negative_prompt": "blurry"}, {"true_cfg_scale": 4}):
        with pytest.raises(BadRequest) as e:
            check({"prompt": "a cat", **body}, model=flux, tmp=tmp_path)
        assert str(e.value).startswith("negative_prompt and true_cfg_scale go together"), \
            str(e.value)
        assert "--" not in str(e.value)
    ok = check({"prompt": "a cat", "negative_prompt": "blurry", "true_cfg_scale": 4},
               model=flux, tmp=tmp_path)
    # the folder's own defaults (ditax_sample.json: 64x64, 20 steps, 8 text tokens)
    assert (ok.call["height"], ok.call["num_inference_steps"], ok.call["true_cfg_scale"],
            ok.call["max_sequence_length"]) == (64, 20, 4.0, 8)


def test_an_image_to_video_server_starts_and_asks_each_request_for_its_image(tmp_path):
    pytest.importorskip("diffusers")
    from i2v_reference import make_tiny_i2v

    _, folder = make_tiny_i2v(tmp_path, "i2v")
    started = check({"prompt": "a check of the server's settings"}, model=folder, tmp=tmp_path,
                    startup=True)
    assert started.load.path == str(folder)
    with pytest.raises(BadRequest) as e:
        check({"prompt": "a cat"}, model=folder, tmp=tmp_path)
    assert e.value.param == "image" and "image-to-video folder" in str(e.value), str(e.value)


@pytest.mark.parametrize("loras, words", [
    (["style"], "loras item 'style': each item must be an object"),
    ([{"name": "style", "strength": 1e30}], "must be a finite number in [-10, 10]"),
    ([{"name": "style", "strength": True}], "must be a finite number"),
    ([{"name": "other"}], "is not held by this server"),
])
def test_loras_items_are_objects_with_bounded_strengths(tmp_path, loras, words):
    with pytest.raises(BadRequest) as e:
        check({"prompt": "a cat", "loras": loras}, tmp=tmp_path, loras=("style",))
    assert e.value.param == "loras" and words in str(e.value), str(e.value)


def test_a_request_for_another_model_is_refused(tmp_path):
    ok = check({"prompt": "a cat", "model": "demo_model"}, tmp=tmp_path)     # its folder name
    assert ok.call["prompt"] == "a cat"
    with pytest.raises(BadRequest) as e:
        check({"prompt": "a cat", "model": "Wan-AI/Wan2.1-T2V-14B-Diffusers"}, tmp=tmp_path)
    assert e.value.param == "model" and "this server serves demo_model" in str(e.value)


def test_serve_refuses_a_bad_store_before_loading(tmp_path, capsys):
    from ditax.cli import main

    (tmp_path / "folder").mkdir()
    (tmp_path / "junk.db").write_text("not a database")
    for db, words in ((tmp_path / "folder", "is a folder; give the job store's file"),
                      (tmp_path / "junk.db", "not a ditax job store"),
                      ("postgresql://user@127.0.0.1:5432/jobs", "a database URL")):
        rc = main(["serve", "--model", "demo", "--db", str(db), "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "postgresql:").exists()
