"""FLUX.1 pipelines (``FluxPipeline`` folders). The family's one declaration
(:mod:`ditax.models.flux`) names them (``pipelines="ditax.pipelines.flux.family:FluxPipelines"``);
this package registers nothing."""
