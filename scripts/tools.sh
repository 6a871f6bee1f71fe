# shellcheck shell=bash
# scripts/tools.sh: the command-line tools the scripts install from PyPI, each set pinned in
# one file, scripts/tools/<set>.txt, and installed into a virtualenv of its own, so that the
# versions a machine happens to have (on PATH, in the user's site-packages) are never used.
#
#   scripts/tools/template.txt      sam and cfn-lint (scripts/check-template)
#   scripts/tools/cargo-lambda.txt  cargo-lambda and the zig it links with (dev, e2e, builds)
#   scripts/tools/moto.txt          moto_server (Secrets Manager, EventBridge in dev and tests);
#                                   moto and the SAM translator (scripts/template-stack.py)
#   scripts/tools/paddle-sdk.txt    paddle-python-sdk, Paddle's verifier for our signatures
#                                   (scripts/paddle-verify.py, tests/api/paddle_sdk.rs)
#
# Each file is a full `pip freeze` (every dependency pinned too), headed by the line
# `# requested: <what was asked for>`. To upgrade on purpose, edit that line and run
#
#   bash scripts/tools.sh lock <set>      re-resolves the set in a scratch virtualenv, rewrites the file
#   bash scripts/tools.sh bin <set>       installs the set if needed, prints its bin directory
#
# Source it (scripts/stack.sh does) and call `tools_bin <set>`: it prints the bin directory of
# the set's virtualenv, installing it first when it is missing or its file changed. The
# virtualenvs live under $INBOX_TOOLS_DIR (default ~/.cache/billing-inbox/tools), one folder
# per set and content hash, so clones of any commit share them and never see another's pins.
# An install holds a lock (flock), so two scripts installing the same set wait for each other.

_TOOLS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_TOOLS_LOCKS="$_TOOLS_ROOT/scripts/tools"

_tools_log() { printf 'tools: %s\n' "$*" >&2; }

_tools_dir() {
  printf '%s\n' "${INBOX_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/billing-inbox/tools}"
}

# A virtualenv made from python3, with Debian's python3-venv installed when the interpreter
# has no ensurepip (Debian's own python3 without that package).
_tools_venv() {
  local dir="$1"
  python3 -m venv "$dir" >/dev/null 2>&1 && return 0
  rm -rf "$dir"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    _tools_log "python3 cannot make a virtualenv; installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2 || return 1
    python3 -m venv "$dir" >&2 && return 0
  fi
  _tools_log "python3 -m venv $dir failed"
  return 1
}

_tools_pip() {
  local dir="$1"
  shift
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_REQUIRE_VIRTUALENV=0 \
    PIP_USER=0 PYTHONNOUSERSITE=1 "$dir/bin/python" -m pip install --quiet "$@" >&2
}

# tools_bin SET: the bin directory of SET's virtualenv (installed first when needed).
tools_bin() {
  local set="$1" file hash base dir
  file="$_TOOLS_LOCKS/$set.txt"
  [ -f "$file" ] || {
    _tools_log "no such tool set: $set (scripts/tools/$set.txt)"
    return 1
  }
  hash="$(sha256sum "$file" | cut -c1-16)"
  base="$(_tools_dir)"
  dir="$base/$set-$hash"
  if [ ! -f "$dir/.complete" ]; then
    mkdir -p "$base" || return 1
    (
      flock 9 || exit 1
      [ -f "$dir/.complete" ] && exit 0
      rm -rf "$dir"
      _tools_log "installing $set ($(sed -n 's/^# requested: //p' "$file")) into $dir"
      _tools_venv "$dir" || exit 1
      _tools_pip "$dir" -r "$file" || {
        _tools_log "pip install -r scripts/tools/$set.txt failed"
        rm -rf "$dir"
        exit 1
      }
      touch "$dir/.complete"
    ) 9>"$dir.lock" || return 1
  fi
  printf '%s\n' "$dir/bin"
}

# tools_lock SET: re-resolve SET's `# requested:` line and write its file anew.
tools_lock() {
  local set="$1" file requested scratch header
  file="$_TOOLS_LOCKS/$set.txt"
  requested="$(sed -n 's/^# requested: //p' "$file" 2>/dev/null)"
  [ -n "$requested" ] || {
    _tools_log "scripts/tools/$set.txt has no '# requested:' line"
    return 1
  }
  scratch="$(mktemp -d)"
  _tools_venv "$scratch/venv" || return 1
  # shellcheck disable=SC2086 # the requested line is a list of requirements
  _tools_pip "$scratch/venv" $requested || return 1
  header="$(sed -n '/^#/p' "$file")"
  {
    printf '%s\n' "$header"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$scratch/venv/bin/python" -m pip freeze --all |
      grep -v -E '^(pip|setuptools|wheel)=='
  } >"$file.new" && mv "$file.new" "$file"
  rm -rf "$scratch"
  _tools_log "wrote scripts/tools/$set.txt"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    bin) tools_bin "${2:?set}" ;;
    lock) tools_lock "${2:?set}" ;;
    *)
      sed -n '2,/^$/{/^$/!p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 2
      ;;
  esac
fi
