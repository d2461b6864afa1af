"""The weight image: (tiles, N, N) int8, tile[k, n] multiplying input element k into output
n (spec/isa.md 5.4).  Lowering registers each operator's tiles as *recipes* in consumption
order; `build()` allocates the image once and copies every weight straight from the IR's
arrays (which may be memory-mapped) into its tile: each weight is copied exactly once.

An operator with int16 weights (MatrixMultiply's D flag) has a *pair* of tiles where an
8-bit one has one: the weights' low bytes (read unsigned), then their high bytes (signed),
so that w = lo + 256 * hi (`weight_planes`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

Recipe = Callable[[np.ndarray], None]        # fills one zeroed (N, N) int8 tile

# The TPU v1's Weight Memory: 8 GiB of DDR3 (the paper), so 131,072 tiles of 256 x 256.
# A model whose tiles do not fit is refused before any weight is read or allocated.
WEIGHT_MEMORY_BYTES = 8 << 30


@dataclass
class TileRegion:
    name: str
    first: int
    recipes: list[Recipe] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.recipes)


@dataclass
class WeightImage:
    n: int
    regions: list[TileRegion] = field(default_factory=list)
    _by_name: dict[str, TileRegion] = field(default_factory=dict)

    @property
    def tiles(self) -> int:
        return sum(r.count for r in self.regions)

    def region(self, name: str) -> TileRegion:
        r = self._by_name.get(name)
        if r is None:
            r = TileRegion(name, self.tiles)
            self.regions.append(r)
            self._by_name[name] = r
        return r

    def add(self, region: str, recipe: Recipe) -> tuple[str, int]:
        """Register a tile; returns its (region, offset) for the weight stream."""
        r = self.region(region)
        if r is not self.regions[-1]:
            raise AssertionError("tiles of a region must be registered together")
        r.recipes.append(recipe)
        return region, r.count - 1

    def build(self) -> np.ndarray:
        image = np.zeros((max(self.tiles, 1), self.n, self.n), np.int8)
        for r in self.regions:
            for i, recipe in enumerate(r.recipes):
                recipe(image[r.first + i])
        return image


def weight_planes(recipe: Recipe, n: int) -> tuple[Recipe, Recipe]:
    """An int16 tile as the pair D switches to (spec/isa.md 5.4): the low bytes' tile, then
    the high bytes' (arithmetic shift: w = lo + 256 * hi with lo in 0..255).  `recipe` fills
    an int16 tile; it runs once, for the low plane (build() fills a region's tiles in
    order), which keeps its values for the high plane."""
    kept: list[np.ndarray] = []

    def low(out):
        values = _filled(recipe, n)
        kept.append(values)
        out[...] = (values & 0xFF).astype(np.uint8).view(np.int8)

    def high(out):
        values = kept.pop() if kept else _filled(recipe, n)
        out[...] = (values >> 8).astype(np.int8)
    return low, high


def _filled(recipe: Recipe, n: int) -> np.ndarray:
    values = np.zeros((n, n), np.int16)
    recipe(values)
    return values


def dense_tile(weight: np.ndarray, k0: int, n0: int, n: int) -> Recipe:
    """Rows k0.. and columns n0.. of a (K, N) weight matrix."""
    def fill(out):
        block = weight[k0:k0 + n, n0:n0 + n]
        out[:block.shape[0], :block.shape[1]] = block
    return fill


def strided_dense_tile(weight: np.ndarray, k0: int, count: int, step: int, n0: int,
                       n: int) -> Recipe:
    """Rows k0, k0 + step, ... (count of them) and columns n0.. of a (K, N) matrix: the
    channels of one pixel of a flattened (C, H, W) input (k = c * H * W + pixel)."""
    def fill(out):
        block = weight[k0:k0 + count * step:step, n0:n0 + n]
        out[:block.shape[0], :block.shape[1]] = block
    return fill


def conv_tile(weight: np.ndarray, o0: int, c0: int, dy: int, dx: int, n: int) -> Recipe:
    """Tap (dy, dx) of output channels o0.. and input channels c0.. of an (O, C, kh, kw)
    kernel, as tile[c, o]."""
    def fill(out):
        block = weight[o0:o0 + n, c0:c0 + n, dy, dx]
        out[:block.shape[1], :block.shape[0]] = block.T
    return fill


def identity_tile(n: int) -> Recipe:
    def fill(out):
        np.fill_diagonal(out, 1)
    return fill


def grouped_conv_tile(weight: np.ndarray, groups: int, o0: int, c0: int, dy: int, dx: int,
                      n: int) -> Recipe:
    """Tap (dy, dx) of a grouped (O, C/G, kh, kw) kernel as a tile of its block-diagonal
    (C, O) matrix: output o reads input channels g(o) * C/G .. only (zero elsewhere)."""
    o_total, cg = weight.shape[:2]
    og = o_total // groups

    def fill(out):
        for o in range(o0, min(o0 + n, o_total)):
            first = (o // og) * cg                       # its group's first input channel
            lo, hi = max(first, c0), min(first + cg, c0 + n)
            if lo < hi:
                out[lo - c0:hi - c0, o - o0] = weight[o, lo - first:hi - first, dy, dx]
    return fill


def group_chunks(op, j: int, n: int) -> range:
    """The input-channel chunks that output block j (channels j*n ..) of a Conv reads:
    all of them for groups = 1, only those its groups' channels fall in otherwise."""
    o_total, cg = op.weight.shape[:2]
    groups = op.groups
    chunks = -(-cg * groups // n)
    if groups == 1:
        return range(chunks)
    og = o_total // groups
    o0, o1 = j * n, min(o_total, (j + 1) * n) - 1
    first = (o0 // og) * cg
    last = (o1 // og + 1) * cg - 1
    return range(first // n, last // n + 1)
