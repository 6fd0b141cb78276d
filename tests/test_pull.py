"""ds4 pull (modelfile/pull.py) against a fake Hugging Face hub on loopback (HF_ENDPOINT): the
hub's client fetches the metadata and the bytes; a transfer cut halfway resumes from where it
stopped (a Range request) in a later run; a file whose bytes do not hash to the hub's SHA-256 is
deleted and never put where ds4 opens models; too little disk is refused before any byte; the
file lands in the hub's cache layout (or a folder), and config.toml gets it (asked first)."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ds4agent import settings
from ds4agent.cli import main
from ds4agent.modelfile import pull as pullmod
from ds4agent.modelfile.pull import PullError, Variant, pull

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    """Serves files under /{repo}/resolve/{revision}/{name} as the hub does: HEAD with the LFS
    object's SHA-256 (X-Linked-Etag), size and commit; GET with Range. ``cut``: the next GET
    sends that many bytes and drops the connection, after which GETs answer 503 until
    ``healthy()``; ``lie``: advertise this SHA-256 instead of the true one."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.cut: int | None = None
        self.broken = False
        self.lie: str | None = None
        self.ranges: list[str | None] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def _file(self) -> bytes | None:
                parts = self.path.split("/")
                if len(parts) < 6 or parts[3] != "resolve":
                    return None
                return hub.files.get("/".join(parts[5:]))

            def _head(self, data: bytes, status: int = 200, length: int | None = None) -> None:
                sha = hub.lie or hashlib.sha256(data).hexdigest()
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("ETag", f'"{sha}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) if length is None else length))

            def _missing(self) -> None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")  # what the hub says of a missing file
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self) -> None:
                data = self._file()
                if data is None:
                    self._missing()
                    return
                self._head(data)
                self.end_headers()

            def do_GET(self) -> None:
                data = self._file()
                if data is None:
                    self._missing()
                    return
                rng = self.headers.get("Range")
                hub.ranges.append(rng)
                if hub.broken:
                    self.send_error(503)
                    return
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                body = data[start:]
                self._head(data, 206 if start else 200, len(body))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if hub.cut is not None:
                    self.wfile.write(body[: hub.cut])
                    self.wfile.flush()
                    hub.cut, hub.broken = None, True
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def healthy(self) -> None:
        self.broken, self.cut, self.lie = False, None, None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# 24 MiB and a bit: the client hands bytes over in 10 MiB pieces, so a cut at 15 MiB leaves 10 here
DATA = bytes(range(256)) * (96 * 1024) + b"tail"
CUT = 15 << 20
KEPT = 10 << 20
V = Variant("tiny", "tiny-model.gguf", 0.001, "a test file", repo="someone/some-gguf")
M = Variant("mtp", "tiny-mtp.gguf", 0.001, "a test MTP file", kind="mtp", repo="someone/some-gguf")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    h = Hub({V.file: DATA, M.file: DATA[:1000]})
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(pullmod, "VARIANTS", (V, M))
    yield h
    h.close()


def test_a_file_lands_in_the_hub_cache_layout_checked(hub, tmp_path) -> None:
    seen: list[tuple[str, int, int]] = []
    got = pull(V, report=lambda stage, done, total: seen.append((stage, done, total)))
    repo = tmp_path / "hf-cache" / "models--someone--some-gguf"
    sha = hashlib.sha256(DATA).hexdigest()
    assert got.path == repo / "snapshots" / COMMIT / V.file and got.path.is_symlink()
    assert got.path.read_bytes() == DATA and got.path.resolve() == repo / "blobs" / sha
    assert (repo / "refs" / "main").read_text() == COMMIT
    assert not got.already and got.downloaded == len(DATA)
    assert ("verify", len(DATA), len(DATA)) in seen and any(s == "download" for s, _, _ in seen)
    # The hub's own client sees it as cached.
    from huggingface_hub import try_to_load_from_cache

    assert Path(try_to_load_from_cache(V.repo, V.file, cache_dir=str(tmp_path / "hf-cache"))) == got.path
    again = pull(V)
    assert again.already and again.path == got.path and hub.ranges == [None]  # no second transfer


def test_an_interrupted_transfer_resumes_where_it_stopped(hub, tmp_path) -> None:
    hub.cut = CUT
    with pytest.raises(PullError, match="run ds4 pull tiny again to resume"):
        pull(V, tmp_path / "models")
    part = tmp_path / "models" / (V.file + ".part")
    assert part.stat().st_size == KEPT and not (tmp_path / "models" / V.file).exists()
    hub.healthy()
    got = pull(V, tmp_path / "models")
    assert got.resumed_from == KEPT and got.downloaded == len(DATA) - KEPT
    assert hub.ranges[-1] == f"bytes={KEPT}-"
    assert got.path == tmp_path / "models" / V.file and got.path.read_bytes() == DATA and not part.exists()


def test_a_wrong_hash_leaves_nothing_where_ds4_looks(hub, tmp_path) -> None:
    hub.lie = "f" * 64
    with pytest.raises(PullError, match="its SHA-256 is .* the hub says f{64}; the download was deleted"):
        pull(V, tmp_path / "models")
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == []
    # A file of that name put there by other means is checked, not trusted, and moved aside.
    (tmp_path / "models" / V.file).write_bytes(b"x" * len(DATA))
    hub.healthy()
    with pytest.raises(PullError, match="is not the hub's file .* moved to tiny-model.gguf.damaged"):
        pull(V, tmp_path / "models")
    assert pull(V, tmp_path / "models").path.read_bytes() == DATA


def test_too_little_disk_is_refused_before_any_byte(hub, monkeypatch, tmp_path) -> None:
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 << 30, 10 << 30, 512 << 20))
    with pytest.raises(PullError, match=r"not enough disk: .* needs 0.0 GiB more .* 0.5 GiB are free"):
        pull(V, tmp_path / "models")
    assert hub.ranges == []


def test_offline_and_missing_files_are_one_line(hub, monkeypatch, tmp_path) -> None:
    with pytest.raises(PullError, match="has no file nothing.gguf"):
        pull(Variant("x", "nothing.gguf", 1, "", repo=V.repo), tmp_path)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PullError, match=r"offline mode is on \(HF_HUB_OFFLINE\); run ds4 pull tiny again"):
        pull(V, tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.close()  # no hub at that address any more
    with pytest.raises(PullError, match="ConnectError: .*; run ds4 pull tiny again to resume"):
        pull(V, tmp_path)


def test_the_command_lists_pulls_and_sets_the_config(hub, tmp_path, capsys) -> None:
    assert main(["pull", "--list"]) == 0
    assert "tiny-model.gguf" in capsys.readouterr().out
    assert main(["pull", "nope"]) == 2
    assert "no variant 'nope'" in capsys.readouterr().err
    assert main(["pull", "mtp", "--dir", str(tmp_path / "m")]) == 0  # not a terminal, no --yes: a hint
    assert "ds4 pull mtp --yes sets 'mtp'" in capsys.readouterr().out
    assert main(["pull", "mtp", "--dir", str(tmp_path / "m"), "--yes"]) == 0
    assert "already here and checked" in capsys.readouterr().out
    assert settings.mtp_choice() == str(tmp_path / "m" / M.file)
    cfg = settings.config_path()
    cfg.write_text('# mine\nspeculate = "ngram"\n\n[mcp_servers.x]\ncommand = "y"\n')
    assert main(["pull", "tiny", "--dir", str(tmp_path / "m"), "--yes"]) == 0
    text = cfg.read_text()
    assert text.startswith(f'# mine\nspeculate = "ngram"\n\nmodel = "{tmp_path / "m" / V.file}"\n[mcp_servers.x]')


def test_the_published_variants_are_named_once() -> None:
    names = [v.name for v in pullmod.VARIANTS]
    files = [v.file for v in pullmod.VARIANTS]
    assert len(set(names)) == len(names) and len(set(files)) == len(files)
    assert pullmod.variant("q2").file == "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf"
