"""``stepstream verify BUNDLE``: integrity, structure and payload hashes of a bundle.

Reads a ``.sftrace`` directory, ours or one the reference wrote, and returns a
:class:`Verdict` whose ``status`` is one of (exit code in brackets):

* ``verified`` [0]: ``integrity.json`` lists a SHA-256 for each of
  ``manifest.json``, ``events.jsonl`` and ``redactions.json`` (and any other file
  it lists), each equal to the file's bytes; the structure is valid; every event
  carries the payload hash its type calls for, equal to the canonical hash of its
  payload.
* ``mismatch`` [3]: a listed file's bytes or an event's payload hash differ;
  ``file`` names the file (and ``line`` the event's line).
* ``invalid`` [4]: a file is missing or not what the format says (bad JSON, a
  blank line, an unknown event type, a run id other than the manifest's, a
  malformed ``integrity.json``).
* ``unverified_legacy`` [5]: valid, but no ``integrity.json``, or events without
  payload hashes: readable, not verified.

Integrity is checked first, so a changed byte is reported as the mismatch of the
file it is in even when the change also breaks the file's JSON.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from pathlib import Path
from typing import Any, NamedTuple

from stepstream.core.canonical import CanonicalError, payload_hash

__all__ = ["EXIT_CODES", "Verdict", "verify_bundle"]

EXIT_CODES = {"verified": 0, "mismatch": 3, "invalid": 4, "unverified_legacy": 5}
REQUIRED = ("manifest.json", "events.jsonl", "redactions.json")
EVENT_TYPES = frozenset(
    {"run_start", "llm_request", "llm_response", "tool_call", "tool_result", "state_change", "error", "run_end"}
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class Verdict(NamedTuple):
    status: str
    message: str
    file: str | None = None
    line: int | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _integrity(root: Path) -> Verdict | None:
    """A mismatch or invalid verdict from ``integrity.json``; ``None`` when it holds
    (or is absent: the caller reports that as legacy after the structure check)."""
    path = root / "integrity.json"
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return Verdict("invalid", "integrity.json is not JSON", "integrity.json")
    if not isinstance(record, dict) or record.get("algorithm") != "sha256" or not isinstance(record.get("files"), dict):
        return Verdict("invalid", "integrity.json has no sha256 file list", "integrity.json")
    files: dict[str, Any] = record["files"]
    for name in REQUIRED:
        if name not in files:
            return Verdict("invalid", f"integrity.json lists no digest for {name}", "integrity.json")
    for name, digest in files.items():
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest) or not _NAME.fullmatch(name) or name == "integrity.json":
            return Verdict("invalid", f"integrity.json has a malformed entry for {name!r}", "integrity.json")
        target = root / name
        if not target.is_file():
            return Verdict("invalid", f"{name} is listed in integrity.json but missing", name)
        if not hmac.compare_digest(_sha256(target), digest):
            return Verdict("mismatch", f"{name}: SHA-256 differs from integrity.json", name)
    return None


def _expected_hashes(event: dict[str, Any]) -> list[tuple[str, str]]:
    """(hash field, payload field) pairs the reference hashes for this event."""
    kind = event["type"]
    if kind in ("llm_request", "tool_call") or (kind == "run_start" and "input" in event):
        return [("input_hash", "input")]
    if kind in ("llm_response", "tool_result") or (kind == "run_end" and "output" in event):
        return [("output_hash", "output")]
    if kind == "state_change":
        pairs = []
        if "before" in event:
            pairs.append(("input_hash", "before"))
        if "after" in event:
            pairs.append(("output_hash", "after"))
        return pairs
    if kind == "error" and "details" in event:
        return [("output_hash", "details")]
    return []


def _read_json(root: Path, name: str) -> Any:
    return json.loads((root / name).read_bytes().decode("utf-8"))


def verify_bundle(path: str | Path) -> Verdict:
    """The :class:`Verdict` on the bundle directory ``path`` (module docstring)."""
    root = Path(path)
    if not root.is_dir():
        return Verdict("invalid", f"{root} is not a directory")
    for name in REQUIRED:
        if not (root / name).is_file():
            return Verdict("invalid", f"{name} is missing", name)
    bad = _integrity(root)
    if bad is not None:
        return bad
    try:
        manifest = _read_json(root, "manifest.json")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Verdict("invalid", f"manifest.json is not JSON: {exc}", "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("format") != "stepfork" or manifest.get("schema_version") != "0.1":
        return Verdict("invalid", "manifest.json is not a stepfork 0.1 manifest", "manifest.json")
    run_id = manifest.get("run_id")
    try:
        redactions = _read_json(root, "redactions.json")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Verdict("invalid", f"redactions.json is not JSON: {exc}", "redactions.json")
    if not isinstance(redactions, dict) or not isinstance(redactions.get("entries"), list):
        return Verdict("invalid", "redactions.json has no entries list", "redactions.json")
    unhashed = 0
    try:
        text = (root / "events.jsonl").read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return Verdict("invalid", "events.jsonl is not UTF-8", "events.jsonl")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    count = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            return Verdict("invalid", f"events.jsonl line {number} is blank", "events.jsonl", number)
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            return Verdict("invalid", f"events.jsonl line {number} is not JSON: {exc.msg}", "events.jsonl", number)
        if not isinstance(event, dict) or event.get("type") not in EVENT_TYPES or not event.get("id"):
            return Verdict("invalid", f"events.jsonl line {number} is not an event", "events.jsonl", number)
        if event.get("run_id") != run_id:
            return Verdict("invalid", f"events.jsonl line {number}: run_id is not the manifest's", "events.jsonl", number)
        count += 1
        for hash_field, field in _expected_hashes(event):
            stored = event.get(hash_field)
            if stored is None:
                unhashed += 1
                continue
            try:
                actual = payload_hash(event.get(field))
            except CanonicalError as exc:
                return Verdict("invalid", f"events.jsonl line {number}: {field} is not JSON: {exc}", "events.jsonl", number)
            if not hmac.compare_digest(str(stored), actual):
                return Verdict("mismatch", f"events.jsonl line {number}: {hash_field} differs from its {field}",
                               "events.jsonl", number)  # fmt: skip
    if not (root / "integrity.json").exists():
        return Verdict("unverified_legacy", "no integrity.json: readable, not verified", "integrity.json")
    if unhashed:
        return Verdict("unverified_legacy", f"{unhashed} payloads carry no hash: readable, not verified", "events.jsonl")
    return Verdict("verified", f"verified: {count} events")
