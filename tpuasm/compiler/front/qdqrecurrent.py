"""A quantized model's float LSTM, GRU and RNN nodes on the TPU without calibration data.

onnxruntime's quantize_static has no QDQ form for a recurrent node: it leaves it float
between the quantized layers, and as one float node it ran on the host (a PyTorch LSTM
classifier's QDQ model: 0.3 % of its MACs on the TPU).  With `--calibrate` the compiler
reads the model back as float and quantizes it all (qdqfloat.py).  Without data, the ranges
a quantization needs are known here from the node itself:

- a hidden state h is in [-1, 1]: an LSTM's is o * tanh(c), a GRU's a convex mix of a tanh
  and the h before it, an RNN's a tanh or a sigmoid (an RNN over Relu is left as it is);
  an initial state given as an input is taken to be one (a state an earlier call of the
  same node returned);
- the input X is on the grid of the DequantizeLinear it comes from (through layout nodes),
  when the model quantized it;
- a gate's sum W x + R h + b is bounded by its weights and those ranges.

So each such node is unrolled (prepare._Unroller: one Gemm per gate and step) and its gate
Gemms are quantized where those ranges say: int8 weights per output channel (int16 where
the accumulators hold any input's sums, an 8-bit X's or a 16-bit state's:
bounds._wide_scale), int32 biases,
a hidden state int16 (step 1 / 32767), X as the model quantized it, and every gate sum
int16 over its bound (com.microsoft's QuantizeLinear / DequantizeLinear, which take int16
at any opset).  A bound costs resolution where a calibrated range would be tighter, which
16 bits pay for (a gate sum bounded at 12 has steps of 0.0004).  The gate arithmetic
(sigmoid, tanh, the cell's products) stays float on the host, as are the Gemms over an X
the model did not quantize (its range is known only from data: `--calibrate`)."""
from __future__ import annotations

import onnx

from tpuasm.compiler.front.bounds import BoundsQuantizer, dequantized_grids
from tpuasm.compiler.front.prepare import (_GATES, NotRewritten, _attr, _expand_nodes,
                                           _Index, _ranks, _Unroller,
                                           drop_unused_initializers)
from tpuasm.compiler.front.provenance import Provenance


def quantize_float_recurrent(model: onnx.ModelProto, prov: Provenance,
                             reasons: dict | None = None, ranges: dict | None = None) -> int:
    """Each float LSTM / GRU / RNN of the quantized `model` unrolled, its gate Gemms
    quantized as the module doc says (in place); how many nodes.  `reasons` gets why a node
    was left as it is; `ranges`: float inputs' declared ranges (--input-range)."""
    reasons = {} if reasons is None else reasons
    dynamic = _float_dynamic_lstms(model)

    def wanted(node) -> bool:
        return node.op_type in _GATES and node.domain in ("", "ai.onnx")

    if not any(wanted(n) for n in model.graph.node):
        return 0
    idx, ranks = _Index(model), _ranks(model)
    grids = dequantized_grids(model, idx)
    made: dict[str, list] = {}
    tied: dict[str, list[str]] = {}

    def unrolled(node):
        if node.op_type == "RNN" and _relu_rnn(node):
            raise NotRewritten("an RNN over Relu has no bounded state to quantize it by "
                               "without data (--calibrate)")
        nodes = _Unroller(idx, node, ranks, tied).run()
        made[node.name] = nodes
        return nodes

    done = _expand_nodes(model, prov, reasons, "unrolled", wanted, unrolled)
    if dynamic:                  # one that stays whole stays as the user's model has it
        nodes = [dynamic.get(n.name, n) if n.op_type == "LSTM" else n
                 for n in model.graph.node]
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        drop_unused_initializers(model)
    if not done:
        return 0
    states = {t for key, ts in tied.items() if key.rsplit("/", 1)[-1] == "h" for t in ts}
    quantizer = BoundsQuantizer(model, grids, states, ranges)
    gemm_of = {n.name: name for name, nodes in made.items() for n in nodes}
    # the ranges carried through the whole graph, not node by node: a stacked LSTM's second
    # layer reads the first one's states (through the exporter's Transpose and Reshape)
    quantizer.quantize(list(model.graph.node), lambda gemm: (
        f"a gate Gemm of '{gemm_of[gemm.name]}' over its input X, which the model does not "
        f"quantize: its range is known from data only (--calibrate quantizes it; "
        f"--input-range NAME=LO,HI declares a float input's)"),
        set(gemm_of))
    quantizer.finish()
    reasons.update(quantizer.reasons)
    return done


# the user's nodes whose bodies onnxruntime's quantizer does not enter (subgraphs), whose
# MatMuls the folding unrolls or inlines into the graph float
_SUBGRAPH_OPS = {"Loop", "Scan", "If"}


def quantize_float_matrices(model: onnx.ModelProto, prov: Provenance,
                            reasons: dict | None = None, ranges: dict | None = None) -> int:
    """Each float MatMul / Gemm with a constant weight that onnxruntime's quantizer cannot
    reach, quantized from bounds as the gate Gemms above: those a Loop, Scan or If of the
    quantized model held (unrolled or inlined by the folding: jax.lax.scan's LSTM and GRU
    cells, a Keras Bidirectional GRU's two Loops), and each Einsum with a weight, which it
    has no QDQ form for (torch.einsum, EinsumDense), rewritten as its MatMul
    (einsumforms.py) first.  The ranges are carried through the whole graph by interval
    arithmetic (a GRU's update z * h + (1 - z) * n kept in the hull of h's and n's); a
    product over a tensor of no known range is left float.  How many were quantized."""
    from tpuasm.compiler.front.einsumforms import rewrite_einsums
    reasons = {} if reasons is None else reasons
    if any(n.op_type == "Einsum" for n in model.graph.node):
        rewrite_einsums(model, prov, reasons)
    sources = dict(prov.nodes)
    idx = _Index(model)

    def held_by(node) -> str | None:
        op = sources.get(prov.source(node.name))
        return op if op in _SUBGRAPH_OPS or op == "Einsum" else None

    def float_weight(node) -> bool:
        w = node.input[1] if len(node.input) > 1 else ""
        return w in idx.inits and idx.inits[w].data_type == onnx.TensorProto.FLOAT

    matrices = {n.name: held_by(n) for n in model.graph.node
                if n.op_type in ("MatMul", "Gemm") and held_by(n) and float_weight(n)}
    if not matrices:
        return 0

    def unknown(node) -> str:
        what = ("an Einsum with a weight, which onnxruntime's quantizer leaves float"
                if matrices[node.name] == "Einsum" else
                "a MatMul of a Loop, Scan or If body, which onnxruntime's quantizer does not "
                "enter")
        return (f"{what}, over a tensor of no range known without data (--calibrate "
                f"quantizes it; --input-range NAME=LO,HI declares a float input's)")
    quantizer = BoundsQuantizer(model, dequantized_grids(model, idx), set(), ranges)
    quantizer.quantize(list(model.graph.node), unknown, set(matrices))
    quantizer.finish()
    reasons.update(quantizer.reasons)
    return quantizer.done


def _float_dynamic_lstms(model) -> dict:
    """Each DynamicQuantizeLSTM of a quantize_dynamic model (in place) as the float LSTM it
    stands for (dynamicquant.py: its int8 weights dequantized), to be unrolled and quantized
    here like one quantize_static left float; {name: the DynamicQuantizeLSTM}."""
    from tpuasm.compiler.front.dynamicquant import _float_lstm, _is_quantized_lstm
    if not any(_is_quantized_lstm(n) for n in model.graph.node):
        return {}
    idx, nodes, originals = _Index(model), [], {}
    for node in model.graph.node:
        lstm = _float_lstm(node, idx) if _is_quantized_lstm(node) else None
        if lstm is not None:
            originals[lstm.name] = node
        nodes.append(lstm if lstm is not None else node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return originals


def _relu_rnn(node) -> bool:
    acts = _attr(node, "activations") or []
    return any((a.decode() if isinstance(a, bytes) else a).lower() == "relu" for a in acts)
