"""FP8 matrix products with delayed per-tensor scaling: the reference (simulated in NumPy).

The original trained in FP8. The recipe here is the usual one for training on tensor cores: the
operands of the large matrix products are stored in 8 bits, e4m3 for weights and activations (3
mantissa bits, range ±448) and e5m2 for gradients (2 mantissa bits, range ±57344); the products
accumulate in fp32. Each tensor at each product ("site") has its own scale, chosen so its largest
magnitude lands just under the format's maximum. The scale comes from the amaxes (largest
magnitudes) of that site's last `history` tensors, not from the tensor being cast (delayed
scaling: no extra pass over the data before the cast). A value beyond the range saturates to ±max
(an overflow); a non-zero value that rounds to zero is an underflow; both are counted.

Decisions: a site's first tensor is scaled by its own amax (a delayed scale has nothing to go on
yet, and the scale 1 that recipes start from loses the small weights of an initial model in
underflow); scales are powers of two (`pow2`: then scaling and unscaling are exact, and the fp8
rounding is the only error); margin 0; history 16.

`FP8Sites.quantize(x, site, fmt)` returns the values the fp8 product sees, unscaled back to fp32
(each exactly an fp8 value divided by the scale): an fp32 product of two such tensors is what the
tensor cores compute from the fp8 operands, up to the fp32 accumulation order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - the test and gpu extras install it
    ml_dtypes = None


@dataclass(frozen=True)
class Format:
    name: str
    dtype: object  # the ml_dtypes type: its cast rounds to nearest even
    max: float


def formats() -> dict[str, Format]:
    if ml_dtypes is None:
        raise RuntimeError("fp8 needs ml_dtypes (pip install -c constraints.txt ml_dtypes): the exact rounding of the 8-bit formats")
    types = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
    return {name: Format(name, t, float(ml_dtypes.finfo(t).max)) for name, t in types.items()}  # 448, 57344


@dataclass
class DelayedScale:
    """One site's scale: from the largest amax of its last `history` tensors."""

    fmt: Format
    history: int = 16
    margin: int = 0
    pow2: bool = True
    amaxes: list = field(default_factory=list)
    last: float = 1.0  # the scale of the site's latest cast

    def scale(self, amax_now: float) -> float:
        amax = max(self.amaxes) if self.amaxes else amax_now  # the first tensor: its own amax
        if not amax > 0 or not math.isfinite(amax):
            return 1.0
        s = self.fmt.max / amax / 2.0**self.margin
        return 2.0 ** math.floor(math.log2(s)) if self.pow2 else s

    def record(self, amax: float) -> None:
        if math.isfinite(amax):
            self.amaxes.append(amax)
            del self.amaxes[:-self.history]


@dataclass
class Counts:
    values: int = 0
    overflow: int = 0  # saturated to ±max
    underflow: int = 0  # non-zero, rounded to zero

    def as_dict(self) -> dict:
        return {"values": self.values, "overflow": self.overflow, "underflow": self.underflow}


class FP8Sites:
    """The scales of every site of a model's products, and the overflow/underflow counts."""

    def __init__(self, history: int = 16, margin: int = 0, pow2: bool = True):
        self.fmts = formats()
        self.history, self.margin, self.pow2 = history, margin, pow2
        self.sites: dict = {}
        self.counts = Counts()

    def quantize(self, x: np.ndarray, site, fmt: str) -> np.ndarray:
        """x as the fp8 product sees it (e4m3 or e5m2 at the site's delayed scale, unscaled: fp32)."""
        f = self.fmts[fmt]
        state = self.sites.get((site, fmt))
        if state is None:
            state = self.sites[(site, fmt)] = DelayedScale(f, self.history, self.margin, self.pow2)
        x32 = np.asarray(x, dtype=np.float32)
        amax = float(np.abs(x32).max()) if x32.size else 0.0
        state.last = state.scale(amax)
        q, over, under = self._cast(x32, state.last, f)
        self.counts.values += x32.size
        self.counts.overflow += over
        self.counts.underflow += under
        state.record(amax)
        return q.astype(np.asarray(x).dtype, copy=False)

    def requantize(self, x: np.ndarray, site, fmt: str) -> np.ndarray:
        """x cast again at the scale of the site's latest cast (the backward pass reading the
        forward's 8-bit operand), neither counted nor recorded."""
        state = self.sites[(site, fmt)]
        q, _, _ = self._cast(np.asarray(x, dtype=np.float32), state.last, self.fmts[fmt])
        return q.astype(np.asarray(x).dtype, copy=False)

    @staticmethod
    def _cast(x32: np.ndarray, scale: float, f: Format) -> tuple[np.ndarray, int, int]:
        """(x rounded to the format at `scale` and unscaled, overflows, underflows)."""
        s = np.float32(scale)
        scaled = x32 * s
        over = int((np.abs(scaled) > f.max).sum())
        q = np.clip(scaled, -f.max, f.max).astype(f.dtype).astype(np.float32)
        under = int(((q == 0) & (x32 != 0)).sum())
        return q / s, over, under
