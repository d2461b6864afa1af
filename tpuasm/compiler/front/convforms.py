"""Convolutions rewritten in the forms the TPU maps (float model, before quantization; see
prepare.py for the other rewrites):

- a dilated Conv as a Conv over its kernel spread out with zeros (k taps at distance d become
  (k - 1) * d + 1 taps, the new ones zero): the array does the zero products too, which the
  report shows as lower utilisation, but the convolution is the same sum;
- a ConvTranspose (1-D or 2-D, explicit pads, any group, stride, dilation, output_padding) as
  a Conv over the input upsampled with zeros: a transposed convolution scatters each input
  element through the kernel, which is the same as gathering from an input with s - 1 zeros
  between elements, padded by (k - 1) * d - pad, with the kernel flipped and its two channel
  axes swapped (per group).  The upsampling is two Reshapes and a Pad on the host; the Conv
  goes to the TPU.

- a 3-D Conv as one 2-D Conv per output depth: the KD input planes it reads (a strided
  Slice) folded into the channels (C x KD), the kernel reshaped to match; the planes are cut
  and the outputs stacked on the host, the Convs run on the TPU (at most MAX_DEPTH_STEPS).

A form these do not cover (a ConvTranspose with `output_shape` or `auto_pad`, a 3-D
ConvTranspose, a weight that is not constant) stays as it is, on the host, with its
reason.

A quantized model keeps its own quantization: its ConvTransposes are rewritten the same way
on their integer kernels (rewrite_quantized_transposes, before matching), and its dilated
Convs are matched with the kernel spread by spread_kernel (match.conv_op)."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tpuasm.compiler.front.prepare import NotRewritten, _attr, _expand_nodes, _Index, _ranks
from tpuasm.compiler.front.provenance import Provenance


def rewrite_convolutions(model, prov: Provenance, reasons: dict[str, str] | None = None) -> int:
    """Dilated and 3-D Convs and ConvTransposes in place (see the module's text); the count
    done.  Each records in `prov.own_work` the share of its new products that are the
    network's own (the report's MACs)."""
    reasons = {} if reasons is None else reasons
    idx = _Index(model)
    ranks = _ranks(model)

    def wanted(node):
        if node.op_type == "ConvTranspose":
            return True
        return node.op_type == "Conv" and (_dilated(node) or _uneven_strides(node)
                                           or len(ranks.get(node.input[1], ())) == 5)

    def expand(node):
        w = _weight(idx, node)
        if node.op_type == "ConvTranspose":
            return _as_conv(idx, node, w, ranks, prov)
        if w.ndim == 5:
            return _per_depth(idx, node, w, ranks, prov)
        conv = _undilated(idx, node, w, prov) if _dilated(node) else node
        return _restrided(idx, conv, ranks, prov) if _uneven_strides(node) else [conv]

    return _expand_nodes(model, prov, reasons, "rewritten", wanted, expand)


def _dilated(node) -> bool:
    return any(d != 1 for d in _attr(node, "dilations", []))


def _uneven_strides(node) -> bool:
    return len(set(_attr(node, "strides", []))) > 1


def _restrided(idx: _Index, conv, ranks: dict, prov: Provenance) -> list:
    """A Conv whose strides differ by axis (OCR models' (2, 1)): MMC.C has one stride for
    both axes, so the Conv runs at their greatest common divisor g and a Slice on the host
    keeps every (s / g)-th output along each axis.  With L = in + pads - reach, the Conv at
    g gives L // g + 1 outputs, and every (s / g)-th of them is L // s + 1: the same ones."""
    if _attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise NotRewritten("auto_pad SAME with strides that differ by axis")
    strides = list(_attr(conv, "strides"))
    g = int(np.gcd.reduce(strides))
    steps = [st // g for st in strides]
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute if a.name != "strides"}
    every = idx.unique(conv.output[0] + "_every_" + str(g))
    made = [helper.make_node("Conv", list(conv.input), [every], name=conv.name,
                             strides=[g] * len(strides), **attrs)]
    axes = list(range(2, 2 + len(strides)))
    const = [idx.add_init(np.asarray(v, np.int64), f"{conv.name}_keep_{what}")
             for what, v in (("starts", [0] * len(axes)), ("ends", [2**62] * len(axes)),
                             ("axes", axes), ("steps", steps))]
    made.append(helper.make_node("Slice", [every, *const], [conv.output[0]],
                                 name=idx.unique(conv.name + "_keep_strided")))
    out = ranks.get(conv.output[0])
    if out and len(out) == 2 + len(strides) and all(isinstance(d, int) for d in out[2:]):
        kept = int(np.prod(out[2:]))
        # the outputs at stride g: L // g + 1 = ((out - 1) * s) // g + 1 at least, exactly
        # when the input's spatial shape is known
        kernel = _attr(conv, "kernel_shape") or list(idx.inits[conv.input[1]].dims[2:])
        computed = _outputs_at(ranks.get(conv.input[0]), conv, kernel, g) or \
            int(np.prod([(o - 1) * st + 1 for o, st in zip(out[2:], steps)]))
        num, den = prov.own_work.get(conv.name, (1, 1))
        prov.own_work[conv.name] = (num * kept, den * computed)
    return made


def _outputs_at(shape, conv, kernel, stride: int) -> int | None:
    """Output positions of `conv` at `stride` on both axes (None: input shape unknown)."""
    if not shape or any(not isinstance(d, int) for d in shape[2:]):
        return None
    spatial = len(kernel)
    pads = list(_attr(conv, "pads", [0] * 2 * spatial))
    dil = list(_attr(conv, "dilations", [1] * spatial))
    total = 1
    for i in range(spatial):
        reach = (kernel[i] - 1) * dil[i] + 1
        total *= (shape[2 + i] + pads[i] + pads[spatial + i] - reach) // stride + 1
    return total


def _weight(idx: _Index, node) -> np.ndarray:
    w = idx.const(node.input[1]) if len(node.input) > 1 else None
    if w is None:
        raise NotRewritten("its weight is not a constant")
    return w


def spread_kernel(w: np.ndarray, dilations) -> np.ndarray:
    """The kernel with d - 1 zeros between its taps along each spatial axis."""
    spatial = w.shape[2:]
    out = np.zeros(w.shape[:2] + tuple((k - 1) * d + 1 for k, d in zip(spatial, dilations)),
                   w.dtype)
    out[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dilations)] = w
    return out


def _undilated(idx: _Index, node, w: np.ndarray, prov: Provenance):
    dilations = list(_attr(node, "dilations"))
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotRewritten("auto_pad with dilations")
    wide = spread_kernel(w, dilations)
    inputs = [node.input[0], idx.add_init(wide, node.input[1] + "_spread"), *node.input[2:]]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute
             if a.name not in ("dilations", "kernel_shape")}
    attrs["kernel_shape"] = list(wide.shape[2:])
    prov.own_work[node.name] = (int(np.prod(w.shape[2:])), int(np.prod(wide.shape[2:])))
    return helper.make_node("Conv", inputs, [node.output[0]], name=node.name, **attrs)


def _as_conv(idx: _Index, node, w: np.ndarray, ranks: dict, prov: Provenance,
             quantized: _QuantizedTranspose | None = None) -> list:
    """The ConvTranspose `node` (kernel `w`) as a Conv over its input upsampled with zeros;
    `quantized`: its QDQ form (w the integer kernel), whose new kernel and upsampled input
    get their DequantizeLinear / QuantizeLinear nodes there."""
    spatial = w.ndim - 2
    if spatial not in (1, 2):
        raise NotRewritten(f"a {spatial}-D transposed convolution (1-D and 2-D are rewritten)")
    if _attr(node, "output_shape") is not None:
        raise NotRewritten("output_shape is given (only explicit pads are rewritten)")
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotRewritten("auto_pad is set (only explicit pads are rewritten)")
    group = int(_attr(node, "group", 1))
    strides = list(_attr(node, "strides", [1] * spatial))
    dilations = list(_attr(node, "dilations", [1] * spatial))
    pads = list(_attr(node, "pads", [0] * 2 * spatial))
    extra = list(_attr(node, "output_padding", [0] * spatial))
    shape = ranks.get(node.input[0])
    if shape is None or len(shape) != spatial + 2 or any(s is None for s in shape[2:]):
        raise NotRewritten("its input's spatial shape is not known")
    kernel = w.shape[2:]
    begin = [(k - 1) * d - p for k, d, p in zip(kernel, dilations, pads[:spatial])]
    end = [(k - 1) * d - p + e for k, d, p, e in zip(kernel, dilations, pads[spatial:], extra)]
    if min(begin + end) < 0:
        raise NotRewritten("its pads exceed the kernel's reach (a crop, not a padding)")

    cin, per_group = w.shape[0], w.shape[1]            # (C, O / group, *K)
    flipped = w.reshape((group, cin // group, per_group) + kernel)
    flipped = np.swapaxes(flipped, 1, 2).reshape((group * per_group, cin // group) + kernel)
    flipped = np.ascontiguousarray(flipped[(slice(None), slice(None))
                                           + (slice(None, None, -1),) * spatial])
    x = node.input[0]
    made = []
    if any(s != 1 for s in strides):
        x, made = _upsampled(idx, node, x, shape, strides)
        if quantized is not None:
            x = quantized.requantized(x, made)
    weight = (quantized.weight(flipped, group, made) if quantized is not None
              else idx.add_init(flipped, node.input[1] + "_as_conv"))
    made.append(helper.make_node("Conv", [x, weight, *node.input[2:3]], [node.output[0]],
                                 name=node.name, group=group, dilations=dilations,
                                 kernel_shape=list(kernel), pads=begin + end,
                                 strides=[1] * spatial))
    out = ranks.get(node.output[0])
    if out and all(isinstance(d, int) for d in out[2:]):
        # each input element meets the kernel once; each output element of the Conv meets
        # it whole, the zeros of the upsampled input included
        prov.own_work[node.name] = (int(np.prod(shape[2:])), int(np.prod(out[2:])))
    return made


def rewrite_quantized_transposes(model, prov: Provenance,
                                 reasons: dict[str, str] | None = None) -> int:
    """A QDQ model's ConvTransposes (DequantizeLinear of an integer constant kernel, of a
    per-tensor quantized input) as Convs, as _as_conv does for a float model: the integer
    kernel flipped and its channel axes swapped, the input upsampled with zeros on the host
    and quantized again at its own scale and zero point (the zeros are exact there), so that
    the Conv runs on the TPU with the model's own quantization.  The count done."""
    if not any(n.op_type == "ConvTranspose" for n in model.graph.node):
        return 0                        # the common case: no shape inference pass
    reasons = {} if reasons is None else reasons
    idx = _Index(model)
    ranks = _ranks(model)
    replaced: list[str] = []

    def expand(node):
        quantized = _QuantizedTranspose(idx, node)
        made = _as_conv(idx, node, quantized.kernel, ranks, prov, quantized)
        replaced.append(quantized.weight_dq.name)
        return made

    done = _expand_nodes(model, prov, reasons, "rewritten",
                         lambda n: n.op_type == "ConvTranspose", expand)
    if done:                  # the old kernels' DequantizeLinear nodes, if nothing else reads
        read = {i for n in model.graph.node for i in n.input} | {o.name for o in
                                                               model.graph.output}
        keep = [n for n in model.graph.node
                if not (n.name in replaced and n.output[0] not in read)]
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return done


class _QuantizedTranspose:
    """A QDQ ConvTranspose's integer kernel and the quantization of its input."""

    def __init__(self, idx: _Index, node):
        self.idx = idx
        self.bias_nodes: list = []      # a float bias quantized here (_weight_quantized)
        x_dq = idx.producer.get(node.input[0])
        w_dq = idx.producer.get(node.input[1]) if len(node.input) > 1 else None
        if x_dq is None or x_dq.op_type != "DequantizeLinear" or len(x_dq.input) < 2:
            raise NotRewritten("its input is not a DequantizeLinear (not quantized)")
        if w_dq is None and _quantized_after(idx, node):
            w_dq = self._weight_quantized(node, idx.const(x_dq.input[1]))
        if w_dq is None or w_dq.op_type != "DequantizeLinear":
            raise NotRewritten("its weight is not a DequantizeLinear of a constant")
        kernel = idx.const(w_dq.input[0])
        scale = idx.const(w_dq.input[1])
        zero = idx.const(w_dq.input[2]) if len(w_dq.input) > 2 and w_dq.input[2] else None
        x_scale = idx.const(x_dq.input[1])
        if kernel is None or scale is None or kernel.dtype.kind not in "iu":
            raise NotRewritten("its weight is not a DequantizeLinear of an integer constant")
        if x_scale is None or x_scale.size != 1:
            raise NotRewritten("its input's scale is not one constant")
        axis = _attr(w_dq, "axis", 1) % kernel.ndim
        if scale.size > 1 and axis != 1:
            raise NotRewritten(f"its kernel's scales are along axis {axis}, not the output "
                               f"channels' (1)")
        self.kernel, self.scale, self.zero, self.weight_dq = kernel, scale, zero, w_dq
        self.x_quant = list(x_dq.input[1:3])

    def _weight_quantized(self, node, x_scale):
        """A float kernel between a quantized input and a quantized output (onnxruntime's
        QOperator form leaves ConvTranspose float so): quantized here as quantize_static
        quantizes a Conv's, int8 symmetric per output channel (axis 1), its bias int32 at
        the input's scale times the kernel's; None when it is not a float constant.  The
        DequantizeLinear returned is not in the graph: weight() reads its inputs."""
        idx = self.idx
        w = idx.const(node.input[1])
        if w is None or w.dtype != np.float32 or x_scale is None or x_scale.size != 1:
            return None
        axes = tuple(a for a in range(w.ndim) if a != 1)
        scale = (np.abs(w).max(axis=axes) / 127.0).astype(np.float32)
        scale[scale == 0] = 1.0
        shape = [1] * w.ndim
        shape[1] = -1
        kernel = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        name = node.input[1] + "_quantized"
        inputs = [idx.add_init(kernel, name), idx.add_init(scale, name + "_scale"),
                  idx.add_init(np.zeros(scale.size, np.int8), name + "_zero_point")]
        b = idx.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if b is not None:
            group = int(_attr(node, "group", 1))
            b_scale = (float(x_scale.reshape(-1)[0]) * np.tile(scale, group)).astype(np.float32)
            self.bias_nodes = [helper.make_node(
                "DequantizeLinear", [idx.add_init(np.round(b / b_scale).astype(np.int32),
                                                  node.input[2] + "_quantized"),
                                     idx.add_init(b_scale, node.input[2] + "_scale"),
                                     idx.add_init(np.zeros(b_scale.size, np.int32),
                                                  node.input[2] + "_zero_point")],
                [idx.unique(node.input[2] + "_dequantized")],
                name=idx.unique(node.input[2] + "_DequantizeLinear"), axis=0)]
            node.input[2] = self.bias_nodes[0].output[0]
        return helper.make_node("DequantizeLinear", inputs, [name + "_dequantized"],
                                name=name + "_DequantizeLinear", axis=1)

    def weight(self, flipped: np.ndarray, group: int, made: list) -> str:
        """The Conv kernel's DequantizeLinear: per output channel (axis 0) the scale of its
        channel within its group, as the ConvTranspose had it."""
        idx, name = self.idx, self.weight_dq.input[0] + "_as_conv"
        made.extend(self.bias_nodes)
        inputs = [idx.add_init(flipped, name)]
        per_channel = self.scale.size > 1
        for part, what in ((self.scale, "scale"), (self.zero, "zero_point")):
            if part is not None:
                value = np.tile(part, group) if per_channel else part
                inputs.append(idx.add_init(value, f"{name}_{what}"))
        out = idx.unique(name + "_DequantizeLinear_Output")
        attrs = {"axis": 0} if per_channel else {}
        made.append(helper.make_node("DequantizeLinear", inputs, [out],
                                     name=idx.unique(name + "_DequantizeLinear"), **attrs))
        return out

    def requantized(self, x: str, made: list) -> str:
        """The upsampled input quantized at the input's own scale and zero point again."""
        idx = self.idx
        q, dq = idx.unique(x + "_QuantizeLinear_Output"), idx.unique(x + "_dequantized")
        made.append(helper.make_node("QuantizeLinear", [x, *self.x_quant], [q],
                                     name=idx.unique(x + "_QuantizeLinear")))
        made.append(helper.make_node("DequantizeLinear", [q, *self.x_quant], [dq],
                                     name=idx.unique(x + "_DequantizeLinear")))
        return dq


def _quantized_after(idx: _Index, node) -> bool:
    """Whether `node`'s output is quantized next: read by a QuantizeLinear alone, through a
    Relu / Clip (which the matcher fuses into the node)."""
    out = node.output[0]
    for _ in range(3):
        reader = idx.sole_consumer(out)
        if reader is None:
            return False
        if reader.op_type == "QuantizeLinear":
            return True
        if reader.op_type not in ("Relu", "Clip"):
            return False
        out = reader.output[0]
    return False


def _upsampled(idx: _Index, node, x: str, shape, strides) -> tuple[str, list]:
    """x with s - 1 zeros after every element along each spatial axis (and none after the
    last): Reshape to (N, C, H, 1, W, 1), Pad the unit axes to s, Reshape to (N, C, H*s,
    W*s), and the trailing zeros cut by a Slice."""
    spatial = shape[2:]
    tag = node.name + "_upsample"
    split = [0, 0] + [v for n in spatial for v in (n, 1)]
    pads = [0] * len(split) * 2
    for i, s in enumerate(strides):
        pads[len(split) + 3 + 2 * i] = s - 1          # end of each unit axis
    joined = [0, 0] + [n * s for n, s in zip(spatial, strides)]
    keep = [(n - 1) * s + 1 for n, s in zip(spatial, strides)]
    names = [idx.unique(f"{tag}_{part}") for part in ("split", "padded", "joined", "out")]
    nodes = [
        helper.make_node("Reshape", [x, idx.add_init(np.array(split, np.int64), tag + "_a")],
                         [names[0]], name=idx.unique(tag + "_reshape")),
        _pad(idx, names[0], names[1], pads, tag),
        helper.make_node("Reshape", [names[1], idx.add_init(np.array(joined, np.int64),
                                                            tag + "_b")],
                         [names[2]], name=idx.unique(tag + "_join")),
        helper.make_node("Slice", [names[2],
                                   idx.add_init(np.zeros(len(keep), np.int64), tag + "_s0"),
                                   idx.add_init(np.array(keep, np.int64), tag + "_s1"),
                                   idx.add_init(np.arange(2, 2 + len(keep), dtype=np.int64),
                                                tag + "_axes")],
                         [names[3]], name=idx.unique(tag + "_trim")),
    ]
    return names[3], nodes


def _pad(idx: _Index, x: str, out: str, pads: list, tag: str):
    name = idx.unique(tag + "_pad")
    if idx.opset >= 11:
        return helper.make_node("Pad", [x, idx.add_init(np.array(pads, np.int64), tag + "_p")],
                                [out], name=name)
    return helper.make_node("Pad", [x], [out], name=name, pads=pads)


MAX_DEPTH_STEPS = 256              # output depths of a 3-D Conv unrolled into 2-D Convs


def _per_depth(idx: _Index, node, w: np.ndarray, ranks: dict, prov: Provenance) -> list:
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotRewritten("a 3-D convolution with auto_pad")
    shape = ranks.get(node.input[0])
    if shape is None or len(shape) != 5 or any(s is None for s in shape[1:]):
        raise NotRewritten("a 3-D convolution whose input shape is not known")
    out_ch, per_group, kd, kh, kw = w.shape
    group = int(_attr(node, "group", 1))
    sd, sh, sw = _attr(node, "strides", [1, 1, 1])
    dd, dh, dw = _attr(node, "dilations", [1, 1, 1])
    pd0, ph0, pw0, pd1, ph1, pw1 = _attr(node, "pads", [0] * 6)
    _, cin, depth, height, width = shape
    depth += pd0 + pd1
    steps = (depth - (kd - 1) * dd - 1) // sd + 1
    if not 0 < steps <= MAX_DEPTH_STEPS:
        raise NotRewritten(f"a 3-D convolution of {steps} output depths (at most "
                           f"{MAX_DEPTH_STEPS} are unrolled)")
    tag = node.name + "_depth"
    x, made = node.input[0], []
    if pd0 or pd1:
        padded = idx.unique(tag + "_padded")
        made.append(_pad(idx, x, padded, [0, 0, pd0, 0, 0, 0, 0, pd1, 0, 0], tag))
        x = padded
    flat = spread_kernel(w.reshape(out_ch, per_group * kd, kh, kw), [dh, dw])  # no 2-D dilation
    kernel = idx.add_init(np.ascontiguousarray(flat), node.input[1] + "_2d")
    planes = idx.add_init(np.array([0, cin * kd, height, width], np.int64), tag + "_planes")
    axis, step = (idx.add_init(np.array([v], np.int64), tag + name)
                  for name, v in (("_axis", 2), ("_step", dd)))
    unsqueeze_axes = idx.add_init(np.array([2], np.int64), tag + "_unsq")
    stacked = []
    for d in range(steps):
        at = f"{tag}{d}"
        start = d * sd
        names = [idx.unique(f"{at}_{part}") for part in ("planes", "flat", "conv", "out")]
        made += [
            helper.make_node("Slice", [x, idx.add_init(np.array([start], np.int64), at + "_s0"),
                                       idx.add_init(np.array([start + (kd - 1) * dd + 1],
                                                             np.int64), at + "_s1"),
                                       axis, step], [names[0]], name=idx.unique(at + "_slice")),
            helper.make_node("Reshape", [names[0], planes], [names[1]],
                             name=idx.unique(at + "_fold")),
            helper.make_node("Conv", [names[1], kernel, *node.input[2:3]], [names[2]],
                             name=idx.unique(f"{node.name}_d{d}"), group=group,
                             kernel_shape=list(flat.shape[2:]), strides=[sh, sw],
                             pads=[ph0, pw0, ph1, pw1]),
            _unsqueeze(idx, names[2], names[3], unsqueeze_axes, at)]
        stacked.append(names[3])
        if flat.shape[2:] != (kh, kw):
            prov.own_work[made[-2].name] = (kh * kw, int(np.prod(flat.shape[2:])))
    made.append(helper.make_node("Concat", stacked, [node.output[0]], axis=2,
                                 name=idx.unique(tag + "_stack")))
    return made


def _unsqueeze(idx: _Index, x: str, out: str, axes: str, tag: str):
    name = idx.unique(tag + "_unsqueeze")
    if idx.opset >= 13:
        return helper.make_node("Unsqueeze", [x, axes], [out], name=name)
    return helper.make_node("Unsqueeze", [x], [out], name=name, axes=[2])
