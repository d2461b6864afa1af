"""Fuzz target `debug`: the debugger's command line, `tpuasm debug PROGRAM [options]
--batch SCRIPT`, with mutated arguments and scripts.

A case is JSON: the argument list, with placeholders for the worker's files (a program as
.tasm and .tbin, host and weight images, a compiled model, special files), and the
script's text.  Promises checked (besides exit 0/1/2 and no traceback): no input changes,
and no file is written except the --screenshot the case asked for.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import sys
from pathlib import Path

_PROGRAM = ".config array_size=8\n.host y, 4\nRHM 0, 0, 1\nRW 0\nMMC.S 0, 0, 1\n" \
    "ACT 0, 1, 1\nWHM 1, 1, 1\nHLT\n"
# Placeholders the worker replaces by paths in its folder.
_PROGRAMS = ["@tasm", "@tasm", "@tbin", "@outdir", "@missing", "@dir", "@empty", "@junk",
             "@fifo", "/dev/zero", "@host", ""]
_ARRAYS = ["@host", "@weights", "@missing", "@junk", "@fifo", "@tasm", "@bighost",
           "@weights3", "/dev/null", "@dir", "@x"]
_SIZES = ["80x24", "1x1", "0x0", "-5x10", "x", "100000x100000", "170x50", "20x", "3x4x5"]
_CONFIGS = ["array_size=8", "array_size=16", "array_size=0", "ub_rows=1", "acc_rows=2",
            "fifo_depth=0", "profile=opentpu", "hazards=interlock", "timing=bogus", "bogus=1",
            "array_size=8,ub_rows=99999999999", "=", "x", "array_size=1e9"]


def _script(rng: random.Random) -> str:
    from targets import gen_batch, _mutate_bytes
    text = gen_batch(rng).decode()
    if rng.random() < 0.3:
        text += "\n" + rng.choice(["segment nope", "segment", "segment 0", "quit", "q",
                                   "break 99999999", "watch ub[0]", "run", "until 99999999",
                                   "set ub[0] = 3", "help", "info nodes"])
    if rng.random() < 0.1:
        text = _mutate_bytes(rng, text.encode(), 3).decode("utf-8", "replace")
    return text


def gen_debug(rng: random.Random) -> bytes:
    args = [rng.choice(_PROGRAMS)]
    options = [
        lambda: ["--host", rng.choice(_ARRAYS)],
        lambda: ["--weights", rng.choice(_ARRAYS)],
        lambda: ["--input", rng.choice(_ARRAYS)],
        lambda: ["--segment", rng.choice(["seg0", "tpu0", "", "nope", "0", "host0"])],
        lambda: ["--config", rng.choice(_CONFIGS)],
        lambda: ["--size", rng.choice(_SIZES)],
        lambda: ["--batch", rng.choice(["@script"] * 6 + ["-", "@missing", "@dir", "@fifo",
                                                         "/dev/zero", "@host"])],
    ]
    for _ in range(rng.randint(0, 4)):
        args += rng.choice(options)()
    if rng.random() < 0.05:                     # a usage error
        args.insert(rng.randrange(len(args) + 1),
                    rng.choice(["--bogus", "-x", "--batch", "--host"]))
    if "--batch" not in args or rng.random() < 0.5:
        args += ["--batch", "@script"]
    if rng.random() < 0.04:                     # Textual's headless screen: rarely (slow)
        args += ["--screenshot", rng.choice(["@shot", "@shot", "@missing/x.svg", "@dir",
                                             "@tasm"])]
    if rng.random() < 0.03:
        rng.shuffle(args)
    return json.dumps({"args": args, "script": _script(rng)}).encode()


_FILES: dict[str, str] | None = None


def _files(tmp: Path) -> dict[str, str]:
    """The worker's fixed files (made once; the target checks each case leaves them)."""
    global _FILES
    if _FILES is None or not Path(_FILES["@tasm"]).exists():
        import numpy as np
        from targets import _compiled_model
        from tpuasm.cli import main
        d = tmp / "debug"
        d.mkdir(exist_ok=True)
        (d / "p.tasm").write_text(_PROGRAM)
        with contextlib.redirect_stdout(io.StringIO()):
            main(["asm", str(d / "p.tasm"), "-o", str(d / "p.tbin")])
        np.save(d / "host.npy", np.arange(32, dtype=np.int8).reshape(4, 8))
        np.save(d / "bighost.npy", np.zeros((5000, 8), np.int8))
        np.save(d / "weights.npy", np.ones((2, 8, 8), np.int8))
        np.save(d / "weights3.npy", np.ones((2, 8), np.float32))
        np.save(d / "x.npy", np.zeros((4, 16), np.float32))
        (d / "empty.tasm").write_bytes(b"")
        (d / "junk.npy").write_bytes(b"\x93NUMPY\x01\x00junk")
        (d / "sub").mkdir(exist_ok=True)
        if not (d / "fifo").exists():
            os.mkfifo(d / "fifo")
        _FILES = {"@tasm": str(d / "p.tasm"), "@tbin": str(d / "p.tbin"),
                  "@outdir": str(_compiled_model()), "@missing": str(d / "nope" / "x"),
                  "@dir": str(d / "sub"), "@empty": str(d / "empty.tasm"),
                  "@junk": str(d / "junk.npy"), "@fifo": str(d / "fifo"),
                  "@host": str(d / "host.npy"), "@bighost": str(d / "bighost.npy"),
                  "@weights": str(d / "weights.npy"), "@weights3": str(d / "weights3.npy"),
                  "@x": str(d / "x.npy"), "@script": str(d / "script.txt"),
                  "@shot": str(d / "shot.svg")}
    return _FILES


def _snapshot(folders) -> dict[str, tuple]:
    out = {}
    for folder in folders:
        for root, dirs, names in os.walk(folder):
            for n in names + dirs:
                p = os.path.join(root, n)
                st = os.lstat(p)
                out[p] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def run_debug(case: bytes, tmp: Path) -> int:
    from tpuasm.cli import main
    spec = json.loads(case)
    files = _files(tmp)
    Path(files["@script"]).write_text(spec["script"], encoding="utf-8",
                                      errors="surrogatepass")
    Path(files["@shot"]).unlink(missing_ok=True)
    args = []
    for a in spec["args"]:
        for key in sorted(files, key=len, reverse=True):
            if a.startswith(key):
                a = files[key] + a[len(key):]
                break
        args.append(a)
    asked = {args[i + 1] for i, a in enumerate(args[:-1]) if a == "--screenshot"}
    folders = [Path(files["@tasm"]).parent, files["@outdir"]]
    before = _snapshot(folders)
    stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(spec["script"].encode("utf-8", "replace")))
    try:
        code = main(["debug", *args])
    finally:
        sys.stdin = stdin
    after = _snapshot(folders)
    changed = sorted(p for p in set(before) | set(after)
                     if before.get(p) != after.get(p) and p not in asked)
    assert not changed, f"debug wrote or changed files it was not asked to: {changed}"
    return code


def warm_cases() -> list[bytes]:
    script = "step\nnext\ncontinue\nx/4d ub[0]\nprint cycle\ninfo pipeline\n"
    return [json.dumps({"args": [p, "--batch", "@script"], "script": script}).encode()
            for p in ("@tasm", "@tbin", "@outdir")]
