"""The exception tree of stepstream. Every error we raise on purpose derives from
:class:`StepstreamError`; policy lives on the type (``retriable``), not in callers.

::

    StepstreamError
    ├── WireError            bad input on the wire; never retriable, goes to the dead-letter topic
    ├── ConfigError          a setting or URL that cannot work; fix the configuration
    ├── SinkError            a store failed
    │   └── SinkUnavailable  transient (connection refused, locked database); retriable
    ├── BundleError          an .sftrace bundle that cannot be read or verified
    ├── KafkaRefused         the brokers refused the connection or an ACL; fix the credentials
    └── AuthError            missing, unknown or insufficient token (API)
"""

from __future__ import annotations


class StepstreamError(Exception):
    """Root of every error stepstream raises on purpose."""

    retriable: bool = False


class WireError(StepstreamError):
    """A message that is not a valid v1 event. ``reason`` is a short stable code
    (see ``stepstream.core.wire.DECODE_REASONS``); ``detail`` says what was wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class ConfigError(StepstreamError):
    """A setting, flag or URL that cannot work as given."""


class SinkError(StepstreamError):
    """A store refused or failed a read or write."""


class SinkUnavailable(SinkError):
    """A store is temporarily unreachable; the caller may retry the same batch."""

    retriable = True


class KafkaRefused(StepstreamError):
    """The brokers refused the configured connection (authentication, TLS trust, a
    missing ACL). The message is one line naming brokers, protocol, mechanism,
    principal and what was refused; never a password."""


class BundleError(StepstreamError):
    """An .sftrace bundle that is malformed, inconsistent or fails verification."""


class AuthError(StepstreamError):
    """Missing, unknown or insufficient API token."""
