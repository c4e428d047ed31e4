"""runner/config/cluster_checks.py: the endpoint classification (property tests: any form of an address is classed
by the address alone, names only through the resolver) and the findings of `runner validate` and convert."""

from __future__ import annotations

import ipaddress
import subprocess
import textwrap
from pathlib import Path

from conftest import RUNNER
from hypothesis import given
from hypothesis import strategies as st

from runner.config.cluster_checks import Reach, classify, endpoint_host, validate_warnings
from runner.config.loader import load_document

NO_DNS = lambda _: ()  # noqa: E731 - a resolver that knows no name
ports = st.integers(min_value=1, max_value=65535)
v4 = st.ip_addresses(v=4)
v6 = st.ip_addresses(v=6)
labels = st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True).filter(lambda s: not s.endswith("-"))


def forms(host: str, port: int) -> list[str]:
    """Every way a spec may write host:port (IPv6 in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return [f"{shown}:{port}", f"http://{shown}:{port}", f"https://{shown}:{port}/", f" {shown}:{port} "]


def expected(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Reach:
    """The reach an address has, by the ipaddress module's own tests."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return Reach.LOOPBACK
    if ip.is_unspecified:
        return Reach.UNSPECIFIED
    return Reach.NETWORK


@given(st.one_of(v4, v6), ports)
def test_an_address_is_classed_by_itself_in_every_form(ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
                                                        port: int) -> None:
    """No resolver is asked about an address; loopback and unspecified ones (also v4-mapped) are this machine's."""
    def refuse(name: str) -> tuple[str, ...]:
        raise AssertionError(f"resolved {name}")

    for text in forms(str(ip), port):
        assert endpoint_host(text) == str(ip).lower()
        assert classify(text, refuse) is expected(ip)


@given(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), ports)
def test_all_of_127_is_loopback(b: int, c: int, d: int, port: int) -> None:
    """127.0.0.0/8, not only 127.0.0.1 (Debian names the host 127.0.1.1)."""
    assert classify(f"127.{b}.{c}.{d}:{port}", NO_DNS) is Reach.LOOPBACK


@given(st.lists(labels, min_size=0, max_size=3), ports, st.booleans())
def test_localhost_names_are_loopback_without_asking(parts: list[str], port: int, upper: bool) -> None:
    """localhost and *.localhost (RFC 6761), any case, trailing dot or not."""
    name = ".".join([*parts, "localhost"])
    name = name.upper() if upper else name
    for text in (f"{name}:{port}", f"{name}.:{port}"):
        assert classify(text, NO_DNS) is Reach.LOOPBACK


@given(st.lists(labels, min_size=1, max_size=3).filter(lambda p: p[-1] != "localhost"), ports,
       st.lists(st.one_of(v4, v6), min_size=0, max_size=3))
def test_a_name_is_classed_by_what_it_resolves_to(parts: list[str], port: int,
                                                   addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address]
                                                   ) -> None:
    """A name is this machine's only when every address it resolves to is; unresolved names are another's."""
    name = ".".join(parts)
    found = classify(f"{name}:{port}", lambda _: tuple(str(a) for a in addresses))
    local = {expected(a) for a in addresses} <= {Reach.LOOPBACK, Reach.UNSPECIFIED}
    assert found is (Reach.LOOPBACK_NAME if addresses and local else Reach.NETWORK)


def test_placeholders_are_never_resolved() -> None:
    """The templates' placeholders (.invalid) are not looked up (no DNS wait on a login node)."""
    def refuse(name: str) -> tuple[str, ...]:
        raise AssertionError(f"resolved {name}")

    assert classify("runner-first-node.invalid:29400", refuse) is Reach.NETWORK



def test_validate_warns_for_a_loopback_name_with_several_nodes(tmp_path: Path) -> None:
    """A name that resolves to loopback here (the hostname on Debian: 127.0.1.1) with nodes 1:2: one warning, on
    rendezvous.endpoints, naming both fixes; nodes: 1 gives none."""
    loaded, doc = load_document(textwrap.dedent("""\
        name: w
        entrypoint: {script: t.py}
        nodes: "1:2"
        rendezvous: {backend: etcd, hosted: true, endpoints: "myhost:29400"}
        """), "job.yaml", tmp_path, environ={})
    found = validate_warnings(loaded, doc, resolve=lambda _: ("127.0.1.1",))
    assert [p.path for p in found] == ["rendezvous.endpoints"]
    assert "resolves to loopback" in found[0].message and "form a job of its own" in found[0].message
    assert "--node" in found[0].fix and "RUNNER_FIRST_NODE" in found[0].fix
    assert found[0].line == 4
    one, doc1 = load_document(textwrap.dedent("""\
        name: w
        entrypoint: {script: t.py}
        rendezvous: {backend: etcd, hosted: true, endpoints: "127.0.0.1:29400"}
        """), "job.yaml", tmp_path, environ={})
    assert validate_warnings(one, doc1, resolve=NO_DNS) == []


def test_validate_cli_warns_and_exits_0(tmp_path: Path) -> None:
    """`runner validate` keeps exit 0 (the spec is right for agents on one machine) and prints the warning."""
    (tmp_path / "t.py").write_text("")
    path = tmp_path / "job.yaml"
    path.write_text('name: w\nentrypoint: {script: t.py}\nnodes: 2\nrendezvous: {backend: etcd, hosted: true, '
                    'endpoints: "127.0.0.1:29400"}\n')
    done = subprocess.run([*RUNNER, "validate", str(path)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "warning: rendezvous.endpoints: '127.0.0.1:29400' is a loopback address" in done.stderr


def test_convert_then_template_does_not_render_a_loopback_job(tmp_path: Path) -> None:
    """torchrun --nnodes 2 --rdzv-endpoint 127.0.0.1:29400: convert says so, and the template refuses it (exit 2)."""
    (tmp_path / "train.py").write_text("")
    done = subprocess.run([*RUNNER, "convert", "--", "torchrun", "--nnodes", "2",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "train.py"],
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    assert "is this machine's loopback, but --nnodes allows 2 nodes" in done.stderr
    assert "# note: rendezvous.endpoints 127.0.0.1:29400 is this machine's loopback" in done.stdout
    (tmp_path / "job.yaml").write_text(done.stdout)
    for kind in ("slurm", "kubernetes"):
        rendered = subprocess.run([*RUNNER, "template", kind, "job.yaml"], cwd=tmp_path,
                                  capture_output=True, text=True, check=False)
        assert rendered.returncode == 2, rendered.stdout
        assert "rendezvous.endpoints" in rendered.stderr and rendered.stdout == ""
