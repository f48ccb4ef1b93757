"""What the rank workers start with: a working dir, pip packages and environment variables (``--working-dir``,
``--pip``, ``--env``, ``--env-file`` of ``%gpu_cluster start``), fixed when the workers start.

The working dir and the pip packages go to Ray's ``runtime_env`` of each rank actor: Ray packs the directory,
uploads it to the cluster once, and starts each worker in its copy of it (with it on ``sys.path``); pip packages
are installed into a virtualenv on each node. The variables' values do not go to the ``runtime_env``: Ray writes
a ``runtime_env`` into its logs and shows it in its state API and dashboard. They travel as an argument of the
worker actor instead, which sets them before any user code runs, and they are never shown: not in progress
lines, a repr, an error or ``%gpu_cluster env`` (see :mod:`gpu_notebook.distributed._settings`). ``--env KEY``
takes the value from the notebook kernel's environment, so a secret is not typed into the saved notebook.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook._display import Progress, format_ranks, rank_label
from gpu_notebook.distributed import MASK, RANK_VARIABLES, rank_settings
from gpu_notebook.errors import GpuNotebookError

__all__ = [
    "EnvReport",
    "WorkerSetup",
    "WorkerSetupError",
    "parse_env_file",
    "prepare_for_workers",
    "rank_env",
    "worker_setup",
]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: Set on every rank by the worker group, as torchrun sets them: a value given for the workers would be overwritten.
RESERVED = RANK_VARIABLES


class WorkerSetupError(GpuNotebookError, ValueError):
    """A working dir, package or variable for the workers is wrong (the message never shows a value)."""


@dataclass(frozen=True)
class WorkerSetup:
    """The workers' working dir, pip packages and environment variables; fixed when the workers start.

    Its repr names the variables, never their values.
    """

    working_dir: str | None = None  # an absolute directory in the notebook's filesystem
    pip: tuple[str, ...] = ()  # requirement strings (or paths of local wheels) for pip
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)  # name -> value (secret)

    @property
    def names(self) -> tuple[str, ...]:
        """The variables' names, in the order given."""
        return tuple(self.env)

    def __bool__(self) -> bool:
        return bool(self.working_dir or self.pip or self.env)

    def __repr__(self) -> str:
        parts = []
        if self.working_dir:
            parts.append(f"working_dir={self.working_dir!r}")
        if self.pip:
            parts.append(f"pip={list(self.pip)!r}")
        if self.env:
            parts.append(f"env=[{', '.join(self.names)}] (values hidden)")
        return f"WorkerSetup({', '.join(parts)})"

    def runtime_env(self) -> dict[str, Any]:
        """The part of Ray's ``runtime_env`` this setup makes (local paths, not yet uploaded; no variables)."""
        env: dict[str, Any] = {}
        if self.working_dir:
            env["working_dir"] = self.working_dir
        if self.pip:
            env["pip"] = list(self.pip)
        return env

    def describe(self) -> str:
        """One progress line: what the workers get (variable names only)."""
        parts = []
        if self.working_dir:
            parts.append(f"working dir {self.working_dir}")
        if self.pip:
            parts.append(f"pip install {' '.join(self.pip)}")
        if self.env:
            parts.append(f"variables {', '.join(self.names)} (values not shown)")
        return "workers get: " + "; ".join(parts)


def _check_name(name: str, where: str) -> None:
    if not _NAME.match(name):
        raise WorkerSetupError(
            f"{where}: {name!r} is not a valid variable name (letters, digits and _, not starting with a digit)"
        )
    if name in RESERVED:
        raise WorkerSetupError(
            f"{where}: {name} is set on every rank by gpu_notebook, as torchrun sets it; it cannot be given"
        )


def _unquote(value: str, where: str) -> str:
    """A dotenv value: 'single' quotes kept literal, "double" quotes with \\n \\" \\\\ escapes, else unquoted."""
    if value[:1] in ("'", '"'):
        quote = value[0]
        end = value.find(quote, 1)
        if quote == '"':
            end = 1
            while end < len(value) and value[end] != '"':
                end += 2 if value[end] == "\\" else 1
        if end >= len(value) or end < 1 or value[end] != quote:
            raise WorkerSetupError(f"{where}: the value's {quote} quote is not closed")
        rest = value[end + 1 :].strip()
        if rest and not rest.startswith("#"):
            raise WorkerSetupError(f"{where}: unexpected text after the quoted value")
        inner = value[1:end]
        if quote == '"':
            inner = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), inner)
        return inner
    return re.split(r"\s+#", value, maxsplit=1)[0].strip()


def parse_env_file(path: str) -> dict[str, str]:
    """The variables of a dotenv file: ``KEY=VALUE`` lines (``export`` allowed), ``#`` comments, blank lines,
    values optionally quoted.

    Raises
    ------
    WorkerSetupError
        The file cannot be read, or a line is not ``KEY=VALUE`` (the error gives its number, not its text).
    """
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkerSetupError(
            f"--env-file {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    out: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"--env-file {path} line {number}"
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep:  # the line itself is not shown: it may be a bare token
            raise WorkerSetupError(f"{where}: expected KEY=VALUE")
        _check_name(name, where)
        out[name] = _unquote(value.strip(), where)
    return out


def worker_setup(
    working_dir: str | None = None,
    pip: Iterable[str] = (),
    env: Iterable[str] = (),
    env_files: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> WorkerSetup:
    """A checked :class:`WorkerSetup` from ``%gpu_cluster start``'s options.

    ``env`` items are ``KEY=VALUE`` or ``KEY`` (the value of ``KEY`` in ``environ``, default this process's
    environment: the kernel's); ``env_files`` are read first, so an ``env`` item overrides a file's value.

    Raises
    ------
    WorkerSetupError
        Not a directory, a bad name, a ``KEY`` not set in the kernel, an unreadable or malformed env file.
    """
    environ = os.environ if environ is None else environ
    wd = None
    if working_dir:
        wd = os.path.abspath(os.path.expanduser(working_dir))
        if not os.path.isdir(wd):
            raise WorkerSetupError(f"--working-dir {working_dir}: no such directory")
    packages = tuple(p for p in pip)
    if any(not p.strip() for p in packages):
        raise WorkerSetupError("--pip: an empty package name")
    values: dict[str, str] = {}
    for path in env_files:
        values.update(parse_env_file(path))
    for item in env:
        name, sep, value = item.partition("=")
        name = name.strip()
        _check_name(name, f"--env {name}")
        if not sep:
            if name not in environ:
                raise WorkerSetupError(
                    f"--env {name}: not set in the kernel's environment (set it there first, or give {name}=VALUE)"
                )
            value = environ[name]
        values[name] = value
    return WorkerSetup(working_dir=wd, pip=packages, env=values)


# ---- at start: what the worker actors get ------------------------------------------------------------------
def _upload(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with its local ``working_dir`` and ``py_modules`` uploaded to the cluster (as URIs).

    Ray takes local paths only in ``ray.init``'s job-wide ``runtime_env``; an actor's needs URIs. Ray's own
    upload (what ``ray.init`` does, through Ray Client too) packs a directory once per content.
    """
    import tempfile

    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    env = dict(runtime_env)
    with tempfile.TemporaryDirectory(prefix="gnb-runtime-env-") as scratch:
        for upload in (upload_py_modules_if_needed, upload_working_dir_if_needed):
            kwargs: dict[str, Any] = {"scratch_dir": scratch}
            if "include_gitignore" in inspect.signature(upload).parameters:  # Ray >= 2.50
                kwargs["include_gitignore"] = True
            env = upload(env, **kwargs)
    env.pop("excludes", None)
    return env


def _through_ray_client() -> bool:
    """Whether this kernel reaches Ray through Ray Client (a ``ray://`` address)."""
    import ray

    try:
        return bool(ray.util.client.ray.is_connected())
    except AttributeError:  # a Ray without the client module: no client connection either
        return False


def prepare_for_workers(
    setup: WorkerSetup | None, user_env: Mapping[str, Any] | None, say: Progress
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The rank actors' ``runtime_env`` (uploaded) and environment variables, from a cluster's settings.

    ``setup`` is its :class:`WorkerSetup` (``Runtime.worker_setup``); ``user_env`` a ``runtime_env`` of the
    user's own (``Runtime.runtime_env``, the Python API), merged under it.
    """
    setup = setup or WorkerSetup()
    runtime_env = dict(user_env or {})
    runtime_env.update(setup.runtime_env())
    if setup:
        say(setup.describe())
    if runtime_env.get("working_dir") or runtime_env.get("py_modules"):
        if _through_ray_client():
            # Ray's upload for one actor's runtime_env never returns over Ray Client (Ray 2.60): refuse, not hang
            raise WorkerSetupError(
                "--working-dir and py_modules cannot be sent to workers over a ray:// (Ray Client) connection; "
                "connect by the cluster's GCS address (host:6379) instead, or put the files on the nodes"
            )
        try:
            runtime_env = _upload(runtime_env)
        except (OSError, ValueError) as exc:
            raise WorkerSetupError(f"the workers' files could not be sent to the cluster: {exc}") from None
    return (runtime_env or None), dict(setup.env)


def working_dir_of(setup: WorkerSetup | None, runtime_env: Mapping[str, Any] | None) -> str | None:
    """The workers' working dir in the notebook's filesystem, when they have one (from a cluster's
    ``Runtime.worker_setup`` and ``Runtime.runtime_env``)."""
    if isinstance(setup, WorkerSetup) and setup.working_dir:
        return setup.working_dir
    wd = (runtime_env or {}).get("working_dir")
    return wd if isinstance(wd, str) and os.path.isdir(wd) else None


# ---- %gpu_cluster env --------------------------------------------------------------------------------------
_MASK_NOTE = f"{MASK}: a value given with --env/--env-file, or a secret's (not shown)"


@dataclass
class EnvReport:
    """Each rank's effective settings (see :mod:`gpu_notebook.distributed._settings`); secrets are ``****``."""

    cluster: str
    settings: dict[int, dict[str, str]]  # rank -> name -> value

    def rows(self) -> list[tuple[str, list[tuple[list[int], str]]]]:
        """Each setting with its values, identical values of several ranks grouped."""
        names: list[str] = []
        for values in self.settings.values():
            names += [n for n in values if n not in names]
        out = []
        for name in names:
            groups: dict[str, list[int]] = {}
            for rank, values in self.settings.items():
                groups.setdefault(values.get(name, "(not set)"), []).append(rank)
            out.append((name, [(ranks, value) for value, ranks in groups.items()]))
        return out

    def text(self) -> str:
        rows = self.rows()
        width = max((len(name) for name, _ in rows), default=0) + 2
        lines = [f"cluster {self.cluster!r}: {len(self.settings)} rank(s); {_MASK_NOTE}"]
        for name, groups in rows:
            if len(groups) == 1:
                lines.append(f"  {name:<{width}}{groups[0][1]}")
                continue
            lines.append(f"  {name}")
            for ranks, value in groups:
                who = rank_label(ranks)
                lines.append(f"    {who:<{width - 2}}{value}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        import html

        body = []
        for name, groups in self.rows():
            cell = "<br>".join(
                html.escape(value if len(groups) == 1 else f"{format_ranks(ranks)}: {value}")
                for ranks, value in groups
            )
            body.append(f"<tr><td><code>{html.escape(name)}</code></td><td><code>{cell}</code></td></tr>")
        head = html.escape(f"cluster {self.cluster!r}: {len(self.settings)} rank(s); {_MASK_NOTE}")
        return f"<div><b>{head}</b><table>{''.join(body)}</table></div>"


def rank_env(cluster: Any) -> EnvReport:
    """Each rank's effective settings on ``cluster`` (a running :class:`~gpu_notebook.cluster.Cluster`)."""
    setup = cluster.settings.runtime.worker_setup
    names = list(setup.names) if isinstance(setup, WorkerSetup) else []
    values = cluster.call(rank_settings, names)
    return EnvReport(cluster.name, dict(enumerate(values)))
