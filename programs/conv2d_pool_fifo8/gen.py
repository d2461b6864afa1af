"""Data for conv2d_pool_fifo8: the very same data as conv2d_pool.

Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def generate(out_dir):
    path = HERE.parent / "conv2d_pool" / "gen.py"
    spec = importlib.util.spec_from_file_location("conv2d_pool_gen", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(out_dir)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")
