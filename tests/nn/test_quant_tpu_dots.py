"""8-bit dots on a TPU v5e, compiled on this CPU machine without one (issue 54 item 3).

A v5e chip (libtpu's ``v5e:1x1`` topology, deviceless) compiles the real TPU executable; its
optimized HLO says what the chip runs. int8 weights x int8 activations: every block linear's
matrix product is a ``convolution`` of two ``s8`` operands into ``s32`` (the MXU's int8 path,
twice the bf16 rate on v5e), the int32 result never reaches HBM (its rescale by the two scales
is in the product's own fusion), and each activation is quantized once however many dots read
it (Wan's q / k / v share one). Weights only: no ``s8 x s8`` product (the 8-bit kernel is
widened inside the product's fusion: memory only). A layer on a concatenation (FLUX's single
blocks: the attention output ``[L, N, K]`` and the MLP ``[L, M]``) quantized part by part:
one product per part, no float concatenation and no relayout of 8-bit values. Skips without
libtpu.
"""

from __future__ import annotations

import importlib.util
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.nn.linear import Linear
from ditax.nn.quant import QuantSpec

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f'libtpu is not installed: pip install "jax[tpu]=={jax.__version__}" '
           f'(deviceless TPU compile)')

D, M, L = 256, 512, 1024     # lanes-wide dims: the layout a real model's dots have


@pytest.fixture(scope="module")
def v5e():
    """The device of a one-chip v5e slice (no TPU attached); every XLA optimisation on (the
    suite turns most off for CPU compiles; fusion is what this module checks)."""
    from ditax.plan.targets import parse_target, topology_devices

    prev = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield topology_devices(parse_target("tpu-v5e-1"))
    finally:
        jax.config.update("jax_disable_most_optimizations", prev)


class Hlo:
    """The instructions of an optimized HLO text: name -> (type, opcode, operands, the
    computation it is in); ``top`` the computations that are not fusion bodies."""

    LINE = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")

    def __init__(self, text: str):
        self.ins, self.calls, comp, fused = {}, {}, None, set()
        for line in text.splitlines():
            if not line.startswith(" ") and line.rstrip().endswith("{"):
                comp = re.match(r"(?:ENTRY )?%?([\w.\-]+)", line).group(1)
                continue
            m = self.LINE.match(line)
            if m and comp:
                name, ty, op, rest = m.groups()
                args = rest.split("), ")[0] if op != "fusion" else rest.split("), kind=")[0]
                self.ins[name] = (ty, op, re.findall(r"%([\w.\-]+)", args), comp)
                if op == "fusion":
                    self.calls[name] = re.search(r"calls=%([\w.\-]+)", rest).group(1)
                    fused.add(self.calls[name])
        self.fused = fused

    def dtype(self, name: str) -> str:
        return re.match(r"\(?([a-z0-9]+)\[", self.ins[name][0]).group(1)

    def body(self, fusion: str) -> set[str]:
        """The opcodes inside fusion instruction ``fusion``'s computation."""
        return {op for _, op, _, comp in self.ins.values() if comp == self.calls[fusion]}

    def products(self) -> list[tuple[str, str, str]]:
        """(lhs, rhs, result) dtypes of every convolution / dot."""
        return [(self.dtype(a[0]), self.dtype(a[1]), self.dtype(n))
                for n, (ty, op, a, _) in self.ins.items() if op in ("convolution", "dot")]

    def top_level(self, dtype: str, min_elements: int) -> list[str]:
        """Instructions outside fusion bodies that write a ``dtype`` array of at least
        ``min_elements`` (in a tuple too)."""
        out = []
        for n, (ty, op, _, comp) in self.ins.items():
            if comp in self.fused or op in ("parameter", "bitcast", "get-tuple-element"):
                continue
            for dt, dims in re.findall(r"([a-z0-9]+)\[([\d,]*)\]", ty):
                size = 1
                for d in filter(None, dims.split(",")):
                    size *= int(d)
                if dt == dtype and size >= min_elements:
                    out.append(n)
        return out


def _compiled(devices, fn, *shapes) -> Hlo:
    mesh = jax.sharding.Mesh(devices, ("x",))
    rep = NamedSharding(mesh, P())
    args = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), shapes)
    return Hlo(jax.jit(fn).lower(*args).compile().as_text())


def _quantized_linear(activations: bool):
    """An abstract bf16 ``Linear(D, M)`` with an int8 kernel and its scales."""
    lin = nnx.eval_shape(lambda: Linear(D, M, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                                        rngs=nnx.Rngs(0)))
    lin.kernel = nnx.Param(jax.ShapeDtypeStruct((D, M), jnp.int8))
    lin.kernel_scale = nnx.Param(jax.ShapeDtypeStruct((M,), jnp.float32))
    lin.quant = QuantSpec("int8", activations)
    return nnx.split(lin)


@pytest.mark.parametrize("activations", [True, False])
def test_linear_int8_dot_on_v5e(v5e, activations):
    """One int8 Linear on ``x [1, L, D]`` bf16: with activations an ``s8 x s8 -> s32``
    product whose s32 result stays inside its fusion; weights only none."""
    gdef, state = _quantized_linear(activations)
    hlo = _compiled(v5e, lambda s, x: nnx.merge(gdef, s)(x), state,
                    jax.ShapeDtypeStruct((1, L, D), jnp.bfloat16))
    products = hlo.products()
    assert products, "no matrix product in the program"
    if activations:
        assert products == [("s8", "s8", "s32")], products
        assert not hlo.top_level("s32", L * M)          # the rescale is in the dot's fusion
    else:
        assert ("s8", "s8", "s32") not in products and products, products


def test_joined_parts_int8_dots_on_v5e(v5e):
    """FLUX.2's single-block ``to_out`` on ``[o [1, L, N, K], SwiGLU(h [1, L, 2M])]`` with
    int8 activations, quantized part by part (``Linear.joined_input``): two ``s8 x s8 ->
    s32`` products (one per part, summed in int32), no float SwiGLU ``[L, M]`` nor joined
    ``[L, N·K + M]`` array written (quantizing the concatenation wrote the SwiGLU twice: once
    for its max, once more for the rounding) and no 8-bit array relaid out by a copy."""
    from ditax.models.flux2.blocks import swiglu

    n, k, m = 2, 128, 768           # m != M: the output [1, L, M] is written
    lin = nnx.eval_shape(lambda: Linear(n * k + m, M, dtype=jnp.bfloat16,
                                        param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    lin.kernel = nnx.Param(jax.ShapeDtypeStruct((n * k + m, M), jnp.int8))
    lin.kernel_scale = nnx.Param(jax.ShapeDtypeStruct((M,), jnp.float32))
    lin.quant = QuantSpec("int8", True)
    gdef, state = nnx.split(lin)

    def fwd(s, o, h):
        layer = nnx.merge(gdef, s)
        return layer(layer.joined_input([o, swiglu(h)], 2))

    hlo = _compiled(v5e, fwd, state, jax.ShapeDtypeStruct((1, L, n, k), jnp.bfloat16),
                    jax.ShapeDtypeStruct((1, L, 2 * m), jnp.bfloat16))
    assert hlo.products() == [("s8", "s8", "s32")] * 2, hlo.products()
    wide = [x for x in hlo.top_level("bf16", 1) + hlo.top_level("f32", 1)
            if re.search(rf"\b(1,)?{L},({m}|{n * k + m})\]", hlo.ins[x][0])]
    assert not wide, [hlo.ins[x][0] for x in wide]
    copies = [x for x in hlo.top_level("s8", 1) if hlo.ins[x][1] == "copy"]
    assert not copies, [hlo.ins[x][0] for x in copies]


def _wan_hlo(tmp_path, capsys, *quantize) -> Hlo:
    """The compiled v5e forward of a bf16 Wan with 128-wide heads (one layer, 768 video
    tokens, 512 text tokens, splash attention as on the chip) through ``ditax plan --target
    tpu-v5e-1``."""
    from ditax.cli import main

    path = tmp_path / "fwd.hlo"
    rc = main(["plan", "tiny", "--target", "tpu-v5e-1", "--latent", "2,48,32",
               "--dump-hlo", str(path), "model.num_layers=1", "model.attention_head_dim=128",
               "model.num_attention_heads=2", "model.ffn_dim=1024", "model.text_dim=256",
               "model.dtype=bfloat16", "model.param_dtype=bfloat16",
               "sample.max_sequence_length=512",
               "attention.backend=splash", *quantize])
    assert rc == 0, capsys.readouterr().err
    return Hlo(path.read_text())


#: a Wan block's linears: self-attention q / k / v / out, cross-attention q / k / v / out, FFN
#: in / out
BLOCK_LINEARS = 10
#: the activations they read, each quantized once: the modulated norm (q, k, v), the attention
#: output, the cross-attention norm (q), the text (k, v), its attention output, the FFN's norm
#: and its hidden
BLOCK_INPUTS = 7


def test_wan_block_int8_dots_on_v5e(v5e, tmp_path, capsys):
    """W8A8 Wan on v5e: the block's ten linears are ``s8 x s8 -> s32`` products, no int32
    result is written outside a fusion, and the block quantizes each of its seven inputs
    once (the three projections of one input share its 8-bit copy)."""
    hlo = _wan_hlo(tmp_path, capsys, "model.quantize=int8", "model.quantize_activations=true")
    products = hlo.products()
    native = [p for p in products if p == ("s8", "s8", "s32")]
    assert len(native) == BLOCK_LINEARS, products
    assert not [p for p in products if "s8" in p[:2] and p != ("s8", "s8", "s32")], products
    assert not hlo.top_level("s32", 1024 * 128), hlo.top_level("s32", 1024 * 128)
    quantized = [n for n in hlo.top_level("s8", 512 * 256) if hlo.ins[n][1] == "fusion"
                 and "s8" in hlo.ins[n][0] and not all(
                     hlo.dtype(a) == "s8" for a in hlo.ins[n][2] if a in hlo.ins)]
    assert len(quantized) == BLOCK_INPUTS, quantized
    # each quantization (divide, round, clip, convert) is one fusion writing only 8 bits (one
    # inside a product's fusion would be better still)
    rounding = [n for n in hlo.calls if n in hlo.ins and hlo.ins[n][3] not in hlo.fused
                and "round-nearest-even" in hlo.body(n) and "convolution" not in hlo.body(n)]
    assert rounding and all(re.fullmatch(r"s8\[[^\]]*\]\S*", hlo.ins[n][0]) for n in rounding), [
        hlo.ins[n][0] for n in rounding]


def test_wan_weights_only_claims_no_native_dot(v5e, tmp_path, capsys):
    """int8 weights only: no ``s8 x s8`` product (every one in bf16), and the plan does not
    claim native 8-bit dots; with activations it does, on this chip."""
    import json

    from ditax.cli import main

    hlo = _wan_hlo(tmp_path, capsys, "model.quantize=int8")
    assert not [p for p in hlo.products() if p[0] == "s8" and p[1] == "s8"], hlo.products()
    capsys.readouterr()
    for act, native in (("false", False), ("true", True)):
        assert main(["plan", "tiny", "--target", "tpu-v5e-1", "--json", "model.quantize=int8",
                     f"model.quantize_activations={act}"]) == 0
        q = json.loads(capsys.readouterr().out)["quantize"]
        assert q["native_dots"] is native and ("TPU v5 lite" in q["dots"]), q
