"""LTX-2's text path after the Gemma-3 encoder: the text connectors (diffusers
``LTX2TextConnectors``: :mod:`.connectors`, :mod:`.config`, :mod:`.convert`) and the prompt
encoding the pipelines run (:mod:`.encoder`).

Nothing is imported here.
"""
