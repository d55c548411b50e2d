"""One tiny name -> object registry used for tasks, objectives, likelihood estimators and credit modules.

Unknown and duplicate names raise errors that list the valid names, so a typo in a config is
reported with the alternatives instead of a bare ``KeyError``.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of objects of one kind (e.g. ``"task"``).

    Args:
        kind: what the entries are, used in error messages ("task", "objective", ...).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``.

        Raises:
            ValueError: if ``name`` is already registered.
        """

        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return deco

    def unregister(self, name: str) -> T:
        """Remove the entry called ``name`` and return it (e.g. to drop a plug-in's registrations, or
        to register a changed version under the same name).

        Raises:
            KeyError: naming the unknown entry and listing the valid ones.
        """
        entry = self.get(name)
        del self._entries[name]
        return entry

    def get(self, name: str) -> T:
        """Return the entry called ``name``.

        Raises:
            KeyError: naming the unknown entry and listing the valid ones.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(sorted(self._entries))}"
            ) from None

    def name_of(self, obj: object) -> str:
        """The name under which ``obj`` -- a registered entry, or an instance of a registered class --
        is registered.

        Raises:
            KeyError: if neither ``obj`` nor its type is registered.
        """
        for name, entry in self._entries.items():
            if entry is obj or (isinstance(entry, type) and type(obj) is entry):
                return name
        raise KeyError(f"{obj!r} is not a registered {self.kind}")

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
