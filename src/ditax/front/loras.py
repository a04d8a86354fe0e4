"""A request's LoRAs, read once at the front door: the ``lora`` files (``FILE[:STRENGTH]``)
read and checked by the family's LoRA names, the sampling settings the files carry
(:mod:`ditax.pipelines.lora_sample`), and those settings laid over the family's load and call
options where the user chose none."""

from __future__ import annotations


def read_loras(specs, strict: bool = True, family: str | None = None) -> list:
    """``FILE[:STRENGTH]`` values → ``[(Lora, strength)]``, each file read and its format
    checked here (a bad file is a :class:`~ditax.errors.WeightError`: exit 2; with
    ``strict=False`` unknown keys are skipped with a warning). Files are named by ``family``'s
    LoRA names (its spec's ``lora_names``; None: the default family's); a family without
    the capability ``lora`` is refused in one line."""
    from ditax.lora import parse_lora_arg, resolve_loras
    from ditax.models import registry

    specs = list(specs or ())
    name = family or registry.DEFAULT_FAMILY
    if specs:       # a family that reads no LoRA files: one line, before any file is read
        registry.require(name, "lora", f"--lora {specs[0]}", "drop --lora")
    return resolve_loras([parse_lora_arg(s) for s in specs], strict,
                         names=registry.spec(name).lora_names_object())


def read_lora_sample(given, pipelines, loras: list, say=print):
    """The sampling settings the ``lora`` files (``loras``: read by :func:`read_loras`) and
    the ``lora_2`` files (their headers) carry (:func:`ditax.pipelines.lora_sample.
    read_lora_sample`), announced in one line through ``say`` when read; ``given["lora_sample"]``
    (settings read for an earlier request of the same run) is taken as it is."""
    from ditax.lora import parse_lora_arg
    from ditax.pipelines.lora_sample import read_lora_sample as read

    if given.get("lora_sample") is not None:
        return given["lora_sample"]
    found = read(pipelines, loras, [parse_lora_arg(a) for a in given.get("lora_2") or []])
    if found is not None:
        say(found.line("flags override"))
    return found


def lora_options(lora_sample, call: dict, load: dict, chosen: set, steps: int) -> None:
    """The family's own call and load arguments (``call``, ``load``: of
    :meth:`~ditax.pipelines.family.PipelineFamily.sample_options`) with the LoRA's sampler and
    shift where the user chose none (``chosen``: the ``sample`` keys set) and its sigmas where
    the call takes sigmas, the user gave none and the request has their ``steps`` on Euler."""
    from ditax.pipelines.lora_sample import LOAD_KEYS, default_sigmas

    values = lora_sample.values
    for key in LOAD_KEYS:
        if key in values and key not in chosen:
            load[key] = values[key]
    euler = load.get("scheduler") in (None, "euler")
    if "sigmas" in call and call["sigmas"] is None and "sigmas" not in chosen and euler:
        call["sigmas"] = default_sigmas(values, steps)


__all__ = ["lora_options", "read_lora_sample", "read_loras"]
