"""Plausible wrong solutions of chapter 02's implement-exercise, each with the rule its grader must name."""

from ggml_lite.errors import AlignmentError


def _power_of_two(alignment):
    if alignment <= 0 or alignment & (alignment - 1):
        raise AlignmentError(f"alignment {alignment} is not a power of two")


def offset_only(buffer, offset, alignment):
    _power_of_two(alignment)
    return offset + (alignment - offset % alignment) % alignment


def always_adds(buffer, offset, alignment):
    _power_of_two(alignment)
    return offset + alignment - ((buffer or 0) + offset) % alignment


def rounds_down(buffer, offset, alignment):
    _power_of_two(alignment)
    return offset - ((buffer or 0) + offset) % alignment


def unchecked(buffer, offset, alignment):
    return offset + (alignment - ((buffer or 0) + offset) % alignment) % alignment


WRONG = {
    "02.3": [
        ("the offset aligned, not the address", offset_only, "address"),
        ("alignment - remainder, without the outer % alignment", always_adds, "aligned stays"),
        ("rounded down", rounds_down, "round up"),
        ("no power-of-two check", unchecked, "power of two"),
    ],
}
