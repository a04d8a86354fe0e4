"""``resolve(model, overrides, given, surface)``: a plain mapping → one checked
:class:`~ditax.front.request.Request`, the same way for every entry.

``given`` holds what the caller asked for, by name: the request fields (the pipeline call's
keywords: ``prompt``, ``height``, ``num_inference_steps``, ``num_frames`` …; the common ones and
the folder's family's, :mod:`ditax.pipelines.request`), the family's inputs (its
:class:`~ditax.pipelines.inputs.Input` names: ``image``, ``video``, ``lora_2`` …) and the
options every entry has (:data:`OPTIONS`). None (or an empty list) is "not given". ``surface``
says how a message names a value: ``cli`` (``--steps``), ``api`` (the JSON name), ``python``
(the keyword). In this order, before any weights are read: the folder and its config
(:func:`~ditax.front.folder.folder_request`), a name the family does not take (one line naming
the family, and the families that take it), the LoRA files and the settings they carry, each
field's type and limits over the defaults (given, else ``sample.*`` / preset, else the
folder's ``ditax_sample.json``, else the family's), the family's request checks, the folder's
size rule, the output path, the family's inputs (files read and checked), the config against
the devices. Defaults are resolved here once; the pipelines take the call as it is.
"""

from __future__ import annotations

import pathlib

from ditax.errors import ConfigError, RequestError, request_errors
from ditax.front.request import LoadRequest, Output, Request, frozen

# the options every entry's request may hold beside the fields and the family's inputs
OPTIONS = ("lora", "lora_mode", "lora_strict", "lora_sample", "text_quantize",
           "text_offload", "output", "no_audio")
# what each output kind (PipelineFamily.makes) is written as
SUFFIX = {"video": ".mp4", "image": ".png"}


def shown(key: str, surface: str) -> str:
    """An option or input ``key`` as ``surface`` names it (``--lora-2`` on the CLI)."""
    return "--" + key.replace("_", "-") if surface == "cli" else key


def refuse_others(given, pipes, model: str, surface: str) -> None:
    """A given name that neither the common request, the family's fields and inputs nor
    :data:`OPTIONS` hold is refused in one line naming the family (and the families that
    take it), before any work."""
    from ditax.pipelines.request import all_fields, fields_of, not_taken

    own = {f.name for f in fields_of(pipes)} | set(pipes.cli_inputs) | set(OPTIONS)
    context = f"{model} is a {pipes.name} folder, it makes {pipes.makes}s"
    for key, value in sorted(given.items()):
        if key in own or value is None or (isinstance(value, (list, tuple)) and not value):
            continue
        field = all_fields().get(key)
        if field is not None:
            raise not_taken(pipes, field[0].shown(surface), "name", key, context)
        from ditax.pipelines.family import known_pipelines

        owners = [name for name, p in known_pipelines() if key in p.cli_inputs]
        if owners:
            raise RequestError(f"{shown(key, surface)} is not taken by {pipes.name} models "
                               f"({context}); it is for {', '.join(owners)} models — drop it")
        raise RequestError(f"{shown(key, surface)} is not a request field, input or option of "
                           f"{pipes.name} models; it takes "
                           f"{', '.join(sorted(own))}")


def pair_true_cfg(given, pipes, surface: str) -> None:
    """A family with true CFG (a ``true_cfg_scale`` field) takes the negative prompt only
    with it: both or neither."""
    from ditax.pipelines.request import fields_of

    tcfg = next((f for f in fields_of(pipes) if f.name == "true_cfg_scale"), None)
    if tcfg is None:
        return
    neg = "--negative-prompt" if surface == "cli" else "negative_prompt"
    if (given.get("negative_prompt") is None) != (given.get("true_cfg_scale") is None):
        eg = (f"{neg} 'blurry' {tcfg.shown(surface)} 4" if surface == "cli"
              else f'"{neg}": "blurry", "{tcfg.shown(surface)}": 4')
        raise RequestError(f"{neg} and {tcfg.shown(surface)} go together (true CFG against "
                           f"the negative prompt), e.g. {eg}; give both or neither")


def output_of(given, req, call: dict, makes: str) -> Output:
    """The checked :class:`Output` of the request: the path (default ``out.mp4`` /
    ``out.png``), its suffix the output kind's, a video's PNG folder and frame rate."""
    from ditax.io.outputs import check_output_file, check_output_folder

    suffix = SUFFIX.get(makes, ".mp4")
    given_path = given.get("output")
    path = str(check_output_file("out" + suffix if given_path is None else given_path,
                                 "--output", example="out" + suffix))
    if pathlib.Path(path).suffix.lower() != suffix:
        fix = "; use --frames-dir for PNG frames" if makes == "video" else ""
        raise RequestError(f"--output {path!r} must end in {suffix} ({req.model} makes "
                           f"{makes}s){fix}")
    if makes != "video":
        return Output(path)
    from ditax.io.ffmpeg import check_available

    check_available()          # an mp4 needs ffmpeg: said now, not after the video
    fps = given.get("fps")
    if fps is None:             # a model made for a frame rate: at it
        rate = call.get("frame_rate")
        fps = (int(rate) if float(rate).is_integer() else rate) if rate else \
            req.defaults.get("fps") or 16
    if fps < 1:
        raise RequestError(f"--fps={fps} must be >= 1 (Wan: 16)")
    frames_dir = given.get("frames_dir")
    if frames_dir is not None:
        frames_dir = str(check_output_folder(frames_dir, "--frames-dir"))
        if pathlib.Path(frames_dir).absolute() == pathlib.Path(path).absolute():
            raise RequestError(f"--frames-dir {frames_dir} is the --output path; give the PNG "
                               f"frames their own folder")
    return Output(path, frames_dir, fps)


def resolve(model, overrides=(), given=None, surface: str = "python", *,
            say=print) -> Request:
    """The checked :class:`~ditax.front.request.Request` of ``given`` (module docstring) on
    ``model`` (a folder, hub id, ``demo``) under the ``key=value`` ``overrides``; a
    :class:`~ditax.errors.RequestError` / ``ConfigError`` naming the value as ``surface`` names
    it. ``say`` announces what the LoRA files set."""
    from ditax.front.folder import folder_request
    from ditax.front.loras import lora_options, read_lora_sample, read_loras
    from ditax.models.registry import require, spec
    from ditax.pipelines.request import build_request, fields_of

    given = dict(given or {})
    req = folder_request(str(model), list(overrides))
    pipes, s, chosen, defaults = req.pipelines, req.cfg.sample, req.chosen, req.defaults
    refuse_others(given, pipes, req.model, surface)
    if s.cache or s.cfg_cache:      # the family declares step caching, or it is refused
        require(pipes.name, "step_cache", "sample.cache" if s.cache else "sample.cfg_cache",
                "drop it (the step cache is not wired into this family's pipelines)")
    pair_true_cfg(given, pipes, surface)
    strict = given.get("lora_strict", True)
    loras = read_loras(given.get("lora"), strict, family=pipes.name)
    lora_sample = read_lora_sample(given, pipes, loras, say)
    if lora_sample is not None:     # the LoRA's steps / guidance over the folder's, under chosen
        defaults = {**defaults, **{k: v for k, v in lora_sample.call_defaults().items()
                                   if k in defaults and k not in chosen}}
    call = build_request(pipes, {f.name: given.get(f.name) for f in fields_of(pipes)},
                         {"seed": 0, **defaults}, surface, folder=req.model).call()
    check_call(req, call, pipes)
    makes = pipes.makes
    output = output_of(given, req, call, makes)
    if spec(pipes.name).has("step_cache"):    # the generic loop's step cache
        call.update(cache=s.cache, cache_threshold=s.cache_threshold, cfg_cache=s.cfg_cache,
                    cache_coefficients=s.cache_coefficients)
    if "audio" in pipes.outputs:               # a family that makes a sound track
        call["audio"] = not given.get("no_audio")
    elif given.get("no_audio"):
        flag = shown("no_audio", surface)
        raise RequestError(f"{flag}: {req.model} is a {pipes.name} folder, which makes no "
                           f"sound track; drop {flag}")
    call = pipes.read_inputs(given, call, s)      # the family's files (images, videos)
    own_call, own_load = pipes.sample_options(given, s, chosen, defaults, call)
    if lora_sample is not None:
        lora_options(lora_sample, own_call, own_load, chosen, call["num_inference_steps"])
    if s.sigmas is not None and "sigmas" not in own_call:
        raise RequestError(f"sample.sigmas is not read by {pipes.name} folders (they set "
                           f"their own schedule); drop it")
    call.update(own_call)
    load = load_request(req, given, makes, loras, own_load)
    return Request(load, frozen(call), output, pipes, lora_sample)


def check_call(req, call: dict, pipes) -> None:
    """The call's step-cache numbers file, sizes (the folder's one rule), the family's checks
    and the sigmas' count, before any weights."""
    from ditax.front.folder import check_sizes

    s = req.cfg.sample
    if s.cache_coefficients is not None:
        from ditax.pipelines.cache.numbers import read_numbers

        read_numbers(s.cache_coefficients)      # a readable numbers file, before any weights
    with request_errors():
        check_sizes(req, call)      # the folder's one size rule, before the family's checks
        pipes.check_request(**call)
    if s.sigmas is not None and len(s.sigmas) != call["num_inference_steps"]:
        origin = f" (sample.preset={s.preset})" if s.preset else ""
        raise RequestError(f"sample.sigmas has {len(s.sigmas)} values{origin} but --steps "
                           f"{call['num_inference_steps']}; drop --steps or pass "
                           f"sample.sigmas=none")


def load_request(req, given, makes: str, loras: list, own_load: dict) -> LoadRequest:
    """The :class:`LoadRequest` of the folder's config (``req``), validated against the
    devices where the user gave a mesh, with the request's LoRAs and text-encoder options
    and the family's own loader options."""
    import jax

    from ditax.config import validate
    from ditax.models.common.fields import matmul_precision

    cfg, given_cfg, s = req.cfg, req.given, req.cfg.sample
    use_mesh = "mesh" in given_cfg
    validate(cfg, jax.device_count() if use_mesh else None)
    dtype = cfg.model.dtype
    if "param_dtype" in given_cfg.get("model", {}) and cfg.model.param_dtype != dtype:
        raise ConfigError(f"model.param_dtype={cfg.model.param_dtype} differs from model.dtype="
                          f"{dtype}; the pipeline loads weights in one dtype — set model.dtype")
    model_over = {k: getattr(cfg.model, k) for k in given_cfg.get("model", {})
                  if k not in ("dtype", "param_dtype", "precision")}
    return LoadRequest(
        path=req.model, makes=makes, dtype=dtype, attention=cfg.attention,
        mesh=cfg.mesh if use_mesh else None, compile_cache=cfg.compile_cache,
        cfg_mode=s.cfg_mode, vae_parallel=bool(s.vae_parallel),
        # sample.vae_tiling given (or a preset's): as given; else None, the pipeline's choice
        vae_tiling=s.vae_tiling if "vae_tiling" in req.chosen else None,
        loras=tuple(loras), lora_mode=given.get("lora_mode") or "merged",
        lora_strict=given.get("lora_strict", True),
        text_quantize=given.get("text_quantize") or "none",
        text_offload=given.get("text_offload"), precision=matmul_precision(cfg.model),
        model=frozen(model_over),
        family=frozen(own_load))


__all__ = ["OPTIONS", "SUFFIX", "resolve"]
