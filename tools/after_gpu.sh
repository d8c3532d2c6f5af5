#!/bin/bash
# Here, after a device call: store what came back and re-execute the pages that read it, in order (intro last: it
# reads the other pages' word counts). One argument, the call's files_at folder (it holds grids.tgz, r/ and/or
# results/ as the queued scripts in notes/gpu_calls/next/ leave them):
#   bash tools/after_gpu.sh /work/.device/N
# grids.tgz → `lpfail.sweep.session unpack`, then `sweep dial_training collect` (`--partial` while runs are missing);
# r/rerun_check.{json,npz} and results/bench_step.{json,npz} → results/. Stops at the first step that fails; prints
# `git status` at the end so that what changed can be read before it is committed.
set -eu
[ $# -eq 1 ] && [ -d "$1" ] || { echo "usage: bash tools/after_gpu.sh FILES_AT_FOLDER" >&2; exit 2; }
IN=$1; cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# (the CPU numeric pins: lpfail sets them itself when imported, `lpfail.numerics.PINS`)
PAGES=()
add() { for p in "$@"; do [[ " ${PAGES[*]-} " == *" $p "* ]] || PAGES+=("$p"); done; }
TGZ=$(find "$IN" -name grids.tgz | head -1)
if [ -n "$TGZ" ]; then
  $PY -m lpfail.sweep.session unpack "$TGZ"
  $PY -m lpfail sweep dial_training collect || $PY -m lpfail sweep dial_training collect --partial
  add lab_01_symptom 01_symptom verdict
fi
for name in rerun_check bench_step; do
  src=$(find "$IN" -name "$name.json" | head -1)
  [ -n "$src" ] || continue
  for ext in json npz; do
    [ -f "${src%.json}.$ext" ] && install -m 644 "${src%.json}.$ext" "results/$name.$ext"
  done
  echo "stored results/$name from $src"
  if [ $name = rerun_check ]; then add appendix_gpu verdict; else add 05_fix lab_05_fix appendix_gpu; fi
done
[ ${#PAGES[@]} -gt 0 ] || { echo "nothing to store in $IN"; exit 1; }
for p in "${PAGES[@]}" intro; do $PY tools/nbbuild.py execute "book/$p.ipynb"; done
git status --short
