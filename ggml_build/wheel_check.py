"""What a built wheel's shared objects link against: ``python -m ggml_build.wheel_check W.whl``
(a wheel, a folder, or single files); with ``--release X``, also that the wheel holds exactly
one build under ggml_py/lib/, of ggml X.

Every file is classified by its magic bytes:

- **ELF** (Linux): its NEEDED libraries and RUNPATH/RPATH (read with ``readelf -d``). A NEEDED
  library passes when a runpath entry under ``$ORIGIN`` resolves to a file of the wheel that
  has that name, or when it is a system library a manylinux platform provides (libc, libm,
  libstdc++, libgcc_s, libgomp, ...).
- **Mach-O** (macOS; thin or universal): its install name (LC_ID_DYLIB), the libraries it
  loads (LC_LOAD_DYLIB and the weak, re-export, lazy and upward variants) and its LC_RPATH
  entries, parsed here (no otool needed, so the macOS leg's check also runs on Linux). A
  library passes when ``@loader_path/...`` or ``@rpath/...`` (through an LC_RPATH entry under
  ``@loader_path``) resolves to a file of the wheel, or when it is the system's (/usr/lib,
  /System/Library); an absolute path elsewhere (/opt/homebrew/...) or an ``@executable_path``
  one would not exist on a user's machine.
- Anything else that looks like a shared object by name (.so, .dylib, .pyd, .dll) is
  **not checked**, and says so; a wheel without any ELF or Mach-O file fails ("nothing
  checked" is not "ok").

Prints `auditwheel show` too (ELF wheels, where auditwheel is installed). Exit 1 on a library
the installed wheel would miss, or when nothing could be checked.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

# provided by the platform (the manylinux policy's list, plus OpenMP's runtime from gcc)
SYSTEM = re.compile(r"^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libgomp|"
                    r"ld-linux[\w.-]*|libvulkan|libcuda|libcudart|libcublas|libcublasLt)\.so")
MACOS_SYSTEM = ("/usr/lib/", "/System/Library/")
SHARED_SUFFIX = re.compile(r"\.(so(\.\d+)*|dylib|pyd|dll)$")

# Mach-O load commands (mach-o/loader.h)
LC_REQ_DYLD = 0x80000000
LC_LOAD_DYLIB = 0xC
LC_ID_DYLIB = 0xD
LC_LOAD_WEAK_DYLIB = 0x18 | LC_REQ_DYLD
LC_RPATH = 0x1C | LC_REQ_DYLD
LC_REEXPORT_DYLIB = 0x1F | LC_REQ_DYLD
LC_LAZY_LOAD_DYLIB = 0x20
LC_LOAD_UPWARD_DYLIB = 0x23 | LC_REQ_DYLD
LOADS = {LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB, LC_LAZY_LOAD_DYLIB,
         LC_LOAD_UPWARD_DYLIB}
MH_MAGIC = {b"\xfe\xed\xfa\xce": (">", 28), b"\xce\xfa\xed\xfe": ("<", 28),
            b"\xfe\xed\xfa\xcf": (">", 32), b"\xcf\xfa\xed\xfe": ("<", 32)}
FAT_MAGIC = {b"\xca\xfe\xba\xbe": 20, b"\xca\xfe\xba\xbf": 32}   # fat_arch, fat_arch_64 sizes


class NotMachO(ValueError):
    pass


@dataclass
class MachO:
    """What one Mach-O image (one architecture of a universal file) declares."""
    install_name: str | None = None
    loads: list[str] = field(default_factory=list)
    rpaths: list[str] = field(default_factory=list)


def kind(path: Path) -> str:
    """'elf', 'macho', 'pe' or 'other', from the first bytes."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"\x7fELF":
        return "elf"
    if head[:4] in MH_MAGIC:
        return "macho"
    if head[:4] in FAT_MAGIC and len(head) == 8 and 0 < struct.unpack(">I", head[4:])[0] < 32:
        return "macho"          # (Java class files share 0xcafebabe; their next word is >= 45)
    if head[:2] == b"MZ":
        return "pe"
    return "other"


def read_macho(data: bytes) -> list[MachO]:
    """The images of a Mach-O file: one for a thin file, one per architecture for a universal."""
    magic = data[:4]
    if magic in FAT_MAGIC:
        (n,) = struct.unpack_from(">I", data, 4)
        images = []
        for i in range(n):
            if magic == b"\xca\xfe\xba\xbe":
                _, _, off, size, _ = struct.unpack_from(">iiIII", data, 8 + 20 * i)
            else:
                _, _, off, size, _, _ = struct.unpack_from(">iiQQII", data, 8 + 32 * i)
            images += read_macho(data[off:off + size])
        return images
    if magic not in MH_MAGIC:
        raise NotMachO("not a Mach-O file")
    end, header = MH_MAGIC[magic]
    _, _, _, _, ncmds, sizeofcmds, _ = struct.unpack_from(end + "IiiIIII", data, 0)
    image, off = MachO(), header
    for _ in range(ncmds):
        cmd, size = struct.unpack_from(end + "II", data, off)
        if size < 8 or off + size > header + sizeofcmds:
            raise NotMachO(f"load command at {off} runs past the header")
        if cmd in LOADS or cmd in (LC_ID_DYLIB, LC_RPATH):
            (name_off,) = struct.unpack_from(end + "I", data, off + 8)
            text = data[off + name_off:off + size].split(b"\0", 1)[0].decode("utf-8", "replace")
            if cmd == LC_RPATH:
                image.rpaths.append(text)
            elif cmd == LC_ID_DYLIB:
                image.install_name = text
            else:
                image.loads.append(text)
        off += size
    return [image]


def resolve_macho(lib: str, where: Path, rpaths: list[str], files: set[Path]) -> str:
    """'in wheel', 'system' or 'MISSING' for a Mach-O load of `lib` by a file in `where`."""
    def inside(p: str) -> bool:
        return Path(os.path.normpath(p)) in files
    if lib.startswith("@loader_path/"):
        return "in wheel" if inside(str(where / lib[len("@loader_path/"):])) else "MISSING"
    if lib.startswith("@rpath/"):
        rest = lib[len("@rpath/"):]
        for rp in rpaths:
            if rp.startswith("@loader_path") and inside(
                    str(where / rp[len("@loader_path"):].lstrip("/") / rest)):
                return "in wheel"
        if any(rp.startswith(MACOS_SYSTEM) for rp in rpaths) and rest.startswith("lib"):
            return "system"
        return "MISSING"
    if lib.startswith(MACOS_SYSTEM):
        return "system"
    return "MISSING"      # @executable_path (the interpreter's), /opt/homebrew, /usr/local, ...


def dynamic(path: Path) -> tuple[list[str], str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", out)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.+?)\]", out)
    return needed, ":".join(runpath)


def resolve_elf(lib: str, where: Path, runpath: str, files: set[Path]) -> str:
    for entry in filter(None, runpath.split(":")):
        if entry.startswith(("$ORIGIN", "${ORIGIN}")):
            rel = entry.split("}", 1)[1] if entry.startswith("${") else entry[len("$ORIGIN"):]
            if Path(os.path.normpath(where / rel.lstrip("/") / lib)) in files:
                return "in wheel"
    return "system" if SYSTEM.match(lib) else "MISSING"


def _check_elf(p: Path, top: Path, files: set[Path]) -> bool:
    if shutil.which("readelf") is None:
        print(f"  {p.relative_to(top)}  ELF: NOT CHECKED (no readelf on this machine)")
        return False
    needed, runpath = dynamic(p)
    outside = [e for e in runpath.split(":") if e and "ORIGIN" not in e]
    print(f"  {p.relative_to(top)}  ELF runpath={runpath or '-'}")
    ok = True
    if outside:
        print(f"      runpath outside the wheel: {':'.join(outside)}  BAD")
        ok = False
    for n in needed:
        where = resolve_elf(n, p.parent, runpath, files)
        ok &= where != "MISSING"
        print(f"      {n:<40} {where}")
    return ok


def _check_macho(p: Path, top: Path, files: set[Path]) -> bool:
    try:
        images = read_macho(p.read_bytes())
    except (NotMachO, struct.error) as e:
        print(f"  {p.relative_to(top)}  Mach-O, unreadable: {e}  BAD")
        return False
    ok = True
    for i, image in enumerate(images):
        arch = f" [image {i + 1}/{len(images)}]" if len(images) > 1 else ""
        print(f"  {p.relative_to(top)}{arch}  Mach-O install name={image.install_name or '-'} "
              f"rpaths={':'.join(image.rpaths) or '-'}")
        for rp in image.rpaths:
            if not rp.startswith(("@loader_path",) + MACOS_SYSTEM):
                print(f"      LC_RPATH outside the wheel: {rp}  BAD")
                ok = False
        for lib in image.loads:
            where = resolve_macho(lib, p.parent, image.rpaths, files)
            ok &= where != "MISSING"
            print(f"      {lib:<40} {where}")
    return ok


def check(target: Path) -> int:
    target = Path(target)
    with tempfile.TemporaryDirectory() as tmp:
        if target.is_file() and zipfile.is_zipfile(target):
            with zipfile.ZipFile(target) as z:
                z.extractall(tmp)
            top = Path(tmp)
            paths = [p for p in top.rglob("*") if p.is_file()]
        elif target.is_dir():
            top, paths = target, [p for p in target.rglob("*") if p.is_file()]
        else:
            top, paths = target.parent, [target]
        top = top.resolve()
        paths = [p.resolve() for p in paths]
        files = set(paths)
        kinds = {p: kind(p) for p in paths}
        objs = [p for p in paths if kinds[p] in ("elf", "macho")]
        unchecked = [p for p in paths if kinds[p] not in ("elf", "macho")
                     and (SHARED_SUFFIX.search(p.name) or kinds[p] == "pe")]
        print(f"{target.name}: {len(objs)} shared objects "
              f"({sum(kinds[p] == 'elf' for p in objs)} ELF, "
              f"{sum(kinds[p] == 'macho' for p in objs)} Mach-O)")
        bad = 0
        for p in sorted(objs):
            good = (_check_elf if kinds[p] == "elf" else _check_macho)(p, top, files)
            bad += not good
        for p in sorted(unchecked):
            print(f"  {p.relative_to(top)}  {kinds[p].upper()}: NOT CHECKED (neither ELF nor Mach-O)")
    if any(kinds[p] == "elf" for p in objs) and target.suffix == ".whl" and shutil.which("auditwheel"):
        subprocess.run(["auditwheel", "show", str(target)])
    if not objs:
        print("nothing checked: no ELF or Mach-O file"
              + (f" ({len(unchecked)} other binaries, not understood here)" if unchecked else ""))
        return 1
    if bad:
        print(f"{bad} shared object(s) would not load from the installed wheel, or search a "
              "folder of the building machine first (the lines marked BAD/MISSING)")
        return 1
    print("ok" + (f" ({len(unchecked)} other binaries not checked)" if unchecked else ""))
    return 0


def builds_in(wheel: Path) -> dict[str, str | None]:
    """{build folder under ggml_py/lib/: its release (build.json), None when it has none}."""
    import json
    found: dict[str, str | None] = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = name.split("/")
            if parts[:2] == ["ggml_py", "lib"] and len(parts) >= 4:
                found.setdefault(parts[2], None)
                if parts[3] == "build.json":
                    found[parts[2]] = json.loads(z.read(name)).get("release")
    return found


def check_release(wheel: Path, release: str) -> int:
    """The wheel holds exactly one build, of `release`."""
    found = builds_in(wheel)
    print(f"{wheel.name}: builds {found or 'none'}")
    if list(found.values()) != [release]:
        print(f"expected exactly one build, of ggml {release}")
        return 1
    return 0


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m ggml_build.wheel_check", description=__doc__)
    p.add_argument("paths", nargs="+", type=Path, help="wheels, folders or files")
    p.add_argument("--release", help="also require exactly one build under ggml_py/lib/, of "
                                     "this ggml release (wheels only)")
    args = p.parse_args(argv)
    rc = 0
    for path in args.paths:
        rc = max(rc, check(path))
        if args.release:
            rc = max(rc, check_release(path, args.release))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
