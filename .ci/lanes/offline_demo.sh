#!/usr/bin/env bash
# `bash .ci/lanes/offline_demo.sh REFERENCE_DEMO WORK TIMM_EXT_COMMAND...`
# The README's main job on a fresh machine that reaches the package index but not GitHub: `timm-ext demo --quick`
# with no network (a network namespace of its own where unshare can make one, else a proxy that refuses), an empty
# timm-ext cache (the digits are read from REFERENCE_DEMO's data root when given there) and no TIMM_EXT_TIMM_TRAIN.
# The demo must say in one line that it uses its built-in loop, show its table, and give the summary.csv of
# REFERENCE_DEMO (the same quick demo through timm's train.py, of as many epochs: its summary.json's) byte for byte,
# run by run.
set -euo pipefail
reference="$1"
work="$2"
shift 2
if unshare -rn true 2>/dev/null; then
  no_network=(unshare -rn)
else
  no_network=(env HTTPS_PROXY=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 NO_PROXY= no_proxy=)
fi
epochs=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["epochs"])' "$reference/summary.json")
echo "+ timm-ext demo --quick --epochs $epochs --no-progress  (no network, an empty cache, no TIMM_EXT_TIMM_TRAIN)"
if ! out="$(env -u TIMM_EXT_TIMM_TRAIN TIMM_EXT_CACHE="$work/offline-cache" "${no_network[@]}" \
    "$@" demo --quick --epochs "$epochs" --no-progress --output "$work/demo-offline" 2>&1)"; then
  echo "$out"
  echo "offline demo: timm-ext demo --quick --epochs $epochs failed with no network and no train.py" >&2
  exit 1
fi
echo "$out"
if ! grep -q "built-in loop" <<< "$out" || ! grep -q '^| run | epochs | top-1' <<< "$out"; then
  echo 'offline demo: it did not say it used its built-in loop, or showed no table' >&2
  exit 1
fi
for run in vit full; do
  if ! cmp "$reference/$run/summary.csv" "$work/demo-offline/$run/summary.csv"; then
    echo "offline demo: the built-in loop's $run/summary.csv differs from train.py's ($reference/$run)" >&2
    exit 1
  fi
done
echo "offline demo: built-in loop = train.py, summary.csv byte for byte (vit, full)"
