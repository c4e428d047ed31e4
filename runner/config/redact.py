"""Hide secrets wherever a spec, a plan or an event is shown or written: by name, and by the shape of the value.

Two rules, applied together (docs/secrets.md):

- by name: an environment variable whose name looks secret (`is_secret`) has its whole value replaced by `MASK`;
- by value: whatever the name, the password of a URL (`scheme://user:PASSWORD@host`) and the value of a
  secret-looking `key=value` pair (`Password=...;`, `pwd=...`, `?token=...`, `--api-key=...`) are masked, and the
  rest of the value stays readable.

Workers still get the real values: only what is shown or written is redacted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from runner.config.spec import JobSpec

MASK = "***"
K = TypeVar("K")  # a mapping's key type, kept by redact_mapping

# A name is secret when its upper-cased form CONTAINS one of these words. Deliberately broad: a false positive
# (KEYBOARD_LAYOUT, AUTHOR) only hides a harmless value; a false negative would leak a secret.
SECRET_WORDS = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "CRED", "AUTH", "PRIVATE", "SIGNATURE", "COOKIE",
)
# ... or when one of its parts (split at _ - . and camelCase) IS one of these: DB_PASS, MYSQL_PWD, GITHUB_PAT,
# SENTRY_DSN, dbPass, but not BYPASS, COMPASS or PATH.
SECRET_PARTS = frozenset({"PASS", "PWD", "PW", "PAT", "DSN", "SIG"})
# ... or when it is one of these whole names (a URL that usually embeds its password).
SECRET_NAMES = frozenset({"DATABASE_URL"})
# Well-known variables that contain a secret word but never hold a secret (environment names only: `Pwd=` in a
# connection string is still a password).
NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD", "TOKENIZERS_PARALLELISM"})

_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# (each pattern starts only where its run starts, so no input makes a search quadratic)
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*+://")
# key=value inside a value: a key starts where no key character precedes it (so `--db-password=` is one key).
_IN_USERINFO = re.compile(r"[^/?#@,;\s]*+")  # text after a scheme:// that is still its URL's userinfo
_PAIR_KEY = re.compile(r"(?<![\w.\-])([A-Za-z_\-][\w.\-]*+)[ \t]*+=[ \t]*+")
# where an unquoted pair value ends: the next `<separator>key=` (so a password may hold spaces, & or ;).
_NEXT_PAIR = re.compile(r"(?<![;&,\s])[;&,\s]++[A-Za-z_\-][\w.\-]*+[ \t]*+=")
_CLOSING = {"'": "'", '"': '"', "{": "}"}


def _has_secret_word(name: str) -> bool:
    """True when `name` contains a secret word or is made of a secret part (no exceptions applied)."""
    upper = name.upper()
    if upper in SECRET_NAMES or any(word in upper for word in SECRET_WORDS):
        return True
    return any(part.upper() in SECRET_PARTS for part in _PARTS.findall(name))


def is_secret(key: str) -> bool:
    """True when the environment variable `key` looks like it holds a secret (HF_TOKEN, DB_PASS, DATABASE_URL...)."""
    return key.upper() not in NOT_SECRET_NAMES and _has_secret_word(key)


def redact(key: str, value: str) -> str:
    """`value` as it may be shown: "***" when `key` looks secret, else `value` with embedded secrets masked."""
    return MASK if is_secret(key) else redact_value(value)


def has_secret(key: str, value: str) -> bool:
    """True when `value`, under the name `key`, is or holds a secret: what must never be stored or shown in clear.

    The test for code that keeps env values somewhere (etcd's spec tree): store a digest instead when it is true.
    """
    return redact(key, value) != value


def redact_value(value: str) -> str:
    """`value` with every URL password and every secret-looking `key=value` pair's value masked."""
    if "=" not in value and "://" not in value:
        return value  # the common case: nothing that could embed a secret
    return _mask_pairs(_mask_url_passwords(value))


def _mask_url_passwords(text: str) -> str:
    """Mask the password of every `scheme://user:password@host` in `text` (user, host and path stay).

    A URL runs to the next `scheme://` (lists of URLs) or the end; its userinfo ends at the LAST `@`, so a
    password holding raw `@`, `/`, `?` or spaces is masked whole (at worst some of the rest is hidden too). A
    `scheme://` that follows the last one with nothing between that ends a userinfo or a URL (`/?#@,;` or a space)
    is part of its userinfo: `postgres://A://pw@h` is user A, password `//pw` (Hypothesis found it shown).
    """
    schemes: list[re.Match[str]] = []
    for m in _SCHEME.finditer(text):
        if not schemes or not _IN_USERINFO.fullmatch(text, schemes[-1].end(), m.start()):
            schemes.append(m)
    if not schemes:
        return text
    starts = [m.end() for m in schemes]
    ends = [*(m.start() for m in schemes[1:]), len(text)]
    out, pos = [], 0
    for start, end in zip(starts, ends, strict=True):
        region = text[start:end]
        at = region.rfind("@")
        colon = region.find(":", 0, at) if at > 0 else -1
        if colon < 0 or any(c in region[:colon] for c in "/?#") or colon + 1 == at:
            continue  # no password (host:port, user@host, or an empty password)
        out += [text[pos : start + colon + 1], MASK]
        pos = start + at
    out.append(text[pos:])
    return "".join(out)


def _mask_pairs(text: str) -> str:
    """Mask the value of every `key=value` whose key looks secret (Password=..;, pwd=, ?token=, --api-key=)."""
    out, pos, search = [], 0, 0
    while (m := _PAIR_KEY.search(text, search)) is not None:
        start = m.end()
        if not _has_secret_word(m.group(1)):
            search = start  # its value may itself hold pairs (opts=password=x)
            continue
        end = _value_end(text, start)
        search = max(end, start)
        if end <= start:
            continue
        quoted = text[start] in _CLOSING
        inner_start, inner_end = (start + 1, max(start + 1, end - 1)) if quoted else (start, end)
        if inner_end > inner_start and text[inner_start:inner_end] != MASK:
            out += [text[pos:inner_start], MASK]
            pos = inner_end
    out.append(text[pos:])
    return "".join(out)


def _value_end(text: str, start: int) -> int:
    """Where the pair value starting at `start` ends (after its closing quote or brace, if quoted)."""
    if start >= len(text):
        return start
    close = _CLOSING.get(text[start])
    if close is not None:
        found = text.find(close, start + 1)
        while 0 <= found < len(text) - 1 and text[found + 1] == close:  # a doubled quote is an escaped one
            found = text.find(close, found + 2)
        return len(text) if found < 0 else found + 1
    nxt = _NEXT_PAIR.search(text, start)
    if nxt is not None:
        return nxt.start()
    return max(start, len(text.rstrip(";&, \t\r\n")))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` as it may be shown: `--token X` hides X, `--token=X` and URL passwords are masked."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        shown.append(MASK if hide_next else redact_value(arg))
        hide_next = arg.startswith("-") and "=" not in arg and _has_secret_word(arg.lstrip("-"))
    return shown


def redact_data(data: object) -> object:
    """A JSON-like value with every string redacted by value; a mapping's secret-named string entries masked whole.

    Lists of strings are treated as command lines (`redact_argv`). Use it on anything written or published that
    might carry an environment value (an event, a report).
    """
    if isinstance(data, str):
        return redact_value(data)
    if isinstance(data, Mapping):
        return redact_mapping(data)
    if isinstance(data, list | tuple):
        if all(isinstance(x, str) for x in data):
            return redact_argv(data)
        return [redact_data(x) for x in data]
    return data


def redact_mapping(data: Mapping[K, object]) -> dict[K, object]:
    """A mapping as redact_data has it: secret-named string entries masked whole, every other value redacted."""
    return {k: redact(k, v) if isinstance(k, str) and isinstance(v, str) else redact_data(v) for k, v in data.items()}


def _redact_spec_part(data: object) -> object:
    """Spec fields are redacted by value only: their names (tls.key, auth.password_env) are not secrets."""
    if isinstance(data, str):
        return redact_value(data)
    if isinstance(data, Mapping):
        return {k: _redact_spec_part(v) for k, v in data.items()}
    if isinstance(data, list):
        return redact_argv(data) if all(isinstance(x, str) for x in data) else [_redact_spec_part(x) for x in data]
    return data


def spec_for_disk(spec: JobSpec) -> dict[str, object]:
    """The resolved spec as written to <run dir>/spec.json or shown by `runner plan`: secrets masked.

    `env` by name and value (`redact`); every other string (entrypoint args, endpoints...) by value.
    """
    resolved = spec.to_dict()
    return {
        k: {name: redact(name, value) for name, value in v.items()} if k == "env" else _redact_spec_part(v)
        for k, v in resolved.items()
    }


def redact_event(_logger: object, _method: str, event_dict: MutableMapping[str, Any]) -> dict[str, object]:
    """A structlog processor: the event with secrets masked (`redact_data`), for the console and agent.jsonl."""
    return redact_mapping(event_dict)
