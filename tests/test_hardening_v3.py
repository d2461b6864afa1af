"""Issue 24 (hardening v3): each finding reproduced as a user meets it, through the real
command line in a subprocess where the issue says so, and held by one command layer
(tpuasm/command.py) and one I/O layer (tpuasm/files.py, tpuasm/limits.py).

Every case checks the exit status and that no Python traceback reaches the user.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ".config array_size=8\nRHM 0, 0, 1\nRW 0\nMMC.S 0, 0, 1\nACT 0, 1, 1\nWHM 1, 1, 1\nHLT\n"


def tpuasm(*args, cwd=None, timeout=60, env=None, **kw) -> subprocess.CompletedProcess:
    """`tpuasm ARGS` as a user runs it; no traceback may reach the user."""
    r = subprocess.run([sys.executable, "-m", "tpuasm", *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})}, **kw)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "p.tasm").write_text(TINY)
    np.save(tmp_path / "x.npy", np.ones((4, 8), np.int8))
    np.save(tmp_path / "w.npy", np.ones((2, 8, 8), np.int8))
    return tmp_path


# ------------------------------------------------------------------ inputs never destroyed
def test_sweep_refuses_an_output_that_is_an_input(tiny):
    host = (tiny / "x.npy").read_bytes()
    for target in ("x.npy", "p.tasm", "w.npy"):
        r = tpuasm("sweep", "p.tasm", "--host", "x.npy", "--weights", "w.npy", "--workers",
                   "0", "--no-cache", "--set", "fifo_depth=2", "-o", target, cwd=tiny)
        assert r.returncode == 2 and f"{target}: cannot write: it is the input" in r.stderr
    assert (tiny / "x.npy").read_bytes() == host and (tiny / "p.tasm").read_text() == TINY


def test_sweep_unreachable_scheduler_leaves_the_old_results(tiny):
    keep = tiny / "keep.csv"
    keep.write_text("old results\n")
    with socket.socket() as s:            # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = tpuasm("sweep", "p.tasm", "--host", "x.npy", "--weights", "w.npy", "--no-cache",
               "--set", "fifo_depth=2", "--scheduler", f"tcp://127.0.0.1:{port}",
               "-o", keep, cwd=tiny, timeout=30)
    assert r.returncode == 2 and "cannot reach the Dask scheduler" in r.stderr
    assert keep.read_text() == "old results\n"
    assert not [p for p in tiny.iterdir() if p.name.endswith(".tmp")]


def _listener(reply: bytes):
    """A loopback TCP server that sends `reply` (maybe nothing) to each connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    conns = []

    def serve():
        while True:
            try:
                c, _ = server.accept()
            except OSError:
                return
            conns.append(c)
            if reply:
                c.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return server, conns


@pytest.mark.parametrize("reply, words", [
    (b"", "sent no Dask handshake within"),                 # an HTTP server waits for us
    (b"\xff" * 64, "does not speak Dask's protocol"),       # would be a 3 EiB "frame"
])
def test_sweep_scheduler_that_is_not_dask_fails_fast(tiny, reply, words):
    server, conns = _listener(reply)
    keep = tiny / "keep.csv"
    keep.write_text("old\n")
    started = time.monotonic()
    try:
        r = tpuasm("sweep", "p.tasm", "--host", "x.npy", "--weights", "w.npy", "--no-cache",
                   "--set", "fifo_depth=2", "--scheduler",
                   f"127.0.0.1:{server.getsockname()[1]}", "-o", keep, cwd=tiny, timeout=30)
    finally:
        server.close()
        for c in conns:
            c.close()
    assert time.monotonic() - started <= 10 + 5      # the probe's 5 s and Python's start
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.splitlines()) == 1
    assert keep.read_text() == "old\n"


@pytest.mark.parametrize("address", ["bogus://::::", "tcp://::1:8786", "tcp://host:99999",
                                     "tcp://"])
def test_scheduler_addresses_dask_cannot_use(address):
    from tpuasm.cluster import ClusterError, probe_scheduler
    with pytest.raises(ClusterError, match="--scheduler"):
        probe_scheduler(address)


def test_sweep_full_disk_is_one_message_and_no_partial_csv(tiny, monkeypatch, capsys):
    from tpuasm.cli import main
    out = tiny / "r.csv"
    out.write_text("old\n")
    r = tpuasm("sweep", "p.tasm", "--host", "x.npy", "--weights", "w.npy", "--workers", "0",
               "--no-cache", "--set", "fifo_depth=2,4", "-o", "/dev/full", cwd=tiny)
    assert r.returncode == 2 and "/dev/full: cannot write the results: No space left" in r.stderr
    # a regular file on a disk that fills up after the header: the write fails mid-sweep
    import tpuasm.files as files
    real = files.StagedFile.write
    calls = []

    def write(self, data):
        calls.append(data)
        if len(calls) > 1:                # the header went through, the first row does not
            self._fail(OSError(28, "No space left on device"))
        return real(self, data)

    monkeypatch.setattr(files.StagedFile, "write", write)
    monkeypatch.chdir(tiny)
    code = main(["sweep", "p.tasm", "--host", "x.npy", "--weights", "w.npy", "--workers", "0",
                 "--no-cache", "--set", "fifo_depth=2,4", "-q", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "r.csv: cannot write the results: No space left on device" in err
    assert "Traceback" not in err and out.read_text() == "old\n"
    assert not [p for p in tiny.iterdir() if p.name.endswith(".tmp")]


def test_asm_writes_all_outputs_or_none(tiny):
    r = tpuasm("asm", "p.tasm", "-o", "big.tbin", "--listing", "/dev/full", cwd=tiny)
    assert r.returncode == 2 and "/dev/full: cannot write: No space left" in r.stderr
    assert not (tiny / "big.tbin").exists()
    assert not [p for p in tiny.iterdir() if p.name.endswith(".tmp")]
    r = tpuasm("asm", "p.tasm", "-o", "big.tbin", "--listing", "big.lst", cwd=tiny)
    assert r.returncode == 0 and (tiny / "big.tbin").is_file() and (tiny / "big.lst").is_file()


def test_write_together_renames_nothing_when_one_output_fails(tmp_path, monkeypatch):
    from tpuasm import files
    from tpuasm.errors import OutputFileError
    (tmp_path / "a").write_text("old a")
    staged = files._stage

    def stage(path, data, verb):
        if path.name == "b":
            raise OutputFileError(f"{path}: {verb}: No space left on device")
        return staged(path, data, verb)

    monkeypatch.setattr(files, "_stage", stage)
    with pytest.raises(OutputFileError, match="No space left"):
        files.write_together([(tmp_path / "a", b"new a"), (tmp_path / "b", b"new b")])
    assert (tmp_path / "a").read_text() == "old a" and not (tmp_path / "b").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


# ------------------------------------------------------------------ the compiler's faces
@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests"))
    import float_models
    d = tmp_path_factory.mktemp("model")
    float_models.save(float_models.build([("gemm", 8), ("relu",)], (16,)), d / "m.onnx")
    np.save(d / "calib.npy", np.random.default_rng(0).normal(0, 1, (20, 16)).astype(np.float32))
    np.save(d / "x.npy", np.random.default_rng(1).normal(0, 1, (5, 16)).astype(np.float32))
    r = tpuasm("compile", "m.onnx", "--calibrate", "calib.npy", "--batch", "4", "-o", "OUT",
               "-q", cwd=d, timeout=120)
    assert r.returncode == 0, r.stderr
    return d


def test_infer_refuses_to_overwrite_its_input(compiled):
    before = (compiled / "x.npy").read_bytes()
    r = tpuasm("infer", "OUT", "x.npy", "-o", "x.npy", cwd=compiled)
    assert r.returncode == 2 and "x.npy: cannot write: it is the input x.npy" in r.stderr
    assert (compiled / "x.npy").read_bytes() == before
    r = tpuasm("infer", "OUT", "x.npy", "-o", "OUT/segment0.host.npy", cwd=compiled)
    assert r.returncode == 2 and "it is the input" in r.stderr
    r = tpuasm("infer", "OUT", "x.npy", "-o", "y.npy", "-q", cwd=compiled)
    assert r.returncode == 0 and np.load(compiled / "y.npy").shape == (5, 8)


def test_special_files_to_compile_and_infer_are_named_at_once(compiled, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                       # nobody writes: reading it would block
    cases = [(("compile", "/dev/zero", "-o", tmp_path / "o"),
              "/dev/zero: ONNX model is a character device"),
             (("compile", "m.onnx", "--batch", "4", "--calibrate", "/dev/zero", "-o",
               tmp_path / "o"), "/dev/zero: calibration data is a character device"),
             (("compile", "m.onnx", "--batch", "4", "--calibrate", fifo, "-o", tmp_path / "o"),
              "calibration data is a FIFO"),
             (("infer", "OUT", fifo, "-o", tmp_path / "y.npy"), "input data is a FIFO")]
    for args, words in cases:
        r = tpuasm(*args, cwd=compiled, timeout=30)
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert "no such file" not in r.stderr and "pickle" not in r.stderr


@pytest.mark.parametrize("batch", ["1000000", "100000000000"])
def test_compile_batch_is_range_checked_before_allocating(compiled, batch, tmp_path):
    r = tpuasm("compile", "m.onnx", "--calibrate", "calib.npy", "--batch", batch, "-o",
               tmp_path / "o", cwd=compiled, timeout=30)
    assert r.returncode == 2 and "--batch: at most 65,536" in r.stderr


def test_compile_memory_budget_is_checked_before_reading_the_model(compiled, tmp_path):
    # the 2 GiB weight of the review, in miniature: a budget smaller than the model needs
    r = tpuasm("compile", "m.onnx", "--calibrate", "calib.npy", "--batch", "4", "-o",
               tmp_path / "o", cwd=compiled, env={"TPUASM_MEMORY_LIMIT": "4K"})
    assert r.returncode == 2 and "m.onnx: compiling this" in r.stderr
    assert "more than the 4.0 KiB" in r.stderr and not (tmp_path / "o").exists()
    from tpuasm import limits
    big = 2 * limits.GiB                 # the review's weight, on a 23 GiB machine
    with pytest.raises(limits.ResourceLimitError):
        limits.check_allocation("w", limits.compile_bytes(big), budget=16 * limits.GiB)


def _tampered(compiled, tmp_path, name, change):
    import shutil
    d = tmp_path / name
    shutil.copytree(compiled / "OUT", d)
    change(d)
    return d


def test_tampered_outdir_is_named_not_a_traceback(compiled, tmp_path):
    def manifest_list(d):
        (d / "manifest.json").write_text("[]")

    def huge_batch(d):
        m = json.loads((d / "manifest.json").read_text())
        m["batch"] = 10 ** 12
        (d / "manifest.json").write_text(json.dumps(m))

    def truncated_host(d):
        data = (d / "host0.onnx").read_bytes()
        (d / "host0.onnx").write_bytes(data[:50])

    def fifo_ir(d):
        (d / "segment0.ir.npz").unlink()
        os.mkfifo(d / "segment0.ir.npz")

    def zero_host(d):
        (d / "host0.onnx").unlink()
        os.symlink("/dev/zero", d / "host0.onnx")

    for change, words in ((manifest_list, "expected a JSON object, found list"),
                          (huge_batch, "batch 1000000000000 is not a whole number"),
                          (truncated_host, "host0.onnx: damaged host model"),
                          (fifo_ir, "segment0.ir.npz: a file of the compiled model is a FIFO"),
                          (zero_host, "host0.onnx: a file of the compiled model is a character")):
        d = _tampered(compiled, tmp_path, change.__name__, change)
        r = tpuasm("infer", d, "x.npy", "-o", tmp_path / "y.npy", cwd=compiled, timeout=30)
        assert r.returncode == 2 and words in r.stderr, (change.__name__, r.stderr)


def test_a_changed_file_or_manifest_of_outdir_is_refused_before_running(compiled, tmp_path):
    # a flipped weight byte would give a wrong answer without a word: the manifest's
    # digests refuse it; so is a manifest edited by hand (batch_axis None: other rows)
    def weight_byte(d):
        import numpy as np
        with np.load(d / "segment0.ir.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}
        w = arrays["op0.weight"]
        w.flat[0] = w.flat[0] ^ 1
        np.savez(d / "segment0.ir.npz", **arrays)

    def batch_axis(d):
        m = json.loads((d / "manifest.json").read_text())
        m["outputs"][0]["batch_axis"] = None
        (d / "manifest.json").write_text(json.dumps(m))

    def golden(d):                          # regression/ is rewritten by --update-golden
        for p in (d / "regression").rglob("test.toml"):
            p.write_text(p.read_text() + "\n# updated\n")

    for change, words in ((weight_byte, "segment0.ir.npz: damaged compiled model (the file "
                                        "changed after it was compiled); compile it again"),
                          (batch_axis, "manifest.json: damaged compiled model (the manifest "
                                       "was changed after it was written)"),
                          (golden, None)):
        d = _tampered(compiled, tmp_path, change.__name__, change)
        r = tpuasm("infer", d, "x.npy", "-o", tmp_path / "y.npy", cwd=compiled, timeout=60)
        if words is None:
            assert r.returncode == 0, r.stderr
        else:
            assert r.returncode == 2 and words in r.stderr, (change.__name__, r.stderr)


def test_outdir_manifest_structure_is_checked(compiled, tmp_path):
    # an OUTDIR without digests (written before them) is checked for its structure, then
    # refused: nothing vouches for its files (tests/test_outdir_legacy.py)
    def unsigned(edit):
        def change(d):
            m = json.loads((d / "manifest.json").read_text())
            del m["digest"], m["files"]
            edit(m)
            (d / "manifest.json").write_text(json.dumps(m))
        return change

    def shape_text(m):
        m["inputs"][0]["shape"] = ["16"]

    def unknown_value(m):
        m["steps"][1]["inputs"] = ["/dev/zero"]

    for edit, words in ((shape_text, "shape ['16'] is not a list of sizes"),
                        (unknown_value, "reads '/dev/zero', which nothing before it makes"),
                        (lambda m: None, "compiled by an older tpuasm")):
        d = _tampered(compiled, tmp_path, f"u{len(words)}", unsigned(edit))
        r = tpuasm("infer", d, "x.npy", "-o", tmp_path / "y.npy", cwd=compiled, timeout=60)
        assert r.returncode == 2 and words in r.stderr, r.stderr


def test_stale_temporary_folders_of_killed_compiles_are_removed(compiled, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()                                       # a pid that no longer runs
    out = tmp_path / "OUT"
    stale = [tmp_path / f".OUT.{dead.pid}.abc{i}.tmp" for i in range(10)]
    for s in stale:
        s.mkdir()
        (s / "manifest.json").write_text("{}")
    live = tmp_path / f".OUT.{os.getpid()}.live.tmp"   # a running process's: kept
    live.mkdir()
    other = tmp_path / ".OUT.notapid.tmp"              # not ours: kept
    other.mkdir()
    r = tpuasm("compile", "m.onnx", "--calibrate", "calib.npy", "--batch", "4", "-o", out,
               "-q", cwd=compiled, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not any(s.exists() for s in stale) and live.is_dir() and other.is_dir()
    assert (out / "manifest.json").is_file()


def test_kill_9_during_compile_leaves_nothing_for_the_next_one(compiled, tmp_path):
    out = tmp_path / "OUT"
    proc = subprocess.Popen([sys.executable, "-m", "tpuasm", "compile", "m.onnx",
                             "--calibrate", "calib.npy", "--batch", "4", "-o", str(out), "-q"],
                            cwd=compiled, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and not any(
            p.name.endswith(".tmp") for p in tmp_path.iterdir()):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    r = tpuasm("compile", "m.onnx", "--calibrate", "calib.npy", "--batch", "4", "-o", out,
               "-q", cwd=compiled, timeout=120)
    assert r.returncode == 0 and (out / "manifest.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["OUT"]


# ------------------------------------------------------------------ bounded readers
def test_fmt_refuses_special_files_and_bounds_stdin(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = tpuasm("fmt", fifo, "/dev/zero", "/dev/urandom", timeout=20)
    assert r.returncode == 2
    assert "fifo: source file is a FIFO" in r.stderr
    assert "/dev/zero: source file is a character device" in r.stderr
    assert "/dev/urandom: source file is a character device" in r.stderr
    r = tpuasm("fmt", "--check", "/dev/zero", timeout=20)
    assert r.returncode == 2 and "character device" in r.stderr
    with open("/dev/zero", "rb") as zero:           # `cat /dev/zero | tpuasm fmt -`
        r = tpuasm("fmt", "-", stdin=zero, timeout=60)
    assert r.returncode == 2 and "standard input is larger than the 64.0 MiB limit" in r.stderr


def test_sweep_grid_from_a_fifo_or_device_is_refused(tiny):
    os.mkfifo(tiny / "grid.toml")
    for grid in ("grid.toml", "/dev/zero"):
        r = tpuasm("sweep", "p.tasm", "--host", "x.npy", "--weights", "w.npy", "--workers",
                   "0", "--grid", grid, "-o", "r.csv", cwd=tiny, timeout=20)
        assert r.returncode == 2 and "grid file is a" in r.stderr


def test_language_server_include_of_a_fifo_or_device(tmp_path):
    from lsp_client import LspClient
    from pygls.uris import from_fs_path
    os.mkfifo(tmp_path / "pipe.tasm")
    text = '.include "pipe.tasm"\n.include "/dev/zero"\nHLT\n'
    client = LspClient("--debounce", "0.05")
    try:
        client.initialize(from_fs_path(str(tmp_path)))
        uri = from_fs_path(str(tmp_path / "main.tasm"))
        client.open(uri, text)
        messages = [d["message"] for d in client.diagnostics(uri)]
    finally:
        assert client.close() == 0
    assert any("is a FIFO" in m for m in messages), messages
    assert any("/dev/zero" in m and "character device" in m for m in messages), messages


def test_language_server_survives_a_huge_content_length():
    from lsp_client import LspClient
    client = LspClient()
    # the client claims 99,999,999,999 bytes and sends a small body: the server must not
    # allocate what is claimed; it reads on (bounded) and ends when the client goes away
    client.proc.stdin.write(b"Content-Length: 99999999999\r\n\r\n" + b"{}" * 1000)
    client.proc.stdin.close()
    code = client.proc.wait(timeout=20)
    err = client.proc.stderr.read().decode()
    client.proc.stdout.close()
    client.proc.stderr.close()
    assert "MemoryError" not in err and "Traceback" not in err, err
    assert "over the" in err and code == 0


def test_language_server_logs_a_bad_frame_in_one_line():
    def frame(body: bytes) -> bytes:
        return b"Content-Length: %d\r\n\r\n" % len(body) + body
    init = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                       "params": {"processId": None, "rootUri": None, "capabilities": {}}})
    list_id = json.dumps({"jsonrpc": "2.0", "id": [1], "method": "textDocument/hover",
                          "params": {"textDocument": {"uri": "file:///x.tasm"},
                                     "position": {"line": 0, "character": 0}}})
    big = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "textDocument/hover",
                      "params": {"textDocument": {"uri": "file:///x.tasm"},
                                 "position": {"line": 2 ** 31, "character": 0}}})
    session = b"".join(frame(m.encode()) for m in (init, "{bad json", list_id, big)) + \
        frame(b'{"jsonrpc": "2.0", "id": 3, "method": "shutdown"}') + \
        frame(b'{"jsonrpc": "2.0", "method": "exit"}')
    r = subprocess.run([sys.executable, "-m", "tpuasm", "lsp"], input=session,
                       capture_output=True, timeout=60)
    err = r.stderr.decode()
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and all(line.startswith("tpuasm lsp: ") for line in lines), err
    assert any("JSONDecodeError" in line for line in lines), err
    assert b'"id": 3' in r.stdout or b'"id":3' in r.stdout      # it answered the shutdown


def test_bounded_input_drops_an_oversized_message_and_stays_in_step():
    import io

    from tpuasm.lsp.frames import MAX_MESSAGE_BYTES, BoundedInput
    body = b"x" * (MAX_MESSAGE_BYTES + 1)
    stream = BoundedInput(io.BytesIO(body + b"next"), log=lambda text: None)
    assert stream.read(len(body)) == b"{}" and stream.read(4) == b"next"
    long_header = BoundedInput(io.BytesIO(b"H" * 100_000 + b"\r\n"), log=lambda t: None)
    assert len(long_header.readline()) <= 8 * 1024


# ------------------------------------------------------------------ the command layer
def test_asm_of_a_folder_is_a_clear_error():
    for folder in (".", "/"):
        r = tpuasm("asm", folder, cwd=ROOT / "programs")
        assert r.returncode == 2 and f"{folder}: source file is a directory" in r.stderr


def test_fmt_diff_into_head_exits_quietly(tmp_path):
    src = tmp_path / "many.tasm"
    src.write_text("  MMC.S 0,0,1 ; x\n" * 20000)
    cmd = f"{sys.executable} -m tpuasm fmt --diff {src} | head -3"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                       timeout=60)
    assert len(r.stdout.splitlines()) == 3
    assert r.stderr == "" and r.returncode == 141      # 128 + SIGPIPE, no traceback


def test_figure11_ctrl_c_is_a_clean_exit_130(tmp_path):
    # SIGINT as a terminal's Ctrl-C finds it (a run started in the background of a script
    # inherits it ignored), and all six apps (about 100 s of points: MLP0's alone can all
    # finish within the 0.3 s before the signal); else the sweep finishes and exits 0
    proc = subprocess.Popen([sys.executable, "-m", "tpuasm.apps.figure11", "--workers", "0",
                             "--out", str(tmp_path / "fig"), "--cache",
                             str(tmp_path / "c.sqlite")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30          # the sweep has started: its cache exists
    while not (tmp_path / "c.sqlite").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().endswith("interrupted")
    assert not (tmp_path / "fig.csv").exists()


def test_exit_statuses_are_defined_once():
    """No face defines its own numbers: they all come from tpuasm/command.py."""
    import re
    pattern = re.compile(r"^\s*EXIT_\w+(\s*,\s*EXIT_\w+)*\s*=\s*\d", re.M)
    owners = [p for p in (ROOT / "tpuasm").rglob("*.py") if pattern.search(p.read_text())]
    assert owners == [ROOT / "tpuasm" / "command.py"], owners


def test_run_face_turns_every_ending_into_a_status(capsys):
    from tpuasm.command import run_face
    from tpuasm.errors import TpuasmError

    def raises(error):
        def face(argv):
            raise error
        return face

    assert run_face(raises(TpuasmError("bad input")), []) == 2
    assert run_face(raises(MemoryError()), []) == 2
    assert run_face(raises(KeyboardInterrupt()), []) == 130
    err = capsys.readouterr().err
    assert "error: bad input" in err and "out of memory" in err and "interrupted" in err
    assert run_face(lambda argv: 1, []) == 1 and run_face(lambda argv: None, []) == 0


# ------------------------------------------------------------------ fmt and positions
def test_fmt_keeps_the_columns_of_the_negative_library(tmp_path):
    import shutil
    lib = tmp_path / "negative"
    shutil.copytree(ROOT / "programs" / "negative", lib)
    r = tpuasm("fmt", *sorted(lib.rglob("*.tasm")), timeout=60)
    assert r.returncode == 0, r.stderr
    overlap = (lib / "asm_region_overlap" / "asm_region_overlap.tasm").read_text()
    assert ".ub     b, 10, 0x105" in overlap          # the error's line kept as written
    r = tpuasm("test", lib, "-q", "-j", "1", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
