"""Keras networks exported by tf2onnx, compiled and run through the CLI (OPTIONAL: not run by
`make test`; `make bench-keras` installs the `keras` extra, TensorFlow and tf2onnx, into
.venv first).

    make bench-keras                      # or, with the extra installed:
    .venv/bin/python benchmarks/real_models_keras.py [--only NAME] [--work DIR]

Each network is built with keras.layers, trained for 10 epochs on 2,048 rows of a
synthetic task of its own, converted by `tf2onnx.convert.from_keras` (opset 17,
channels-last images, a dynamic batch), compiled with `tpuasm compile --calibrate` on 128
other rows and run with `tpuasm infer` on 1,024 more, against onnxruntime on the float model
(top-1 with its 95 % interval, SNR of the logits, the float model's own accuracy) and on the
compiled model's own QDQ model (benchmarks/real_models_torch.py's comparison).

- cnn: Conv2D + BatchNormalization + ReLU6, a MobileNetV2 inverted residual (1x1,
  DepthwiseConv2D, 1x1, residual Add), MaxPooling2D, Conv2D with swish, global average
  pooling, Dropout, Dense (tf2onnx writes NHWC with Transposes around the Convs).
- lstm: keras.layers.LSTM (tf2onnx's rewriter makes it an ONNX LSTM), Dense.
- gru: a Bidirectional GRU (reset_after, Keras' default), which tf2onnx writes as two Loops
  (front/loops.py unrolls them), global average pooling over the steps, Dense.
- cnn, through TensorFlow Lite: the same network converted to a full-integer int8 .tflite
  (TFLiteConverter, its representative data the calibration rows), then to ONNX by
  `tf2onnx.convert.from_tflite` (a QDQ model), compiled as shipped and compared with the
  float model and with onnxruntime on that QDQ model.
- attention: MultiHeadAttention (4 heads), residual Adds, LayerNormalization, a Dense with
  the tanh GELU (tf2onnx writes the exact GELU with an `Erfc` node that is not an ONNX
  operator, which onnxruntime refuses too), global average pooling, Dense.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_models_shipped import compile_and_infer  # noqa: E402
from real_models_torch import (CALIBRATE, ROWS, TRAIN, _run, one_input_export,  # noqa: E402
                               top1_figures)

NAMES = ("cnn", "lstm", "gru", "attention")


def _images(rng):
    x = rng.normal(0, 1, (ROWS, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 4, ROWS)
    for i, k in enumerate(labels):           # a bright quadrant
        x[i, (k // 2) * 16:(k // 2) * 16 + 16, (k % 2) * 16:(k % 2) * 16 + 16] += 1.5
    return x, labels


def _sequences(rng):
    x = rng.normal(0, 1, (ROWS, 12, 16)).astype(np.float32)
    return x, np.argmax(x[:, :, :5].sum(1), 1)


def _network(name: str, keras):
    layers = keras.layers
    if name == "cnn":
        inp = keras.Input((32, 32, 3))
        h = layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inp)
        h = layers.ReLU(6.0)(layers.BatchNormalization()(h))
        e = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(64, 1, use_bias=False)(h)))
        e = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(e)
        e = layers.ReLU(6.0)(layers.BatchNormalization()(e))
        e = layers.BatchNormalization()(layers.Conv2D(16, 1, use_bias=False)(e))
        h = layers.MaxPooling2D()(layers.Add()([h, e]))
        h = layers.Conv2D(32, 3, padding="same", activation="swish")(h)
        h = layers.Dropout(0.1)(layers.GlobalAveragePooling2D()(h))
        return keras.Model(inp, layers.Dense(4)(h))
    inp = keras.Input((12, 16))
    if name == "lstm":
        return keras.Model(inp, layers.Dense(5)(layers.LSTM(32)(inp)))
    if name == "gru":
        h = layers.Bidirectional(layers.GRU(32, return_sequences=True))(inp)
        return keras.Model(inp, layers.Dense(5)(layers.GlobalAveragePooling1D()(h)))
    a = layers.MultiHeadAttention(4, 8)(inp, inp)
    h = layers.LayerNormalization()(inp + a)
    f = layers.Dense(64, activation=lambda t: keras.activations.gelu(t, approximate=True))(h)
    h = layers.LayerNormalization()(h + layers.Dense(16)(f))
    return keras.Model(inp, layers.Dense(5)(layers.GlobalAveragePooling1D()(h)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, help="where models and OUTDIRs go (default: temp)")
    p.add_argument("--only", action="append", default=[], help=f"one of {', '.join(NAMES)}")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import keras
        import tensorflow as tf
        import tf2onnx
    except ImportError:
        print("TensorFlow and tf2onnx are not installed: `make bench-keras` installs the "
              "keras extra", file=sys.stderr)
        return 2
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for name in args.only or NAMES:
            x, labels = (_images if name == "cnn" else _sequences)(rng)
            model = _network(name, keras)
            model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x[:TRAIN], labels[:TRAIN], epochs=10, batch_size=32, verbose=0)
            folder = work / name
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"keras_{name}.onnx"
            spec = (tf.TensorSpec((None,) + x.shape[1:], tf.float32, name="x"),)
            tf2onnx.convert.from_keras(model, input_signature=spec, opset=17,
                                       output_path=str(path))
            one_input_export(path, folder, f"keras {name} (tf2onnx)", x, labels)
            if name == "cnn":
                print(json.dumps(tflite_form(tf, tf2onnx, model, x, folder, path)), flush=True)
    return 0


def tflite_form(tf, tf2onnx, model, x: np.ndarray, folder: Path, float_path: Path) -> dict:
    """`model` as TensorFlow Lite's full-integer int8 conversion writes it, made ONNX by
    tf2onnx, compiled as shipped: its row against the float model (`float_path`) and
    onnxruntime on that QDQ model."""
    calib = x[TRAIN:TRAIN + CALIBRATE]
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([calib[i:i + 1]] for i in range(len(calib)))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    sub = folder / "tflite"
    sub.mkdir(exist_ok=True)
    (sub / "model.tflite").write_bytes(converter.convert())
    path = sub / "keras_cnn_int8.onnx"
    tf2onnx.convert.from_tflite(str(sub / "model.tflite"), opset=17, output_path=str(path))
    import onnx
    graph = onnx.load(str(path)).graph
    name, output = graph.input[0].name, graph.output[0].name
    evaluation = {name: x[TRAIN + CALIBRATE:]}
    np.savez(sub / "eval.npz", **evaluation)
    row = {"model": "keras cnn (TFLite int8, tf2onnx), as it is"}
    got = compile_and_infer(path, sub, [], row, calibrate=False)
    if got is None:
        return row
    floats = next(iter(_run(float_path, {"x": evaluation[name]}).values()))
    shipped = _run(path, evaluation)[output]
    ours = got[output].reshape(shipped.shape)
    row.update(top1_figures(floats.argmax(1), ours.argmax(1)))
    row["qdq_model_top1"] = round(100 * float(np.mean(floats.argmax(1) ==
                                                      shipped.argmax(1))), 2)
    row["identical_to_qdq"] = round(100 * float(np.mean(ours == shipped)), 2)
    return row


if __name__ == "__main__":
    sys.exit(main())
