#!/bin/sh
# hack/clean.sh PATH...: fail, listing them, when files under PATHs differ from the
# committed ones or are not committed at all (make verify: a generator that writes a
# new file must not pass because git diff only sees tracked files).
out=$(git status --porcelain --untracked-files=all -- "$@")
[ -z "$out" ] && exit 0
printf '%s\n' "$out" >&2
exit 1
