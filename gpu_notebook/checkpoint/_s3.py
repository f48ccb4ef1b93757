"""S3 (and S3-compatible: MinIO, R2, ...) store through boto3.

* credentials come from boto3's usual chain (env, profile, instance role); they are never printed or stored
* create-only writes use ``If-None-Match: *`` where the service supports it (AWS, MinIO, R2, moto); where it
  answers "not implemented", the store falls back to HEAD-then-PUT (safe for content-addressed objects,
  whose bytes are identical whoever writes them; manifests carry a random token in their key)
* objects above ``multipart_threshold_mb`` are uploaded in parts, ``max_concurrency`` parts at a time
* every request is retried with exponential backoff and jitter on connection errors, throttling and 5xx;
  after the last attempt a :class:`StoreError` names the operation, bucket and key
* ``checksum="when_required"`` (default) keeps boto3 >= 1.36 from sending the new default checksums that
  several S3-compatible services reject; pass ``"when_supported"`` on AWS if you want them
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ._errors import ObjectMissingError, StoreError
from ._store import ObjectInfo, Store

__all__ = ["S3Store"]

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
        self._conditional: bool | None = None  # None = unknown, detected on first create-only write
        self._lock = threading.Lock()
        if client is None:
            import boto3
            from botocore.config import Config

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

    @staticmethod
    def _code(e: BaseException) -> tuple[str, int]:
        resp = getattr(e, "response", None) or {}
        err = resp.get("Error", {})
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return str(err.get("Code", "")), int(status or 0)

    def _retryable(self, e: BaseException) -> bool:
        from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

        if isinstance(e, ConnectionError | HTTPClientError):
            return True
        if isinstance(e, ClientError):
            code, status = self._code(e)
            return code in _RETRY_CODES or status >= 500 and code != "NotImplemented"
        return False

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except Exception as e:  # noqa: BLE001
                if not self._retryable(e) or attempt == self.retries:
                    if self._retryable(e):
                        raise StoreError(
                            f"S3 {what} of s3://{self.bucket}/{self._k(key)} failed after {attempt + 1} attempts"
                            f"{' at ' + self.endpoint_url if self.endpoint_url else ''}: {e}"
                        ) from e
                    raise
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------ Store API
    def check(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        where = f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")
        try:
            self._call("head_bucket", "", lambda: self.client.head_bucket(Bucket=self.bucket))
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        except NoCredentialsError as e:
            raise StoreError(
                f"no AWS credentials found for {where} (configure the usual boto3 credential chain)"
            ) from e
        except ClientError as e:
            code, status = self._code(e)
            if status == 404 or code in ("NoSuchBucket", "404", "NotFound"):
                raise StoreError(f"bucket {self.bucket!r} does not exist ({where})") from None
            if status == 403 or code in (
                "AccessDenied",
                "403",
                "Forbidden",
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
            ):
                raise StoreError(
                    f"access denied to {where} ({code or status}); check the credentials and the bucket policy"
                ) from None
            raise StoreError(f"cannot use {where}: {code or status}: {e}") from e
        except StoreError:
            raise
        except BotoCoreError as e:
            raise StoreError(f"cannot reach {where}: {e}") from e

    def _put_plain(self, key: str, data: bytes | memoryview) -> None:
        body = bytes(data)
        self._call(
            "put", key, lambda: self.client.put_object(Bucket=self.bucket, Key=self._k(key), Body=body)
        )

    def put(self, key: str, data: bytes | memoryview, create_only: bool = True) -> bool:
        from botocore.exceptions import ClientError

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
            except ClientError as e:
                code, status = self._code(e)
                if status == 412 or code == "PreconditionFailed":
                    self._conditional = True
                    return False
                if status == 501 or code in ("NotImplemented", "InvalidArgument"):
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
        from botocore.exceptions import ClientError

        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._k(key)}
        if rng:
            kwargs["Range"] = rng
        try:
            resp = self._call("get", key, lambda: self.client.get_object(**kwargs))
            return self._call("read", key, lambda: resp["Body"].read())
        except ClientError as e:
            code, status = self._code(e)
            if status == 404 or code in ("NoSuchKey", "404"):
                raise ObjectMissingError(key) from None
            raise

    def get(self, key: str) -> bytes:
        return self._get(key, None)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return self._get(key, f"bytes={offset}-{offset + length - 1}")

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._call("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=self._k(key)))
            return True
        except ClientError as e:
            code, status = self._code(e)
            if status == 404 or code in ("NoSuchKey", "404", "NotFound"):
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
