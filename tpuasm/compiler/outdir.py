"""OUTDIR: a compiled model on disk, written atomically (built in a temporary directory beside
it, then renamed into place), and read back by `load`.

    manifest.json            inputs, outputs, batch, machine config, steps in order
    model.qdq.onnx           the quantized model (the onnxruntime reference)
    report.txt, report.json  the compile report
    hostN.onnx               host parts (onnxruntime sub-models)
    segmentN.tasm            TPU programs (the back end's source; `.node` per ONNX node)
    segmentN.weights.npy     their weight images
    segmentN.host.npy        a host image with constants and one batch of sample inputs
    segmentN.ir.npz          the segment's IR arrays (weights, scales, biases, tables)
    regression/segmentN/test.toml   `tpuasm test OUTDIR`: golden outputs of that batch
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.runtime.host import HostRunner
from tpuasm.compiler.ir import (Activation, Conv, Dense, Elementwise, Lookup, Pool, QParams,
                                Segment, Tensor)
from tpuasm.compiler.runtime.steps import HostStep, TpuStep, ValueInfo
from tpuasm.errors import OutputFileError, TpuasmError
from tpuasm.files import atomic_directory

FORMAT = "tpuasm-compiled-model"
VERSION = 1
MANIFEST = "manifest.json"


# --- writing -------------------------------------------------------------------------------

def save(model, outdir) -> Path:
    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise CompileError(f"{outdir}: exists and is not a directory")
    if outdir.is_dir() and any(outdir.iterdir()) and not (outdir / MANIFEST).is_file():
        raise CompileError(f"{outdir}: exists, is not empty and holds no compiled model; "
                           f"refusing to replace it")
    try:
        outdir.resolve().parent.mkdir(parents=True, exist_ok=True)
        with atomic_directory(outdir) as tmp:
            tmp.chmod(0o755)                # a directory for people, not mkdtemp's 0700
            _write(model, tmp)
    except OSError as e:
        raise CompileError(f"{outdir}: cannot write: {e.strerror or e}") from None
    except OutputFileError as e:
        raise CompileError(str(e)) from None
    return outdir


def _write(model, d: Path) -> None:
    _copy_reference(model.reference_model, d / "model.qdq.onnx")
    (d / "report.txt").write_text(model.report.text())
    (d / "report.json").write_text(json.dumps(model.report.to_json(), indent=1))
    steps = []
    for step in model.steps:
        if isinstance(step, HostStep):
            (d / f"{step.name}.onnx").write_bytes(step.runner.model_bytes)
            steps.append({"kind": "host", "name": step.name, "model": f"{step.name}.onnx",
                          "inputs": step.runner.inputs, "outputs": step.runner.outputs,
                          "input_shapes": {k: None if v is None else list(v)
                                           for k, v in step.input_shapes.items()},
                          "nodes": step.nodes})
        else:
            steps.append(_write_segment(step, d, model))
    manifest = {"format": FORMAT, "version": VERSION, "model": model.report.model,
                "batch": model.batch, "config": model.config,
                "inputs": [_value(v) for v in model.inputs],
                "outputs": [_value(v) for v in model.outputs],
                "reference_model": "model.qdq.onnx", "steps": steps,
                "files": {name: _file_digest(d / name) for name in _digested(d)}}
    # what read() will refuse is refused now, before OUTDIR exists (a shape inferred from
    # hostile attributes can be negative or beyond any memory)
    _check_structure(manifest, lambda why: CompileError(
        f"{model.report.model}: cannot be compiled: its manifest would be refused when "
        f"loaded: {why}"))
    manifest["digest"] = _manifest_digest(manifest)
    (d / MANIFEST).write_text(json.dumps(manifest, indent=1))


# --- integrity: a compiled model is read as it was written, or refused ---------------------
# The manifest lists a sha256 of every file a run reads (not regression/, which `tpuasm test
# --update-golden` rewrites) and carries a digest of itself.  A file changed, cut or
# replaced, or a manifest edited by hand, is "damaged compiled model ...; compile it again"
# before anything runs, instead of a wrong answer or a failure half way through a run.
# An OUTDIR written before the digests existed has neither: nothing vouches for its files
# (an edit that keeps the manifest's structure would fail half way or change the answer),
# so it is refused with the command that makes a checked one.

def _digested(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*")
                  if p.is_file() and p.name != MANIFEST
                  and p.relative_to(d).parts[0] != "regression")


def _file_digest(path: Path) -> str:
    """sha256 of a regular file, read in chunks (tpuasm.files.check_input refuses anything
    else at once)."""
    import hashlib

    from tpuasm.files import check_input
    check_input(path, what="a file of the compiled model")
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest_digest(manifest: dict) -> str:
    import hashlib
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _check_integrity(outdir: Path, data: dict, bad) -> None:
    if "digest" not in data and "files" not in data:
        model = data.get("model")
        if not (isinstance(model, str) and model.isprintable() and 0 < len(model) <= 200):
            model = "MODEL.onnx"
        raise CompileError(
            f"{outdir}: compiled by an older tpuasm: its manifest has no digests, so a change "
            f"to its files cannot be detected; compile the model again with this tpuasm: "
            f"`tpuasm compile {model} -o {outdir}` (with the --batch and --calibrate "
            f"options it was compiled with)")
    again = "compile it again"
    if data.get("digest") != _manifest_digest(data):
        raise CompileError(f"{outdir / MANIFEST}: damaged compiled model (the manifest was "
                           f"changed after it was written); {again}")
    listed = data.get("files")
    if not isinstance(listed, dict):
        raise bad("'files' is not an object")
    from tpuasm.errors import InputFileError
    for name, digest in listed.items():
        _inside(name, bad)
        try:
            found = _file_digest(outdir / name)
        except InputFileError as e:
            raise CompileError(str(e)) from None
        except OSError as e:
            raise CompileError(f"{outdir / name}: cannot read: {e.strerror or e}") from None
        if found != digest:
            raise CompileError(f"{outdir / name}: damaged compiled model (the file changed "
                               f"after it was compiled); {again}")


def _inside(name, bad) -> None:
    if not isinstance(name, str) or not name or Path(name).is_absolute() \
            or ".." in Path(name).parts:
        raise bad(f"file name {name!r} is not a name inside OUTDIR")


_MAX_DIM = 1 << 31


def _check_structure(data: dict, bad) -> None:
    """Types a run relies on: names are text, shapes lists of whole numbers (an older
    OUTDIR has no digest to vouch for them)."""
    def shape(value, where):
        if not isinstance(value, list) or len(value) > 16 or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _MAX_DIM
                for d in value):
            raise bad(f"{where}: shape {value!r} is not a list of sizes")

    def named(entries, where):
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries):
            raise bad(f"{where!r} is not a list of named objects")

    for key in ("inputs", "outputs"):
        named(data[key], key)
        for v in data[key]:
            shape(v.get("shape"), f"{key} {v['name']!r}")
            if not isinstance(v.get("dtype"), str):
                raise bad(f"{key} {v['name']!r}: dtype {v.get('dtype')!r}")
    for step in data["steps"]:
        kind = step.get("kind")
        if kind not in ("host", "tpu") or not isinstance(step.get("name"), str):
            raise bad(f"step {step.get('name')!r}: kind {kind!r} is not host or tpu")
        for key in ("inputs", "outputs"):
            if not isinstance(step.get(key), list) or not all(
                    isinstance(n, str) for n in step[key]):
                raise bad(f"step {step['name']!r}: {key!r} is not a list of names")
        shapes = step.get("input_shapes" if kind == "host" else "onnx_shapes")
        if not isinstance(shapes, dict):
            raise bad(f"step {step['name']!r}: no shapes")
        for name, value in shapes.items():
            if not (kind == "host" and value is None):     # None: known at run time
                shape(value, f"step {step['name']!r} {name!r}")
        if kind == "tpu":
            named(step.get("tensors"), f"step {step['name']} tensors")
            named(step.get("operators"), f"step {step['name']} operators")
            for t in step["tensors"]:
                shape(t.get("shape"), f"tensor {t['name']!r}")
            from tpuasm.limits import MAX_BATCH
            rows = step.get("rows")       # Segment.rows: its own fixed rows, bounded as a batch
            if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int)
                                     or not 1 <= rows <= MAX_BATCH):
                raise bad(f"step {step['name']!r}: rows {rows!r} is not a whole number in "
                          f"1..{MAX_BATCH:,}")
    # every value a step or the model's outputs read is an input or made by an earlier step
    known = {v["name"] for v in data["inputs"]}
    for step in data["steps"]:
        missing = [n for n in step["inputs"] if n not in known]
        if missing:
            raise bad(f"step {step['name']!r} reads {missing[0]!r}, which nothing before "
                      "it makes")
        known |= set(step["outputs"])
    missing = [v["name"] for v in data["outputs"] if v["name"] not in known]
    if missing:
        raise bad(f"output {missing[0]!r} is made by no step")


def _value(v: ValueInfo) -> dict:
    return {"name": v.name, "shape": list(v.shape), "dtype": v.dtype,
            "batch_axis": v.batch_axis}


def _copy_reference(src: Path, dst: Path) -> None:
    """The QDQ model with any external data files it names."""
    import onnx
    shutil.copyfile(src, dst)
    model = onnx.load(str(src), load_external_data=False)
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = {e.key: e.value for e in t.external_data}.get("location")
            if location and not (dst.parent / location).exists():
                target = dst.parent / location
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src.parent / location, target)


def _tensor_json(t: Tensor) -> dict:
    return {"name": t.name, "shape": list(t.shape), "scale": t.quant.scale,
            "zero_point": t.quant.zero_point, "signed": t.quant.signed,
            "bits": t.quant.bits, "channels_last": t.channels_last}


def _write_segment(step: TpuStep, d: Path, model) -> dict:
    seg = step.segment
    arrays, ops = {}, []
    for i, op in enumerate(seg.operators):
        entry = {"type": type(op).__name__, "name": op.name, "input": op.inputs[0].name,
                 "output": op.output.name, "nodes": list(op.nodes)}
        if isinstance(op, Elementwise):
            entry.update(input_b=op.b.name if op.b is not None else None, op=op.op,
                         activation={"kind": op.activation.kind, "lo": op.activation.lo,
                                     "hi": op.activation.hi}, reverse=op.reverse)
            if op.b is None:
                arrays[f"op{i}.constant"] = np.asarray(op.constant)
                q = op.constant_quant
                entry["constant_quant"] = {"scale": q.scale, "zero_point": q.zero_point,
                                           "signed": q.signed}
        if isinstance(op, (Dense, Conv)):
            arrays[f"op{i}.weight"] = op.weight
            arrays[f"op{i}.weight_scale"] = op.weight_scale
            if op.bias is not None:
                arrays[f"op{i}.bias"] = op.bias
            entry["bias"] = op.bias is not None
            entry["activation"] = {"kind": op.activation.kind, "lo": op.activation.lo,
                                   "hi": op.activation.hi}
        if isinstance(op, Conv):
            entry.update(strides=list(op.strides), pads=list(op.pads), groups=op.groups)
        if isinstance(op, Pool):
            entry.update(kind=op.kind, kernel=list(op.kernel), strides=list(op.strides),
                         pads=list(op.pads), count_include_pad=op.count_include_pad)
        if isinstance(op, Lookup):
            arrays[f"op{i}.table"] = op.table
            entry["function"] = op.function
            if op.index is not None:
                entry["index"] = {"scale": op.index.scale, "zero_point": op.index.zero_point,
                                  "signed": op.index.signed}
        ops.append(entry)
    tensors = {}
    for op in seg.operators:
        for t in (*op.inputs, op.output):
            tensors[t.name] = _tensor_json(t)
    np.savez(d / f"{seg.name}.ir.npz", **arrays)
    entry = {"kind": "tpu", "name": seg.name, "ir": f"{seg.name}.ir.npz", "operators": ops,
             "tensors": list(tensors.values()),
             "inputs": [t.name for t in seg.inputs], "outputs": [t.name for t in seg.outputs],
             "onnx_shapes": {k: list(v) for k, v in step.onnx_shapes.items()},
             "rows": seg.rows, "program": None}
    program = step.program
    if program is not None:
        entry["program"] = f"{seg.name}.tasm"
        entry["weights"] = f"{seg.name}.weights.npy"
        entry["host"] = f"{seg.name}.host.npy"
        entry["layout"] = {name: {"base": h.base, "rows": h.rows, "layout": h.layout}
                           for name, h in {**program.inputs, **program.outputs}.items()}
        (d / entry["program"]).write_text(program.source)
        np.save(d / entry["weights"], program.weights)
        from tpuasm.compiler.codegen.golden import write_regression
        write_regression(step, d, model)
    return entry


# --- reading -------------------------------------------------------------------------------

def check(outdir: Path) -> list[Path]:
    """Validate OUTDIR's manifest before the compiler reads it (a manifest that is `[]`,
    `"batch": 10**12`, a FIFO or /dev/zero in place of one of its files): CompileError
    naming the problem.  The files the manifest names (inputs of `infer`)."""
    return _checked(outdir)[1]


def _checked(outdir: Path) -> tuple[dict, list[Path]]:
    """check's work: (the manifest, read once through the bounded reader, and its files)."""
    from tpuasm.errors import InputFileError
    from tpuasm.files import check_input, read_text
    from tpuasm.limits import MAX_BATCH, MAX_MODEL_MANIFEST_BYTES
    manifest = outdir / "manifest.json"
    if not outdir.is_dir() or not manifest.exists():
        raise CompileError(f"{outdir}: not a compiled model (no manifest.json); make one with "
                     f"`tpuasm compile MODEL.onnx -o {outdir}`")
    try:
        data = json.loads(read_text(manifest, what="compiled-model manifest",
                                    limit=MAX_MODEL_MANIFEST_BYTES))
    except InputFileError as e:
        raise CompileError(str(e)) from None
    except ValueError as e:
        raise CompileError(f"{manifest}: not valid JSON: {e}") from None

    def bad(why: str):
        return CompileError(f"{manifest}: not a valid compiled-model manifest: {why}")

    if not isinstance(data, dict):
        raise bad(f"expected a JSON object, found {type(data).__name__}")
    batch = data.get("batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise bad(f"batch {batch!r} is not a whole number in 1..{MAX_BATCH:,}")
    steps = data.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise bad("'steps' is not a list of objects")
    for key in ("inputs", "outputs"):
        if not isinstance(data.get(key), list):
            raise bad(f"{key!r} is not a list")
    names = [data.get("reference_model"), "report.json"]
    for step in steps:
        names += [step.get(k) for k in ("model", "ir", "program", "weights", "host")]
    files = [manifest]
    for name in names:
        if name is None:
            continue
        _inside(name, bad)
        try:
            check_input(outdir / name, what="a file of the compiled model")
        except InputFileError as e:
            raise CompileError(str(e)) from None
        files.append(outdir / name)
    _check_structure(data, bad)
    for step in steps:            # host parts run late (onnxruntime): check them now
        if step.get("kind") == "host" and step.get("model"):
            _check_onnx(outdir / step["model"])
    _check_integrity(outdir, data, bad)
    return data, files


def _check_onnx(path: Path) -> None:
    """A host part that onnx can parse and check (a truncated one fails here, not half
    way through a run)."""
    import onnx

    from tpuasm.files import read_input
    from tpuasm.limits import MAX_BINARY_BYTES
    data = read_input(path, what="host model", limit=4 * MAX_BINARY_BYTES)
    try:
        model = onnx.load_model_from_string(data)
        if not model.HasField("graph") or not model.graph.node:
            raise ValueError("no graph")
    except Exception as e:      # protobuf's and onnx's many kinds of "damaged"
        text = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise CompileError(f"{path}: damaged host model ({text}); compile it again") from None



def read(outdir) -> dict:
    """What OUTDIR holds, as CompiledModel's arguments (model.load builds the model and
    regenerates its programs), and whether it has TPU programs."""
    outdir = Path(outdir)
    manifest, _ = _checked(outdir)
    try:
        return _read(outdir, manifest)
    except (TpuasmError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:      # onnx's, numpy's and zipfile's many kinds of "damaged"
        text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise CompileError(f"{outdir}: damaged compiled model ({type(e).__name__}"
                           f"{': ' + text if text else ''}); compile it again") from None


def _read(outdir: Path, manifest: dict) -> dict:
    from tpuasm.compiler.report import CompileReport
    from tpuasm.files import read_text
    from tpuasm.limits import MAX_SOURCE_BYTES
    path = outdir / MANIFEST
    try:
        if manifest.get("format") != FORMAT:
            raise ValueError("not a compiled-model manifest")
        if manifest.get("version") != VERSION:
            raise ValueError(f"version {manifest.get('version')} (this tpuasm reads "
                             f"{VERSION})")
        steps = [_load_step(s, outdir) for s in manifest["steps"]]
        report = CompileReport.from_json(json.loads(read_text(
            outdir / "report.json", what="compile report", limit=MAX_SOURCE_BYTES)))
        inputs = [_value_info(v) for v in manifest["inputs"]]
        outputs = [_value_info(v) for v in manifest["outputs"]]
        batch, config = int(manifest["batch"]), dict(manifest["config"])
    except CompileError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CompileError(f"{path}: unreadable compiled model: {e}") from None
    has_programs = any(s.get("program") for s in manifest["steps"] if s["kind"] == "tpu")
    return dict(steps=steps, batch=batch, inputs=inputs, outputs=outputs, report=report,
                config=config, reference_model=outdir / manifest["reference_model"],
                has_programs=has_programs)


def _value_info(v: dict) -> ValueInfo:
    """A manifest's input/output; an OUTDIR written before batch axes were saved is batch
    first."""
    axis = v.get("batch_axis", 0)
    if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)
                             or not 0 <= axis <= len(v["shape"])):
        raise ValueError(f"input/output {v['name']!r}: bad batch_axis {axis!r}")
    return ValueInfo(v["name"], tuple(v["shape"]), v["dtype"], axis)


def _load_step(s: dict, outdir: Path):
    if s["kind"] == "host":
        runner = HostRunner((outdir / s["model"]).read_bytes(), s["inputs"], s["outputs"],
                            s["name"])
        return HostStep(runner, s["nodes"], {k: None if v is None else tuple(v)
                                             for k, v in s["input_shapes"].items()})
    tensors = {t["name"]: Tensor(t["name"], tuple(t["shape"]),
                                 QParams(t["scale"], t["zero_point"], t["signed"],
                                         int(t.get("bits", 8))),
                                 bool(t.get("channels_last", False)))
               for t in s["tensors"]}
    with np.load(outdir / s["ir"], allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    ops = []
    for i, e in enumerate(s["operators"]):
        x, y, nodes = tensors[e["input"]], tensors[e["output"]], tuple(e["nodes"])
        kind = e["type"]
        if kind in ("Dense", "Conv"):
            act = Activation(**e["activation"])
            bias = arrays.get(f"op{i}.bias") if e["bias"] else None
            w, ws = arrays[f"op{i}.weight"], arrays[f"op{i}.weight_scale"]
            if kind == "Dense":
                ops.append(Dense(e["name"], x, y, w, ws, bias, act, nodes))
            else:
                ops.append(Conv(e["name"], x, y, w, ws, bias, tuple(e["strides"]),
                                tuple(e["pads"]), act, nodes, int(e.get("groups", 1))))
        elif kind == "Pool":
            ops.append(Pool(e["name"], x, y, e["kind"], tuple(e["kernel"]), tuple(e["strides"]),
                            tuple(e["pads"]), e["count_include_pad"], nodes))
        elif kind == "Lookup":
            index = QParams(**e["index"]) if e.get("index") is not None else None
            ops.append(Lookup(e["name"], x, y, arrays[f"op{i}.table"], e["function"], nodes,
                              index))
        elif kind == "Elementwise":
            b = tensors[e["input_b"]] if e.get("input_b") is not None else None
            const = arrays.get(f"op{i}.constant") if b is None else None
            cq = QParams(**e["constant_quant"]) if b is None else None
            ops.append(Elementwise(e["name"], x, b, y, e["op"], Activation(**e["activation"]),
                                   nodes, const, cq, bool(e.get("reverse", False))))
        else:
            raise ValueError(f"unknown operator type {kind!r}")
    segment = Segment(s["name"], ops, [tensors[n] for n in s["inputs"]],
                      [tensors[n] for n in s["outputs"]], s.get("rows"))
    return TpuStep(segment, {k: tuple(v) for k, v in s["onnx_shapes"].items()})


# --- opening one compiled segment (for the debugger and other faces) ---------------------

@dataclass(frozen=True)
class SegmentFiles:
    """One TPU segment of an OUTDIR: its program and the data to load with it."""
    name: str
    program: Path                 # segmentN.tasm
    host: Path                    # segmentN.host.npy (constants + one sample batch)
    weights: Path                 # segmentN.weights.npy


def segment_files(path, segment: str | None = None) -> SegmentFiles:
    """OUTDIR (its first segment, or `segment`) or OUTDIR/segmentN.tasm -> the files to open
    it with: `tpuasm debug` / `Machine.load(assemble(program), host, weights)`."""
    path = Path(path)
    if path.suffix == ".tasm":
        outdir, segment = path.parent, path.stem
    else:
        outdir = path
    # the manifest through the bounded reader, its structure and digests checked, as `infer`
    # reads it: the debugger opens what the compiler wrote, or nothing
    steps = _checked(outdir)[0]["steps"]
    tpu = [s for s in steps if s.get("kind") == "tpu" and s.get("program")]
    if not tpu:
        raise CompileError(f"{outdir}: holds no TPU program")
    chosen = tpu[0] if segment is None else next((s for s in tpu if s["name"] == segment), None)
    if chosen is None:
        raise CompileError(f"{outdir}: no segment '{segment}' (segments: "
                           f"{', '.join(s['name'] for s in tpu)})")
    return SegmentFiles(chosen["name"], outdir / chosen["program"], outdir / chosen["host"],
                        outdir / chosen["weights"])
