"""Models exported by tools nobody in this project wrote - Hugging Face transformers through
torch.onnx, scikit-learn through skl2onnx - compiled and run through the CLI as a new user
runs them (OPTIONAL: not run by `make test`; `make bench-hf` installs the `torch` extra,
which brings transformers, into .venv first).

    make bench-hf                         # or, with the extra installed:
    .venv/bin/python benchmarks/real_models_hf.py [--only NAME] [--work DIR]

transformers (random-init small configs built from a config object, nothing downloaded;
each fine-tuned for 300 steps of 128 rows drawn from 2,048 rows of a synthetic task whose
labels the inputs decide, so that its logits have margins), each exported by torch.onnx's
TorchScript exporter (`dynamo=False`, opset 17) and by its dynamo exporter (opset 18):

- bert: BertForSequenceClassification (2 layers, hidden 64, 4 heads), input_ids +
  attention_mask + token_type_ids (int64, 16 tokens, 8 to 16 of them real); the class is
  how many real tokens are below 30 (in pairs, 6 classes).  bert-seq: the same exported
  as Optimum does, batch and sequence dynamic.
- distilbert, albert (one layer's weights shared by both), deberta (DeBERTa-v2's
  disentangled attention over relative positions), gpt2 (GPT2ForSequenceClassification:
  causal mask, the class read at the last real token), llama (LlamaForSequenceClassification:
  RMSNorm, rotary positions, grouped KV heads, SiLU-gated MLP), xlnet
  (XLNetForSequenceClassification: relative positional attention written with torch.einsum,
  its projections Einsums with weights): the same task and size.
- gpt2-lm: GPT2LMHeadModel on sequences whose next token the previous one decides; top-1
  at every position.
- vit (ViTForImageClassification, image 32, patch 8), convnext, swin (shifted windows),
  resnet, mobilenet (MobileNetV2, TensorFlow's "same" padding): which quadrant is bright.
- whisper: WhisperForAudioClassification (encoder, 16 mel bins, 32 frames, two Conv1d):
  which of 4 mel bands carries the energy.
- wav2vec2: Wav2Vec2ForSequenceClassification (two Conv1d feature layers with GroupNorm,
  a grouped positional Conv1d, 2 layers, hidden 64) on 800 raw samples: which of 4
  frequency bands a noisy tone is in.
- the same text task, ForSequenceClassification (hidden 64, 2 layers unless said): roberta,
  electra (embeddings 32 projected), mobilebert (bottlenecks of 32, NoNorm, 2 stacked FFNs),
  squeezebert (grouped Conv1d projections), convbert (span-based dynamic convolution),
  mpnet (relative position buckets), funnel (pooled attention between blocks, its
  relative attention Einsums), bart and t5 (1 encoder + 1 decoder layer; the class read at
  their one eos token, the last real one), opt, bloom (ALiBi), gpt-neox (partial rotary),
  phi (partial rotary, parallel attention/MLP), qwen2, mistral (sliding window 8), gemma,
  roformer (rotary positions in an encoder), big-bird (its full attention at 16 tokens),
  longformer (sliding-window attention, window 4), fnet (a 2-D FFT mixes the tokens),
  nystromformer (4 landmarks), gptj, gpt-bigcode (multi-query attention), falcon, mpt
  (ALiBi), stablelm, mixtral (top-2 of 4 experts per token).
- the same image task: segformer (2 blocks, efficient attention with a reduction Conv),
  mobilevit (MobileNetV2 blocks and transformer blocks over unfolded patches),
  efficientnet (squeeze-excitation, width 0.25), regnet (grouped Convs), levit (Linear +
  BatchNorm1d everywhere, attention biases, 3 stages), poolformer (pooling as the token
  mixer, GroupNorm), beit (relative position bias, mean pooling), deit, dinov2 (layer
  scale), cvt (3 stages, convolutional Q/K/V projections with BatchNorm).
- hubert: HubertForSequenceClassification on wav2vec2's task and size; ast
  (ASTForAudioClassification, 8x8 patches of whisper's spectrograms, frames first).

scikit-learn (skl2onnx's default options; the bundled data sets: load_digits, load_iris,
load_diabetes, rows shuffled once; iris has 150 rows, so its calibration and evaluation
rows are new rows drawn around its own, the label the fitted model's float answer):
Pipeline(StandardScaler, PCA, LogisticRegression), MLPRegressor, SVC(kernel='linear',
probability=True), LinearSVC, RandomForestClassifier, KNeighborsClassifier, GaussianNB,
Ridge.

Each is compiled with `tpuasm compile --calibrate` on 128 rows and run with `tpuasm infer`
on 1,024 others (512 for the scikit-learn ones whose data set is small), against
onnxruntime on the float model: top-1 agreement (of the label output where the model has
one, else of the first 2-D output's argmax), SNR of every float output, for a regression
its error in steps of the output's quantization (its calibrated range / 255): median, p99, max.
Next to it, onnxruntime's own quantize_static QDQ model of the same float model
(per-channel int8 weights, uint8 activations, min-max on the same 128 rows) on the same
rows.  "matrix" is how many of the model's Conv / MatMul / Gemm / Einsum / BatchNormalization
/ LSTM / GRU nodes the report puts on the TPU, out of how many (a MatMul or Einsum of two
activations, attention's scores, may stay on the host: "act x act" counts them); the host
ones are listed with the report's reason.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_models_shipped import compile_and_infer, snr  # noqa: E402
from real_models_torch import (CALIBRATE, ROWS, TRAIN, _rows, _run, _train,  # noqa: E402
                               top1_figures)

STEPS, MINIBATCH = 300, 128
TOKENS, VOCAB = 16, 100
# the nodes a matrix multiply does: ONNX's, and scikit-learn's linear models and SVMs (the
# compiler rewrites the linear ones' work as Gemms for the TPU; another kernel stays)
MATRIX_OPS = ("Conv", "MatMul", "Gemm", "Einsum", "ConvTranspose", "BatchNormalization", "LSTM",
              "GRU", "LinearClassifier", "LinearRegressor", "SVMClassifier", "SVMRegressor")
MORE_TEXT = ("roberta", "electra", "mobilebert", "squeezebert", "convbert", "mpnet", "funnel",
             "bart", "t5", "opt", "bloom", "gpt-neox", "phi", "qwen2", "mistral", "gemma",
             "roformer", "big-bird", "longformer", "fnet", "nystromformer", "gptj", "gpt-bigcode",
             "falcon", "mpt", "stablelm", "mixtral")
MORE_IMAGE = ("segformer", "mobilevit", "efficientnet", "regnet", "levit", "poolformer", "beit",
              "deit", "dinov2", "cvt", "bit", "convnextv2", "swinv2", "focalnet", "mobilenet-v1")
HF = ("bert", "bert-seq", "distilbert", "albert", "deberta", "xlnet", "gpt2", "gpt2-lm", "llama",
      "vit",
      "convnext", "swin", "resnet", "mobilenet", "whisper", "wav2vec2",
      *MORE_TEXT, *MORE_IMAGE, "hubert", "wavlm", "data2vec-audio", "ast")
TEXT = ("bert", "bert-seq", "distilbert", "albert", "deberta", "xlnet", "gpt2", "llama",
        *MORE_TEXT)
IMAGE = ("vit", "convnext", "swin", "resnet", "mobilenet", *MORE_IMAGE)
ENDS_WITH_EOS = ("bart", "t5")      # read the class at their (one) eos token
TOKEN_TYPES = ("bert", "bert-seq", "albert")
SKLEARN = ("pca-logreg", "mlp-regressor", "svc-linear", "linear-svc", "random-forest",
           "knn", "gaussian-nb", "ridge")


# ----------------------------------------------------------------------------- transformers
def _text_task(rng, with_types: bool, eos: bool = False) -> tuple[dict, np.ndarray]:
    """With `eos`, the last real token is VOCAB - 1 and no other is (bart and t5 classify
    at it, and refuse rows with different counts of it)."""
    ids = rng.integers(1, VOCAB, (ROWS, TOKENS))
    lengths = rng.integers(8, TOKENS + 1, ROWS)
    if eos:
        ids = np.where(ids == VOCAB - 1, VOCAB - 2, ids)
        ids[np.arange(ROWS), lengths - 1] = VOCAB - 1
    mask = (np.arange(TOKENS)[None] < lengths[:, None]).astype(np.int64)
    ids = ids * mask                                   # padding 0 after the real tokens
    labels = np.minimum(((ids < 30) & (mask == 1)).sum(1) // 2, 5)
    data = {"input_ids": ids.astype(np.int64), "attention_mask": mask}
    if with_types:                  # a second segment from the middle of the real tokens
        data["token_type_ids"] = ((np.arange(TOKENS)[None] >= lengths[:, None] // 2)
                                  & (mask == 1)).astype(np.int64)
    return data, labels


def _next_token_task(rng) -> tuple[dict, np.ndarray]:
    """Sequences whose next token the previous one decides ((3 t + 1) mod VOCAB, from a
    random first one); the labels (rows, tokens), each position's next token."""
    first = rng.integers(0, VOCAB, ROWS)
    ids = np.empty((ROWS, TOKENS + 1), np.int64)
    ids[:, 0] = first
    for t in range(TOKENS):
        ids[:, t + 1] = (3 * ids[:, t] + 1) % VOCAB
    return {"input_ids": ids[:, :-1].copy()}, ids[:, 1:].copy()


def _image_task(rng) -> tuple[dict, np.ndarray]:
    x = rng.normal(0, 1, (ROWS, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 4, ROWS)
    for i, k in enumerate(labels):                     # a bright quadrant
        x[i, :, (k // 2) * 16:(k // 2) * 16 + 16, (k % 2) * 16:(k % 2) * 16 + 16] += 1.5
    return {"pixel_values": x}, labels


def _audio_task(rng) -> tuple[dict, np.ndarray]:
    x = rng.normal(0, 1, (ROWS, 16, 32)).astype(np.float32)
    labels = rng.integers(0, 4, ROWS)
    for i, k in enumerate(labels):                     # energy in one band of 4 mel bins
        x[i, 4 * k:4 * k + 4] += 1.5
    return {"input_features": x}, labels


def _spectrogram_task(rng) -> tuple[dict, np.ndarray]:
    """_audio_task's spectrograms as the audio-spectrogram-transformer takes them: (rows,
    frames, mel bins)."""
    x, labels = _audio_task(rng)
    return {"input_values": np.ascontiguousarray(x["input_features"].transpose(0, 2, 1))}, labels


def _wave_task(rng) -> tuple[dict, np.ndarray]:
    t = np.arange(800) / 800
    labels = rng.integers(0, 4, ROWS)
    freq = (10 + 25 * labels + rng.uniform(-3, 3, ROWS))[:, None]   # one tone of 4 bands
    x = np.sin(2 * np.pi * freq * t + rng.uniform(0, 6.3, (ROWS, 1)))
    return {"input_values": (x + rng.normal(0, 0.3, x.shape)).astype(np.float32)}, labels


# text: sequence classification on the same task as bert (6 classes)
_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_DECODER = dict(vocab_size=VOCAB, max_position_embeddings=TOKENS, num_labels=6, pad_token_id=0,
                **_SMALL)
# name: (config class, its arguments, model class); positions from a padding index count
# past it (roberta, mpnet: TOKENS + 2), bart/t5 read the class at their one eos token
MORE = {
    "roberta": ("RobertaConfig", dict(vocab_size=VOCAB, max_position_embeddings=TOKENS + 2,
                                      pad_token_id=0, num_labels=6, **_SMALL, **_NO_DROPOUT),
                "RobertaForSequenceClassification"),
    "electra": ("ElectraConfig", dict(vocab_size=VOCAB, embedding_size=32,
                                      max_position_embeddings=TOKENS, num_labels=6, **_SMALL,
                                      **_NO_DROPOUT), "ElectraForSequenceClassification"),
    "mobilebert": ("MobileBertConfig", dict(vocab_size=VOCAB, embedding_size=32,
                                            true_hidden_size=32, intra_bottleneck_size=32,
                                            num_feedforward_networks=2,
                                            max_position_embeddings=TOKENS, num_labels=6,
                                            classifier_dropout=0.0, **_SMALL, **_NO_DROPOUT),
                   "MobileBertForSequenceClassification"),
    "squeezebert": ("SqueezeBertConfig", dict(vocab_size=VOCAB, embedding_size=64,
                                              max_position_embeddings=TOKENS, num_labels=6,
                                              q_groups=4, k_groups=4, v_groups=4,
                                              post_attention_groups=2, intermediate_groups=4,
                                              output_groups=4, **_SMALL, **_NO_DROPOUT),
                    "SqueezeBertForSequenceClassification"),
    "convbert": ("ConvBertConfig", dict(vocab_size=VOCAB, embedding_size=64, head_ratio=2,
                                        conv_kernel_size=5, max_position_embeddings=TOKENS,
                                        num_labels=6, **_SMALL, **_NO_DROPOUT),
                 "ConvBertForSequenceClassification"),
    "mpnet": ("MPNetConfig", dict(vocab_size=VOCAB, max_position_embeddings=TOKENS + 2,
                                  pad_token_id=0, num_labels=6,
                                  **_SMALL, **_NO_DROPOUT), "MPNetForSequenceClassification"),
    "funnel": ("FunnelConfig", dict(vocab_size=VOCAB, block_sizes=[1, 1], block_repeats=[1, 1],
                                    num_decoder_layers=1, d_model=64, n_head=4, d_head=16,
                                    d_inner=128, hidden_dropout=0.0, attention_dropout=0.0,
                                    activation_dropout=0.0, num_labels=6),
               "FunnelForSequenceClassification"),
    "bart": ("BartConfig", dict(vocab_size=VOCAB, d_model=64, encoder_layers=1, decoder_layers=1,
                                encoder_attention_heads=4, decoder_attention_heads=4,
                                encoder_ffn_dim=128, decoder_ffn_dim=128,
                                max_position_embeddings=TOKENS, dropout=0.0,
                                attention_dropout=0.0, classifier_dropout=0.0, num_labels=6,
                                pad_token_id=0, bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1,
                                decoder_start_token_id=VOCAB - 1),
             "BartForSequenceClassification"),
    "t5": ("T5Config", dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=1,
                            num_decoder_layers=1, num_heads=4, relative_attention_num_buckets=8,
                            dropout_rate=0.0, classifier_dropout=0.0, num_labels=6,
                            pad_token_id=0, eos_token_id=VOCAB - 1, decoder_start_token_id=0),
           "T5ForSequenceClassification"),
    "opt": ("OPTConfig", dict(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                              num_attention_heads=4, word_embed_proj_dim=64,
                              max_position_embeddings=TOKENS, dropout=0.0, attention_dropout=0.0,
                              num_labels=6, pad_token_id=0),
            "OPTForSequenceClassification"),
    "bloom": ("BloomConfig", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
                                  hidden_dropout=0.0, attention_dropout=0.0, num_labels=6,
                                  pad_token_id=0), "BloomForSequenceClassification"),
    "gpt-neox": ("GPTNeoXConfig", dict(rotary_pct=0.25, hidden_dropout=0.0, attention_dropout=0.0,
                                       **_DECODER), "GPTNeoXForSequenceClassification"),
    "phi": ("PhiConfig", dict(partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0,
                              attention_dropout=0.0, **_DECODER), "PhiForSequenceClassification"),
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2, **_DECODER),
              "Qwen2ForSequenceClassification"),
    "mistral": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=8, **_DECODER),
                "MistralForSequenceClassification"),
    "gemma": ("GemmaConfig", dict(num_key_value_heads=2, head_dim=16, **_DECODER),
              "GemmaForSequenceClassification"),
    "roformer": ("RoFormerConfig", dict(vocab_size=VOCAB, embedding_size=64,
                                        max_position_embeddings=TOKENS, num_labels=6, **_SMALL,
                                        **_NO_DROPOUT), "RoFormerForSequenceClassification"),
    "big-bird": ("BigBirdConfig", dict(vocab_size=VOCAB, max_position_embeddings=TOKENS,
                                       attention_type="original_full", num_labels=6, **_SMALL,
                                       **_NO_DROPOUT), "BigBirdForSequenceClassification"),
    "longformer": ("LongformerConfig", dict(vocab_size=VOCAB, max_position_embeddings=TOKENS + 2,
                                            attention_window=4, pad_token_id=0, num_labels=6,
                                            **_SMALL, **_NO_DROPOUT),
                   "LongformerForSequenceClassification"),        # sliding-window attention
    "fnet": ("FNetConfig", dict(vocab_size=VOCAB, max_position_embeddings=TOKENS, num_labels=6,
                                hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                hidden_dropout_prob=0.0, use_tpu_fourier_optimizations=False),
             "FNetForSequenceClassification"),                    # a 2-D FFT as token mixer
    "nystromformer": ("NystromformerConfig", dict(vocab_size=VOCAB,
                                                  max_position_embeddings=TOKENS + 2,
                                                  num_landmarks=4, segment_means_seq_len=TOKENS,
                                                  num_labels=6, **_SMALL, **_NO_DROPOUT),
                      "NystromformerForSequenceClassification"),
    "gptj": ("GPTJConfig", dict(vocab_size=VOCAB, n_positions=TOKENS, n_embd=64, n_layer=2,
                                n_head=4, rotary_dim=8, resid_pdrop=0.0, embd_pdrop=0.0,
                                attn_pdrop=0.0, num_labels=6, pad_token_id=0, bos_token_id=None,
                                eos_token_id=None), "GPTJForSequenceClassification"),
    "gpt-bigcode": ("GPTBigCodeConfig", dict(vocab_size=VOCAB, n_positions=TOKENS, n_embd=64,
                                             n_layer=2, n_head=4, multi_query=True,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                             num_labels=6, pad_token_id=0),
                    "GPTBigCodeForSequenceClassification"),       # multi-query attention
    "falcon": ("FalconConfig", dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, hidden_dropout=0.0,
                                    attention_dropout=0.0, num_labels=6, pad_token_id=0),
               "FalconForSequenceClassification"),
    "mpt": ("MptConfig", dict(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4,
                              max_seq_len=TOKENS, num_labels=6, pad_token_id=0),
            "MptForSequenceClassification"),                      # ALiBi
    "stablelm": ("StableLmConfig", dict(num_key_value_heads=2, **_DECODER),
                 "StableLmForSequenceClassification"),
    "mixtral": ("MixtralConfig", dict(num_key_value_heads=2, num_local_experts=4,
                                      num_experts_per_tok=2, **_DECODER),
                "MixtralForSequenceClassification"),          # top-2 of 4 experts per token
    # vision: which quadrant is bright (4 classes), 32x32
    "segformer": ("SegformerConfig", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                          hidden_sizes=[16, 32], patch_sizes=[7, 3],
                                          strides=[4, 2], num_attention_heads=[1, 2],
                                          mlp_ratios=[2, 2], decoder_hidden_size=32,
                                          drop_path_rate=0.0, classifier_dropout_prob=0.0,
                                          num_labels=4), "SegformerForImageClassification"),
    "mobilevit": ("MobileViTConfig", dict(image_size=32, hidden_sizes=[16, 24, 32],
                                          neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                          num_attention_heads=2, expand_ratio=2.0,
                                          hidden_dropout_prob=0.0, classifier_dropout_prob=0.0,
                                          num_labels=4), "MobileViTForImageClassification"),
    "efficientnet": ("EfficientNetConfig", dict(image_size=32, width_coefficient=0.25,
                                                depth_coefficient=0.3, hidden_dim=320,
                                                dropout_rate=0.0, drop_connect_rate=0.0,
                                                num_labels=4),
                     "EfficientNetForImageClassification"),
    "regnet": ("RegNetConfig", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                    groups_width=8, num_labels=4),
               "RegNetForImageClassification"),
    "levit": ("LevitConfig", dict(image_size=32, hidden_sizes=[32, 48, 64],
                                  num_attention_heads=[2, 3, 4], depths=[1, 1, 1],
                                  key_dim=[8, 8, 8], mlp_ratio=[2, 2, 2],
                                  attention_ratio=[2, 2, 2], num_labels=4),
              "LevitForImageClassification"),
    "poolformer": ("PoolFormerConfig", dict(num_encoder_blocks=2, depths=[1, 1],
                                            hidden_sizes=[16, 32], patch_sizes=[7, 3],
                                            strides=[4, 2], padding=[2, 1], mlp_ratio=2.0,
                                            drop_path_rate=0.0, num_labels=4),
                   "PoolFormerForImageClassification"),
    "beit": ("BeitConfig", dict(image_size=32, patch_size=8, use_relative_position_bias=True,
                                use_mean_pooling=True, drop_path_rate=0.0, num_labels=4,
                                **_SMALL, **_NO_DROPOUT), "BeitForImageClassification"),
    "deit": ("DeiTConfig", dict(image_size=32, patch_size=8, num_labels=4, **_SMALL,
                                **_NO_DROPOUT), "DeiTForImageClassification"),
    "dinov2": ("Dinov2Config", dict(image_size=32, patch_size=8, mlp_ratio=2, num_labels=4,
                                    hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    **_NO_DROPOUT), "Dinov2ForImageClassification"),
    "cvt": ("CvtConfig", dict(embed_dim=[16, 32, 64], num_heads=[1, 2, 4], depth=[1, 2, 3],
                              mlp_ratio=[2.0, 2.0, 2.0], drop_path_rate=[0.0, 0.0, 0.0],
                              num_labels=4), "CvtForImageClassification"),
    "bit": ("BitConfig", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                              num_groups=4, num_labels=4),
            "BitForImageClassification"),     # weight-standardized Convs, GroupNorm
    "convnextv2": ("ConvNextV2Config", dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                                            image_size=32, num_labels=4),
                   "ConvNextV2ForImageClassification"),
    "swinv2": ("Swinv2Config", dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                    num_heads=[2, 2], window_size=4, drop_path_rate=0.0,
                                    num_labels=4), "Swinv2ForImageClassification"),
    "focalnet": ("FocalNetConfig", dict(image_size=32, patch_size=4, embed_dim=16,
                                        hidden_sizes=[16, 32], depths=[1, 1],
                                        focal_levels=[2, 2], focal_windows=[3, 3],
                                        drop_path_rate=0.0, num_labels=4),
                 "FocalNetForImageClassification"),
    "mobilenet-v1": ("MobileNetV1Config", dict(image_size=32, depth_multiplier=0.25,
                                               classifier_dropout_prob=0.0, num_labels=4),
                     "MobileNetV1ForImageClassification"),
    # audio
    "wavlm": ("WavLMConfig", dict(conv_dim=(32, 32), conv_kernel=(10, 3), conv_stride=(5, 2),
                                  conv_bias=True, num_conv_pos_embeddings=16,
                                  num_conv_pos_embedding_groups=4, num_buckets=32,
                                  max_bucket_distance=64, mask_time_prob=0.0, layerdrop=0.0,
                                  hidden_dropout=0.0, attention_dropout=0.0,
                                  activation_dropout=0.0, final_dropout=0.0,
                                  num_labels=4, classifier_proj_size=32, **_SMALL),
              "WavLMForSequenceClassification"),     # gated relative position bias
    "data2vec-audio": ("Data2VecAudioConfig", dict(
        conv_dim=(32, 32), conv_kernel=(10, 3), conv_stride=(5, 2), conv_bias=True,
        num_conv_pos_embeddings=2, conv_pos_kernel_size=5, num_conv_pos_embedding_groups=4,
        mask_time_prob=0.0, layerdrop=0.0, hidden_dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, final_dropout=0.0, num_labels=4, classifier_proj_size=32,
        **_SMALL), "Data2VecAudioForSequenceClassification"),
    "hubert": ("HubertConfig", dict(conv_dim=(32, 32), conv_kernel=(10, 3), conv_stride=(5, 2),
                                    conv_bias=True, num_conv_pos_embeddings=16,
                                    num_conv_pos_embedding_groups=4, mask_time_prob=0.0,
                                    layerdrop=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
                                    num_labels=4, classifier_proj_size=32, **_SMALL,
                                    **_NO_DROPOUT), "HubertForSequenceClassification"),
    "ast": ("ASTConfig", dict(patch_size=8, num_mel_bins=16, max_length=32, frequency_stride=4,
                              time_stride=4, num_labels=4, **_SMALL, **_NO_DROPOUT),
            "ASTForAudioClassification"),
}


def _hf_model(name: str, transformers):
    if name in MORE:
        config_class, arguments, model_class = MORE[name]
        config = getattr(transformers, config_class)(**arguments)
        return getattr(transformers, model_class)(config)
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
    if name in ("bert", "bert-seq"):
        config = transformers.BertConfig(vocab_size=VOCAB, max_position_embeddings=TOKENS,
                                         num_labels=6, **small)
        return transformers.BertForSequenceClassification(config)
    if name == "albert":            # one layer's weights shared by both
        config = transformers.AlbertConfig(vocab_size=VOCAB, embedding_size=32,
                                           max_position_embeddings=TOKENS, num_labels=6,
                                           classifier_dropout_prob=0.0, **small)
        return transformers.AlbertForSequenceClassification(config)
    if name == "deberta":           # disentangled attention: relative positions
        config = transformers.DebertaV2Config(vocab_size=VOCAB, max_position_embeddings=TOKENS,
                                              relative_attention=True, position_buckets=8,
                                              pos_att_type=["p2c", "c2p"], type_vocab_size=0,
                                              num_labels=6, **small)
        return transformers.DebertaV2ForSequenceClassification(config)
    if name == "xlnet":             # torch.einsum throughout, relative positions
        config = transformers.XLNetConfig(vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4,
                                          d_inner=128, dropout=0.0, num_labels=6,
                                          use_mems_eval=False)
        return transformers.XLNetForSequenceClassification(config)
    if name == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=VOCAB, max_position_embeddings=TOKENS,
                                               dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                               dropout=0.0, attention_dropout=0.0,
                                               num_labels=6)
        return transformers.DistilBertForSequenceClassification(config)
    if name in ("gpt2", "gpt2-lm"):
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=TOKENS, n_embd=64,
                                         n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, num_labels=6, pad_token_id=0)
        return (transformers.GPT2LMHeadModel if name == "gpt2-lm" else
                transformers.GPT2ForSequenceClassification)(config)
    if name == "llama":
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=TOKENS,
                                          num_labels=6, pad_token_id=0)
        return transformers.LlamaForSequenceClassification(config)
    if name == "swin":              # shifted windows: rolls, window partitions
        config = transformers.SwinConfig(image_size=32, patch_size=4, num_channels=3,
                                         embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                         window_size=4, num_labels=4, drop_path_rate=0.0,
                                         hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
        return transformers.SwinForImageClassification(config)
    if name == "resnet":
        config = transformers.ResNetConfig(num_channels=3, embedding_size=16,
                                           hidden_sizes=[16, 32], depths=[1, 1],
                                           layer_type="basic", num_labels=4)
        return transformers.ResNetForImageClassification(config)
    if name == "mobilenet":         # TensorFlow's "same" padding, computed from the shape
        config = transformers.MobileNetV2Config(num_channels=3, image_size=32,
                                                depth_multiplier=0.35, num_labels=4,
                                                classifier_dropout_prob=0.0)
        return transformers.MobileNetV2ForImageClassification(config)
    if name == "convnext":
        config = transformers.ConvNextConfig(num_channels=3, patch_size=4, hidden_sizes=[16, 32],
                                             depths=[1, 1], num_stages=2, image_size=32, num_labels=4,
                                             drop_path_rate=0.0)
        return transformers.ConvNextForImageClassification(config)
    if name == "vit":
        config = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3,
                                        num_labels=4, **small)
        return transformers.ViTForImageClassification(config)
    if name == "wav2vec2":
        config = transformers.Wav2Vec2Config(
            conv_dim=(32, 32), conv_kernel=(10, 3), conv_stride=(5, 2), conv_bias=True,
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            mask_time_prob=0.0, layerdrop=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
            num_labels=4, classifier_proj_size=32, **small)
        return transformers.Wav2Vec2ForSequenceClassification(config)
    config = transformers.WhisperConfig(num_mel_bins=16, max_source_positions=16, d_model=64,
                                        encoder_layers=2, encoder_attention_heads=4,
                                        encoder_ffn_dim=128, decoder_layers=1,
                                        decoder_attention_heads=4, decoder_ffn_dim=128,
                                        dropout=0.0, attention_dropout=0.0, num_labels=4)
    return transformers.WhisperForAudioClassification(config)


def _hf_task(name: str, rng):
    if name in TEXT:
        return _text_task(rng, with_types=name in TOKEN_TYPES, eos=name in ENDS_WITH_EOS)
    if name in IMAGE:
        return _image_task(rng)
    return {"gpt2-lm": _next_token_task, "whisper": _audio_task, "wav2vec2": _wave_task,
            "hubert": _wave_task, "wavlm": _wave_task, "data2vec-audio": _wave_task,
            "ast": _spectrogram_task}[name](rng)


class _Logits:
    """A transformers model called with named inputs, returning its logits only (what is
    exported: a tuple output of a ModelOutput would add nothing)."""

    @staticmethod
    def wrap(torch, model, names: list):
        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                return self.model(**dict(zip(names, args))).logits
        return Wrapper()


def _fine_tune(torch, model, data: dict, labels: np.ndarray) -> float:
    """STEPS of Adam on TRAIN rows; the accuracy on them after (of every position's class
    for a model answering per position, whose (rows, positions, classes) logits are trained
    as cross_entropy takes them, classes second)."""
    trained = model
    if labels.ndim == 2:
        class ClassesSecond(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                return self.model(*args).transpose(1, 2)
        trained = ClassesSecond()
    _train(torch, trained, data, labels, {k: 0 for k in data}, STEPS, MINIBATCH, 2e-3)
    with torch.no_grad():
        got = model(*[torch.from_numpy(v[:TRAIN]) for v in data.values()]).argmax(-1).numpy()
    return round(100 * float(np.mean(got == labels[:TRAIN])), 2)


def _export(torch, net, data: dict, path: Path, dynamo: bool, sequence: bool) -> None:
    """torch.onnx.export with a dynamic batch (and, with `sequence`, a dynamic axis 1 of
    every input, as Optimum exports a text model)."""
    names = list(data)
    sample = tuple(torch.from_numpy(v[:2]) for v in data.values())
    if dynamo:          # the wrapper's *args: their dynamic shapes under "args"
        batch, length = torch.export.Dim("N", min=2), torch.export.Dim("T", min=2, max=TOKENS)
        shapes = tuple({0: batch, 1: length} if sequence else {0: batch} for _ in names)
        torch.onnx.export(net, sample, str(path), input_names=names, dynamo=True,
                          dynamic_shapes={"args": shapes})
    else:
        torch.onnx.export(net, sample, str(path), input_names=names, dynamo=False,
                          opset_version=17, dynamic_axes={
                              k: {0: "N", 1: "T"} if sequence else {0: "N"} for k in names})


def hf_models(work: Path, only: list) -> list[dict]:
    import torch
    import transformers
    rows = []
    for name in HF:
        if name not in only:
            continue
        rng = np.random.default_rng(0)
        data, labels = _hf_task(name, rng)
        torch.manual_seed(0)
        net = _Logits.wrap(torch, _hf_model(name, transformers), list(data))
        train_accuracy = _fine_tune(torch, net, data, labels)
        axes = {k: 0 for k in data}
        calib = _rows(data, axes, TRAIN, TRAIN + CALIBRATE)
        evaluation = _rows(data, axes, TRAIN + CALIBRATE, ROWS)
        for dynamo in (False, True):
            form = "dynamo" if dynamo else "torchscript"
            row = {"model": f"{name} ({form})", "train_accuracy": train_accuracy}
            folder = work / f"{name}-{form}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{name}.onnx"
            try:
                _export(torch, net, data, path, dynamo, name.endswith("-seq"))
            except Exception as e:                  # an exporter's failure, not tpuasm's
                row["failure"] = f"export: {_export_error(e)}"
                rows.append(_print(row))
                continue
            rows.append(_print(measure(path, folder, calib, evaluation, row,
                                       labels[TRAIN + CALIBRATE:])))
    return rows


def _export_error(e: Exception) -> str:
    """The line that says why (torch.onnx's dynamo exporter puts it under its 'Exception
    summary' heading, after a page of advice)."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    for i, line in enumerate(lines[:-1]):
        if "Exception summary" in line:
            return lines[i + 1][:300]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


# ----------------------------------------------------------------------------- scikit-learn
def _sklearn_data(name: str):
    """(estimator, x_train, y_train, x_calib, x_eval) for one of SKLEARN."""
    from sklearn import datasets
    from sklearn.decomposition import PCA
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC, LinearSVC
    rng = np.random.default_rng(0)
    estimators = {
        "pca-logreg": ("digits", make_pipeline(StandardScaler(), PCA(32),
                                               LogisticRegression(max_iter=2000))),
        "mlp-regressor": ("diabetes", make_pipeline(StandardScaler(), MLPRegressor(
            hidden_layer_sizes=(64, 32), max_iter=2000, random_state=0))),
        "svc-linear": ("digits", SVC(kernel="linear", probability=True, random_state=0)),
        "linear-svc": ("digits", LinearSVC(max_iter=5000)),
        "random-forest": ("iris", RandomForestClassifier(n_estimators=20, random_state=0)),
        "knn": ("digits", KNeighborsClassifier(n_neighbors=5)),
        "gaussian-nb": ("iris", GaussianNB()),
        "ridge": ("diabetes", Ridge(alpha=1.0)),
    }
    source, estimator = estimators[name]
    data = getattr(datasets, f"load_{source}")()
    x, y = data.data.astype(np.float32), data.target
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    if source == "iris":                    # 150 rows: new rows around them
        estimator.fit(x, y)
        spread = x.std(0) * 0.15
        new = x[rng.integers(0, len(x), CALIBRATE + 512)] + rng.normal(
            0, 1, (CALIBRATE + 512, x.shape[1])) * spread
        new = new.astype(np.float32)
        return estimator, new[:CALIBRATE], new[CALIBRATE:]
    if source == "diabetes":                # 442 rows: fit on 300, new rows around them
        estimator.fit(x[:300], y[:300])
        spread = x.std(0) * 0.2
        new = x[rng.integers(0, len(x), CALIBRATE + 512)] + rng.normal(
            0, 1, (CALIBRATE + 512, x.shape[1])) * spread
        new = new.astype(np.float32)
        return estimator, new[:CALIBRATE], new[CALIBRATE:]
    # digits: 1,797 rows; fit on 1,157 (the rest, 640, are 128 + 512 new ones)
    estimator.fit(x[:-CALIBRATE - 512], y[:-CALIBRATE - 512])
    return estimator, x[-CALIBRATE - 512:-512], x[-512:]


def sklearn_models(work: Path, only: list) -> list[dict]:
    from skl2onnx import to_onnx
    rows = []
    for name in SKLEARN:
        if name not in only:
            continue
        row = {"model": f"{name} (skl2onnx)"}
        estimator, calib, evaluation = _sklearn_data(name)
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.onnx"
        try:
            path.write_bytes(to_onnx(estimator, calib[:1]).SerializeToString())
        except Exception as e:
            row["failure"] = f"skl2onnx: {type(e).__name__}: {str(e).splitlines()[0]}"
            rows.append(_print(row))
            continue
        import onnx
        feed = onnx.load(str(path)).graph.input[0].name
        rows.append(_print(measure(path, folder, {feed: calib}, {feed: evaluation}, row)))
    return rows


# ----------------------------------------------------------------------------- measuring
def measure(model: Path, folder: Path, calib: dict, evaluation: dict, row: dict,
            labels=None) -> dict:
    np.savez(folder / "calib.npz", **calib)
    np.savez(folder / "eval.npz", **evaluation)
    got = compile_and_infer(model, folder, [], row)
    out = folder / model.stem
    if (out / "report.json").exists():
        row.update(matrix_placement(model, json.loads((out / "report.json").read_text())))
    if got is None:
        return row
    ref = _as_arrays(_run(model, evaluation))
    row.update(accuracy(ref, got, labels, _as_arrays(_run(model, calib))))
    row.update(ort_qdq(model, folder, calib, evaluation, ref))
    return row


def matrix_placement(model: Path, report: dict) -> dict:
    """How many of the model's matrix nodes the report puts on the TPU; the host ones with
    their reasons, a MatMul of two activations marked."""
    import onnx
    graph = onnx.load(str(model), load_external_data=False).graph
    constants = {i.name for i in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    both_activations = {n.name for n in graph.node if n.op_type in ("MatMul", "Einsum")
                        and not set(n.input) & constants}
    # (a product of constants is computed when compiling: DeBERTa's relative positions')
    matrix = [r for r in report["rows"] if r["op_type"] in MATRIX_OPS
              and not r["reason"].startswith("constant-folded")]
    host = [r for r in matrix if r["where"] != "TPU"]
    activations = [r for r in host if r["node"] in both_activations]
    return {"matrix": f"{len(matrix) - len(host)}/{len(matrix)}",
            "matrix_act_x_act_on_host": len(activations),
            "matrix_on_host": [f"{r['op_type']} {r['node']}: {r['reason']}" for r in host
                               if r["node"] not in both_activations]}


def accuracy(ref: dict, got: dict, labels, calibrated: dict) -> dict:
    """Top-1 against the float model (its label output where it has one), SNR of every float
    output; for a regression its error in steps of the output's quantization (the float
    model's range on the calibration rows / 255): median, 99th percentile and largest (the
    largest on rows with an input beyond the calibration rows' range: clipped)."""
    row: dict = {"snr": {}}
    for k, v in ref.items():
        if np.issubdtype(v.dtype, np.floating):
            row["snr"][k] = round(snr(v, got[k].reshape(v.shape).astype(v.dtype)), 1)
    want, mine = _classes(ref), _classes(got)
    if want is not None:
        row.update(top1_figures(want, mine.reshape(want.shape)))
        if labels is not None:
            row["float_accuracy"] = round(100 * float(np.mean(want == labels.ravel())), 2)
        return row
    name = next(iter(ref))
    y, seen = ref[name].reshape(len(ref[name]), -1), calibrated[name]
    steps = np.abs(got[name].reshape(y.shape) - y).max(1) / ((seen.max() - seen.min()) / 255)
    row["error_steps"] = {"median": round(float(np.median(steps)), 2),
                          "p99": round(float(np.percentile(steps, 99)), 2),
                          "max": round(float(steps.max()), 2)}
    return row


def _as_arrays(outputs: dict) -> dict:
    """onnxruntime's outputs with a ZipMap's list of {class: probability} (skl2onnx's
    default) as an array, its columns in the classes' order (as `tpuasm infer` writes it)."""
    return {k: np.array([[d[c] for c in sorted(v[0])] for d in v], np.float32)
            if isinstance(v, list) else v for k, v in outputs.items()}


def _classes(outputs: dict):
    """The classes a model answers: its integer label output, else the argmax of its first
    2-D float output of more than one column; None for a regression."""
    for v in outputs.values():
        if np.issubdtype(v.dtype, np.integer) and v.ndim == 1:
            return v
    for v in outputs.values():
        if np.issubdtype(v.dtype, np.floating) and v.ndim in (2, 3) and v.shape[-1] > 1:
            return v.argmax(-1).ravel()         # (rows, positions, classes): every position
    return None


def ort_qdq(model: Path, folder: Path, calib: dict, evaluation: dict, ref: dict) -> dict:
    """onnxruntime's own quantize_static QDQ model of the float model on the same rows."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Rows(CalibrationDataReader):
        def __init__(self):
            count = len(next(iter(calib.values())))
            self.rows = iter([{n: v[i:i + 1] for n, v in calib.items()}
                              for i in range(count)])

        def get_next(self):
            return next(self.rows, None)

    path = folder / f"{model.stem}.ort-qdq.onnx"
    source = _one_import_per_domain(model, folder)
    try:
        quantize_static(str(source), str(path), Rows(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8,
                        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        own = _as_arrays(_run(path, evaluation))
    except Exception as e:
        return {"ort_qdq": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    want, theirs = _classes(ref), _classes(own)
    row: dict = {"ort_qdq_snr": {k: round(snr(v, own[k].reshape(v.shape)), 1)
                                 for k, v in ref.items()
                                 if np.issubdtype(v.dtype, np.floating)}}
    if want is not None:
        row["ort_qdq_top1"] = round(100 * float(np.mean(want == theirs.reshape(want.shape))), 2)
    return row


def _one_import_per_domain(model: Path, folder: Path) -> Path:
    """The model, or a copy importing each domain once (skl2onnx imports the ONNX domain
    twice for a model of scikit-learn operators alone, which quantize_static refuses:
    'Failed to find proper ai.onnx domain'); the highest version kept."""
    import onnx
    m = onnx.load(str(model))
    versions: dict = {}
    for o in m.opset_import:
        versions[o.domain] = max(versions.get(o.domain, 0), o.version)
    if len(versions) == len(m.opset_import):
        return model
    del m.opset_import[:]
    m.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in versions.items())
    copy = folder / f"{model.stem}.one-import.onnx"
    onnx.save(m, str(copy))
    return copy


def _print(row: dict) -> dict:
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = ("model", "compiled", "matrix on TPU", "top-1", "ORT QDQ top-1", "SNR dB",
            "ORT QDQ SNR", "compile s", "peak MB", "load")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        first = lambda d: next(iter(d.values())) if isinstance(d, dict) and d else "-"  # noqa
        top1 = r.get("top1", "error in steps: median {median}, p99 {p99}, max {max}".format(
            **r["error_steps"]) if "error_steps" in r else "-")
        cells = (r["model"], "no: " + r["failure"] if "failure" in r else "yes",
                 r.get("matrix", "-") + (f" (+{r['matrix_act_x_act_on_host']} act x act)"
                                         if r.get("matrix_act_x_act_on_host") else ""),
                 top1, r.get("ort_qdq_top1", r.get("ort_qdq", "-")), first(r.get("snr")),
                 first(r.get("ort_qdq_snr")), f"{r['compile_s']:.1f}" if "compile_s" in r
                 else "-", r.get("compile_peak_mb", "-"), " ".join(r.get("load", [])))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, help="where models and OUTDIRs go (default: temp)")
    p.add_argument("--only", action="append", default=[],
                   help=f"one of {', '.join(HF + SKLEARN)} (repeatable)")
    args = p.parse_args(argv)
    wanted = args.only or [*HF, *SKLEARN]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if any(n in SKLEARN for n in wanted):
            rows += sklearn_models(work, wanted)
        if any(n in HF for n in wanted):
            try:
                import torch  # noqa: F401
                import transformers  # noqa: F401
            except ImportError:
                print("PyTorch or transformers is not installed: `make bench-hf` installs "
                      "the torch extra", file=sys.stderr)
                return 2
            rows += hf_models(work, wanted)
    print(table(rows))
    for r in rows:
        for line in r.get("matrix_on_host", []):
            print(f"{r['model']}: host {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
