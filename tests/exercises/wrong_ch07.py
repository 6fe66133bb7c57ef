"""Plausible wrong solutions of chapter 07's implement-exercise (07.2, `quantize_row_q8_0_ref`), each with the
rule its grader must reject it by."""

import numpy as np

F4 = np.float32


def _round_away(v):
    v = np.asarray(v, np.float64)
    return np.trunc(v + np.copysign(0.5, v))


def _quantize(amax=lambda b: np.abs(b).max(), scale="id", rounding=_round_away, store_f16=True, id_of_f16=False,
              per_block=True, zero_check=True):
    """A quantize_row_q8_0_ref with one step changed: how max|x| is found (`amax`), how x is scaled
    ("id": x·(1/d), "div": x/d, "cpu": x·(127/amax)), the rounding, whether d is stored as f16, whether id comes
    from the f16 d, one d per block or per row, and whether a zero block is special."""
    def quantize_row_q8_0_ref(x):
        x = np.asarray(x, F4)
        row_amax = F4(amax(x))
        out = []
        for i in range(0, x.size, 32):
            b = x[i:i + 32]
            m = F4(amax(b)) if per_block else row_amax
            d = m / F4(127)
            dh = F4(np.float16(d))
            with np.errstate(divide="ignore", invalid="ignore"):
                base = dh if id_of_f16 else d
                inv = F4(1) / base if (base or not zero_check) else F4(0)
                if scale == "div":
                    v = b / d if (d or not zero_check) else b * F4(0)
                elif scale == "cpu":
                    v = b * (F4(127) / m if m else F4(0))
                else:
                    v = b * inv
            q = rounding(v.astype(F4))
            qs = [int(t) if np.isfinite(t) else -128 for t in q]
            out.append((float(dh if store_f16 else d), qs))
        return out
    return quantize_row_q8_0_ref


WRONG = {
    "07.2": [
        ("no zero check: 1/0 gives inf, 0·inf gives NaN", _quantize(zero_check=False), "zero block"),
        ("rounds halves to even (np.rint)", _quantize(rounding=np.rint), "halves away"),
        ("roundf as trunc(v ± 0.5) in float32", _quantize(rounding=lambda v: np.trunc((v + np.copysign(F4(0.5), v))
                                                                                       .astype(F4))), "below a half"),
        ("the largest value, not the largest magnitude", _quantize(amax=np.max), "absmax"),
        ("stores the f32 d, not rounded to f16", _quantize(store_f16=False), "f16 scale"),
        ("id from the stored f16 d", _quantize(id_of_f16=True), "unrounded id"),
        ("divides by d", _quantize(scale="div"), "1/d"),
        ("the CPU quantizer's id = 127/max|x|, with roundf", _quantize(scale="cpu"), "1/d"),
        ("one d for the whole row", _quantize(per_block=False), "blocks"),
    ],
}
