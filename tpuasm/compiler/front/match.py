"""Matching (the front end's last pass; the back end's codegen/lower.py lowers the IR to
instructions): ONNX nodes of a quantized model (QDQ or QOperator form) -> IR operators.

Every compute node is tried on its own ("anchor"): the QDQ pattern around it (DequantizeLinear
on its activation input, weight and bias; QuantizeLinear on its output, with an optional
Relu/Clip in between) or its QOperator form.  On success it becomes one IR operator that
lists every ONNX node it absorbed; otherwise the node stays on the host, with the reason.

Layout-only nodes (Flatten, Reshape, Transpose, Squeeze, Unsqueeze, Identity) between a
quantized tensor and a Gemm/MatMul are folded: the consumer's weights are reordered so that it
reads the producer's tensor in its own layout, and a Gemm over an image becomes a Conv whose
kernel covers the whole image.

Tensors of other ranks: a MatMul over (N, *rows, K) reads the channels-last image (K, rows, 1)
(`Tensor.channels_last`) as a 1x1 Conv, a bias Add after it joins it; a 1-D signal (C, L) is
the image (C, L, 1) and a Conv1d the kernel (k, 1) over it; grouped convolutions keep their
(O, C/G, kh, kw) weights and `groups`; a Pad of zeros before a convolution joins its padding.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field, replace

import numpy as np

from tpuasm.compiler.front.convforms import spread_kernel
from tpuasm.compiler.front.graph import Graph, Node
from tpuasm.compiler.ir import (Activation, Conv, Dense, Elementwise, Lookup, Operator, Pool,
                                QParams, Tensor)

LAYOUT_OPS = {"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Dropout"}
LOOKUP_OPS = {"Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish",
              "Elu", "Selu", "Softplus", "Softsign", "Exp", "Log", "Neg", "Abs", "Erf",
              "Gelu", "FastGelu", "QuickGelu", "Mish", "Sqrt", "Reciprocal", "ThresholdedRelu",
              "Celu"}
QLINEAR_LOOKUP_OPS = {"QLinearSigmoid", "QLinearLeakyRelu"}
_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
# quantized activations the TPU reads: 8-bit, or int16 (its 16-bit activations, MMC's H flag)
_QUANTIZED = _INT8 + (np.dtype(np.int16),)
_WIDE_REFUSED = ("a 16-bit (int16) tensor: the TPU's pooling, a lookup table's direct input "
                 "and VADD/VMUL with a constant or broadcast operand take 8-bit tensors "
                 "(matrix operators and VADD/VMUL of two activations read 16-bit ones)")


class NotMapped(Exception):
    """Why a node stays on the host (the message is the report's reason)."""


class LayoutConflict(NotMapped):
    """A tensor an earlier operator registered in one layout, read in another."""

    def __init__(self, message: str, tensor: str):
        super().__init__(message)
        self.tensor = tensor


@dataclass
class Source:
    """Where a consumer's activation input really comes from: a quantized tensor, read
    through the layout-only nodes in `layout` (flat permutation `index`, None = identity)."""
    tensor: str
    quant: QParams
    shape: tuple                      # the consumer-side sample shape (ONNX)
    index: np.ndarray | None
    nodes: list[str] = field(default_factory=list)
    pads: tuple[int, ...] = ()        # a zero Pad folded into the consumer (a convolution):
    #                                   spatial begins then ends, ONNX order


@dataclass
class Lowered:
    """The IR operators of a graph and every node's placement."""
    operators: list[Operator]                      # in the model's node order
    anchor: dict[str, Node]                        # operator name -> its compute node
    fused: dict[str, str]                          # node name -> operator that absorbed it
    host_reasons: dict[str, str]                   # compute node name -> why not on the TPU
    tensors: dict[str, Tensor]                     # IR tensors by name
    notes: dict[str, list[str]] = field(default_factory=dict)   # operator -> remarks


def rows_shape(onnx_shape) -> tuple[int, int, int]:
    """The IR shape (C, rows, 1) of a channels-last ONNX sample shape (*rows, C)."""
    c = int(onnx_shape[-1]) if len(onnx_shape) else 1
    return c, int(np.prod(onnx_shape, dtype=np.int64)) // max(c, 1), 1


def _layout(shape, channels_last: bool) -> str:
    return f"{shape} {'channels-last rows' if channels_last else 'channels-first'}"


class Lowerer:
    def __init__(self, graph: Graph, table_builder=None):
        self.g = graph
        self.tensors: dict[str, Tensor] = {}
        self.notes: dict[str, list[str]] = {}
        self.table_builder = table_builder

    # --- small helpers ------------------------------------------------------------------

    def _const(self, name: str, what: str, node: Node) -> np.ndarray:
        value = self.g.constant(name) if name else None
        if value is None:
            raise NotMapped(f"its {what} '{name}' is not a constant")
        return value

    def _qtype(self, name: str) -> tuple[bool, int]:
        """(signed, bits): int8, uint8 or int16 (the TPU's 16-bit activations, always
        signed: Activate writes int16); NotMapped otherwise."""
        dtype = self.g.dtypes.get(name)
        if dtype == np.int8:
            return True, 8
        if dtype == np.uint8:
            return False, 8
        if dtype == np.int16:
            return True, 16
        raise NotMapped(f"tensor '{name}' is {dtype}, not 8-bit or int16 (--calibrate DATA "
                        f"reads the model back as float and quantizes it so)")

    def qparams(self, scale_name: str, zp_name: str, tensor: str, node: Node) -> QParams:
        scale = self._const(scale_name, "scale", node)
        if scale.size != 1:
            raise NotMapped("per-axis quantization of an activation")
        signed, bits = self._qtype(tensor)
        zp = 0 if not zp_name else int(self._const(zp_name, "zero point", node).reshape(-1)[0])
        if not float(scale.reshape(-1)[0]) > 0:
            raise NotMapped(f"scale {float(scale.reshape(-1)[0])} is not positive")
        return QParams(float(np.float32(scale.reshape(-1)[0])), zp, signed, bits)

    def tensor(self, name: str, quant: QParams, shape=None) -> Tensor:
        """The IR tensor of a quantized ONNX tensor (one object per name)."""
        if name not in self.tensors:
            why = self.g.not_batch_first(name)        # TPU programs take the batch first
            if why:
                raise NotMapped(why)
            if shape is None:
                shape = self.g.sample_shape(name)
                if shape is None:
                    raise NotMapped(f"the shape of '{name}' is unknown")
            self.tensors[name] = Tensor(name, tuple(int(d) for d in shape), quant)
        t = self.tensors[name]
        if t.quant != quant:
            raise NotMapped(f"'{name}' is read with two different quantizations")
        return t

    def ir_tensor(self, name: str, quant: QParams, shape, channels_last: bool = False) -> Tensor:
        """`tensor` with an explicit IR shape and layout flag: one layout per tensor."""
        fresh = name not in self.tensors
        t = self.tensor(name, quant, shape)
        if fresh and channels_last:
            t = self.tensors[name] = replace(t, channels_last=True)
        if t.channels_last != channels_last or t.shape != tuple(shape):
            raise LayoutConflict(f"'{name}' is read in two layouts "
                                 f"({_layout(t.shape, t.channels_last)} and "
                                 f"{_layout(tuple(shape), channels_last)})", name)
        return t

    def natural(self, name: str) -> tuple[tuple, bool]:
        """A tensor's IR (shape, channels_last): as registered, else from its ONNX shape:
        (K,) a vector, (C, H, W) an image, any other rank rows of its last dimension."""
        t = self.tensors.get(name)
        if t is not None:
            return t.shape, t.channels_last
        shape = self.g.sample_shape(name)
        if shape is None:
            raise NotMapped(f"the shape of '{name}' is unknown")
        if len(shape) in (1, 3):
            return tuple(int(d) for d in shape), False
        return rows_shape(shape), True

    # --- tracing inputs -----------------------------------------------------------------

    def trace(self, name: str, quant: QParams | None = None, allow_pad: bool = False,
              through_layout: bool = True, reorder_fallback: bool = False) -> Source:
        """Follow an activation input back through DequantizeLinear, layout-only nodes and
        QuantizeLinear(DequantizeLinear) identities to the quantized tensor it reads.  With
        `allow_pad` (a convolution's input) one Pad of real zeros is folded too, into the
        consumer's padding (`Source.pads`); without `through_layout` the walk stops at the
        first layout node (the host then makes the consumer's own layout)."""
        layout: list[Node] = []
        folded: list[str] = []
        pad = None                      # (folded depth, layout depth, spatial pads)
        current = name
        # every quantized tensor reached: (tensor, layout depth, folded depth), nearest
        # first; the source is the deepest a program can read (_same_rows), so a walk that
        # ends on a float tensor (a layout node before the model's quantization) falls back
        seen = []
        while True:
            if quant is not None and self.g.dtypes.get(current) in _QUANTIZED:
                seen.append((current, len(layout), len(folded)))
            node = self.g.producer.get(current)
            if node is None:
                break
            op = node.op_type
            if op == "DequantizeLinear":
                q = self.qparams(node.input(1), node.input(2), node.inputs[0], node)
                if quant is not None and q != quant:
                    raise NotMapped("its input is requantized on the way (a QuantizeLinear/"
                                    "DequantizeLinear pair with different parameters)")
                quant = q
            elif op == "QuantizeLinear" and quant is not None:
                q = self.qparams(node.input(1), node.input(2), node.outputs[0], node)
                inner = self.g.producer.get(node.inputs[0])
                if q != quant or inner is None or not (
                        inner.op_type in LAYOUT_OPS or inner.op_type == "DequantizeLinear"
                        or (allow_pad and pad is None and inner.op_type == "Pad")):
                    break                       # a real quantization: the source
            elif op in LAYOUT_OPS and through_layout:
                layout.append(node)
            elif op == "Pad" and allow_pad and pad is None and quant is not None:
                try:
                    pad = (len(folded), len(layout), self._zero_pads(node, quant))
                except NotMapped:
                    break                   # the host pads: read its quantized result
            else:
                break
            folded.append(node.name)
            current = node.inputs[0]
        best = self._same_rows(name, layout, seen)
        if quant is None or not seen:
            raise NotMapped("its input is not quantized (no DequantizeLinear before it)")
        if best is None:
            raise NotMapped(f"its input '{name}' has {self.g.rows(name)} rows, the quantized "
                            f"tensor it is made of {self.g.rows(seen[-1][0])} (a layout node "
                            f"between changes the rows a program takes)")
        current, depth, count = best
        layout, folded = layout[:depth], folded[:count]
        pads = ()
        if pad is not None and pad[0] < count:
            if depth:
                raise NotMapped("a Pad and layout nodes between its input and the convolution")
            pads = pad[2]
        src = self.tensors.get(current)
        src_shape = src.shape if src is not None else self.g.sample_shape(current)
        onnx_shape = self.g.sample_shape(current)
        if src_shape is None or onnx_shape is None:
            raise NotMapped(f"the shape of '{current}' is unknown")
        index = np.arange(int(np.prod(onnx_shape)), dtype=np.int64).reshape((1,) + onnx_shape)
        for node in self._cancelled(list(reversed(layout))):
            index = self._apply_layout(node, index)
        shape = tuple(index.shape[1:])
        flat = index.reshape(-1)
        identity = bool(np.array_equal(flat, np.arange(flat.size)))
        source = Source(current, quant, shape, None if identity else flat, folded, pads)
        if source.index is not None and reorder_fallback:
            # a layout node reorders the elements: read the quantized tensor after it, which
            # the host makes in the consumer's layout (when the model quantizes it)
            try:
                return self.trace(name, quant, allow_pad, through_layout=False)
            except NotMapped:
                return source
        return source

    def _same_rows(self, name: str, layout: list, seen: list):
        """Of the quantized tensors a trace passed (`seen`: (tensor, layout depth, folded
        depth), nearest first), the deepest one a program can read for `name`: of the same
        rows (Graph.rows: a program takes one row count; a Reshape (T, F) -> (1, T*F) or a
        Transpose that moves another axis first makes others, and the host then makes the
        tensor after it), reached through no Transpose that moves the leading axis."""
        rows = self.g.rows(name)
        for i in range(len(seen) - 1, -1, -1):
            tensor, depth, _ = seen[i]
            moved = any(n.op_type == "Transpose" and (n.attr("perm") or [1])[0] != 0
                        for n in layout[:depth])
            other = self.g.rows(tensor)
            if not moved and (rows is None or other is None or other == rows):
                return seen[i]
        return None

    def _zero_pads(self, node: Node, quant: QParams) -> tuple[int, ...]:
        """The spatial pads of a Pad that adds real zeros on the spatial axes only."""
        mode = node.attr("mode", b"constant")
        if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
            raise NotMapped("a Pad that is not constant")
        if node.input(3):
            raise NotMapped("a Pad with axes")
        pads = node.attr("pads") if len(node.inputs) < 2 or not node.input(1) else \
            self._const(node.input(1), "pads", node).reshape(-1).tolist()
        value = node.attr("value", 0.0)
        if node.input(2):
            value = self._const(node.input(2), "pad value", node).reshape(-1)[0]
        if self.g.dtypes.get(node.inputs[0]) in _QUANTIZED:
            if int(value) != quant.zero_point:
                raise NotMapped("a Pad whose value is not the zero point")
        elif float(value) != 0.0:
            raise NotMapped("a Pad whose value is not 0")
        rank = len(pads) // 2
        begin, end = pads[:rank], pads[rank:]
        if rank < 3 or any(begin[:2]) or any(end[:2]) or min(pads) < 0:
            raise NotMapped("a Pad of the batch or channel axis, or a negative one")
        return tuple(int(v) for v in begin[2:] + end[2:])

    def _cancelled(self, chain: list) -> list:
        """Layout nodes in data order without the Unsqueeze -> Squeeze pairs of one axis
        that undo each other (an unrolled GRU's Y_h, (1, N, H), squeezed again): the
        Unsqueeze alone would move the batch dimension."""
        out: list = []
        for node in chain:
            if node.op_type in ("Identity", "Dropout"):
                continue
            if out and node.op_type == "Squeeze" and out[-1].op_type == "Unsqueeze":
                axes = self._axes(node)
                if axes is not None and axes == self._axes(out[-1]):
                    out.pop()
                    continue
            out.append(node)
        return out

    def _axes(self, node: Node):
        """The axes of a Squeeze / Unsqueeze (attribute or constant input), or None."""
        if node.input(1):
            value = self.g.constant(node.input(1))
            return None if value is None else tuple(int(v) for v in value.reshape(-1))
        axes = node.attr("axes")
        return None if axes is None else tuple(int(v) for v in axes)

    def _apply_layout(self, node: Node, index: np.ndarray) -> np.ndarray:
        if node.op_type == "Transpose":
            perm = node.attr("perm") or list(range(index.ndim))[::-1]
            if perm[0] != 0:
                raise NotMapped(f"{node} moves the batch dimension")
            return np.transpose(index, perm)
        out = self.g.shapes.get(node.outputs[0])
        if out is None:
            raise NotMapped(f"the output shape of {node} is unknown")
        if out[0] != self.g.shapes.get(node.inputs[0], (None,))[0]:
            raise NotMapped(f"{node} changes the batch dimension")
        return index.reshape((1,) + tuple(out[1:]))

    # --- outputs, weights, bias ---------------------------------------------------------

    def quantized_output(self, node: Node, allow_activation: bool, out: str | None = None):
        """(output tensor name, its QParams, fused activation, fused node names); `out`: the
        float tensor to start from (a fused bias Add's output), else the node's output."""
        out = out or node.outputs[0]
        act, fused = Activation(), []
        cons = self.g.consumers.get(out, [])
        if out in self.g.outputs:
            raise NotMapped("its float output is a model output")
        if allow_activation and len(cons) == 1 and cons[0].op_type in ("Relu", "Clip"):
            act = self._activation(cons[0])
            fused.append(cons[0].name)
            out = cons[0].outputs[0]
            cons = self.g.consumers.get(out, [])
            if out in self.g.outputs:
                raise NotMapped("its float output is a model output")
        if len(cons) != 1 or cons[0].op_type != "QuantizeLinear":
            raise NotMapped("its output is not quantized (no single QuantizeLinear after it)")
        q = cons[0]
        quant = self.qparams(q.input(1), q.input(2), q.outputs[0], q)
        fused.append(q.name)
        return q.outputs[0], quant, act, fused

    def _activation(self, node: Node) -> Activation:
        if node.op_type == "Relu":
            return Activation("relu")
        lo, hi = node.attr("min"), node.attr("max")         # Clip before opset 11
        if len(node.inputs) > 1 and node.input(1):
            lo = float(self._const(node.input(1), "lower bound", node).reshape(-1)[0])
        if len(node.inputs) > 2 and node.input(2):
            hi = float(self._const(node.input(2), "upper bound", node).reshape(-1)[0])
        return Activation("clip", lo, hi)

    def qdq_weight(self, name: str, axis: int):
        """An int8 or int16 weight (the TPU's 16-bit weights, MatrixMultiply's D flag) behind
        DequantizeLinear: (the integer array, per-`axis` scales, zero point, node)."""
        dq = self.g.producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            raise NotMapped("its weight is not a quantized constant")
        w = self._const(dq.inputs[0], "weight", dq)
        if w.dtype not in (np.int8, np.int16):
            raise NotMapped(f"its weight is {w.dtype}, the TPU's weights are int8 or int16")
        scale = self._const(dq.input(1), "weight scale", dq).astype(np.float32).reshape(-1)
        zp = self.g.constant(dq.input(2)) if dq.input(2) else None
        if scale.size > 1:
            dq_axis = dq.attr("axis", 1) % w.ndim
            if dq_axis != axis % w.ndim:
                raise NotMapped("its weight is quantized per input channel, not per output "
                                "channel")
        return w, self._per_channel(scale, w.shape[axis]), zp, dq.name

    @staticmethod
    def _per_channel(scale: np.ndarray, n: int) -> np.ndarray:
        scale = np.asarray(scale, np.float32).reshape(-1)
        if scale.size == 1:
            return np.full(n, scale[0], np.float32)
        if scale.size != n:
            raise NotMapped(f"{scale.size} weight scales for {n} output channels")
        return scale

    @staticmethod
    def _check_symmetric(zp) -> None:
        if zp is not None and np.any(np.asarray(zp) != 0):
            raise NotMapped("its weight zero point is not 0 (the TPU's weights are symmetric)")

    def bias(self, name: str, x_scale: float, w_scale: np.ndarray, op_name: str):
        """int32 bias in units of x.scale * w_scale[n]; (None, None) without one."""
        if not name:
            return None, None
        target = np.float32(x_scale) * w_scale
        dq = self.g.producer.get(name)
        if dq is not None and dq.op_type == "DequantizeLinear":
            b = self._const(dq.inputs[0], "bias", dq)
            scale = self._per_channel(self._const(dq.input(1), "bias scale", dq), len(w_scale))
            zp = self.g.constant(dq.input(2)) if dq.input(2) else None
            real = (b.astype(np.float64) - (0 if zp is None else zp.astype(np.float64))) * scale
            node = dq.name
            if b.size == len(w_scale) and b.dtype == np.int32 and \
                    (zp is None or not np.any(zp)) and np.allclose(scale, target, rtol=1e-6,
                                                                   atol=0):
                return b.astype(np.int32).reshape(-1), node
        else:
            real = self._const(name, "bias", None).astype(np.float64)
            node = None
        if real.size != len(w_scale):
            raise NotMapped(f"its bias has {real.size} values for {len(w_scale)} outputs")
        q = np.rint(real.reshape(-1) / target.astype(np.float64))
        if np.abs(q).max(initial=0) > 2**31 - 1:
            raise NotMapped("its bias does not fit int32 at scale x.scale * w.scale")
        self.notes.setdefault(op_name, []).append(
            "bias requantized to x.scale * w.scale (rounded to the nearest integer)")
        return q.astype(np.int32), node

    # --- operators ----------------------------------------------------------------------

    def dense_or_conv(self, node: Node, source: Source, w_kn: np.ndarray, w_scale,
                      bias, out_name: str, out_quant: QParams, act, nodes):
        """A Gemm/MatMul: Dense over a vector, Conv with a whole-image kernel over an image,
        a 1x1 Conv over the rows of a rank-3+ activation (a Dense applied to every row).
        w_kn is (K, N) in the consumer's order (a view; copied once here if reordered)."""
        k, n = w_kn.shape
        if len(source.shape) >= 2:
            return self._dense_rows(node, source, w_kn, w_scale, bias, out_name, out_quant,
                                    act, nodes)
        if len(source.shape) != 1 or source.shape[0] != k:
            raise NotMapped(f"its input has shape {source.shape}, expected ({k},)")
        src_shape, last = self.natural(source.tensor)
        if last and source.tensor not in self.tensors:      # made on the host: a vector
            src_shape, last = (int(np.prod(src_shape)),), False
        if source.index is not None:
            w_kn = w_kn[np.argsort(source.index)]           # row j reads source element j
        x = self.ir_tensor(source.tensor, source.quant, src_shape, last)
        if len(src_shape) == 3:
            c, h, wd = src_shape
            if last:       # ONNX flat order (rows, C): element j is channel j % C of row j // C
                weight = np.ascontiguousarray(w_kn.reshape(h * wd, c, n).transpose(2, 1, 0)
                                              ).reshape(n, c, h, wd)
            else:
                weight = np.ascontiguousarray(w_kn.T).reshape(n, c, h, wd)
            y = self.tensor(out_name, out_quant, (n, 1, 1))
            return Conv(node.name, x, y, weight, w_scale, bias, (1, 1), (0, 0, 0, 0), act,
                        tuple(nodes))
        if len(src_shape) != 1:
            raise NotMapped(f"its input '{source.tensor}' has rank {len(src_shape)}")
        y = self.tensor(out_name, out_quant, (n,))
        return Dense(node.name, x, y, w_kn, w_scale, bias, act, tuple(nodes))

    def _dense_rows(self, node, source, w_kn, w_scale, bias, out_name, out_quant, act, nodes):
        """MatMul over (*rows, K): every leading dimension is a row.  The activation is the
        channels-last image (K, rows, 1), the MatMul a 1x1 Conv over it."""
        k, n = w_kn.shape
        if source.shape[-1] != k:
            raise NotMapped(f"its input has shape {source.shape}, expected (..., {k})")
        image = self._channels_moved_last(source, k)
        if image is not None:        # an image read as (*pixels, C): a 1x1 Conv over it
            x = self.ir_tensor(source.tensor, source.quant, image)
            y = self.ir_tensor(out_name, out_quant, (n,) + image[1:], True)
            weight = np.ascontiguousarray(w_kn.T).reshape(n, k, 1, 1)
            return Conv(node.name, x, y, weight, w_scale, bias, (1, 1), (0, 0, 0, 0), act,
                        tuple(nodes))
        if source.index is not None:
            raise NotMapped("its input's rows are rearranged by a layout node (Transpose)")
        total = int(np.prod(source.shape))
        shape = (k, total // k, 1)
        known = self.tensors.get(source.tensor)
        if known is not None and known.channels_last and known.shape[0] == k:
            shape = known.shape             # rows of a Conv's pixels, (k, H, W)
        x = self.ir_tensor(source.tensor, source.quant, shape, True)
        y = self.ir_tensor(out_name, out_quant, (n,) + shape[1:], True)
        out_shape = self.g.sample_shape(out_name)
        if out_shape is not None and int(np.prod(out_shape)) != n * (total // k):
            raise NotMapped(f"its output has shape {out_shape}, expected {total // k} rows "
                            f"of {n}")
        groups = block_diagonal_groups(w_kn)
        weight = np.ascontiguousarray(w_kn.T).reshape(n, groups, k // groups)[
            np.arange(n), np.arange(n) // (n // groups)].reshape(n, k // groups, 1, 1)
        return Conv(node.name, x, y, weight, w_scale, bias, (1, 1), (0, 0, 0, 0), act,
                    tuple(nodes), groups)

    def _channels_moved_last(self, source: Source, k: int):
        """The IR image (C, H, W) when the consumer reads an image (C, H, W) or a 1-D
        signal (C, L) with its channels moved last by a Transpose ((N, L, C): a Conv1d
        before a Dense), so that a 1x1 Conv reads it in place; else None."""
        if source.index is None:
            return None
        known = self.tensors.get(source.tensor)
        if known is not None:
            if known.channels_last or len(known.shape) != 3:
                return None
            image = known.shape
        else:
            onnx_shape = self.g.sample_shape(source.tensor)
            if onnx_shape is None or len(onnx_shape) not in (2, 3):
                return None
            image = tuple(onnx_shape) if len(onnx_shape) == 3 else \
                (onnx_shape[0], onnx_shape[1], 1)
        c = image[0]
        pixels = int(np.prod(image[1:]))
        moved = np.arange(c * pixels).reshape(c, pixels).T.reshape(-1)
        if c != k or not np.array_equal(source.index, moved):
            return None
        return tuple(int(d) for d in image)

    def lower_gemm(self, node: Node) -> Operator:
        if node.attr("transA", 0):
            raise NotMapped("transA=1")
        if node.attr("alpha", 1.0) != 1.0 or (node.input(2) and node.attr("beta", 1.0) != 1.0):
            raise NotMapped("alpha or beta is not 1")
        trans_b = node.attr("transB", 0)
        self._constant_operand(node)
        source = self.trace(node.inputs[0])
        w, scale, zp, wnode = self.qdq_weight(node.inputs[1], 0 if trans_b else 1)
        self._check_symmetric(zp)
        w_kn = w.T if trans_b else w
        return self._finish_dense(node, source, w_kn, scale, node.input(2), [wnode])

    def lower_matmul(self, node: Node) -> Operator:
        if len(self.g.shapes.get(node.inputs[0], ())) < 2:
            raise NotMapped("MatMul of a tensor without a batch dimension")
        self._constant_operand(node)
        source = self._merged_heads(node, self.trace(node.inputs[0]))
        w, scale, zp, wnode = self.qdq_weight(node.inputs[1], 1)
        if w.ndim != 2:
            raise NotMapped("its weight is not a matrix")
        self._check_symmetric(zp)
        return self._finish_dense(node, source, w, scale, "", [wnode])

    def _merged_heads(self, node: Node, source: Source, quant: QParams | None = None
                      ) -> Source:
        """A MatMul's input whose rows a Transpose reorders (attention heads merged): the
        quantized tensor after the layout nodes, which the host makes in the MatMul's
        layout (a QOperator model's Transpose and Reshape on bytes too)."""
        if source.index is not None and len(source.shape) >= 2 and \
                self._channels_moved_last(source, source.shape[-1]) is None:
            return self.trace(node.inputs[0], quant, through_layout=False)
        return source

    def _constant_operand(self, node: Node) -> None:
        """A MatMul/Gemm whose second operand changes per sample stays on the host."""
        def constant(name):
            dq = self.g.producer.get(name)
            if dq is not None and dq.op_type == "DequantizeLinear":
                name = dq.inputs[0]
            return self.g.is_constant(name)
        if constant(node.inputs[1]):
            return
        if constant(node.inputs[0]):
            raise NotMapped(f"{node.op_type} of a constant by an activation (W @ x): the "
                            f"TPU maps x @ W")
        made = self.weight_made_at_run_time(node)
        if made:
            raise NotMapped(made)
        raise NotMapped(f"{node.op_type} of two activations (e.g. attention scores): "
                        f"the array's weights are constants, so it runs on the host")

    def weight_made_at_run_time(self, node: Node) -> str | None:
        """Why a Conv/Gemm/MatMul stays on the host when its weight is computed from constants
        only, at run time (ONNX's 'light' zoo models make weights with ConstantOfShape): that,
        not what the missing quantization looks like, is what the user needs to know."""
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.inputs) < 2:
            return None
        weight = node.inputs[1]
        dq = self.g.producer.get(weight)
        if dq is not None and dq.op_type == "DequantizeLinear":
            weight = dq.inputs[0]
        if self.g.is_constant(weight) or self._reads_model_inputs(weight):
            return None
        from tpuasm.compiler.front.fold import MAX_ELEMENTS
        return (f"{node.op_type} whose weight '{weight}' is computed from constants at run "
                f"time (constant folding materialises at most {MAX_ELEMENTS:,} elements), so "
                f"it runs on the host")

    def _reads_model_inputs(self, tensor: str) -> bool:
        """Whether `tensor` depends on any input of the model (else only on constants)."""
        inputs, seen, todo = set(self.g.inputs), set(), [tensor]
        while todo:
            name = todo.pop()
            if name in inputs:
                return True
            if name in seen:
                continue
            seen.add(name)
            producer = self.g.producer.get(name)
            if producer is not None:
                todo.extend(i for i in producer.inputs if i)
        return False

    def _finish_dense(self, node, source, w_kn, scale, bias_name, extra_nodes):
        w_scale = self._per_channel(scale, w_kn.shape[1])
        start, add = None, []
        if not bias_name:
            found = self._bias_add(node, w_kn.shape[1])
            if found is not None:
                add_node, bias_name = found
                start, add = add_node.outputs[0], [add_node.name]
        bias, bnode = self.bias(bias_name, source.quant.scale, w_scale, node.name)
        out, out_q, act, fused = self.quantized_output(node, allow_activation=True, out=start)
        nodes = [node.name, *source.nodes, *extra_nodes, *([bnode] if bnode else []), *add,
                 *fused]
        return self.dense_or_conv(node, source, w_kn, w_scale, bias, out, out_q, act, nodes)

    def _bias_add(self, node: Node, n: int):
        """An Add right after a MatMul whose other operand is a constant of n values along
        the last axis (DequantizeLinear of an int32 bias, or a float constant): (the Add,
        the bias operand) to fuse, else None."""
        out = node.outputs[0]
        cons = self.g.consumers.get(out, [])
        if out in self.g.outputs or len(cons) != 1 or cons[0].op_type != "Add":
            return None
        add = cons[0]
        others = [i for i in add.inputs if i != out]
        if len(others) != 1 or len(add.inputs) != 2:
            return None
        name = others[0]
        dq = self.g.producer.get(name)
        value = self.g.constant(dq.inputs[0] if dq is not None and
                                dq.op_type == "DequantizeLinear" else name)
        if value is None or value.size != n or (value.ndim and value.shape[-1] != n):
            return None
        if self.g.shapes.get(add.outputs[0]) != self.g.shapes.get(out):
            return None                     # the constant broadcasts the output up
        return add, name

    def _image_source(self, source: Source, node: Node):
        """The (C, H, W) image a Conv/Pool reads: the consumer's view of its source, which
        layout nodes may reshape but not reorder (the same bytes in the same order)."""
        if len(source.shape) != 3:
            raise NotMapped(f"its input has shape {source.shape}, not (C, H, W)")
        return self._view_source(source, tuple(source.shape))

    def _line_source(self, source: Source) -> Tensor:
        """A 1-D signal (C, L) as the image (C, L, 1): one pixel per row, so that a long
        signal is banded by rows and samples stack into one tall image like images do."""
        if len(source.shape) != 2:
            raise NotMapped(f"its input has shape {source.shape}, not (C, L)")
        c, length = source.shape
        return self._view_source(source, (c, length, 1))

    def _view_source(self, source: Source, shape: tuple) -> Tensor:
        if source.index is not None:
            raise NotMapped("its input is rearranged by a layout node")
        known = self.tensors.get(source.tensor)
        if known is not None and (known.channels_last or known.shape != shape):
            raise LayoutConflict(f"its input '{source.tensor}' is laid out as "
                                 f"{_layout(known.shape, known.channels_last)}, not as the "
                                 f"image {shape}", source.tensor)
        return self.ir_tensor(source.tensor, source.quant, shape)

    def _conv_geometry(self, node: Node, kernel, image_hw, spread: bool = False):
        """(strides, pads) of a 2-D window; a 1-D one (kernel (k,), image (L,)) as the 2-D
        window (k, 1) over an image of width 1: strides (s, s) (the horizontal one never
        moves), pads (begin, 0, end, 0).  `spread`: the kernel is a dilated one's, its zeros
        already between the taps (auto_pad's SAME then pads for its whole reach, as ONNX
        does)."""
        d = len(kernel)
        if d not in (1, 2) or len(image_hw) != d:
            raise NotMapped("not a 1-D or 2-D operation")
        if not spread and any(v != 1 for v in node.attr("dilations", [1] * d)):
            raise NotMapped("dilation is not 1")
        strides = tuple(node.attr("strides", [1] * d))
        pads = list(node.attr("pads", [0] * 2 * d))
        auto = node.attr("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if len(strides) != d or len(pads) != 2 * d:
            raise NotMapped(f"strides {strides} or pads {pads} do not fit a {d}-D kernel")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            begin, end = [], []
            for size, k, s in zip(image_hw, kernel, strides):
                total = max((-(-size // s) - 1) * s + k - size, 0)
                small, big = total // 2, total - total // 2
                begin.append(small if auto == "SAME_UPPER" else big)
                end.append(big if auto == "SAME_UPPER" else small)
            pads = begin + end
        elif auto == "VALID":
            pads = [0] * 2 * d
        if d == 1:
            return (int(strides[0]),) * 2, (int(pads[0]), 0, int(pads[1]), 0)
        return tuple(int(v) for v in strides), tuple(int(p) for p in pads)

    def lower_conv(self, node: Node) -> Operator:
        source = self.trace(node.inputs[0], allow_pad=True, reorder_fallback=True)
        w, scale, zp, wnode = self.qdq_weight(node.inputs[1], 0)
        self._check_symmetric(zp)
        w_scale = self._per_channel(scale, w.shape[0])
        bias, bnode = self.bias(node.input(2), source.quant.scale, w_scale, node.name)
        out, out_q, act, fused = self.quantized_output(node, allow_activation=True)
        nodes = [node.name, *source.nodes, wnode, *([bnode] if bnode else []), *fused]
        return self.conv_op(node, source, w, w_scale, bias, out, out_q, act, nodes)

    def conv_op(self, node: Node, source: Source, w, w_scale, bias, out, out_q, act,
                nodes) -> Conv:
        """A 2-D or 1-D (as width 1) convolution with any number of groups."""
        groups = int(node.attr("group", 1))
        if w.ndim not in (3, 4):
            raise NotMapped(f"a {w.ndim - 2}-D convolution (the TPU maps 1-D and 2-D)")
        dilations = [int(v) for v in node.attr("dilations", [1] * (w.ndim - 2))]
        if len(dilations) != w.ndim - 2 or min(dilations) < 1:
            raise NotMapped(f"dilations {dilations} do not fit a {w.ndim - 2}-D kernel")
        if max(dilations) > 1:
            # a quantized model's dilated Conv (a float model's was rewritten by convforms):
            # its integer kernel with zeros between the taps is the same sum; the array does
            # the zero products too (the report's utilisation)
            w = spread_kernel(w, dilations)
        extra = (0, 0, 0, 0)
        if source.pads:                                   # a folded Pad of zeros
            if len(source.pads) != 2 * (w.ndim - 2):
                raise NotMapped("a Pad of another rank than the convolution")
            extra = source.pads if w.ndim == 4 else (source.pads[0], 0, source.pads[1], 0)
        if w.ndim == 3:
            x = self._line_source(source)
            weight = w.reshape(w.shape[0], w.shape[1], w.shape[2], 1)
            padded = (x.shape[1] + extra[0] + extra[2],)
        else:
            if len(source.shape) != 3:
                raise NotMapped(f"its input has shape {source.shape}, not (C, H, W)")
            padded = (source.shape[1] + extra[0] + extra[2],
                      source.shape[2] + extra[1] + extra[3])
        strides, pads = self._conv_geometry(node, w.shape[2:], padded, spread=True)
        pads = tuple(a + b for a, b in zip(pads, extra))
        if w.ndim == 4 and source.shape[1] == 1 and w.shape[2] == 1 and not (pads[0] or
                                                                             pads[2]):
            # a 1-D signal as a 2-D conv of height 1 (a Conv1d exported as Conv2d): the
            # same bytes as the signal (C, W, 1) with the kernel turned (k, 1)
            x = self._view_source(source, (source.shape[0], source.shape[2], 1))
            weight = w.transpose(0, 1, 3, 2)
            strides, pads = (strides[1],) * 2, (pads[1], 0, pads[3], 0)
        elif w.ndim == 4:
            x = self._image_source(source, node)
            weight = w
        o, cg, kh, kw = weight.shape
        if groups < 1 or o % groups or cg * groups != x.shape[0]:
            raise NotMapped(f"weight {tuple(w.shape)} with group={groups} does not fit "
                            f"{x.shape[0]} input channels")
        _c, h, wd = x.shape
        ho = (h + pads[0] + pads[2] - kh) // strides[0] + 1
        wo = (wd + pads[1] + pads[3] - kw) // strides[1] + 1
        if ho < 1 or wo < 1:
            raise NotMapped("the kernel is larger than the padded input")
        onnx_out = self.g.sample_shape(out)
        expected = (o, ho) if w.ndim == 3 else (o, 1, ho) if weight is not w else (o, ho, wo)
        if onnx_out is not None and tuple(onnx_out) != expected:
            raise NotMapped(f"output shape {onnx_out} is not the convolution's {expected}")
        y = self.ir_tensor(out, out_q, (o, ho, wo))
        if weight is not w:
            self.notes.setdefault(node.name, []).append(
                f"a 1-D convolution: the signal ({x.shape[0]}, {h}) as the image "
                f"({x.shape[0]}, {h}, 1), a pixel per row")
        return Conv(node.name, x, y, weight, w_scale, bias, strides, pads, act, tuple(nodes),
                    groups)

    def lower_pool(self, node: Node, quant_in=None, out=None, out_q=None, fused=()) -> Operator:
        op = node.op_type.replace("QLinear", "")
        source = self.trace(node.inputs[0], quant_in, reorder_fallback=True)
        x = self._image_source(source, node)
        if out is None:
            out, out_q, _, fused = self.quantized_output(node, allow_activation=False)
        c, h, w = x.shape
        if op == "GlobalAveragePool":
            kernel, strides, pads, include = (h, w), (1, 1), (0, 0, 0, 0), False
        else:
            kernel = tuple(node.attr("kernel_shape"))
            strides, pads = self._conv_geometry(node, kernel, (h, w))
            include = bool(node.attr("count_include_pad", 0))
            if node.attr("ceil_mode", 0):
                pads = self._ceil_pads(kernel, strides, pads, (h, w), op, include)
            if len(node.outputs) > 1 and node.outputs[1]:
                raise NotMapped("MaxPool with an Indices output")
        kind = "max" if op == "MaxPool" else "avg"
        if x.quant.wide or out_q.wide:
            raise NotMapped(_WIDE_REFUSED)
        if kind == "max" and out_q != x.quant:
            raise NotMapped("max pooling whose output is quantized differently from its input")
        y = self.tensor(out, out_q)
        ho = (h + pads[0] + pads[2] - kernel[0]) // strides[0] + 1
        wo = (w + pads[1] + pads[3] - kernel[1]) // strides[1] + 1
        if y.shape != (c, ho, wo):
            raise NotMapped(f"output shape {y.shape} is not the pooled shape {(c, ho, wo)}")
        return Pool(node.name, x, y, kind, tuple(kernel), tuple(strides), pads, include,
                    (node.name, *source.nodes, *fused))

    @staticmethod
    def _ceil_pads(kernel, strides, pads, hw, op, include):
        """ceil_mode as extra bottom/right padding (exact for max, and for average when the
        padding is not counted)."""
        pads = list(pads)
        for axis in range(2):
            size = hw[axis] + pads[axis] + pads[axis + 2] - kernel[axis]
            extra = (-size) % strides[axis]
            if extra and op != "MaxPool" and include:
                raise NotMapped("ceil_mode with count_include_pad")
            pads[axis + 2] += extra
        return tuple(pads)

    def lower_lookup(self, node: Node) -> Operator:
        converted = self._converted(node.inputs[0])
        if converted is None:
            index, source = None, self.trace(node.inputs[0], reorder_fallback=True)
        else:
            index, wide, chain = converted
            source = self.trace(wide)
            source = replace(source, nodes=(*source.nodes, *chain))
        out, out_q, _, fused = self.quantized_output(node, allow_activation=False)
        x, y = self._elementwise(source, out, out_q, wide_in=index is not None)
        table = self._table(node, index or x.quant, out_q)
        return Lookup(node.name, x, y, table, node.op_type.lower(), (node.name, *source.nodes,
                                                                     *fused), index)

    def _converted(self, name: str):
        """(8-bit QParams, the int16 dequantized tensor, the chain's nodes) when `name` is a
        16-bit tensor converted to 8 bits (onnxruntime's `convert`: DequantizeLinear of the
        int16, QuantizeLinear to 8 bits, DequantizeLinear), the byte a table indexes; else
        None."""
        dq8 = self.g.producer.get(name)
        q8 = None if dq8 is None or dq8.op_type != "DequantizeLinear" else \
            self.g.producer.get(dq8.inputs[0])
        dq16 = None if q8 is None or q8.op_type != "QuantizeLinear" else \
            self.g.producer.get(q8.inputs[0])
        if dq16 is None or dq16.op_type != "DequantizeLinear" or \
                self.g.dtypes.get(dq16.inputs[0]) != np.dtype(np.int16) or \
                self.g.dtypes.get(q8.outputs[0]) not in _INT8:
            return None
        index = self.qparams(q8.input(1), q8.input(2), q8.outputs[0], q8)
        return index, dq16.outputs[0], (dq8.name, q8.name)

    def _elementwise(self, source: Source, out: str, out_q: QParams, wide_in: bool = False,
                     wide_out: bool = False):
        """Input and output tensors of an element-wise operator: the output in the input's
        IR shape and layout (any ONNX rank: the same bytes in the same order).  16-bit
        tensors as `wide_in` / `wide_out` allow (VADD / VMUL of two activations, a table
        reading a converted int16)."""
        if source.index is not None:
            raise NotMapped("its input is rearranged by a layout node")
        if (source.quant.wide and not wide_in) or (out_q.wide and not wide_out):
            raise NotMapped(_WIDE_REFUSED)
        shape, last = self.natural(source.tensor)
        onnx_shape = self.g.sample_shape(source.tensor)
        if source.tensor not in self.tensors and last and len(onnx_shape) == 2 and \
                self._read_by_conv(out):
            shape, last = (onnx_shape[0], onnx_shape[1], 1), False     # a 1-D signal
        x = self.ir_tensor(source.tensor, source.quant, shape, last)
        return x, self.ir_tensor(out, out_q, shape, last)

    def _read_by_conv(self, name: str) -> bool:
        """Whether a quantized tensor feeds a convolution (through its DequantizeLinear)."""
        for node in self.g.consumers.get(name, []):
            if node.op_type in ("Conv", "QLinearConv"):
                return True
            if node.op_type == "DequantizeLinear" and any(
                    c.op_type == "Conv" for c in self.g.consumers.get(node.outputs[0], [])):
                return True
        return False

    def _table(self, node: Node, x_q: QParams, out_q: QParams) -> np.ndarray:
        if self.table_builder is None:
            raise NotMapped("no table builder (onnxruntime) available")
        return self.table_builder(self.g, node, x_q, out_q)

    # --- element-wise Add / Sub / Mul (VADD / VMUL) ---------------------------------------

    def lower_binary(self, node: Node) -> Operator:
        """DequantizeLinear(a), DequantizeLinear(b) -> Add | Sub | Mul (-> Relu | Clip) ->
        QuantizeLinear: an Elementwise over two quantized tensors of one shape, or over one
        and a constant (quantized, or a float scalar) broadcast per channel."""
        kind = node.op_type.lower()
        if len(node.inputs) != 2 or not all(node.inputs):
            raise NotMapped(f"{node.op_type} without two inputs")
        consts = [self._constant_operand_value(name) for name in node.inputs]
        try:
            if consts[0] is not None and consts[1] is not None:
                raise NotMapped("both operands are constants")
            if any(c is not None for c in consts):
                k = 0 if consts[0] is not None else 1
                source = self.trace(node.inputs[1 - k])
                out, out_q, act, fused = self.quantized_output(node, allow_activation=True)
                return self._binary_constant(node, kind, source, consts[k], node.inputs[k],
                                             reverse=k == 0, out=out, out_q=out_q, act=act,
                                             nodes=[node.name, *source.nodes, *fused])
            small = self._binary_operands(node.inputs[0], node.inputs[1], node)
            sources = [self.trace(name) for name in node.inputs]
            out, out_q, act, fused = self.quantized_output(node, allow_activation=True)
            return self._binary(node, kind, sources, out, out_q, act,
                                [node.name, *sources[0].nodes, *sources[1].nodes, *fused],
                                small)
        except NotMapped as e:
            raise NotMapped(f"element-wise {node.op_type} runs on the host: {e}") from None

    def lower_qlinear_binary(self, node: Node) -> Operator:
        """com.microsoft QLinearAdd / QLinearMul (A, A_scale, A_zp, B, B_scale, B_zp,
        C_scale, C_zp); a constant A or B is the per-channel constant form."""
        if len(node.inputs) < 7 or not node.input(0) or not node.input(3):
            raise NotMapped(f"{node.op_type} without two inputs and an output scale")
        aq = self.qparams(node.input(1), node.input(2), node.input(0), node)
        bq = self.qparams(node.input(4), node.input(5), node.input(3), node)
        yq = self.qparams(node.input(6), node.input(7) if len(node.inputs) > 7 else "",
                          node.outputs[0], node)
        kind = node.op_type.replace("QLinear", "").lower()
        names, quants = (node.input(0), node.input(3)), (aq, bq)
        constant = [self.g.constant(n) for n in names]
        if constant[0] is not None and constant[1] is not None:
            raise NotMapped("both operands are constants")
        for k in (0, 1):
            if constant[k] is not None:
                source = self.trace(names[1 - k], quants[1 - k])
                return self._binary_constant(node, kind, source, (constant[k], quants[k], None),
                                             names[k], reverse=False, out=node.outputs[0],
                                             out_q=yq, act=Activation(),
                                             nodes=[node.name, *source.nodes])
        small = self._binary_operands(node.input(0), node.input(3), node)
        sources = [self.trace(node.input(0), aq), self.trace(node.input(3), bq)]
        return self._binary(node, kind, sources, node.outputs[0], yq, Activation(),
                            [node.name, *sources[0].nodes, *sources[1].nodes], small)

    def _constant_operand_value(self, name: str):
        """(integers, QParams, DequantizeLinear node or None) of a constant operand of an
        element-wise node, else None: DequantizeLinear of an 8-bit constant (per tensor), or
        a float constant of one value k (exactly the integer 1 or -1 at scale |k|)."""
        dq = self.g.producer.get(name)
        if dq is not None and dq.op_type == "DequantizeLinear" and \
                self.g.is_constant(dq.inputs[0]):
            q = self.g.constant(dq.inputs[0])
            if q.dtype not in _INT8:
                raise NotMapped(f"its constant operand '{dq.inputs[0]}' is {q.dtype}")
            scale = self._const(dq.input(1), "scale", dq)
            if scale.size != 1:
                raise NotMapped("its constant operand is quantized per axis")
            zp = int(self._const(dq.input(2), "zero point", dq).reshape(-1)[0]) \
                if dq.input(2) else 0
            if not float(scale.reshape(-1)[0]) > 0:
                raise NotMapped("its constant operand's scale is not positive")
            return q, QParams(float(np.float32(scale.reshape(-1)[0])), zp,
                              q.dtype == np.int8), dq.name
        if not self.g.is_constant(name):
            return None
        value = np.asarray(self.g.constant(name))
        if value.dtype.kind != "f":
            raise NotMapped(f"its constant operand '{name}' is {value.dtype}")
        flat = value.astype(np.float32).reshape(-1)
        if flat.size == 0 or not np.all(flat == flat[0]) or not np.isfinite(flat[0]):
            raise NotMapped(f"its float constant operand '{name}' holds several values (not "
                            f"quantized, so with no exact 8-bit form; quantize it)")
        k = float(flat[0])
        ints = np.full(value.shape, 0 if k == 0 else (1 if k > 0 else -1), np.int16)
        return ints, QParams(abs(k) if k else 1.0, 0, True), None

    def _binary_constant(self, node: Node, kind: str, source: Source, const, const_name: str,
                         reverse: bool, out: str, out_q: QParams, act: Activation, nodes):
        """An Elementwise of one tensor and a constant b broadcast per channel (the B flag's
        constant row); `reverse`: the constant is the first operand (b - a for a Sub)."""
        ints, quant, dq_name = const
        _check_vector_operands([source], out_q)
        a, y = self._elementwise(source, out, out_q)
        per_channel = self._per_channel_constant(np.asarray(ints), source.tensor, a)
        if kind != "sub":
            reverse = False                      # add and mul commute
        if dq_name:
            nodes = [*nodes, dq_name]
        return Elementwise(node.name, a, None, y, kind, act, tuple(dict.fromkeys(nodes)),
                           per_channel, quant, reverse)

    def _per_channel_constant(self, value: np.ndarray, tensor: str, a: Tensor) -> np.ndarray:
        """A constant operand as one value per channel of `a` (a scalar stays one value):
        it must broadcast against a's ONNX shape without growing it and vary only along the
        channel axis (the last one of channels-last rows, else the first after the batch)."""
        sample = self.g.sample_shape(tensor)
        if sample is None:
            raise NotMapped(f"the shape of '{tensor}' is unknown")
        full = (1, *sample)
        if value.size == 1:
            return value.reshape(1)
        try:
            grown = np.broadcast_shapes(full, value.shape)
        except ValueError:
            raise NotMapped(f"its constant of shape {value.shape} does not broadcast "
                            f"against {tuple(sample)}") from None
        if grown != full:
            raise NotMapped(f"its constant of shape {value.shape} broadcasts the tensor "
                            f"{tuple(sample)} up")
        axis = len(full) - 1 if a.channels_last or len(full) == 2 else 1
        if full[axis] != a.shape[0]:
            raise NotMapped(f"'{tensor}' has {a.shape[0]} channels on the TPU, its ONNX "
                            f"shape {tuple(sample)}")
        spread = np.moveaxis(np.broadcast_to(value, full), axis, 0).reshape(a.shape[0], -1)
        if not np.all(spread == spread[:, :1]):
            raise NotMapped(f"its constant of shape {value.shape} varies along more than the "
                            f"channel axis (B's constant row repeats one row of channels)")
        return spread[:, 0].copy()

    def _binary_operands(self, a: str, b: str, node: Node):
        """Two activations of one shape (None), or one of them (its index) one value per
        channel of the other per sample ((C, 1, 1) against (C, H, W), (1, C) against
        (rows, C): a squeeze-and-excitation gate), read as B's row for every pixel; any
        other broadcast stays on the host."""
        sa, sb = self.g.sample_shape(a), self.g.sample_shape(b)
        if sa is None or sb is None:
            raise NotMapped("the shapes of its operands are unknown")
        sa, sb = tuple(sa), tuple(sb)
        if sa == sb:
            return None
        why = (f"it broadcasts the activation {sa} with the activation {sb} (VADD/VMUL read "
               f"rows of one shape, B's one row of channels per sample (a per-channel operand "
               f"(C, 1, 1) or (1, C)), or one channel spread over a row by the array)")
        for k, (small, big) in enumerate(((sa, sb), (sb, sa))):
            if len(small) == len(big) and small != big and \
                    all(d == 1 or d == e for d, e in zip(small, big)):
                return k          # which form (_binary) depends on the big one's channel axis
        raise NotMapped(why)

    def _binary(self, node: Node, kind: str, sources, out: str, out_q: QParams,
                act: Activation, nodes, small=None) -> Operator:
        a_src, b_src = sources
        reverse = False
        if small is not None and small == 0:   # the broadcast operand is B: b - a for a Sub
            a_src, b_src = b_src, a_src
            reverse = kind == "sub"
        _check_vector_operands(sources, out_q)
        if out_q.wide and act.kind != "none":
            raise NotMapped(f"a fused {act.kind} on an int16 output (the clamp is a table, "
                            f"which writes bytes)")
        wide = small is None           # 16-bit operands: two activations of one shape
        a, y = self._elementwise(a_src, out, out_q, wide_in=wide, wide_out=wide)
        if b_src.quant.wide and not wide:
            raise NotMapped(_WIDE_REFUSED)
        if small is None:
            b = self.ir_tensor(b_src.tensor, b_src.quant, a.shape, a.channels_last)
        else:
            b = self._broadcast_operand(b_src, a)
        return Elementwise(node.name, a, b, y, kind, act, tuple(dict.fromkeys(nodes)),
                           reverse=reverse)

    def _broadcast_operand(self, source: Source, a: Tensor) -> Tensor:
        """The smaller operand of a broadcast against `a`, as the IR tensor the back end
        reads: one channel of a's pixels ((1, H, W) against (C, H, W), (T, 1) against
        (T, C), (1,) against (C,); spread over every channel by the array) or one pixel of
        a's channels per sample ((C, 1, 1), (1, C); B's row per sample)."""
        onnx_big = tuple(self.g.sample_shape(a.name))
        shape = tuple(self.g.sample_shape(source.tensor))
        axis = len(onnx_big) - 1 if a.channels_last else 0      # the channel axis
        if onnx_big[axis] != a.shape[0]:
            raise NotMapped(f"'{a.name}' has {a.shape[0]} channels on the TPU, its ONNX "
                            f"shape {onnx_big}")
        others = [i for i in range(len(onnx_big)) if i != axis]
        if shape[axis] == 1 and all(shape[i] == onnx_big[i] for i in others):
            return self.ir_tensor(source.tensor, source.quant, (1, *a.shape[1:]),
                                  a.channels_last)
        if shape[axis] != a.shape[0] or any(shape[i] != 1 for i in others):
            raise NotMapped(f"its operand '{source.tensor}' {shape} is neither one channel "
                            f"nor one pixel of '{a.name}' {onnx_big}")
        return self._channel_pixel(source, a)

    def _channel_pixel(self, source: Source, a: Tensor) -> Tensor:
        """The broadcast operand as one pixel of a's channels per sample, in the IR shape it
        has (a Dense's (C,)) or gets ((C, 1, 1), or channels-last (C, 1, 1)): the same UB
        rows, one per chunk and sample."""
        known = self.tensors.get(source.tensor)
        if known is not None:
            if known.quant != source.quant:
                raise NotMapped(f"'{source.tensor}' is read with two different quantizations")
            if known.shape[0] != a.shape[0] or int(np.prod(known.shape[1:])) != 1:
                raise NotMapped(f"'{source.tensor}' is laid out as {known.shape}, not one "
                                f"pixel of {a.shape[0]} channels")
            return known
        pixel = (a.shape[0],) if len(a.shape) == 1 else (a.shape[0], 1, 1)
        return self.ir_tensor(source.tensor, source.quant, pixel, a.channels_last)

    # --- QOperator forms ----------------------------------------------------------------

    def lower_qlinear(self, node: Node) -> Operator:
        op = node.op_type
        if op in ("QLinearConv", "QLinearMatMul"):
            xq = self.qparams(node.input(1), node.input(2), node.inputs[0], node)
            w = self._const(node.input(3), "weight", node)
            if w.dtype != np.int8:
                raise NotMapped(f"its weight is {w.dtype}, the TPU's weights are int8")
            self._check_symmetric(self.g.constant(node.input(5)) if node.input(5) else None)
            yq = self.qparams(node.input(6), node.input(7), node.outputs[0], node)
            source = self.trace(node.inputs[0], xq, allow_pad=op == "QLinearConv",
                                reorder_fallback=op == "QLinearConv")
            n_axis = 0 if op == "QLinearConv" else 1
            w_scale = self._per_channel(self._const(node.input(4), "weight scale", node),
                                        w.shape[n_axis])
            y_name = node.outputs[0]
            if op == "QLinearMatMul":
                if w.ndim != 2 or len(self.g.shapes.get(node.inputs[0], ())) < 2:
                    raise NotMapped("QLinearMatMul that is not (batch, ..., K) x (K, N)")
                source = self._merged_heads(node, source, xq)
                return self.dense_or_conv(node, source, w, w_scale, None, y_name, yq,
                                          Activation(), [node.name, *source.nodes])
            bias = None
            if node.input(8):
                bias = self._const(node.input(8), "bias", node).astype(np.int32).reshape(-1)
            return self.conv_op(node, source, w, w_scale, bias, y_name, yq, Activation(),
                                (node.name, *source.nodes))
        if op == "QGemm":
            if node.attr("transA", 0) or node.attr("alpha", 1.0) != 1.0:
                raise NotMapped("transA or alpha")
            if len(node.inputs) < 8 or not node.input(7):
                raise NotMapped("a float output (no y_scale)")
            xq = self.qparams(node.input(1), node.input(2), node.inputs[0], node)
            w = self._const(node.input(3), "weight", node)
            if w.dtype != np.int8:
                raise NotMapped(f"its weight is {w.dtype}, the TPU's weights are int8")
            self._check_symmetric(self.g.constant(node.input(5)) if node.input(5) else None)
            trans_b = node.attr("transB", 0)
            w_kn = w.T if trans_b else w
            w_scale = self._per_channel(self._const(node.input(4), "weight scale", node),
                                        w_kn.shape[1])
            bias = None
            if node.input(6):
                bias = self._const(node.input(6), "bias", node).astype(np.int32).reshape(-1)
            yq = self.qparams(node.input(7), node.input(8), node.outputs[0], node)
            source = self.trace(node.inputs[0], xq)
            return self.dense_or_conv(node, source, w_kn, w_scale, bias, node.outputs[0], yq,
                                      Activation(), [node.name, *source.nodes])
        if op in ("QLinearAveragePool", "QLinearGlobalAveragePool"):
            if node.attr("channels_last", 0) or node.attr("nchw", 1) == 0:
                raise NotMapped("channels-last layout")
            xq = self.qparams(node.input(1), node.input(2), node.inputs[0], node)
            yq = self.qparams(node.input(3), node.input(4), node.outputs[0], node)
            return self.lower_pool(node, xq, node.outputs[0], yq, ())
        if op in QLINEAR_LOOKUP_OPS:
            xq = self.qparams(node.input(1), node.input(2), node.inputs[0], node)
            yq = self.qparams(node.input(3), node.input(4), node.outputs[0], node)
            source = self.trace(node.inputs[0], xq, reorder_fallback=True)
            x, y = self._elementwise(source, node.outputs[0], yq)
            table = self._table(node, x.quant, yq)
            return Lookup(node.name, x, y, table, op.replace("QLinear", "").lower(),
                          (node.name, *source.nodes))
        raise NotMapped(f"{op} has no TPU mapping")

    def lower_int_maxpool(self, node: Node) -> Operator:
        """MaxPool directly on an 8-bit tensor (QOperator models): shares its quantization."""
        self._qtype(node.inputs[0])
        producer = self.g.producer.get(node.inputs[0])
        quant = self._known_quant(node.inputs[0])
        if quant is None:
            raise NotMapped(f"the quantization of '{node.inputs[0]}' is unknown"
                            f" (produced by {producer})")
        return self.lower_pool(node, quant, node.outputs[0], quant, ())

    def _known_quant(self, name: str) -> QParams | None:
        if name in self.tensors:
            return self.tensors[name].quant
        node = self.g.producer.get(name)
        if node is not None and node.op_type == "QuantizeLinear":
            return self.qparams(node.input(1), node.input(2), name, node)
        return None

    # --- driver -------------------------------------------------------------------------

    def node_operator(self, node: Node) -> Operator:
        op = node.op_type
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            raise NotMapped(f"operator domain '{node.domain}'")
        if op == "Gemm":
            return self.lower_gemm(node)
        if op == "MatMul":
            return self.lower_matmul(node)
        if op == "Conv":
            return self.lower_conv(node)
        if op in ("MaxPool", "AveragePool", "GlobalAveragePool"):
            if self.g.dtypes.get(node.inputs[0]) in (np.dtype(np.int8), np.dtype(np.uint8)):
                return self.lower_int_maxpool(node)
            return self.lower_pool(node)
        if op in LOOKUP_OPS:
            return self.lower_lookup(node)
        if op in BINARY_OPS:
            return self.lower_binary(node)
        if op in QLINEAR_BINARY_OPS:
            return self.lower_qlinear_binary(node)
        if op.startswith("QLinear") or op == "QGemm":
            return self.lower_qlinear(node)
        if op in ("MatMulInteger", "ConvInteger"):
            raise NotMapped(f"{op} yields int32 accumulators; the TPU's operators requantize "
                            f"to 8 bits (use the QDQ or QLinear form; a dynamically quantized "
                            f"model is quantized statically with --calibrate DATA)")
        if op in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat"):
            raise NotMapped(f"{op} quantizes its input at run time (onnxruntime's fused "
                            f"dynamic form); the TPU's scales are fixed when compiling "
                            f"(--calibrate DATA reads it back as a float MatMul and "
                            f"quantizes it statically)")
        if op == "MatMulNBits":
            raise NotMapped("a weight-only quantized MatMul: its activation is float, the "
                            "TPU's operators read quantized ones (--calibrate DATA reads it "
                            "back as a float MatMul and quantizes it)")
        raise NotMapped(f"{op} has no TPU mapping")


def _check_vector_operands(sources, out_q: QParams) -> None:
    """A VADD / VMUL's 8-bit operands and output share one signedness (one U flag; a 16-bit
    one is always int16) and are read in place."""
    names = {True: "int8", False: "uint8"}
    narrow = [(f"operand '{src.tensor}'", src.quant) for src in sources
              if not src.quant.wide] + ([("the output", out_q)] if not out_q.wide else [])
    for what, q in narrow[1:]:
        if q.signed != narrow[0][1].signed:
            raise NotMapped(f"{narrow[0][0]} is {names[narrow[0][1].signed]} and {what} "
                            f"{names[q.signed]}: VADD/VMUL take one signedness (U flag)")
    for src in sources:
        if src.index is not None:
            raise NotMapped("an operand is rearranged by a layout node")


BINARY_OPS = {"Add", "Sub", "Mul"}             # VADD / VMUL
QLINEAR_BINARY_OPS = {"QLinearAdd", "QLinearMul"}
CANDIDATES = {"Gemm", "MatMul", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
              "QLinearConv", "QLinearMatMul", "QGemm", "QLinearAveragePool",
              "QLinearGlobalAveragePool", "MatMulInteger", "ConvInteger", "MatMulNBits",
              "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
              *LOOKUP_OPS, *QLINEAR_LOOKUP_OPS, *BINARY_OPS, *QLINEAR_BINARY_OPS}
GLUE = {"QuantizeLinear", "DequantizeLinear", "Constant", *LAYOUT_OPS}


ELEMENTWISE_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
                   "QLinearAdd", "QLinearMul"}
LAYOUT_HOST_OPS = {"Concat", "Split", "Slice", "Pad", "Gather", "Tile", "Expand",
                   "QLinearConcat"}


def block_diagonal_groups(w_kn: np.ndarray) -> int:
    """The most equal diagonal blocks a (K, N) weight is made of, zeros elsewhere (1: it is
    not so): einsumforms.py's per-head weights.  As a grouped 1x1 Conv the array skips the
    zero tiles instead of multiplying them."""
    k, n = w_kn.shape
    used = w_kn != 0
    if used.all():
        return 1                    # the common case: a dense weight
    for g in range(math.gcd(k, n), 1, -1):
        if k % g or n % g:
            continue
        occupied = used.reshape(g, k // g, g, n // g).any(axis=(1, 3))    # (g, g) blocks
        if not (occupied & ~np.eye(g, dtype=bool)).any():
            return g
    return 1


def host_reason(node: Node, graph: Graph) -> str:
    """Why a node with no TPU pattern runs on the host (the report's reason)."""
    op_type = node.op_type
    if op_type in ELEMENTWISE_OPS:
        return (f"element-wise {op_type} runs on the host: VADD/VMUL take Add, Sub and Mul "
                f"(of two quantized activations of one shape, or of one and a constant per "
                f"channel)")
    if op_type in LAYOUT_HOST_OPS:
        return (f"{op_type} moves data between tensors; runs on the host (an IR operator "
                f"writes one whole tensor)")
    if op_type in RECURRENT_OPS:
        article = "a" if op_type == "GRU" else "an"
        return (f"{op_type} runs on the host as one node: the TPU takes the gate MatMuls of "
                f"{article} {op_type} unrolled from a float model compiled with --calibrate "
                f"(onnxruntime's quantize_static leaves it float in a quantized model)")
    if op_type == "ConvTranspose":
        return ("ConvTranspose runs on the host: the TPU takes one rewritten as a Conv, from "
                "a float model, or from a QDQ model whose kernel is a DequantizeLinear of an "
                "integer constant and whose input is quantized, or a float one between "
                "quantized tensors (a QOperator model leaves it float: where nothing "
                "quantizes its output, its QDQ form, or the model with --calibrate, puts it "
                "on the TPU)")
    if op_type == "Einsum":
        if not any(graph.is_constant(i) for i in node.inputs if i):
            return ("Einsum of activations only (e.g. attention scores): the array's weights "
                    "are constants, so it runs on the host")
        return ("Einsum runs on the host: the TPU takes an Einsum of an activation and a "
                "constant weight rewritten as a MatMul, from a float model compiled with "
                "--calibrate (onnxruntime's quantize_static leaves it float in a quantized "
                "model)")
    if op_type in ("MultiHeadAttention", "GroupQueryAttention"):
        return (f"{op_type}: attention's products of two activations (Q K^T, the weights by "
                f"V) run on the host; its projections are MatMuls of their own")
    return f"{op_type} has no TPU mapping (runs on the host)"


RECURRENT_OPS = {"LSTM", "GRU", "RNN"}


def _mixed_rows(graph: Graph, op: Operator) -> str | None:
    """Why an operator cannot run in one program (None when it can): its tensors have
    different rows (Graph.rows), an Elementwise of a (64, C) and a (1, C) say, or more rows
    than a program may take (limits.MAX_BATCH, as --batch)."""
    from tpuasm.limits import MAX_BATCH
    rows = {t.name: graph.rows(t.name) for t in (*op.inputs, op.output)}
    known = {r for r in rows.values() if r is not None}
    if known and max(known) > MAX_BATCH:
        return (f"its tensors have {max(known):,} rows (leading dimension), above the "
                f"{MAX_BATCH:,} a TPU program takes (spec/limits.md)")
    if len(known) <= 1:
        return None
    listed = ", ".join(f"'{n}' {r}" for n, r in rows.items())
    return (f"its tensors have different rows (leading dimensions: {listed}); a TPU "
            f"program takes one row count")


def _constant_tensors(graph: Graph) -> set[str]:
    """Tensors computed from the model's initializers alone."""
    known = set(graph.initializers)
    for node in graph.nodes:
        if all(not t or t in known for t in node.inputs):
            known.update(o for o in node.outputs if o)
    return known


def _constant_input(op: Operator, constants: set[str]) -> str | None:
    """An operator reading a tensor made from weights alone (the quantized zeros of an
    unrolled LSTM's initial state) computes a constant: the host makes it, once per run,
    rather than a program with an input nothing before it would write."""
    made = [t.name for t in op.inputs if t.name in constants]
    return (f"its input '{made[0]}' is computed from the model's weights alone (a constant "
            f"for every input): the host computes it") if made else None


# rounds of lower(): each may send the element-wise operators that laid out a tensor a
# matrix operator needs in another layout to the host
_LAYOUT_ROUNDS = 4


def lower(graph: Graph, table_builder=None, supported=None) -> Lowered:
    """Try every compute node; return the operators and the reasons for the rest.
    `supported(op)`: None if the back end maps the operator, else why not.  A node whose
    lowering raises anything but NotMapped (a bug) stays on the host with the reason
    "internal: <message>": a model is never refused for it.

    Nodes are lowered in graph order, and the first operator to read or write a tensor
    fixes its layout.  An element-wise operator (a lookup, VADD / VMUL, a pool) keeps its
    input's, so it can fix a layout a matrix operator after it cannot read: Silero VAD's
    QDQ model computes its STFT magnitude with a Sqrt lookup in (frames, bins) rows, and
    its first Conv, 29 % of the MACs, needs the (bins, frames) image.  Such an element-wise
    operator goes to the host and the lowering runs again: the host then quantizes the
    tensor in the Conv's layout."""
    hosted: dict[str, str] = {}
    for _ in range(_LAYOUT_ROUNDS):
        lowered, conflicts = _lower_once(graph, table_builder, supported, hosted)
        found = {owner: node for node, owner in conflicts.items() if owner not in hosted}
        if not found:
            break
        for owner, node in found.items():
            hosted[owner] = (f"runs on the host so that '{node}' can read its output in "
                             f"that operator's layout (it would fix another)")
    return lowered


def _lower_once(graph: Graph, table_builder, supported, hosted: dict):
    """One greedy pass; (Lowered, {matrix node: the element-wise node whose output layout
    it could not read}).  `hosted`: nodes kept on the host, with their reasons."""
    from tpuasm.compiler.front.macs import MATRIX_OPS
    lw = Lowerer(graph, table_builder)
    constants = _constant_tensors(graph)
    operators, anchor, fused, reasons = [], {}, {}, {}
    owners: dict[str, tuple] = {}          # a tensor -> (the node that laid it out, op type)
    conflicts: dict[str, str] = {}
    for node in graph.nodes:
        if node.name in fused:
            continue                 # a Relu/Clip already fused into its producer
        if node.op_type not in CANDIDATES:
            if node.op_type not in GLUE:
                reasons[node.name] = host_reason(node, graph)
            continue
        if node.name in hosted:
            reasons[node.name] = hosted[node.name]
            continue
        before = dict(lw.tensors)
        try:
            op = lw.node_operator(node)
            why = supported(op) if supported else None
            if why:
                raise NotMapped(f"the back end does not map it: {why}")
        except NotMapped as e:
            lw.tensors = before
            lw.notes.pop(node.name, None)
            reasons[node.name] = lw.weight_made_at_run_time(node) or str(e)
            owner = owners.get(getattr(e, "tensor", None))
            if isinstance(e, LayoutConflict) and node.op_type in MATRIX_OPS and \
                    owner is not None and owner[1] not in MATRIX_OPS:
                conflicts[node.name] = owner[0]
            continue
        except Exception as e:     # noqa: BLE001 - a lowering bug: this node to the host
            lw.tensors = before
            lw.notes.pop(node.name, None)
            reasons[node.name] = f"internal: {type(e).__name__}: {e}"
            continue
        why = _mixed_rows(graph, op) or _constant_input(op, constants)
        if why:
            lw.tensors = before
            lw.notes.pop(node.name, None)
            reasons[node.name] = why
            continue
        operators.append(op)
        anchor[op.name] = node
        for name in op.nodes:
            fused.setdefault(name, op.name)
        for tensor in lw.tensors.keys() - before.keys():
            owners[tensor] = (node.name, node.op_type)
    return Lowered(operators, anchor, fused, reasons, lw.tensors, lw.notes), conflicts
