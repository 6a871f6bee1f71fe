# shellcheck shell=bash
# scripts/browser.sh: the browser the console's tests drive (tests/browser, docs/design.md
# §1.5): Debian's Chromium and its WebDriver server, chromedriver, pinned to one version.
#
#   source scripts/stack.sh       # (for _stack_apt_install, _stack_spawn, _stack_log)
#   source scripts/browser.sh
#   ensure_browser                # install chromium and chromium-driver at
#                                 # STACK_CHROMIUM_VERSION unless that version is installed
#   start_chromedriver 61945      # chromedriver on 127.0.0.1:61945, its pid in
#                                 # .dev/chromedriver-61945.pid, waits until it is ready
#   stop_chromedriver 61945       # stops that chromedriver (and the browsers under it) by pid
#
# The version is the one Debian bookworm's security archive serves; the archive keeps only
# its newest build, so when a security update replaces it, `ensure_browser` says which
# versions apt offers and this line is moved to the new one (chromium, chromium-common and
# chromium-driver always share a version). The tests start the browser themselves, through
# chromedriver, headless with a fresh profile and nothing fetched from outside
# (tests/browser/src/lib.rs).

# shellcheck disable=SC2034 # read by scripts that source this file
STACK_CHROMIUM_VERSION=156.0.8078.114-1~deb12u1
STACK_CHROMIUM_BIN=/usr/bin/chromium
STACK_CHROMEDRIVER_BIN=/usr/bin/chromedriver

_STACK_BROWSER_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The installed version of Debian package $1, or nothing.
_browser_installed_version() {
  dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null |
    sed -n 's/^ii *//p' | head -n 1
}

# ensure_browser: chromium, chromium-common and chromium-driver at STACK_CHROMIUM_VERSION
# (apt, as root); a no-op when that version of each is installed.
ensure_browser() {
  local pkg missing=""
  for pkg in chromium chromium-common chromium-driver; do
    if [ "$(_browser_installed_version "$pkg")" != "$STACK_CHROMIUM_VERSION" ]; then
      missing="$missing $pkg=$STACK_CHROMIUM_VERSION"
    fi
  done
  if [ -z "$missing" ] && [ -x "$STACK_CHROMIUM_BIN" ] && [ -x "$STACK_CHROMEDRIVER_BIN" ]; then
    _stack_log "browser: chromium and chromedriver $STACK_CHROMIUM_VERSION installed"
    return 0
  fi
  _stack_log "browser: installing${missing}"
  # shellcheck disable=SC2086 # a list of package=version words
  if ! _stack_apt_install $missing; then
    _stack_err "browser: apt could not install chromium $STACK_CHROMIUM_VERSION; what apt offers:"
    apt-cache policy chromium chromium-driver >&2 || true
    _stack_err "browser: move STACK_CHROMIUM_VERSION in scripts/browser.sh to an offered version"
    return 1
  fi
  "$STACK_CHROMEDRIVER_BIN" --version >&2 || {
    _stack_err "browser: $STACK_CHROMEDRIVER_BIN does not run"
    return 1
  }
}

_browser_pidfile() {
  printf '%s/.dev/chromedriver-%s.pid\n' "$_STACK_BROWSER_ROOT" "$1"
}

# The processes under pid $1 (children, theirs, …): the browsers chromedriver started.
_browser_descendants() {
  local p
  for p in $(pgrep -P "$1" 2>/dev/null); do
    echo "$p"
    _browser_descendants "$p"
  done
}

# start_chromedriver PORT: chromedriver on 127.0.0.1:PORT (only local clients), in a session of
# its own, its pid in .dev/chromedriver-PORT.pid and its log in .dev/chromedriver-PORT.log;
# returns once it answers ready (30 s at most). Refuses a port that something else holds.
start_chromedriver() {
  local port="$1" pidfile log pid i
  [ -n "$port" ] || {
    _stack_err "start_chromedriver: name a port"
    return 1
  }
  pidfile="$(_browser_pidfile "$port")"
  log="$_STACK_BROWSER_ROOT/.dev/chromedriver-$port.log"
  mkdir -p "$_STACK_BROWSER_ROOT/.dev" || return 1
  if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/status"; then
    _stack_err "browser: 127.0.0.1:$port is in use by $(stack_port_holder "$port" || true); stop it or choose another port"
    return 1
  fi
  : >"$log"
  pid="$(_stack_spawn "$log" "$STACK_CHROMEDRIVER_BIN" --port="$port" --allowed-ips=127.0.0.1)"
  printf '%s\n' "$pid" >"$pidfile"
  for i in $(seq 1 120); do
    if curl -s --max-time 2 "http://127.0.0.1:$port/status" 2>/dev/null | grep -q '"ready": *true'; then
      _stack_log "browser: chromedriver ready on 127.0.0.1:$port (pid $pid, log $log)"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      _stack_err "browser: chromedriver exited; its log:"
      tail -n 20 "$log" >&2
      rm -f "$pidfile"
      return 1
    fi
    [ "$i" = 120 ] || sleep 0.25
  done
  _stack_err "browser: chromedriver (pid $pid) not ready on 127.0.0.1:$port after 30 s (see $log)"
  stop_chromedriver "$port"
  return 1
}

# stop_chromedriver PORT: stops the chromedriver start_chromedriver recorded for PORT, if its
# pid still runs chromedriver, and any browser left under it; nothing else.
stop_chromedriver() {
  local port="$1" pidfile pid under left p i
  pidfile="$(_browser_pidfile "$port")"
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  if [ -z "$pid" ] || ! _stack_pid_is "$pid" "chromedriver --port=$port( |\$)"; then
    rm -f "$pidfile"
    _stack_log "browser: no chromedriver of this checkout runs on 127.0.0.1:$port"
    return 0
  fi
  # taken first: once chromedriver has ended, its browsers no longer have it as parent
  under="$(_browser_descendants "$pid")"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 40); do
    _stack_alive "$pid" || break
    [ "$i" = 40 ] && kill -KILL "$pid" 2>/dev/null
    sleep 0.25
  done
  left=""
  for p in $under; do
    if _stack_alive "$p"; then left="$left $p"; fi
  done
  if [ -n "$left" ]; then
    # shellcheck disable=SC2086 # a list of pids
    kill -TERM $left 2>/dev/null || true
    sleep 1
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
  fi
  rm -f "$pidfile"
  _stack_log "browser: chromedriver on 127.0.0.1:$port stopped (pid $pid${left:+; browsers left under it:$left})"
}
