"""``ditax plan``, ``ditax bench`` and ``ditax convert`` in-process on the tiny preset / a tiny
diffusers folder."""

import json

from ditax.cli import main as cli_main


def test_plan_bench_convert_cli(tmp_path, capsys):
    assert cli_main(["plan", "tiny", "mesh.fsdp=2", "mesh.context=4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mesh"]["context"] == 4
    assert out["param_bytes_per_device"] * 4 <= out["param_bytes_total"]
    assert cli_main(["bench", "tiny", "--latent", "1,8,8", "--text-len", "4",
                     "--repeats", "1"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["metric"] == "forward" and line["value"] > 0
    from wan_reference import make_diffusers_wan

    _, folder = make_diffusers_wan(tmp_path, layers=1)
    assert cli_main(["convert", str(folder)]) == 0
    assert "OK" in capsys.readouterr().out
