"""Weight-only quantized models read as the float models they compute.

- **MatMulNBits** (com.microsoft, from `matmul_nbits_quantizer`, the form language models
  are shipped in): a float activation times a weight stored as 2-, 4- or 8-bit codes in
  blocks along K, each block with its own scale and zero point.  The activation is float, so
  such a model is a float model with compressed weights: given calibration data, each node
  is read back here as the float MatMul (and bias Add) it computes, its weight the exact
  dequantized values, and the compiler quantizes it like any float model (its per-channel
  int8 grid resolves the 4-bit codes' values to within 1/16 of their own step).
- **Block-wise DequantizeLinear of constants** (opset 21's `block_size`, the QDQ form of the
  same tool) is read back as float with the rest of a QDQ model
  (dynamicquant.float_constant).

4-bit and 16-bit QDQ tensors are widths.py's."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.dynamicquant import float_matmul
from tpuasm.compiler.front.prepare import _Index, drop_unused_initializers

def check_matmul_nbits(model: onnx.ModelProto, path) -> None:
    """A MatMulNBits whose constant weights do not fit its attributes is one clear error
    naming the node (onnxruntime refuses to run it, and its MACs could not be counted)."""
    nodes = matmul_nbits_nodes(model)
    idx = _Index(model) if nodes else None      # (read_model runs this on every model)
    for node in nodes:
        inputs = list(node.input) + [""] * (6 - len(node.input))
        packed, scales = idx.const(inputs[1]), idx.const(inputs[2])
        if packed is None or scales is None:
            continue
        (k, n, bits, block), fit = _attributes(node)
        if not fit:
            raise CompileError(f"{path}: node {node.name or node.output[0]}: MatMulNBits "
                               f"attributes K={k}, N={n}, bits={bits}, block_size={block} "
                               f"(K, N and block_size positive, bits 2, 4 or 8)")
        zeros = idx.const(inputs[3]) if inputs[3] else None
        groups = idx.const(inputs[4]) if inputs[4] else None
        why = nbits_mismatch(packed, scales, zeros, groups, k, n, bits, block)
        if why is not None:
            raise CompileError(f"{path}: node {node.name or node.output[0]}: MatMulNBits "
                               f"{why}")


def matmul_nbits_nodes(model: onnx.ModelProto) -> list:
    return [n for n in model.graph.node
            if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]


def dequantize_matmul_nbits(model: onnx.ModelProto) -> tuple[int, list[str]]:
    """Rewrite (in place) every MatMulNBits whose weights are constants as a float MatMul
    (and Add of its bias); (the count rewritten, the names of those left as they are, with
    why)."""
    idx = _Index(model)
    replaced: dict[str, list] = {}
    left = []
    for node in matmul_nbits_nodes(model):
        nodes, why = _float_matmul(node, idx)
        if nodes is None:
            left.append(f"{node.name or node.output[0]} ({why})")
        else:
            replaced[node.output[0]] = nodes
    if replaced:
        kept = []
        for node in model.graph.node:
            kept.extend(replaced.get(node.output[0], [node]) if node.output else [node])
        del model.graph.node[:]
        model.graph.node.extend(kept)
        drop_unused_initializers(model)
    return len(replaced), left


def _float_matmul(node, idx: _Index):
    """([MatMul, Add?], None) computing `node` in float, or (None, why not)."""
    inputs = list(node.input) + [""] * (6 - len(node.input))
    (k, n, bits, block), fit = _attributes(node)
    if not fit:
        return None, f"attributes K={k}, N={n}, bits={bits}, block_size={block}"
    packed, scales = idx.const(inputs[1]), idx.const(inputs[2])
    zeros = idx.const(inputs[3]) if inputs[3] else None
    groups = idx.const(inputs[4]) if inputs[4] else None
    if packed is None or scales is None or (inputs[3] and zeros is None) or \
            (inputs[4] and groups is None):
        return None, "weights that are not constants"
    weight = nbits_weight(packed, scales, zeros, groups, k, n, bits, block)
    if isinstance(weight, str):
        return None, weight
    name = node.name or node.output[0]
    w = idx.add_init(weight, f"{inputs[1]}_dequantized")
    return float_matmul(idx, inputs[0], w, node.output[0], name, inputs[5]), None


def _attributes(node) -> tuple[tuple, bool]:
    """((K, N, bits, block_size), whether they describe a MatMulNBits: K, N and block_size
    positive, bits 2, 4 or 8, 4 when absent)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n, bits, block = (attrs.get(a) for a in ("K", "N", "bits", "block_size"))
    bits = 4 if bits is None else bits
    fit = all(isinstance(v, int) and v > 0 for v in (k, n, block)) and bits in (2, 4, 8)
    return (k, n, bits, block), fit


def _unpack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes -> their `bits`-bit codes, low bits first along the last axis."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    mask = np.uint8((1 << bits) - 1)
    return ((codes[..., None] >> shifts) & mask).reshape(*codes.shape[:-1], -1)


def nbits_mismatch(packed, scales, zeros, groups, k: int, n: int, bits: int, block: int
                   ) -> str | None:
    """What of MatMulNBits' constants does not fit its attributes, or None (sizes only: a
    language model's weights are not unpacked to check them)."""
    blocks = -(-k // block)
    blob = block * bits // 8
    if packed.dtype != np.uint8 or packed.size != n * blocks * blob:
        return f"B of {packed.size} {packed.dtype} values where N x blocks x blob is " \
               f"{n * blocks * blob} uint8"
    if scales.size != n * blocks:
        return f"{scales.size} scales for {n} x {blocks} blocks"
    if zeros is not None and zeros.dtype == np.uint8 and \
            zeros.size != n * -(-blocks * bits // 8):
        return f"{zeros.size} packed zero points for {n} x {blocks} blocks"
    if zeros is not None and zeros.dtype != np.uint8 and zeros.size != n * blocks:
        return f"{zeros.size} zero points for {n} x {blocks} blocks"
    if groups is not None and not (groups.size == k and np.issubdtype(groups.dtype, np.integer)
                                   and groups.min(initial=0) >= 0
                                   and groups.max(initial=0) < blocks):
        return "a g_idx that does not name one block per row of K"
    return None


def nbits_weight(packed, scales, zeros, groups, k: int, n: int, bits: int, block: int):
    """MatMulNBits' B as the float (K, N) matrix it stands for: W[k, j] = (code - zero
    point) * scale of k's block in column j (the block k // block_size, or g_idx[k]); the
    zero point is 2^(bits-1) when absent, packed like the codes when uint8, a value of the
    scales' type otherwise.  A string saying what does not fit the attributes, else."""
    why = nbits_mismatch(packed, scales, zeros, groups, k, n, bits, block)
    if why is not None:
        return why
    if groups is not None and zeros is not None and zeros.dtype == np.uint8:
        # (onnxruntime's CPU kernel reads such zero points as 2^(bits-1): its answers and
        # the operator's definition differ, so neither is taken for the model's)
        return "a g_idx beside packed zero points, which onnxruntime does not apply"
    blocks = -(-k // block)
    codes = _unpack(packed.reshape(n, -1), bits)[:, :k].astype(np.float32)
    scales = scales.reshape(n, blocks).astype(np.float32)
    if zeros is None:
        zero = np.full((n, blocks), 1 << (bits - 1), np.float32)
    elif zeros.dtype == np.uint8:
        zero = _unpack(zeros.reshape(n, -1), bits)[:, :blocks].astype(np.float32)
    else:
        zero = zeros.reshape(n, blocks).astype(np.float32)
    of_row = np.arange(k) // block if groups is None else groups.reshape(k).astype(np.int64)
    weight = (codes - zero[:, of_row]) * scales[:, of_row]
    return np.ascontiguousarray(weight.T, np.float32)
