#!/usr/bin/env bash
# Vulkan on the GPU machine (NVIDIA's Vulkan driver): bring the loader and the build tools as
# Debian packages, then build and test through run_suite.sh. Not run yet (issue 17).
#
#   bash tools/gpu/run_vulkan.sh [PYTEST_ARGS...]
#   run(command="bash tools/gpu/run_vulkan.sh", carry=[".whl", "vendor/0.25.3", ".gl"])
#
# .gl/*.deb        the loaders (libvulkan1, libglvnd and friends), as the device README says:
#                  unpacked into / in every call
# .gl/build/*.deb  for building only: glslc and libshaderc1 (bookworm), spirv-headers, and
#                  trixie's libvulkan-dev (headers 1.4.309, >= the 1.3.272 ggml needs, and the
#                  libvulkan.so link); each unpacked only when the machine lacks what it holds
# BACKENDS defaults to cpu,rpc,vulkan here; cpu,rpc,cuda,vulkan builds both (CUDA0 <-> Vulkan0
# copies), about 200 s more. Other variables: see run_suite.sh.
set -u
cd "$(dirname "$0")/../.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
has() { case "$1" in
    glslc*|libshaderc*) command -v glslc >/dev/null ;;
    spirv-headers*) [ -e /usr/include/spirv/unified1/spirv.hpp ] ;;
    libvulkan-dev*) [ -e /usr/include/vulkan/vulkan_core.h ] &&
                    grep -Eq 'VK_HEADER_VERSION ([3-9][0-9]{2}|2[89][0-9]|27[2-9])$' /usr/include/vulkan/vulkan_core.h ;;
    *) false ;;
esac; }
for f in .gl/build/*.deb; do has "$(basename "$f")" || dpkg -x "$f" /; done
ldconfig
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -e "$nvidia_icd" ] && export VK_DRIVER_FILES=$nvidia_icd \
    __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export BACKENDS=${BACKENDS:-cpu,rpc,vulkan}
exec bash tools/gpu/run_suite.sh "" "$@"
