#!/usr/bin/env bash
# Pack this worktree for the device tool. The tool sends the checkout the session was started
# in (the main checkout), not a helper's worktree: so copy this worktree's files, its cp312
# wheels (.whl) and a trimmed vendor tree into an ignored folder of that checkout, and name it
# in `carry`; tools/gpu/round3.sh copies it to /root/wt on the device machine and works there.
#
#   bash tools/gpu/pack_wt.sh /work/main [RELEASE] [NBWHEELS]
#   run(command="bash .gpu-wt/repo/tools/gpu/round3.sh build", carry=[".gpu-wt"])
#
# NBWHEELS: a folder of cp312 wheels for the notebook test (nbclient, ipykernel, matplotlib and
# their needs), installed there behind the image's own packages (a .pth: the image's win).
set -eu
SRC=$(git rev-parse --show-toplevel)
DEST=${1:?the session checkout, e.g. /work/main}/.gpu-wt
REL=${2:-0.26.0}
NB=${3:-}
common=$(git rev-parse --git-common-dir)
grep -qx '/.gpu-wt/' "$common/info/exclude" || echo '/.gpu-wt/' >> "$common/info/exclude"
rm -rf "$DEST"
mkdir -p "$DEST/repo"
cd "$SRC"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
    [ -e "$f" ] && printf '%s\0' "$f"
done | xargs -0 cp -p --parents -t "$DEST/repo"
cp -rp .whl "$DEST/repo/.whl"
mkdir -p "$DEST/repo/vendor/$REL/src"
[ -e "vendor/$REL/.ggml_py-verified" ] || { echo "vendor/$REL is not verified"; exit 1; }
( cd "vendor/$REL" && for f in .[!.]* * src/*; do
    case $f in src) continue ;; src/*) [ -d "$f" ] && case ${f#src/} in
        ggml-cpu|ggml-cuda|ggml-rpc) ;; *) continue ;; esac ;; esac
    cp -rp "$f" "$DEST/repo/vendor/$REL/$f"
done )
[ -n "$NB" ] && cp -rp "$NB" "$DEST/nbwhl"
du -sh "$DEST" "$DEST"/*
