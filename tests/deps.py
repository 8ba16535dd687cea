"""What the test suite needs beyond the Python packages, in one table: `make test` installs it first.

Run as a script (standard library only, before any venv exists) it is the bootstrap behind
`make deps`: every missing Debian program (and library source: the Go example builds from Debian's
Go packages) is installed with apt-get when we are root or have
password-less sudo, and every npm lock newer than its install is re-installed with `npm ci`.
Without the privileges it prints one message naming what is missing and the exact command, and
exits 1, so `make test` stops there.

Imported by the tests, :func:`require` turns a missing program into a test *failure* carrying the
same install hint: the suite never skips because a part is missing.

    python3 tests/deps.py            # install what is missing (idempotent; fast when all is there)
    python3 tests/deps.py --check    # install nothing: report what is missing, exit 1 if anything is
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


_POSTGRES_BIN = ("/usr/lib/postgresql/*/bin",)
_GO_USE = "the Go example sidecar (examples/go, tests/e2e/go)"
_SNIPPETS = "proto/README.md's protoc lines (tests/e2e/go/test_protoc_snippets.py)"


@dataclass(frozen=True)
class Program:
    """A program the tests start themselves, and the Debian package that ships it."""

    name: str
    package: str | None
    used_by: str
    manual: str = ""
    """How to install a program that no Debian package ships in a usable version."""
    search: tuple[str, ...] = ()
    """Folders (glob patterns) to look in after PATH, for packages that install off PATH."""


PROGRAMS = (
    Program("redis-server", "redis-server", "the response cache's Redis backend (tests/e2e/builtins)"),
    Program("prometheus", "prometheus", "the scrape test (tests/e2e/service/test_prometheus.py)"),
    Program("node", "nodejs", "the Node SDK and cross-language tests (tests/e2e/node)"),
    Program("npm", "npm", "installing the Node SDK's and @mastra/client-js's packages"),
    # Debian's kubernetes-client is 1.20, without a usable built-in kustomize; this machine image ships 1.32.
    Program(
        "kubectl",
        None,
        "rendering the kustomize overlays (tests/deploy, tests/e2e/test_pod.py)",
        manual="install kubectl 1.27 or newer (its built-in kustomize renders deploy/k8s)",
    ),
    # Debian installs PostgreSQL's server programs under /usr/lib/postgresql/<version>/bin, off PATH;
    # the memory tests start a private server from them (initdb, then postgres on a unix socket).
    *(
        Program(
            name,
            "postgresql",
            "the PostgreSQL memory store's tests (tests/integration/memory, tests/e2e/memory)",
            search=_POSTGRES_BIN,
        )
        for name in ("initdb", "pg_ctl", "postgres")
    ),
    # The Go example sidecar (examples/go/build.sh): stubs generated from proto/, built offline.
    Program("go", "golang-go", _GO_USE),
    Program("protoc", "protobuf-compiler", _GO_USE),
    Program("protoc-gen-go", "protoc-gen-go", _GO_USE),
    Program("protoc-gen-go-grpc", "protoc-gen-go-grpc", _GO_USE),
    # proto/README.md's protoc lines for C++ and Java, run by tests/e2e/go/test_protoc_snippets.py;
    # libgrpc++-dev (headers and pkg-config files) brings pkg-config-able gRPC for the C++ compile.
    Program("grpc_cpp_plugin", "protobuf-compiler-grpc", _SNIPPETS),
    Program("pkg-config", "pkgconf", _SNIPPETS),
    Program("grpc_java_plugin", "protobuf-compiler-grpc-java-plugin", _SNIPPETS),
    Program("g++", "g++", _SNIPPETS),
    # Debian's prometheus package ships promtool: the alert rules' checks and unit tests.
    Program("promtool", "prometheus", "the alert rules' checks (tests/deploy/test_alert_rules.py)"),
)


@dataclass(frozen=True)
class Source:
    """Library sources a build reads (Debian's Go packages install them), and their package."""

    path: str
    """A file that exists once the package is installed."""
    package: str
    used_by: str

    @property
    def name(self) -> str:
        return f"{self.package} ({self.path})"


_GOCODE = "/usr/share/gocode/src"
SOURCES = (
    Source(f"{_GOCODE}/google.golang.org/grpc/server.go", "golang-google-grpc-dev", _GO_USE),
    # grpc-dev depends on "golang-github-golang-protobuf-1-3-dev | ...-1-5-dev", and apt takes the
    # first: the 1.3 runtime, which panics at the first RPC of stubs from today's protoc-gen-go.
    # Naming 1-5 in the same apt-get command picks it; registry.go exists only from 1.4 on.
    Source(
        f"{_GOCODE}/github.com/golang/protobuf/proto/registry.go",
        "golang-github-golang-protobuf-1-5-dev",
        _GO_USE,
    ),
    Source("/usr/include/grpcpp/grpcpp.h", "libgrpc++-dev", _SNIPPETS),
)

# Directories holding an npm lock whose packages the tests load (`npm ci` there).
NPM_DIRS = (REPO / "sdk" / "node", REPO / "tests" / "clientjs")


def which(name: str) -> str | None:
    """The program's path: on PATH, else in the table's search folders (the newest version first)."""
    found = shutil.which(name)
    if found is not None:
        return found
    program = next((p for p in PROGRAMS if p.name == name), None)
    for pattern in program.search if program else ():
        for folder in sorted(glob.glob(pattern), key=_version_key, reverse=True):
            found = shutil.which(name, path=folder)
            if found is not None:
                return found
    return None


def _version_key(folder: str) -> tuple[int, ...]:
    """/usr/lib/postgresql/15/bin sorts by 15, numerically (so 10 comes after 9)."""
    return tuple(int(part) for part in Path(folder).parts if part.isdigit())


def missing_programs() -> list[Program]:
    """The table's programs that are not on PATH."""
    return [p for p in PROGRAMS if which(p.name) is None]


def missing_sources() -> list[Source]:
    """The table's library sources that are not installed."""
    return [s for s in SOURCES if not Path(s.path).exists()]


def require_sources() -> None:
    """Fail the calling test with the install hint when a library source of the table is missing."""
    missing = missing_sources()
    if missing:
        import pytest

        names = ", ".join(s.name for s in missing)
        command = install_command(sorted({s.package for s in missing}))
        pytest.fail(
            f"not installed ({missing[0].used_by}): {names}: `{command}` -- or run `make deps`", pytrace=False
        )


def install_command(packages: list[str]) -> str:
    """The exact command a user runs to install `packages`."""
    prefix = "" if _is_root() else "sudo "
    names = " ".join(packages)
    return f"{prefix}apt-get update && {prefix}apt-get install -y {names}"


def how_to_install(program: Program) -> str:
    """The command (or, for a program outside Debian, the instruction) that installs `program`."""
    return f"`{install_command([program.package])}`" if program.package else program.manual


def hint(program: Program) -> str:
    """One line: what is missing, what needs it, and how to install it."""
    return f"{program.name} is not installed ({program.used_by}): {how_to_install(program)}"


def require(name: str) -> str:
    """The path of program `name`, or fail the calling test with its install hint (never a skip)."""
    path = which(name)
    if path is None:
        import pytest  # only the tests import this function; the script runs without pytest

        program = next(p for p in PROGRAMS if p.name == name)
        pytest.fail(hint(program) + " -- or run `make deps`", pytrace=False)
    return path


def require_npm_packages(folder: Path) -> None:
    """Fail the calling test, with the command to run, when `folder`'s npm packages are not installed."""
    if folder in stale_npm_dirs():
        import pytest

        pytest.fail(
            f"the npm packages of {folder.relative_to(REPO)} are not installed or older than its lock: "
            f"run `npm ci --prefix {folder}` -- or `make deps`",
            pytrace=False,
        )


def stale_npm_dirs() -> list[Path]:
    """npm projects whose lock is newer than their last `npm ci` (or never installed)."""
    stale = []
    for folder in NPM_DIRS:
        done = folder / "node_modules" / ".package-lock.json"
        if not done.exists() or done.stat().st_mtime < (folder / "package-lock.json").stat().st_mtime:
            stale.append(folder)
    return stale


def _is_root() -> bool:
    return os.geteuid() == 0


def _can_sudo() -> bool:
    if shutil.which("sudo") is None:
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False).returncode == 0


def _apt_install(packages: list[str]) -> None:
    sudo = [] if _is_root() else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], check=True, env=env
    )


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    missing: list[Program | Source] = [*missing_programs(), *missing_sources()]
    if missing:
        packages = sorted({p.package for p in missing if p.package})
        manual = [p for p in missing if isinstance(p, Program) and p.package is None]
        if manual or check_only or not (_is_root() or _can_sudo()):
            print("make deps: the test suite needs programs that are not installed:", file=sys.stderr)
            for program in missing:
                print(f"  - {program.name}: {program.used_by}", file=sys.stderr)
            if packages:
                print(f"install them with:\n  {install_command(packages)}", file=sys.stderr)
            for program in manual:
                print(f"and {program.manual}", file=sys.stderr)
            if packages and not check_only and not manual:
                print("(you are not root and sudo needs a password, so make deps cannot)", file=sys.stderr)
            return 1
        print(f"make deps: apt-get install {' '.join(packages)}", flush=True)
        _apt_install(packages)
        still: list[Program | Source] = [*missing_programs(), *missing_sources()]
        if still:
            print(
                f"make deps: still missing after apt-get: {', '.join(p.name for p in still)}", file=sys.stderr
            )
            return 1
    stale = stale_npm_dirs()
    if stale and check_only:
        for folder in stale:
            print(f"make deps: npm packages not installed: run `npm ci --prefix {folder}`", file=sys.stderr)
        return 1
    for folder in stale:
        print(f"make deps: npm ci --prefix {folder.relative_to(REPO)}", flush=True)
        subprocess.run(
            ["npm", "ci", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error"], check=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
