#!/usr/bin/env bash
# Every C++/CUDA source in the repository is clang-formatted (.clang-format at the root).
set -euo pipefail
cd "$1"
files=$(git ls-files '*.cpp' '*.h' '*.cu' 2>/dev/null || find . -path ./build -prune -o \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) -print)
clang-format --dry-run --Werror $files
echo "clang-format: $(echo "$files" | wc -w) files clean"
