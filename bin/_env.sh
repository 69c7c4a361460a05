# Sourced by bin/*: make .venv from requirements.txt when missing or stale, and set JAVA_HOME.
# Sourced from an interactive shell (`source bin/_env.sh`), it leaves that shell's options (no set -e that would
# close it on the next failing command) and its directory as they were.
case $- in *i*) _env_shell_opts="$(set +o)" ;; *) _env_shell_opts="" ;; esac
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.installed"
want="$(cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
  py="$(command -v python3.11 || command -v python3)"
  echo "setting up $VENV from requirements.txt with $("$py" --version) (first run takes a few minutes)" >&2
  "$py" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt"
  # setuptools prints a notice box for every editable install; nothing in it applies here
  PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$ROOT"
  echo "$want" > "$STAMP"
fi
if [ -z "${JAVA_HOME:-}" ]; then
  java_bin="$(command -v java || true)"
  if [ -z "$java_bin" ]; then
    echo "error: no 'java' on PATH; install a JDK 17 (apt-get install openjdk-17-jdk-headless) or set JAVA_HOME" >&2
    if [ -n "$_env_shell_opts" ]; then eval "$_env_shell_opts"; return 1; fi
    exit 1
  fi
  JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$java_bin")")")"
  export JAVA_HOME
fi
export PATH="$VENV/bin:$PATH"
export GX_ANALYTICS_ENABLED=False
export PYTHONUNBUFFERED=1
if [ -n "$_env_shell_opts" ]; then
  eval "$_env_shell_opts"
else
  cd "$ROOT"
fi
unset _env_shell_opts
