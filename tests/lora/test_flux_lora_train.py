"""LoRA fine-tuning of FLUX.1: ``ditax train`` with ``lora.rank`` on the Flux family (from a tiny
diffusers folder, synthetic data, adapters on every attention and MLP layer) writes PEFT and
kohya files that load back equal to diffusers' reading of them. One compiled train step."""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from flux_lora_reference import CFG, D, TOL, diffusers_run, ours, save  # noqa: E402
from flux_lora_reference import base  # noqa: E402,F401  (the module's fixture)
from wan_reference import rel_err  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_compile")


def test_trained_adapters_export_load_back_and_diffusers_reads_them(tmp_path, base):
    """``ditax train`` with ``lora.rank`` on the Flux family (from the base folder, synthetic
    data, adapters on every attention and MLP layer) writes PEFT and kohya files (fused layers
    assembled: block-diagonal up, alpha scaled with the rank); both load back equal to
    diffusers' reading of the PEFT file, and diffusers' kohya reader reads the kohya file
    (without linear1: its reader fixes FLUX.1-dev's widths) as the same LoRA."""
    from safetensors.numpy import load_file

    from ditax.config import load_config
    from ditax.lora.export import ORIGINAL_FILE, PEFT_FILE
    from ditax.parallel.mesh import make_mesh
    from ditax.train.loop import train

    folder, fresh, inputs, plain = base
    rank, alpha = 2, 4.0
    cfg = load_config("flux-tiny", [
        f"model.in_channels={CFG['in_channels']}", f"model.num_layers={CFG['num_layers']}",
        f"model.num_single_layers={CFG['num_single_layers']}", f"init_from={folder}",
        "data.source=synthetic", "data.height=32", "data.width=32", "batch_size=8", "steps=2",
        f"output_dir={tmp_path / 'run'}", "checkpoint.every=100", f"lora.rank={rank}",
        f"lora.alpha={alpha}", "lora.targets=attn,ffn", "optim.learning_rate=3e-2",
        "optim.warmup_steps=0"])
    one = make_mesh(dict(data=1, fsdp=1, context=1, tensor=1), jax.devices()[:1])
    res = train(cfg, mesh=one, progress=False)
    assert len(res.losses) == 2 and all(np.isfinite(res.losses))
    peft, kohya = tmp_path / "run" / PEFT_FILE, tmp_path / "run" / ORIGINAL_FILE
    want = diffusers_run(fresh, inputs, peft, 1.0)
    assert rel_err(want, plain) > 1e-3          # the adapters really changed the model
    for path in (peft, kohya):
        got = ours(folder, inputs, loras=[path])
        assert rel_err(got, want) <= TOL, (path.name, rel_err(got, want))
    k = load_file(str(kohya))
    assert k["lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight"].shape == (3 * D, 3 * rank)
    assert float(k["lora_unet_double_blocks_0_img_attn_qkv.alpha"]) == 3 * alpha
    assert k["lora_unet_single_blocks_0_linear1.lora_up.weight"].shape == (7 * D, 4 * rank)
    no_single = {n: v for n, v in k.items() if "single_blocks" not in n}
    p = load_file(str(peft))
    no_single_peft = {n: v for n, v in p.items() if "single_transformer_blocks" not in n}
    a = diffusers_run(fresh, inputs, save(tmp_path / "k.safetensors", no_single), 1.0)
    b = diffusers_run(fresh, inputs, save(tmp_path / "p.safetensors", no_single_peft), 1.0)
    assert rel_err(a, b) <= TOL and rel_err(a, plain) > 1e-3
