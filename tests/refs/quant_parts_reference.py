"""The check of a model whose layers on a concatenation quantize its parts one by one
(:meth:`~ditax.nn.quant.QuantSpec.quantize_parts`): bit for bit the output of the concatenation
quantized whole."""

import numpy as np


def parts_output_equals_joined(monkeypatch, tr, inputs: dict) -> np.ndarray:
    """``tr(**inputs)`` with 8-bit activations, asserting that the parts' dot was traced (each
    with two parts) and that the output equals, bit for bit, the one with ``joined_input``
    patched back to the plain concatenation (whose dot quantizes it whole); returns it."""
    from ditax.nn.linear import Linear
    from ditax.nn.quant import QuantSpec
    from ditax.nn.quant_dot import join_parts

    calls, parts_dot = [], QuantSpec._parts_dot
    monkeypatch.setattr(QuantSpec, "_parts_dot",
                        lambda self, *a: calls.append(a[1]) or parts_dot(self, *a))
    new = np.asarray(tr.module(**inputs))
    assert len(calls) >= 1 and all(len(x.values) == 2 for x in calls), calls
    traced = len(calls)
    monkeypatch.setattr(Linear, "joined_input",
                        lambda self, parts, lead=None: join_parts(parts, lead))
    old = np.asarray(tr.module(**inputs))
    assert len(calls) == traced
    np.testing.assert_array_equal(new, old)
    return new
