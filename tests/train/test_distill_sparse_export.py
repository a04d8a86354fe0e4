"""A distilled sparse student end to end: DMD2 (``attention.sparsity=vsa``) from the random
Wan pipeline folder (its dense teacher) for one step, ``ditax export``, and the folder loaded
with VSA is the student: its weights (the trained gates among them) are the checkpoint's, its
prediction the student's, and it carries the student's sampling settings; and a sparse
student's step on a mesh equals one device."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ditax
from ditax.cli import main
from ditax.config import load_config
from ditax.parallel.mesh import make_mesh
from ditax.train.batches import BatchIterator
from ditax.train.distill import DistillTrainer
from ditax.train.loop import train
from latent_datasets import run_cfg, write_dataset
from mesh_steps import assert_same_step

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
VSA = ("attention.sparsity=vsa", "attention.topk=2", "attention.tile=1,2,2")


def test_an_exported_sparse_student_is_the_student(tmp_path):
    from random_pipeline import folder_fields, random_pipeline_folder

    pipe = random_pipeline_folder(tmp_path / "pipe")
    base = load_config("tiny", []).model
    fields = folder_fields(pipe)
    run = tmp_path / "student"
    # latents [C, 1, 8, 8]: a 1 x 4 x 4 token grid, 4 tiles of 1 x 2 x 2, 2 picked
    cfg = load_config("tiny", [*fields, f"init_from={pipe}", "data.num_frames=1",
                               "data.height=64", "data.width=64", "data.text_len=8", "steps=1",
                               "batch_size=8", "distill.method=dmd2", "distill.critic_updates=1",
                               "distill.guidance=1", "optim.learning_rate=1e-2", *VSA,
                               f"output_dir={run}"])
    result = train(cfg, mesh=make_mesh(ONE, jax.devices()[:1]), progress=False)
    assert np.isfinite(result.losses).all()
    student = jax.tree.map(np.asarray, result.state["params"])
    gate = student["blocks"]["attn1"]["to_gate_compress"]["kernel"]
    assert np.abs(gate).max() > 0                  # trained off its zero init
    assert main(["export", str(run), "--out", str(tmp_path / "folder")]) == 0
    acfg = ditax.AttentionConfig(backend="xla", sparsity="vsa", topk=2, tile=(1, 2, 2))
    loaded = ditax.load_transformer(tmp_path / "folder", attention=acfg)
    got = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(loaded.module, nnx.Param)))
    for (path, a), (_, b) in zip(*(jax.tree_util.tree_flatten_with_path(t)[0]
                                   for t in (got, student))):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    # the folder's prediction is the trainer's student's (VSA), not its dense twin's
    tr = DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    r = np.random.default_rng(0)
    x = r.standard_normal((1, base.in_channels, 1, 8, 8)).astype(np.float32)
    t = np.array([700.0], np.float32)
    text = r.standard_normal((1, 8, loaded.module.cfg.text_dim)).astype(np.float32)
    mask = jnp.ones((1, 8), bool)
    want = tr.family.apply(tr.model(student, student), x, t, text, mask)
    dense = tr.family.apply(tr.score_model(student, student), x, t, text, mask)
    out = loaded.module(x, t, text, mask)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(dense) - np.asarray(want)).max() > 1e-4
    own = json.loads((tmp_path / "folder" / "ditax_sample.json").read_text())
    assert own["num_inference_steps"] == 4 and own["guidance_scale"] == 1.0


def test_a_sparse_students_step_on_fsdp2_tensor4_equals_one_device(tmp_path):
    """One DMD2 step of a VSA student (the scores dense) on fsdp 2 x tensor 4 against one
    device from the same state and batch (Adam ``eps=1`` and a large rate, as in
    ``test_distill.py``'s mesh test: the mesh's arithmetic compared, not Adam's amplification
    of a tiny gradient): loss within 1e-5, the student and the critic within 1e-3 of the
    largest step either took."""
    data_dir = write_dataset(tmp_path / "latents", n=4, null=True)
    cfg = run_cfg(tmp_path / "unused", data_dir, "distill.method=dmd2",
                  "distill.critic_updates=1", "distill.guidance=4", "flow.shift=3",
                  "optim.eps=1.0", "optim.learning_rate=0.1", "batch_size=2", "mesh.fsdp=2",
                  "mesh.tensor=4", *VSA)
    tr = DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    tr8 = DistillTrainer(cfg, make_mesh(cfg.mesh))
    assert dict(tr8.mesh.shape) == {"data": 1, "fsdp": 2, "context": 1, "tensor": 4}
    data = BatchIterator(cfg)
    tr.bind_data(data)
    tr8.bind_data(BatchIterator(cfg))
    batch = next(data)
    state = jax.tree.map(np.asarray, tr.init())
    st8, m8 = tr8.step(jax.device_put(state, tr8.state_sh), tr8.put_batch(batch))
    st, m = tr.step(jax.device_put(state, tr.state_sh), tr.put_batch(batch))
    assert_same_step(state, st, m, st8, m8)
