"""``ditax plan --train`` of a DMD2 distillation step (issue 42): a config with
``distill.method=dmd2`` is planned as the step :func:`ditax.train.trainers.make_trainer` builds
(student, critic and teacher), its state told by entry, its FLOPs the step's transformer work.

On a one-layer tiny Wan in bfloat16 over 4 CPU devices (``fsdp=4``; bf16 weights: what a
14B student is distilled in), compiled with most XLA optimisations off (the arguments are the
state and the batch either way): a LoRA student holds one base and
two small adapter sets (student and critic, each with Adam's two moments); a full-weight
student holds three weight sets (student, critic, teacher) and the moments of two. The 14B
numbers are in docs/plan_distill.md."""

import contextlib
import io
import json

import pytest

from ditax.cli import main
from ditax.config import load_config
from ditax.models.base import model_family
from ditax.plan.core import train_step_flops
from ditax.train.data import latent_shape_for

RANK = 4
SMALL = ["tiny", "--target", "cpu:4", "--train", "mesh.fsdp=4", "batch_size=4",
         "model.num_layers=1", "data.text_len=8", "distill.method=dmd2",
         "model.param_dtype=bfloat16", "model.dtype=bfloat16"]


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def plans(fast_compile, tmp_path_factory):
    """``ditax plan ... --json`` of the LoRA (rank 4) and the full-weight distillation step,
    compiled into one cache folder (the text run below reads the LoRA step back from it)."""
    cache = tmp_path_factory.mktemp("distill_cache")
    out = {}
    for rank in (RANK, 0):
        rc, text, err = _cli("plan", *SMALL, f"lora.rank={rank}", f"compile_cache={cache}",
                             "--json")
        assert rc == 0, err
        out[rank] = json.loads(text)
    return out, cache


def test_lora_distill_step_holds_one_base_and_small_adapters(plans):
    res, _ = plans
    lora, full = res[RANK]["train_step"], res[0]["train_step"]
    weights = res[0]["param_bytes_per_device"]            # one copy of the model on a device
    sl, sf = lora["state_bytes_per_device"], full["state_bytes_per_device"]
    # full weights: student, critic and teacher are whole copies; two Adam states of two moments
    assert sf["params"] == sf["fake"] == sf["frozen"] == weights
    for opt in ("opt", "fake_opt"):
        assert 2 * weights <= sf[opt] <= 2 * weights + 64     # + the step counts
    # LoRA: the one frozen base (+ the adapters' fixed scales), two small adapter sets
    adapters = sl["params"]
    assert sl["fake"] == adapters and 0 < adapters < 0.15 * weights
    assert weights <= sl["frozen"] < 1.01 * weights
    assert 2 * adapters <= sl["opt"] == sl["fake_opt"] <= 2 * adapters + 64
    # the compiled step's arguments are that state and the same batch (+ the empty prompt)
    batch = [p["argument_bytes"] - sum(s.values()) for p, s in ((lora, sl), (full, sf))]
    assert batch[0] == batch[1] > 0
    # so LoRA saves the student's and the critic's weights and their moments: 6 copies less
    # the adapters (the "about 2 copies" counts the weights without Adam's moments)
    saved = full["argument_bytes"] - lora["argument_bytes"]
    assert saved > 2 * weights
    assert saved == pytest.approx(6 * (weights - adapters), rel=0.01)
    assert lora["argument_bytes"] < weights + 7 * adapters + batch[0]


def test_distill_step_reports_its_transformer_work(plans):
    """FLOPs: 5 critic updates of (rollout 1.5 + estimate 1 + forward and backward 3) and the
    student's (rollout 1.5 + forward and backward 3 + guided teacher 2 + critic 1) forwards,
    over a training step's 3: 35/3 of the flow-matching step's model FLOPs."""
    res, _ = plans
    cfg = load_config("tiny", SMALL[4:] + [f"lora.rank={RANK}"])
    family = model_family(cfg.model, cfg.attention)
    shape = tuple(latent_shape_for(cfg))
    plain = family.flops_per_sample(shape, cfg.data.text_len) * cfg.batch_size / 4
    for rank in (RANK, 0):
        step = res[rank]["train_step"]
        assert step["distill"] == {"method": "dmd2", "steps": 4, "critic_updates": 5,
                                   "guidance": 5.0, "lora_rank": rank,
                                   "flops_factor": pytest.approx(35 / 3)}
        assert step["model_flops"] == pytest.approx(35 / 3 * plain)
        assert step["xla_flops"] > 3 * plain            # more than one training step compiled


def test_remat_recompute_counts_once_per_backward_pass():
    """``model.remat=full`` runs each forward again in its backward: a flow-matching step once
    (4/3 of its model FLOPs), a DMD2 step once for each critic update and once for the
    student (the rollouts, the teacher and the critic's scoring have no backward)."""
    cfg = load_config("tiny", ["model.remat=full"])
    family = model_family(cfg.model, cfg.attention)
    shape = tuple(latent_shape_for(cfg))
    one = family.flops_per_sample(shape, cfg.data.text_len) * cfg.batch_size
    assert train_step_flops(cfg, family, shape) == pytest.approx(one * 4 / 3)
    d = load_config("tiny", ["model.remat=full", "distill.method=dmd2",
                             "distill.critic_updates=2"])
    assert train_step_flops(d, family, shape, 10.0) == pytest.approx(one * (10 + 3 / 3))


def test_cli_prints_the_distill_rows(plans):
    """The text output of the LoRA step (compiled once above, read back from the cache): the
    step, what it distils and its state by entry."""
    _, cache = plans
    rc, text, err = _cli("plan", *SMALL, f"lora.rank={RANK}", f"compile_cache={cache}")
    assert rc == 0, err
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("train_step latents [4, "))
    assert lines[head + 1] == (f"  distill dmd2: 4-step student (LoRA rank {RANK}), 5 critic "
                               f"updates a step, teacher guidance 5; 11.67x a training step's "
                               f"transformer work")
    state = lines[head + 2]
    assert state.startswith("  state: params ") and ", frozen " in state and "fake_opt" in state
    assert lines[head + 3].startswith("  memory: arguments ")


def test_distill_refusal_is_one_line_before_any_compile():
    """A model that trains part of itself (a VACE branch) cannot be distilled: the trainer's
    refusal names the key and the fix, exit 2, nothing compiled."""
    rc, out, err = _cli("plan", "tiny", "--devices", "1", "--train", "distill.method=dmd2",
                        "model.vace_layers=0", "train.vace_trainable=vace")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert "train.vace_trainable=all" in lines[0] and "distill.method=dmd2" in lines[0]
