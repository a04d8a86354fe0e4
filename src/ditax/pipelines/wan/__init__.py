"""Wan's pipelines: its folders (t2v / i2v / ti2v), components, request checks and defaults, and
the text-to-video / image-to-video pipelines built on the generic sampling loop."""
