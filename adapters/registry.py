"""The one registry of adapters. Adapter modules register themselves with @register_adapter."""

from __future__ import annotations

from adapters.base import Adapter
from adapters.errors import UnknownAdapterError

_REGISTRY: dict[str, Adapter] = {}


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: instantiate and register. Names must be unique and gaps declared."""
    adapter = cls()
    if not adapter.name or not adapter.gap or not adapter.applies_to:
        raise TypeError(f"{cls.__name__}: an adapter must declare name, gap and applies_to")
    if adapter.name in _REGISTRY and type(_REGISTRY[adapter.name]) is not cls:
        raise ValueError(
            f"adapter name {adapter.name!r} is already registered by {type(_REGISTRY[adapter.name])}"
        )
    _REGISTRY[adapter.name] = adapter
    return cls


def all_adapters() -> list[Adapter]:
    """Every registered adapter, in application order."""
    return sorted(_REGISTRY.values(), key=lambda a: (a.order, a.name))


def get_adapter(name: str) -> Adapter:
    if name not in _REGISTRY:
        raise UnknownAdapterError([name], sorted(_REGISTRY))
    return _REGISTRY[name]


def select(only=None, exclude=None) -> list[Adapter]:
    """Registered adapters filtered by name; unknown names are an error, not silently ignored."""
    only = [only] if isinstance(only, str) else only
    exclude = [exclude] if isinstance(exclude, str) else exclude
    unknown = [n for n in (only or []) + (exclude or []) if n not in _REGISTRY]
    if unknown:
        raise UnknownAdapterError(unknown, sorted(_REGISTRY))
    chosen = all_adapters()
    if only is not None:
        chosen = [a for a in chosen if a.name in set(only)]
    if exclude:
        chosen = [a for a in chosen if a.name not in set(exclude)]
    return chosen
