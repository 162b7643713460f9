"""The Keras extension's option enums (GK ``keras/ipu/extensions/extensions_base.py:79-110``,
TFI ``ipu/gradient_accumulation.py:22-60``; reference tf-keras-ipu.md §4.4-4.5) and their
case-insensitive parsing with TF-IPU's messages."""

from __future__ import annotations

import enum

__all__ = ["ReplicatedMetricReductionMethod", "GradientAccumulationReductionMethod",
           "parse_metric_reduction", "parse_accumulation_reduction"]


class ReplicatedMetricReductionMethod(enum.Enum):
    """How a metric's per-replica values are combined: NONE (the last replica's), LIST
    (an R-vector, all_gather), SUM, MEAN."""

    NONE = 1
    LIST = 2
    SUM = 3
    MEAN = 4


class GradientAccumulationReductionMethod(enum.IntEnum):
    """How G micro-batch gradients combine: SUM, MEAN (sum x 1/G), RUNNING_MEAN
    (``acc*n/(n+1) + g/(n+1)``)."""

    SUM = 0
    MEAN = 1
    RUNNING_MEAN = 2


def parse_metric_reduction(value) -> ReplicatedMetricReductionMethod:
    """Raises: ValueError: "Cannot parse X as a ReplicatedMetricReductionMethod. ..."."""
    if isinstance(value, ReplicatedMetricReductionMethod):
        return value
    if isinstance(value, str) and value.upper() in ReplicatedMetricReductionMethod.__members__:
        return ReplicatedMetricReductionMethod[value.upper()]
    raise ValueError(f"Cannot parse {value} as a ReplicatedMetricReductionMethod. Valid values "
                     "are: NONE, LIST, SUM, MEAN.")


def parse_accumulation_reduction(value) -> GradientAccumulationReductionMethod:
    """Raises: ValueError: "Cannot parse X as one of GradientAccumulationReductionMethod. ..."."""
    if isinstance(value, GradientAccumulationReductionMethod):
        return value
    if isinstance(value, str) and \
            value.upper() in GradientAccumulationReductionMethod.__members__:
        return GradientAccumulationReductionMethod[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2:
        return GradientAccumulationReductionMethod(value)
    raise ValueError(f"Cannot parse {value} as one of GradientAccumulationReductionMethod. "
                     "Valid values are: SUM, MEAN, RUNNING_MEAN.")
