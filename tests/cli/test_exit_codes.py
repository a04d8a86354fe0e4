"""A ValueError inside a run is the user's request only when ditax's own check raised it:
one raised by jax itself (arguments laid out unlike the compiled program's, found mid-run)
is a failure of the run — exit 1 with its type, not exit 2 "bad request"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.errors import RequestError, raised_in_library, request_errors


def _jax_value_error():
    """A ValueError raised inside jax: a program compiled for one input sharding called with
    another (the static-batch-on-a-mesh failure of session 62)."""
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs 2 devices (the suite's CPU host gives 8)")
    mesh = jax.sharding.Mesh(np.array(devices[:2]), ("x",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x = jax.device_put(jnp.ones((4, 4)), whole)
    program = jax.jit(lambda a: a + 1).lower(x).compile()
    program(jax.device_put(jnp.ones((4, 4)), split))


def test_a_check_of_the_request_becomes_a_request_error():
    with pytest.raises(RequestError, match="height=40 must be a multiple of 16"):
        with request_errors():
            raise ValueError("height=40 must be a multiple of 16")


def test_jaxs_own_value_error_stays_a_failure():
    with pytest.raises(ValueError) as e:
        with request_errors():
            _jax_value_error()
    assert not isinstance(e.value, RequestError) and raised_in_library(e.value)
    assert "sharding" in str(e.value).lower()


def test_the_cli_exits_1_for_it(monkeypatch, capsys, tmp_path):
    """Through ``ditax generate``'s own wrapper: the pipeline call raising jax's error."""
    import ditax.front
    from ditax.cli import main

    class Boom:
        hands_frames = False

        def __call__(self, **kw):
            _jax_value_error()

    class Opened:
        def __enter__(self):
            return Boom()

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(ditax.front, "open", lambda *a, **k: Opened())
    out = tmp_path / "o.mp4"
    rc = main(["generate", "--model", "demo", "--prompt", "a red circle moves right",
               "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "ValueError" in err[0], err
    assert not out.exists()
