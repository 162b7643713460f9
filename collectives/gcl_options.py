"""GCL options (anchors §2.2; seed 004:1492-1494 ``IPUConfig.gcl_poplar_options``).

Options are poplar ``OptionFlags``: string keys and values. They come from
``IPUConfig.gcl_poplar_options`` and the ``GCL_OPTIONS`` environment variable (a JSON object),
which overrides the config key by key, as in GCL. In ipupod they choose the *modelled*
algorithm of a collective (what the cost model charges); they never change a result, which
always follows the canonical tree order.

| option                                      | values                                  | default |
|---------------------------------------------|-----------------------------------------|---------|
| ``method``                                  | see :data:`METHODS`                     | auto    |
| ``syncful.maxBroadcastSize``                | bytes, integer >= 0                     | 2048    |
| ``syncful.useOptimisedLayout``              | true, false                             | true    |
| ``syncful.useForwardingToSupportStridedGroups`` | auto, true, false                   | auto    |

``method=auto`` picks ``broadcast`` when ``group_size * nbytes <= syncful.maxBroadcastSize``
(GCL's rule for small tensors) and otherwise ``bidirectional_ring_pair`` -- ipupod's choice,
since GCL's own heuristics are not published: it is the ring that uses both directions of
every link.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

GCL_OPTIONS_ENV = "GCL_OPTIONS"

METHODS = ("auto", "clockwise_ring", "anticlockwise_ring", "bidirectional_ring_pair",
           "meet_in_middle_ring", "quad_directional_ring", "broadcast")
KNOWN_OPTIONS = ("method", "syncful.maxBroadcastSize", "syncful.useOptimisedLayout",
                 "syncful.useForwardingToSupportStridedGroups")
_BOOL = {"true": True, "false": False}


@dataclass(frozen=True)
class GCLOptions:
    """Parsed GCL options.

    Attributes:
        method: one of :data:`METHODS`.
        max_broadcast_size: ``syncful.maxBroadcastSize`` in bytes.
        use_optimised_layout: ``syncful.useOptimisedLayout``.
        use_forwarding: ``syncful.useForwardingToSupportStridedGroups`` (auto/true/false).
    """

    method: str = "auto"
    max_broadcast_size: int = 2048
    use_optimised_layout: bool = True
    use_forwarding: str = "auto"

    def modelled_method(self, group_size: int, nbytes: int) -> str:
        """The method a call's record carries for the cost model: the configured one;
        ``"auto"`` stays ``"auto"`` and the cost model takes the cheapest schedule it knows
        (:mod:`collectives.performance.pricing`), so ``max_broadcast_size`` no longer makes a step in
        modelled time. ``group_size`` and ``nbytes`` are kept for callers."""
        del group_size, nbytes
        return self.method

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None = None,
              environ: Mapping[str, str] | None = None) -> "GCLOptions":
        """Options from a config dict, overridden by ``GCL_OPTIONS`` in ``environ``.

        Raises:
            ValueError: an unknown option (names the known ones), a bad value (names the
                valid ones), or ``GCL_OPTIONS`` that is not a JSON object.
        """
        merged = dict(options or {})
        raw = (os.environ if environ is None else environ).get(GCL_OPTIONS_ENV, "")
        if raw.strip():
            try:
                env = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{GCL_OPTIONS_ENV}={raw!r} is not JSON: {exc}") from None
            if not isinstance(env, dict):
                raise ValueError(f"{GCL_OPTIONS_ENV} must be a JSON object, got {raw!r}")
            merged.update(env)
        unknown = sorted(k for k in merged if k not in KNOWN_OPTIONS)
        if unknown:
            raise ValueError(f"unknown GCL option(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(KNOWN_OPTIONS)}")
        kwargs: dict[str, Any] = {}
        if "method" in merged:
            method = str(merged["method"])
            if method not in METHODS:
                raise ValueError(f"GCL option method={method!r} is not one of "
                                 f"{', '.join(METHODS)}")
            kwargs["method"] = method
        if "syncful.maxBroadcastSize" in merged:
            kwargs["max_broadcast_size"] = _size(merged["syncful.maxBroadcastSize"])
        if "syncful.useOptimisedLayout" in merged:
            kwargs["use_optimised_layout"] = _flag("syncful.useOptimisedLayout",
                                                   merged["syncful.useOptimisedLayout"],
                                                   _BOOL)
        if "syncful.useForwardingToSupportStridedGroups" in merged:
            value = str(merged["syncful.useForwardingToSupportStridedGroups"]).lower()
            _flag("syncful.useForwardingToSupportStridedGroups", value,
                  {"auto": 0, **_BOOL})
            kwargs["use_forwarding"] = value
        return cls(**kwargs)


def _size(value: Any) -> int:
    try:
        size = int(str(value), 10)
    except ValueError:
        size = -1
    if size < 0:
        raise ValueError(f"GCL option syncful.maxBroadcastSize={value!r} must be an integer "
                         "number of bytes >= 0")
    return size


def _flag(name: str, value: Any, valid: Mapping[str, Any]):
    text = str(value).lower()
    if text not in valid:
        raise ValueError(f"GCL option {name}={value!r} is not one of {', '.join(valid)}")
    return valid[text]
