#!/bin/bash
# Build the archive that carries FBGEMM_GPU's TBE training libraries to the GPU machine (run here, not there).
#   bash experiments/peers/fbgemm/pack.sh [ARCH]        ARCH: 90 (default: keep only the sm_90a cubins) or all (as shipped)
# Output: /tmp/fbgemm/fbgemm_tbe_sm90.tar.xz (ARCH 90) or /tmp/fbgemm/fbgemm_tbe_all.tar.xz; then split.sh on it.
# What goes in: the fbgemm-gpu 1.6.0 wheel's Python files (all of them, 1.3 MB), its dist-info, and 10 of its 19
# shared libraries: the 6 that the patched __init__.py loads (config, tbe_utils, tbe_training_forward,
# tbe_training_backward, tbe_training_backward_pt2, tbe_training_backward_split_host) and the 4 they need by
# DT_NEEDED (tbe_common, fbgemm, asmjit, sparse_async_cumsum). __init__.py is patched to load only those 6 and to
# know that 1.6 pairs with torch 2.11. With ARCH 90 every fat binary keeps only its sm_90a cubins
# (fatbin_keep_arch.py: same file size and layout, the other architectures' cubins zeroed).
set -euo pipefail
ARCH=${1:-90}
VER=1.6.0
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=/tmp/fbgemm
WHEEL=$OUT/fbgemm_gpu-$VER-cp312-cp312-manylinux_2_28_x86_64.whl
mkdir -p $OUT
if [ ! -f "$WHEEL" ]; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d $OUT fbgemm-gpu==$VER
fi
W=$OUT/pack/wheel S=$OUT/pack/stage
rm -rf $OUT/pack && mkdir -p $W $S
unzip -q "$WHEEL" -d $W
(cd $W && tar cf - --exclude='*.so' fbgemm_gpu fbgemm_gpu-$VER.dist-info) | tar xf - -C $S
python3 - "$S/fbgemm_gpu/__init__.py" <<'EOF'
import os, re, sys
p = sys.argv[1]
s = open(p).read()
libs = ["fbgemm_gpu_config", "fbgemm_gpu_tbe_utils", "fbgemm_gpu_tbe_training_forward",
        "fbgemm_gpu_tbe_training_backward", "fbgemm_gpu_tbe_training_backward_pt2",
        "fbgemm_gpu_tbe_training_backward_split_host"] + (["fbgemm_gpu_tbe_cache", "fbgemm_gpu_py"] if os.environ.get("CACHE") == "1" else [])
new = ("fbgemm_gpu_libraries = [\n    # Trimmed for a TBE-training-only peer (HBM tables, no cache, no VBE/GWD):\n"
       "    # the wheel's other libraries were left out to keep the transfer small.\n"
       + "".join(f'    "{l}",\n' for l in libs) + "]")
s, n = re.subn(r'fbgemm_gpu_libraries = \[\n(?:    "[a-z0-9_]+",\n)+\]', new, s)
assert n == 1, "library list not found"
s, n = re.subn(r'_fbgemm_torch_compat_table = \{\n', '_fbgemm_torch_compat_table = {\n    "1.6": "2.11",\n', s)
assert n == 1, "compat table not found"
open(p, "w").write(s)
EOF
# CACHE=1 bash pack.sh: fbgemm_gpu_tbe_cache and fbgemm_gpu_py too (peer_fbgemm.py --cache-rows,
# EmbeddingLocation.MANAGED_CACHING: the cache's operators, and new_unified_tensor for the managed rows); the patched
# __init__.py then loads them as well. CACHE=only: an add-on of those two alone (about 3 MB,
# /tmp/fbgemm/fbgemm_cache_sm90.tar.xz) for an archive made without them: unpack it into the package's directory
# (tar -xJf ADDON -C /tmp/fbgemm_tbe/fbgemm_gpu) and peer_fbgemm.py --cache-rows loads them.
EXTRA=""
[ "${CACHE:-0}" != 0 ] && EXTRA="fbgemm_gpu_tbe_cache fbgemm_gpu_py"
if [ "${CACHE:-0}" = only ]; then
  mkdir -p $S/addon
  for lib in $EXTRA; do
    python3 "$HERE/fatbin_keep_arch.py" --arch "$ARCH" $W/fbgemm_gpu/$lib.so $S/addon/$lib.so
  done
  (cd $S/addon && sha256sum *.so > SHA256SUMS.cache && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
     -cf - *.so SHA256SUMS.cache | xz -9e -T2 > $OUT/fbgemm_cache_sm$ARCH.tar.xz)
  echo "$OUT/fbgemm_cache_sm$ARCH.tar.xz: $(stat -c %s $OUT/fbgemm_cache_sm$ARCH.tar.xz) bytes"
  exit 0
fi
for lib in $EXTRA fbgemm_gpu_config fbgemm_gpu_tbe_utils fbgemm_gpu_tbe_training_forward fbgemm_gpu_tbe_training_backward \
           fbgemm_gpu_tbe_training_backward_pt2 fbgemm_gpu_tbe_training_backward_split_host fbgemm_gpu_tbe_common \
           fbgemm asmjit fbgemm_gpu_sparse_async_cumsum; do
  if [ "$ARCH" = all ]; then
    cp $W/fbgemm_gpu/$lib.so $S/fbgemm_gpu/
  else
    python3 "$HERE/fatbin_keep_arch.py" --arch "$ARCH" $W/fbgemm_gpu/$lib.so $S/fbgemm_gpu/$lib.so
  fi
done
(cd $S && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS)
[ "$ARCH" = all ] && ARCHIVE=$OUT/fbgemm_tbe_all.tar.xz || ARCHIVE=$OUT/fbgemm_tbe_sm$ARCH.tar.xz
start=$(date +%s)
tar -C $S --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | xz -9e -T2 > $ARCHIVE
echo "$ARCHIVE: $(stat -c %s $ARCHIVE) bytes from $(du -sb $S | cut -f1) bytes in $(( $(date +%s) - start )) s"
