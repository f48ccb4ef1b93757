"""Check a cloud's credentials (and the local tools the launcher needs) before anything is launched.

Each check uses the cloud's standard credential chain and ends in one clear :class:`CredentialsError` when
something is missing or expired. Messages name where credentials come from, never their values.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from gpu_notebook.errors import GpuNotebookError


class CredentialsError(GpuNotebookError, RuntimeError):
    """Missing, expired or unusable cloud credentials (the message says how to fix it)."""


@dataclass
class CredentialsInfo:
    """Where the credentials were found (no secrets): e.g. ``AWS: env, account 123456789012``."""

    cloud: str
    source: str
    identity: str | None = None

    def __str__(self) -> str:
        who = f", {self.identity}" if self.identity else ""
        return f"{self.cloud}: credentials from {self.source}{who}"


def _need_tools(cloud: str) -> None:
    missing = [tool for tool in ("ssh", "rsync") if shutil.which(tool) is None]
    if missing:
        raise CredentialsError(
            f"{cloud}: Ray's cluster launcher needs {' and '.join(missing)} on this machine "
            "(it connects to the nodes over SSH); install them (e.g. apt-get install openssh-client rsync)."
        )


def check_aws(region: str | None = None, verify: bool = True) -> CredentialsInfo:
    """AWS: the boto3 credential chain (env, ``~/.aws``, SSO, instance role), verified with STS."""
    try:
        import boto3
        import botocore.exceptions as bexc
    except ImportError:
        raise CredentialsError('AWS needs boto3: pip install "gpu_notebook[aws]"') from None
    session = boto3.session.Session(region_name=region)
    creds = session.get_credentials()
    if creds is None:
        raise CredentialsError(
            "AWS: no credentials found. Set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, run "
            "`aws configure` or `aws sso login`, or run on an instance with an IAM role."
        )
    source = getattr(creds, "method", None) or "the default chain"
    if not verify:
        return CredentialsInfo("AWS", source)
    try:
        ident = session.client("sts", region_name=region).get_caller_identity()
    except bexc.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "ClientError")
        hint = (
            "they have expired: refresh them (`aws sso login`, new session token)"
            if "Expired" in code
            else "they were rejected"
        )
        raise CredentialsError(f"AWS: credentials from {source} are not usable ({code}); {hint}.") from None
    except bexc.NoCredentialsError:
        raise CredentialsError(
            "AWS: no credentials found (run `aws configure` or `aws sso login`)."
        ) from None
    except (bexc.EndpointConnectionError, bexc.ConnectTimeoutError):
        raise CredentialsError("AWS: cannot reach the AWS API to check the credentials (network?).") from None
    except bexc.BotoCoreError as exc:
        raise CredentialsError(f"AWS: credentials check failed ({type(exc).__name__}).") from None
    return CredentialsInfo("AWS", source, f"account {ident.get('Account', '?')}")


def check_gcp(project: str | None = None) -> CredentialsInfo:
    """GCP: Application Default Credentials, a project, and the Google API client Ray's launcher uses."""
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:
        raise CredentialsError(
            "GCP needs google-auth: pip install google-auth google-api-python-client"
        ) from None
    try:
        import googleapiclient  # noqa: F401
    except ImportError:
        raise CredentialsError(
            "GCP: Ray's launcher needs the Google API client: pip install google-api-python-client"
        ) from None
    try:
        _creds, default_project = google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError:
        raise CredentialsError(
            "GCP: no Application Default Credentials. Run `gcloud auth application-default login` or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file."
        ) from None
    proj = project or default_project
    if not proj:
        raise CredentialsError(
            "GCP: no project; pass project=... (--project) or run `gcloud config set project`."
        )
    return CredentialsInfo("GCP", "application default credentials", f"project {proj}")


def check_azure() -> CredentialsInfo:
    """Azure: the SDKs Ray's Azure launcher needs and a token from ``DefaultAzureCredential`` (``az login``)."""
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise CredentialsError(
            "Azure: Ray's launcher needs azure-identity and the azure-mgmt packages: pip install azure-cli "
            "azure-identity azure-mgmt-compute azure-mgmt-network azure-mgmt-resource"
        ) from None
    from azure.core.exceptions import AzureError

    try:
        DefaultAzureCredential().get_token("https://management.azure.com/.default")
    except (
        AzureError,
        ValueError,
    ) as exc:  # CredentialUnavailableError, ClientAuthenticationError, bad settings
        raise CredentialsError(
            f"Azure: no usable credentials ({type(exc).__name__}); run `az login` or set AZURE_CLIENT_ID, "
            "AZURE_TENANT_ID and AZURE_CLIENT_SECRET."
        ) from None
    return CredentialsInfo("Azure", "DefaultAzureCredential")


def kubeconfig_path() -> str | None:
    """The kube config file in use (``$KUBECONFIG`` or ``~/.kube/config``), or None."""
    env = os.environ.get("KUBECONFIG")
    candidates = env.split(os.pathsep) if env else [os.path.expanduser("~/.kube/config")]
    for path in candidates:
        if path and os.path.exists(path):
            return path
    return None


def check_kubernetes(need_client: bool = True) -> CredentialsInfo:
    """Kubernetes: a kube config (or in-cluster service account) and the ``kubernetes`` client package."""
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    path = kubeconfig_path()
    if not in_cluster and path is None:
        raise CredentialsError(
            "Kubernetes: no kube config found (set KUBECONFIG or create ~/.kube/config); "
            "use --dry-run to print the RayCluster manifest instead."
        )
    if need_client:
        try:
            import kubernetes  # noqa: F401
        except ImportError:
            raise CredentialsError(
                "Kubernetes: applying the manifest needs the client: pip install kubernetes"
            ) from None
    return CredentialsInfo(
        "Kubernetes", "in-cluster service account" if in_cluster else f"kube config {path}"
    )


def check_credentials(
    cloud: str, region: str | None = None, project: str | None = None, verify: bool = True, tools: bool = True
) -> CredentialsInfo:
    """Check credentials for ``cloud`` before launching anything.

    Parameters
    ----------
    cloud : {"aws", "gcp", "azure", "kubernetes"}
    region : str, optional
    project : str, optional
        GCP project.
    verify : bool
        AWS: also ask STS who we are (catches expired credentials).
    tools : bool
        VM clouds: also check for ``ssh`` and ``rsync``.

    Raises
    ------
    CredentialsError
        One message saying what is missing and how to fix it.
    """
    if cloud == "aws":
        info = check_aws(region, verify=verify)
    elif cloud == "gcp":
        info = check_gcp(project)
    elif cloud == "azure":
        info = check_azure()
    elif cloud == "kubernetes":
        return check_kubernetes()
    else:
        raise CredentialsError(f"unknown cloud {cloud!r}")
    if tools:
        _need_tools(cloud)
    return info
