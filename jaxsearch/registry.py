"""A small name -> entry registry, for the things configs pick by name (protocols, rewards, advantage
estimators, policy losses).

    PROTOCOLS = Registry("protocol")

    @PROTOCOLS.register("search_r1")
    class SearchR1(AgentProtocol): ...

    PROTOCOLS.get("search_r1")      # the entry; an unknown name raises, naming the kind and the known names
    PROTOCOLS.names()               # sorted names; `name in PROTOCOLS`, iteration and `PROTOCOLS[name]` work too
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, Mapping, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError, KeyError):
    """A name no entry is registered under: a ValueError (what `get` has always raised) and a KeyError
    (what `registry[name]` raises, as for a mapping)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Entries of one `kind` by name. Each name registers once; `get` of an unknown name raises
    `UnknownNameError` naming the kind, the name and the known names."""

    def __init__(self, kind: str, entries: Mapping[str, T] | None = None):
        self.kind = kind
        self._entries: dict[str, T] = {}
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    def add(self, name: str, entry: T) -> T:
        """Register `entry` under `name` (a ValueError if the name is taken); returns the entry."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated function or class under `name`."""
        return lambda entry: self.add(name, entry)

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {self.names()}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    __getitem__ = get

    def __delitem__(self, name: str) -> None:  # tests unregister what they registered
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
