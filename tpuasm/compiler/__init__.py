"""ONNX models -> TPU programs (spec: issue 10).  ir.py is the seam between the front end
(ONNX -> quantized segments) and the back end (segments -> .tasm, weights, host layout)."""
