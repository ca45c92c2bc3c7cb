#!/usr/bin/env bash
# design_figure_current: docs/design.svg is what scripts/design-figure writes now. Regenerates the
# figure into a temporary directory and fails, naming the command that fixes it, if the committed
# file differs (the figure's script was changed without regenerating it, or the reverse).
# Usage: tests/design_figure_test.sh SOURCE_DIR [PYTHON3]
set -euo pipefail
source_dir="$1"
python="${2:-python3}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" "$source_dir/scripts/design-figure" "$tmp/design.svg"
if ! cmp -s "$tmp/design.svg" "$source_dir/docs/design.svg"; then
  diff -u "$source_dir/docs/design.svg" "$tmp/design.svg" | head -n 40 || true
  echo "docs/design.svg is not what scripts/design-figure writes; regenerate and commit it:" >&2
  echo "  scripts/design-figure docs/design.svg" >&2
  exit 1
fi
echo "docs/design.svg is current"
