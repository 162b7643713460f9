"""The machinery under :class:`ipu_node.config.IPUConfig`: typed options in named groups.

TF-IPU builds its config tree from annotated assignments and docstrings parsed out of its
source (``tensorflow/python/ipu/config.py``); ipupod declares each option once, as an
:class:`Option` (default, TF-IPU's type string, a strict type check, an optional value
check, and its docstring), in a :class:`ConfigGroup` subclass. From these come what the seeds
describe (seed 004:1438-1473, 1886-1896): ``get_attribute_metadata(path)`` returning an
:class:`AttributeMetadata` (``name``, ``type``, ``default``, ``deprecated``,
``deprecated_msg``, ``check_type``, ``warn_if_deprecated``, ``__doc__``), and TF-IPU's errors:

* an option that does not exist: ``ConfigAttributeError`` (an ``AttributeError`` and a
  ``ValueError``, TF-IPU raises the latter) "'x' is not a valid attribute of this config.
  Did you mean 'y'?", which also names the valid options;
* a value of the wrong type: ``TypeError`` "Trying to set a.b to v, but it must be of type T"
  (types are strict, as TF-IPU's: ``True`` is no ``int``, ``1`` is no ``float``);
* a value out of range: ``ValueError`` naming the option (TF-IPU checks some of these when
  the config is configured; ipupod checks every one on assignment);
* assigning to a group: ``TypeError`` naming it.
"""

from __future__ import annotations

import copy
import difflib
import enum
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger("ipu_node.config")

__all__ = ["Option", "ConfigGroup", "AttributeMetadata", "ConfigAttributeError",
           "strict", "int_option", "bool_option", "str_option", "dict_option", "enum_option",
           "float_option"]


class ConfigAttributeError(AttributeError, ValueError):
    """An option that does not exist (TF-IPU raises ValueError; ipupod's earlier releases
    AttributeError: this is both)."""


def strict(*types: type) -> Callable[[Any], bool]:
    """A type check accepting exactly ``types`` (``type(v) is t``, as TF-IPU's)."""
    return lambda v: type(v) in types


@dataclass(frozen=True)
class Option:
    """One option of a group.

    Attributes:
        default: the default value (a ``dict``/``list`` default is copied per config).
        type: TF-IPU's type string (``"int"``, ``"typing.Union[int, ...]"``, an enum name).
        doc: the docstring: what the option does in TF-IPU and what it does in ipupod (or
            that it is accepted with no effect, and why).
        check: the strict type check (default: exactly the default's type).
        validate: ``validate(full_name, value) -> value`` raising ValueError (or TypeError
            for elements of a container) with the option's name; may normalise the value.
        deprecated_msg: TF-IPU's deprecation message, or None.
        explain: ``explain(value) -> str``, what is wrong with a value of the wrong type,
            appended to the TypeError (e.g. the offending element of a list).
    """

    default: Any
    type: str
    doc: str
    check: Callable[[Any], bool] | None = None
    validate: Callable[[str, Any], Any] | None = None
    deprecated_msg: str | None = None
    explain: Callable[[Any], str] | None = None

    def fresh_default(self) -> Any:
        return copy.copy(self.default) if isinstance(self.default, (dict, list)) \
            else self.default

    def type_ok(self, value: Any) -> bool:
        return self.check(value) if self.check is not None else \
            type(value) is type(self.default)


def bool_option(default: bool, doc: str, **kw) -> Option:
    return Option(default, "bool", doc, **kw)


def _int_range(minimum: int | None, maximum: int | None):
    def validate(name: str, value: int) -> int:
        if minimum is not None and value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ValueError(f"{name} must be an int <= {maximum}, got {value}")
        return value
    return validate


def int_option(default: int, doc: str, minimum: int | None = 0, maximum: int | None = None,
               **kw) -> Option:
    """An ``int`` option in ``[minimum, maximum]`` (None: unbounded)."""
    return Option(default, "int", doc, validate=_int_range(minimum, maximum), **kw)


def float_option(default: float, doc: str, low: float = 0.0, high: float = 1.0, **kw) -> Option:
    """A ``float`` option in ``[low, high]``."""
    def validate(name: str, value: float) -> float:
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low:g} and {high:g}, got {value!r}")
        return value
    return Option(default, "float", doc, validate=validate, **kw)


def str_option(default: str, doc: str, choices: tuple[str, ...] | None = None, **kw) -> Option:
    """A ``str`` option, one of ``choices`` when given."""
    def one_of(name: str, value: str) -> str:
        if value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            raise ValueError(f"{name} must be one of {shown}, got {value!r}")
        return value
    if choices:
        kw["validate"] = one_of
    return Option(default, "str", doc, **kw)


def _poplar_dict(name: str, value: dict) -> dict:
    """Poplar/PopLibs option dictionaries: option names and values are strings (TF-IPU puts
    them into string fields of its IpuOptions protobuf)."""
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{name}: Poplar options are strings, e.g. "
                            f"{{'availableMemoryProportion': '0.3'}}; got {type(k).__name__} "
                            f"{k!r}: {type(v).__name__} {v!r}")
    return dict(value)


def dict_option(doc: str, **kw) -> Option:
    """A ``dict`` of Poplar option strings (default ``{}``)."""
    return Option({}, "dict", doc, validate=_poplar_dict, **kw)


def enum_option(default: enum.Enum, doc: str, **kw) -> Option:
    """A member of ``type(default)``."""
    return Option(default, type(default).__name__, doc, **kw)


class AttributeMetadata:
    """What TF-IPU tells about one option or group (seed 004:1438-1473).

    Attributes (read-only properties): ``name`` (the full dotted name from the root),
    ``type`` (TF-IPU's type string; None for a group), ``default`` (None for a group),
    ``deprecated``, ``deprecated_msg``; ``__doc__`` is the option's docstring.
    """

    def __init__(self, name: str, doc: str, default: Any, attr_type: str | None,
                 deprecated_msg: str | None, check: Callable[[Any], bool]):
        self._name, self._default, self._type = name, default, attr_type
        self._deprecated_msg = deprecated_msg
        self._check = check
        self.__doc__ = doc

    @property
    def name(self) -> str:
        """The full name of the option/category, relative to the config's root."""
        return self._name

    @property
    def type(self) -> str | None:
        """The option's type as a string; None for a category."""
        return self._type

    @property
    def default(self) -> Any:
        """The option's default; None for a category."""
        return copy.copy(self._default)

    @property
    def deprecated(self) -> bool:
        return self._deprecated_msg is not None

    @property
    def deprecated_msg(self) -> str | None:
        return self._deprecated_msg

    def check_type(self, value: Any) -> bool:
        """True if ``value`` has this option's type.

        Raises:
            TypeError: it has not ("Trying to set NAME to VALUE, but it must be of type T").
        """
        if not self._check(value):
            raise TypeError(f"Trying to set {self._name} to {value!r}, but it must be of type "
                            f"{self._type}")
        return True

    def warn_if_deprecated(self) -> None:
        """Log a warning when this option is deprecated."""
        if self.deprecated:
            logger.warning("%s has been deprecated: %s", self._name, self._deprecated_msg)

    def __repr__(self) -> str:
        return f"AttributeMetadata({self._name!r}, type={self._type!r}, default={self._default!r})"


@dataclass
class _State:
    """Per-instance bookkeeping of a group (kept apart from the options)."""

    prefix: str = ""
    explicit: set = field(default_factory=set)


class ConfigGroup:
    """A node of the config tree: options (``_options``) and sub-groups (``_groups``).

    Subclasses declare ``_options: dict[str, Option]`` and ``_groups: dict[str, type]`` and a
    docstring; ``_secret`` names options whose value ``repr`` hides. Values are checked on
    assignment (module docstring).
    """

    _options: dict[str, Option] = {}
    _groups: dict[str, type] = {}
    _secret: frozenset[str] = frozenset()

    def __init__(self, _prefix: str = "") -> None:
        object.__setattr__(self, "_state", _State(_prefix))
        for name, opt in self._options.items():
            object.__setattr__(self, name, opt.fresh_default())
        for name, group in self._groups.items():
            object.__setattr__(self, name, group(self._full(name)))

    def _full(self, name: str) -> str:
        prefix = self._state.prefix
        return f"{prefix}.{name}" if prefix else name

    def _names(self) -> list[str]:
        return [*self._options, *self._groups]

    def _unknown(self, name: str) -> ConfigAttributeError:
        close = difflib.get_close_matches(name, self._names())
        hint = f" Did you mean '{self._full(close[0])}'?" if close else ""
        return ConfigAttributeError(
            f"'{name}' is not a valid attribute of this config.{hint} ({type(self).__name__} "
            f"has no option {name!r}; valid options: {', '.join(sorted(self._names()))})")

    def __getattr__(self, name: str) -> Any:  # only called when the attribute is missing
        if name.startswith("__") or name == "_state":
            raise AttributeError(name)
        raise self._unknown(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._groups:
            group = self._groups[name]
            if not isinstance(value, group):
                raise TypeError(
                    f"{type(self).__name__}.{name} is a group of options ({group.__name__}); "
                    f"it cannot be set to {type(value).__name__} {value!r} ({self._full(name)} "
                    "is a category and cannot be assigned to)")
            value = copy.deepcopy(value)
            value._rename(self._full(name))
            object.__setattr__(self, name, value)
            return
        opt = self._options.get(name)
        if opt is None:
            raise self._unknown(name)
        full = self._full(name)
        if opt.deprecated_msg:
            logger.warning("%s has been deprecated: %s", full, opt.deprecated_msg)
        if not opt.type_ok(value):
            detail = f"; {opt.explain(value)}" if opt.explain is not None else ""
            raise TypeError(f"Trying to set {full} to {value!r}, but it must be of type "
                            f"{opt.type}{detail}")
        if opt.validate is not None:
            value = opt.validate(full, value)
        object.__setattr__(self, name, value)
        self._state.explicit.add(name)

    def _rename(self, prefix: str) -> None:
        self._state.prefix = prefix
        for name in self._groups:
            getattr(self, name)._rename(self._full(name))

    def is_set(self, name: str) -> bool:
        """Whether option ``name`` of this group was assigned (not left at its default)."""
        return name in self._state.explicit

    def explicit_options(self) -> dict[str, Any]:
        """Every option assigned in this group and below: ``{full name: value}``, in
        declaration order (what the run report lists)."""
        out = {self._full(n): getattr(self, n) for n in self._options if self.is_set(n)}
        for name in self._groups:
            out.update(getattr(self, name).explicit_options())
        return out

    def get_attribute_metadata(self, attr: str) -> AttributeMetadata:
        """The :class:`AttributeMetadata` of ``attr``, a dotted name relative to this group
        (seed 004:1886-1896).

        Raises:
            ValueError: no such option ("Could not get attribute metadata for 'x': ...").
        """
        try:
            if not isinstance(attr, str) or not attr:
                raise ValueError(f"{attr!r} is not an option name")
            *path, last = attr.split(".")
            group = self
            for part in path:
                if part not in group._groups:
                    raise group._unknown(part)
                group = getattr(group, part)
            if last in group._groups:
                sub = group._groups[last]
                return AttributeMetadata(group._full(last), (sub.__doc__ or "").strip(), None,
                                         None, None, lambda v: isinstance(v, sub))
            opt = group._options.get(last)
            if opt is None:
                raise group._unknown(last)
            return AttributeMetadata(group._full(last), opt.doc, opt.default, opt.type,
                                     opt.deprecated_msg, opt.type_ok)
        except ValueError as exc:
            raise ValueError(f"Could not get attribute metadata for '{attr}': {exc}") from None

    def __deepcopy__(self, memo: dict) -> "ConfigGroup":
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            object.__setattr__(new, k, copy.deepcopy(v, memo))
        return new

    def same_options(self, other: "ConfigGroup") -> bool:
        """Whether ``other`` (a group of the same kind) holds the same values throughout."""
        return type(other) is type(self) and all(
            getattr(self, n).same_options(getattr(other, n)) if n in self._groups
            else getattr(self, n) == getattr(other, n) for n in self._names())

    def __repr__(self) -> str:
        def shown(k: str) -> str:
            if k in self._secret:
                return "'<set>'" if getattr(self, k) else "''"
            return repr(getattr(self, k))
        items = ", ".join(f"{k}={shown(k)}" for k in self._names())
        return f"{type(self).__name__}({items})"
