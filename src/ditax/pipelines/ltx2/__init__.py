"""LTX-2's pipelines: text-to-video with a sound track (diffusers ``LTX2Pipeline`` folders)."""
