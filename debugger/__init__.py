"""The Textual step-debugger for TPU programs."""
