"""Which Vulkan devices ggml may use: ``GGML_VK_VISIBLE_DEVICES``.

ggml's Vulkan backend skips devices of CPU type (Mesa's software driver, lavapipe) unless
``GGML_VK_VISIBLE_DEVICES`` lists them, and aborts on an index that does not exist. For a
build with Vulkan, when the variable is unset, ggml_py counts the Vulkan devices through the
loader before ggml starts: if none of them is a hardware GPU, it makes the software devices
visible, so a Vulkan build has a ``Vulkan0`` on a machine without a GPU. With a GPU, or when
the user set the variable, nothing changes.

When the user set the variable, ggml parses it as a list of indices into the loader's devices
and, for an index past the end, throws a C++ exception from its registry's initialisation,
which ends the process. ggml_py reads the list
first, by ggml's own parsing rules, and refuses such a value with an ImportError that names it.
"""
from __future__ import annotations

import os

_CPU_TYPE = 4   # VK_PHYSICAL_DEVICE_TYPE_CPU
_GPU_TYPES = (1, 2)   # integrated, discrete


def physical_device_types() -> list[int] | None:
    """VkPhysicalDeviceType of each device the Vulkan loader reports, or None without one."""
    import cffi
    ffi = cffi.FFI()
    ffi.cdef("""
        typedef struct { int sType; const void *pNext; uint32_t flags;
                         const void *pApplicationInfo; uint32_t enabledLayerCount;
                         const char *const *ppEnabledLayerNames; uint32_t enabledExtensionCount;
                         const char *const *ppEnabledExtensionNames; } VkInstanceCreateInfo;
        int vkCreateInstance(const VkInstanceCreateInfo *, const void *, void **);
        void vkDestroyInstance(void *, const void *);
        int vkEnumeratePhysicalDevices(void *, uint32_t *, void **);
        void vkGetPhysicalDeviceProperties(void *, void *);
    """)
    try:
        vk = ffi.dlopen("libvulkan.so.1")
    except OSError:
        return None
    info = ffi.new("VkInstanceCreateInfo *", {"sType": 1})   # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    inst = ffi.new("void **")
    if vk.vkCreateInstance(info, ffi.NULL, inst) != 0:
        return None
    try:
        n = ffi.new("uint32_t *")
        if vk.vkEnumeratePhysicalDevices(inst[0], n, ffi.NULL) != 0:
            return None
        devs = ffi.new("void *[]", n[0])
        vk.vkEnumeratePhysicalDevices(inst[0], n, devs)
        types = []
        props = ffi.new("uint32_t[512]")      # VkPhysicalDeviceProperties is 824 bytes
        for i in range(n[0]):
            vk.vkGetPhysicalDeviceProperties(devs[i], props)
            types.append(int(props[4]))      # apiVersion, driverVersion, vendorID, deviceID, deviceType
        return types
    finally:
        vk.vkDestroyInstance(inst[0], ffi.NULL)


def visible_indices(spec: str) -> list[int]:
    """The indices ggml reads from a GGML_VK_VISIBLE_DEVICES value: commas count as spaces and
    numbers are read one after another (C++ ``stream >> size_t``) until one cannot be: a word
    that is no number ends the list, a sign starts a new number ("1-2" is 1 then -2), a minus
    wraps modulo 2**64 and a number past 2**64 - 1 ends the list."""
    import re
    text, pos = spec.replace(",", " "), 0
    out: list[int] = []
    number = re.compile(r"\s*([+-]?)(\d+)")
    while True:
        m = number.match(text, pos)
        if m is None:
            return out
        v = int(m[2])
        if v >= 2**64:
            return out
        out.append((-v) % 2**64 if m[1] == "-" else v)
        pos = m.end()


def check_visible_devices(types: list[int] | None) -> None:
    """Refuse a GGML_VK_VISIBLE_DEVICES that names a device the loader does not report."""
    spec = os.environ.get("GGML_VK_VISIBLE_DEVICES")
    if spec is None or types is None:
        return
    bad = [i for i in visible_indices(spec) if i >= len(types)]
    if bad:
        raise ImportError(
            f"ggml_py: GGML_VK_VISIBLE_DEVICES={spec!r} names Vulkan device {bad[0]}, but the "
            f"Vulkan loader reports {len(types)} device(s) (indices 0..{len(types) - 1}); ggml "
            "would end the process on it. Unset the variable or name existing devices")


def expose_software_devices() -> None:
    """Check a GGML_VK_VISIBLE_DEVICES the user set; when unset, set it to the software devices
    if no hardware GPU is there."""
    if "GGML_VK_VISIBLE_DEVICES" in os.environ:
        check_visible_devices(physical_device_types())
        return
    types = physical_device_types()
    if not types or any(t in _GPU_TYPES for t in types):
        return
    software = [str(i) for i, t in enumerate(types) if t == _CPU_TYPE]
    if software:
        os.environ["GGML_VK_VISIBLE_DEVICES"] = ",".join(software)
