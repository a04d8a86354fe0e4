"""``model.offload=host`` compiled for a TPU without one (deviceless v6e, one chip): the blocks'
matrices are host arguments of the program, each layer's weights cross to the device once
per forward (one more for the prefetch past the end), and the layer loop brings block i + 1's
weights in the iteration before it runs — the copy's result leaves the loop body through its
carry, never read by that iteration's compute. Skips (with the install line) without libtpu."""

import importlib.util
import json

import jax
import pytest

from ditax.cli import main
from ditax.plan.hlo import parse

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f'libtpu is not installed: pip install "jax[tpu]=={jax.__version__}"')

LAYERS = 8
ARGS = ["tiny", "--target", "tpu-v6e-1", "--compile", "--json", "--latent", "2,8,8",
        f"model.num_layers={LAYERS}", "model.dtype=bfloat16", "model.param_dtype=bfloat16"]


def _plan(capsys, tmp_path, *extra):
    hlo = tmp_path / "forward.hlo"
    rc = main(["plan", *ARGS, "--dump-hlo", str(hlo), *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out), hlo.read_text()


def _carried_only(text: str) -> tuple[int, int]:
    """``(copies, carried)``: the layer loop body's host-to-device copies (``*-done`` of a
    start reading memory space ``S(5)``) and how many of them reach nothing but the body's
    root tuple (through bitcasts / copies): brought for the next iteration, not this one."""
    for comp in parse(text).values():
        dones = [i for i in comp.instrs.values() if i.opcode == "dynamic-slice-done"
                 and "S(5)" in comp.instrs[i.operands[0]].shape]
        if not dones or comp.entry:
            continue
        users: dict[str, list] = {}
        for ins in comp.instrs.values():
            for o in ins.operands:
                users.setdefault(o, []).append(ins)

        def only_root(name, seen=()):
            for u in users.get(name, ()):
                if u.root:
                    continue
                if u.opcode in ("bitcast", "copy") and u.name not in seen:
                    if not only_root(u.name, seen + (u.name,)):
                        return False
                    continue
                return False
            return True

        return len(dones), sum(only_root(d.name) for d in dones)
    return 0, 0


@needs_libtpu
def test_offloaded_forward_streams_each_layer_once_ahead_of_its_compute(capsys, tmp_path):
    resident, _ = _plan(capsys, tmp_path)
    plan, hlo = _plan(capsys, tmp_path, "model.offload=host")
    fwd, ref = plan["forward"], resident["forward"]
    host = fwd["host_argument_bytes"]
    assert host > 0 and ref["host_argument_bytes"] == 0
    # the blocks' matrices left the device's arguments for the host's
    assert fwd["argument_bytes"] + host == ref["argument_bytes"]
    # every layer copied once, and (prefetch 1) the last once more past the end
    assert fwd["host_to_device_bytes"] * LAYERS == host * (LAYERS + 1)
    assert fwd["roofline"]["host_s"] > 0
    copies, carried = _carried_only(hlo)
    assert copies > 0 and carried == copies, (copies, carried)


@needs_libtpu
def test_offloaded_int8_kernels_stream_one_layer_at_a_time(capsys, tmp_path):
    """8-bit kernels on the host get the TPU layout of one layer's device copy
    (ditax.nn.offload.placement): each layer's int8 weights cross once per forward (one more
    for the prefetch), not the whole stack every layer (9x the weights per forward with XLA's
    default host layout for s8 at 8 layers)."""
    bf16, _ = _plan(capsys, tmp_path, "model.offload=host")
    plan, hlo = _plan(capsys, tmp_path, "model.offload=host", "model.quantize=int8")
    int8_bytes = bf16["forward"]["host_argument_bytes"] / 2     # the same kernels, 1 byte each
    streamed = plan["forward"]["host_to_device_bytes"]
    # small tiny-model kernels pad to the tiles a little; the whole stack per layer is 8x
    assert int8_bytes * (LAYERS + 1) / LAYERS <= streamed < 1.1 * int8_bytes * (LAYERS + 1) / LAYERS
    assert "s8[" in hlo and "T(8,128)(4,1)S(5)" in hlo
