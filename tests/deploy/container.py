"""A Debian 12 container with a real systemd, for tests that run the deploy path for real.

The root file system comes from Debian's packages (``debootstrap --variant=minbase``) and is
cached outside the repository under ``/var/cache/ldp-telemetry/`` (``$LDP_CONTAINER_CACHE``),
keyed by the suite, the mirror and the package list, so only the first run downloads it.
``systemd-nspawn --boot --volatile=overlay`` boots it with every change in a tmpfs on top,
so each run starts from the same tree and the cache is never written by a test. The
container has its own network namespace (``--private-network``: loopback only), so the
broker's and the collector's fixed ports cannot collide with anything on the host.

The host is not booted with systemd, so ``machinectl`` cannot reach the container
(``--register=no``); commands run in it through ``nsenter`` into the namespaces of its PID 1.
Python packages reach it as wheels that pip downloaded from PyPI on the host, cached the same
way and installed offline in the container (``deploy/install.sh --wheels``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "PACKAGES",
    "BootError",
    "Container",
    "cache_dir",
    "missing_tools",
    "rootfs",
    "wheelhouse",
]

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-venv",
    "mosquitto",  # also brings mosquitto_passwd (deploy/make-broker-users.sh)
    "openssl",  # deploy/make-test-ca.sh
    "procps",
)
TOOLS = ("systemd-nspawn", "debootstrap", "nsenter")
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BootError(Exception):
    """The container could not be built, booted or reached; the message says which step."""


def cache_dir() -> Path:
    return Path(os.environ.get("LDP_CONTAINER_CACHE", "/var/cache/ldp-telemetry"))


def missing_tools() -> list[str]:
    """The host tools this module needs that are not installed (Debian: systemd-container, debootstrap)."""
    return [t for t in TOOLS if shutil.which(t) is None]


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise builders of one cache entry (two test sessions may start at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _configure(root: Path) -> None:
    """What the Debian installer would have set up and debootstrap does not."""
    # debootstrap writes no /etc/hosts, and minbase has no nss-myhostname: without this,
    # "localhost" (the name the test broker certificate carries) does not resolve.
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    (root / "etc/hostname").write_text("ldp-deploy\n")
    subprocess.run(["chroot", str(root), "apt-get", "clean"], stdout=subprocess.DEVNULL, check=False, timeout=120)


def rootfs(log: Path) -> Path:
    """The cached root file system, debootstrapped on first use (output appended to ``log``)."""
    cache = cache_dir()
    dest = cache / f"rootfs-{SUITE}-{_key(SUITE, MIRROR, *PACKAGES)}"
    if (dest / ".complete").exists():
        return dest
    with _locked(cache / ".rootfs.lock"):
        if (dest / ".complete").exists():
            return dest
        build = cache / f".build-{dest.name}"
        shutil.rmtree(build, ignore_errors=True)
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(build),
            MIRROR,
        ]
        with log.open("ab") as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=1800, check=False)
        if done.returncode != 0:
            shutil.rmtree(build, ignore_errors=True)
            raise BootError(f"debootstrap exited with {done.returncode}; its output is in {log}")
        _configure(build)
        (build / ".complete").write_text(" ".join(PACKAGES) + "\n", encoding="utf-8")
        shutil.rmtree(dest, ignore_errors=True)
        build.rename(dest)
    return dest


def wheelhouse(pyproject: Path, log: Path) -> Path:
    """Wheels of the project's dependencies, its ``[collector]`` extra's (the collector role
    installs it) and its build backend, downloaded from PyPI once.

    The host and the container are the same Debian release and Python minor version, so the
    host's pip picks the wheels the container can install.
    """
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    requirements = [
        *project["build-system"]["requires"],
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["collector"],
    ]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    dest = cache_dir() / f"wheels-{tag}-{_key(*requirements)}"
    if (dest / ".complete").exists():
        return dest
    with _locked(cache_dir() / ".wheels.lock"):
        if (dest / ".complete").exists():
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(dest)]
        with log.open("ab") as out:
            done = subprocess.run([*cmd, *requirements], stdout=out, stderr=subprocess.STDOUT, timeout=900, check=False)
        if done.returncode != 0:
            raise BootError(f"pip download exited with {done.returncode}; its output is in {log}")
        (dest / ".complete").write_text("\n".join(requirements) + "\n", encoding="utf-8")
    return dest


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The second field (comm) may contain spaces: the parent id follows its closing ')'.
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


class Container:
    """One container: :meth:`boot` it, :meth:`run` scripts in it, :meth:`halt` it.

    Args:
        root: the root file system (mounted read-only under a tmpfs overlay).
        name: the machine name (the container's host name).
        console: where systemd-nspawn writes the container's console.
        binds: (host path, container path, read-only) bind mounts.
    """

    def __init__(self, root: Path, name: str, console: Path, binds: Sequence[tuple[Path, str, bool]] = ()) -> None:
        self.root = root
        self.name = name
        self.console = console
        self.binds = list(binds)
        self._proc: subprocess.Popen[bytes] | None = None
        self.pid1 = 0

    def boot(self, timeout: float = 120.0) -> None:
        """Start systemd-nspawn and wait until the container's systemd finished booting."""
        cmd = [
            "systemd-nspawn",
            f"--directory={self.root}",
            "--volatile=overlay",
            "--boot",
            "--register=no",
            "--keep-unit",
            "--private-network",
            f"--machine={self.name}",
            "--console=read-only",
        ]
        for host, inside, read_only in self.binds:
            cmd.append(f"--bind{'-ro' if read_only else ''}={host}:{inside}")
        out = self.console.open("ab")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + timeout
        while not self.pid1:
            self._check_alive()
            for child in _children(self._proc.pid):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{child}/ns/pid") != os.readlink("/proc/self/ns/pid"):
                        self.pid1 = child
            if time.monotonic() > deadline:
                raise BootError(f"no container process appeared within {timeout:.0f} s; console: {self.console}")
            time.sleep(0.2)
        while True:
            self._check_alive()
            state = self.run("systemctl is-system-running --wait", timeout=max(1.0, deadline - time.monotonic()))
            if state.stdout.strip() in ("running", "degraded"):
                return
            if time.monotonic() > deadline:
                raise BootError(f"systemd did not finish booting: {state.stdout.strip()!r}; console: {self.console}")
            time.sleep(0.5)

    def _check_alive(self) -> None:
        assert self._proc is not None
        if self._proc.poll() is not None:
            tail = self.console.read_text(errors="replace")[-3000:]
            raise BootError(f"systemd-nspawn exited with {self._proc.returncode} while booting:\n{tail}")

    def run(self, script: str, *, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run a shell script in the container as root, in its namespaces, with a clean environment."""
        if not self.pid1:
            raise BootError("the container is not running")
        cmd = ["nsenter", f"--target={self.pid1}", "--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd"]
        env = ["/usr/bin/env", "-i", f"PATH={CONTAINER_PATH}", "HOME=/root", "LANG=C.UTF-8", "SYSTEMD_PAGER="]
        try:
            return subprocess.run(
                [*cmd, "--", *env, "/bin/sh", "-ec", script],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(e.cmd, 124, str(e.stdout or ""), f"timed out after {timeout:.0f} s")

    def halt(self, timeout: float = 60.0) -> None:
        """Power the container off (systemd-nspawn turns SIGTERM into a clean shutdown)."""
        proc, self._proc = self._proc, None
        self.pid1 = 0
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
