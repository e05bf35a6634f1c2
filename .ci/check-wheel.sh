#!/usr/bin/env bash
# The wheel as a new user gets it: build it, install it into a fresh virtual
# environment (CPU torch and nixl-cu12 first, as the README says, then
# 'p2pfsm-*.whl[check]') and run the CLI from a directory outside the checkout, so
# that nothing can come from the source tree: --version, demo (real ZeroMQ + NIXL),
# check --dry-run and one real TLC run on the spec inside the wheel, diagrams
# --check of a copy of docs/diagrams (and docs/machines.md) and diagrams --out. Every temporary directory
# goes on exit. About two minutes, most of it installing torch.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/p2pfsm-wheel-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
unset PYTHONPATH
start=$SECONDS

step() { printf 'check-wheel: %s\n' "$*"; }
fail() { printf 'check-wheel: FAILED: %s\n' "$*" >&2; exit 1; }

step "building the wheel"
"$REPO/.venv/bin/pip" wheel -q --no-deps -w "$WORK/dist" "$REPO"
WHEEL="$(ls "$WORK"/dist/p2pfsm-*.whl)"
step "built $(basename "$WHEEL")"

step "installing it into a fresh venv"
"$PY" -m venv "$WORK/venv"
PIP="$WORK/venv/bin/pip"
"$PIP" install -q --upgrade pip
"$PIP" install -q torch==2.13.0 numpy
"$PIP" install -q --no-deps nixl-cu12==1.5.1
"$PIP" install -q "$WHEEL[check]"
P2PFSM="$WORK/venv/bin/p2pfsm"

OUTSIDE="$WORK/outside"
mkdir "$OUTSIDE"
cd "$OUTSIDE"

where="$("$WORK/venv/bin/python" -c 'import p2pfsm; print(p2pfsm.__file__)')"
case "$where" in
    "$WORK/venv/"*) step "p2pfsm imported from $where" ;;
    *) fail "p2pfsm imported from $where, not from the fresh venv" ;;
esac

want="p2pfsm $("$WORK/venv/bin/python" -c 'import p2pfsm; print(p2pfsm.__version__)')"
got="$("$P2PFSM" --version)"
[ "$got" = "$want" ] || fail "--version said '$got', expected '$want'"
step "--version: $got"

step "demo"
"$P2PFSM" demo

step "check --dry-run"
dry="$("$P2PFSM" check --dry-run)"
echo "$dry"
case "$dry" in
    *"$WORK/venv/"*"/p2pfsm/_tla"*) ;;
    *) fail "check --dry-run does not run in the wheel's p2pfsm/_tla" ;;
esac

step "check: a must-fail config on the wheel's spec (must exit 1)"
set +e
"$P2PFSM" -q check --config p3_finish_drops_load >"$WORK/p3.out"
code=$?
set -e
[ "$code" -eq 1 ] && grep -q "VIOLATED (as this must-fail config requires)" "$WORK/p3.out" \
    || { cat "$WORK/p3.out"; fail "check --config p3_finish_drops_load exited $code"; }
head -1 "$WORK/p3.out"

step "diagrams"
set +e
"$P2PFSM" diagrams 2>"$WORK/diagrams.err"
code=$?
set -e
[ "$code" -eq 2 ] && grep -q -- "--out DIR is required" "$WORK/diagrams.err" \
    || fail "diagrams without --out outside a checkout exited $code: $(cat "$WORK/diagrams.err")"
[ -z "$(ls -A "$OUTSIDE")" ] || fail "diagrams without --out wrote into $OUTSIDE"
cp -r "$REPO/docs/diagrams" "$WORK/diagrams-copy"
# Outside a checkout the machines page (docs/machines.md there) lives in the --out DIR.
cp "$REPO/docs/machines.md" "$WORK/diagrams-copy/machines.md"
"$P2PFSM" diagrams --check --out "$WORK/diagrams-copy"
"$P2PFSM" diagrams --out "$WORK/diagrams-new"
"$P2PFSM" diagrams --check --out "$WORK/diagrams-new"

step "OK in $((SECONDS - start)) s"
