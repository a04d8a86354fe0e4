"""Step caching (first_block, TeaCache, MagCache, CFG reuse), written against the denoiser
protocol of :mod:`ditax.models.base` (``embed`` / ``run_blocks`` / ``head``, the context's
``seq`` / ``mod`` / ``temb``): any family whose denoiser speaks it gets step caching from the
generic sampling loop (:mod:`ditax.pipelines.sampling`). :mod:`.step_cache` describes the
methods; :mod:`.policy`, :mod:`.carry`, :mod:`.cached_step`, :mod:`.numbers` and
:mod:`.calibrate` hold their parts."""
