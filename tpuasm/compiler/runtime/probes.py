"""The class scores the check judges in place of an output it cannot judge well by its own
values: a classifier's label (an integer an ArgMax picked, through a table of class names:
skl2onnx's ArrayFeatureExtractor, a Gather, Casts and Reshapes) and a ZipMap's sequence of
maps (skl2onnx's probabilities, which the check cannot compare at all).

Exact agreement of labels on the check's rows says little of new rows: 128 rows all
identical is anywhere from 97 to 100 % on new data, and there is no margin to estimate from.
scikit-learn's StandardScaler + MLPClassifier on digits, exported by skl2onnx with its
defaults: "rows identical 100.00 %" on the 128 check rows, so the calibration search did not
look further, and 98.74 % on 397 new rows.  The scores the label is the arg-max of are
judged by top-1 with the agreement expected on new rows (validate.pair_agreement) instead,
next to the label's own figure.

The compile makes each such scores tensor an extra output of the float model (with_probes),
so that the float, QDQ and compiled models all give it; the compiled model keeps it apart
from the user's outputs (CompiledModel.probes): `run` and `infer` never return it, and the
QDQ model written to OUTDIR has the model's own outputs only (without_probes)."""
from __future__ import annotations

import onnx

from tpuasm.compiler.front.prepare import _Index, inferred_values

# nodes between an ArgMax and the label output that keep each row's pick (a Gather and an
# ArrayFeatureExtractor through their index input, the class names being constant)
_LABEL_WAY = {"Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten"}
_TABLES = {"ArrayFeatureExtractor", "Gather"}
_MAX_WALK = 16


def score_probes(model: onnx.ModelProto) -> dict[str, list[str]]:
    """{scores tensor: the outputs it is judged for}: the input of a ZipMap that makes an
    output, the input of the ArgMax an integer output is picked by, when that tensor is not
    an output already (then the check judges it as one)."""
    idx = _Index(model)
    outputs = [o.name for o in model.graph.output]
    probes: dict[str, list[str]] = {}
    for name in outputs:
        scores = _scores_of(idx, name)
        if scores is not None and scores not in outputs and scores in idx.producer:
            probes.setdefault(scores, []).append(name)
    return probes


def _scores_of(idx, output: str) -> str | None:
    node = idx.producer.get(output)
    if node is not None and node.op_type == "ZipMap":
        return node.input[0]
    tensor = output
    for _ in range(_MAX_WALK):
        node = idx.producer.get(tensor)
        if node is None or not node.input:
            return None
        if node.op_type == "ArgMax":
            return node.input[0]
        if node.op_type in _LABEL_WAY:
            tensor = node.input[0]
        elif node.op_type in _TABLES and len(node.input) == 2 and (
                node.input[0] in idx.inits or _constant(idx, node.input[0])):
            tensor = node.input[1]
        else:
            return None
    return None


def _constant(idx, name: str) -> bool:
    node = idx.producer.get(name)
    return node is not None and node.op_type == "Constant"


def with_probes(model: onnx.ModelProto, probes: dict) -> dict:
    """Each probe an extra graph output of `model` (in place), typed as shape inference
    says; a ZipMap's input it cannot type a float (rows, classes); a tensor of no known
    rank a float of unknown shape where the model's IR allows one (4 and up).  Returns the
    probes added."""
    known = inferred_values(model) if probes else {}
    added = {}
    for name, outputs in probes.items():
        info = known.get(name)
        if info is None:
            zipmapped = any(_made_by(model, o) == "ZipMap" for o in outputs)
            if not zipmapped and model.ir_version < 4:
                continue
            info = onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.FLOAT, ["rows", "classes"] if zipmapped else None)
        model.graph.output.append(info)
        added[name] = outputs
    return added


def _made_by(model, tensor: str) -> str | None:
    return next((n.op_type for n in model.graph.node if tensor in n.output), None)


def without_probes(model: onnx.ModelProto, probes) -> bool:
    """The probe outputs removed from `model` (in place); whether any was there."""
    keep = [o for o in model.graph.output if o.name not in probes]
    if len(keep) == len(model.graph.output):
        return False
    del model.graph.output[:]
    model.graph.output.extend(keep)
    return True


def probe_why(outputs: list[str]) -> str:
    """The report's words for a probe judged for `outputs`."""
    names = ", ".join(f"'{n}'" for n in outputs)
    return (f"the class scores behind {names}, judged in "
            f"{'its' if len(outputs) == 1 else 'their'} place")
