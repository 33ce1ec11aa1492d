#!/usr/bin/env bash
# CI for {{name}}: build every preset of this repo (one matrix build), then validate each bundle.
#   ./ci.sh              static validation (files parse and agree, Volcano schema, shellcheck, hadolint): seconds
#   ./ci.sh --dry-run    also run each bundle's scripts as simulated pods on CPU (minutes; needs recipekit[train])
# RECIPEKIT overrides the command, e.g. RECIPEKIT="python -m recipekit.cli" ./ci.sh
set -euo pipefail
cd "$(dirname "$0")"

dry_run=()
case "${1:-}" in
  "") ;;
  --dry-run) dry_run=(--dry-run) ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
read -r -a recipekit <<< "${RECIPEKIT:-recipekit}"

# The presets are the recipe/ options of the trees in recipekit.toml's search_path (keep the list in step).
presets=()
for file in recipes/recipe/*.yaml; do
  [[ -e "$file" ]] && presets+=("$(basename "$file" .yaml)")
done
if [[ ${#presets[@]} -eq 0 ]]; then
  echo "no presets under recipes/recipe/" >&2
  exit 1
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
status=0
list="$(IFS=,; echo "${presets[*]}")"
"${recipekit[@]}" build -m "recipe=$list" -o "$out" || status=1
for bundle in "$out"/*/; do
  [[ -d "$bundle" ]] || continue
  "${recipekit[@]}" validate "${bundle%/}" ${dry_run[@]+"${dry_run[@]}"} || status=1
done
exit "$status"
