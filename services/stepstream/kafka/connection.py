"""One Kafka connection value: the brokers and their security, read once at the edge.

Every Kafka client stepstream builds (the faust worker, the lag poller's admin and
consumer, topic administration, the compactor's and the CLI's producer, the SDK's
:class:`~stepstream.emitter.tracer.Tracer`) is built from a :class:`KafkaConnection`;
none reads a broker string or a security setting on its own.

Public names (stable):

- :class:`KafkaConnection` -- frozen; fields ``brokers`` (``host:port[,host:port]``),
  ``security_protocol``, ``sasl_mechanism``, ``sasl_username``, ``sasl_password``,
  ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``.
  Its ``repr``/``str`` never show the password (``sasl_password`` is left out).

  - ``KafkaConnection.from_env(environ=None, overrides=None, *, brokers=None)``: the
    value from ``STEPSTREAM_BROKER`` and the ``STEPSTREAM_KAFKA_*`` variables of
    :data:`ENV_NAMES`, then ``overrides`` (the CLI flags or the SDK's keyword
    arguments, keyed by field name; ``None`` is ignored; ``sasl_password_file`` is
    read here, once). Raises :class:`~stepstream.errors.ConfigError` naming the setting.
  - ``KafkaConnection.plaintext(brokers)``: no security (tests, a laptop).
  - ``.aiokafka_kwargs()``: keyword arguments for ``AIOKafkaProducer``,
    ``AIOKafkaConsumer`` and ``AIOKafkaAdminClient`` (``bootstrap_servers``,
    ``security_protocol``, and the ``ssl_context`` / ``sasl_*`` it needs).
  - ``.librdkafka_config()``: the same connection as a confluent-kafka configuration
    (``bootstrap.servers``, ``security.protocol``, ``ssl.*``, ``sasl.*``), for the
    API's ingest producer.
  - ``.faust_broker`` (``kafka://h:p;kafka://h:p``) and ``.faust_credentials()``
    (``faust.SSLCredentials`` / ``faust.SASLCredentials`` with the SSL context, so
    ``SASL_SSL`` is never silently downgraded to ``SASL_PLAINTEXT``; ``None`` for
    ``PLAINTEXT``).
  - ``.ssl_context()``: the ``ssl.SSLContext`` of ``SSL``/``SASL_SSL`` (else ``None``).
  - ``.describe()``: ``"SASL_SSL SCRAM-SHA-512 user 'worker' at h:p"``, for error lines.
  - ``.check_protocol(effective, client)``: :class:`ConfigError` unless a client's
    effective protocol (:func:`effective_protocol` of an aiokafka client, or what faust
    hands aiokafka) is the configured one. Every client is checked when built.
  - ``.uses_tls`` / ``.uses_sasl``; ``.secrets()`` (the password, for the log scrub).

- :data:`SECURITY_PROTOCOLS`, :data:`SASL_MECHANISMS`, :data:`ENV_NAMES` (field name to
  variable), :data:`SDK_ARGUMENTS` (the SDK's keyword arguments: the field names and
  ``sasl_password_file``), :func:`as_connection` (a connection, or a broker string as a
  plaintext one), :func:`effective_protocol`, :func:`normalize_broker`, :func:`faust_broker`.

This module imports neither faust nor the worker (faust is imported inside
``faust_credentials`` only), so the SDK side can use it.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepstream.errors import ConfigError

__all__ = [
    "ENV_NAMES",
    "SASL_MECHANISMS",
    "SDK_ARGUMENTS",
    "SECURITY_PROTOCOLS",
    "KafkaConnection",
    "as_connection",
    "effective_protocol",
    "faust_broker",
    "normalize_broker",
]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_BROKERS = "127.0.0.1:9092"

# Field (or SDK keyword) -> environment variable. The CLI flag of each is
# ``--kafka-<field with dashes>`` (``--broker`` for brokers); there is no password flag:
# a password is never in argv, only in the environment or a file.
ENV_NAMES: dict[str, str] = {
    "brokers": "STEPSTREAM_BROKER",
    "security_protocol": "STEPSTREAM_KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "STEPSTREAM_KAFKA_SASL_MECHANISM",
    "sasl_username": "STEPSTREAM_KAFKA_SASL_USERNAME",
    "sasl_password": "STEPSTREAM_KAFKA_SASL_PASSWORD",
    "sasl_password_file": "STEPSTREAM_KAFKA_SASL_PASSWORD_FILE",
    "ssl_cafile": "STEPSTREAM_KAFKA_SSL_CAFILE",
    "ssl_certfile": "STEPSTREAM_KAFKA_SSL_CERTFILE",
    "ssl_keyfile": "STEPSTREAM_KAFKA_SSL_KEYFILE",
    "ssl_check_hostname": "STEPSTREAM_KAFKA_SSL_CHECK_HOSTNAME",
}
SDK_ARGUMENTS = tuple(name for name in ENV_NAMES if name != "brokers")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_PASSWORD_FILE_BYTES = 4096


@dataclass(frozen=True, kw_only=True)
class KafkaConnection:
    """Where the brokers are and how to talk to them (module docstring). Validated when
    built: a protocol or mechanism outside the lists, SASL without a user and password,
    a client certificate without its key, or TLS files on a protocol without TLS are a
    :class:`ConfigError`. Files are read when a client is built, not here."""

    brokers: str = DEFAULT_BROKERS
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "brokers", normalize_broker(self.brokers))
        protocol = self.security_protocol.strip().upper()
        object.__setattr__(self, "security_protocol", protocol)
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"bad setting: kafka_security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}")
        mechanism = self.sasl_mechanism.strip().upper()
        object.__setattr__(self, "sasl_mechanism", mechanism)
        if self.uses_sasl:
            if mechanism not in SASL_MECHANISMS:
                raise ConfigError(
                    f"bad setting: kafka_sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)} with {protocol}"
                )
            if not self.sasl_username or not self.sasl_password:
                raise ConfigError(
                    f"bad setting: {protocol} needs kafka_sasl_username and kafka_sasl_password "
                    "(or kafka_sasl_password_file)"
                )
        elif mechanism or self.sasl_username or self.sasl_password:
            raise ConfigError(f"bad setting: SASL settings are given but kafka_security_protocol is {protocol}")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ConfigError("bad setting: kafka_ssl_certfile and kafka_ssl_keyfile go together (client certificate)")
        if not self.uses_tls and (self.ssl_cafile or self.ssl_certfile):
            raise ConfigError(f"bad setting: TLS files are given but kafka_security_protocol is {protocol}")

    # -- reading ---------------------------------------------------------------------

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        *,
        brokers: str | None = None,
    ) -> KafkaConnection:
        """Defaults, then the variables of :data:`ENV_NAMES`, then ``overrides`` (flags or
        SDK keywords by field name, ``None`` ignored), then ``brokers`` if given. A
        password file (``sasl_password_file``) is read now; a password given directly
        wins over a file from the environment, a file given as an override wins over
        a password from the environment."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, variable in ENV_NAMES.items():
            raw = env.get(variable)
            if raw is not None and raw != "":
                values[name] = raw
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        unknown = set(given) - set(ENV_NAMES)
        if unknown:
            raise ConfigError(f"bad setting: unknown Kafka settings {sorted(unknown)}")
        if "sasl_password_file" in given and "sasl_password" not in given:
            values.pop("sasl_password", None)
        values.update(given)
        if brokers is not None:
            values["brokers"] = brokers
        password_file = values.pop("sasl_password_file", None)
        if password_file and not values.get("sasl_password"):
            values["sasl_password"] = _read_password(str(password_file))
        if "ssl_check_hostname" in values:
            values["ssl_check_hostname"] = _boolean(values["ssl_check_hostname"], "kafka_ssl_check_hostname")
        for name in values:
            if name != "ssl_check_hostname" and not isinstance(values[name], str):
                raise ConfigError(f"bad setting: kafka setting {name} must be a string")
        return cls(**values)

    @classmethod
    def plaintext(cls, brokers: str) -> KafkaConnection:
        return cls(brokers=brokers)

    # -- facts -------------------------------------------------------------------------

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def faust_broker(self) -> str:
        return faust_broker(self.brokers)

    def describe(self) -> str:
        """Protocol, mechanism, principal and brokers; never the password."""
        parts = [self.security_protocol]
        if self.uses_sasl:
            parts.append(f"{self.sasl_mechanism} user {self.sasl_username!r}")
        if self.ssl_certfile:
            parts.append("with a client certificate")
        return f"{' '.join(parts)} at {self.brokers}"

    # -- building clients ----------------------------------------------------------------

    def secrets(self) -> tuple[str, ...]:
        """The literal secrets this value holds (the SASL password), for the log scrub."""
        return (self.sasl_password,) if self.sasl_password else ()

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS client context (the system's CAs, or ``ssl_cafile`` only; the client
        certificate when given; hostname checks unless turned off). ``None`` without TLS.
        A file that cannot be read is a :class:`ConfigError` naming the setting."""
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ssl_cafile or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"bad setting: kafka_ssl_cafile {self.ssl_cafile!r} cannot be used ({_why(exc)})") from None
        if self.ssl_certfile:
            try:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"bad setting: kafka_ssl_certfile {self.ssl_certfile!r} / kafka_ssl_keyfile "
                    f"{self.ssl_keyfile!r} cannot be used ({_why(exc)})"
                ) from None
        context.check_hostname = self.ssl_check_hostname
        return context

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by aiokafka's producer, consumer and admin client."""
        kwargs: dict[str, Any] = {"bootstrap_servers": self.brokers, "security_protocol": self.security_protocol}
        if self.uses_tls:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password
        return kwargs

    def librdkafka_config(self) -> dict[str, Any]:
        """The connection part of a librdkafka (confluent-kafka) client's configuration:
        the same protocol, mechanism, principal, CA, client certificate and hostname rule
        as :meth:`aiokafka_kwargs`. The TLS files are checked here as for aiokafka
        (:meth:`ssl_context`: a :class:`ConfigError` naming the setting); without a CA
        file librdkafka probes the system's CA locations. The password is in the value:
        never log it."""
        config: dict[str, Any] = {"bootstrap.servers": self.brokers, "security.protocol": self.security_protocol.lower()}
        if self.uses_tls:
            self.ssl_context()
            config["ssl.ca.location"] = self.ssl_cafile or "probe"
            if self.ssl_certfile:
                config["ssl.certificate.location"] = self.ssl_certfile
                config["ssl.key.location"] = self.ssl_keyfile
            config["ssl.endpoint.identification.algorithm"] = "https" if self.ssl_check_hostname else "none"
        if self.uses_sasl:
            config["sasl.mechanism"] = self.sasl_mechanism
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self.sasl_password
        return config

    def check_protocol(self, effective: str, client: str) -> None:
        """Refuse a client whose effective security protocol is not the configured one
        (faust's ``SASLCredentials`` means ``SASL_PLAINTEXT`` without an SSL context:
        a silent downgrade). ``effective``: what the client will use, e.g. from
        :func:`effective_protocol`; ``client`` names it in the error."""
        if str(effective).upper() != self.security_protocol:
            raise ConfigError(
                f"{client} would connect with {effective}, not the configured {self.security_protocol}: refusing to start"
            )

    def faust_credentials(self) -> Any:
        """faust's ``broker_credentials``: ``None``, ``SSLCredentials`` or
        ``SASLCredentials`` carrying the SSL context for ``SASL_SSL`` (faust's
        ``SASLCredentials`` means ``SASL_PLAINTEXT`` without one)."""
        if self.security_protocol == "PLAINTEXT":
            return None
        import faust

        context = self.ssl_context()
        if self.security_protocol == "SSL":
            return faust.SSLCredentials(context)
        return faust.SASLCredentials(
            username=self.sasl_username,
            password=self.sasl_password,
            ssl_context=context,
            mechanism=self.sasl_mechanism,
        )


def effective_protocol(client: Any) -> str:
    """The security protocol an aiokafka producer, consumer or admin client was built
    with (its ``AIOKafkaClient``'s; private names of aiokafka 0.14, guarded by
    tests/unit/test_kafka_connection.py)."""
    inner = getattr(client, "client", None) or getattr(client, "_client", None)
    protocol = getattr(inner, "_security_protocol", None)
    if protocol is None:
        raise ConfigError(f"cannot tell the security protocol of {type(client).__name__}")
    return str(protocol)


def as_connection(value: KafkaConnection | str) -> KafkaConnection:
    """``value`` itself, or a broker string as a plaintext connection."""
    return value if isinstance(value, KafkaConnection) else KafkaConnection.plaintext(value)


def _read_password(path: str) -> str:
    try:
        with Path(path).open("rb") as handle:
            raw = handle.read(_PASSWORD_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"bad setting: kafka_sasl_password_file {path!r} cannot be read ({_why(exc)})") from None
    if len(raw) > _PASSWORD_FILE_BYTES:
        raise ConfigError(f"bad setting: kafka_sasl_password_file {path!r} is larger than {_PASSWORD_FILE_BYTES} bytes")
    try:
        # A Kubernetes secret file may or may not end with a newline; the password never does.
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(f"bad setting: kafka_sasl_password_file {path!r} is not UTF-8") from None


def _boolean(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"bad setting: {name} must be true or false")


def _why(exc: BaseException) -> str:
    # The class and errno/reason only: an exception's text may quote file contents.
    reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None)
    return f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__


def normalize_broker(value: str) -> str:
    """Bootstrap servers as ``host:port[,host:port...]`` from what users write:
    ``host:port``, ``kafka://host:port`` (faust's form), several separated by ``,``
    or ``;``. Raises :class:`ConfigError` for an address without a port or with
    another scheme; the message names the setting, not the whole value."""
    servers: list[str] = []
    for part in re.split(r"[,;]", value):
        part = part.strip()
        if not part:
            continue
        if "://" in part:
            scheme, _, part = part.partition("://")
            if scheme.lower() != "kafka":
                raise ConfigError(f"bad setting: broker: scheme {scheme[:16]!r} is not kafka://")
            part = part.rstrip("/")
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("bad setting: broker: each address must be host:port or kafka://host:port")
        servers.append(f"{host}:{int(port)}")
    if not servers:
        raise ConfigError("bad setting: broker: no address given")
    return ",".join(servers)


def faust_broker(value: str) -> str:
    """The same servers as faust's broker URL list (``kafka://h:p;kafka://h:p``)."""
    return ";".join(f"kafka://{server}" for server in normalize_broker(value).split(","))
