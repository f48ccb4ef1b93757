"""S3 (and S3-compatible: MinIO, R2, ...) store through boto3.

* credentials come from boto3's usual chain (env, profile, instance role); they are never printed or stored
* create-only writes use ``If-None-Match: *`` where the service supports it (AWS, MinIO, R2, moto); where it
  answers "not implemented", the store falls back to HEAD-then-PUT (safe for content-addressed objects,
  whose bytes are identical whoever writes them; manifests carry a random token in their key)
* objects above ``multipart_threshold_mb`` are uploaded in parts, ``max_concurrency`` parts at a time
* every request is retried with exponential backoff and jitter on connection errors, throttling and 5xx;
  after the last attempt a :class:`StoreError` names the operation, bucket and key; a GET and the read of
  its whole body are one attempt (a dropped or short body re-issues the GET)
* every public method raises only :class:`StoreError` (or :class:`ObjectMissingError` for a missing key),
  never a raw botocore error; the message names the operation, the ``s3://`` URL, the endpoint and the S3
  error code, and never the credentials
* ``checksum="when_required"`` (default) keeps boto3 >= 1.36 from sending the new default checksums that
  several S3-compatible services reject; pass ``"when_supported"`` on AWS if you want them
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .._errors import ObjectMissingError, StoreError
from .base import ObjectInfo, Store

__all__ = ["S3Store", "S3RequestError"]

T = TypeVar("T")

_RETRY_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "ConditionalRequestConflict",
    "OperationAborted",
}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_DENIED_CODES = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "AccountProblem"}
_CRED_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "InvalidClientTokenId",
}
_VERBS = {
    "put": "writing",
    "create_multipart_upload": "writing",
    "upload_part": "writing",
    "complete_multipart_upload": "writing",
    "get": "reading",
    "head": "checking",
    "list": "listing",
    "delete": "deleting",
    "head_bucket": "checking",
}
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[A-Z0-9]{12,}\b")


class S3RequestError(StoreError):
    """An S3 request failed for good; ``code`` is the S3 error code (``""`` for a connection error), ``status``
    the HTTP status (0 when there was no response), ``operation`` what the store was doing and ``attempts``
    how many attempts a transient error outlasted (0: not a transient error)."""

    def __init__(
        self, message: str, *, operation: str, code: str = "", status: int = 0, attempts: int = 0
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.code = code
        self.status = status
        self.attempts = attempts  # > 0: a transient error that outlasted this many attempts


class _ShortBody(Exception):
    """A GET's body ended before its Content-Length (retried like a dropped connection)."""


def _parse(url: str) -> tuple[str, str]:
    rest = url[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"bad S3 URL {url!r}: expected s3://bucket/prefix")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/") if prefix else ""


class S3Store(Store):
    """A prefix in an S3 bucket.

    Parameters
    ----------
    url
        ``s3://bucket/prefix``.
    endpoint_url
        For S3-compatible services (MinIO, a local test server).
    region_name
        AWS region (default: boto3's configuration).
    max_concurrency
        Parallel multipart parts per object.
    multipart_threshold_mb, part_size_mb
        Objects larger than the threshold are uploaded as multipart uploads with parts of this size (>= 5).
    retries, backoff_s
        Attempts per request after the first, and the base of the exponential backoff.
    checksum
        boto3 ``request_checksum_calculation``: ``"when_required"`` (default) or ``"when_supported"``.
    client
        A ready boto3 S3 client (overrides the options above).
    sleep
        How the backoff between retries waits (``time.sleep``; a test records the delays instead).
    """

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        max_concurrency: int = 8,
        multipart_threshold_mb: float = 64.0,
        part_size_mb: float = 16.0,
        retries: int = 5,
        backoff_s: float = 0.25,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        checksum: str = "when_required",
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        **client_kwargs: Any,
    ) -> None:
        self.bucket, self.prefix = _parse(url)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.endpoint_url = endpoint_url
        self.max_concurrency = max(1, int(max_concurrency))
        self.multipart_threshold = int(multipart_threshold_mb * 2**20)
        self.part_size = max(5 * 2**20, int(part_size_mb * 2**20))
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self._sleep = sleep
        self._conditional: bool | None = None  # None = unknown, detected on first create-only write
        self._lock = threading.Lock()
        # explicit credentials, only so that error messages can be scrubbed of them (never printed or stored)
        self._secrets = tuple(
            str(v)
            for k in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
            if len(str(v := client_kwargs.get(k) or "")) >= 8
        )
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError as e:
                raise ImportError(
                    f"S3 stores ({self.url}) need boto3, which is not installed: pip install boto3 "
                    '(or pip install "gpu_notebook[aws]")',
                    name="boto3",
                ) from e

            cfg_kwargs: dict[str, Any] = {
                "retries": {"max_attempts": 2, "mode": "standard"},
                "connect_timeout": connect_timeout_s,
                "read_timeout": read_timeout_s,
                "max_pool_connections": max(10, 2 * self.max_concurrency),
            }
            try:
                cfg = Config(
                    request_checksum_calculation=checksum,
                    response_checksum_validation="when_required",
                    **cfg_kwargs,
                )
            except TypeError:  # botocore < 1.36
                cfg = Config(**cfg_kwargs)
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region_name, config=cfg, **client_kwargs
            )
        self.client = client

    def __repr__(self) -> str:
        ep = f", endpoint_url={self.endpoint_url!r}" if self.endpoint_url else ""
        return f"S3Store({self.url!r}{ep})"

    # ------------------------------------------------------------ helpers
    def _k(self, key: str) -> str:
        return self.prefix + key

    def _url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._k(key)}"

    @staticmethod
    def _code(e: BaseException) -> tuple[str, int]:
        resp = getattr(e, "response", None) or {}
        err = resp.get("Error", {})
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return str(err.get("Code", "")), int(status or 0)

    def _redact(self, text: str) -> str:
        """``text`` without anything that looks like an AWS key id or equals a configured credential."""
        text = _AWS_KEY_ID.sub("<key id>", text)
        for v in self._secrets:
            text = text.replace(v, "<redacted>")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            v = os.environ.get(name, "")
            if len(v) >= 8:
                text = text.replace(v, "<redacted>")
        return text

    def _retryable(self, e: BaseException) -> bool:
        from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, IncompleteReadError

        if isinstance(e, _ShortBody | ConnectionError | HTTPClientError | IncompleteReadError):
            return True
        if isinstance(e, ClientError):
            code, status = self._code(e)
            return code in _RETRY_CODES or status >= 500 and code != "NotImplemented"
        from urllib3.exceptions import HTTPError as Urllib3Error  # a dependency of botocore

        return isinstance(e, Urllib3Error | OSError)  # a socket error while reading a body

    def _error(self, what: str, key: str, e: Exception, attempts: int) -> S3RequestError | None:
        """The :class:`S3RequestError` for ``e`` (``attempts`` > 0: a transient error that outlasted the
        retries), or None when ``e`` is no S3/transport error (a bug: it propagates as is)."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        op = what.split()[0]
        verb = _VERBS.get(op, op)
        url = self._url(key)
        at = f" at {self.endpoint_url}" if self.endpoint_url else ""
        code, status = self._code(e) if isinstance(e, ClientError) else ("", 0)
        label = code or (str(status) if status else "")
        if isinstance(e, ClientError):
            detail = str(getattr(e, "response", {}).get("Error", {}).get("Message", "") or e)
        else:
            detail = str(e)
        detail = self._redact(detail)[:300]
        if attempts:
            label = label or type(e).__name__.lstrip("_")
            msg = f"S3 {what} of {url} failed after {attempts} attempts{at} ({label}): {detail}"
        elif isinstance(e, ClientError):
            if code == "NoSuchBucket":
                msg = (
                    f"bucket {self.bucket!r} does not exist ({verb} {url}{at}, NoSuchBucket): "
                    "check the bucket name, the endpoint and the region"
                )
            elif code in _CRED_CODES:
                msg = (
                    f"access denied {verb} {url}{at} ({code}): the credentials were rejected; check the access "
                    "key, secret and session token (or the profile or instance role boto3 uses)"
                )
            elif code in _DENIED_CODES or status == 403:
                hint = (
                    "the credentials may be read-only; check them and the bucket policy"
                    if verb in ("writing", "deleting")
                    else "check the credentials and the bucket policy"
                )
                msg = f"access denied {verb} {url}{at} ({label}): {hint}"
            elif status == 404 or code in _MISSING_CODES:
                msg = f"object missing {verb} {url}{at} ({label})"
            elif status == 412 or code == "PreconditionFailed":
                msg = f"{verb} {url}{at} refused: the object already exists ({label})"
            elif status == 501 or code == "NotImplemented":
                msg = f"the S3 service{at} does not implement {what} ({verb} {url}, {label}): {detail}"
            else:
                msg = f"S3 {what} of {url}{at} failed ({label}): {detail}"
        elif isinstance(e, NoCredentialsError | PartialCredentialsError):
            msg = (
                f"no usable AWS credentials {verb} {url}{at} ({type(e).__name__}): configure the usual boto3 "
                "credential chain (environment, profile, instance role)"
            )
        elif isinstance(e, BotoCoreError):
            msg = f"S3 {what} of {url}{at} failed ({type(e).__name__}): {detail}"
        else:
            return None
        return S3RequestError(msg, operation=what, code=code, status=status, attempts=attempts)

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried with exponential backoff and jitter on transient errors; any S3 or connection
        error that remains is raised as an :class:`S3RequestError` (with the S3 ``code`` and HTTP ``status``)."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - classified just below: retried or re-raised
                retryable = self._retryable(e)
                if retryable and attempt < self.retries:
                    self._sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 10.0)
                    continue
                err = self._error(what, key, e, attempt + 1 if retryable else 0)
                if err is None:
                    raise
                raise err from e
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------ Store API
    def check(self, write: bool = True) -> None:  # (reads only, either way)
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError

        where = f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")
        try:
            self._call("head_bucket", "", lambda: self.client.head_bucket(Bucket=self.bucket))
            self._call(
                "list",
                "",
                lambda: self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1),
            )
        except S3RequestError as e:
            if e.attempts:
                raise
            if isinstance(e.__cause__, NoCredentialsError | PartialCredentialsError):
                raise StoreError(
                    f"no AWS credentials found for {where} (configure the usual boto3 credential chain)"
                ) from e.__cause__
            if e.status == 404 or e.code in ("NoSuchBucket", "404", "NotFound"):
                raise StoreError(f"bucket {self.bucket!r} does not exist ({where})") from None
            if e.status == 403 or e.code in _DENIED_CODES | _CRED_CODES:
                raise StoreError(
                    f"access denied to {where} ({e.code or e.status}); check the credentials and the bucket policy"
                ) from None
            raise

    def _put_plain(self, key: str, data: bytes | memoryview) -> None:
        body = bytes(data)
        self._call(
            "put", key, lambda: self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=body)
        )

    def put(self, key: str, data: bytes | memoryview, create_only: bool = True) -> bool:
        n = len(data)
        if n > self.multipart_threshold:
            if create_only and self.exists(key):
                return False
            self._put_multipart(key, data)
            return True
        if not create_only:
            self._put_plain(key, data)
            return True
        if self._conditional is not False:
            body = bytes(data)
            try:
                self._call(
                    "put",
                    key,
                    lambda: self.client.put_object(
                        Bucket=self.bucket, Key=self._k(key), Body=body, IfNoneMatch="*"
                    ),
                )
                self._conditional = True
                return True
            except S3RequestError as e:
                if e.attempts:
                    raise
                if e.status == 412 or e.code == "PreconditionFailed":
                    self._conditional = True
                    return False
                if e.status == 501 or e.code in ("NotImplemented", "InvalidArgument"):
                    self._conditional = False  # fall through to HEAD + PUT
                else:
                    raise
        if self.exists(key):
            return False
        self._put_plain(key, data)
        return True

    def _put_multipart(self, key: str, data: bytes | memoryview) -> None:
        mv = memoryview(data)
        k = self._k(key)
        up = self._call(
            "create_multipart_upload",
            key,
            lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=k),
        )
        upload_id = up["UploadId"]
        ranges = [
            (i + 1, o, min(self.part_size, len(mv) - o))
            for i, o in enumerate(range(0, len(mv), self.part_size))
        ]

        def part(r: tuple[int, int, int]) -> dict[str, Any]:
            num, off, ln = r
            body = bytes(mv[off : off + ln])
            resp = self._call(
                f"upload_part {num}",
                key,
                lambda: self.client.upload_part(
                    Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=num, Body=body
                ),
            )
            return {"PartNumber": num, "ETag": resp["ETag"]}

        try:
            with cf.ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(ranges))) as ex:
                parts = list(ex.map(part, ranges))
            self._call(
                "complete_multipart_upload",
                key,
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=k, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
            except Exception:  # noqa: BLE001 - the endpoint may be down; a lifecycle rule cleans up
                pass
            raise

    def _get(self, key: str, rng: str | None) -> bytes:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._k(key)}
        if rng:
            kwargs["Range"] = rng

        def once() -> bytes:  # the GET and the read of its whole body: one attempt
            resp = self.client.get_object(**kwargs)
            body = resp["Body"]
            try:
                data = body.read()
            finally:
                body.close()
            expected = resp.get("ContentLength")
            if expected is not None and len(data) != int(expected):
                raise _ShortBody(f"the body ended after {len(data)} of {int(expected)} bytes")
            return bytes(data)

        try:
            return self._call("get", key, once)
        except S3RequestError as e:
            if not e.attempts and e.code != "NoSuchBucket" and (e.status == 404 or e.code in _MISSING_CODES):
                raise ObjectMissingError(key) from None
            raise

    def get(self, key: str) -> bytes:
        return self._get(key, None)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return self._get(key, f"bytes={offset}-{offset + length - 1}")

    def exists(self, key: str) -> bool:
        try:
            self._call("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=self._k(key)))
            return True
        except S3RequestError as e:
            if not e.attempts and (e.status == 404 or e.code in _MISSING_CODES):
                return False
            raise

    def list(self, prefix: str) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        token: str | None = None
        full = self._k(prefix)
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call("list", prefix, lambda kw=kwargs: self.client.list_objects_v2(**kw))  # type: ignore[misc]
            for o in resp.get("Contents", []):
                out.append(
                    ObjectInfo(o["Key"][len(self.prefix) :], int(o["Size"]), o["LastModified"].timestamp())
                )
            if not resp.get("IsTruncated"):
                break
            token = resp.get("NextContinuationToken")
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=self._k(key)))

    def touch(self, key: str) -> None:
        # S3 has no "touch": a copy of the object onto itself with its metadata replaced sets LastModified
        k = self._k(key)
        try:
            self._call(
                "touch",
                key,
                lambda: self.client.copy_object(
                    Bucket=self.bucket,
                    Key=k,
                    CopySource={"Bucket": self.bucket, "Key": k},
                    MetadataDirective="REPLACE",
                ),
            )
        except S3RequestError as e:
            if e.attempts or not (e.status == 404 or e.code in _MISSING_CODES):
                raise  # (gone: nothing to protect)
