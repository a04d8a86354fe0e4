"""A newcomer's first install is light (issue 23, class 9).

``make demo`` installs ditax and its runtime dependencies only; ``make test`` adds the [test]
extra (torch, diffusers, transformers: the parity references) and the [tpu] one, on a fresh
machine or on top of a demo install. Checked on the Makefile itself with ``make -n`` (what it
would run, nothing installed) for fresh and half-installed virtual environments, plus the
package metadata (an SPDX licence, so setuptools prints no deprecation warning) and the demo's
import path (nothing from the test extra).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def dry_run(target: str, venv: pathlib.Path) -> list[str]:
    """The install lines (``tools/install.py``: pip install by uv) ``make -n TARGET VENV=venv``
    would run, in order."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=env)   # (not the flags of a `make test`)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if "tools/install.py" in line]


def extras(line: str) -> set[str]:
    """The extras of the editable install on ``line`` (``-e ".[test]"`` → {"test"})."""
    m = re.search(r"-e\s+[\"']?\.(\[([^\]]*)\])?[\"']?(\s|$)", line)
    assert m, f"no editable install of . in {line!r}"
    return set(filter(None, (m.group(2) or "").split(",")))


def editable_installs(lines: list[str]) -> list[set[str]]:
    return [extras(line) for line in lines if " -e " in line]


@needs_make
def test_make_demo_on_a_fresh_machine_installs_the_runtime_only(tmp_path):
    installs = editable_installs(dry_run("demo", tmp_path / "fresh-venv"))
    assert installs == [set()], installs           # `pip install -e .`: no extras at all
    assert installs == editable_installs(dry_run("install", tmp_path / "fresh-venv"))


@needs_make
def test_make_test_adds_the_test_and_tpu_extras_fresh_or_after_make_demo(tmp_path):
    fresh = editable_installs(dry_run("test", tmp_path / "fresh-venv"))
    assert fresh == [set(), {"test"}, {"tpu"}], fresh
    # after `make demo`: the runtime stamp exists (newer than pyproject / constraints)
    venv = tmp_path / "demo-venv"
    venv.mkdir()
    stamp = venv / ".installed"
    stamp.touch()
    newest = max((ROOT / f).stat().st_mtime for f in ("pyproject.toml", "constraints.txt"))
    os.utime(stamp, (newest + 10, newest + 10))
    assert editable_installs(dry_run("demo", venv)) == []
    assert editable_installs(dry_run("test", venv)) == [{"test"}, {"tpu"}]


def _uv_flags_under(install, env: dict):
    """``install.uv_flags`` of the pip settings seen with exactly ``env`` as the environment
    (restored after), and those flags as (flag, value) pairs."""
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        settings = install.pip_settings()
    finally:
        os.environ.clear()
        os.environ.update(old)
    flags = install.uv_flags(settings)
    return flags, list(zip(flags[::2], flags[1::2]))


def test_the_installer_passes_pips_package_sources_on_to_uv(tmp_path):
    """uv reads no pip configuration: the installer hands pip's sources (config files and
    ``PIP_*`` variables, as ``pip config list`` shows them) to uv, every index searched."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import install
    finally:
        sys.path.pop(0)
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="/w1 /w2",
               PIP_EXTRA_INDEX_URL="file:///idx/simple", PIP_CONSTRAINT="/c.txt")
    for k in ("PIP_INDEX_URL", "PIP_CERT"):
        env.pop(k, None)
    flags, pairs = _uv_flags_under(install, env)
    assert pairs == [("--index-strategy", "unsafe-best-match"),
                     ("--extra-index-url", "file:///idx/simple"), ("--find-links", "/w1"),
                     ("--find-links", "/w2"), ("--constraint", "/c.txt")], flags
    # a config file's multi-line value (printed with "\n" escapes) and an index-url in both
    # the file and the environment: each URL on its own, one index-url (the environment's)
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://file/simple\n"
                    "extra-index-url =\n    https://a/simple\n    https://b/simple\n")
    env.update(PIP_CONFIG_FILE=str(conf), PIP_INDEX_URL="https://env/simple")
    flags, pairs = _uv_flags_under(install, env)
    assert [v for f, v in pairs if f == "--index-url"] == ["https://env/simple"], flags
    assert [v for f, v in pairs if f == "--extra-index-url"] == [
        "https://a/simple", "https://b/simple", "file:///idx/simple"], flags


def test_the_test_extra_holds_the_heavy_references_and_the_runtime_does_not():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = lambda reqs: {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in reqs}
    heavy = {"torch", "diffusers", "transformers"}
    assert heavy <= names(project["optional-dependencies"]["test"])
    assert not heavy & names(project["dependencies"])


def test_the_licence_is_an_spdx_string_and_setuptools_supports_it():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"    # a table is deprecated (setuptools 77)
    [setuptools] = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools.replace(" ", ""))
    assert minimum and int(minimum.group(1)) >= 77, setuptools


def test_the_demo_imports_nothing_from_the_test_extra():
    """The modules ``python -m ditax.demo`` runs import with torch / diffusers / transformers
    made unimportable (as in the light venv ``make demo`` builds)."""
    code = (
        "import sys\n"
        "for name in ('torch', 'diffusers', 'transformers', 'accelerate', 'peft'):\n"
        "    sys.modules[name] = None\n"
        "import ditax, ditax.demo, ditax.pipelines.wan.text_to_video, ditax.synthetic.score\n"
        "import ditax.synthetic.sheet, ditax.synthetic.vocab, ditax.io.video\n"
        "import ditax.compile_cache, ditax.cli, ditax.cli.generate\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
