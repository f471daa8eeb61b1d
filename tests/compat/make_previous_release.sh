#!/usr/bin/env bash
# Rebuild tests/compat/previous/: the wheel of the previous release (0.1.0, the last commit before
# wire format 2), built from the git history. The compatibility tests install it (unpack it) and
# run its agent and its collector's store code as that release would, against this one.
#
#   tests/compat/make_previous_release.sh            # from this checkout's history
#   tests/compat/make_previous_release.sh COMMIT     # another commit
set -euo pipefail
cd "$(dirname "$0")/../.."
commit="${1:-75d60e0}"
out="tests/compat/previous"
work="$(mktemp -d)"
trap 'git worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/src" "$commit" >/dev/null
python="${PYTHON:-.venv/bin/python}"
"$python" -m pip wheel --quiet --no-deps -w "$work/wheel" "$work/src"
rm -f "$out"/*.whl
cp "$work"/wheel/*.whl "$out/"
echo "$out: $(ls "$out"/*.whl) from $(git rev-parse --short "$commit")"
