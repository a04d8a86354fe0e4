"""FLUX.1 pipelines (``FluxPipeline`` folders): importing this package registers them for the
``flux`` family (:func:`ditax.pipelines.family.register_pipelines`)."""

from ditax.pipelines.family import register_pipelines

register_pipelines("flux", "ditax.pipelines.flux.family:FluxPipelines")
