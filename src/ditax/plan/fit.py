"""What fits one chip (``ditax plan CONFIG --target tpu-v5e-1 --fit``): each phase of a video
pipeline — text encoding, one denoising step, the VAE decode — against the chip's HBM, and the
smallest change that makes all of them fit.

A pipeline's phases share the device: while the text encoder runs, the transformer's
device-resident weights are there too; while the transformer denoises, the encoder's weights
(unless ``text_offload=host``) and the VAE's are; while the VAE decodes, the transformer's
(and with Wan 2.2 A14B, both experts') are. Each phase's bytes are therefore its own program's
peak plus what the other phases leave resident.

How each number is got (the report says it again, phase by phase; the phases' estimators are
in :mod:`ditax.plan.fit_phases`):

- denoise: the transformer forward compiled for the target (deviceless, :func:`ditax.plan.plan`)
  at the batch a step runs (2 with batched CFG), once per rung of the ladder below: the
  device peak a chip shows (``device_peak_bytes``: buffers + the executable's temporaries,
  :func:`ditax.plan.measure.device_peak`), device / host argument bytes and
  ``host_to_device_bytes`` (the async copies out of host memory space ``S(5)`` in the
  compiled program) are measured; each phase is judged against the chip's
  :attr:`~ditax.plan.targets.Chip.limit_bytes` (v5e: the runtime's 15.75 GiB). When fewer layers
  than the model has are compiled (``layers=``), the rest is scaled: the weights' bytes exactly
  from the full abstract model, each further layer's weights streamed once more per step, the
  temporaries unchanged (the layer loop's body is the same), compute in proportion to the
  model's FLOPs. ``host_s`` is the streamed bytes over :data:`~ditax.plan.measure.
  HOST_LINK_BYTES_PER_S` (32 GB/s, an ASSUMED host link: no per-chip figure is published);
  ``compute_s`` the FLOPs over the chip's peak bf16 rate (a floor).
- text: analytic, from the encoders' published configs (UMT5-XXL for Wan, CLIP-L and T5-XXL
  for FLUX.1, Qwen3-4B / 8B or Mistral Small 3.1 for FLUX.2, Gemma-3 12B for LTX-2):
  its weights' bytes from the abstract module (T5s) or the published sizes (the decoder LMs,
  CLIP), 8-bit block linears under ``text_quantize``,
  its activations from the prompt length (``sample.max_sequence_length``, two prompts with CFG).
- decode: the Wan VAE's later-frame program (one latent frame in, ``temporal_factor`` frames
  out, the feature cache carried; the whole decode's peak, :mod:`ditax.models.vae.wan.chunks`)
  compiled at the config's size, or skipped (``decode=False``).

A phase not measured (the decode of a family other than Wan, or skipped; the text of a model
whose encoder is no published one) is "not known" in the verdict, and so is the verdict on all
phases: a plan never says "fits" for a phase it did not measure.

The ladder of changes, each added to the ones before, skipping what the config already has:
``model.offload=host`` (with ``text_offload=host``, its default), ``model.quantize=int8``,
``text_quantize=int8``; past it, more chips (a larger slice of the same chip, to plan with
``--target``) or, for the decode, the tiled / row-split parallel decode.
"""

from __future__ import annotations

import math

from ditax.errors import ConfigError
from ditax.plan.fit_phases import (decode, denoise, encoder_activation_bytes, encoder_bytes,
                                   text_configs, vae_weight_bytes, with_model)
from ditax.plan.measure import HOST_LINK_BYTES_PER_S

#: the ladder: (what the change says, model fields, pipeline options), tried in this order
LADDER = (("model.offload=host", {"offload": "host"}, {"text_offload": "host"}),
          ("model.quantize=int8", {"quantize": "int8"}, {}),
          ("text_quantize=int8", {}, {"text_quantize": "int8"}))
#: the slices "more chips" suggests, smallest first, per chip generation
MORE_CHIPS = {"v5e": (4, 8, 16, 32), "v6e": (4, 8, 16, 32), "v5p": (8, 16, 32, 64),
              "v7x": (8, 16)}


# -- the report ------------------------------------------------------------------------------

def rungs(cfg, text_offload=None, text_quantize: str = "none") -> list[tuple[str, dict]]:
    """``[(changes so far, settings)]``: the config as given, then each change of
    :data:`LADDER` it does not have yet, added to the ones before. Settings: ``offload``,
    ``quantize`` (the model's), ``text_offload`` (default: the model's ``offload``, as
    :func:`ditax.load_pipeline` defaults it) and ``text_quantize``."""
    now = {"offload": cfg.model.offload, "quantize": cfg.model.quantize,
           "text_offload": text_offload or cfg.model.offload, "text_quantize": text_quantize}
    out, said = [("as configured", dict(now))], []
    for label, model, pipe in LADDER:
        change = {**model, **pipe}
        if text_offload is not None:       # given: the user's, not the offload's default
            change.pop("text_offload", None)
        if all(now[k] != "none" for k in model or pipe):    # has it (or another 8-bit mode)
            continue
        now = {**now, **change}
        said.append(label)
        out.append((" + ".join(said), dict(now)))
    return out


def more_chips(chip_key: str, need: float, hbm: float) -> str:
    """The smallest slice of ``chip_key`` chips whose summed HBM holds ``need`` bytes: a rough
    count (weights and activations split evenly), to check with ``--target``."""
    for n in MORE_CHIPS.get(chip_key, ()):
        if n * hbm >= need:
            return f"tpu-{chip_key}-{n}"
    return f"tpu-{chip_key}-{MORE_CHIPS.get(chip_key, (0,))[-1]}+"


def suggestion(cfg, chip, need: float) -> str:
    """What makes a program that does not fit ``chip`` fit, in one phrase: the first change of
    :data:`LADDER` to the transformer that ``cfg`` does not have yet (``ditax plan --fit``
    compiles it and the changes after it), else the smallest slice whose chips hold ``need`` bytes
    (:func:`more_chips`)."""
    for label, model, _ in LADDER:        # the changes of the transformer's own memory
        if model and all(getattr(cfg.model, k, "none") == "none" for k in model):
            return f"{label} (ditax plan --fit checks it, then each further change)"
    return (f"more chips: {more_chips(chip_key_of(chip), need, chip.limit_bytes)} (rough: "
            f"the bytes over the chip's limit; plan it with --target)")


def chip_key_of(chip) -> str:
    """``"v5e"`` … for a chip of :data:`~ditax.plan.targets.CHIPS` (``""`` for another)."""
    return next((k for k, c in _chips().items() if c == chip), "")


def fit(cfg, mesh, chip, *, latent=None, layers=None, text_offload=None,
        text_quantize: str = "none", decode_: bool = True, every_rung: bool = False,
        vae_cfg=None, text_encoders=None, experts=None, batch=None, say=None) -> dict:
    """Per phase (text, denoise, decode) the bytes on one chip of ``mesh`` (one device) under
    each rung of :func:`rungs`, whether they fit ``chip.limit_bytes``, the host traffic of a
    denoising step next to its compute, and the smallest change that fits. Compiles one
    forward per rung until everything fits (``every_rung``: every rung, and the step without
    offload when the config has it) and the decode once.

    ``layers``: compile this many transformer layers and scale to ``model.num_layers`` (the
    module docstring says how). ``experts``: transformers the pipeline holds (default 2 when
    ``sample.guidance_scale_2`` is set: Wan 2.2 A14B; one runs per step, both stay loaded).
    ``batch``: the forward's batch per step (default 2 with classifier-free guidance, batched
    as the pipelines run it; 1 without, or with a guidance-embedding model). ``say``: called
    with a progress line before each compile. ``vae_cfg`` / ``text_encoders`` (``[(name,
    T5Config)]``): instead of the published ones (the tests' small models)."""
    from ditax.models.base import model_family

    if mesh.size != 1:
        raise ConfigError(f"--fit plans one chip; the mesh has {mesh.size} devices: use a "
                          f"single-chip target (tpu-v5e-1, tpu-v6e-1, tpu-v5p-1)")
    family = model_family(cfg.model, cfg.attention)
    full = cfg.model.num_layers
    if layers is not None and not 1 <= layers <= full:
        raise ConfigError(f"--fit-layers={layers} must be in 1..{full} (model.num_layers)")
    small = with_model(cfg, num_layers=layers) if layers and layers < full else cfg
    s = cfg.sample
    if batch is None:
        cfg_on = s.guidance_scale > 1.0 and not getattr(cfg.model, "guidance_embeds", False)
        batch = 2 if cfg_on else 1
    experts = experts or (2 if s.guidance_scale_2 is not None else 1)
    say = say or (lambda line: None)
    hbm = chip.limit_bytes       # the runtime's bytes_limit where measured (v5e: 15.75 GiB)
    chip_key = chip_key_of(chip)

    encoders = text_encoders or text_configs(family, cfg.model.dtype)
    text_act = (sum(encoder_activation_bytes(c, batch, s.max_sequence_length)
                    for _, c in encoders) if encoders else 0)
    enc_bytes = {}

    def text_weights(q):
        if encoders is None:
            return 0
        if q not in enc_bytes:
            enc_bytes[q] = sum(encoder_bytes(c, q) for _, c in encoders)
        return enc_bytes[q]

    missing = {}            # the phases not measured, and why: the verdict says "not known"
    if encoders is None:
        missing["text"] = (f"this {family.name} model's text width {family.text_dim} is no "
                           f"published text encoder's that --fit knows")
    if family.name != "wan":
        missing["decode"] = f"--fit compiles only the Wan VAE's decode, not {family.name}'s"
    elif not decode_:
        missing["decode"] = "skipped (--fit-no-decode)"
    dec = None
    if decode_ and family.name == "wan":
        say(f"compiling the VAE decode ({s.height}x{s.width}, one latent frame a call)")
        dec = decode(cfg, mesh, vae_cfg)
    vae_w = (dec or {}).get("vae_weight_bytes") or (
        vae_weight_bytes(cfg, vae_cfg) if family.name == "wan" else 0)

    compiled: dict = {}
    rows = []
    for label, st in rungs(cfg, text_offload, text_quantize):
        key = (st["offload"], st["quantize"])
        if key not in compiled:
            say(f"compiling the denoise step: model.offload={key[0]} model.quantize={key[1]}"
                + (f" ({small.model.num_layers} of {full} layers)" if small is not cfg else ""))
            compiled[key] = denoise(with_model(small, offload=key[0], quantize=key[1]), mesh,
                                    chip, latent=latent, batch=batch,
                                    full_layers=full if small is not cfg else None)
        d = compiled[key]
        tw = text_weights(st["text_quantize"])
        kept_text = tw if st["text_offload"] == "none" else 0
        dev_params = d["device_param_bytes"]
        if "error" in d:
            den = {"fits": False, "error": d["error"]}
        else:
            den_b = d["device_peak_bytes"] + (experts - 1) * dev_params + kept_text + vae_w
            den = {"bytes": den_b}
        row = {"changes": label, **st, "denoise": {**den, "step": d}}
        if encoders is not None:
            tb = tw + text_act + experts * dev_params + vae_w
            row["text"] = {"bytes": tb, "encoder_weight_bytes": tw,
                           "activation_bytes": text_act}
        if dec is not None and "error" in dec:
            row["decode"] = {"fits": False, "error": dec["error"]}
        elif dec is not None:
            row["decode"] = {"bytes": dec["device_peak_bytes"] + experts * dev_params + kept_text}
        rows.append(row)
        if _fits_all(_judge_row(row, hbm)) and not every_rung:
            break

    if every_rung and cfg.model.offload != "none" and not any(
            k[0] == "none" for k in compiled):        # the step without offload, to compare
        say("compiling the denoise step without model.offload, to compare")
        rows[0]["denoise"]["without_offload"] = denoise(
            with_model(small, offload="none"), mesh, chip, latent=latent, batch=batch,
            full_layers=full if small is not cfg else None)
    out = {"chip": chip.name, "chip_key": chip_key, "batch": batch, "experts": experts,
           "layers": full, "compiled_layers": small.model.num_layers,
           "host_link_bytes_per_s": HOST_LINK_BYTES_PER_S,
           "measured": "denoise: compiled forward (peak, arguments, host->device copies); "
                       "decode: " + ("compiled VAE later-frame program" if dec else
                                     f"NOT measured ({missing.get('decode')})"),
           "analytic": ("text encoders " + ", ".join(n for n, _ in encoders) + " (weights "
                        "from their published sizes, activations from the prompt length)"
                        if encoders else f"text: NOT measured ({missing.get('text')})")
                       + "; host link 32 GB/s ASSUMED; compute_s = FLOPs / peak"
                       + ("" if small is cfg else f"; layers {small.model.num_layers} -> "
                          f"{full} scaled"),
           "text_encoders": [n for n, _ in encoders] if encoders else None,
           "decode": dec, "not_measured": missing, "rungs": rows}
    return judge(out, hbm)


PHASES = ("text", "denoise", "decode")


def _judge_row(row: dict, hbm: float) -> dict:
    for k in PHASES:
        if k in row and "bytes" in row[k]:
            row[k]["fits"] = row[k]["bytes"] <= hbm
    return row


def _fits_all(row: dict) -> bool:
    return all(row[k]["fits"] for k in PHASES if k in row)


def judge(out: dict, hbm: float) -> dict:
    """``out`` (:func:`fit`'s report) judged against ``hbm`` bytes a chip: each phase's
    ``fits`` and the :func:`verdict`; in place, returned. The bytes do not depend on the
    capacity, so one report can be judged against several."""
    out["hbm_bytes"] = int(hbm)
    for row in out["rungs"]:
        _judge_row(row, hbm)
    out["verdict"] = verdict(out["rungs"], out["decode"], hbm, out["chip_key"],
                             out.get("not_measured"))
    return out


def _chips():
    from ditax.plan.targets import CHIPS

    return CHIPS


def verdict(rows: list[dict], dec, hbm: float, chip_key: str,
            missing: dict | None = None) -> dict:
    """Per phase: whether it fits as configured and the first rung at which it does (its
    changes), else what to try past the ladder; and the first rung where all phases fit.
    A phase not measured (``missing``: phase → why) is not known, and so is ``all`` while
    one is: never "fits" for what was not measured."""
    out = {}
    unknown = {p: (missing or {}).get(p) or "not measured" for p in PHASES
               if not any(p in r for r in rows)}
    for phase in PHASES:
        have = [r for r in rows if phase in r]
        if not have:
            out[phase] = {"fits": None, "suggestion": f"not known: {unknown[phase]}"}
            continue
        first = next((r for r in have if r[phase]["fits"]), None)
        v = {"fits": have[0][phase]["fits"] if have[0] is rows[0] else None,
             "bytes": have[0][phase].get("bytes")}
        if first is rows[0]:
            v["suggestion"] = "fits as configured"
        elif first is not None:
            v["suggestion"] = first["changes"]
        elif phase == "decode":
            frac = (dec or {}).get("temp_bytes", 0)
            room = hbm - (have[-1][phase].get("bytes", frac) - frac)
            n = math.ceil(frac / room) if room > 0 else None
            v["suggestion"] = ("tiled decode (sample.vae_tiling=true; a Wan pipeline with it "
                               "unset tiles by itself where its estimate is over the budget) "
                               "or the row-split parallel decode (sample.vae_parallel=true)"
                               + (f" over about {n} chips: {more_chips(chip_key, n * hbm, hbm)}"
                                  if n else ", with the transformer's weights off the device"))
        else:
            need = have[0][phase].get("bytes") or rows[0]["denoise"]["step"].get(
                "device_param_bytes", 0)
            v["suggestion"] = (f"more chips: {more_chips(chip_key, need, hbm)} (rough: the "
                               f"bytes as configured over the chip's HBM; plan it with --target)")
        out[phase] = v
    first_all = next((r for r in rows if _fits_all(r)), None)
    said = ("fits as configured" if first_all is rows[0] else first_all["changes"]
            if first_all else "; ".join(f"{k}: {out[k]['suggestion']}" for k in PHASES
                                        if out[k]["fits"] is False))
    if unknown:
        what = ", ".join(f"{k} ({why})" for k, why in unknown.items())
        known = ("fit as configured" if first_all is rows[0] else
                 f"fit with {first_all['changes']}" if first_all else f"do not: {said}")
        said = f"not known: {what} not measured; the measured phases {known}"
    out["all"] = {"fits": None if unknown and first_all is not None else first_all is rows[0],
                  "suggestion": said}
    return out


__all__ = ["LADDER", "PHASES", "chip_key_of", "fit", "judge", "more_chips", "rungs",
           "suggestion", "verdict"]
