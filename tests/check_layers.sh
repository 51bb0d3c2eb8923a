#!/usr/bin/env bash
# The layering rule, checked on the tree (make test runs it first; a violation fails the run):
#   src/base/                  includes only src/base/
#   kernels/  comm/  io/       include their own folder and src/base/, never each other or the core
#   src/ (the core)            anything below it, never experiments/ or tests/
#   experiments/lab/           its own folder, kernels/ and src/base/ (measurement kernels beside the library)
#   every include of a project file names its room: "src/base/check.h", "comm/communicator.h"
# Usage: tests/check_layers.sh [ROOT]   prints each violation, then "layers: passed|failed (N violations)".
set -u
root=${1:-.}
cd "$root" || exit 2
bad=0
say() { echo "layers: $1"; bad=$((bad + 1)); }
while IFS=: read -r file line text; do
  inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$text")
  room=${inc%%/*}
  [ "$room" = "$inc" ] && { say "$file:$line includes \"$inc\" without its folder (write \"<room>/$inc\")"; continue; }
  case $file in
    src/base/*) [[ $inc == src/base/* ]] || say "$file:$line: the base layer includes \"$inc\"" ;;
    kernels/*|comm/*|io/*)
      own=${file%%/*}
      [[ $inc == "$own"/* || $inc == src/base/* ]] || say "$file:$line: $own/ includes \"$inc\" (only $own/ and src/base/)" ;;
    src/*) [[ $inc == experiments/* || $inc == tests/* ]] && say "$file:$line: the core includes \"$inc\"" ;;
    experiments/lab/*)
      [[ $inc == experiments/lab/* || $inc == kernels/* || $inc == src/base/* ]] ||
        say "$file:$line: experiments/lab/ includes \"$inc\" (only experiments/lab/, kernels/ and src/base/)" ;;
  esac
  [ -e "$inc" ] || say "$file:$line: \"$inc\" does not exist"
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' src kernels comm io experiments tests \
           --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh')
if [ "$bad" = 0 ]; then echo "layers: passed"; else echo "layers: failed ($bad violations)"; exit 1; fi
