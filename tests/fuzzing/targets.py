"""Fuzz targets: for each input kind, a generator of hostile inputs and the run of one.

    gen(rng) -> bytes           one case, from a seed corpus (programs/) and mutations
    run(case, tmp) -> int       feed it to the tool, in the worker process; the exit code

Every target goes through the faces a user meets (the `tpuasm` command line, the
regression runner's command, the debugger's batch engine), so what is checked is what a
user would see: a documented exit code, no traceback, no "internal error".  The worker
(worker.py) runs `run` under CPU and memory limits; the harness checks the result.
"""
from __future__ import annotations

import json
import os
import random
import struct
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "programs"

# ------------------------------------------------------------------ shared pieces
FRAGMENTS = [
    "MMC", ".SO", "ACT.R", "ACT.A", "RHM", "WHM", "RHMA", "CFG", "act_shift", "pool_size", "RW",
    "VADD", "VMUL", ".UBL", ".B", "vec_shift", "vec_mult_b", "vec_zero_c", "act_table",
    "HLT", "NOP", "SYNC", "INT", "TAG", "repeat=", "len=", "length=", ".equ", ".ub", ".acc",
    ".host", ".tile", ".config", "array_size=", "ub_rows=", "acc_rows=", "fifo_depth=",
    "profile=", '"opentpu"', ".rept", ".endr", ".macro", ".endm", ".include", '"x.tasm"',
    '"/dev/zero"', '"."', '"fifo"', "\\a", "ub.", "M", "A", "B", "i", "0x", "0b1", "1_0",
    "99999999999", "4096", "16777216", "4294967295", "1<<256", "-", "+", "*", "/", "%", "<<",
    ">>", "&", "|", "^", "~", "(", ")", ",", "=", " ", "\t", "\n", ";", "#", "0", "1", "7",
    "1000", "\r\n", "\\", "$", "é", ":", "l:", "\x00",
]
BIG_INTS = [0, 1, -1, 2, 7, 8, 16, 255, 256, 4096, 65535, 1 << 24, 1 << 31, (1 << 32) - 1,
            1 << 32, 1 << 40, 1 << 62, (1 << 63) - 1, -(1 << 63), 10 ** 11, 10 ** 20]


def _seed_sources() -> list[str]:
    out = []
    for p in sorted(PROGRAMS.rglob("*.tasm")) + sorted(PROGRAMS.rglob("*.a")):
        text = p.read_text(encoding="utf-8", errors="replace")
        if len(text) < 20000:
            out.append(text)
    return out or ["HLT\n"]


_SOURCES: list[str] | None = None


def sources() -> list[str]:
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = _seed_sources()
    return _SOURCES


def _mutate_bytes(rng: random.Random, data: bytes, rounds: int = 4) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, rounds)):
        op = rng.randrange(6)
        if op == 0 and b:                                   # flip bits
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:                                 # set a byte to an edge value
            b[rng.randrange(len(b))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif op == 2 and b:                                 # truncate
            del b[rng.randrange(len(b)):]
        elif op == 3:                                       # append junk
            b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        elif op == 4 and len(b) >= 4:                       # an edge-value u32 somewhere
            i = rng.randrange(len(b) - 3)
            b[i:i + 4] = struct.pack("<I", rng.choice((0, 1, 0xFFFFFFFF, 0x7FFFFFFF,
                                                        rng.getrandbits(32))))
        elif op == 5 and len(b) > 8:                        # splice a chunk elsewhere
            i, j = sorted(rng.randrange(len(b)) for _ in range(2))
            k = rng.randrange(len(b))
            b[k:k] = b[i:j][:512]
    return bytes(b)


# ------------------------------------------------------------------ assembler text
def _fragment_soup(rng, n) -> str:
    return "".join(rng.choice(FRAGMENTS) for _ in range(n))


def _pathological(rng) -> str:
    """The shapes of issue 14's rows 1-5, with random sizes."""
    kind = rng.randrange(8)
    if kind == 0:                       # .equ growth chains
        op = rng.choice(["*", "<<", "+"])
        lines = [f".equ A0, 1<<{rng.choice([64, 200, 256])}"]
        rhs = {"*": "A{i}*A{i}", "<<": "A{i}<<256", "+": "A{i}+A{i}"}[op]
        lines += [f".equ A{i + 1}, " + rhs.format(i=i) for i in range(rng.randint(1, 60))]
        return "\n".join(lines) + f"\nINT A{len(lines) - 1} & 0xff\nHLT\n"
    if kind == 1:                       # nested .rept
        depth = rng.randint(1, 5)
        counts = [rng.choice([0, 1, 10, 1000, 999999, 1000000]) for _ in range(depth)]
        body = rng.choice(["NOP", "", "NOP\nNOP", "l:"])
        text = "".join(f".rept {c}\n" for c in counts) + body + "\n" + ".endr\n" * depth
        return text + "HLT\n"
    if kind == 2:                       # many bad lines
        word = rng.choice(["FROB", "@@@", "MMC 1,", "RHM ((", ".bogus"])
        return (word + "\n") * rng.randint(100, 5000)
    if kind == 3:                       # one long line
        return rng.choice(["X", "MMC ", "(", "1+"]) * rng.randint(1000, 60000) + "\n"
    if kind == 4:                       # special files as includes
        target = rng.choice(["/dev/zero", "/dev/null", ".", "/", "fifo", "/proc/self/mem",
                             "/nonexistent/x", "case.tasm", ""])
        return f'.include "{target}"\nHLT\n'
    if kind == 5:                       # a big machine shape
        return (f".config array_size={rng.choice(BIG_INTS[:12])}, "
                f"ub_rows={rng.choice(BIG_INTS)}, acc_rows={rng.choice(BIG_INTS)}\nHLT\n")
    if kind == 6:                       # deep nesting
        d = rng.randint(10, 3000)
        return "INT " + "(" * d + "1" + ")" * d + "\nHLT\n"
    return ".macro m\nm\n.endm\n" + "m\n" * rng.randint(1, 5)


def gen_asm(rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.15:
        return _pathological(rng).encode()
    if r < 0.35:
        return _fragment_soup(rng, rng.randint(1, 120)).encode()
    if r < 0.40:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    lines = rng.choice(sources()).split("\n")
    for _ in range(rng.randint(1, 8)):
        if not lines:
            lines = [""]
        op = rng.randrange(5)
        i = rng.randrange(len(lines))
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, _fragment_soup(rng, rng.randint(1, 10)))
        elif op == 2:
            words = lines[i].split(" ")
            words[rng.randrange(len(words))] = rng.choice(FRAGMENTS + [str(x) for x in BIG_INTS])
            lines[i] = " ".join(words)
        elif op == 3:
            lines.insert(i, lines[rng.randrange(len(lines))])
        else:
            lines[i] = _mutate_bytes(rng, lines[i].encode(), 2).decode("utf-8", "replace")
    return "\n".join(lines).encode("utf-8", "surrogatepass")


def run_asm(case: bytes, tmp: Path) -> int:
    from tpuasm.cli import main
    src = tmp / "case.tasm"
    src.write_bytes(case)
    return main(["asm", str(src), "-o", str(tmp / "out.tbin"), "--listing", str(tmp / "l.txt"),
                 "--symbols", str(tmp / "s.txt")])


# ------------------------------------------------------------------ .tbin binaries
_TBIN_SEEDS: list[bytes] | None = None


def tbin_seeds() -> list[bytes]:
    global _TBIN_SEEDS
    if _TBIN_SEEDS is None:
        from tpuasm.assembler import assemble
        from tpuasm.errors import TpuasmError
        out = []
        for text in sources():
            try:
                p = assemble(text, "seed.tasm")
            except TpuasmError:
                continue
            out.append(p.to_bytes())
            out.append(p.stripped().to_bytes())
        _TBIN_SEEDS = [b for b in out if len(b) < 200_000] or [b"TBIN"]
    return _TBIN_SEEDS


def _fix_crc(b: bytes) -> bytes:
    if len(b) < 12 or b[:4] != b"TBIN":
        return b
    return b[:8] + struct.pack("<I", zlib.crc32(b[12:])) + b[12:]


def gen_tbin(rng: random.Random) -> bytes:
    b = bytearray(rng.choice(tbin_seeds()))
    r = rng.random()
    if r < 0.3 and len(b) >= 24:          # the machine shape in the header
        fields = list(struct.unpack_from("<IIIHH", b, 12))
        k = rng.randrange(5)
        limit = (1 << 32) - 1 if k < 3 else 0xFFFF
        fields[k] = rng.choice(BIG_INTS) & limit if rng.random() < 0.8 \
            else rng.randrange(limit + 1)
        struct.pack_into("<IIIHH", b, 12, *fields)
    elif r < 0.5 and len(b) > 40:         # a section table entry
        n = struct.unpack_from("<H", b, 6)[0]
        if n:
            at = 28 + 12 * rng.randrange(n) + rng.choice((4, 8))
            if at + 4 <= len(b):
                struct.pack_into("<I", b, at, rng.choice((0, 1, 0xFFFFFFFF, len(b),
                                                          rng.getrandbits(32))))
    else:
        b = bytearray(_mutate_bytes(rng, bytes(b)))
    out = bytes(b)
    return _fix_crc(out) if rng.random() < 0.85 else out     # mostly get past the checksum


def run_tbin(case: bytes, tmp: Path) -> int:
    from tpuasm.cli import main
    p = tmp / "case.tbin"
    p.write_bytes(case)
    code = main(["disasm", str(p), "-o", str(tmp / "d.tasm")])
    if code != 0:
        return code
    return main(["run", str(p), "--max-cycles", "20000", "-q"])


# ------------------------------------------------------------------ OpenTPU binaries
def gen_opentpu(rng: random.Random) -> bytes:
    words = []
    for _ in range(rng.randint(1, 40)):
        if rng.random() < 0.8:
            opcode = rng.randrange(8)
            flags = rng.choice((0, 0, 1, 4, 5, 8, 0x10, 0x18, 2, rng.randrange(256)))
            length = rng.choice((0, 1, 2, 8, 255, rng.randrange(256)))
            addr = rng.choice((0, 1, 8, 1 << 32, (1 << 64) - 1, rng.getrandbits(64)))
            ub = rng.choice((0, 1, 8, (1 << 24) - 1, rng.getrandbits(24)))
            w = (opcode << 104) | (flags << 96) | (length << 88) | (addr << 24) | ub
            words.append(w.to_bytes(14, "big"))
        else:
            words.append(bytes(rng.randrange(256) for _ in range(14)))
    data = b"".join(words)
    if rng.random() < 0.1:
        data = _mutate_bytes(rng, data)
    return data


def run_opentpu(case: bytes, tmp: Path) -> int:
    from tpuasm.cli import main
    p = tmp / "case.out"
    p.write_bytes(case)
    code = main(["disasm", str(p), "--format", "opentpu", "-o", str(tmp / "d.a")])
    if code != 0:
        return code
    return main(["run", str(p), "--format", "opentpu", "--max-cycles", "20000", "-q"])


# ------------------------------------------------------------------ .npy images
def _npy(header: str, data: bytes, version: bytes = b"\x01\x00") -> bytes:
    text = header + " " * (64 - (10 + len(header) + 1) % 64) + "\n"
    size = len(text).to_bytes(2 if version == b"\x01\x00" else 4, "little")
    return b"\x93NUMPY" + version + size + text.encode("latin1") + data


def gen_npy(rng: random.Random) -> bytes:
    descr = rng.choice(["|i1", "|u1", "|i1", "|u1", "<f8", "|O", "<i4", "<U99999999",
                        "[('a', '|O')]", "|V0", "x", "'"])
    ndim = rng.choice((2, 2, 3, 3, 1, 0, 4))
    dims = [rng.choice((0, 1, 2, 8, 8, 8, 16, 5000, -1, 1 << 40, 1 << 62, 10 ** 30))
            for _ in range(ndim)]
    shape = "(" + ", ".join(map(str, dims)) + ("," if ndim == 1 else "") + ")"
    fortran = rng.choice(("False", "False", "True", "0", "'x'"))
    q = "'" if not descr.startswith("[") else ""
    header = f"{{'descr': {q}{descr}{q}, 'fortran_order': {fortran}, 'shape': {shape}, }}"
    count = 1
    for d in dims:
        count *= max(d, 0)
    size = min(count, 4096) if rng.random() < 0.8 else rng.randrange(200)
    data = _npy(header, bytes(rng.randrange(256) for _ in range(size)),
                rng.choice((b"\x01\x00", b"\x01\x00", b"\x02\x00", b"\x03\x00", b"\x09\x09")))
    r = rng.random()
    if r < 0.15:
        data = _mutate_bytes(rng, data)
    elif r < 0.2:
        data = rng.choice([b"", b"PK\x03\x04" + os.urandom(40), os.urandom(rng.randrange(300))])
    return bytes([rng.randrange(3)]) + data          # first byte: which option gets it


_TINY = "RHM 0, 0, 1\nRW 0\nMMC.S 0, 0, 1\nACT 0, 1, 1\nWHM 1, 1, 1\nHLT\n"


def run_npy(case: bytes, tmp: Path) -> int:
    from tpuasm.cli import main
    which, data = case[0] % 3, case[1:]
    prog = tmp / "tiny.tasm"
    prog.write_text(".config array_size=8\n" + _TINY if which < 2 else _TINY)
    p = tmp / "case.npy"
    p.write_bytes(data)
    ok_host = tmp / "ok_host.npy"
    ok_w = tmp / "ok_w.npy"
    if not ok_host.exists():
        import numpy as np
        np.save(ok_host, np.zeros((4, 8), np.int8))
        np.save(ok_w, np.zeros((2, 8, 8), np.int8))
    if which == 0:
        args = ["--host", str(p), "--weights", str(ok_w)]
    elif which == 1:
        args = ["--host", str(ok_host), "--weights", str(p)]
    else:
        args = ["--profile", "opentpu", "--weights", str(p)]
    return main(["run", str(prog), *args, "--max-cycles", "20000", "-q",
                 "--out", str(tmp / "o.npy")])


# ------------------------------------------------------------------ manifests
_MANIFEST_KEYS = {
    "test": ["program", "name", "description", "tags", "max_cycles"],
    "machine": ["array_size", "ub_rows", "acc_rows", "fifo_depth", "profile", "hazards",
                "timing", "clock_hz", "host_latency_cycles", "shift_cycles", "bogus"],
    "data": ["host", "weights", "host_rows", "weight_tiles", "generator"],
    "expect": ["status", "cycles"],
    "expect.fault": ["kind", "message", "index", "line"],
    "expect.assembly_error": ["message", "line", "col", "file"],
    "golden": ["cycles", "tolerance"],
}


def _toml_value(rng) -> str:
    return rng.choice([
        str(rng.choice(BIG_INTS)), "9223372036854775807", "-9223372036854775808", "inf", "nan",
        "-1.5", "1e300", '"x"', '"prog.tasm"', '"e.npy"', '"../../etc/passwd"', "true",
        "[1, 2]", '["a"]', "{ min = 1, max = 0 }", "{ min = 10 }", "[]", '"halted"', '"fault"',
        '"address"', '"tpu"', '"opentpu"', '"error"', '"/dev/zero"', "2000-01-01"])


def gen_manifest(rng: random.Random) -> bytes:
    lines = ['[test]', 'program = "prog.tasm"']
    for table, keys in _MANIFEST_KEYS.items():
        if table != "test" and rng.random() < 0.5:
            continue
        if table != "test":
            lines.append(f"[{table}]")
        for key in rng.sample(keys, rng.randint(0, min(3, len(keys)))):
            if table == "test" and key == "program":
                continue
            lines.append(f"{key} = {_toml_value(rng)}")
    if rng.random() < 0.3:
        memory = rng.choice(["host", "ub", "acc"])
        lines += ["[[expect.rows]]", 'expected = "e.npy"',
                  f"start = {rng.choice(BIG_INTS[:8])}", f'memory = "{memory}"']
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.2:
        text = _mutate_bytes(rng, text.encode(), 3).decode("utf-8", "replace")
    expected = gen_npy(rng)[1:] if rng.random() < 0.5 else b""
    return len(text.encode()).to_bytes(4, "little") + text.encode() + expected


def run_manifest(case: bytes, tmp: Path) -> int:
    from tpuasm.regression import main
    n = int.from_bytes(case[:4], "little")
    d = tmp / "m"
    d.mkdir(exist_ok=True)
    (d / "test.toml").write_bytes(case[4:4 + n])
    (d / "prog.tasm").write_text(".config array_size=8\n" + _TINY)
    (d / "e.npy").write_bytes(case[4 + n:])
    return main([str(d / "test.toml"), "-j", "1", "-q"])


# ------------------------------------------------------------------ debugger batch scripts
_NUMS = ["0", "1", "-5", "3", "999999999", "4294967296", "-1", "1e3", "0x10", "x", ""]
_EXPRS = ["ub[0]", "acc[4][0:8]", "cycle", "act_shift", "ub[-1]", "ub[0:99999999]",
          "acc[1e9]", "host[0]", "1/0", "((((1))))", "ub[0] == 3", "pc", "y", "*"]


def gen_batch(rng: random.Random) -> bytes:
    from debugger.commands import COMMANDS
    names = [c.names[0] for c in COMMANDS]
    lines = []
    for _ in range(rng.randint(1, 12)):
        cmd = rng.choice(names + ["x/999999999d", "x/0d", "x/16x", "x/-3w", "x/99999999999999b",
                                  "bogus", "#"])
        args = [rng.choice(_NUMS + _EXPRS) for _ in range(rng.randint(0, 3))]
        lines.append(" ".join([cmd] + args))
    return "\n".join(lines).encode()


_SESSION_PROGRAM = None


def run_batch(case: bytes, tmp: Path) -> int:
    import io
    from debugger.batch import run_batch as batch
    from debugger.session import Session
    global _SESSION_PROGRAM
    if _SESSION_PROGRAM is None:
        from tpuasm.assembler import assemble
        _SESSION_PROGRAM = assemble(".config array_size=8\n.host y, 4\n" + _TINY, "b.tasm")
    import numpy as np
    session = Session(_SESSION_PROGRAM, host=np.zeros((4, 8), np.int8),
                      weights=np.zeros((2, 8, 8), np.int8), source_name="b.tasm")
    return batch(session, case.decode("utf-8", "replace"), name="fuzz", out=io.StringIO())


# ------------------------------------------------------------------ tpuasm fmt
def gen_fmt(rng: random.Random) -> bytes:
    """Assembler text in any file convention: BOM or not, LF, CRLF, CR or a mix."""
    text = gen_asm(rng)
    r = rng.random()
    if r < 0.3:
        text = text.replace(b"\n", b"\r\n")
    elif r < 0.4:
        text = text.replace(b"\n", b"\r")
    elif r < 0.5:
        text = b"".join(line + rng.choice((b"\n", b"\r\n", b"\r"))
                        for line in text.split(b"\n"))
    return (b"\xef\xbb\xbf" if rng.random() < 0.2 else b"") + text


def _assembled(path: Path):
    """What the assembler makes of a file: its code, shape and symbols, or its errors'
    messages, lines and columns."""
    from tpuasm.assembler import assemble, decode_source
    from tpuasm.errors import AssemblyError, TpuasmError
    try:
        p = assemble(decode_source(path.read_bytes(), str(path)), str(path))
    except AssemblyError as e:
        return sorted((d.line, d.col, d.message) for d in e.diagnostics)
    except TpuasmError as e:
        return str(e)
    return p.stripped().to_bytes(), sorted((s.name, s.kind, s.value, s.size) for s in p.symbols)


def run_fmt(case: bytes, tmp: Path) -> int:
    """`tpuasm fmt FILE`, then the promises: the same code (or the same errors at the same
    places), the BOM and line ending kept, and a second `fmt --check` content."""
    from tpuasm.cli import main
    from tpuasm.fmt import line_ending
    src = tmp / "case.tasm"
    src.write_bytes(case)
    # assembling before and after doubles the work; cases the budget makes slow are
    # checked for their exit code and output only
    judge = len(case) < 20_000 and b".rept" not in case and b".macro" not in case \
        and b".include" not in case
    before = _assembled(src) if judge else None
    code = main(["fmt", str(src)])
    if code != 0:
        return code
    after = src.read_bytes()
    assert after.startswith(b"\xef\xbb\xbf") == case.startswith(b"\xef\xbb\xbf"), "BOM"
    assert b"\n" not in after.replace(b"\r\n", b"") or line_ending(case) != "\r\n", "CRLF"
    assert main(["fmt", "--check", str(src)]) == 0, "formatting is not idempotent"
    if judge:
        assert _assembled(src) == before, "fmt changed what the program assembles to"
    return code


# ------------------------------------------------------------------ infer, tampered OUTDIR
_HOSTILE = [None, True, -1, 0, 1, 2 ** 31, 10 ** 12, 2 ** 63, -(2 ** 63), 1e308, 0.5, "",
            "x", "../../../etc/passwd", "/dev/zero", ".", [], {}, [[]], [None], {"a": 1},
            "manifest.json", "host0.onnx", [1, 2, 3], [-1], [10 ** 12]]


def gen_infer(rng: random.Random) -> bytes:
    """A tampering of the compiled model (by file index; the worker holds the model)."""
    op = rng.choice(["json", "json", "json", "flip", "truncate", "empty", "junk", "delete",
                     "fifo", "dev", "dir", "symlink_out", "extra"])
    return json.dumps({"op": op, "file": rng.randrange(64), "seed": rng.getrandbits(32),
                       "rows": rng.choice((0, 1, 3, 5, 9))}).encode()


_OUTDIR: Path | None = None
LEGACY_OUTDIRS = os.environ.get("FUZZ_INFER_LEGACY") == "1"


def _compiled_model() -> Path:
    """A tiny compiled model (Gemm 16 -> 8, ReLU, batch 4), built once per worker."""
    global _OUTDIR
    if _OUTDIR is None or not _OUTDIR.exists():
        import sys
        import tempfile
        import numpy as np
        sys.path.insert(0, str(ROOT / "tests"))
        import float_models
        from tpuasm.compiler.pipeline import compile_model
        d = Path(tempfile.mkdtemp(prefix="fuzz-model-"))
        float_models.save(float_models.build([("gemm", 8), ("relu",)], (16,)), d / "m.onnx")
        calib = np.random.default_rng(0).normal(0, 1, (20, 16)).astype(np.float32)
        compile_model(d / "m.onnx", batch=4, calibration=calib).save(d / "OUT")
        _OUTDIR = d / "OUT"
    return _OUTDIR


def _json_paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _json_paths(v, path + (i,))


def _tamper(outdir: Path, spec: dict) -> None:
    import shutil
    rng = random.Random(spec["seed"])
    files = sorted(p for p in outdir.rglob("*") if p.is_file())
    target = outdir / "manifest.json" if spec["op"] == "json" else \
        files[spec["file"] % len(files)]
    op = spec["op"]
    if op == "json":
        doc = json.loads(target.read_text())
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(list(_json_paths(doc)))
            if not path:
                doc = rng.choice(_HOSTILE)
                break
            parent = doc
            for k in path[:-1]:
                parent = parent[k]
            if rng.random() < 0.2 and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = rng.choice(_HOSTILE)
        if isinstance(doc, dict) and LEGACY_OUTDIRS and rng.random() < 0.5:
            # as an OUTDIR written before manifests carried digests: its structure is
            # checked, then it is refused (spec/limits.md "Compiled models"); off by default
            doc.pop("digest", None)
            doc.pop("files", None)
        target.write_text(json.dumps(doc))
    elif op == "flip":
        target.write_bytes(_mutate_bytes(rng, target.read_bytes()))
    elif op == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[:rng.randrange(len(data) + 1)])
    elif op == "empty":
        target.write_bytes(b"")
    elif op == "junk":
        target.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))))
    elif op == "delete":
        target.unlink()
    elif op == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif op == "dev":
        target.unlink()
        os.symlink(rng.choice(["/dev/zero", "/dev/urandom", "/dev/null"]), target)
    elif op == "dir":
        target.unlink()
        target.mkdir()
    elif op == "symlink_out":
        target.unlink()
        os.symlink(rng.choice(["/etc/passwd", "../x.npy", "/nonexistent"]), target)
    else:
        shutil.copy(target, outdir / rng.choice(["extra.onnx", "segment9.ir.npz", "regression"]))


def run_infer(case: bytes, tmp: Path) -> int:
    """`tpuasm infer OUT X.npy -o Y.npy` on a tampered copy of a compiled model; X.npy must
    be as it was, and Y.npy, when the run succeeds, a readable array of the run's rows."""
    import shutil
    import numpy as np
    from tpuasm.cli import main
    spec = json.loads(case)
    out = tmp / "OUT"
    if out.exists() or out.is_symlink():
        shutil.rmtree(out)
    shutil.copytree(_compiled_model(), out)
    _tamper(out, spec)
    x = tmp / "x.npy"
    np.save(x, np.random.default_rng(spec["seed"]).normal(0, 1, (spec["rows"], 16))
            .astype(np.float32))
    before = x.read_bytes()
    y = tmp / "y.npy"
    y.unlink(missing_ok=True)
    code = main(["infer", str(out), str(x), "-o", str(y), "-q"])
    assert x.read_bytes() == before, "infer changed its input"
    if code == 0:
        assert np.load(y).shape[0] == spec["rows"], "infer wrote a result of other rows"
    return code


# ------------------------------------------------------------------ sweep grid files, --set
_GRID_NAMES = ["array_size", "ub_rows", "acc_rows", "fifo_depth", "clock_hz", "memory",
               "clock", "clock+", "matrix", "matrix+", "weight_bytes_per_cycle",
               "host_latency_cycles", "hazards", "timing", "profile", "bogus", "shift_cycles",
               "host_bytes_per_cycle", "act_latency_cycles", ""]
_GRID_VALUES = ["1", "2", "0", "-1", "0.5", "x0.5", "x4", "x0", "x-1", "1e308", "inf", "nan",
                "16", "8", "4096", "65536", "1e9", '"tpu"', '"opentpu"', '"interlock"', '"x"',
                "true", "[]", "{}", "0x10", "99999999999999999999"]


def _grid_value(rng) -> str:
    return rng.choice(_GRID_VALUES) if rng.random() < 0.9 else str(rng.choice(BIG_INTS))


def gen_grid(rng: random.Random) -> bytes:
    lines = []
    if rng.random() < 0.3:
        lines.append("each = " + rng.choice(["true", "false", "1", '"yes"']))
    if rng.random() < 0.2:
        lines.append("targets = " + rng.choice(['["p.tasm"]', '["/dev/zero"]', '["nope"]',
                                                '[1]', '"p.tasm"', '["."]', "[]"]))
    if rng.random() < 0.4:
        lines.append("[base]")
        for _ in range(rng.randint(0, 2)):
            lines.append(f'"{rng.choice(_GRID_NAMES)}" = {_grid_value(rng)}')
    if rng.random() < 0.9:
        lines.append(rng.choice(["[grid]", "[grid]", "grid = 3", "[[grid]]"]))
        for _ in range(rng.randint(0, 3)):
            values = ", ".join(_grid_value(rng) for _ in range(rng.randint(0, 4)))
            value = f"[{values}]" if rng.random() < 0.85 else _grid_value(rng)
            lines.append(f'"{rng.choice(_GRID_NAMES)}" = {value}')
    if rng.random() < 0.1:
        lines.append(rng.choice(["[unknown]", "x = ", "[grid", "\x00", "= 1"]))
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.1:
        text = _mutate_bytes(rng, text.encode(), 2).decode("utf-8", "replace")
    sets = []
    for _ in range(rng.randint(0, 2)):
        values = ",".join(_grid_value(rng).strip('"') for _ in range(rng.randint(0, 3)))
        sets.append(f"{rng.choice(_GRID_NAMES)}={values}")
    flags = [f for f in ("--each", "--timing-only") if rng.random() < 0.3]
    if rng.random() < 0.2:
        flags += ["--max-cycles", rng.choice(["1", "0", "-5", "100000", "x"])]
    return json.dumps({"grid": text, "sets": sets, "flags": flags}).encode()


_GRID_PROGRAM = ".config array_size=16\n.host x, 8\n.ub a, 8\n.acc s, 8\n" \
    "RW 0\nRHM host.x, ub.a, 8\nMMC.SO ub.a, acc.s, 8\nACT.R acc.s, ub.a, 8\n" \
    "WHM ub.a, host.x, 8\nHLT\n"


def run_grid(case: bytes, tmp: Path) -> int:
    """`tpuasm sweep p.tasm --grid G.toml [--set ...] --workers 0 -o R.csv`: bad grids are one
    message, exit 2; a sweep that ran wrote one row per point."""
    import numpy as np
    from tpuasm.cli import main
    spec = json.loads(case)
    prog = tmp / "p.tasm"
    if not prog.exists():
        prog.write_text(_GRID_PROGRAM)
        np.save(tmp / "h.npy", np.zeros((8, 16), np.int8))
        np.save(tmp / "w.npy", np.ones((1, 16, 16), np.int8))
    grid = tmp / "g.toml"
    grid.write_text(spec["grid"], encoding="utf-8", errors="surrogatepass")
    out = tmp / "r.csv"
    out.unlink(missing_ok=True)
    args = [str(prog), "--host", str(tmp / "h.npy"), "--weights", str(tmp / "w.npy"),
            "--grid", str(grid), *[f"--set={s}" for s in spec["sets"]], *spec["flags"],
            "--workers", "0", "--no-cache", "--no-table", "-q", "-o", str(out)]
    code = main(["sweep", *args])
    if code in (0, 1):
        import csv
        with open(out, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert rows, "a sweep that ran wrote no rows"
    else:
        assert not out.exists(), "a refused sweep left a results file"
    return code


# ------------------------------------------------------------------ the language server
_LSP_METHODS = ["textDocument/hover", "textDocument/completion", "textDocument/definition",
                "textDocument/references", "textDocument/rename",
                "textDocument/prepareRename", "textDocument/documentSymbol",
                "textDocument/formatting", "textDocument/semanticTokens/full",
                "textDocument/inlayHint", "workspace/symbol", "nonexistent/method"]


def _frame(message, rng=None) -> bytes:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    length = len(body)
    if rng is not None and rng.random() < 0.05:
        length = rng.choice((0, 1, length - 1, length + 1, -1, 10 ** 11, 2 ** 64))
    return f"Content-Length: {length}\r\n\r\n".encode() + body


def _position(rng) -> dict:
    return {"line": rng.choice((0, 1, 2, 5, -1, 10 ** 9, 2 ** 31)),
            "character": rng.choice((0, 1, 4, 8, 80, -1, 10 ** 9))}


def gen_lsp(rng: random.Random) -> bytes:
    """A client session: initialize, open a (mutated) document, edits and requests with
    hostile positions, ranges, uris and ids, then shutdown and exit; some frames broken."""
    uri = rng.choice(["file:///tmp/fuzz/main.tasm", "file:///tmp/fuzz/main.tasm",
                      "file:///dev/zero", "untitled:x", "file:///", "bogus", ""])
    text = gen_asm(rng).decode("utf-8", "replace")
    frames = [_frame({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                      "params": {"processId": None, "rootUri": "file:///tmp/fuzz",
                                 "capabilities": {}}}),
              _frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
              _frame({"jsonrpc": "2.0", "method": "textDocument/didOpen",
                      "params": {"textDocument": {"uri": uri, "languageId": "tasm",
                                                  "version": 1, "text": text}}})]
    version = 1
    for i in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.3:
            version += 1
            change = {"text": gen_asm(rng).decode("utf-8", "replace")[:2000]}
            if rng.random() < 0.6:
                change["range"] = {"start": _position(rng), "end": _position(rng)}
            frames.append(_frame({"jsonrpc": "2.0", "method": "textDocument/didChange",
                                  "params": {"textDocument": {"uri": uri,
                                                              "version": version},
                                             "contentChanges": [change]}}, rng))
        elif r < 0.8:
            params = {"textDocument": {"uri": uri}, "position": _position(rng),
                      "range": {"start": _position(rng), "end": _position(rng)},
                      "newName": rng.choice(["x", "", "1bad", "a b", "HLT"]),
                      "context": {"includeDeclaration": True},
                      "options": {"tabSize": 4, "insertSpaces": True}, "query": "a"}
            if rng.random() < 0.15:
                params = rng.choice([None, [], {}, {"textDocument": 3}, "x"])
            frames.append(_frame({"jsonrpc": "2.0", "id": rng.choice((i + 1, str(i), None,
                                                                      [1], 2 ** 70)),
                                  "method": rng.choice(_LSP_METHODS), "params": params}, rng))
        elif r < 0.9:
            frames.append(rng.choice([
                b"Content-Length: 5\r\n\r\n{bad}", b"Content-Length: x\r\n\r\n",
                b"garbage\r\n\r\n", b"Content-Length: 2\r\n\r\n[]",
                b"Content-Length: 4\r\n\r\nnull", b"\r\n\r\n",
                b"Content-Length: 16\r\n\r\n{\"jsonrpc\":\"1\"}",
                _frame(_mutate_bytes(rng, json.dumps({"jsonrpc": "2.0", "id": 99,
                       "method": "textDocument/hover"}).encode(), 2))]))
        else:
            frames.append(_frame({"jsonrpc": "2.0", "method": "textDocument/didClose",
                                  "params": {"textDocument": {"uri": uri}}}))
    frames.append(_frame({"jsonrpc": "2.0", "id": 10 ** 6, "method": "shutdown"}))
    frames.append(_frame({"jsonrpc": "2.0", "method": "exit"}))
    return b"".join(frames)


def run_lsp(case: bytes, tmp: Path) -> int:
    """The server, in this process, reading the session from a bounded in-memory stdin:
    it must end (at `exit` or the end of the stream), and nothing may fail inside tpuasm's
    own handlers (a client's bad frame is logged in one line; an exception raised in
    tpuasm/ is a finding, with its traceback)."""
    import io
    import logging
    import traceback

    from pygls.exceptions import JsonRpcException
    from tpuasm.lsp import logs
    from tpuasm.lsp.frames import BoundedInput
    from tpuasm.lsp.server import make_server
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)
    kept = Keep(logging.WARNING)
    shown = io.StringIO()
    line = logs.configure(shown)                   # what the user would see, formatted
    for name in logs.LOGGERS:
        logging.getLogger(name).addHandler(kept)
    try:
        server = make_server(debounce=0.0)
        try:
            server.start_io(stdin=BoundedInput(io.BytesIO(case), log=lambda text: None),
                            stdout=io.BytesIO())
            code = 0
        except SystemExit as e:                    # `exit`: pygls ends the process
            code = e.code if isinstance(e.code, int) else 0
    finally:
        for name in logs.LOGGERS:
            logging.getLogger(name).removeHandler(kept)
            logging.getLogger(name).removeHandler(line)
    print(shown.getvalue())                        # judged like any tool's output
    for record in records:
        if record.exc_info and record.exc_info[2] is not None:
            # the record's own exception and its explicit cause: an error a handler
            # raises on purpose (rename to '' answers the client with an error) is only
            # the context of pygls's own failure on a request whose id is a list
            if isinstance(record.exc_info[1], JsonRpcException):
                continue                           # a protocol error answered on purpose
            frames = traceback.extract_tb(record.exc_info[2])
            cause = record.exc_info[1].__cause__
            if cause is not None and cause.__traceback__ is not None:
                frames += traceback.extract_tb(cause.__traceback__)
            ours = [f for f in frames if "/tpuasm/" in f.filename.replace("\\", "/")
                    and "site-packages" not in f.filename]
            assert not ours, "an exception inside tpuasm's handlers:\n" + "".join(
                traceback.format_exception(*record.exc_info))
    return code


# Inputs that take the healthy paths (a program that halts, a manifest that passes): the
# worker runs them before its limits are set, so loading numba's kernels for those paths
# is not charged to the first case that reaches them.
WARM = {
    "asm": [s.encode() for s in ("HLT\n", ".config array_size=8\n" + _TINY)],
    "tbin": None,                        # filled in by warm_cases (assembled seeds)
    "opentpu": [b"".join(((op << 104) | (1 << 88)).to_bytes(14, "big") for op in (1, 7))],
    "npy": None,
    "manifest": None,
    "batch": [b"step\nnext\ncontinue\nx/4d ub[0]\nprint cycle\ninfo pipeline\nreverse-step\n"],
    "fmt": [b"HLT\n", b"\xef\xbb\xbf  HLT\r\n"],
    "infer": [json.dumps({"op": "extra", "file": 0, "seed": 0, "rows": 5}).encode()],
    "grid": [json.dumps({"grid": "[grid]\nfifo_depth = [2, 4]\n", "sets": [],
                         "flags": []}).encode()],
    "lsp": None,
    "compile": None,
    "debug": None,
}


def warm_cases(target: str) -> list[bytes]:
    if target == "tbin":
        return tbin_seeds()[:6]
    if target == "npy":
        import io
        import numpy as np
        buf = io.BytesIO()
        np.save(buf, np.zeros((4, 8), np.int8))
        host = buf.getvalue()
        buf = io.BytesIO()
        np.save(buf, np.zeros((2, 8, 8), np.int8))
        return [b"\0" + host, b"\1" + buf.getvalue(), b"\2" + buf.getvalue()]
    if target == "manifest":
        text = b'[test]\nprogram = "prog.tasm"\n[data]\nhost_rows = 4\nweight_tiles = 2\n'
        return [len(text).to_bytes(4, "little") + text]
    if target == "lsp":
        return [gen_lsp(random.Random(seed)) for seed in range(3)]
    if target == "compile":
        from target_compile import warm_cases as compile_warm
        return compile_warm()
    if target == "debug":
        from target_debug import warm_cases as debug_warm
        return debug_warm()
    return WARM[target]


from target_compile import gen_compile, run_compile  # noqa: E402
from target_debug import gen_debug, run_debug  # noqa: E402

TARGETS = {
    "asm": (gen_asm, run_asm, {0, 2}),
    "tbin": (gen_tbin, run_tbin, {0, 1, 2}),
    "opentpu": (gen_opentpu, run_opentpu, {0, 1, 2}),
    "npy": (gen_npy, run_npy, {0, 1, 2}),
    "manifest": (gen_manifest, run_manifest, {0, 1, 2}),
    "batch": (gen_batch, run_batch, {0, 1}),
    "fmt": (gen_fmt, run_fmt, {0, 2}),
    "infer": (gen_infer, run_infer, {0, 2}),
    "grid": (gen_grid, run_grid, {0, 1, 2}),
    "lsp": (gen_lsp, run_lsp, {0}),
    "compile": (gen_compile, run_compile, {0, 2}),
    "debug": (gen_debug, run_debug, {0, 1, 2}),
}

# Cases per target in `make test`'s short mode (tests/test_fuzz_tools.py; FUZZ_SHORT_CASES
# overrides them all): a few seconds each.  `make fuzz` runs FUZZ_CASES of every target.
SHORT_CASES = {"infer": 24, "grid": 30, "lsp": 30, "fmt": 40, "compile": 30, "debug": 30}
