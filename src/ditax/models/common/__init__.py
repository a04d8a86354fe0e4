"""The building floor every model family stands on (a shared room: it registers no family and
imports none; ``models/encoders/`` and ``models/vae/`` are the other two).

- :mod:`.loader`: the one transformer loader (a family gives it data — its architectures'
  config classes, weight tables, parameter axes, builders and wrapper classes — and it reads,
  checks, shards, quantizes and LoRA-merges once);
- :mod:`.fields`: the numeric config fields and rules every family's config shares;
- :mod:`.dit`: ``DiT``, the head of a family's transformer module;
- :mod:`.loaded`: parameter shardings and the loaded-transformer pytree;
- :mod:`.single_files`: single-file checkpoints' key prefixes and the diffusers-folder writer;
- :mod:`.name_map`: original ↔ diffusers name templates (LoRA and single-file names);
- :mod:`.family`: the family methods that only hand over to the family's modules, from its
  parts named as data (``PartsFamily``);
- :mod:`.components`: a pipeline component's folder and ``config.json`` (VAEs, vocoder …);
- :mod:`.bfl`: what FLUX.1 and FLUX.2 share (config views, blocks, the transformer's frame,
  the family, the BFL name table, single files, the loader).

Nothing is imported here: the family registry's discovery and the reading of a family's config
stay light (no JAX).
"""
