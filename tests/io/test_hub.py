"""Hub downloads are explicit (issue 23, class 11), without the network.

A fake Hugging Face hub (the HTTP endpoints ``huggingface_hub.snapshot_download`` calls: repo
info, tree listing, file resolve) runs on 127.0.0.1; a child process points ``HF_ENDPOINT`` at
it and resolves hub ids with ditax. The hub logs every file requested, so the tests see what
really is downloaded: only JSON and safetensors, never the ``.bin`` / ``.pth`` / ``.gguf`` /
ONNX duplicates nor README media, at the pinned revision when one is given. Offline
(``HF_HUB_OFFLINE=1``) an ``org/name`` that is neither a folder nor cached fails at once, in
one line naming it.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

COMMITS = {"main": "a" * 40, "v1": "b" * 40}
FILES = {
    "model_index.json": b'{"_class_name": "WanPipeline"}',
    "README.md": b"# a model card",
    "assets/teaser.png": b"PNG" * 10,
    "transformer/config.json": b'{"_class_name": "WanTransformer3DModel"}',
    "transformer/diffusion_pytorch_model.safetensors": b"S" * 64,
    "transformer/diffusion_pytorch_model.bin": b"B" * 64,
    "transformer/model.gguf": b"G" * 64,
    "vae/config.json": b"{}",
    "vae/diffusion_pytorch_model.safetensors": b"V" * 64,
    "vae/Wan2.1_VAE.pth": b"P" * 64,
    "text_encoder/model.onnx": b"O" * 64,
    "tokenizer/tokenizer.json": b'{"model": {}}',
    "tokenizer/spiece.model": b"M" * 64,
}
WANTED = {f for f in FILES if f.endswith((".json", ".safetensors"))}


class FakeHub(http.server.BaseHTTPRequestHandler):
    """The three endpoints snapshot_download uses, for repo ``org/name``; logs resolves."""

    resolved: list = []
    revisions: list = []

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802 — http.server's naming
        self.do_GET()

    def do_GET(self):  # noqa: N802
        path = self.path.split("?")[0]
        info, tree, resolve = "/api/models/org/name/revision/", "/api/models/org/name/tree/", \
            "/org/name/resolve/"
        if path.startswith(info):
            rev = path[len(info):]
            self.revisions.append(rev)
            sha = COMMITS.get(rev, rev if rev in COMMITS.values() else None)
            if sha is None:
                return self._send(404, b'{"error": "Invalid rev id"}',
                                  {"X-Error-Code": "RevisionNotFound"})
            body = {"id": "org/name", "sha": sha, "siblings": [{"rfilename": f} for f in FILES]}
            return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
        if path.startswith(tree):
            rows = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for f, b in FILES.items()]
            return self._send(200, json.dumps(rows).encode(), {"Content-Type": "application/json"})
        if path.startswith(resolve):
            sha, _, name = path[len(resolve):].partition("/")
            if name in FILES:
                if self.command == "GET":
                    self.resolved.append((sha, name))
                return self._send(200, FILES[name], {
                    "X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(FILES[name]).hexdigest()}"'})
        self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"})

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(tmp_path):
    FakeHub.resolved, FakeHub.revisions = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
           "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    yield FakeHub, env
    server.shutdown()


def resolve(env: dict, *calls: str) -> list[str]:
    """Run ``resolve_folder(ARGS)`` for each call in a child (huggingface_hub reads its env at
    import); returns the folders, or the error lines."""
    code = ("import sys\nfrom ditax.io.hub import resolve_folder\n"
            "for call in sys.argv[1:]:\n"
            "    try: print(eval('resolve_folder(' + call + ')'))\n"
            "    except Exception as e: print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code, *calls], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_a_subfolder_fetches_only_its_json_and_safetensors(hub):
    fake, env = hub
    [folder] = resolve(env, "'org/name', 'transformer'")
    assert folder.endswith(f"snapshots/{COMMITS['main']}/transformer"), folder
    got = {name for _, name in fake.resolved}
    assert got == {"transformer/config.json", "transformer/diffusion_pytorch_model.safetensors",
                   "model_index.json"}, got


def test_a_pipeline_fetches_json_and_safetensors_never_the_duplicates(hub):
    fake, env = hub
    [folder] = resolve(env, "'org/name', None, ('model_index.json',)")
    assert folder.endswith(f"snapshots/{COMMITS['main']}"), folder
    got = {name for _, name in fake.resolved}
    assert got == WANTED, sorted(got ^ WANTED)
    assert not any(n.endswith((".bin", ".pth", ".gguf", ".onnx", ".md", ".png", ".model"))
                   for n in got)


def test_a_pinned_revision_is_what_is_fetched(hub):
    fake, env = hub
    folder, folder_kw = resolve(env, "'org/name@v1', 'vae'", "'org/name', 'vae', revision='v1'")
    assert folder.endswith(f"snapshots/{COMMITS['v1']}/vae") and folder_kw == folder
    assert fake.revisions == ["v1", "v1"] and {s for s, _ in fake.resolved} == {COMMITS["v1"]}
    # a commit pins too; an unknown revision and two different pins are one line each
    by_commit, unknown, both = resolve(env, f"'org/name@{COMMITS['v1']}', 'vae'",
                                       "'org/name@nope', 'vae'",
                                       "'org/name@v1', 'vae', revision='v2'")
    assert by_commit == folder
    assert unknown.startswith("ModelNotFound") and "'nope'" in unknown, unknown
    assert both.startswith("ModelNotFound") and "'v2'" in both, both


def test_offline_an_org_name_that_is_no_folder_fails_in_one_line_without_a_request(tmp_path):
    from loopback import silent_endpoint

    with silent_endpoint() as (url, hits):
        env = {**os.environ, "HF_HUB_OFFLINE": "1",
               "HF_HUB_CACHE": str(tmp_path / "empty-cache"), "HF_ENDPOINT": url}
        code = ("from ditax.io.hub import resolve_folder\n"
                "try: resolve_folder('someorg/missing-model', 'transformer')\n"
                "except Exception as e: print(type(e).__name__, e)\n")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        [line] = out.stdout.strip().splitlines()
        kind, message = line.split(" ", 1)
        assert kind == "ModelNotFound", line
        assert "'someorg/missing-model' is neither a local folder nor" in message, message
        assert "HF_HUB_OFFLINE" in message, message
        # the command line: exit 2 and one line naming the id
        cli = subprocess.run([sys.executable, "-m", "ditax.cli", "convert",
                              "someorg/missing-model"], env=env, capture_output=True, text=True,
                             timeout=120)
        assert cli.returncode == 2, cli.stderr
        lines = cli.stderr.strip().splitlines()
        assert len(lines) == 1 and "someorg/missing-model" in lines[0], cli.stderr
    assert hits == [], f"{len(hits)} connection(s) to the hub endpoint while offline"
