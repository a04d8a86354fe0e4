"""Which loop of a compiled program is the layer scan (``ditax.plan.measure.layer_loop``):
in a two-layer compile XLA's windowed-einsum loops run 2 trips too; the layer loop is the one
whose iteration holds the most (its body holds the windowed loops)."""

from ditax.plan.measure import layer_loop


def test_layer_loop_is_the_largest_loop_with_num_layers_trips():
    windowed = {"trip": 2, "hbm_bytes": 10, "tpu_custom_calls": 0}
    layer = {"trip": 2, "hbm_bytes": 200, "tpu_custom_calls": 2}
    chunks = {"trip": 4, "hbm_bytes": 500, "tpu_custom_calls": 0}
    assert layer_loop([chunks, windowed, layer], 2) is layer
    assert layer_loop([chunks, windowed, layer], 40) is None
    assert layer_loop([], 2) is None and layer_loop([layer], None) is None
