"""The building floor every model family stands on: :mod:`.loader`, the one transformer loader
(a family gives it data — its architectures' config classes, weight tables, parameter axes,
builders and wrapper classes — and it reads, checks, shards, quantizes and LoRA-merges once).

The shared config fields and rules are in :mod:`ditax.models.fields`, the module head in
:mod:`ditax.models.dit`, shardings and the loaded-transformer pytree in
:mod:`ditax.models.loaded`. Nothing is imported here, so reading a family's config stays light.
"""
