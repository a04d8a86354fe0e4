"""A LoRA file carries the sampling settings it was trained for (``ditax_sample`` in its
safetensors metadata, :func:`ditax.lora.export.save_lora`), and ditax samples with them:
``load_pipeline(folder, loras=[...])`` makes them the pipeline's defaults (the loader's sampler
and shift, the call's steps, guidance and sigmas), ``ditax generate --lora`` the request's; what
the caller gives wins. Two LoRAs with different settings, or a bad value, are refused in one
line naming the file(s). The shipped Wan demo and small Flux are the base models."""

import json

import numpy as np
import pytest

import ditax
from ditax.demo import flux_model_path, model_path
from ditax.errors import PipelineLoadError
from ditax.lora.export import ORIGINAL_FILE, PEFT_FILE, SAMPLE_FILE, save_lora
from ditax.pipelines.lora_sample import save_student_lora
from ditax.pipelines.sample_defaults import FILE
from ditax.models import registry
from ditax.models.wan.convert import weight_table
from ditax.pipelines.family import pipelines_of
from ditax.pipelines.lora_sample import META_KEY, read_lora_sample

STUDENT = {"num_inference_steps": 4, "guidance_scale": 1.0, "scheduler": "euler",
           "flow_shift": 5.0, "sigmas": [1.0, 0.75, 0.5, 0.25]}
SMALL = dict(height=32, width=32, num_frames=5, seed=1, progress=False)


def student(folder, sample=STUDENT, seed=0, rank=4):
    """A LoRA on the demo's self-attention queries (4 layers, width 320), saved by save_lora."""
    rng = np.random.default_rng(seed)
    params = {"blocks": {"attn1": {"to_q": {
        "lora_down": (0.05 * rng.standard_normal((4, rank, 320))).astype(np.float32),
        "lora_up": (0.05 * rng.standard_normal((4, rank, 320))).astype(np.float32)}}}}
    args = (folder, params, weight_table(4, True, head_dim=64), rank, 4.0)
    names = registry.spec("wan").lora_names_object()
    if sample is None:
        return save_lora(*args, names=names)
    return save_student_lora(*args, names=names, sample=sample)   # checks, then save_lora


def with_meta(path, sample_text: str):
    """A Wan LoRA file whose metadata holds ``ditax_sample`` = ``sample_text`` as given."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    m = "transformer.blocks.0.attn1.to_q"
    save_file({f"{m}.lora_A.weight": rng.standard_normal((2, 320)).astype(np.float32),
               f"{m}.lora_B.weight": rng.standard_normal((320, 2)).astype(np.float32)},
              str(path), metadata={"format": "pt", META_KEY: sample_text})
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return student(tmp_path_factory.mktemp("student"))


@pytest.fixture(scope="module")
def pipe(files):
    return ditax.load_pipeline(model_path(), loras=[(files[0], 1.0)])


def test_save_lora_writes_the_settings_into_both_files_and_beside_them(files):
    from safetensors import safe_open

    assert [p.name for p in files] == [PEFT_FILE, ORIGINAL_FILE]
    for path in files:
        with safe_open(str(path), framework="np") as f:
            assert json.loads(f.metadata()[META_KEY]) == STUDENT
    assert SAMPLE_FILE == FILE      # lora.export's name of the folder file (it cannot import it)
    assert json.loads((files[0].parent / "ditax_sample.json").read_text()) == STUDENT
    names = registry.spec("wan").lora_names_object()
    assert json.loads(ditax.lora.read_lora(files[1], names=names).metadata[META_KEY]) == STUDENT


def test_save_lora_refuses_a_bad_setting_before_writing(tmp_path):
    for bad, words in (({**STUDENT, "sigmas": [1.0, 0.5]}, "sigmas has 2 values but 4 steps"),
                       ({**STUDENT, "flow_shift": -1}, "flow_shift=-1 must be"),
                       ({"height": 64}, "unknown key 'height'")):
        with pytest.raises(PipelineLoadError, match=f"save_lora.sample=...*{words}"):
            student(tmp_path / "bad", bad)
        assert not (tmp_path / "bad").exists()


def test_the_loras_settings_are_the_pipelines_defaults_and_explicit_values_win(pipe):
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    # the loader's: Euler, shift 5 (the demo folder's own is UniPC, shift 3)
    assert isinstance(pipe.scheduler, FlowMatchEulerScheduler) and pipe.scheduler.shift == 5.0
    # the call's, over the folder's ditax_sample.json (25 steps, guidance 8)
    assert {k: pipe.sample_defaults[k] for k in ("num_inference_steps", "guidance_scale",
                                                 "sigmas")} == {
        "num_inference_steps": 4, "guidance_scale": 1.0, "sigmas": STUDENT["sigmas"]}
    plain = pipe("a red ball", **SMALL)
    assert pipe.last_stats["steps"] == 4
    explicit = pipe("a red ball", num_inference_steps=4, guidance_scale=1.0,
                    sigmas=STUDENT["sigmas"], **SMALL)
    np.testing.assert_array_equal(plain, explicit)
    # an explicit step count wins (the LoRA's 4 sigmas do not go with it: evenly spaced)
    two = pipe("a red ball", num_inference_steps=2, **SMALL)
    assert pipe.last_stats["steps"] == 2 and np.abs(two - plain).max() > 1e-3
    # so does an explicit guidance (CFG against the folder's empty negative prompt)
    guided = pipe("a red ball", guidance_scale=6.0, **SMALL)
    assert np.abs(guided - plain).max() > 1e-3


def test_explicit_loader_arguments_win_and_strength_zero_carries_nothing(files):
    wan = pipelines_of("wan")
    got = read_lora_sample(wan, [(files[0], 0.8)])
    assert got.values == STUDENT and got.source == PEFT_FILE
    assert got.load_args(scheduler="unipc", flow_shift=None) == {"scheduler": "unipc",
                                                                 "flow_shift": 5.0}
    assert got.call_defaults(euler=False) == {"num_inference_steps": 4, "guidance_scale": 1.0}
    assert got.line("flags override") == (
        f"{PEFT_FILE} carries its sampling settings: 4 steps, euler, shift 5, sigmas "
        f"1,0.75,0.5,0.25, guidance 1 (flags override)")
    # a server loads its LoRAs at strength 0: they set nothing until a request names them
    assert read_lora_sample(wan, [(files[0], 0.0)]) is None
    assert read_lora_sample(wan, [], None) is None
    # the same settings on both experts (Wan 2.2: --lora and --lora-2) are one schedule
    both = read_lora_sample(wan, [files[0]], [files[1]])
    assert both.values == STUDENT and both.source == f"{PEFT_FILE}, {ORIGINAL_FILE}"


def test_two_loras_with_different_settings_are_refused(tmp_path, files):
    other = student(tmp_path / "eight", {**STUDENT, "num_inference_steps": 8,
                                         "sigmas": [1 - i / 8 for i in range(8)]})[0]
    with pytest.raises(PipelineLoadError) as e:
        ditax.load_pipeline(model_path(), loras=[files[0], other])
    msg = str(e.value)
    assert "\n" not in msg and str(files[0]) in msg and str(other) in msg
    assert "different sampling settings" in msg


@pytest.mark.parametrize("text,words", [
    ('{"num_inference_steps": 0}', "num_inference_steps=0 must be a positive int"),
    ('{"num_inference_steps": 2, "sigmas": [1.0, 0.5]}', 'scheduler=null; set "scheduler"'),
    ('{"scheduler": "euler", "num_inference_steps": 2, "sigmas": [0.5, 1.0]}',
     "must decrease strictly"),
    ('{"guidance_scale": "high"}', 'guidance_scale="high" must be a finite number'),
    ('{"true_cfg_scale": 4}', "true_cfg_scale is not a setting of wan pipelines"),  # Flux's
    ('{"num_frames": 5}', "unknown key 'num_frames'"),
    ('{"num_inference_steps": 4', "not valid JSON"),
    ('[4]', "must hold a JSON object"),
])
def test_a_bad_setting_is_refused_naming_the_file_and_key(tmp_path, text, words):
    path = with_meta(tmp_path / "bad.safetensors", text)
    with pytest.raises(PipelineLoadError) as e:
        ditax.load_pipeline(model_path(), loras=[path])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path} metadata ditax_sample") and words in msg


def test_diffusers_load_lora_weights_reads_the_files(files):
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    pytest.importorskip("peft")

    ref = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None,
                                transformer=diffusers.WanTransformer3DModel.from_pretrained(
                                    str(model_path() / "transformer")))
    x = torch.randn(2, 320)
    with torch.no_grad():
        before = ref.transformer.blocks[0].attn1.to_q(x)
        for i, path in enumerate(files):
            ref.load_lora_weights(str(path), adapter_name=f"s{i}")
            ref.set_adapters([f"s{i}"])
            after = ref.transformer.blocks[0].attn1.to_q(x)   # now PEFT's LoRA layer
            assert (after - before).abs().max() > 1e-3      # the adapter is in
            if i:
                torch.testing.assert_close(after, first, atol=1e-5, rtol=1e-5)
            first = after


def test_generate_takes_the_settings_under_its_flags(files, capsys):
    from ditax.cli import build_parser
    from ditax.cli.generate import parse_request

    _, parser, _ = build_parser("generate")
    base = ["--model", "demo", "--prompt", "x", "--lora", f"{files[0]}:0.9"]
    args = parser.parse_intermixed_args(base)
    req = parse_request(args)
    load, call = req.load.kwargs(), req.call
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"{PEFT_FILE} carries its sampling settings: 4 steps, euler, shift 5, "
                   f"sigmas 1,0.75,0.5,0.25, guidance 1 (flags override)"]
    assert (load["scheduler"], load["flow_shift"]) == ("euler", 5.0)
    assert (call["num_inference_steps"], call["guidance_scale"], list(call["sigmas"])) == \
        (4, 1.0, STUDENT["sigmas"])
    # read once: a later request of the same run (--prompts) takes the first one's settings
    # and prints nothing more
    from ditax.cli.generate import given_of

    again = parse_request(args, {**given_of(args), "lora_sample": req.lora_sample})
    assert again.call["num_inference_steps"] == 4 and capsys.readouterr().out == ""
    # flags and sample.* win; the sigmas go only with their own step count
    req = parse_request(parser.parse_intermixed_args(
        base + ["--steps", "8", "--guidance", "3", "sample.flow_shift=3"]))
    load, call = req.load.kwargs(), req.call
    assert (load["scheduler"], load["flow_shift"]) == ("euler", 3.0)
    assert (call["num_inference_steps"], call["guidance_scale"], call["sigmas"]) == \
        (8, 3.0, None)
    req = parse_request(parser.parse_intermixed_args(base + ["sample.scheduler=unipc"]))
    load, call = req.load.kwargs(), req.call
    assert (load["scheduler"], call["num_inference_steps"], call["sigmas"]) == ("unipc", 4, None)
    # --lora-2 is read too: a conflict is exit 2 in one line naming both files
    from ditax.cli import main

    other = with_meta(files[0].parent / "other.safetensors", json.dumps(
        {**STUDENT, "flow_shift": 3.0}))
    assert main(["generate", *base, "--lora-2", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(files[0]) in err[0] and str(other) in err[0], err


def flux_student(path, sample: dict):
    """A PEFT LoRA on the small Flux's first double block's queries with ``sample``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    m = "transformer.transformer_blocks.0.attn.to_q"
    save_file({f"{m}.lora_A.weight": (0.2 * rng.standard_normal((2, 128))).astype(np.float32),
               f"{m}.lora_B.weight": (0.2 * rng.standard_normal((128, 2))).astype(np.float32)},
              str(path), metadata={"format": "pt", META_KEY: json.dumps(sample)})
    return path


def test_flux_takes_sigmas_and_a_loras_settings(tmp_path):
    sample = {"num_inference_steps": 2, "sigmas": [1.0, 0.6], "guidance_scale": 2.0,
              "true_cfg_scale": 1.0, "flow_shift": 2.0}
    path = flux_student(tmp_path / "flux_student.safetensors", sample)
    pipe = ditax.load_pipeline(flux_model_path(), loras=[path])
    assert (pipe.scheduler.shift, pipe.scheduler.use_dynamic_shifting) == (2.0, False)
    kw = dict(height=32, width=32, seed=2, progress=False)
    plain = pipe("a red circle", **kw)
    explicit = pipe("a red circle", num_inference_steps=2, sigmas=[1.0, 0.6], guidance_scale=2.0,
                    true_cfg_scale=1.0, **kw)
    np.testing.assert_array_equal(plain, explicit)
    spaced = pipe("a red circle", num_inference_steps=2, sigmas=[1.0, 0.5], **kw)
    assert np.abs(spaced - plain).max() > 1e-4      # the sigmas are used
    with pytest.raises(ditax.DitaxError, match="sigmas has 3 values but 2 steps"):
        pipe("a red circle", sigmas=[1.0, 0.6, 0.3], **kw)
    # a Wan-only key in a Flux LoRA
    bad = flux_student(tmp_path / "bad.safetensors", {"scheduler": "euler"})
    with pytest.raises(PipelineLoadError, match=f"{bad} metadata ditax_sample: scheduler is "
                       f"not a setting of flux pipelines .* a LoRA for another model"):
        ditax.load_pipeline(flux_model_path(), loras=[bad])
