"""Wan's pipelines: its folders (t2v / i2v / ti2v), components, request checks and defaults, and
the text-to-video / image-to-video pipelines built on the generic sampling loop.

The family's one declaration (:mod:`ditax.models.wan`) names them
(``pipelines="ditax.pipelines.wan.family:WanPipelines"``); this package registers nothing.
"""
