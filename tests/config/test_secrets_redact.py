"""Redaction (runner.config.redact): a secret, whatever name or value shape carries it, never shows; the rest does."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from runner.config.redact import (
    MASK,
    NOT_SECRET_NAMES,
    SECRET_PARTS,
    SECRET_WORDS,
    has_secret,
    is_secret,
    redact,
    redact_argv,
    redact_data,
    redact_event,
    redact_value,
    spec_for_disk,
)
from runner.config.spec import Auth, Entrypoint, JobSpec, Rendezvous

NAME_CHARS = string.ascii_uppercase + string.digits + "_"
# A password may hold anything but whitespace (it would not survive in a URL or an unquoted pair either).
PASSWORD_CHARS = string.ascii_letters + string.digits + string.punctuation
ORDINARY = ("PATH", "OMP_NUM_THREADS", "HOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "MASTER_ADDR",
            "MASTER_PORT", "PYTHONPATH", "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "WORLD_SIZE",
            "TORCHELASTIC_ERROR_FILE", "RUNNER_HEARTBEAT_FILE", "TOKENIZERS_PARALLELISM", "PWD", "LANG")

secrets = st.text(PASSWORD_CHARS, min_size=8, max_size=40)


@st.composite
def secret_names(draw: st.DrawFn) -> str:
    """A variable name that holds a secret word (HF_TOKEN, X_SECRET_Y) or is made with a secret part (DB_PASS)."""
    prefix = draw(st.text(NAME_CHARS, max_size=8))
    suffix = draw(st.text(NAME_CHARS, max_size=8))
    if draw(st.booleans()):
        name = prefix + draw(st.sampled_from(SECRET_WORDS)) + suffix
    else:
        name = "_".join(p for p in (prefix, draw(st.sampled_from(sorted(SECRET_PARTS))), suffix) if p)
    if draw(st.booleans()):
        name = name.lower()
    assume(name.upper() not in NOT_SECRET_NAMES)
    return name


@given(name=secret_names(), secret=secrets)
@example(name="DATABASE_URL", secret="s3cr3t-value")
@example(name="sentry_dsn", secret="https://abc@o1.ingest.sentry.io/1")
def test_a_secret_named_value_never_shows(name: str, secret: str) -> None:
    """Under a secret-looking name the whole value is masked."""
    assert is_secret(name)
    assert redact(name, secret) == MASK


@pytest.mark.parametrize("name", ["DB_PASS", "MYSQL_PWD", "GITHUB_PAT", "SENTRY_DSN", "DATABASE_URL", "HF_TOKEN",
                                  "AWS_SECRET_ACCESS_KEY", "PGPASSWORD", "MYSQL_PASSWD", "GOOGLE_APPLICATION_CREDENTIALS",
                                  "NPM_AUTH", "SSH_PRIVATE_KEY", "dbPass", "api-key", "azure.storage.sig", "SESSION_COOKIE"])
def test_common_credential_names_are_secret(name: str) -> None:
    """The names a credential usually goes by."""
    assert is_secret(name)


@pytest.mark.parametrize("name", [*ORDINARY, "BYPASS_PROXY", "COMPASS_DIR", "PATHS", "SPATIAL"])
def test_ordinary_names_are_not_secret(name: str) -> None:
    """The torchrun contract, the usual tuning variables and look-alikes (BYPASS is not *_PASS) are shown."""
    assert not is_secret(name)


@given(name=st.sampled_from(ORDINARY), value=st.text(max_size=60))
@example(name="PATH", value="/usr/local/bin:/usr/bin:/bin")
@example(name="OMP_NUM_THREADS", value="8")
@example(name="NCCL_SOCKET_IFNAME", value="^lo,docker0")
def test_ordinary_values_are_untouched(name: str, value: str) -> None:
    """An ordinary name with a value that embeds no URL or key=value pair is shown as is."""
    assume("=" not in value and "://" not in value)
    assert redact(name, value) == value


@given(
    name=st.sampled_from(["SERVICE_URL", "ENDPOINT", "MY_CACHE", "X", "BROKER_URI", "STORE"]),
    scheme=st.sampled_from(["postgres", "postgresql+psycopg2", "redis", "mongodb+srv", "https", "amqp", "s3"]),
    user=st.text(string.ascii_letters + string.digits + "._-", max_size=10),
    secret=secrets,
    host=st.sampled_from(["db.example.com", "10.0.0.1:5432", "[::1]:6379", "h"]),
    rest=st.sampled_from(["", "/", "/db", "/db?sslmode=require", "/0#frag", "/a/b?x=1&y=2"]),
)
@example(name="X", scheme="postgres", user="u", secret="p@ss/w:rd?#x", host="h", rest="/db")
@example(name="X", scheme="postgres", user="A", secret="//000000", host="h", rest="")  # "A://" read as a scheme
@example(name="X", scheme="postgres", user="_a.b", secret="//pw", host="h", rest="/db")
def test_a_url_password_never_shows_whatever_the_name(name: str, scheme: str, user: str, secret: str, host: str,
                                                      rest: str) -> None:
    """scheme://user:PASSWORD@host/...: only the password is masked; scheme, user, host and path stay readable."""
    assume("://" not in secret and secret not in f"{scheme}://{user}:{MASK}@{host}{rest}")
    value = f"{scheme}://{user}:{secret}@{host}{rest}"
    shown = redact(name, value)
    assert secret not in shown
    assert shown == f"{scheme}://{user}:{MASK}@{host}{rest}"


@given(secret=secrets, other=secrets)
def test_each_url_of_a_list_or_a_sentence_is_masked(secret: str, other: str) -> None:
    """Several URLs in one value (a list, a command line): every password is masked."""
    assume("://" not in secret + other and secret not in other and other not in secret)
    value = f"--primary redis://:{secret}@h1:6379/0,redis://u:{other}@h2 --x 1"
    shown = redact_value(value)
    assert secret not in shown and other not in shown
    assert "@h1:6379/0," in shown and "@h2 --x 1" in shown


@given(
    key=st.sampled_from(["Password", "password", "PWD", "pwd", "Passwd", "AccountKey", "token", "api_key",
                         "client_secret", "sslpassword", "SharedAccessKey", "X-Amz-Signature", "--db-password"]),
    secret=st.text(string.ascii_letters + string.digits + "!#$%()*+-./:<=>?@[]^_|~", min_size=8, max_size=40),
    style=st.sampled_from(["ado", "libpq", "query", "flag"]),
)
@example(key="Password", secret="abc=def==", style="ado")
def test_a_connection_string_password_never_shows(key: str, secret: str, style: str) -> None:
    """`Password=...;` (ADO/ODBC), `password=... ` (libpq), `?token=...&` (URL query), `--x-password=...`."""
    assume(secret not in f"Server=tcp:db,1433;User ID=sa;{key}=;Encrypt=True https://h/p?user=u&x=1 dbname=d{MASK}")
    value = {
        "ado": f"Server=tcp:db,1433;User ID=sa;{key}={secret};Encrypt=True",
        "libpq": f"host=db user=u {key}={secret} dbname=d",
        "query": f"https://h/p?user=u&{key}={secret}&x=1",
        "flag": f"{key}={secret}",
    }[style]
    shown = redact_value(value)
    assert secret not in shown
    assert f"{key}={MASK}" in shown
    assert shown.replace(f"{key}={MASK}", "") == value.replace(f"{key}={secret}", "")  # the rest is kept


@given(quote=st.sampled_from(['"', "'"]), secret=st.text(string.printable, min_size=8, max_size=40))
def test_a_quoted_connection_string_password_never_shows(quote: str, secret: str) -> None:
    """A quoted value may hold ; = and spaces; a doubled quote is an escaped one."""
    escaped = secret.replace(quote, quote * 2)
    shown = redact_value(f"Server=db;Password={quote}{escaped}{quote};Database=x")
    assert shown == f"Server=db;Password={quote}{MASK}{quote};Database=x"


@given(st.text(max_size=300))
@settings(max_examples=300)
def test_any_text_is_redacted_without_error_and_idempotently(text: str) -> None:
    """Whatever the value, redaction returns a string, and redacting again changes nothing."""
    once = redact_value(text)
    assert redact_value(once) == once


def test_argv_hides_the_value_after_a_secret_flag() -> None:
    """`--token X` hides X; `--token=X`, URL passwords in args are masked; other args are kept."""
    argv = ["python", "-u", "train.py", "--hf-token", "hf_abc", "--api-key=k3y", "--lr", "0.1",
            "--db", "postgres://u:pw@h/db"]
    assert redact_argv(argv) == ["python", "-u", "train.py", "--hf-token", MASK, f"--api-key={MASK}", "--lr", "0.1",
                                 "--db", f"postgres://u:{MASK}@h/db"]


def test_spec_for_disk_masks_env_args_and_endpoints() -> None:
    """spec.json: env by name and by value, entrypoint args and etcd endpoints by value; names are not secrets."""
    spec = JobSpec(
        name="j",
        entrypoint=Entrypoint(script="t.py", args=("--token", "tok-123456", "--url=https://u:pw-654321@h")),
        env=(("HF_TOKEN", "hf_abcdef"), ("CACHE", "redis://:rp-987654@c:6379"), ("OMP_NUM_THREADS", "4"),
             ("DSN_HOST", "h")),
        rendezvous=Rendezvous(backend="etcd", endpoints=("http://root:ep-112233@e1:2379",),
                              auth=Auth(user="root", password_env="ETCD_PASSWORD")),
    )
    disk = spec_for_disk(spec)
    text = json.dumps(disk)
    for secret in ("tok-123456", "pw-654321", "hf_abcdef", "rp-987654", "ep-112233"):
        assert secret not in text
    assert disk["env"]["OMP_NUM_THREADS"] == "4" and disk["env"]["CACHE"] == f"redis://:{MASK}@c:6379"
    assert disk["env"]["HF_TOKEN"] == MASK
    assert disk["rendezvous"]["auth"] == {"user": "root", "password_env": "ETCD_PASSWORD", "password_file": None}
    assert disk["entrypoint"]["script"] == "t.py"
    assert list(disk) == list(spec.to_dict())  # same fields, same order


def test_events_are_redacted_by_key_and_value() -> None:
    """redact_event (a structlog processor): secret-named fields masked, URL passwords masked, the rest kept."""
    event = {"event": "x", "token": "abc123", "url": "https://u:pw123456@h", "n": 3,
             "nested": {"password": "zz9999", "ranks": [0, 1], "args": ["--secret", "qq8888"]}}
    shown = redact_event(None, "info", event)
    assert shown == {"event": "x", "token": MASK, "url": f"https://u:{MASK}@h", "n": 3,
                     "nested": {"password": MASK, "ranks": [0, 1], "args": ["--secret", MASK]}}
    assert redact_data(("a", "b")) == ["a", "b"]


@pytest.mark.parametrize(("key", "value", "secret"), [
    ("HF_TOKEN", "x", True), ("CACHE", "redis://:pw@h", True), ("CONN", "Server=s;Password=p", True),
    ("CACHE", "redis://h:6379", False), ("OMP_NUM_THREADS", "4", False), ("HF_TOKEN", MASK, False),
])
def test_has_secret_says_what_must_not_be_stored_in_clear(key: str, value: str, secret: bool) -> None:
    """By name or by value; a value that is already the mask holds nothing."""
    assert has_secret(key, value) is secret


@given(
    hidden=st.dictionaries(secret_names(), secrets, min_size=1, max_size=5),
    shown=st.dictionaries(st.sampled_from(ORDINARY), st.text(string.ascii_letters + string.digits + "/:._-", max_size=20),
                          max_size=5),
)
def test_spec_json_never_holds_a_secret_named_value(hidden: dict[str, str], shown: dict[str, str]) -> None:
    """Whatever the mix of secret and ordinary variables, spec.json masks the first and keeps the second verbatim."""
    assume(not set(hidden) & set(shown))
    disk = spec_for_disk(JobSpec(name="j", entrypoint=Entrypoint(script="t.py"),
                                 env=tuple({**hidden, **shown}.items())))
    assert {k: v for k, v in disk["env"].items() if k in shown} == shown
    assert all(disk["env"][k] == MASK for k in hidden)
