"""``ditax generate --prompts FILE``: many requests on one loaded pipeline, one output each.

The file holds one request a line: a plain line is a prompt; a line starting with ``{`` is a JSON
object of a request in ``ditax serve``'s field names (``{"prompt": "a cat", "seed": 3,
"num_inference_steps": 20}``; ``size`` as ``"WxH"``). Blank lines and lines starting with ``#``
are skipped. The command's flags give every request's defaults. Every request is checked — and
every output path — before the model loads, each error naming its line; then the pipeline loads
once and the requests run in order — consecutive requests of one program shape (size, steps,
guidance…) as one batch of up to ``--batch`` rows through the generic loop
(:func:`ditax.pipelines.batch.sample_batch`: each row equals its request alone within float
rounding) — request ``i`` written to ``--output`` with ``_i`` before the suffix (``out.mp4`` →
``out_0.mp4``, ``out_1.mp4``…; zero-padded to the count).
"""

from __future__ import annotations

import json
import pathlib

from ditax.errors import RequestError, request_errors
from ditax.io.files import read_text


def read_prompts(path) -> list[tuple[int, dict]]:
    """``[(line number, request)]`` of the file (module docstring); a request is a dict of
    JSON field names (a plain line: ``{"prompt": line}``)."""
    text = read_text(path, what="--prompts file", fix="one prompt a line", error=RequestError)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("{"):
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise RequestError(f"--prompts {path} line {n}: not a JSON object ({e.msg} at "
                                   f"column {e.colno}); write one request a line, e.g. "
                                   f'{{"prompt": "a cat", "seed": 1}}') from None
            if not isinstance(item, dict):
                raise RequestError(f"--prompts {path} line {n}: a JSON line must be an object "
                                   f"with a \"prompt\"")
            out.append((n, item))
        else:
            out.append((n, {"prompt": line}))
    if not out:
        raise RequestError(f"--prompts {path} has no prompt (one a line; # starts a comment)")
    return out


def request_given(given: dict, item: dict, pipelines, where: str) -> dict:
    """The command's mapping ``given`` with the request ``item`` (JSON field names) over it."""
    from ditax.pipelines.request import all_fields, fields_of, not_taken
    from ditax.serve.requests import parse_size

    by_json = {f.api: f for f in fields_of(pipelines) if f.api}
    one = dict(given)
    for key, value in item.items():
        if key == "size":
            try:
                one["height"], one["width"] = parse_size(value)
            except RequestError as e:
                raise RequestError(f"{where}: {e}") from None
        elif key in by_json:
            one[by_json[key].name] = value
        elif any(f.api == key for f, _ in all_fields().values()):
            raise RequestError(f"{where}: {not_taken(pipelines, key, 'api', key)}")
        else:
            raise RequestError(f"{where}: unknown field {key!r}; a {pipelines.name} request's "
                               f"fields are {', '.join(['size', *by_json])}")
    return one


def output_of(output: str, i: int, n: int) -> str:
    """Output ``i`` of ``n``: ``output`` with ``_i`` (zero-padded) before the suffix."""
    p = pathlib.Path(output)
    return str(p.with_name(f"{p.stem}_{i:0{len(str(n - 1))}d}{p.suffix}"))


def run_many(args, given: dict, items: list[tuple[int, dict]]) -> int:
    """Check every request of ``items`` (``[(line, request)]``: each over the command's mapping
    ``given``, by the front door, :func:`ditax.front.resolve`, its values named as the server
    names them), then run them on one loaded pipeline, writing each as it finishes."""
    from ditax.cli.generate_output import write_output
    from ditax.compile_cache import compile_cache
    from ditax.front import open as open_pipeline
    from ditax.front import resolve
    from ditax.front.folder import folder_request
    from ditax.front.resolver import SUFFIX
    from ditax.pipelines.batch import sample_batch

    pipelines = folder_request(args.model, args.overrides).pipelines
    base = given.get("output")
    base = "out" + SUFFIX.get(pipelines.makes, ".mp4") if base is None else base
    runs = []
    for i, (line, item) in enumerate(items):
        where = f"--prompts {args.prompts} line {line}"
        one = request_given(given, item, pipelines, where)
        one["output"] = output_of(base, i, len(items))
        if one.get("frames_dir") is not None:
            one["frames_dir"] = output_of(one["frames_dir"], i, len(items))
        if runs:       # the LoRA files were read once, for the first request, and their settings
            one.update(lora=[], lora_2=[], lora_sample=runs[0].lora_sample)
        try:
            runs.append(resolve(args.model, args.overrides, one, "api"))
        except RequestError as e:
            raise RequestError(f"{where}: {e}") from None
    first = runs[0]
    with open_pipeline(first.load, first.call, progress=not args.no_progress) as pipe:
        for group in batches(pipe, runs, args.batch):
            calls = [r.kwargs() for r in group]
            with request_errors():
                if len(group) == 1:
                    outs = [pipe(progress=not args.no_progress, **calls[0])]
                else:
                    with compile_cache(pipe.compile_cache):
                        outs = sample_batch(pipe, calls, progress=not args.no_progress)
                    print(f"ran {len(group)} requests as one batch")
            for r, out in zip(group, outs):
                write_output(r.output, out, pipe, first.makes,
                             whole="--prompts writes each video after its decode")
    print(f"wrote {len(runs)} outputs ({runs[0].output.path} .. {runs[-1].output.path})")
    return 0


def batches(pipe, runs: list, size: int) -> list[list]:
    """``runs`` in order, consecutive requests of one program shape (their batch key:
    :func:`ditax.pipelines.batch.batch_key`) grouped up to ``size`` a batch, for a pipeline
    that batches; one a group otherwise (and for a step-cached request)."""
    from ditax.pipelines.batch import batch_key, batchable

    if not batchable(pipe) or size <= 1:
        return [[r] for r in runs]
    groups, last = [], None
    for run in runs:
        key = batch_key(run.kwargs())
        if key is not None and key == last and len(groups[-1]) < size:
            groups[-1].append(run)
        else:
            groups.append([run])
        last = key
    return groups


__all__ = ["output_of", "read_prompts", "request_given", "run_many"]
