"""The attribute store under every PopTorch options object (poptorch reference §2.1,
PT python/_options_impl.py): keys fixed at construction, type-checked setters, freezing.

* Setters store snake_case keys, read back as attributes (``opts.device_iterations``).
* Reading an unknown attribute: ``AttributeError("Invalid attribute <name>.")``.
* Assigning an unknown public attribute: ``AssertionError("Invalid option <name>, valid
  options are dict_keys([...])")``; a value of another type than the default's:
  ``AssertionError("Unexpected type <class 'float'> for option device_iterations. Expected
  <class 'int'>")`` (an ``isinstance`` check, so ``bool`` passes for ``int``).
* A private attribute not declared before ``_values``: ``AttributeError("Invalid private
  attribute ...")``.
* A frozen object (and its sub-objects) refuses every change with ``AttributeError("Can't
  modify frozen Options")``; ``copy.deepcopy`` gives an unfrozen copy.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["OptionsDict", "FROZEN_MESSAGE"]

FROZEN_MESSAGE = "Can't modify frozen Options"


class OptionsDict:
    """A dictionary of options whose keys are those given to the constructor.

    Subclasses set their private attributes before calling ``super().__init__`` (after it,
    only declared private attributes may be assigned).
    """

    def __init__(self, **default_values: Any) -> None:
        self._is_frozen = False
        self._values = dict(default_values)  # must stay the last attribute set here

    # -- the store --------------------------------------------------------------------
    def set(self, **kwargs: Any) -> None:
        """Set existing options, checking each value's type against the current value's."""
        self.checkIsFrozen()
        for option, value in kwargs.items():
            if option not in self._values:
                raise AssertionError(f"Invalid option {option}, valid options are "
                                     f"{self._values.keys()}")
            expected = type(self._values[option])
            if not isinstance(value, expected):
                raise AssertionError(f"Unexpected type {type(value)} for option {option}. "
                                     f"Expected {expected}")
            self._values[option] = value

    def createOrSet(self, **kwargs: Any) -> None:
        """Set options, creating those that do not exist yet."""
        self.checkIsFrozen()
        for option, value in kwargs.items():
            if option in self._values:
                self.set(**{option: value})
            else:
                self._values[option] = value

    def exists(self, option: str) -> bool:
        return option in self._values

    def deleteIfExists(self, option: str) -> None:
        self.checkIsFrozen()
        self._values.pop(option, None)

    def update(self, other: dict) -> dict:
        """``other`` with this object's options added (they must not overlap)."""
        if set(self._values).intersection(other):
            raise AssertionError("Can't merge dictionaries, they have some keys in common")
        other.update(self._values)
        return other

    def toDict(self) -> dict:
        """The options as a plain dictionary."""
        return self.update({})

    def __call__(self, option: str) -> Any:
        return getattr(self, option)

    # -- freezing ---------------------------------------------------------------------
    def _hasattr(self, option: str) -> bool:
        if option.startswith("_"):
            return option in self.__dict__
        return option in self.__dict__.get("_values", {})

    def _changeFreezeState(self, frozen: bool) -> None:
        object.__setattr__(self, "_is_frozen", frozen)
        for value in list(self.__dict__.values()):
            if isinstance(value, OptionsDict):
                value._changeFreezeState(frozen)
            elif hasattr(type(value), "_changeFreezeState"):
                value._changeFreezeState(frozen)

    def _freeze(self) -> None:
        self._changeFreezeState(True)

    def _unfreeze(self) -> None:
        self._changeFreezeState(False)

    def checkIsFrozen(self, option: str | None = None) -> None:
        """Raise ``AttributeError("Can't modify frozen Options")`` when frozen."""
        if self.__dict__.get("_is_frozen") and option != "_is_frozen":
            raise AttributeError(FROZEN_MESSAGE)

    # -- attribute access -------------------------------------------------------------
    def __setattr__(self, option: str, value: Any) -> None:
        self.checkIsFrozen(option)
        if option == "__class__":  # a wrapper's subclass (popdist.poptorch)
            object.__setattr__(self, option, value)
        elif option.startswith("_"):
            if "_values" in self.__dict__ and option not in self.__dict__:
                raise AttributeError(f"Invalid private attribute {option}. Valid attributes: "
                                     f"{list(self.__dict__)}")
            object.__setattr__(self, option, value)
        else:
            self.set(**{option: value})

    def __getattr__(self, option: str) -> Any:
        # only called when normal lookup fails: a stored option, or an error
        values = self.__dict__.get("_values")
        if values is not None and not option.startswith("_") and option in values:
            return values[option]
        raise AttributeError(f"Invalid attribute {option}.")

    def __deepcopy__(self, memo: dict) -> "OptionsDict":
        cls = type(self)
        copied = cls.__new__(cls)
        memo[id(self)] = copied
        for key, value in self.__dict__.items():
            object.__setattr__(copied, key,
                               False if key == "_is_frozen" else copy.deepcopy(value, memo))
        return copied

    def __getstate__(self) -> dict:
        return self.__dict__

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"{type(self).__name__}({shown})"
