"""AWS failures a person can act on, as one line each: what went wrong and what to do.

Only adapters import botocore; the CLI asks here (``explain``) and prints the answer. Adapters
raise what they do not translate, so these reach the CLI as botocore's own exceptions.
"""

from __future__ import annotations

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ReadTimeoutError,
    SSOTokenLoadError,
    TokenRetrievalError,
    UnauthorizedSSOTokenError,
)

# "403": botocore's code when the answer has no body to read one from (S3's HeadObject, as "404" below)
_DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError",
           "UnrecognizedClientException", "InvalidClientTokenId", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "ExpiredToken", "ExpiredTokenException", "RequestExpired", "InvalidToken", "403"}
_MISSING = {"ResourceNotFoundException", "NoSuchBucket", "StateMachineDoesNotExist", "NotFoundException",
            "NotFound", "404", "NoSuchEntity", "ExecutionDoesNotExist"}
_TWIN_HINT = "start the twin with `spotrelay local up`, or fix --endpoint-url / AWS_ENDPOINT_URL / .spotrelay.toml"

Explained = tuple[str, int]  # (one line, exit code: 2 usage/configuration, 1 runtime)


def explain(exc: BaseException, endpoint: str | None) -> Explained | None:
    """One line for an AWS failure, or None when it is not one."""
    where = endpoint or "AWS"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return ("no AWS credentials found: run `aws configure` or `aws sso login`, or set AWS_PROFILE; "
                "for the local twin pass --endpoint-url (any credentials work there)", 1)
    if isinstance(exc, (SSOTokenLoadError, UnauthorizedSSOTokenError, TokenRetrievalError, CredentialRetrievalError)):
        return f"AWS credentials could not be loaded ({exc}); log in again (`aws sso login`)", 1
    if isinstance(exc, NoRegionError):
        return "no AWS region: pass --region, set AWS_REGION, or put region in .spotrelay.toml", 2
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError)):
        hint = _TWIN_HINT if endpoint else "check your network or proxy settings"
        return f"cannot reach {where}: {exc}; {hint}", 1
    if isinstance(exc, ReadTimeoutError):
        return f"{where} did not answer in time ({exc}); try again, or check the endpoint", 1
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        message = str(exc.response.get("Error", {}).get("Message", "")) or code
        operation = exc.operation_name
        if code in _DENIED:
            return (f"access denied calling {operation} ({code}): your credentials are expired or lack "
                    "spotrelay's permissions; log in again, or attach the deployment's cli-user policy (the home "
                    "stack's CliUserPolicyArn output; docs/security.md)", 1)
        if code in _MISSING:
            return (f"not found calling {operation}: {message}; is spotrelay deployed in this account and "
                    "region, and are --table / --bucket / --region right?", 1)
        return f"AWS refused {operation} ({code}): {message}", 1
    if isinstance(exc, BotoCoreError):
        return f"AWS client error: {exc}", 1
    return None
