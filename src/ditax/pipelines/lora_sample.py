"""The sampling settings a LoRA file carries: ``ditax_sample`` in its safetensors metadata.

A few-step student (``ditax train`` with a ``distill`` section) is only right when sampled the
way it was trained: Euler on its own unshifted sigmas with its shift, no classifier-free
guidance. :func:`ditax.lora.export.save_lora` writes those settings into the LoRA file as JSON
under ``ditax_sample`` (keys named as the pipeline's arguments), e.g. a Wan student's::

    {"num_inference_steps": 4, "guidance_scale": 1.0, "scheduler": "euler",
     "flow_shift": 5.0, "sigmas": [1.0, 0.75, 0.5, 0.25]}

Loading such a LoRA (``ditax.load_pipeline(folder, loras=[...])``, ``ditax generate --lora``,
``--lora-2``) makes them the pipeline's defaults, like a folder's ``ditax_sample.json``
(:mod:`ditax.pipelines.sample_defaults`) but over it: the loader's settings (``scheduler``,
``flow_shift``) where the caller passed none, the call's (``num_inference_steps``,
``guidance_scale``, ``true_cfg_scale``, ``sigmas``) as ``pipe.sample_defaults``. Whatever the
caller gives wins; ``sigmas`` go with their step count, so an explicit other step count samples
evenly spaced sigmas (with the LoRA's sampler and shift unless those are given too).

Which keys a family's LoRAs may carry is its declaration
(:attr:`~ditax.pipelines.family.PipelineFamily.lora_sample_keys`); each value is checked by the
rules of a folder's file (:data:`~ditax.pipelines.sample_defaults.RULES`,
``SAMPLER_RULES``), ``sigmas`` against the steps and the sampler. A bad value, or two LoRAs that
carry different settings, is one :class:`~ditax.errors.PipelineLoadError` line naming the
file(s) and the key, before any weights. A LoRA loaded at strength 0 (a server's LoRAs at
load, before a request names them) carries none.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from ditax.errors import PipelineLoadError
from ditax.lora.export import META_KEY
from ditax.pipelines.sample_defaults import RULES, SAMPLER_RULES, check_sample_defaults
# every key a family may declare (its lora_sample_keys pick among them)
KEYS = ("num_inference_steps", "guidance_scale", "true_cfg_scale", "scheduler", "flow_shift",
        "sigmas")
# the loader's arguments among the keys; the others are the call's
LOAD_KEYS = ("scheduler", "flow_shift")


def check_sample_settings(values, source, rules: dict | None = None) -> dict:
    """``values`` checked key by key (``rules``: a family's
    :meth:`~ditax.pipelines.family.PipelineFamily.lora_sample_rules`; None: those of
    :data:`KEYS`, every key a family may declare), then together: ``sigmas`` need ``num_inference_steps`` of their
    count, each in (0, 1] below the one before, and the Euler sampler where the family has a
    choice of sampler. Returns the checked values; :class:`PipelineLoadError` naming
    ``source`` and the key."""
    from ditax.schedulers.flow_match import check_sigmas

    every = {**RULES, **SAMPLER_RULES}
    given_rules, rules = rules, {k: every[k] for k in KEYS} if rules is None else rules
    if not rules and isinstance(values, dict) and values:
        raise PipelineLoadError(f"{source}: these pipelines take no sampling settings from a "
                                f"LoRA; re-save it without {META_KEY}")
    out = check_sample_defaults(values, source, rules)
    if "sigmas" in out:
        if "num_inference_steps" not in out:
            raise PipelineLoadError(f"{source}: sigmas={json.dumps(out['sigmas'])} need "
                                    f"num_inference_steps (one sigma per step); add "
                                    f"\"num_inference_steps\": {len(out['sigmas'])}")
        try:
            check_sigmas(out["sigmas"], out["num_inference_steps"])
        except ValueError as e:
            raise PipelineLoadError(f"{source}: {e}") from None
        # a family with a choice of sampler (a "scheduler" key) must name Euler; one without
        # (FLUX.1) runs Euler anyway
        sampler = out.get("scheduler")
        if sampler not in (None, "euler") or (sampler is None and given_rules is not None
                                              and "scheduler" in rules):
            raise PipelineLoadError(f"{source}: sigmas are the Euler sampler's, but scheduler="
                                    f"{json.dumps(out.get('scheduler'))}; set \"scheduler\": "
                                    f"\"euler\"")
    return out


@dataclass(frozen=True)
class LoraSample:
    """The checked settings ``values`` of the LoRA file(s) named ``source``."""

    values: dict
    source: str

    def line(self, override: str = "explicit arguments override") -> str:
        """The one line that says these settings are used, e.g. ``student.safetensors carries
        its sampling settings: 4 steps, euler, shift 5, sigmas 1,0.75,0.5,0.25, guidance 1
        (flags override)``."""
        v = self.values
        parts = []
        if "num_inference_steps" in v:
            parts.append(f"{v['num_inference_steps']} steps")
        if "scheduler" in v:
            parts.append(v["scheduler"])
        if "flow_shift" in v:
            parts.append(f"shift {v['flow_shift']:g}")
        if "sigmas" in v:
            parts.append("sigmas " + ",".join(f"{s:g}" for s in v["sigmas"]))
        if "guidance_scale" in v:
            parts.append(f"guidance {v['guidance_scale']:g}")
        if "true_cfg_scale" in v:
            parts.append(f"true CFG {v['true_cfg_scale']:g}")
        verb = "carries its" if "," not in self.source else "carry their"
        return f"{self.source} {verb} sampling settings: {', '.join(parts)} ({override})"

    def load_args(self, **given) -> dict:
        """The loader's arguments ``given`` (``scheduler=``, ``flow_shift=``) with each left at
        None taken from these settings."""
        return {k: self.values.get(k) if v is None else v for k, v in given.items()}

    def call_defaults(self, euler: bool = True) -> dict:
        """The call's defaults among these settings (``sigmas`` only where the pipeline runs
        the Euler sampler, ``euler``)."""
        return {k: v for k, v in self.values.items()
                if k not in LOAD_KEYS and (euler or k != "sigmas")}


def default_sigmas(defaults: dict, num_inference_steps: int):
    """The default ``sigmas`` (``defaults``: a pipeline's ``sample_defaults``) for a call of
    ``num_inference_steps`` steps: a LoRA's, when it has as many; else None (evenly spaced)."""
    sigmas = defaults.get("sigmas")
    return list(sigmas) if sigmas is not None and len(sigmas) == num_inference_steps else None


def _metadata(item) -> tuple[str, dict]:
    """``(name, safetensors metadata)`` of a LoRA spec's file or parsed
    :class:`~ditax.lora.Lora` (a file's header only: no tensor is read). A file that cannot
    be read has none here: the LoRA loader refuses it, naming it, as the LoRAs load."""
    from ditax.errors import WeightError
    from ditax.io.weights import Weights
    from ditax.lora import Lora

    if isinstance(item, Lora):
        return item.source, dict(item.metadata)
    try:
        return str(item), Weights.open(item).metadata()
    except WeightError:
        return str(item), {}


def _strength(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None       # refused by ditax.lora.resolve_loras as the LoRAs load


def read_lora_sample(pipelines, *lora_lists) -> LoraSample | None:
    """The sampling settings the LoRAs of ``lora_lists`` carry (each a ``loras=`` list of
    paths, :class:`~ditax.lora.Lora` objects or ``(either, strength)``) for ``pipelines``
    (a :class:`~ditax.pipelines.family.PipelineFamily`), checked by its rules; None when none
    carries any. LoRAs at strength 0 are skipped; two with different settings are refused."""
    found: list[tuple[str, dict]] = []
    for specs in lora_lists:
        for spec in specs or ():
            item, strength = spec if isinstance(spec, tuple) else (spec, 1.0)
            if _strength(strength) == 0.0:
                continue
            source, meta = _metadata(item)
            raw = meta.get(META_KEY)
            if raw is None:
                continue
            where = f"{source} metadata {META_KEY}"
            try:
                values = json.loads(raw)
            except json.JSONDecodeError as e:
                raise PipelineLoadError(f"{where}: not valid JSON ({e.msg} at column "
                                        f"{e.colno}); re-save the LoRA with "
                                        f"save_lora(sample=...)") from None
            rules = pipelines.lora_sample_rules()
            other = [k for k in values if k in KEYS and k not in rules] if isinstance(
                values, dict) else []
            if other:
                raise PipelineLoadError(f"{where}: {other[0]} is not a setting of "
                                        f"{pipelines.name} pipelines (they take "
                                        f"{', '.join(rules) or 'none'}); is it a LoRA for "
                                        f"another model?")
            found.append((source, check_sample_settings(values, where, rules)))
    if not found:
        return None
    first, values = found[0]
    names = [first]
    for source, other in found[1:]:
        if other != values:
            diff = ", ".join(f"{k} {json.dumps(values.get(k))} vs {json.dumps(other.get(k))}"
                             for k in dict.fromkeys([*values, *other])
                             if values.get(k) != other.get(k))
            raise PipelineLoadError(
                f"the LoRAs {first} and {source} carry different sampling settings ({diff}); "
                f"load LoRAs trained for one schedule, or re-save one without {META_KEY}")
        names.append(source)
    shown = ", ".join(dict.fromkeys(pathlib.Path(n).name for n in names))
    return LoraSample(values, shown)


__all__ = ["save_student_lora", "KEYS", "LOAD_KEYS", "LoraSample", "META_KEY", "check_sample_settings", "default_sigmas",
           "read_lora_sample"]


def save_student_lora(folder, params: dict, table, rank: int, alpha: float, *, names,
                      sample: dict) -> list[pathlib.Path]:
    """:func:`ditax.lora.export.save_lora` of adapters trained for the sampling settings
    ``sample``, checked first (nothing is written when a value is bad)."""
    from ditax.lora.export import save_lora

    sample = check_sample_settings(sample, "save_lora(sample=...)")
    return save_lora(folder, params, table, rank, alpha, names=names, sample=sample)

