"""Data for double_buffer_serial: the very same data as double_buffer.

Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def generate(out_dir):
    path = HERE.parent / "double_buffer" / "gen.py"
    spec = importlib.util.spec_from_file_location("double_buffer_gen", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(out_dir, tasm=HERE / "double_buffer_serial.tasm")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")
