"""A decoder in the form onnxruntime-genai's model builder writes language models (Llama,
Qwen, Phi, Mistral for CPU): SimplifiedLayerNormalization in the ONNX domain (onnxruntime
registers it there; onnx has no schema for it), com.microsoft SkipSimplifiedLayerNormalization
and GroupQueryAttention (rotary inside, grouped key/value heads, a past state per layer of
(batch, kv heads, past, head)), one packed Q/K/V MatMul, a SiLU-gated MLP, every weight in
an external data file (onnxruntime's CPU kernel takes heads of a multiple of 16); its int4 form puts MatMulNBits of accuracy level 4 in the MatMuls'
place.  Compiled from the CLI and run with `tpuasm infer` on a decoding step whose past
states the float model computed from real prompts; onnxruntime is the oracle."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tpuasm.compiler.cli import compile_main, infer_main
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.graph import Node
from tpuasm.compiler.front.macs import node_macs
from tpuasm.compiler.front.reader import read_model
from tpuasm.compiler.ort import session

VOCAB, WIDTH, HEADS, KV_HEADS, HEAD, LAYERS, PROMPT = 48, 64, 4, 2, 16, 2, 6


def _decoder(rng) -> onnx.ModelProto:
    """The builder's graph for a two-layer decoder; a tied head over the vocabulary and
    small layers that refine the residual stream, so that the untrained net's next token
    has a trained one's margins."""
    inits: dict[str, np.ndarray] = {}
    small = 0.5 / np.sqrt(WIDTH)

    def weight(name, shape, spread):
        inits[name] = (rng.normal(size=shape) * spread).astype(np.float32)
        return name

    def ones(name):
        inits[name] = np.ones(WIDTH, np.float32)
        return name

    freqs = np.outer(np.arange(64), 1.0 / 10000 ** (np.arange(0, HEAD, 2) / HEAD))
    inits["cos_cache"], inits["sin_cache"] = (np.cos(freqs).astype(np.float32),
                                              np.sin(freqs).astype(np.float32))
    inits["one"] = np.array([1], np.int64)
    inits["axis1"] = np.array([1], np.int64)
    inits["index1"] = np.array(1, np.int64)
    ms = "com.microsoft"
    nodes = [
        # the builder's attn_mask_reformat: seqlens_k = keys - 1, total_sequence_length
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["keys"], keepdims=1,
                         name="/model/attn_mask_reformat/ReduceSum"),
        helper.make_node("Sub", ["keys", "one"], ["last"], name="/model/attn_mask_reformat/Sub"),
        helper.make_node("Cast", ["last"], ["seqlens_k"], to=TensorProto.INT32,
                         name="/model/attn_mask_reformat/Sub/Cast"),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"],
                         name="/model/attn_mask_reformat/Shape"),
        helper.make_node("Gather", ["mask_shape", "index1"], ["total"], axis=0,
                         name="/model/attn_mask_reformat/Gather"),
        helper.make_node("Cast", ["total"], ["total_sequence_length"], to=TensorProto.INT32,
                         name="/model/attn_mask_reformat/Gather/Cast"),
        helper.make_node("Gather", [weight("embed", (VOCAB, WIDTH), 1.0), "input_ids"], ["h0"],
                         name="/model/embed_tokens/Gather"),
        helper.make_node("SimplifiedLayerNormalization", ["h0", ones("norm_in.0")], ["n0"],
                         epsilon=1e-6, axis=-1, stash_type=1,
                         name="/model/layers.0/input_layernorm/LayerNorm")]
    residual, normed = "h0", "n0"
    packed = (HEADS + 2 * KV_HEADS) * HEAD
    for i in range(LAYERS):
        scope = f"/model/layers.{i}"
        nodes += [
            helper.make_node("MatMul", [normed, weight(f"qkv.{i}", (WIDTH, packed),
                                                       1 / np.sqrt(WIDTH))],
                             [f"qkv{i}"], name=f"{scope}/attn/qkv_proj/MatMul"),
            helper.make_node("GroupQueryAttention",
                             [f"qkv{i}", "", "", f"past_key_values.{i}.key",
                              f"past_key_values.{i}.value", "seqlens_k",
                              "total_sequence_length", "cos_cache", "sin_cache"],
                             [f"att{i}", f"present.{i}.key", f"present.{i}.value"], domain=ms,
                             num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1,
                             scale=float(HEAD ** -0.5), name=f"{scope}/attn/GroupQueryAttention"),
            helper.make_node("MatMul", [f"att{i}", weight(f"o.{i}", (WIDTH, WIDTH), small)],
                             [f"o{i}"], name=f"{scope}/attn/o_proj/MatMul"),
            helper.make_node("SkipSimplifiedLayerNormalization",
                             [residual, f"o{i}", ones(f"norm_post.{i}")],
                             [f"m{i}", "", "", f"r{i}"], domain=ms, epsilon=1e-6,
                             name=f"{scope}/post_attention_layernorm/SkipLayerNorm"),
            helper.make_node("MatMul", [f"m{i}", weight(f"gate.{i}", (WIDTH, 2 * WIDTH),
                                                        1 / np.sqrt(WIDTH))],
                             [f"g{i}"], name=f"{scope}/mlp/gate_proj/MatMul"),
            helper.make_node("MatMul", [f"m{i}", weight(f"up.{i}", (WIDTH, 2 * WIDTH),
                                                        1 / np.sqrt(WIDTH))],
                             [f"u{i}"], name=f"{scope}/mlp/up_proj/MatMul"),
            helper.make_node("Sigmoid", [f"g{i}"], [f"s{i}"], name=f"{scope}/mlp/act_fn/Sigmoid"),
            helper.make_node("Mul", [f"g{i}", f"s{i}"], [f"silu{i}"],
                             name=f"{scope}/mlp/act_fn/Mul"),
            helper.make_node("Mul", [f"silu{i}", f"u{i}"], [f"gu{i}"], name=f"{scope}/mlp/Mul"),
            helper.make_node("MatMul", [f"gu{i}", weight(f"down.{i}", (2 * WIDTH, WIDTH),
                                                         small / 2)],
                             [f"d{i}"], name=f"{scope}/mlp/down_proj/MatMul")]
        last = i == LAYERS - 1
        after = "final" if last else f"n{i + 1}"
        nodes.append(helper.make_node(
            "SkipSimplifiedLayerNormalization", [f"r{i}", f"d{i}",
                                                 ones("norm_final" if last else
                                                      f"norm_in.{i + 1}")],
            [after] if last else [after, "", "", f"h{i + 1}"], domain=ms, epsilon=1e-6,
            name=f"/model/layers.{i + 1}/{'final_norm' if last else 'input'}_layernorm/"
                 f"SkipLayerNorm"))
        residual, normed = f"h{i + 1}", after
    inits["head"] = inits["embed"].T.copy()
    nodes.append(helper.make_node("MatMul", ["final", "head"], ["logits"],
                                  name="/lm_head/MatMul"))
    state = ["batch_size", KV_HEADS, "past_sequence_length", HEAD]
    present = ["batch_size", KV_HEADS, "total_sequence_length", HEAD]
    graph = helper.make_graph(
        nodes, "decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                       ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                       ["batch_size", "total_sequence_length"]),
         *(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", TensorProto.FLOAT, state)
           for i in range(LAYERS) for kv in ("key", "value"))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                       ["batch_size", "sequence_length", VOCAB]),
         *(helper.make_tensor_value_info(f"present.{i}.{kv}", TensorProto.FLOAT, present)
           for i in range(LAYERS) for kv in ("key", "value"))],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid(ms, 1)])


def _save(model: onnx.ModelProto, path) -> None:
    """As the builder saves: every weight in one external data file beside the model (a copy
    is saved: onnx moves the weights of the model it saves out of it)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)


def _decoding_step(model: onnx.ModelProto, rows: int, seed: int) -> dict:
    """The inputs of one decoding step after a PROMPT-token prompt: the past states the
    float model computed from it (a prompt runs with empty past states)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (rows, PROMPT + 1))
    empty = np.zeros((rows, KV_HEADS, 0, HEAD), np.float32)
    feed = {"input_ids": tokens[:, :PROMPT], "attention_mask": np.ones((rows, PROMPT), np.int64),
            **{f"past_key_values.{i}.{kv}": empty for i in range(LAYERS) for kv in ("key", "value")}}
    outputs = [o.name for o in model.graph.output]
    prompt = dict(zip(outputs, session(model).run(None, feed)))
    return {"input_ids": tokens[:, PROMPT:], "attention_mask": np.ones((rows, PROMPT + 1), np.int64),
            **{f"past_key_values.{i}.{kv}": prompt[f"present.{i}.{kv}"]
               for i in range(LAYERS) for kv in ("key", "value")}}


def _in_batches(path, data: dict, batch: int) -> dict:
    """onnxruntime on a model of a fixed batch (OUTDIR's QDQ model), over every row."""
    model = onnx.load(str(path))
    names = [o.name for o in model.graph.output]
    sess = session(model)
    rows = len(data["input_ids"])
    parts = [sess.run(None, {k: v[i:i + batch] for k, v in data.items()})
             for i in range(0, rows, batch)]
    return {n: np.concatenate([p[j] for p in parts]) for j, n in enumerate(names)}


def _snr(got, want) -> float:
    with np.errstate(divide="ignore"):               # identical: infinite
        return float(10 * np.log10((want ** 2).sum() / ((got - want) ** 2).sum()))


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """The float decoder saved as the builder saves it, its calibration and check steps."""
    folder = tmp_path_factory.mktemp("genai")
    model = _decoder(np.random.default_rng(31))
    _save(model, folder / "model.onnx")
    calibration, check = _decoding_step(model, 64, 1), _decoding_step(model, 128, 2)
    np.savez(folder / "calib.npz", **calibration)
    np.savez(folder / "check.npz", **check)
    return folder, model, check


def _compile_and_infer(folder, model_path, name, capsys):
    out = folder / name
    assert compile_main([str(model_path), "-o", str(out), "--calibrate",
                         str(folder / "calib.npz"), "--validate", str(folder / "check.npz"),
                         "--batch", "32", "-q"]) == 0, capsys.readouterr().err
    assert infer_main([str(out), str(folder / "check.npz"), "-o",
                       str(folder / f"{name}.npz")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    return out, report, dict(np.load(folder / f"{name}.npz"))


def test_the_builders_float_decoder_puts_every_projection_on_the_tpu(decoder, capsys):
    """Refused before: onnx's checker knows no SimplifiedLayerNormalization."""
    folder, model, check = decoder
    out, report, got = _compile_and_infer(folder, folder / "model.onnx", "float", capsys)
    rows = {r["node"]: r for r in report["rows"]}
    matmuls = [n.name for n in model.graph.node if n.op_type == "MatMul"]
    assert len(matmuls) == 11
    assert all(rows[n]["where"] == "TPU" for n in matmuls), \
        {n: rows[n]["reason"] for n in matmuls if rows[n]["where"] != "TPU"}
    norm = rows["/model/layers.0/input_layernorm/LayerNorm"]
    assert (norm["op_type"], norm["where"]) == ("SimplifiedLayerNormalization", "host")
    # the attention's products over the past and the new key: 2 x B x S x N x head x T
    attention = rows["/model/layers.0/attn/GroupQueryAttention"]
    assert attention["where"] == "host" and "two activations" in attention["reason"]
    assert attention["macs"] == 2 * 32 * 1 * HEADS * HEAD * (PROMPT + 1)
    assert report["macs"] == sum(r["macs"] or 0 for r in report["rows"])
    assert report["tpu_macs"] == sum(rows[n]["macs"] for n in matmuls)
    want = dict(zip([o.name for o in model.graph.output], session(model).run(None, check)))
    assert np.mean(got["logits"].argmax(-1) == want["logits"].argmax(-1)) >= 0.99
    for i in range(LAYERS):
        assert _snr(got[f"present.{i}.key"], want[f"present.{i}.key"]) > 30
    # the TPU's answers are onnxruntime's on OUTDIR's QDQ model
    qdq = _in_batches(out / "model.qdq.onnx", check, 32)
    assert np.array_equal(got["logits"].argmax(-1), qdq["logits"].argmax(-1))
    assert _snr(got["logits"], qdq["logits"]) > 60


def test_the_builders_int4_decoder_is_read_back_onto_the_tpu(decoder, tmp_path, capsys):
    """Its MatMulNBits (weights in an external file, accuracy level 4) stayed on the host
    before, each 'weights that are not constants': the external data was not read."""
    pytest.importorskip("onnx_ir")            # onnxruntime's quantizer needs it
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits
    folder, model, check = decoder
    config = nbits.DefaultWeightOnlyQuantConfig(block_size=16, is_symmetric=True,
                                                accuracy_level=4,
                                                op_types_to_quantize=("MatMul",))
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(folder / "model.onnx")),
                                           algo_config=config)
    quantizer.process()
    shipped = quantizer.model.model
    assert sum(n.op_type == "MatMulNBits" for n in shipped.graph.node) == 11
    path = tmp_path / "model.onnx"
    _save(shipped, path)
    out, report, got = _compile_and_infer(folder, path, "int4", capsys)
    rows = {r["node"]: r for r in report["rows"]}
    weighted = [n.name for n in shipped.graph.node if n.op_type == "MatMulNBits"]
    assert all(rows[n]["where"] == "TPU" for n in weighted), \
        {n: rows[n]["reason"] for n in weighted if rows[n]["where"] != "TPU"}
    # checked against its weights in float: accuracy level 4 also rounds the shipped
    # model's activations to int8
    assert report["validation"]["against"] == "the model read back as float"
    want = dict(zip([o.name for o in shipped.graph.output],
                    session(shipped).run(None, check)))
    assert np.mean(got["logits"].argmax(-1) == want["logits"].argmax(-1)) >= 0.99


def test_an_onnx_domain_operator_neither_onnx_nor_onnxruntime_knows_is_refused(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph(
        [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["n"]),
         helper.make_node("RootMeanSquareNormalise", ["n"], ["y"])], "g", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "g")])
    path = tmp_path / "unknown.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    with pytest.raises(CompileError, match="No Op registered for RootMeanSquareNormalise"):
        read_model(path)
    del graph.node[1]
    graph.node[0].output[0] = "y"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    model = read_model(path)
    assert model.graph.node[0].domain == ""           # the model itself is as shipped


def _node(op, inputs, outputs, **attrs):
    return Node(op, op, "com.microsoft", inputs, outputs, attrs, 0, None)


@pytest.mark.parametrize("inputs,shapes,outputs,keys", [
    # separate Q, K, V of 10 keys; a past of 5 before them; the present's length wins
    (["q", "k", "v"], {"k": (2, 10, 32)}, ["y"], 10),
    (["q", "k", "v", "", "", "", "pk", "pv"], {"k": (2, 10, 32), "pk": (2, 4, 5, 8)},
     ["y"], 15),
    (["q", "k", "v"], {"k": (2, 10, 32), "present": (2, 4, 12, 8)}, ["y", "present"], 12),
    # cross attention over keys already in heads (B, N, L, head); packed Q/K/V (no key)
    (["q", "k", "v"], {"k": (2, 4, 9, 8)}, ["y"], 9),
    (["q"], {}, ["y"], 3)])
def test_multi_head_attention_macs_count_its_keys(inputs, shapes, outputs, keys):
    shapes = {"q": (2, 3, 32), "y": (2, 3, 32), **shapes}
    node = _node("MultiHeadAttention", inputs, outputs, num_heads=4)
    assert node_macs(node, shapes) == 2 * 2 * 3 * 32 * keys       # QK^T and by V


def test_group_query_attention_macs_count_every_query_head():
    # packed Q/K/V of 4 query and 2 key/value heads of 8; a past of 6 and one new key
    node = _node("GroupQueryAttention", ["qkv", "", "", "pk", "pv"], ["y", "pk_out", "pv_out"],
                 num_heads=4, kv_num_heads=2)
    shapes = {"qkv": (3, 1, 64), "y": (3, 1, 32), "pk": (3, 2, 6, 8)}
    assert node_macs(node, shapes) == 2 * 3 * 1 * 4 * 8 * 7
    shapes["pk_out"] = (3, 2, 7, 8)
    assert node_macs(node, shapes) == 2 * 3 * 1 * 4 * 8 * 7
    assert node_macs(node, {"qkv": (3, 1, 64)}) is None
