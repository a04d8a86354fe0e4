"""FLUX.2 pipelines (diffusers ``Flux2Pipeline``: dev, Mistral-3 text; ``Flux2KleinPipeline``:
klein, Qwen3 text, distilled or base). The family's one declaration (:mod:`ditax.models.flux2`)
names them (``pipelines="ditax.pipelines.flux2.family:Flux2Pipelines"``); this package
registers nothing."""
