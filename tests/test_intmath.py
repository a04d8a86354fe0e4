"""Integer size helpers (ditax.intmath) against their definition."""

from ditax.intmath import ceil_div, round_up


def test_round_up_and_ceil_div():
    for x in range(0, 300):
        for m in (1, 3, 8, 128):
            assert ceil_div(x, m) * m >= x > (ceil_div(x, m) - 1) * m or x == 0
            assert round_up(x, m) % m == 0 and 0 <= round_up(x, m) - x < m
    assert (ceil_div(0, 8), round_up(0, 8), round_up(129, 128)) == (0, 0, 256)
