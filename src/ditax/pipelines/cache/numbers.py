"""Per-model numbers of the step caches (TeaCache's polynomial, MagCache's magnitude ratios).

TeaCache and MagCache decide from numbers measured on the model itself; without them they
cannot run (:mod:`.step_cache` refuses, naming the fix). The numbers live in JSON files of one
form (``"format": "ditax-step-cache-numbers/1"``)::

    {"format": "ditax-step-cache-numbers/1",
     "models": [{
        "name": "wan2.1-t2v-1.3b", "source": "where the numbers come from",
        "match": {"inner_dim": 1536, "num_layers": 30, ...},   # transformer config fields
        "experts": 1,                                          # 2: Wan 2.2 two-expert folders
        "teacache": {"input": "modulation" | "time_embedding",
                     "coefficients": [c4, c3, c2, c1, c0],      # highest power first
                     "retention_ratio": 0.1, "compute_last": false},
        "magcache": {"ratios": [[cond per step...], [uncond per step...]],
                     "retention_ratio": 0.2, "max_skip_steps": 2}}]}

A pipeline takes the first entry whose ``match`` fields all equal its transformer config's and
whose ``experts`` equals its number of experts. The shipped file (``step_cache_numbers.json``
beside this module) holds the published Wan 2.1 T2V 1.3B / 14B numbers; ``ditax
calibrate-cache`` writes a file of the same form for any model (one entry), which is given to
the pipeline with ``cache_coefficients=PATH`` (config key ``sample.cache_coefficients``) or
put into the shipped file to make it the default for that model (``ditax calibrate-cache ...
--into src/ditax/pipelines/cache/step_cache_numbers.json``, :func:`merge_numbers`): adding a
model is one entry.
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass

import numpy as np

from ditax.errors import ConfigError

FORMAT = "ditax-step-cache-numbers/1"
SHIPPED = pathlib.Path(__file__).with_name("step_cache_numbers.json")
TEACACHE_INPUTS = ("modulation", "time_embedding")


@dataclass(frozen=True)
class TeaCacheNumbers:
    input: str                      # which timestep-modulated input is compared between steps
    coefficients: tuple[float, ...]  # rescaling polynomial, highest power first (np.polyval)
    retention_ratio: float          # the first round(N * ratio) steps are always computed
    compute_last: bool              # the last step is always computed


@dataclass(frozen=True)
class MagCacheNumbers:
    ratios: tuple[tuple[float, ...], tuple[float, ...]]   # per step, (cond, uncond)
    retention_ratio: float
    max_skip_steps: int              # K: at most K steps in a row reuse the residual

    def per_step(self, num_steps: int) -> np.ndarray:
        """``[num_steps, 2]`` float32: the ratios resampled to ``num_steps`` (nearest, the
        published method's rule when the step count differs from the calibration's)."""
        out = []
        for r in self.ratios:
            r = np.asarray(r, np.float64)
            if num_steps == 1:
                out.append(r[-1:])
                continue
            idx = np.round(np.arange(num_steps) * (len(r) - 1) / (num_steps - 1)).astype(int)
            out.append(r[idx])
        return np.stack(out, axis=1).astype(np.float32)


@dataclass(frozen=True)
class ModelNumbers:
    name: str
    source: str
    teacache: TeaCacheNumbers | None
    magcache: MagCacheNumbers | None


def _fail(where: str, what: str) -> ConfigError:
    return ConfigError(f"step-cache numbers {where}: {what}")


def _number_list(where, value, name, length=None) -> tuple[float, ...]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in value)):
        raise _fail(where, f"{name} must be a non-empty list of finite numbers")
    if length is not None and len(value) != length:
        raise _fail(where, f"{name} has {len(value)} numbers; expected {length}")
    return tuple(float(v) for v in value)


def _ratio(where, block, key, default):
    v = block.get(key, default)
    if not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise _fail(where, f"{key}={v!r} must be a number in [0, 1)")
    return float(v)


def parse_entry(entry: dict, where: str) -> ModelNumbers:
    """One ``models`` entry → :class:`ModelNumbers` (:class:`ConfigError` naming the field)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("match"), dict):
        raise _fail(where, "each model entry needs a 'match' object of transformer config fields")
    tea = mag = None
    if "teacache" in entry:
        t = entry["teacache"]
        if t.get("input") not in TEACACHE_INPUTS:
            raise _fail(where, f"teacache.input={t.get('input')!r} is not one of "
                               f"{', '.join(TEACACHE_INPUTS)}")
        tea = TeaCacheNumbers(t["input"], _number_list(where, t.get("coefficients"),
                                                       "teacache.coefficients"),
                              _ratio(where, t, "retention_ratio", 0.1),
                              bool(t.get("compute_last", False)))
    if "magcache" in entry:
        m = entry["magcache"]
        r = m.get("ratios")
        if not isinstance(r, list) or len(r) != 2:
            raise _fail(where, "magcache.ratios must be [[cond per step], [uncond per step]]")
        cond = _number_list(where, r[0], "magcache.ratios[0]")
        uncond = _number_list(where, r[1], "magcache.ratios[1]", len(cond))
        k = m.get("max_skip_steps", 2)
        if not isinstance(k, int) or k < 1:
            raise _fail(where, f"magcache.max_skip_steps={k!r} must be an integer >= 1")
        mag = MagCacheNumbers((cond, uncond), _ratio(where, m, "retention_ratio", 0.2), k)
    return ModelNumbers(str(entry.get("name", "unnamed")), str(entry.get("source", "")), tea, mag)


def read_numbers(path) -> list[dict]:
    """The ``models`` entries of a numbers file (checked for its format)."""
    path = pathlib.Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"cache_coefficients={str(path)!r} is not a file; give the JSON that "
                          f"`ditax calibrate-cache` wrote")
    from ditax.io.files import read_json     # bad UTF-8 / JSON: the file, line and column

    doc = read_json(path, what="step-cache numbers file", error=ConfigError,
                    fix="give the JSON that `ditax calibrate-cache` wrote")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"cache_coefficients={str(path)!r} is not a step-cache numbers file "
                          f"(its 'format' must be {FORMAT!r})")
    models = doc.get("models")
    if not isinstance(models, list):
        raise _fail(str(path), "'models' must be a list")
    for i, entry in enumerate(models):
        parse_entry(entry, f"{path} models[{i}]")
    return models


def _matches(entry: dict, config, experts: int) -> bool:
    return entry.get("experts", 1) == experts and all(
        getattr(config, k, object()) == (tuple(v) if isinstance(v, list) else v)
        for k, v in entry["match"].items())


def find_numbers(config, experts: int, path=None) -> ModelNumbers | None:
    """The numbers for a transformer ``config`` in a pipeline of ``experts`` experts: from
    ``path`` (its first matching entry, or its only entry when it holds one) or else from the
    shipped file; None when no entry matches."""
    if path is not None:
        models = read_numbers(path)
        hit = [m for m in models if _matches(m, config, experts)]
        if not hit:
            names = ", ".join(str(m.get("name")) for m in models)
            raise ConfigError(f"cache_coefficients={str(path)!r} has no entry for this model "
                              f"({describe(config)}, {experts} expert(s)); its entries: {names}. "
                              f"Calibrate this model with `ditax calibrate-cache`")
        return parse_entry(hit[0], str(path))
    for i, entry in enumerate(read_numbers(SHIPPED)):
        if _matches(entry, config, experts):
            return parse_entry(entry, f"{SHIPPED} models[{i}]")
    return None


# the config fields an entry matches on, those a family's config has (Wan's; LTX-2's audio
# stream's, which no other family's config has, so an entry of one never matches the other)
MATCH_FIELDS = ("inner_dim", "num_layers", "num_attention_heads", "ffn_dim", "in_channels",
                "out_channels", "text_dim", "image_dim", "audio_inner_dim",
                "audio_num_attention_heads", "audio_in_channels")


def describe(config) -> str:
    """The config fields an entry matches on, as ``k=v`` text."""
    return " ".join(f"{k}={v}" for k, v in match_of(config).items())


def match_of(config) -> dict:
    """The ``match`` object that identifies ``config`` (what calibration writes): the
    :data:`MATCH_FIELDS` it has."""
    missing = object()
    return {k: v for k in MATCH_FIELDS
            if (v := getattr(config, k, missing)) is not missing}


def write_numbers(path, entry: dict) -> pathlib.Path:
    """Write one entry as a numbers file (checked by parsing it back)."""
    parse_entry(entry, str(path))
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, "models": [entry]}, indent=1) + "\n")
    return path


def _format(value, depth: int = 0) -> str:
    """JSON as the shipped file is laid out: one key per line, lists of numbers on one line."""
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_format(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return ("[\n" + ",\n".join(inner + _format(v, depth + 1) for v in value) + "\n" + pad
                + "]")
    return json.dumps(value)


def merge_numbers(path, entry: dict) -> pathlib.Path:
    """Put ``entry`` into the numbers file ``path`` (e.g. the shipped one): it replaces the
    entry of the same name, else the one matching the same model (``match`` and ``experts``),
    else it is appended. The file is written back in the shipped layout."""
    parse_entry(entry, str(path))
    path = pathlib.Path(path)
    models = read_numbers(path)
    same = [i for i, m in enumerate(models) if m.get("name") == entry.get("name")] or [
        i for i, m in enumerate(models)
        if m["match"] == entry["match"] and m.get("experts", 1) == entry.get("experts", 1)]
    if same:
        models[same[0]] = entry
    else:
        models.append(entry)
    path.write_text(_format({"format": FORMAT, "models": models}) + "\n")
    return path


__all__ = ["FORMAT", "MagCacheNumbers", "ModelNumbers", "SHIPPED", "TeaCacheNumbers",
           "describe", "find_numbers", "match_of", "merge_numbers", "parse_entry",
           "read_numbers", "write_numbers"]
