"""botocore's data files (service models, endpoints), read once per process (``moto_account.share_sdk_data``).

Its own module because it subclasses botocore's loader: importing it imports botocore, which only
the tests that make AWS clients need (a worker collecting the suite does not).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import botocore.loaders


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
