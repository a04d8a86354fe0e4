"""Wan's pipelines: its folders (t2v / i2v / ti2v), components, request checks and defaults, and
the text-to-video / image-to-video pipelines built on the generic sampling loop.

Importing this package registers them as the pipelines of family ``wan``
(:mod:`ditax.pipelines.family`), by name, so the import stays light (no JAX).
"""

from ditax.pipelines.family import register_pipelines

register_pipelines("wan", "ditax.pipelines.wan.family:WanPipelines")
