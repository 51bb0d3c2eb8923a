#!/bin/bash
# Cut the archive made by pack.sh into chunks of at most 60 MiB, one folder per device call (run here):
#   bash experiments/peers/fbgemm/split.sh [ARCHIVE [OUTDIR]]   defaults /tmp/fbgemm/fbgemm_tbe_sm90.tar.xz, lab/fbgemm
# Makes OUTDIR/chunk0, chunk1, ...: each holds its part (part.NN), MANIFEST (the archive's name, size,
# sha256 and number of parts, the same in every folder), PART.sha256 and a copy of reassemble.sh, so one call
# needs to carry that one folder only (carry the folder chunkK). CHUNK_MIB=60 sets the part size.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ARCHIVE=${1:-/tmp/fbgemm/fbgemm_tbe_sm90.tar.xz}
OUTDIR=$(mkdir -p "${2:-$HERE}" && cd "${2:-$HERE}" && pwd)
MIB=${CHUNK_MIB:-60}
[ -f "$ARCHIVE" ] || { echo "split.sh: no $ARCHIVE (run pack.sh first)" >&2; exit 1; }
rm -rf "$OUTDIR"/chunk[0-9]* "$OUTDIR/.parts"
mkdir -p "$OUTDIR/.parts"
split -b ${MIB}M -d -a 2 "$ARCHIVE" "$OUTDIR/.parts/part."
n=$(ls "$OUTDIR/.parts" | wc -l)
sum=$(sha256sum "$ARCHIVE" | cut -d' ' -f1)
i=0
for part in $(ls "$OUTDIR/.parts" | sort); do
  d="$OUTDIR/chunk$i"
  mkdir -p "$d"
  mv "$OUTDIR/.parts/$part" "$d/"
  (cd "$d" && sha256sum "$part" > PART.sha256)
  printf 'archive=%s\nsize=%s\nsha256=%s\nparts=%s\n' "$(basename "$ARCHIVE")" "$(stat -c %s "$ARCHIVE")" "$sum" "$n" > "$d/MANIFEST"
  cp "$HERE/reassemble.sh" "$d/"
  i=$((i + 1))
done
rmdir "$OUTDIR/.parts"
du -sh "$OUTDIR"/chunk[0-9]*
echo "$n chunk(s) of at most $MIB MiB for $(basename "$ARCHIVE") ($(stat -c %s "$ARCHIVE") bytes, sha256 $sum)"
