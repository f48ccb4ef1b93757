"""Object stores behind one small interface: a local folder (the default) and S3.

``base`` defines the interface (:class:`Store`) and what it raises, ``local`` and ``s3`` implement it, and
:func:`open_store` picks one from a URL. Importing this package imports no boto3 (``S3Store`` loads it when
it is created).
"""

from __future__ import annotations

import os
from typing import Any

from .base import ObjectInfo, Store
from .local import LocalStore
from .s3 import S3RequestError, S3Store

__all__ = ["Store", "ObjectInfo", "LocalStore", "S3Store", "S3RequestError", "open_store"]


def open_store(url: str | os.PathLike[str] | Store, **options: Any) -> Store:
    """Open a store from a URL: ``s3://bucket/prefix`` (options go to :class:`S3Store`), ``file:///path``
    or a plain path (a :class:`LocalStore`). A :class:`Store` instance is returned as is."""
    if isinstance(url, Store):
        return url
    s = os.fspath(url)
    if s.startswith("s3://"):
        return S3Store(s, **options)
    if options:
        raise TypeError(f"options {sorted(options)} only apply to s3:// stores")
    if s.startswith("file://"):
        s = s[len("file://") :]
    return LocalStore(s)
