"""What the peer benchmarks (``ltx2_peer.py``, ``flux2_peer.py``) share: ditax's forward compiled
as ``ditax plan --compile`` builds it, the per-chip summary row of a compiled program, and the
stand-in for the Google Cloud Storage client maxdiffusion imports at import time."""

from __future__ import annotations

import json
import os
import sys
import types


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def cost_flops(compiled) -> float:
    """XLA's ``cost_analysis`` FLOPs (0 where it has none)."""
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    return float((ca or {}).get("flops", 0.0))


def summary(compiled, secs, model_flops, layers, chip, hlo_path=None) -> dict:
    """:func:`ditax.plan.measure.measure` of ``compiled`` (its loops left out) plus
    ``args_plus_temp_bytes`` and ``cost_flops``."""
    from ditax.plan.measure import measure

    m = measure(compiled, compile_s=secs, model_flops=model_flops, num_layers=layers, chip=chip,
                hlo_path=hlo_path)
    m.pop("loops", None)
    m["args_plus_temp_bytes"] = m["argument_bytes"] + m["temp_bytes"]
    m["cost_flops"] = cost_flops(compiled)
    return m


def ditax_forward(cfg, mesh, chip, hlo_path=None):
    """ditax's compiled forward, exactly as ``ditax plan --compile`` builds it: (the summary
    row with the latent shape and the parameter count, the model's FLOPs)."""
    import jax
    from flax import nnx

    from ditax.models.base import model_family
    from ditax.plan.core import _forward
    from ditax.plan.measure import compile_timed

    family = model_family(cfg.model, cfg.attention)
    gdef, state = nnx.split(family.abstract(mesh))
    sh = family.param_shardings(state, mesh)
    latent = family.latent_shape(cfg.sample.num_frames, cfg.sample.height, cfg.sample.width)[1:]
    lowered, shape, fl = _forward(cfg, mesh, family, gdef, state, sh, latent)
    compiled, secs = compile_timed(lowered)
    params = sum(int(x.size) for x in jax.tree.leaves(state))
    # as ditax plan: per_layer = one iteration of the (first) scanned stack
    return {"latent": shape, "params": params,
            **summary(compiled, secs, fl, cfg.model.num_layers, chip, hlo_path)}, fl


def stub_gcs() -> None:
    """maxdiffusion's ``max_utils`` imports ``google.cloud.storage`` at import time; where it is
    missing an empty module stands in (nothing here touches GCS)."""
    try:
        import google.cloud.storage  # noqa: F401
        return
    except ImportError:
        pass
    storage = types.ModuleType("google.cloud.storage")
    cloud = sys.modules.get("google.cloud") or types.ModuleType("google.cloud")
    cloud.storage = storage
    sys.modules["google.cloud"], sys.modules["google.cloud.storage"] = cloud, storage
    try:
        import google
        google.cloud = cloud
    except ImportError:
        sys.modules["google"] = types.ModuleType("google")
        sys.modules["google"].cloud = cloud


def md_config(src: str, name: str) -> dict:
    """maxdiffusion's ``configs/<name>`` of the checkout's ``src`` folder."""
    import yaml

    with open(os.path.join(src, "maxdiffusion", "configs", name)) as f:
        return yaml.safe_load(f)
