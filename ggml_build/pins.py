"""Pinned upstream releases: read the manifest, fetch the sdist, verify it, extract the tree.

Only pins are committed (``vendor/releases.toml``). The archive is downloaded once with
``pip download`` into a cache shared by every checkout on the machine, checked against its
sha256 before anything is extracted, and only the ggml tree inside it is written under
``vendor/<release>/``. A tree already extracted from a verified archive is recognised by its
stamp file, so a machine without network (the GPU machine) can build from it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildError
from .progress import human_bytes

ROOT = Path(__file__).resolve().parent.parent
#: the pins: the checkout's vendor/releases.toml; an installed package (a wheel) carries a copy
#: beside this module
MANIFEST = ROOT / "vendor" / "releases.toml"
if not MANIFEST.exists():
    MANIFEST = Path(__file__).resolve().with_name("releases.toml")
#: whether this is a source checkout (extracted trees and CMake folders go into it) or an
#: installed package (they go beside the sdist cache, never into site-packages)
CHECKOUT = (ROOT / "vendor" / "releases.toml").exists() and (ROOT / "build_ggml.py").exists()
STAMP = ".ggml_py-verified"
TESTS = "ggml_py-tests"          # folder of the extracted tree that holds test-backend-ops.cpp


@dataclass(frozen=True)
class Pin:
    release: str
    package: str
    version: str
    file: str
    sha256: str
    tree: str
    tests: str | None = None     # test-backend-ops.cpp inside the archive, where it ships one
    notes: str = ""              # what this release adds, for `build_ggml.py --list`


def load_manifest(path: Path = MANIFEST) -> tuple[str, dict[str, Pin]]:
    """Return (default release, {release: Pin})."""
    data = tomllib.loads(path.read_text())
    pins = {rel: Pin(release=rel, **fields) for rel, fields in data["releases"].items()}
    return data["default"], pins


def pin_for(release: str, path: Path = MANIFEST) -> Pin:
    _, pins = load_manifest(path)
    if release not in pins:
        known = ", ".join(sorted(pins, key=_version_key, reverse=True))
        raise BuildError(f"unknown ggml release {release!r}",
                         f"pick one of {known}, or build a local tree with --source PATH")
    return pins[release]


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


def cache_dir() -> Path:
    """Where downloaded sdists are kept: $GGML_PY_CACHE, else ~/.cache/ggml_py/sdists."""
    env = os.environ.get("GGML_PY_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ggml_py" / "sdists"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(archive: Path, pin: Pin) -> None:
    got = sha256_of(archive)
    if got != pin.sha256:
        raise BuildError(
            f"sha256 mismatch for {archive.name}: expected {pin.sha256}, got {got}",
            f"the archive is not the pinned one; delete {archive} and build again "
            f"(if upstream re-published it, update vendor/releases.toml deliberately)")


def fetch(pin: Pin, cache: Path | None = None, log=print, origin: Path | None = None) -> Path:
    """Return the verified sdist for `pin`, downloading it into the cache when missing.

    `origin` is an archive already on disk (an offline machine): it is verified and copied
    into the cache instead of downloading. Downloading uses pip (`pip download`, the machine's
    index settings); pip is declared in pyproject's build requirements, so this also works
    inside pip's isolated build environment."""
    cache = cache or cache_dir()
    archive = cache / pin.file
    if archive.exists():
        verify(archive, pin)
        return archive
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=cache, prefix=".probe-")
        probe.close()
    except OSError as e:
        raise BuildError(f"cache folder {cache} is not writable ({e.strerror})",
                         "set GGML_PY_CACHE to a writable folder") from None
    with tempfile.TemporaryDirectory(dir=cache, prefix=".dl-") as tmp:
        got = Path(tmp) / pin.file
        if origin is not None:
            origin = Path(origin)
            if origin.is_dir():
                origin = origin / pin.file
            if not origin.is_file():
                raise BuildError(f"{origin} does not exist",
                                 f"pass the downloaded {pin.file} (or the folder holding it)")
            shutil.copyfile(origin, got)
        else:
            _download(pin, Path(tmp), log)
        verify(got, pin)
        os.replace(got, archive)  # atomic: the cache never holds a half-written archive
    return archive


def _download(pin: Pin, dest: Path, log) -> None:
    """The pinned archive into `dest`: straight from the package index (the file the pin names,
    found through the index's simple API, pip's index settings), else with `pip download`.

    `pip download` of an sdist also prepares its metadata: it installs the carrying package's
    own build requirements (Cython, ...) into a fresh environment and runs its build backend,
    about 30 s here for an archive that downloads in under a second. The archive's sha256 is
    pinned, so where it came from does not matter to what gets built."""
    t0 = time.monotonic()
    log(f"download {pin.file} (carries ggml {pin.release}) from the package index")
    try:
        where = _direct_download(pin, dest)
    except (OSError, ValueError) as e:
        where = None
        log(f"direct download failed ({e}); trying pip download")
    if where is not None:
        size = (dest / pin.file).stat().st_size
        dt = max(time.monotonic() - t0, 1e-3)
        log(f"downloaded {pin.file} from {where}: "
            f"{human_bytes(size)} in {dt:.1f} s ({human_bytes(size / dt)}/s)")
        return
    _pip_download(pin, dest, log)


def _index_urls() -> list[str]:
    """pip's index and extra indexes (environment, then pip's configuration), else PyPI."""
    cfg: dict[str, str] = {}
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        key, _, val = line.partition("=")
        cfg.setdefault(key.rsplit(".", 1)[-1], val.strip().strip("'\""))
    no_index = os.environ.get("PIP_NO_INDEX") or cfg.get("no-index") or ""
    if no_index.lower() in ("1", "true", "yes", "on"):
        return []                   # pip is told to use no index: neither do we
    index = os.environ.get("PIP_INDEX_URL") or cfg.get("index-url") or "https://pypi.org/simple"
    extra = os.environ.get("PIP_EXTRA_INDEX_URL") or cfg.get("extra-index-url") or ""
    return [index, *extra.split()]


def _direct_download(pin: Pin, dest: Path) -> str | None:
    """Download `pin.file` from the first index that lists it (PEP 691 JSON or PEP 503 HTML
    simple pages); None when no index lists it. Returns the host it came from."""
    import json
    import re
    import urllib.parse
    import urllib.request
    project = re.sub(r"[-_.]+", "-", pin.package).lower()
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    for index in _index_urls():
        page = index.rstrip("/") + f"/{project}/"
        local = urllib.request.url2pathname(urllib.parse.urlsplit(page).path) \
            if page.startswith("file:") else None
        try:
            # a local index is a folder per project holding index.html (as pip reads it)
            url = page + "index.html" if local and Path(local).is_dir() else page
            with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept}),
                                        timeout=60) as r:
                body, ctype = r.read(), r.headers.get("Content-Type", "")
        except (OSError, ValueError):
            continue                     # this index does not have the project (or is down)
        if "json" in ctype:
            links = [f["url"] for f in json.loads(body).get("files", [])]
        else:
            links = re.findall(r'href="([^"]+)"', body.decode("utf-8", "replace"))
        for link in links:
            url = urllib.parse.urljoin(page, link.split("#", 1)[0])
            if urllib.parse.unquote(url.rsplit("/", 1)[-1]) == pin.file:
                with urllib.request.urlopen(url, timeout=300) as r, \
                        open(dest / pin.file, "wb") as f:
                    shutil.copyfileobj(r, f, 1 << 20)
                return urllib.parse.urlsplit(url).netloc or index
    return None


def _pip_download(pin: Pin, dest: Path, log) -> None:
    log(f"download {pin.package}=={pin.version} (carries ggml {pin.release}) with pip")
    try:
        import pip  # noqa: F401  (declared in [build-system].requires for isolated builds)
    except ImportError:
        raise BuildError(
            "pip is not importable by this Python, so the pinned sdist cannot be downloaded",
            f"install pip, or download {pin.file} elsewhere and give it with "
            f"`python build_ggml.py fetch --from FILE` (or put it into {cache_dir()})") from None
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest),
           f"{pin.package}=={pin.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    got = dest / pin.file
    if not got.exists():
        lines = (proc.stderr or proc.stdout or "no output").strip().splitlines()
        raise BuildError(
            f"could not download {pin.package}=={pin.version} from the package index "
            f"(pip: {lines[-1].strip()})",
            f"check the network or pip's index settings; offline, download {pin.file} "
            f"elsewhere and run `python build_ggml.py fetch --from FILE`")
    dt = max(time.monotonic() - t0, 1e-3)
    size = got.stat().st_size
    log(f"downloaded {pin.file}: {human_bytes(size)} in {dt:.1f} s ({human_bytes(size / dt)}/s)")


def vocab_sdist() -> Path | None:
    """A cached pinned sdist that carries llama.cpp's ``models/ggml-vocab-*.gguf`` (real GGUF
    files for tests, benchmarks and notebooks): the default release's, else another pin's from
    llama.cpp, newest first; None when none is in the cache."""
    default, all_pins = load_manifest()
    order = [default] + sorted((r for r in all_pins if r != default), key=_version_key,
                               reverse=True)
    for release in order:
        pin = all_pins[release]
        archive = cache_dir() / pin.file
        if pin.tree.endswith("llama.cpp/ggml") and archive.exists():
            return archive
    return None


def work_root() -> Path:
    """The folder that holds vendor/ (extracted trees) and build/ (CMake folders): the checkout,
    or for an installed package the cache's parent (~/.cache/ggml_py by default)."""
    return ROOT if CHECKOUT else cache_dir().parent


def tree_dir(pin: Pin) -> Path:
    return work_root() / "vendor" / pin.release


def extracted_tree(pin: Pin) -> Path | None:
    """The extracted tree for `pin` when it exists and came from the verified archive."""
    dest = tree_dir(pin)
    stamp = dest / STAMP
    if stamp.exists() and stamp.read_text().strip() == pin.sha256:
        if pin.tests and not test_backend_ops(dest).exists() and (cache_dir() / pin.file).exists():
            return None          # extracted before the tests were taken: extract again
        return dest
    return None


def test_backend_ops(tree: Path) -> Path:
    """Where an extracted tree keeps upstream's test-backend-ops.cpp (when its pin has one)."""
    return tree / TESTS / "test-backend-ops.cpp"


def extract(pin: Pin, archive: Path) -> Path:
    """Extract only the ggml tree of `archive` to vendor/<release>/ (atomically)."""
    dest = tree_dir(pin)
    dest.parent.mkdir(parents=True, exist_ok=True)
    top = pin.file.removesuffix(".tar.gz")
    prefix = f"{top}/{pin.tree}/"
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{pin.release}-"))
    try:
        with tarfile.open(archive) as tar:
            members = []
            tests = f"{top}/{pin.tests}" if pin.tests else None
            for m in tar.getmembers():
                if m.name == tests and m.isfile():
                    m.name = f"{TESTS}/test-backend-ops.cpp"
                    members.append(m)
                    continue
                if not m.name.startswith(prefix) or not (m.isfile() or m.isdir()):
                    continue
                m.name = m.name[len(prefix):]
                if m.name:
                    members.append(m)
            if not members:
                raise BuildError(f"{archive.name} holds no {pin.tree}/",
                                 "the pin's 'tree' field in vendor/releases.toml is wrong")
            tar.extractall(tmp, members=members, filter="data")
        (tmp / STAMP).write_text(pin.sha256 + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def prepare(release: str, log=print, origin: Path | None = None) -> Path:
    """The verified ggml tree of `release`, fetching and extracting as needed."""
    pin = pin_for(release)
    tree = extracted_tree(pin)
    if tree is not None and origin is None:
        return tree
    archive = fetch(pin, log=log, origin=origin)
    log(f"extract {pin.tree}/ of {archive.name} -> vendor/{pin.release}/")
    return extract(pin, archive)


def check_source(path: Path) -> Path:
    """A local ggml checkout given with --source: refuse anything that is not one."""
    path = Path(path).resolve()
    if not (path / "CMakeLists.txt").is_file() or not (path / "include" / "ggml.h").is_file():
        raise BuildError(f"{path} is not a ggml tree (no CMakeLists.txt and include/ggml.h)",
                         "pass the folder that holds ggml's CMakeLists.txt, e.g. llama.cpp/ggml")
    return path


def tree_version(tree: Path) -> str:
    """The GGML_VERSION_{MAJOR,MINOR,PATCH} a tree's CMakeLists.txt declares."""
    import re
    text = (tree / "CMakeLists.txt").read_text(errors="replace")
    parts = []
    for key in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"set\(GGML_VERSION_{key}\s+(\d+)\)", text)
        if not m:
            return "unknown"
        parts.append(m.group(1))
    return ".".join(parts)
