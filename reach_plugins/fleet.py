"""``reach up FILE``: a whole local fleet in one command, as the seeds draw it, on 127.0.0.1 and free ports.

A fleet file names a config (tenants and agent descriptors), the agents to run
(a script and a number of instances each), the gateway's workers and whether a
node runs. :class:`Fleet` starts, in order: etcd secured as the README's
security model describes (TLS with client certificates, authentication on, the
role layout: an operator writes descriptors, each agent's user writes only its
own instances, gateways and nodes only read), Redis (the workers' shared dedup
store), the operator's load of the descriptors, the agent instances
(registering themselves), the gateway and the node. Each waits for the one
before to answer. Certificates, etcd's data, tenant tokens and every process's
log go under the fleet's state folder. :meth:`Fleet.down` stops everything in
reverse order (SIGTERM, SIGKILL after a grace).

Tenant tokens (and their credentials' secrets) come from the environment when
set there; otherwise each gets a random one, written to ``tokens.env`` (mode
0600) in the state folder.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from reach_plugins.config.loader import load_config
from reach_plugins.endpoints import EndpointPolicy
from reach_plugins.errors import BackendUnavailable, ConfigError
from reach_plugins.registry import open_registry
from reach_plugins.security.keys import ENV_KEYS, SigningKey

WAIT: Final = 60.0
"""Seconds each process may take to answer after its start."""
GRACE: Final = 10.0
"""Seconds a process has to stop after SIGTERM before it is killed."""
CLI: Final = "from reach_plugins.cli import main; main()"
ETCD_USERS: Final = ("root", "reach-operator", "reach-gateway")


@dataclass(frozen=True)
class AgentSpec:
    """An agent of the fleet: its name (as the config describes it), the script serving it, how many instances."""

    name: str
    script: Path
    instances: int


@dataclass(frozen=True)
class FleetSpec:
    """A fleet file, its paths resolved against the file's folder."""

    config: Path
    state: Path
    agents: tuple[AgentSpec, ...]
    workers: int = 1
    node: bool = True


def load_fleet(path: Path) -> FleetSpec:
    """The fleet file at ``path`` (``ConfigError`` naming the key for anything it cannot use)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the fleet file: {exc}") from None
    if not isinstance(doc, dict) or "config" not in doc or not isinstance(doc.get("agents"), dict):
        raise ConfigError(f"{path}: a fleet file has 'config: FILE' and 'agents: {{NAME: {{script, instances}}}}'")
    unknown = set(doc) - {"config", "state", "agents", "gateway", "node"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}; use config, state, agents, gateway, node")
    base = path.resolve().parent
    agents = []
    for name, body in doc["agents"].items():
        if not isinstance(body, dict) or "script" not in body:
            raise ConfigError(f"{path}: agents.{name} needs 'script: PATH' (and 'instances: N', default 1)")
        instances = body.get("instances", 1)
        if not isinstance(instances, int) or instances < 1:
            raise ConfigError(f"{path}: agents.{name}.instances must be a whole number of at least 1")
        agents.append(AgentSpec(str(name), base / str(body["script"]), instances))
    gateway = doc.get("gateway") or {}
    workers = gateway.get("workers", 1) if isinstance(gateway, dict) else 0
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"{path}: gateway.workers must be a whole number of at least 1")
    return FleetSpec(
        config=base / str(doc["config"]),
        state=(base / str(doc.get("state", ".reach-fleet"))).resolve(),
        agents=tuple(agents),
        workers=workers,
        node=bool(doc.get("node", True)),
    )


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class _Running:
    what: str
    process: subprocess.Popen[bytes]
    where: str


@dataclass
class Fleet:
    """The processes of one fleet: :meth:`up` starts them (and says where each listens), :meth:`down` stops them."""

    spec: FleetSpec
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    running: list[_Running] = field(default_factory=list)

    @property
    def tls(self) -> Path:
        return self.spec.state / "tls"

    def _log(self, name: str) -> Any:
        return (self.spec.state / "logs" / f"{name}.log").open("ab")

    def _start(self, what: str, command: list[str], where: str, env: Mapping[str, str], port: int) -> None:
        """Start ``command``, logging to its own file, and wait until ``port`` accepts connections."""
        with self._log(what) as log:
            process = subprocess.Popen(command, env=dict(env), stdout=log, stderr=subprocess.STDOUT)
        self.running.append(_Running(what, process, where))
        end = time.monotonic() + WAIT
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > end:
                log_file = self.spec.state / "logs" / f"{what}.log"
                raise BackendUnavailable(f"{what} did not start (see {log_file}): {_tail(log_file)}")
            time.sleep(0.05)

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.tls)

    def _certificate(self, name: str, *, server: bool = False) -> None:
        """A P-256 key and certificate of the fleet's CA for ``name`` (its CN: the etcd user it authenticates as)."""
        extensions = self.tls / f"{name}.ext"
        usage = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth" if server else ""
        extensions.write_text(usage or "extendedKeyUsage=clientAuth")
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}"]
        self._openssl("req", "-new", *key, "-keyout", f"{name}-key.pem", "-out", f"{name}.csr")
        sign = ["-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial", "-days", "7"]
        self._openssl("x509", "-req", "-in", f"{name}.csr", *sign, "-extfile", extensions.name, "-out", f"{name}.pem")
        (self.tls / f"{name}.csr").unlink()
        extensions.unlink()

    def _pki(self) -> None:
        self.tls.mkdir(parents=True)
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        self._openssl(
            "req", "-x509", *key, "-days", "7", "-subj", "/CN=reach-fleet-ca", "-keyout", "ca-key.pem", "-out", "ca.pem"
        )
        self._certificate("server", server=True)
        for user in (*ETCD_USERS, *(f"reach-agent-{agent.name}" for agent in self.spec.agents)):
            self._certificate(user)
        for pem in self.tls.glob("*-key.pem"):
            pem.chmod(0o600)

    def registry_url(self, port: int, user: str) -> str:
        """The registry URL of the fleet's etcd presenting ``user``'s certificate (its CN is the etcd user)."""
        tls = self.tls
        return f"etcd://127.0.0.1:{port}/reach/?ca={tls}/ca.pem&cert={tls}/{user}.pem&key={tls}/{user}-key.pem"

    def _etcdctl(self, port: int, *args: str) -> None:
        tls = self.tls
        command = ["etcdctl", f"--endpoints=https://127.0.0.1:{port}", f"--cacert={tls}/ca.pem"]
        command += [f"--cert={tls}/root.pem", f"--key={tls}/root-key.pem", *args]
        subprocess.run(command, check=True, capture_output=True, env={**self.environ, "ETCDCTL_API": "3"})

    def _etcd(self) -> int:
        """Start etcd with TLS and client certificates, apply the README's role layout, turn authentication on."""
        port, peer = free_port(), free_port()
        tls = self.tls
        command = ["etcd", "--name", "reach-fleet", "--data-dir", str(self.spec.state / "etcd")]
        command += ["--listen-client-urls", f"https://127.0.0.1:{port}"]
        command += ["--advertise-client-urls", f"https://127.0.0.1:{port}"]
        command += ["--listen-peer-urls", f"http://127.0.0.1:{peer}"]
        command += ["--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"]
        command += ["--initial-cluster", f"reach-fleet=http://127.0.0.1:{peer}"]
        command += ["--cert-file", f"{tls}/server.pem", "--key-file", f"{tls}/server-key.pem"]
        command += ["--trusted-ca-file", f"{tls}/ca.pem", "--client-cert-auth"]
        self._start("etcd", command, f"https://127.0.0.1:{port} (TLS, client certificates, auth)", self.environ, port)
        layout = [
            ("user", "add", "root", "--no-password"),
            ("user", "grant-role", "root", "root"),
            ("role", "add", "reach-reader"),
            ("role", "grant-permission", "reach-reader", "--prefix=true", "read", "/reach/"),
            ("role", "add", "reach-operator"),
            ("role", "grant-permission", "reach-operator", "--prefix=true", "readwrite", "/reach/"),
            ("user", "add", "reach-operator", "--no-password"),
            ("user", "grant-role", "reach-operator", "reach-operator"),
            ("user", "add", "reach-gateway", "--no-password"),
            ("user", "grant-role", "reach-gateway", "reach-reader"),
        ]
        for agent in self.spec.agents:
            role = f"reach-agent-{agent.name}"
            layout += [
                ("role", "add", role),
                ("role", "grant-permission", role, "--prefix=true", "readwrite", f"/reach/instances/{agent.name}/"),
                ("user", "add", role, "--no-password"),
                ("user", "grant-role", role, "reach-reader"),
                ("user", "grant-role", role, role),
            ]
        for step in [*layout, ("auth", "enable")]:
            self._etcdctl(port, *step)
        return port

    def _tokens(self) -> dict[str, str]:
        """The tenants' secrets (each ``token_env``, each credential's ``value_env``): from the environment, or
        random ones made now and written to tokens.env (a local fleet's agents check none of them but the tokens)."""
        tenants = load_config(self.spec.config).tenants
        names = [tenant.token_env for tenant in tenants.values()]
        names += [ref.value_env for tenant in tenants.values() for ref in tenant.credentials.values()]
        made = {name: secrets.token_urlsafe(24) for name in names if name and not self.environ.get(name)}
        if made:
            path = self.spec.state / "tokens.env"
            path.write_text("".join(f"export {name}={value}\n" for name, value in made.items()))
            path.chmod(0o600)
        return made

    async def _load_descriptors(self, url: str) -> None:
        """As the operator: upsert the descriptors of the fleet's agents (agents register only under one); their
        instances are the ones the fleet starts, which register themselves."""
        names = {agent.name for agent in self.spec.agents}
        endpoints = EndpointPolicy.from_environ(self.environ)
        descriptors = load_config(self.spec.config, endpoints=endpoints).agents
        unknown = names - {descriptor.name for descriptor in descriptors}
        if unknown:
            raise ConfigError(f"agents {sorted(unknown)} of the fleet file are not described in {self.spec.config}")
        registry = open_registry(url, endpoints=endpoints)
        try:
            for descriptor in descriptors:
                if descriptor.name in names:  # without the config's static endpoints: the instances run here
                    await registry.register_agent(descriptor.model_copy(update={"endpoints": [], "instances": []}))
        finally:
            await registry.aclose()

    def up(self) -> list[tuple[str, str]]:
        """Start the fleet (``BackendUnavailable`` naming the process that did not start, after stopping the rest);
        what runs and where it listens, in start order."""
        missing = [binary for binary in ("etcd", "etcdctl", "redis-server", "openssl") if not shutil.which(binary)]
        if missing:
            raise ConfigError(
                f"reach up needs {', '.join(missing)}: apt-get install etcd-server etcd-client redis-server openssl"
            )
        if self.spec.state.exists():
            shutil.rmtree(self.spec.state)
        (self.spec.state / "logs").mkdir(parents=True)
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return [(running.what, running.where) for running in self.running]

    def _up(self) -> None:
        self._pki()
        etcd = self._etcd()
        redis = free_port()
        command = ["redis-server", "--port", str(redis), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self._start(
            "redis", [*command, "--dir", str(self.spec.state)], f"redis://127.0.0.1:{redis}/0", self.environ, redis
        )
        asyncio.run(self._load_descriptors(self.registry_url(etcd, "reach-operator")))
        env = {**self.environ, **self._tokens(), ENV_KEYS: SigningKey.generate().pem().decode()}
        for agent in self.spec.agents:
            url = self.registry_url(etcd, f"reach-agent-{agent.name}")
            for number in range(agent.instances):
                port = free_port()
                command = [sys.executable, str(agent.script), "--port", str(port), "--registry", url]
                self._start(f"{agent.name}-{number}", command, f"http://127.0.0.1:{port}", env, port)
        reader = self.registry_url(etcd, "reach-gateway")
        served = ["--config", str(self.spec.config), "--registry", reader]
        port = free_port()
        command = [
            sys.executable,
            "-c",
            CLI,
            "gateway",
            *served,
            "--port",
            str(port),
            "--workers",
            str(self.spec.workers),
        ]
        command += ["--dedup-store", f"redis://127.0.0.1:{redis}/0"]
        self._start("gateway", command, f"http://127.0.0.1:{port} ({self.spec.workers} workers)", env, port)
        if self.spec.node:
            port = free_port()
            command = [sys.executable, "-c", CLI, "node", *served, "--port", str(port)]
            self._start("node", command, f"grpc://127.0.0.1:{port}", env, port)

    def down(self) -> None:
        """Stop every process, the last started first: SIGTERM, then SIGKILL after :data:`GRACE` seconds."""
        while self.running:
            process = self.running.pop().process
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(GRACE)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
