"""botocore's data files (service models, endpoints), read once per process (``moto_account.share_sdk_data``).

Its own module because it subclasses botocore's loader: importing it imports botocore, which only
the tests that make AWS clients need (a worker collecting the suite does not).
"""

from __future__ import annotations

import os
import types
import weakref
from typing import Any, ClassVar

import botocore.endpoint_provider
import botocore.hooks
import botocore.loaders
import botocore.regions


class _SharedDataLoader(botocore.loaders.Loader):
    """botocore's loader of its data files (service models, endpoints, partitions), with one cache
    per search path for the whole process instead of one per session.

    mock_aws replaces boto3's default session for every test, and each new session's first client
    re-reads and re-parses endpoints.json and the service's model (~100 ms of CPU a client, most of
    a small moto test). The files are the installed SDK's and never change while the tests run, and
    botocore already shares the parsed data between all the clients of one session (nothing mutates
    it), so sharing it between sessions changes no behaviour. Only the files are shared: every
    session keeps its own credentials, configuration, event handlers and clients.
    """

    _caches: ClassVar[dict[tuple[str, ...], dict[Any, Any]]] = {}

    @property
    def _cache(self) -> dict[Any, Any]:
        # Keyed by the search path at lookup time: boto3 appends its own data directory to a
        # session's loader after creating it, and a different path may find different files.
        return self._caches.setdefault(tuple(self.search_paths), {})

    @_cache.setter
    def _cache(self, _value: dict[Any, Any]) -> None:
        """``Loader.__init__`` assigns a fresh dict; every instance reads the shared one instead."""


def create_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
    """``botocore.loaders.create_loader`` (the same search path rules) making a :class:`_SharedDataLoader`."""
    if search_path_string is None:
        return _SharedDataLoader()
    paths = [os.path.expanduser(os.path.expandvars(p)) for p in search_path_string.split(os.pathsep)]
    return _SharedDataLoader(extra_search_paths=paths)


# -- registering a session's event handlers ----------------------------------------------------------
# Every new botocore session registers its ~130 built-in handlers, and each client a few more. Two
# steps of each registration are pure functions recomputed every time (botocore 1.44.8,
# botocore/hooks.py): the check that the handler accepts **kwargs (``inspect.getfullargspec``), and
# the event name's aliases (``EventAliaser._alias_event_name``, cached only per session). Together
# they were ~80% of a session's creation (~15 ms of CPU; mock_aws and the IAM harness make one a
# test) and a third of a client's. Both are shared here for the process, and so is each service's
# parsed endpoint rule set (_SharedRulesProvider).

_ACCEPTS_KWARGS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_ALIASED: dict[str, str] = {}


def _accepts_kwargs(func: Any) -> bool:
    """``botocore.compat.accepts_kwargs``, remembered per plain function or method's function (a
    signature does not change; weakly held, so a session's closures die with it)."""
    target = getattr(func, "__func__", func)
    if not isinstance(target, types.FunctionType):  # a partial, a callable object: not remembered
        return bool(_original_accepts_kwargs(func))
    try:
        return _ACCEPTS_KWARGS[target]
    except KeyError:
        found = _ACCEPTS_KWARGS[target] = bool(_original_accepts_kwargs(func))
        return found


def _alias_event_name(self: Any, event_name: str) -> str:
    """``EventAliaser._alias_event_name`` for botocore's own aliases, remembered for the process
    (the same name always aliases to the same name); other aliases as botocore does it."""
    if self._event_aliases is not botocore.hooks.EVENT_ALIASES:
        return str(_original_alias_event_name(self, event_name))
    try:
        return _ALIASED[event_name]
    except KeyError:
        aliased = _ALIASED[event_name] = _original_alias_event_name(self, event_name)
        return str(aliased)


_original_accepts_kwargs = botocore.hooks.accepts_kwargs
_original_alias_event_name = botocore.hooks.EventAliaser._alias_event_name


class _SharedRulesProvider(botocore.endpoint_provider.EndpointProvider):
    """botocore's endpoint provider with one parsed rule set per service for the process.

    Every client parses its service's endpoint rule set into rule objects (``RuleSet``; about a
    quarter of a client's creation, ~3 ms of CPU) from data that :class:`_SharedDataLoader` already
    shares. The rule objects are only read while resolving (``evaluate`` copies the parameters it
    is given; botocore 1.44.8, botocore/endpoint_provider.py), and each provider keeps its own
    resolution cache and excluded parameters."""

    _rule_sets: ClassVar[dict[tuple[int, int], tuple[Any, Any, Any]]] = {}

    def __init__(self, ruleset_data: Any, partition_data: Any, excluded_params: Any = None) -> None:
        key = (id(ruleset_data), id(partition_data))
        kept = self._rule_sets.get(key)
        # The data is kept with its rule set: the ids stay those objects' while the entry lives.
        if kept is None or kept[0] is not ruleset_data or kept[1] is not partition_data:
            rule_set = botocore.endpoint_provider.RuleSet(**ruleset_data, partitions=partition_data)
            kept = self._rule_sets[key] = (ruleset_data, partition_data, rule_set)
        self.ruleset = kept[2]
        self._excluded_params = excluded_params or frozenset()


def share_handler_checks() -> None:
    """Install :func:`_accepts_kwargs`, :func:`_alias_event_name` and
    :class:`_SharedRulesProvider` into botocore. Idempotent."""
    botocore.hooks.accepts_kwargs = _accepts_kwargs
    botocore.hooks.EventAliaser._alias_event_name = _alias_event_name  # type: ignore[method-assign]
    botocore.regions.EndpointProvider = _SharedRulesProvider  # type: ignore[misc]
