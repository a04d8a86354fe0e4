"""Conformance: every registered family and variant (Wan T2V, I2V, TI2V, VACE, Animate, V2V,
FLUX.1, the toy third family) through every capability it has — load, generate, serve one
request, batch two, LoRA load, int8 load, ``plan``, ``convert`` (folder check, single-file
round trip) — and each capability it lacks answered in one line, exit 2 (or, for batching,
declared: ``batchable(pipe)`` is False). The table is tests/refs/conformance_variants.py.

This checks that each capability *works* for each variant on the smallest request (one step,
one frame, the smallest grid; one folder and one loaded pipeline per variant); the numbers
against diffusers are the per-family modules' (tests/pipelines, tests/models, tests/lora)."""

import importlib

import numpy as np
import pytest

import ditax
from conformance_variants import (ALL_CAPS, FAMILY_CAPS, VARIANTS, b64, generate_argv,
                                  peft_lora, single_file_config, write_inputs)
from family_scope import families_restored

pytestmark = pytest.mark.usefixtures("fast_compile")

#: the capabilities whose check takes longest (6-9 s each): in the slow tier
SLOW_CAPS = {("ltx2", "batch"), ("wan-animate", "generate")}
HAS = [pytest.param(v, c, marks=pytest.mark.slow) if (v, c) in SLOW_CAPS else (v, c)
       for v, row in VARIANTS.items() for c in ALL_CAPS if c in row.caps]
LACKS = [(v, c) for v, row in VARIANTS.items() for c in ("serve", "batch", *FAMILY_CAPS)
         if c not in row.caps]
TORCH_BUILT = {"wan-i2v", "wan-ti2v", "wan-vace", "wan-animate"}
TOL = 2e-4   # a batch of two vs each alone: float32 rounding of wider matmuls


@pytest.fixture(scope="module", autouse=True)
def toy():
    """The toy third family registered for this module only (as a plug-in is on import)."""
    with families_restored():
        import toy_third

        yield importlib.reload(toy_third)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return write_inputs(tmp_path_factory.mktemp("conformance_inputs"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory, inputs):
    """``get(variant)``: its folder, built once (shipped folders as they are)."""
    cache = {}

    def get(name):
        if name not in cache:
            if name in TORCH_BUILT:
                pytest.importorskip("torch")
                pytest.importorskip("diffusers")
            cache[name] = VARIANTS[name].build(tmp_path_factory.mktemp(name), inputs)
        return cache[name]
    return get


@pytest.fixture(scope="module")
def pipes(folders):
    """``get(variant)``: its pipeline, loaded once."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = ditax.load_pipeline(folders(name), **VARIANTS[name].load)
        return cache[name]
    return get


def one_line_exit_2(capsys, argv, words):
    from ditax.cli import main

    capsys.readouterr()          # what building the folder printed
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words.lower() in err[0].lower(), (argv, rc, err)


def body_of(name, inputs, prompt, seed):
    v = VARIANTS[name]
    body = {k: val for k, val in v.size.items() if k not in ("height", "width")}
    return dict(body, prompt=prompt, seed=seed, size=f"{v.size['width']}x{v.size['height']}",
                **v.body(inputs))


def checked(name, folder, inputs, tmp, prompt="a red circle moves right", seed=1):
    """The server's check of a body (ditax.serve.requests.check_body: the front door, as the
    server runs it)."""
    from ditax.serve.requests import check_body

    return check_body(body_of(name, inputs, prompt, seed), str(folder), [], str(tmp / "x.mp4"))


def _latents(out) -> np.ndarray:
    """A call's ``output="latent"`` as one array (a family with several streams, LTX-2's
    video and audio, returns them by name: laid end to end)."""
    if isinstance(out, dict):
        return np.concatenate([np.ravel(np.asarray(v)) for _, v in sorted(out.items())])
    return np.asarray(out)


def frames_of(out):
    return out["video"] if isinstance(out, dict) else out


def params(pipe) -> list:
    import jax
    from flax import nnx

    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(pipe.transformer.module,
                                                             nnx.Param))]


# ---------------------------------------------------------------- what each variant has
def check_load(name, folders, pipes, inputs, tmp, capsys):
    pipe = pipes(name)
    assert callable(pipe)
    assert pipe.__class__.__module__.startswith(("ditax.", "toy_third"))


def check_generate(name, folders, pipes, inputs, tmp, capsys):
    from ditax.cli import main

    v = VARIANTS[name]
    out = tmp / f"o{v.makes[0]}"
    rc = main(generate_argv(v, folders(name), inputs, out))
    assert rc == 0, capsys.readouterr().err
    for suffix in v.makes:
        assert (tmp / f"o{suffix}").stat().st_size > 0, suffix


def check_serve(name, folders, pipes, inputs, tmp, capsys):
    v = VARIANTS[name]
    c = checked(name, folders(name), inputs, tmp)
    assert c.batch_key is not None
    out = frames_of(pipes(name)(progress=False, **c.call))
    assert out.shape[-3:] == (v.size["height"], v.size["width"], 3)
    assert np.isfinite(out).all()


def check_batch(name, folders, pipes, inputs, tmp, capsys):
    from ditax.pipelines.batch import batchable, sample_batch

    pipe = pipes(name)
    assert batchable(pipe)
    a = checked(name, folders(name), inputs, tmp, "a red circle moves right", 1)
    b = checked(name, folders(name), inputs, tmp, "a blue square moves up", 2)
    assert a.batch_key == b.batch_key           # the server would put them in one batch
    calls = [dict(x.call, output="latent") for x in (a, b)]
    alone = [_latents(pipe(progress=False, **c)) for c in calls]
    both = [_latents(x) for x in sample_batch(pipe, calls)]
    for got, want in zip(both, alone):
        assert got.shape == want.shape and float(np.abs(got - want).max()) < TOL
    assert float(np.abs(alone[0] - alone[1]).max()) > 1e-3


def check_step_cache(name, folders, pipes, inputs, tmp, capsys):
    """A threshold no step reaches: every step after the first reuses the cached residual, so
    the cached call runs fewer transformer evaluations than the same steps uncached. The
    uncached count is the plain call's per step (every branch every step) at the table's own
    request, the program generate and serve compiled; the cached call runs two steps (the
    fewest where one can be skipped), the table's step count where that is more (LTX-2's),
    four at video-to-video's strength 0.5 (2 of them run)."""
    v, pipe = VARIANTS[name], pipes(name)
    call = dict(v.size, **v.call(inputs), prompt="a red circle", seed=1, progress=False)
    pipe(**call)
    plain = pipe.last_stats
    per_step = plain["transformer_calls"] / plain["steps"]
    steps = max(2, v.size["num_inference_steps"])
    call["num_inference_steps"] = 2 * steps if call.get("strength", 1.0) < 1 else steps
    pipe(**call, cache="first_block", cache_threshold=1e9)
    got = pipe.last_stats
    assert got["steps"] >= 2, got
    assert 0 < got["transformer_calls"] < per_step * got["steps"], (got, plain)


def check_lora(name, folders, pipes, inputs, tmp, capsys):
    folder = folders(name)
    lora = peft_lora(folder, tmp / "lora.safetensors")
    with_lora = ditax.load_pipeline(folder, loras=[(str(lora), 1.0)], **VARIANTS[name].load)
    base, got = params(pipes(name)), params(with_lora)
    moved = [not np.array_equal(x, y) for x, y in zip(base, got)]
    assert len(base) == len(got) and 0 < sum(moved) < len(moved), sum(moved)


def check_quantize(name, folders, pipes, inputs, tmp, capsys):
    from flax import nnx

    from ditax.nn.quant import quantized_kernels

    q = ditax.load_pipeline(folders(name), quantize="int8", **VARIANTS[name].load)
    assert quantized_kernels(nnx.state(q.transformer.module))


def check_plan(name, folders, pipes, inputs, tmp, capsys):
    from ditax.cli import main

    plan = VARIANTS[name].plan
    rc = main(["plan", plan if isinstance(plan, str) else plan(tmp), "--target", "cpu:8"])
    assert rc == 0, capsys.readouterr().err


def check_folder_check(name, folders, pipes, inputs, tmp, capsys):
    from ditax.cli import main

    rc = main(["convert", str(folders(name))])
    assert rc == 0, capsys.readouterr().err


def single_file(name, folder, tmp):
    """The folder's transformer as one safetensors file: under Wan / ComfyUI's original names
    where every key has one (Wan T2V / I2V; VACE's and Animate's extra modules have none),
    else under diffusers' names, which the single-file readers take too."""
    from safetensors.numpy import load_file, save_file

    from ditax.models.wan.original_names import key_to_original

    files = sorted((folder / "transformer").glob("*.safetensors"))
    theirs = {k: v for f in files for k, v in load_file(str(f)).items()}
    original = VARIANTS[name].family == "wan" and all(map(key_to_original, theirs))
    rename = (lambda k: "model.diffusion_model." + key_to_original(k)) if original else str
    save_file({rename(k): v for k, v in theirs.items()}, str(tmp / "one.safetensors"))
    return tmp / "one.safetensors", theirs


def check_single_file(name, folders, pipes, inputs, tmp, capsys):
    from safetensors.numpy import load_file

    from ditax.cli import main

    folder = folders(name)
    path, want = single_file(name, folder, tmp)
    spec = single_file_config(folder, VARIANTS[name].family, tmp)
    rc = main(["convert", str(path), "--config", str(spec), "--out", str(tmp / "out")])
    assert rc == 0, capsys.readouterr().err
    got = {k: v for f in sorted((tmp / "out").glob("*.safetensors"))
           for k, v in load_file(str(f)).items()}
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.mark.parametrize("variant, capability", HAS)
def test_capability(variant, capability, folders, pipes, inputs, tmp_path, capsys):
    globals()[f"check_{capability}"](variant, folders, pipes, inputs, tmp_path, capsys)


# ---------------------------------------------------------------- what it lacks
def test_table_agrees_with_the_registry():
    """The table's family capabilities are the families' own declarations
    (FamilySpec.capabilities, names from registry.CAPABILITIES): no variant has one its family
    does not declare, and each one a family declares some variant of it has."""
    from ditax.models import registry

    assert set(FAMILY_CAPS) <= set(registry.CAPABILITIES)
    families = {v.family for v in VARIANTS.values()}
    assert families >= set(registry.family_names()), "a registered family has no row"
    for family in families:
        declared = set(registry.spec(family).capabilities) & set(FAMILY_CAPS)
        rows = {n: set(v.caps) & set(FAMILY_CAPS) for n, v in VARIANTS.items()
                if v.family == family}
        for name, caps in rows.items():
            assert caps <= declared, (name, sorted(caps - declared))
        assert set().union(*rows.values()) == declared, (family, sorted(declared))


@pytest.mark.parametrize("variant, capability", LACKS)
def test_lacking(variant, capability, folders, pipes, inputs, tmp_path, capsys):
    v, folder = VARIANTS[variant], folders(variant)
    if capability == "batch":
        from ditax.pipelines.batch import batchable, sample_batch

        pipe = pipes(variant)
        assert not batchable(pipe)
        with pytest.raises(ValueError, match="one by one") as e:
            sample_batch(pipe, [dict(prompt="x")] * 2)
        assert len(str(e.value).splitlines()) == 1
    elif capability == "serve":
        from ditax.serve.requests import BadRequest, check_body

        body = body_of(variant, inputs, "x", 1)
        for k in v.call(inputs):            # its inputs, as a client would try to send them
            body.setdefault(k, b64(inputs / "src.mp4"))
        with pytest.raises(BadRequest) as e:
            check_body(body, str(folder), [], str(tmp_path / "x.mp4"))
        assert len(str(e.value).splitlines()) == 1, str(e.value)
    elif capability == "lora":
        lora = peft_lora(folders("wan-t2v"), tmp_path / "lora.safetensors")
        one_line_exit_2(capsys, generate_argv(v, folder, inputs, tmp_path / "o.mp4",
                                              ["--lora", str(lora)]), "lora")
    elif capability == "quantize":
        one_line_exit_2(capsys, generate_argv(v, folder, inputs, tmp_path / "o.mp4",
                                              ["model.quantize=int8"]), "quantiz")
    elif capability == "step_cache":
        one_line_exit_2(capsys, ["calibrate-cache", "--model", str(folder), "--prompts", "a cat", "a dog"],
                        "step cache")
    elif capability == "folder_check":
        one_line_exit_2(capsys, ["convert", str(folder)], v.family)
    elif capability == "single_file":
        import yaml

        from ditax.models import registry

        if registry.spec(v.family).has("single_file"):   # a variant whose extra modules the
            path, _ = single_file(variant, folder, tmp_path)     # family's reader lacks
            spec, words = single_file_config(folder, v.family, tmp_path), "unexpected"
        else:
            spec, words = tmp_path / "arch.yaml", "capability 'single_file'"
            spec.write_text(yaml.safe_dump({"model": {"family": v.family}}))
            path = tmp_path / "one.safetensors"
            path.write_bytes(b"")
        one_line_exit_2(capsys, ["convert", str(path), "--config", str(spec)], words)


@pytest.mark.parametrize("variant", [v for v, row in VARIANTS.items() if row.refusals])
def test_flags_of_another_capability_are_refused(variant, folders, inputs, tmp_path, capsys):
    """A flag this variant does not take: exit 2, one line naming it, nothing written."""
    v = VARIANTS[variant]
    for flags, words in v.refusals:
        flags = [f.format(inputs=inputs) for f in flags]
        out = tmp_path / f"o{v.makes[0]}"
        one_line_exit_2(capsys, generate_argv(v, folders(variant), inputs, out, flags), words)
        assert not out.exists()
