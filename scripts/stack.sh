# shellcheck shell=bash
# scripts/stack.sh: the local stack (Postgres 15, an SQS server, moto for the other AWS
# services, and PgBouncer in transaction mode in front of Postgres, as RDS Proxy would be),
# shared by scripts/dev, scripts/test and .ci/run.
#
# Source it, then call the functions:
#
#   source scripts/stack.sh
#   stack_env        # export DATABASE_URL, QUEUE_URL, EFFECTS_QUEUE_URL, AWS_*, INBOX_*, and where
#                    # inboxctl finds the intake (INTAKE_URL, INBOX_INVOKE_URL: INBOX_INTAKE_PORT,
#                    # else the port the running scripts/dev recorded, else 61900); caller's values win
#   stack_sources_env [inboxctl]  # export INBOX_SOURCES, the dev sources (needs a built inboxctl)
#   stack_effects_env  # effects on: INBOX_EFFECTS, a webhook sink at the local `inboxctl listen`
#   ensure_services  # install what is missing, start what is not running
#   stop_sqs; stop_aws; stop_pgbouncer; stop_postgres
#
# Everything is idempotent: installing or starting something that is already
# there is a no-op. State lives under $ROOT/.dev (git-ignored):
#   .dev/pg/data   Postgres data directory (owned by the postgres user)
#   .dev/pg/run    Postgres unix socket directory
#   .dev/pg/log    Postgres server log
#   .dev/sqs.log   SQS server log (local-aws-sqs),  .dev/sqs.pid  its pid
#   .dev/sqs-server  its npm install (scripts/sqs-server, pinned by its package-lock.json)
#   .dev/moto.log  moto log (Secrets Manager and the other AWS services),  .dev/moto.pid
#   .dev/pgbouncer/  PgBouncer's configuration, log and pid file
#   .dev/pipeline/<port>  what a running scripts/dev started (its intake port, its pids)
#
# Ports: Postgres 127.0.0.1:${INBOX_PG_PORT:-61320},
#        SQS      127.0.0.1:${INBOX_SQS_PORT:-61326} (AWS_ENDPOINT_URL_SQS),
#        moto     127.0.0.1:${INBOX_AWS_PORT:-61324} (AWS_ENDPOINT_URL, every other service),
#        PgBouncer 127.0.0.1:${INBOX_PGBOUNCER_PORT:-61327} (transaction mode, 2 server
#                 connections per database; tests/api/pooler.rs, docs/deploy.md "RDS Proxy").
#        provider fakes 127.0.0.1:${INBOX_FAKES_PORT:-61340} to +4 (`inboxctl fakes`, started by
#                 scripts/dev: Stripe, Polar, Kinde, Paddle, Lemon Squeezy; docs/design.md §6.6).
#
# Functions return non-zero (with a message on stderr) on failure; they never
# `exit`, so the file can also be sourced into an interactive shell. They work
# with and without `set -euo pipefail`.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The inboxctl a build of this tree makes: under CARGO_TARGET_DIR when it is set, as cargo
# puts it (a relative one is taken from the tree's root, where the scripts run cargo).
INBOXCTL="${CARGO_TARGET_DIR:-target}/debug/inboxctl"
case "$INBOXCTL" in /*) ;; *) INBOXCTL="$ROOT/$INBOXCTL" ;; esac
# the pinned PyPI tools (moto, cargo-lambda; sam and cfn-lint for check-template)
# shellcheck source=scripts/tools.sh
source "$ROOT/scripts/tools.sh"

STACK_PG_VERSION=15
STACK_PG_BIN="/usr/lib/postgresql/${STACK_PG_VERSION}/bin"
STACK_PG_DB=billing_inbox
# Debian bookworm's PgBouncer: 1.18 keeps no prepared statement across server connections in
# transaction mode (that came in 1.21), so a named statement fails through it, as it pins a
# session on RDS Proxy: the proof that the functions name none with DATABASE_POOLER=transaction.
STACK_PGBOUNCER_VERSION=1.18.0-1+deb12u1
STACK_QUEUE_NAME=billing-inbox
# the queue of effect ids, from the worker to the dispatcher
STACK_EFFECTS_QUEUE_NAME=billing-inbox-effects
# the account id in queue URLs (moto's default, and what serve.js sets)
STACK_SQS_ACCOUNT=123456789012

# Set to 1 by ensure_postgres / ensure_sqs when *they* started the service
# (so a caller such as .ci/run can stop only what it started).
STACK_STARTED_PG=${STACK_STARTED_PG:-0}
STACK_STARTED_SQS=${STACK_STARTED_SQS:-0}
STACK_STARTED_AWS=${STACK_STARTED_AWS:-0}
STACK_STARTED_PGBOUNCER=${STACK_STARTED_PGBOUNCER:-0}

_STACK_APT_UPDATED=${_STACK_APT_UPDATED:-0}

_stack_log() { printf '%s\n' "$*" >&2; }
_stack_err() { printf 'error: %s\n' "$*" >&2; }

# stack_env: export the environment every script, function and test uses.
# A variable that the caller already set is left as it is.
# (SC2089/SC2090: the JSON quotes are meant to be literal.)
# shellcheck disable=SC2089,SC2090
stack_env() {
  : "${INBOX_PG_PORT:=61320}"
  : "${INBOX_SQS_PORT:=61326}"
  : "${INBOX_AWS_PORT:=61324}"
  : "${INBOX_PGBOUNCER_PORT:=61327}"
  export INBOX_PG_PORT INBOX_SQS_PORT INBOX_AWS_PORT INBOX_PGBOUNCER_PORT

  # plain `psql` reaches the dev server too
  : "${PGHOST:=127.0.0.1}"
  : "${PGPORT:=$INBOX_PG_PORT}"
  : "${PGUSER:=postgres}"
  export PGHOST PGPORT PGUSER

  # trust auth on loopback: no password
  : "${DATABASE_URL:=postgres://postgres@127.0.0.1:${INBOX_PG_PORT}/${STACK_PG_DB}}"
  export DATABASE_URL

  # SQS goes to the SQS server; every other service (Secrets Manager) to moto.
  : "${AWS_ENDPOINT_URL:=http://127.0.0.1:${INBOX_AWS_PORT}}"
  : "${AWS_ENDPOINT_URL_SQS:=http://127.0.0.1:${INBOX_SQS_PORT}}"
  export AWS_ENDPOINT_URL_SQS
  : "${AWS_REGION:=us-east-1}"
  : "${AWS_DEFAULT_REGION:=$AWS_REGION}"
  : "${AWS_ACCESS_KEY_ID:=test}"
  : "${AWS_SECRET_ACCESS_KEY:=test}"
  export AWS_ENDPOINT_URL AWS_REGION AWS_DEFAULT_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY

  # exactly what the SQS server answers to CreateQueue (see ensure_sqs)
  : "${QUEUE_URL:=http://127.0.0.1:${INBOX_SQS_PORT}/${STACK_SQS_ACCOUNT}/${STACK_QUEUE_NAME}}"
  export QUEUE_URL
  : "${EFFECTS_QUEUE_URL:=http://127.0.0.1:${INBOX_SQS_PORT}/${STACK_SQS_ACCOUNT}/${STACK_EFFECTS_QUEUE_NAME}}"
  export EFFECTS_QUEUE_URL
  : "${INBOX_LISTEN_PORT:=61920}"
  export INBOX_LISTEN_PORT
  # the provider fakes' first port (`inboxctl fakes`: one port per provider, from this one)
  : "${INBOX_FAKES_PORT:=61340}"
  export INBOX_FAKES_PORT

  # Where inboxctl finds the functions (send, scenario, dev): one port, the intake's. A shell
  # that did not choose one follows the scripts/dev running in this checkout, if any. A URL
  # this function set before is made again, so that a moved port is followed.
  if [ -z "${INBOX_INTAKE_PORT:-}" ]; then
    INBOX_INTAKE_PORT="$(_stack_recorded_intake_port)"
    : "${INBOX_INTAKE_PORT:=61900}"
  fi
  export INBOX_INTAKE_PORT
  if [ -z "${INBOX_INVOKE_URL:-}" ] || [ "$INBOX_INVOKE_URL" = "${_STACK_INVOKE_URL:-}" ]; then
    INBOX_INVOKE_URL="http://127.0.0.1:${INBOX_INTAKE_PORT}"
    _STACK_INVOKE_URL="$INBOX_INVOKE_URL"
  fi
  if [ -z "${INTAKE_URL:-}" ] || [ "$INTAKE_URL" = "${_STACK_INTAKE_URL:-}" ]; then
    INTAKE_URL="http://127.0.0.1:${INBOX_INTAKE_PORT}/lambda-url/intake"
    _STACK_INTAKE_URL="$INTAKE_URL"
  fi
  export INBOX_INVOKE_URL INTAKE_URL

  # development plans; the sources come from the providers' fixtures (stack_sources_env),
  # through inboxctl: here when it is built, else after the build of the script that needs them
  local dev_plans
  : "${INBOX_JWKS_PORT:=61325}"
  export INBOX_JWKS_PORT
  # (each plan's features, docs/design.md §4.12: what the app's feature check answers)
  local pro_features='"features":{"sso":true,"seats":20,"export":"csv"}'
  local team_features='"features":{"sso":true,"seats":100,"export":"csv","audit-log":true}'
  dev_plans='{"free":{"plan":"free","monthly_allowance":10,"features":{"seats":1}},"pro":{"plan":"pro","monthly_allowance":500,'"$pro_features"'},"price_pro":{"plan":"pro","monthly_allowance":500,'"$pro_features"'},"prod_pro":{"plan":"pro","monthly_allowance":500,'"$pro_features"'},"team":{"plan":"team","monthly_allowance":2000,'"$team_features"'},"price_team":{"plan":"team","monthly_allowance":2000,'"$team_features"'},"prod_team":{"plan":"team","monthly_allowance":2000,'"$team_features"'}}'
  # Paddle's catalogs are keyed by price ids, Lemon Squeezy's by variant ids: the ones the
  # development deliveries carry (the providers' fixtures: DEV_PRICE, DEV_VARIANT and the team's)
  dev_plans="${dev_plans%\}},"'"pri_01gsz8x8sawmvhz1pv30nge1ke":{"plan":"pro","monthly_allowance":500,'"$pro_features"'},"pri_01h84cdy3xatsp16afda2gekzy":{"plan":"team","monthly_allowance":2000,'"$team_features"'}}'
  dev_plans="${dev_plans%\}},"'"101":{"plan":"pro","monthly_allowance":500,'"$pro_features"'},"102":{"plan":"team","monthly_allowance":2000,'"$team_features"'}}'
  [ -n "${INBOX_PLANS:-}" ] || INBOX_PLANS="$dev_plans"
  export INBOX_PLANS
  if [ -x "$INBOXCTL" ]; then
    stack_sources_env "$INBOXCTL" 2>/dev/null || true
  fi
  # the app API's dev keys (dev-only; scripts/dev prints them): INBOX_API_KEYS lists their
  # hashes. The app's key reads, debits and replays its accounts' events; the admin key opens
  # the console and the admin API; the reader only reads (the console refuses it).
  : "${INBOX_DEV_API_KEY:=bik_dev_local_only_0123456789abcdef0123456789abcdef}"
  : "${INBOX_DEV_ADMIN_KEY:=bik_dev_admin_local_only_0123456789abcdef01234567}"
  : "${INBOX_DEV_READ_KEY:=bik_dev_reader_local_only_0123456789abcdef0123456}"
  export INBOX_DEV_API_KEY INBOX_DEV_ADMIN_KEY INBOX_DEV_READ_KEY
  if [ -z "${INBOX_API_KEYS:-}" ]; then
    INBOX_API_KEYS='[{"name":"dev","sha256":"'"$(printf %s "$INBOX_DEV_API_KEY" | sha256sum | cut -d' ' -f1)"'","scopes":["read","usage","replay"]},'
    INBOX_API_KEYS+='{"name":"dev-admin","sha256":"'"$(printf %s "$INBOX_DEV_ADMIN_KEY" | sha256sum | cut -d' ' -f1)"'","scopes":["admin"]},'
    INBOX_API_KEYS+='{"name":"dev-reader","sha256":"'"$(printf %s "$INBOX_DEV_READ_KEY" | sha256sum | cut -d' ' -f1)"'","scopes":["read"]}]'
  fi
  export INBOX_API_KEYS
  # the local Kinde signing key, whose public half ensure_dev_kinde serves as a JWKS
  : "${INBOX_DEV_KINDE_KEY:=$ROOT/.dev/kinde/key.pem}"
  : "${INBOX_DEV_KINDE_KID:=dev-key}"
  export INBOX_DEV_KINDE_KEY INBOX_DEV_KINDE_KID
  # the console's Engine Room on the dev sources its scenarios run on (all test mode), Kinde
  # signed with the dev key its JWKS serves
  if [ -z "${INBOX_ENGINE_ROOM:-}" ]; then
    INBOX_ENGINE_ROOM='{"sources":["kinde","polar","stripe","paddle","lemonsqueezy"],"kinde_key_file":"'"$INBOX_DEV_KINDE_KEY"'","kinde_kid":"'"$INBOX_DEV_KINDE_KID"'"}'
  fi
  export INBOX_ENGINE_ROOM
  # cargo lambda watch serves the api function at /lambda-url/api and hands it the path
  # without: the console's links put it back
  : "${INBOX_CONSOLE_BASE:=/lambda-url/api}"
  export INBOX_CONSOLE_BASE
}

# --- the running pipeline (scripts/dev) -------------------------------------------
# scripts/dev records, per intake port, what it started: .dev/pipeline/<port>, lines of
# key=value (port, dev: its own pid, bridge: inboxctl dev's, listen: inboxctl listen's).

_STACK_PIPELINE_DIR="$ROOT/.dev/pipeline"

# The value of key $2 in record $1.
_stack_record_get() {
  sed -n "s/^$2=//p" "$1" 2>/dev/null | head -n 1
}

# 0 when pid $1 runs (exists and has not exited: a zombie waiting to be reaped has).
_stack_alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  case "${stat%% *}" in Z | X | x) return 1 ;; esac
  return 0
}

# 0 when pid $1 is alive and its command line matches the pattern $2 (read whole first: a
# `grep -q` that stops reading early fails the pipe under pipefail).
_stack_pid_is() {
  local cmdline
  { [ -n "$1" ] && _stack_alive "$1"; } || return 1
  cmdline="$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null)" || return 1
  [[ "$cmdline" =~ $2 ]]
}

# The intake ports of the scripts/dev pipelines of this checkout that are running, one a line.
stack_running_pipelines() {
  local record port
  for record in "$_STACK_PIPELINE_DIR"/*; do
    [ -f "$record" ] || continue
    port="$(_stack_record_get "$record" port)"
    if _stack_pid_is "$(_stack_record_get "$record" dev)" 'scripts/dev'; then
      printf '%s\n' "$port"
    fi
  done
}

# The intake port of the running scripts/dev, when there is one (61900's when several run).
_stack_recorded_intake_port() {
  local ports
  ports="$(stack_running_pipelines)"
  case "$(printf '%s' "$ports" | grep -c .)" in
    0) ;;
    1) printf '%s\n' "$ports" ;;
    *) printf '%s\n' "$ports" | grep -x 61900 || true ;;
  esac
}

# Who listens on 127.0.0.1:$1: "pid N (its command line)", or nothing when nobody does (or
# this user may not see it).
stack_port_holder() {
  local port="$1" line pid
  command -v ss >/dev/null 2>&1 || return 0
  line="$(ss -ltnpH "( sport = :$port )" 2>/dev/null | head -n 1)"
  [ -n "$line" ] || return 0
  pid="$(printf '%s' "$line" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n 1)"
  if [ -n "$pid" ]; then
    printf 'pid %s (%s)\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-120 | sed 's/ *$//')"
  else
    printf 'a process this user cannot see\n'
  fi
}

# stack_sources_env [inboxctl]: export INBOX_SOURCES (caller's value wins), the development
# sources: one per provider, with its dev-only secret (Kinde: the local JWKS), as each provider
# folder's fixtures configure it (`inboxctl dev sources`). $1 is the inboxctl to ask (default
# $INBOXCTL), so a script calls this after building it. A value this function set
# before is made again: the binary may be newer than when it was set. When the provider fakes
# run (scripts/dev starts them; STACK_DEV_FAKES=1 says they will), each source's provider API
# is the fake's (`api_base_url`, a test-mode `api_key`); else the sources have none, and
# nothing reads a provider.
_STACK_DEV_SOURCES=${_STACK_DEV_SOURCES:-}
stack_sources_env() {
  local bin="${1:-$INBOXCTL}" sources
  if [ -n "${INBOX_SOURCES:-}" ] && [ "$INBOX_SOURCES" != "$_STACK_DEV_SOURCES" ]; then
    return 0
  fi
  : "${INBOX_JWKS_PORT:=61325}"
  : "${INBOX_FAKES_PORT:=61340}"
  local fakes=()
  if [ "${STACK_DEV_FAKES:-0}" = 1 ] \
    || curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$INBOX_FAKES_PORT/_fake/" 2>/dev/null; then
    fakes=(--fakes-port "$INBOX_FAKES_PORT")
  fi
  sources="$("$bin" dev sources --jwks-url "http://127.0.0.1:$INBOX_JWKS_PORT/jwks.json" "${fakes[@]}")" || {
    _stack_err "sources: \`$bin dev sources\` failed (is inboxctl built?)"
    return 1
  }
  INBOX_SOURCES="$sources"
  _STACK_DEV_SOURCES="$sources"
  export INBOX_SOURCES INBOX_JWKS_PORT INBOX_FAKES_PORT
}

# stack_effects_env: turn effects on (export INBOX_EFFECTS, caller's value wins): one webhook
# sink pointing at the local receiver (`inboxctl listen` on INBOX_LISTEN_PORT, which
# scripts/dev starts), signed with a dev-only secret. Separate from stack_env so that tests,
# benchmarks and e2e runs keep effects off unless they ask.
# shellcheck disable=SC2089,SC2090
stack_effects_env() {
  : "${INBOX_LISTEN_PORT:=61920}"
  export INBOX_LISTEN_PORT
  local dev_effects
  dev_effects='[{"name":"app","kind":"webhook","url":"http://127.0.0.1:'"$INBOX_LISTEN_PORT"'/billing-events","secret":"whsec_YmlsbGluZy1pbmJveC1kZXYtZWZmZWN0cy1rZXktMDE="}]'
  [ -n "${INBOX_EFFECTS:-}" ] || INBOX_EFFECTS="$dev_effects"
  export INBOX_EFFECTS
}

# --- installing -------------------------------------------------------------

_stack_apt_install() {
  if [ "$(id -u)" != 0 ]; then
    _stack_err "need root to install Debian packages: $*"
    return 1
  fi
  if [ "$_STACK_APT_UPDATED" != 1 ]; then
    _stack_log "apt: updating package lists"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || {
      _stack_err "apt-get update failed"
      return 1
    }
    _STACK_APT_UPDATED=1
  fi
  _stack_log "apt: installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2 || {
    _stack_err "apt-get install $* failed"
    return 1
  }
}

_stack_ensure_curl() {
  command -v curl >/dev/null 2>&1 && return 0
  _stack_apt_install curl || return 1
}

# --- Postgres ---------------------------------------------------------------

_STACK_PG_DIR="$ROOT/.dev/pg"
_STACK_PG_DATA="$_STACK_PG_DIR/data"
_STACK_PG_LOG="$_STACK_PG_DIR/log"

# The socket path must stay under the kernel's 107-byte limit; a deep checkout
# gets a socket directory under /tmp instead.
_stack_pg_sockdir() {
  local dir="$_STACK_PG_DIR/run"
  local sock="$dir/.s.PGSQL.${INBOX_PG_PORT:-61320}.lock"
  if [ "${#sock}" -gt 100 ]; then
    dir="/tmp/billing-inbox-pg-$(printf '%s' "$ROOT" | cksum | cut -d' ' -f1)"
  fi
  printf '%s\n' "$dir"
}

# Run a Postgres server tool as the postgres user (as ourselves when not root).
_stack_as_pg() {
  if [ "$(id -u)" = 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

_stack_pg_ready() {
  "$STACK_PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$INBOX_PG_PORT" -t 2 >/dev/null 2>&1
}

_stack_psql() {
  "$STACK_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$INBOX_PG_PORT" -U postgres "$@"
}

# 0: our server is running; 1: it is not
_stack_pg_running() {
  local rc=0
  _stack_as_pg "$STACK_PG_BIN/pg_ctl" -D "$_STACK_PG_DATA" status >/dev/null 2>&1 || rc=$?
  [ "$rc" = 0 ]
}

ensure_postgres() {
  : "${INBOX_PG_PORT:=61320}"
  local port="$INBOX_PG_PORT" sockdir pid_file pid running_port d

  if [ ! -x "$STACK_PG_BIN/initdb" ]; then
    _stack_log "postgres: PostgreSQL ${STACK_PG_VERSION} is not installed; installing it"
    _stack_apt_install "postgresql-${STACK_PG_VERSION}" "postgresql-client-${STACK_PG_VERSION}" || return 1
  fi
  if ! id postgres >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    _stack_err "postgres: the postgres user does not exist (is postgresql-common installed?)"
    return 1
  fi

  sockdir="$(_stack_pg_sockdir)"
  mkdir -p "$_STACK_PG_DATA" "$sockdir" || return 1
  touch "$_STACK_PG_LOG" || return 1
  chmod 700 "$_STACK_PG_DATA"
  if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$_STACK_PG_DIR" "$_STACK_PG_DATA" "$sockdir" "$_STACK_PG_LOG"
    chmod 755 "$_STACK_PG_DIR"
    # The postgres user must be able to traverse every parent of its data dir.
    d="$_STACK_PG_DIR"
    while [ "$d" != / ] && [ -n "$d" ]; do
      if ! runuser -u postgres -- test -x "$d" 2>/dev/null; then
        chmod o+x "$d" || return 1
      fi
      d="$(dirname "$d")"
    done
  fi

  if [ ! -f "$_STACK_PG_DATA/PG_VERSION" ]; then
    if [ -n "$(ls -A "$_STACK_PG_DATA")" ]; then
      # no PG_VERSION: an initdb that did not finish; it holds no data
      _stack_log "postgres: $_STACK_PG_DATA is an unfinished cluster; recreating it"
      find "$_STACK_PG_DATA" -mindepth 1 -delete || return 1
    fi
    _stack_log "postgres: initializing $_STACK_PG_DATA"
    _stack_as_pg "$STACK_PG_BIN/initdb" -D "$_STACK_PG_DATA" --auth=trust -U postgres \
      --encoding=UTF8 --locale=C >"$_STACK_PG_DIR/initdb.log" 2>&1 || {
      _stack_err "postgres: initdb failed (see $_STACK_PG_DIR/initdb.log):"
      tail -n 20 "$_STACK_PG_DIR/initdb.log" >&2
      return 1
    }
  fi

  pid_file="$_STACK_PG_DATA/postmaster.pid"
  if _stack_pg_running; then
    pid="$(sed -n 1p "$pid_file" 2>/dev/null || true)"
    running_port="$(sed -n 4p "$pid_file" 2>/dev/null || true)"
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" != postgres ]; then
      # the pid in postmaster.pid now belongs to an unrelated process
      _stack_log "postgres: removing stale $pid_file (pid $pid is not a postgres server)"
      rm -f "$pid_file"
    elif [ -n "$running_port" ] && [ "$running_port" != "$port" ]; then
      _stack_err "postgres: this checkout's server is running on port $running_port, not $port; stop it first (scripts/dev stop with INBOX_PG_PORT=$running_port)"
      return 1
    fi
  elif [ -f "$pid_file" ]; then
    # left behind by an unclean stop (killed process, machine restart)
    _stack_log "postgres: removing stale $pid_file"
    rm -f "$pid_file"
  fi

  if _stack_pg_running; then
    _stack_log "postgres: already running on 127.0.0.1:$port"
  else
    # pg_isready: 0 accepting, 1 rejecting (starting up), 2 no answer
    local isready=0
    "$STACK_PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -t 2 >/dev/null 2>&1 || isready=$?
    if [ "$isready" = 0 ] || [ "$isready" = 1 ]; then
      _stack_err "postgres: another server already listens on 127.0.0.1:$port (not $_STACK_PG_DATA); stop it or set INBOX_PG_PORT"
      return 1
    fi
    _stack_log "postgres: starting on 127.0.0.1:$port (data $_STACK_PG_DATA, log $_STACK_PG_LOG)"
    # fsync, synchronous_commit and full_page_writes are off: this cluster only
    # ever holds development and test data, and a crash may lose it.
    if ! _stack_as_pg "$STACK_PG_BIN/pg_ctl" -D "$_STACK_PG_DATA" -l "$_STACK_PG_LOG" -w -t 60 \
      -o "-p $port -k '$sockdir' -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
      start >/dev/null 2>&1; then
      _stack_err "postgres: failed to start; last lines of $_STACK_PG_LOG:"
      tail -n 20 "$_STACK_PG_LOG" >&2
      return 1
    fi
    STACK_STARTED_PG=1
  fi

  local i
  for i in $(seq 1 60); do
    _stack_pg_ready && break
    if [ "$i" = 60 ]; then
      _stack_err "postgres: not accepting connections on 127.0.0.1:$port after 30 s (see $_STACK_PG_LOG)"
      return 1
    fi
    sleep 0.5
  done

  local exists
  exists="$(_stack_psql -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$STACK_PG_DB'")" || {
    _stack_err "postgres: cannot query 127.0.0.1:$port as postgres"
    return 1
  }
  if [ "$exists" != 1 ]; then
    _stack_log "postgres: creating database $STACK_PG_DB"
    _stack_psql -d postgres -c "CREATE DATABASE $STACK_PG_DB" >/dev/null || return 1
  fi
  _stack_pg_auth_and_tls || return 1
  _stack_log "postgres: ready at postgres://postgres@127.0.0.1:$port/$STACK_PG_DB"
}

# Real password checks and TLS, for the tests of the database's secret (docs/design.md
# §5.3): members of the role password_users log in with a SCRAM password on loopback (the
# pg_hba.conf line comes before initdb's trust lines; nobody else is asked for one), and
# the server offers TLS with a certificate for localhost and 127.0.0.1 signed by a local CA
# (.dev/pg/tls/ca.crt; other-ca.crt signed nothing, for the test that a wrong CA is
# refused). Idempotent: the certificates are made once, the settings reloaded each time.
_stack_pg_auth_and_tls() {
  local tls="$_STACK_PG_DIR/tls" hba="$_STACK_PG_DATA/pg_hba.conf"
  if [ ! -s "$tls/server.crt" ] || [ ! -s "$tls/other-ca.crt" ]; then
    command -v openssl >/dev/null 2>&1 || _stack_apt_install openssl || return 1
    _stack_log "postgres: making a local CA and a server certificate in $tls"
    mkdir -p "$tls" || return 1
    (
      cd "$tls" || exit 1
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=billing-inbox local CA" \
        -keyout ca.key -out ca.crt >/dev/null 2>&1 &&
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=billing-inbox other CA" \
          -keyout other-ca.key -out other-ca.crt >/dev/null 2>&1 &&
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
          -keyout server.key -out server.csr >/dev/null 2>&1 &&
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext &&
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
          -extfile server.ext -out server.crt >/dev/null 2>&1
    ) || {
      _stack_err "postgres: openssl could not make the test certificates in $tls"
      return 1
    }
    chmod 600 "$tls/server.key"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$tls/server.key" "$tls/server.crt"
  fi
  if ! grep -q '+password_users' "$hba"; then
    _stack_as_pg sh -c "{ printf '%s\n' 'host all +password_users 127.0.0.1/32 scram-sha-256'; cat '$hba'; } >'$hba.new' && mv '$hba.new' '$hba'" || return 1
  fi
  _stack_psql -d postgres -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'password_users'" | grep -q 1 ||
    _stack_psql -d postgres -c "CREATE ROLE password_users NOLOGIN" >/dev/null || return 1
  _stack_psql -d postgres -c "ALTER SYSTEM SET ssl_cert_file = '$tls/server.crt'" \
    -c "ALTER SYSTEM SET ssl_key_file = '$tls/server.key'" -c "ALTER SYSTEM SET ssl = on" \
    -c "SELECT pg_reload_conf()" >/dev/null || return 1
}

stop_postgres() {
  : "${INBOX_PG_PORT:=61320}"
  if [ ! -f "$_STACK_PG_DATA/PG_VERSION" ] || [ ! -x "$STACK_PG_BIN/pg_ctl" ]; then
    _stack_log "postgres: not set up here; nothing to stop"
    return 0
  fi
  if ! _stack_pg_running; then
    _stack_log "postgres: not running"
    return 0
  fi
  _stack_log "postgres: stopping"
  _stack_as_pg "$STACK_PG_BIN/pg_ctl" -D "$_STACK_PG_DATA" -m fast -w -t 60 stop >/dev/null || {
    _stack_err "postgres: pg_ctl stop failed (see $_STACK_PG_LOG)"
    return 1
  }
  _stack_log "postgres: stopped"
}

# --- PgBouncer ---------------------------------------------------------------
# A transaction-mode pooler in front of the local Postgres, as RDS Proxy stands in front of
# the deployed one: each transaction may run on another of its (at most 2 per database)
# server connections, and nothing resets a server connection between clients, so a named
# prepared statement stays there to be seen (tests/api/pooler.rs).

_STACK_PGB_DIR="$ROOT/.dev/pgbouncer"
_STACK_PGB_BIN=/usr/sbin/pgbouncer

# ensure_pgbouncer: install the pinned PgBouncer if it is missing, write its configuration,
# start it on INBOX_PGBOUNCER_PORT unless it already runs there with it. Needs Postgres.
ensure_pgbouncer() {
  : "${INBOX_PG_PORT:=61320}"
  : "${INBOX_PGBOUNCER_PORT:=61327}"
  local port="$INBOX_PGBOUNCER_PORT" pidfile="$_STACK_PGB_DIR/pgbouncer.pid" pid i
  if [ ! -x "$_STACK_PGB_BIN" ]; then
    _stack_log "pgbouncer: not installed; installing pgbouncer=$STACK_PGBOUNCER_VERSION"
    _stack_apt_install "pgbouncer=$STACK_PGBOUNCER_VERSION" || return 1
  fi
  mkdir -p "$_STACK_PGB_DIR" || return 1
  # Every database of the local server, as the postgres user: loopback is trusted by
  # Postgres (ensure_postgres), and so by PgBouncer, which still wants the user listed.
  printf '"postgres" ""\n' >"$_STACK_PGB_DIR/userlist.txt" || return 1
  cat >"$_STACK_PGB_DIR/pgbouncer.ini.new" <<EOF || return 1
[databases]
* = host=127.0.0.1 port=$INBOX_PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $_STACK_PGB_DIR/userlist.txt
pool_mode = transaction
default_pool_size = 2
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
server_round_robin = 0
; sqlx sends it at startup; PgBouncer 1.18 refuses a startup parameter it does not track
ignore_startup_parameters = extra_float_digits
logfile = $_STACK_PGB_DIR/pgbouncer.log
pidfile = $pidfile
EOF
  if [ "$(id -u)" = 0 ]; then
    # PgBouncer refuses to run as root: it runs as postgres, which must write here.
    chown -R postgres:postgres "$_STACK_PGB_DIR" || return 1
  fi
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = pgbouncer ]; then
    if cmp -s "$_STACK_PGB_DIR/pgbouncer.ini.new" "$_STACK_PGB_DIR/pgbouncer.ini"; then
      rm -f "$_STACK_PGB_DIR/pgbouncer.ini.new"
      _stack_log "pgbouncer: already running on 127.0.0.1:$port"
      return 0
    fi
    _stack_log "pgbouncer: its configuration changed; restarting it"
    stop_pgbouncer || return 1
  fi
  mv "$_STACK_PGB_DIR/pgbouncer.ini.new" "$_STACK_PGB_DIR/pgbouncer.ini" || return 1
  local isready=0
  "$STACK_PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1 >/dev/null 2>&1 || isready=$?
  if [ "$isready" = 0 ] || [ "$isready" = 1 ]; then
    _stack_err "pgbouncer: something else answers on 127.0.0.1:$port; stop it or set INBOX_PGBOUNCER_PORT"
    return 1
  fi
  _stack_log "pgbouncer: starting on 127.0.0.1:$port (transaction mode, log $_STACK_PGB_DIR/pgbouncer.log)"
  _stack_as_pg "$_STACK_PGB_BIN" -d -q "$_STACK_PGB_DIR/pgbouncer.ini" || {
    _stack_err "pgbouncer: failed to start; last lines of its log:"
    tail -n 20 "$_STACK_PGB_DIR/pgbouncer.log" >&2
    return 1
  }
  for i in $(seq 1 40); do
    "$STACK_PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1 >/dev/null 2>&1 && break
    if [ "$i" = 40 ]; then
      _stack_err "pgbouncer: not accepting connections on 127.0.0.1:$port after 10 s (see $_STACK_PGB_DIR/pgbouncer.log)"
      return 1
    fi
    sleep 0.25
  done
  STACK_STARTED_PGBOUNCER=1
  _stack_log "pgbouncer: ready at postgres://postgres@127.0.0.1:$port/$STACK_PG_DB"
}

stop_pgbouncer() {
  _stack_stop_pidfile "$_STACK_PGB_DIR/pgbouncer.pid" "pgbouncer .*$_STACK_PGB_DIR/pgbouncer\.ini" "pgbouncer" && return 0
  _stack_log "pgbouncer: not running"
}

# --- SQS calls (either server) ------------------------------------------------

# One SQS call with the JSON protocol (what aws-sdk-sqs speaks) to the server on
# port $3 (default: the SQS server). moto picks the service from the credential
# scope of the Authorization header (without one it answers as S3); neither
# server checks the signature.
# Prints the body; returns non-zero when nothing answers or on an HTTP error.
_stack_sqs_call() {
  local action="$1" payload="$2" port="${3:-$INBOX_SQS_PORT}"
  curl -sS --max-time 5 --fail-with-body \
    -H "Content-Type: application/x-amz-json-1.0" \
    -H "X-Amz-Target: AmazonSQS.$action" \
    -H "Authorization: AWS4-HMAC-SHA256 Credential=${AWS_ACCESS_KEY_ID:-test}/20240101/${AWS_REGION:-us-east-1}/sqs/aws4_request, SignedHeaders=host, Signature=0" \
    --data "$payload" \
    "http://127.0.0.1:${port}/"
}

# 0: an SQS server answers on port $1; 1: nothing answers; 2: something else answers
_stack_sqs_probe() {
  local code body
  body="$(_stack_sqs_call ListQueues '{}' "${1:-$INBOX_SQS_PORT}" 2>/dev/null)" && code=0 || code=$?
  if [ "$code" = 0 ]; then
    case "$body" in *QueueUrls* | "{}") return 0 ;; esac
    return 2
  fi
  # curl exit 7: connection refused, 28: timeout, 52: empty reply
  case "$code" in 7 | 28 | 52 | 56) return 1 ;; esac
  return 2
}

# Whether the server $3 (for the log line's prefix $2) runs on port $1: 0 it
# does (said), 1 nothing answers, 2 something else does (said, with the
# variable $4 that moves the port).
_stack_server_on() {
  local port="$1" prefix="$2" what="$3" var="$4" probe=0
  _stack_ensure_curl || return 2
  _stack_sqs_probe "$port" || probe=$?
  case "$probe" in
    0) _stack_log "$prefix: $what already running on 127.0.0.1:$port" ;;
    2) _stack_err "$prefix: something that is not $what answers on 127.0.0.1:$port; stop it or set $var" ;;
  esac
  return "$probe"
}

# Starts "$@" in its own session, no terminal, no inherited stdio, so that it
# outlives this script and a Ctrl-C in it (from a subshell without job control,
# so that setsid does not fork and $! is the server itself); logs to $1.
_stack_spawn() {
  local log="$1"
  shift
  (
    set +m
    setsid nohup "$@" </dev/null >>"$log" 2>&1 &
    echo $!
  )
}

# Waits until the server on port $1 (pid $2, named $3, log $4) answers SQS calls.
_stack_wait_sqs_server() {
  local port="$1" pid="$2" name="$3" log="$4" i probe
  for i in $(seq 1 60); do
    probe=0
    _stack_sqs_probe "$port" || probe=$?
    [ "$probe" = 0 ] && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      _stack_err "$name exited; last lines of $log:"
      tail -n 20 "$log" >&2
      return 1
    fi
    if [ "$i" = 60 ]; then
      _stack_err "$name (pid $pid) does not answer on 127.0.0.1:$port after 30 s (see $log)"
      return 1
    fi
    sleep 0.5
  done
}

# Stops the process in pid file $1 if its command line matches $2; $3 names it.
_stack_stop_pidfile() {
  local pidfile="$1" pattern="$2" name="$3" pid="" i
  [ -f "$pidfile" ] && pid="$(cat "$pidfile" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -Eq "$pattern"; then
    _stack_log "$name: stopping (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 40); do
      kill -0 "$pid" 2>/dev/null || break
      if [ "$i" = 40 ]; then
        kill -KILL "$pid" 2>/dev/null || true
      fi
      sleep 0.25
    done
    rm -f "$pidfile"
    _stack_log "$name: stopped"
    return 0
  fi
  rm -f "$pidfile"
  return 1
}

# --- SQS (local-aws-sqs) ------------------------------------------------------
# An in-memory SQS server on Node.js, chosen on measured throughput and fidelity
# (docs/design.md §1.5); installed from the npm registry at the version its
# package-lock.json pins.

_STACK_SQS_LOG="$ROOT/.dev/sqs.log"
_STACK_SQS_PID="$ROOT/.dev/sqs.pid"
_STACK_SQS_DIR="$ROOT/.dev/sqs-server"

_stack_ensure_node() {
  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    return 0
  fi
  _stack_log "sqs: Node.js is not installed; installing it"
  _stack_apt_install nodejs npm || return 1
}

# npm ci into .dev/sqs-server when the pinned lock file changed (or on first use).
_stack_install_sqs_server() {
  local src="$ROOT/scripts/sqs-server"
  if [ -f "$_STACK_SQS_DIR/node_modules/local-aws-sqs/package.json" ] &&
    cmp -s "$src/package-lock.json" "$_STACK_SQS_DIR/package-lock.json"; then
    cp "$src/serve.js" "$_STACK_SQS_DIR/serve.js" || return 1
    return 0
  fi
  _stack_ensure_node || return 1
  _stack_log "sqs: installing local-aws-sqs (npm ci, pinned by scripts/sqs-server/package-lock.json)"
  mkdir -p "$_STACK_SQS_DIR" || return 1
  cp "$src/package.json" "$src/package-lock.json" "$src/serve.js" "$_STACK_SQS_DIR/" || return 1
  (cd "$_STACK_SQS_DIR" && npm ci --no-audit --no-fund --loglevel=error >&2) || {
    _stack_err "sqs: npm ci in $_STACK_SQS_DIR failed"
    return 1
  }
}

ensure_sqs() {
  : "${INBOX_SQS_PORT:=61326}"
  local port="$INBOX_SQS_PORT" probe pid

  probe=0
  _stack_server_on "$port" sqs "an SQS server" INBOX_SQS_PORT || probe=$?
  [ "$probe" = 2 ] && return 1
  if [ "$probe" = 1 ]; then
    _stack_install_sqs_server || return 1
    _stack_ensure_node || return 1
    mkdir -p "$ROOT/.dev" || return 1
    _stack_log "sqs: starting local-aws-sqs on 127.0.0.1:$port (log $_STACK_SQS_LOG)"
    pid="$(_stack_spawn "$_STACK_SQS_LOG" node "$_STACK_SQS_DIR/serve.js" "$port")"
    printf '%s\n' "$pid" >"$_STACK_SQS_PID"
    _stack_wait_sqs_server "$port" "$pid" "sqs: local-aws-sqs" "$_STACK_SQS_LOG" || {
      rm -f "$_STACK_SQS_PID"
      return 1
    }
    STACK_STARTED_SQS=1
  fi

  _stack_create_queue "$STACK_QUEUE_NAME" "${QUEUE_URL:-}" QUEUE_URL || return 1
  _stack_create_queue "$STACK_EFFECTS_QUEUE_NAME" "${EFFECTS_QUEUE_URL:-}" EFFECTS_QUEUE_URL || return 1
}

# Creates queue $1 on the SQS server; warns when its URL is not $2 (the variable $3).
# CreateQueue with the same attributes is idempotent. The server keeps queues in memory, so
# this also recreates the queue after a restart.
_stack_create_queue() {
  local name="$1" expected="$2" var="$3" body url
  body="$(_stack_sqs_call CreateQueue "{\"QueueName\":\"$name\",\"Attributes\":{\"VisibilityTimeout\":\"180\"}}")" || {
    _stack_err "sqs: CreateQueue $name failed: $body"
    return 1
  }
  url="$(printf '%s' "$body" | sed -n 's/.*"QueueUrl": *"\([^"]*\)".*/\1/p')"
  if [ -z "$url" ]; then
    _stack_err "sqs: unexpected CreateQueue answer: $body"
    return 1
  fi
  if [ -n "$expected" ] && [ "$expected" != "$url" ]; then
    _stack_log "sqs: warning: $var=$expected but the server's queue is $url"
  fi
  _stack_log "sqs: queue ready at $url"
}

stop_sqs() {
  : "${INBOX_SQS_PORT:=61326}"
  _stack_stop_pidfile "$_STACK_SQS_PID" "serve\.js $INBOX_SQS_PORT( |\$)" "sqs" && return 0
  if command -v curl >/dev/null 2>&1 && _stack_sqs_probe "$INBOX_SQS_PORT"; then
    _stack_log "sqs: a server on 127.0.0.1:$INBOX_SQS_PORT was not started by these scripts; leaving it running"
  else
    _stack_log "sqs: not running"
  fi
}

# --- the other AWS services (moto_server) ---------------------------------------
# Secrets Manager in dev and tests (AWS_ENDPOINT_URL); SQS is not sent here.

_STACK_MOTO_LOG="$ROOT/.dev/moto.log"
_STACK_MOTO_PID="$ROOT/.dev/moto.pid"

# pid of the moto_server started (by these scripts) for this port, if any
_stack_moto_pid_on() {
  pgrep -o -f "moto_server -H 127\.0\.0\.1 -p $1( |\$)" 2>/dev/null || true
}

ensure_aws() {
  : "${INBOX_AWS_PORT:=61324}"
  local port="$INBOX_AWS_PORT" probe pid bin

  probe=0
  _stack_server_on "$port" aws "moto" INBOX_AWS_PORT || probe=$?
  [ "$probe" = 2 ] && return 1
  [ "$probe" = 0 ] && return 0
  # the pinned moto (scripts/tools/moto.txt), whatever else the machine has
  bin="$(tools_bin moto)" || return 1
  mkdir -p "$ROOT/.dev" || return 1
  _stack_log "aws: starting moto_server on 127.0.0.1:$port (log $_STACK_MOTO_LOG)"
  pid="$(_stack_spawn "$_STACK_MOTO_LOG" "$bin/moto_server" -H 127.0.0.1 -p "$port")"
  printf '%s\n' "$pid" >"$_STACK_MOTO_PID"
  _stack_wait_sqs_server "$port" "$pid" "aws: moto_server" "$_STACK_MOTO_LOG" || {
    rm -f "$_STACK_MOTO_PID"
    return 1
  }
  # record the pid of the process that actually serves the port
  local served_by
  served_by="$(_stack_moto_pid_on "$port")"
  if [ -n "$served_by" ] && [ "$served_by" != "$pid" ]; then
    printf '%s\n' "$served_by" >"$_STACK_MOTO_PID"
  fi
  STACK_STARTED_AWS=1
}

stop_aws() {
  : "${INBOX_AWS_PORT:=61324}"
  _stack_stop_pidfile "$_STACK_MOTO_PID" "moto_server -H 127\.0\.0\.1 -p $INBOX_AWS_PORT( |\$)" "aws: moto" && return 0
  if command -v curl >/dev/null 2>&1 && _stack_sqs_probe "$INBOX_AWS_PORT"; then
    _stack_log "aws: a server on 127.0.0.1:$INBOX_AWS_PORT was not started by these scripts; leaving it running"
  else
    _stack_log "aws: moto not running"
  fi
}

# --- cargo lambda -----------------------------------------------------------

# ensure_cargo_lambda: the pinned cargo-lambda (scripts/tools/cargo-lambda.txt) first on PATH,
# so `cargo lambda` and the zig it links with are that version, whatever else is installed.
ensure_cargo_lambda() {
  # inboxctl dev stops and restarts the functions' process group with kill(1).
  if ! type -P kill >/dev/null 2>&1 || ! type -P pgrep >/dev/null 2>&1; then
    _stack_apt_install procps || return 1
  fi
  local bin
  bin="$(tools_bin cargo-lambda)" || return 1
  case ":$PATH:" in
    *":$bin:"*) ;;
    *) export PATH="$bin:$PATH" ;;
  esac
  hash -r
  cargo lambda --version >/dev/null 2>&1 || {
    _stack_err "cargo-lambda: \`cargo lambda --version\` fails with $bin first on PATH"
    return 1
  }
  _stack_log "cargo-lambda: $(cargo lambda --version 2>/dev/null | head -n 1) ($bin)"
}

# --- a local Kinde: signing key and JWKS ------------------------------------

_STACK_JWKS_DIR="$ROOT/.dev/kinde"
_STACK_JWKS_PID="$ROOT/.dev/jwks.pid"

# ensure_dev_kinde: a dev RSA key (made once) and its JWKS served on loopback, so that
# `inboxctl send kinde …` deliveries verify like real Kinde tokens.
ensure_dev_kinde() {
  command -v openssl >/dev/null 2>&1 || _stack_apt_install openssl || return 1
  _stack_ensure_curl || return 1
  mkdir -p "$_STACK_JWKS_DIR"
  if [ ! -s "$INBOX_DEV_KINDE_KEY" ]; then
    openssl genrsa -out "$INBOX_DEV_KINDE_KEY" 2048 2>/dev/null || {
      _stack_err "kinde: could not make a signing key with openssl"
      return 1
    }
  fi
  local modulus
  modulus="$(openssl rsa -in "$INBOX_DEV_KINDE_KEY" -noout -modulus 2>/dev/null | cut -d= -f2)"
  python3 - "$modulus" "$INBOX_DEV_KINDE_KID" >"$_STACK_JWKS_DIR/jwks.json" <<'PY'
import base64, json, sys
b64u = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
n = bytes.fromhex(sys.argv[1])
print(json.dumps({"keys": [{"kty": "RSA", "kid": sys.argv[2], "alg": "RS256", "use": "sig",
                            "n": b64u(n), "e": b64u((65537).to_bytes(3, "big"))}]}))
PY
  local served
  if served="$(curl -fsS "http://127.0.0.1:$INBOX_JWKS_PORT/jwks.json" 2>/dev/null)"; then
    # Only our own key set will do: another checkout's server on this port would serve keys
    # this checkout's tokens do not match (every Kinde delivery then answered 401).
    if [ "$served" = "$(cat "$_STACK_JWKS_DIR/jwks.json")" ]; then
      _stack_log "kinde: JWKS already served at http://127.0.0.1:$INBOX_JWKS_PORT/jwks.json"
      return 0
    fi
    _stack_err "kinde: 127.0.0.1:$INBOX_JWKS_PORT serves another key set (another checkout's JWKS server?); stop it or set INBOX_JWKS_PORT"
    return 1
  fi
  # a session of its own, as the other services: it outlives the script that started it, and
  # stopping that script's pipeline (scripts/dev stop pipeline) leaves it running
  : >"$ROOT/.dev/jwks.log"
  _stack_spawn "$ROOT/.dev/jwks.log" python3 -m http.server "$INBOX_JWKS_PORT" --bind 127.0.0.1 \
    --directory "$_STACK_JWKS_DIR" >"$_STACK_JWKS_PID"
  local i
  for i in $(seq 1 50); do
    if curl -fsS "http://127.0.0.1:$INBOX_JWKS_PORT/jwks.json" >/dev/null 2>&1; then
      _stack_log "kinde: JWKS served at http://127.0.0.1:$INBOX_JWKS_PORT/jwks.json"
      return 0
    fi
    sleep 0.2
  done
  _stack_err "kinde: the JWKS server did not start (see .dev/jwks.log)"
  return 1
}

stop_dev_kinde() {
  if [ -f "$_STACK_JWKS_PID" ]; then
    kill "$(cat "$_STACK_JWKS_PID")" 2>/dev/null || true
    rm -f "$_STACK_JWKS_PID"
    _stack_log "kinde: JWKS server stopped"
  fi
}

# --- all --------------------------------------------------------------------

ensure_services() {
  ensure_postgres || return 1
  ensure_pgbouncer || return 1
  ensure_sqs || return 1
  ensure_aws || return 1
}

stop_services() {
  stop_dev_kinde || true
  stop_sqs || return 1
  stop_aws || return 1
  stop_pgbouncer || return 1
  stop_postgres || return 1
}
