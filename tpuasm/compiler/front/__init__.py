"""The compiler's front end: an ONNX model read (reader, graph, batch, samples, arrays), made
static and rewritten in float (fold, ortshapes, values, prepare), quantized where the TPU will
run it (quantize), and matched into the IR (match, partition; ir.py is the seam).  Provenance
and macs describe the user's nodes for the report."""
